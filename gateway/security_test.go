package gateway_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"
)

// A page on another site must not drive the API with the user's browser:
// every state-changing endpoint refuses a cross-site request with the
// protocol's forbidden error and changes nothing, while programs (no Origin)
// and the server's own pages pass.
func TestCrossOriginCommandsAreRefused(t *testing.T) {
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("guarded")
	run := h.startRun(snap.ThreadID, snap.StateVersion, "short: hello")
	countThreads := func() int {
		var list struct {
			Threads []json.RawMessage `json:"threads"`
		}
		if err := json.Unmarshal(h.do(http.MethodGet, "/api/threads", nil).body, &list); err != nil {
			t.Fatal(err)
		}
		return len(list.Threads)
	}
	threads := countThreads()

	attacks := []struct{ method, path, body string }{
		{"POST", "/api/threads", `{}`},
		{"POST", "/api/threads/" + snap.ThreadID + "/runs", `{"expected_state_version":1,"user_message":"x"}`},
		{"POST", "/api/runs/" + run.RunID + "/cancel", `{}`},
		{"POST", "/api/threads/" + snap.ThreadID + "/fragments", `{"message_id":"msg_x","last_seq":1,"expected_state_version":1}`},
		{"POST", "/api/threads/" + snap.ThreadID + "/drafts/msg_x/delete", `{"expected_state_version":1}`},
		{"POST", "/api/threads/" + snap.ThreadID + "/fork", `{"from_checkpoint_id":"` + snap.HeadCheckpointID + `"}`},
		{"POST", "/api/operations/op_x/confirm", `{"expected_state_version":1}`},
		{"POST", "/api/operations/op_x/reject", `{"expected_state_version":1}`},
	}
	for _, a := range attacks {
		for _, hdr := range [][]string{
			{"Sec-Fetch-Site", "cross-site"},
			{"Origin", "https://evil.example"},
		} {
			r := h.do(a.method, a.path, a.body, hdr...)
			body := h.wantError(t, r, http.StatusForbidden, "forbidden")
			if body["message"] == "" {
				t.Errorf("%s %s: no message", a.method, a.path)
			}
		}
	}
	if r := h.run(run.RunID); r.CancelRequestedAt != nil {
		t.Fatal("a cross-site cancel was carried out")
	}
	if got := countThreads(); got != threads {
		t.Fatalf("a cross-site request created a thread: %d threads, had %d", got, threads)
	}

	// The server's own page (same origin) and a program (no Origin) pass.
	same := h.do(http.MethodPost, "/api/threads", `{}`, "Origin", h.srv.URL, "Sec-Fetch-Site", "same-origin")
	if same.status != http.StatusCreated {
		t.Fatalf("same-origin create = %v", same)
	}
	if prog := h.do(http.MethodPost, "/api/threads", `{}`); prog.status != http.StatusCreated {
		t.Fatalf("program create = %v", prog)
	}
}

func TestAPIAnswersCarrySecurityHeaders(t *testing.T) {
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("headers")
	for _, r := range []reply{
		h.do(http.MethodGet, "/api/threads/"+snap.ThreadID, nil),
		h.do(http.MethodGet, "/api/threads/thr_missing", nil),
		h.do(http.MethodPost, "/api/threads", `{"title":`),
	} {
		for k, want := range map[string]string{
			"X-Content-Type-Options": "nosniff",
			"X-Frame-Options":        "DENY",
			"Cache-Control":          "no-store",
		} {
			if got := r.header.Get(k); got != want {
				t.Errorf("%v: %s = %q, want %q", r, k, got, want)
			}
		}
	}
}
