package main

// Long-lived responses of the real binary against the end of their
// credential (a token revoked with the CLI), and the bound of
// -max-conn-age.

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/internal/apptest"
)

// openLines opens a thread's event stream as w and returns its lines as
// they arrive; the channel closes when the server ends the response. Raw,
// not client.Stream: these tests' subject is how the server ends the
// response (its last event and comment lines, the end of the body), which
// the client turns into a reconnection or an error without showing it.
func (s *server) openLines(w who, threadID, lastID string) (int, <-chan string) {
	s.t.Helper()
	header := http.Header{}
	w.apply(header)
	status, lines, _ := apptest.OpenEventLines(s.t, http.DefaultClient, s.base+"/api/threads/"+threadID+"/events?after_seq=0", header, lastID)
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

// A token revoked with `gateway token revoke` while its event stream is
// open ends the stream within one -ws-ping-interval: an error event
// carrying unauthorized, then the end of the response; a run started
// afterwards by the same user (another token) reaches no stream of the
// revoked one, and reopening it is 401.
func TestRevokedTokenEndsItsEventStream(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	addUser(t, db, "alice", "correct horse battery")
	token, id := createToken(t, db, "alice")
	other, _ := createToken(t, db, "alice")
	srv := startServerWith(t, db, "5ms", "-auth", "password", "-ws-ping-interval", "200ms")
	alice, alice2 := who{bearer: token}, who{bearer: other}
	th := srv.as(alice).NewThread("watched")
	status, lines := srv.openLines(alice, th.ThreadID, "")
	if status != http.StatusOK {
		t.Fatalf("open the stream: %d", status)
	}
	if code, out, errOut := runCLI(t, nil, "token", "revoke", id, "-db", db); code != 0 {
		t.Fatalf("token revoke: exit %d, %q %q", code, out, errOut)
	}
	got := readToEnd(t, lines, 20*time.Second)
	var last string
	for _, l := range got {
		if strings.HasPrefix(l, "event: ") {
			last = l
		}
	}
	if last != "event: error" || !strings.Contains(strings.Join(got, "\n"), `"error":"unauthorized"`) {
		t.Errorf("the stream ended without an unauthorized error event: %q", got[max(0, len(got)-6):])
	}
	ack := srv.as(alice2).StartRun(th.ThreadID, th.StateVersion, "after the revoke")
	srv.as(alice2).waitRun(ack.RunID)
	if status, _ := srv.openLines(alice, th.ThreadID, ""); status != http.StatusUnauthorized {
		t.Errorf("reopening the stream with the revoked token: %d, want 401", status)
	}
}

// -max-conn-age under a second is refused at start, naming the bound.
// (What the limit does is tested in-process:
// app/scenario_streams_test.go's TestMaxConnAgeEndsConnections.)
func TestMaxConnAgeUnderASecondIsRefused(t *testing.T) {
	dir := t.TempDir()
	if code, _, errOut := runCLI(t, nil, "-addr", "127.0.0.1:0", "-db", filepath.Join(dir, "refused.db"), "-max-conn-age", "10ms"); code != 2 || !strings.Contains(errOut, "-max-conn-age must be at least 1s") {
		t.Errorf("-max-conn-age 10ms: exit %d, stderr %q; want 2 naming the bound", code, errOut)
	}
}
