package engine_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/engine"
)

// holedStore refuses the first refusals publishes of a reply with
// chat.ErrDeltasLost (negative: every one), as the store does when another
// instance wrote past the deltas of the message (store/writepast_test.go
// shows that part on PostgreSQL), and records the messages it refused.
type holedStore struct {
	engine.Store
	refusals atomic.Int64
	mu       sync.Mutex
	refused  []string
}

func (s *holedStore) CompleteWith(ctx context.Context, lease chat.Lease, out chat.StepOutput) error {
	if n := s.refusals.Load(); n < 0 || (n > 0 && s.refusals.CompareAndSwap(n, n-1)) {
		s.mu.Lock()
		s.refused = append(s.refused, out.MessageID)
		s.mu.Unlock()
		return fmt.Errorf("%w: message %s (test)", chat.ErrDeltasLost, out.MessageID)
	}
	return s.Store.CompleteWith(ctx, lease, out)
}

// A reply refused for a hole starts over: attempt 2, a new message, the
// model told the previous attempt was interrupted; the run completes and
// the refused message is never published. After MaxAttempts the run fails
// "interrupted", publishing nothing.
func TestAReplyThatLostDeltasStartsOver(t *testing.T) {
	for _, tc := range []struct {
		name     string
		refusals int64
		want     chat.RunStatus
		attempts int
	}{
		{"once", 1, chat.RunCompleted, 2},
		{"every time", -1, chat.RunFailed, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newScripted(words, false)
			h := newHarness(t, m)
			hs := &holedStore{Store: h.st}
			hs.refusals.Store(tc.refusals)
			h.startWith(func(c *engine.Config) {
				c.Store = hs
				c.MaxAttempts = 2
			})
			snap, sub := h.watchedThread()
			ack := h.startRun(snap.ThreadID, snap.StateVersion, ptr("hello"))
			end := chat.EventRunCompleted
			if tc.want == chat.RunFailed {
				end = chat.EventRunFailed
			}
			waitFor(t, sub, string(tc.want), isType(end, ack.RunID))
			r := h.run(ack.RunID)
			if r.Status != tc.want || r.Attempt != tc.attempts {
				t.Fatalf("run ended %s at attempt %d (error %v); want %s at attempt %d", r.Status, r.Attempt, r.Error, tc.want, tc.attempts)
			}
			hs.mu.Lock()
			refused := slices.Clone(hs.refused)
			hs.mu.Unlock()
			if len(refused) == 0 || (tc.refusals > 0 && len(refused) != int(tc.refusals)) {
				t.Fatalf("refused %v: the test proves nothing", refused)
			}
			final := h.snapshot(snap.ThreadID)
			var contents []string
			for _, msg := range final.Messages {
				for _, id := range refused {
					if msg.MessageID == id {
						t.Fatalf("message %s was refused for a hole and published anyway", id)
					}
				}
				contents = append(contents, msg.Content)
			}
			want := "hello"
			if tc.want == chat.RunCompleted {
				want += "|" + strings.Join(words, " ")
			} else if r.Error == nil || *r.Error != chat.ErrorInterrupted {
				t.Fatalf("failed run's error %v, want %q", r.Error, chat.ErrorInterrupted)
			}
			if got := strings.Join(contents, "|"); got != want {
				t.Fatalf("history %q, want %q", got, want)
			}
			if note := m.lastRequest().ResumeNote; !strings.Contains(note, "interrupted") {
				t.Fatalf("the step started over with the note %q; want the model told the previous attempt was interrupted", note)
			}
		})
	}
}
