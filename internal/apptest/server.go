package apptest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/honestcancel/gateway/app"
	"github.com/honestcancel/gateway/auth"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/gateway"
	"github.com/honestcancel/gateway/store"
)

// CommandConfig is the Config the serve command builds from
// `-addr 127.0.0.1:0 -db DB -demo-pace PACE` and nothing else (every
// other flag at its default, no GATEWAY_* variable set): the scenario
// tests' starting point, where a flag a test passed to the command
// becomes the Config field it sets. The root package's tests check that
// it stays what the command builds.
func CommandConfig(db string, pace time.Duration) app.Config {
	hosts, err := gateway.ParseHosts("127.0.0.1")
	if err != nil {
		panic(err)
	}
	return app.Config{
		Addr: "127.0.0.1:0", DB: db, SQLiteSynchronous: store.DefaultSynchronous,
		NATSSubject: "gateway", LeaseTTL: 15 * time.Second, ReconcileHorizon: 24 * time.Hour,
		Model: "demo", DemoPace: pace, MaxReplyBytes: chat.DefaultReplyBytes,
		StreamTTL: 10 * time.Minute, EventTTL: 30 * 24 * time.Hour, AuditTTL: 365 * 24 * time.Hour, DraftTTL: 7 * 24 * time.Hour,
		Workers: 64, MaxRunsPerUser: 32,
		SearchLatency: 1500 * time.Millisecond, OutboxLatency: 500 * time.Millisecond, OutboxRecordDelay: 10 * time.Second,
		AuthMode: auth.ModeNone, AuthHeader: "X-Forwarded-User", SessionTTL: 7 * 24 * time.Hour,
		WSPing: 20 * time.Second, MaxConnAge: time.Hour,
		UserConns: 32, UserSubs: 500, UserRate: 60,
		Hosts:       gateway.LoopbackHosts().Union(hosts),
		BodyTimeout: gateway.DefaultBodyTimeout, IdleTimeout: 2 * time.Minute,
	}
}

// Server is one App served in the test's process on a loopback port, as
// the serve command serves it (its log in the command's text format, at
// level info), with the protocol helpers of the scenario tests: a
// protocol client (API), typed calls that stop the test on any error
// (Snapshot, StartRun, CancelRun, …) and event streams (Events).
//
// A Server belongs to the test that started (or attached) it: its methods may stop
// that test (t.Fatal) and so are called from the test's goroutine only,
// except Stderr, Logged and API, which are safe from any goroutine. It is
// stopped when the test ends, whatever happened. The Servers As returns
// share its App, log and lifecycle.
type Server struct {
	T    testing.TB
	DB   string
	Base string

	logs *logTap
	api  *client.Client
	run  *running
}

// running is an App's lifecycle: cancel ends Run's context; stopped is
// closed once Run returned and the App closed, err is what Run returned
// (read only after stopped is closed).
type running struct {
	cancel  context.CancelFunc
	stopped chan struct{}
	err     error
}

// keepLogLines is how many of the last log lines a Server keeps for
// Stderr (failure reports, log checks); Logged counts them all.
const keepLogLines = 300

// Start builds an App of cfg (its log kept, see Stderr), serves it, and
// returns once /readyz answers 200. The test fails if the App does not
// build, does not become ready within 15s, or (at its end) does not stop
// within 20s; its last log lines are printed when it failed.
func Start(t testing.TB, cfg app.Config) *Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{T: t, DB: cfg.DB, logs: &logTap{msgs: map[string]int{}}, run: &running{cancel: cancel, stopped: make(chan struct{})}}
	log := slog.New(slog.NewTextHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	a, err := app.New(ctx, cfg, log)
	if err != nil {
		cancel()
		t.Fatalf("app.New (db %s): %v; log:\n%s", cfg.DB, err, s.Stderr())
	}
	s.Base = "http://" + a.Addr().String()
	s.api = NewAPI(t, s.Base, 15*time.Second, nil)
	go func() {
		err := a.Run(ctx)
		if err != nil {
			log.Error("gateway stopped", "err", err)
		}
		a.Close()
		s.run.err = err
		close(s.run.stopped)
	}()
	t.Cleanup(func() {
		s.end()
		if t.Failed() {
			t.Logf("gateway log (db %s), last lines:\n%s", s.DB, s.Stderr())
		}
	})
	s.waitReady()
	return s
}

