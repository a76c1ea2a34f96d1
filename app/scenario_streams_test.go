package app_test

// Long-lived responses of a whole gateway against -max-conn-age. (Their
// end when a token is revoked with the CLI is tested in the root
// package.)

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/internal/apptest"
)

// openLines opens a thread's event stream as w and returns its lines as
// they arrive; the channel closes when the server ends the response. Raw,
// not client.Stream: these tests' subject is how the server ends the
// response (its last event and comment lines, the end of the body), which
// the client turns into a reconnection or an error without showing it.
func openLines(s *apptest.Server, w who, threadID, lastID string) (int, <-chan string) {
	s.T.Helper()
	header := http.Header{}
	w.apply(header)
	status, lines, _ := apptest.OpenEventLines(s.T, http.DefaultClient, s.Base+"/api/threads/"+threadID+"/events?after_seq=0", header, lastID)
	return status, lines
}

// readToEnd collects lines until the server ends the stream, failing the
// test after limit.
func readToEnd(t *testing.T, lines <-chan string, limit time.Duration) []string {
	t.Helper()
	got, ended := apptest.ReadLinesToEnd(lines, limit)
	if !ended {
		n := len(got)
		t.Fatalf("event stream still open after %v (%d lines, last %q)", limit, n, got[max(0, n-4):])
	}
	return got
}

// -max-conn-age (Config.MaxConnAge) ends an event stream (with a comment
// saying so) and a WebSocket connection (1000) once they are that old;
// the stream resumes with Last-Event-ID. (Values under a second are
// refused at start: TestMaxConnAgeUnderASecondIsRefused, in the root
// package.)
func TestMaxConnAgeEndsConnections(t *testing.T) {
	dir := t.TempDir()
	cfg := apptest.CommandConfig(filepath.Join(dir, "gw.db"), 5*time.Millisecond)
	cfg.MaxConnAge = time.Second
	srv := apptest.Start(t, cfg)
	th := srv.CreateThread()
	opened := time.Now()
	status, lines := openLines(srv, who{}, th.ThreadID, "")
	if status != http.StatusOK {
		t.Fatalf("open the stream: %d", status)
	}
	ws := mustDialWS(srv, who{}, "a connection to age")
	got := readToEnd(t, lines, 20*time.Second)
	if took := time.Since(opened); took < time.Second {
		t.Errorf("the stream ended after %v, before -max-conn-age", took)
	}
	if n := len(got); n < 2 || got[n-2] != ": connection age limit: reconnect with Last-Event-ID" {
		t.Errorf("the stream's last lines %q, want the age-limit comment", got[max(0, n-4):])
	}
	lastID := ""
	for _, l := range got {
		if v, ok := strings.CutPrefix(l, "id: "); ok {
			lastID = v
		}
	}
	if status, _ := openLines(srv, who{}, th.ThreadID, lastID); status != http.StatusOK {
		t.Errorf("resuming with Last-Event-ID %s: %d", lastID, status)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, _, err := ws.conn.Read(ctx)
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusNormalClosure || !strings.Contains(ce.Reason, "age limit") {
		t.Errorf("the WebSocket ended with %v, want 1000 naming the age limit", err)
	}
}
