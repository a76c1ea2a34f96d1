package gateway

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/honestcancel/gateway/chat"
)

// A tab that is behind (events queued that its writer has not taken yet)
// gets the answer to its cancel ahead of that backlog: none of those
// events was caused by the cancel, which is read after they were queued.
// It does not pass the answers of earlier commands (answers keep their
// commands' order), and any other command's answer keeps its place after
// the events queued before it.
func TestACancelsAnswerGoesAheadOfTheBacklog(t *testing.T) {
	s, _ := newFuzzServer()
	c := newWSConn(s.ws, nil, chat.Principal{UserID: chat.LocalUserID, Method: chat.AuthLocal})
	defer c.cancel()
	c.mu.Lock()
	c.subs["thr_1"] = 0
	c.mu.Unlock()
	deliver := func(from, to int64) {
		for seq := from; seq <= to; seq++ {
			raw := fmt.Appendf(nil, `{"type":"message.delta","thread_id":"thr_1","seq":%d,"text":"w"}`, seq)
			if !c.Deliver(&chat.Event{ThreadID: "thr_1", Seq: seq, Type: chat.EventMessageDelta, Raw: raw}) {
				t.Fatal("an event was refused")
			}
		}
	}
	order := func() []string {
		c.mu.Lock()
		defer c.mu.Unlock()
		var out []string
		for _, f := range c.queue {
			var obj struct {
				Re  string `json:"re"`
				Seq int64  `json:"seq"`
			}
			if err := json.Unmarshal(f, &obj); err != nil {
				t.Fatalf("frame %q: %v", f, err)
			}
			if obj.Re != "" {
				out = append(out, "answer "+obj.Re)
			} else {
				out = append(out, fmt.Sprint("seq ", obj.Seq))
			}
		}
		return out
	}
	deliver(1, 3)
	c.command([]byte(`{"type":"run.start","id":"start","thread_id":"thr_1","expected_state_version":1,"user_message":"hi"}`))
	deliver(4, 5)
	c.command([]byte(`{"type":"run.cancel","id":"cancel","run_id":"run_1"}`))
	got := fmt.Sprint(order())
	if want := "[seq 1 seq 2 seq 3 answer start answer cancel seq 4 seq 5]"; got != want {
		t.Fatalf("queue = %s, want %s: the cancel's answer ahead of the events queued after the previous answer, and behind that answer", got, want)
	}
}
