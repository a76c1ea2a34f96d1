package web

import (
	"strings"
	"testing"

	"github.com/honestcancel/gateway/chat"
)

// A reload while the run waits for a free slot shows where it stands from
// the first paint, in the page script's words (static/src/admission.ts),
// with Cancel in place of Send; any other run paints no such state.
func TestThreadPageWaitingRun(t *testing.T) {
	for _, tc := range []struct {
		name     string
		run      *chat.ActiveRun
		want     string // the chip's text; "" = no waiting state
		position string
	}{
		{"next to start", &chat.ActiveRun{RunID: "run_q", Status: chat.RunQueued, QueuePosition: 1}, "Waiting for a free slot (next to start)", "1"},
		{"two ahead", &chat.ActiveRun{RunID: "run_q", Status: chat.RunQueued, QueuePosition: 3}, "Waiting for a free slot (2 ahead)", "3"},
		{"queued with a free slot", &chat.ActiveRun{RunID: "run_q", Status: chat.RunQueued}, "", ""},
		{"running", &chat.ActiveRun{RunID: "run_r", Status: chat.RunRunning, MessageID: ptr("msg_r"), PartialText: "Hello", LastSeq: 5}, "", ""},
		{"no run", nil, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := chat.Snapshot{ThreadID: "thr_w", Title: "Waiting", StateVersion: 2, LastSeq: 3, Messages: []chat.Message{}, ActiveRun: tc.run}
			doc, _ := render(t, ThreadPage(snap, nil))
			live := one(t, doc, byTestID("live"))
			box := live.Find(byTestID("streaming"))
			send := one(t, doc, byTestID("send"))
			cancel := one(t, doc, byTestID("cancel"))
			if tc.want == "" {
				if box.Length() != 0 {
					t.Errorf("a waiting state painted: %q", box.Text())
				}
				if hasAttr(send, "hidden") || !hasAttr(cancel, "hidden") {
					t.Errorf("send hidden=%v, cancel hidden=%v: want Send shown, Cancel hidden", hasAttr(send, "hidden"), hasAttr(cancel, "hidden"))
				}
				return
			}
			if box.Length() != 1 {
				t.Fatalf("%d waiting boxes in the live section, want 1", box.Length())
			}
			if got := strings.TrimSpace(box.Find(byTestID("run-chip")).Text()); got != tc.want {
				t.Errorf("chip = %q, want %q", got, tc.want)
			}
			if got := attr(t, box, "data-queue-position"); got != tc.position {
				t.Errorf("data-queue-position = %q, want %q", got, tc.position)
			}
			if got := box.Find(byTestID("waiting-hint")).Text(); got != waitingHint {
				t.Errorf("hint = %q", got)
			}
			if !box.HasClass("waiting") || box.Find(".chip.live").Length() != 0 {
				t.Errorf("the waiting state must not look like a reply being written: class=%q", box.AttrOr("class", ""))
			}
			if !hasAttr(send, "hidden") || hasAttr(cancel, "hidden") {
				t.Errorf("send hidden=%v, cancel hidden=%v: want Cancel shown in place of Send", hasAttr(send, "hidden"), hasAttr(cancel, "hidden"))
			}
		})
	}
}
