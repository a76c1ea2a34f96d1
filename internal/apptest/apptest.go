// Package apptest runs whole gateways (app.App) in a test's process, on a
// loopback port, for the black-box tests of packages app and client, and
// gives the root package's tests the same protocol helpers for a gateway
// they serve themselves (Attach). For tests only.
package apptest

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/honestcancel/gateway/app"
	"github.com/honestcancel/gateway/auth"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/gateway"
	"github.com/honestcancel/gateway/store"
)

// Config is an App's configuration for quick black-box tests, on a
// loopback port of the system's choosing, over the database db (a SQLite
// file or a PostgreSQL URL), the demo model at 20 ms a word. It is not
// the command's (fewer workers, shorter sessions, faster simulated
// tools, no event retention): a test of what the command serves starts
// from CommandConfig.
func Config(db string) app.Config {
	return app.Config{
		Addr: "127.0.0.1:0", DB: db, SQLiteSynchronous: store.SynchronousNormal,
		NATSSubject: "gateway", LeaseTTL: 15 * time.Second, ReconcileHorizon: time.Hour,
		Model: "demo", DemoPace: 20 * time.Millisecond,
		StreamTTL: 10 * time.Minute, Workers: 8,
		SearchLatency: 50 * time.Millisecond, OutboxLatency: 50 * time.Millisecond, OutboxRecordDelay: time.Second,
		AuthMode: auth.ModeNone, SessionTTL: time.Hour,
		WSPing: 20 * time.Second, MaxConnAge: time.Hour,
		UserConns: 32, UserSubs: 500, UserRate: 60,
		Hosts:       gateway.LoopbackHosts(),
		BodyTimeout: gateway.DefaultBodyTimeout, IdleTimeout: time.Minute,
	}
}

// Serve runs an App of cfg until stop is called, at the latest when the
// test ends, and returns its base URL. stop ends its context, waits for
// Run to return (an error of Run fails the test) and closes the App; it
// may be called more than once.
func Serve(t testing.TB, cfg app.Config) (base string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a, err := app.New(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		cancel()
		t.Fatalf("app.New: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
			a.Close()
		})
	}
	t.Cleanup(stop)
	return "http://" + a.Addr().String(), stop
}

// CheckClean audits the database db (every invariant of the protocol)
// once the apps on it have closed, failing the test for each violation.
func CheckClean(t testing.TB, db string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := store.Open(ctx, db, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	v, err := st.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range v {
		t.Errorf("invariant violated: %+v", x)
	}
}

// Client is a protocol client of the gateway at base, closed when the
// test ends.
func Client(t testing.TB, base string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(base, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// Bounded is a context that ends after limit, or when the test ends.
func Bounded(t testing.TB, limit time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	return ctx
}
