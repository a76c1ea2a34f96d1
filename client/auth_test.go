package client_test

import (
	"context"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/auth"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
	"github.com/honestcancel/gateway/store"
)

// The credentials a program can present reach the server as the protocol
// says, over HTTP, event streams and WebSocket alike: a bearer token (auth
// mode password), a session cookie under the server's name for it, a
// trusted proxy's user header (auth mode header); without them every way
// in answers unauthorized.
func TestAuthentication(t *testing.T) {
	t.Run("password", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "gateway.db")
		token := makeToken(t, db, "ann")
		cfg := apptest.Config(db)
		cfg.AuthMode = auth.ModePassword
		base, _ := apptest.Serve(t, cfg)
		ctx := bounded(t)

		anon := newClient(t, base)
		_, err := anon.CreateThread(ctx, "")
		wantError(t, err, chat.CodeUnauthorized, http.StatusUnauthorized)
		_, err = anon.Connect(ctx, client.ConnOptions{})
		wantError(t, err, chat.CodeUnauthorized, http.StatusUnauthorized)
		wrong := newClient(t, base, client.WithBearerToken("tok_nope.nope"))
		_, err = wrong.CreateThread(ctx, "")
		wantError(t, err, chat.CodeUnauthorized, http.StatusUnauthorized)
		// A session cookie is read (this one is no session of the server's).
		stale := newClient(t, base, client.WithSessionCookie("not-a-session"))
		_, err = stale.CreateThread(ctx, "")
		if e := wantError(t, err, chat.CodeUnauthorized, http.StatusUnauthorized); !strings.Contains(e.Message, "session ended") {
			t.Fatalf("with a session cookie: %+v, want the server to have read it", e)
		}

		ann := newClient(t, base, client.WithBearerToken(token))
		th := createThread(t, ann, "ann's")
		_, err = anon.Events(ctx, th.ThreadID, 0)
		wantError(t, err, chat.CodeUnauthorized, http.StatusUnauthorized)
		stream, err := ann.Events(ctx, th.ThreadID, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer stream.Close()
		if ev, err := stream.Next(ctx); err != nil || ev.Type != chat.EventCheckpointCreated {
			t.Fatalf("ann's stream: %v, %v", ev, err)
		}
		conn := connect(t, ann, "tab-ann")
		if _, err := conn.Subscribe(ctx, th.ThreadID, 0); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("header", func(t *testing.T) {
		cfg := apptest.Config(filepath.Join(t.TempDir(), "gateway.db"))
		cfg.AuthMode = auth.ModeHeader
		cfg.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
		base, _ := apptest.Serve(t, cfg)
		ctx := bounded(t)
		_, err := newClient(t, base).CreateThread(ctx, "")
		wantError(t, err, chat.CodeUnauthorized, http.StatusUnauthorized)
		bob := newClient(t, base, client.WithProxyUser("", "bob"))
		th := createThread(t, bob, "bob's")
		carol := newClient(t, base, client.WithProxyUser("X-Forwarded-User", "carol"))
		_, err = carol.Thread(ctx, th.ThreadID)
		wantError(t, err, chat.CodeNotFound, http.StatusNotFound) // another user's thread is never revealed
		conn := connect(t, bob, "tab-bob")
		if _, err := conn.Subscribe(ctx, th.ThreadID, 0); err != nil {
			t.Fatal(err)
		}
		other := connect(t, carol, "tab-carol")
		_, err = other.Subscribe(ctx, th.ThreadID, 0)
		wantError(t, err, chat.CodeNotFound, http.StatusNotFound)
	})
}

// makeToken creates the account name and an API token for it in the
// database db, as `gateway user add` and `gateway token create` do before
// the server starts.
func makeToken(t *testing.T, db, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	st, err := store.Open(ctx, db, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Accounts().EnsureUser(ctx, name); err != nil {
		t.Fatal(err)
	}
	_, token, err := auth.CreateToken(ctx, st.Accounts(), name, "client test", 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return token
}