// waitReady polls /readyz until it answers 200 (bounded: 15s).
func (s *Server) waitReady() {
	s.T.Helper()
	WaitReady(s.T, s.Base, s.run.stopped, func() string { return fmt.Sprintf("Run: %v", s.run.err) })
}

// WaitReady polls base's /readyz until it answers 200, failing t after
// 15s, or as soon as stopped is closed (the gateway ended: why says how).
func WaitReady(t testing.TB, base string, stopped <-chan struct{}, why func() string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	last := ""
	for {
		resp, err := readyClient.Get(base + "/readyz")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /readyz never answered 200 within 15s (last: %s)", last)
		}
		select {
		case <-tick.C:
		case <-stopped:
			t.Fatalf("the gateway stopped while waiting for /readyz (%s)", why())
		}
	}
}

var readyClient = &http.Client{Timeout: 15 * time.Second}

// Attach is a Server for the gateway at base (a URL) over db that the
// caller serves, already ready: the command's serve in the test's
// process, or a process of its own. Its protocol helpers (API, As,
// Snapshot, StartRun, CancelRun, Events, EventsAfterCrash, …) work as a
// started Server's do, with a protocol client made here (closed when the
// test ends). Its log and lifecycle stay the caller's: Stderr is empty,
// Logged counts nothing, AdminURL finds no line, and Stop fails the test;
// a caller with a log and a lifecycle wraps the Server and gives its own.
// Attach starts no goroutine.
func Attach(t testing.TB, db, base string) *Server {
	t.Helper()
	return &Server{T: t, DB: db, Base: base, logs: &logTap{msgs: map[string]int{}}, api: NewAPI(t, base, 15*time.Second, nil)}
}

// end stops the App whatever state it is in (at the test's end).
func (s *Server) end() {
	s.run.cancel()
	select {
	case <-s.run.stopped:
	case <-time.After(20 * time.Second):
		s.T.Errorf("the in-process gateway (db %s) did not stop within 20s", s.DB)
	}
}

// Stop shuts the App down gracefully (as SIGTERM does the command) and
// requires that it stops within 20s and that Run returns no error (the
// command's exit status 0).
func (s *Server) Stop() {
	s.T.Helper()
	if s.run == nil {
		s.T.Fatalf("Stop: the gateway at %s was attached (Attach): its lifecycle is its caller's", s.Base)
	}
	s.run.cancel()
	select {
	case <-s.run.stopped:
	case <-time.After(20 * time.Second):
		s.T.Fatalf("gateway did not stop within 20s of the end of its context")
	}
	if s.run.err != nil {
		s.T.Fatalf("Run returned %v after the end of its context, want nil (exit status 0)", s.run.err)
	}
}

// Stderr is the last log lines (up to keepLogLines), one a line.
func (s *Server) Stderr() string { return s.logs.String() }

// Logged counts the log lines so far whose msg is exactly msg (all of
// them, not only the lines Stderr keeps).
func (s *Server) Logged(msg string) int { return s.logs.count(msg) }

// AdminURL is the admin listener's address as the App logged it (its
// profiles' URL, ending in /debug/pprof/); none logged stops the test.
func (s *Server) AdminURL() string {
	s.T.Helper()
	const line = `msg="admin listener" addr=`
	var admin string
	for _, l := range strings.Split(s.Stderr(), "\n") {
		if i := strings.Index(l, line); i >= 0 {
			admin = strings.TrimSpace(l[i+len(line):])
		}
	}
	if admin == "" {
		s.T.Fatalf("no admin listener line in the log:\n%s", s.Stderr())
	}
	return admin
}

// logTap is the App's log output: the last lines kept, every line's msg
// counted. Safe for concurrent use (slog writes one line per Write).
type logTap struct {
	mu      sync.Mutex
	partial string
	lines   []string
	msgs    map[string]int // msg="…" (quoted: more than one word) of every line -> how many lines said it
}

func (l *logTap) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	text := l.partial + string(p)
	for {
		line, rest, ok := strings.Cut(text, "\n")
		if !ok {
			break
		}
		text = rest
		l.lines = append(l.lines, line)
		if len(l.lines) > keepLogLines {
			l.lines = l.lines[len(l.lines)-keepLogLines:]
		}
		if _, after, ok := strings.Cut(line, ` msg="`); ok {
			if msg, _, ok := strings.Cut(after, `"`); ok {
				l.msgs[msg]++
			}
		}
	}
	l.partial = text
	return len(p), nil
}

func (l *logTap) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func (l *logTap) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.msgs[msg]
}
