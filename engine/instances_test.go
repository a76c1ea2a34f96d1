package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/honestcancel/gateway/bus"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/engine"
)

// wakeupsTo delivers a cancel wake-up straight to another engine, as the
// NATS bus does between instances.
type wakeupsTo struct{ target func() *engine.Engine }

func (w wakeupsTo) PublishCancel(string) { w.target().WakeCancels() }

// Two engines on one store play two instances: "a" executes a run whose
// model is stuck between two chunks (so no delta write can notice the
// cancel), and "b" accepts the cancel. The run must stop through a wake-up
// or, when the wake-up is lost, through a's own look-up of accepted cancels.
func TestCancelAcceptedByAnotherInstance(t *testing.T) {
	for _, tc := range []struct {
		name      string
		wakeup    bool
		pollEvery time.Duration // a's look-up of accepted cancels
	}{
		{"woken over the bus", true, time.Hour},
		{"wake-up lost, found by polling", false, 50 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, m, sub, a, ack := streamingOnA(t, tc.pollEvery)

			cfgB := h.config()
			cfgB.SingleInstance, cfgB.InstanceID, cfgB.CancelPoll = false, "b", time.Hour
			if tc.wakeup {
				cfgB.Wakeups = wakeupsTo{func() *engine.Engine { return a }}
			}
			b := engine.New(cfgB)
			if err := b.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			cancel, err := b.CancelRun(context.Background(), chat.CancelRun{UserID: chat.LocalUserID, RunID: ack.RunID, Reason: "user_requested", RequestedBy: "tab:b"})
			if err != nil || cancel.Status != chat.RunCancelRequested || cancel.AlreadyRequested {
				t.Fatalf("cancel on b = %+v, %v", cancel, err)
			}
			select {
			case <-m.stopped:
			case <-time.After(10 * time.Second):
				t.Fatal("a's model call was not cancelled within 10s of b accepting the cancel")
			}
			ev := waitFor(t, sub, "run.cancelled", isType(chat.EventRunCancelled, ack.RunID))
			if body := ev.Body.(chat.RunCancelledBody); body.DiscardedStreamChars != int64(len("one two")) {
				t.Errorf("discarded_stream_chars = %d, want %d (what a streamed)", body.DiscardedStreamChars, len("one two"))
			}
			if r := h.run(ack.RunID); r.Status != chat.RunCancelled || r.RequestedBy == nil || *r.RequestedBy != "tab:b" {
				t.Fatalf("run = %+v", r)
			}
		})
	}
}

// holdersTo hands a forwarded cancel straight to another engine, as the
// NATS bus does between instances; with lost set it lets the cancel be
// accepted there and then answers as a holder that did not answer in
// time would.
type holdersTo struct {
	target func() *engine.Engine
	lost   bool
	asked  *[]string
}

func (h holdersTo) ForwardCancel(ctx context.Context, holder string, p chat.CancelRun) (chat.CancelAck, error) {
	*h.asked = append(*h.asked, holder)
	ack, err := h.target().CancelRunHere(ctx, p)
	if h.lost && err == nil {
		return chat.CancelAck{}, context.DeadlineExceeded
	}
	return ack, err
}

// A cancel sent to b of a run a executes goes to a, which accepts it and
// stops its worker at once (no wake-up, no poll: both are off here). When
// a accepts it but its answer is lost, b accepts it again for the same
// requester: the ack says it is this request's, not an earlier cancel's.
func TestCancelForwardedToTheInstanceExecutingTheRun(t *testing.T) {
	for _, lost := range []bool{false, true} {
		name := "answered"
		if lost {
			name = "answer lost"
		}
		t.Run(name, func(t *testing.T) {
			h, m, sub, a, ack := streamingOnA(t, time.Hour)

			var asked []string
			cfgB := h.config()
			cfgB.SingleInstance, cfgB.InstanceID, cfgB.CancelPoll = false, "b", time.Hour
			cfgB.Holders = holdersTo{target: func() *engine.Engine { return a }, lost: lost, asked: &asked}
			b := engine.New(cfgB)
			if err := b.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			cancel, err := b.CancelRun(context.Background(), chat.CancelRun{UserID: chat.LocalUserID, RunID: ack.RunID, Reason: "user_requested", RequestedBy: "tab:b"})
			// (With the answer lost, a may have finished the cancel before b
			// accepts it again: then b finds it cancelled.)
			if err != nil || !cancel.Status.CancelAccepted() || (!lost && cancel.Status != chat.RunCancelRequested) ||
				cancel.AlreadyRequested || cancel.AcceptedStateVersion == 0 {
				t.Fatalf("cancel through b = %+v, %v", cancel, err)
			}
			if len(asked) != 1 || asked[0] != "a" {
				t.Fatalf("b asked %v, want the run's lease holder a once", asked)
			}
			select {
			case <-m.stopped:
			case <-time.After(10 * time.Second):
				t.Fatal("a's model call was not cancelled within 10s: the forwarded cancel did not reach its worker")
			}
			waitFor(t, sub, "run.cancelled", isType(chat.EventRunCancelled, ack.RunID))

			// A second cancel of the same tab is a repeat, answered as one.
			again, err := b.CancelRun(context.Background(), chat.CancelRun{UserID: chat.LocalUserID, RunID: ack.RunID, Reason: "user_requested", RequestedBy: "tab:b"})
			if err != nil || !again.AlreadyRequested {
				t.Fatalf("second cancel = %+v, %v; want already_requested", again, err)
			}
		})
	}
}

// streamingOnA starts engine "a" of two instances (looking for cancels
// accepted elsewhere every pollEvery) on a run whose model is stuck after
// its first two chunks, and waits for a's first delta. The engine and the
// subscription are closed when the test ends.
func streamingOnA(t *testing.T, pollEvery time.Duration) (*harness, *scripted, *bus.Subscription, *engine.Engine, chat.RunStartAck) {
	t.Helper()
	m := newScripted(words, true)
	h := newHarness(t, m)
	snap := h.thread()
	sub := h.feed.Subscribe(snap.ThreadID, 1024)
	t.Cleanup(sub.Close)
	cfgA := h.config()
	cfgA.SingleInstance, cfgA.InstanceID, cfgA.CancelPoll = false, "a", pollEvery
	a := engine.New(cfgA)
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	ack, err := a.StartRun(context.Background(), chat.StartRun{UserID: chat.LocalUserID, ThreadID: snap.ThreadID,
		ExpectedStateVersion: snap.StateVersion, UserMessage: ptr("hello")})
	if err != nil {
		t.Fatal(err)
	}
	m.release(t, 2)
	waitFor(t, sub, "a streams", isType(chat.EventMessageDelta, ack.RunID))
	return h, m, sub, a, ack
}

// thread.delete of a thread whose run streams: the run is cancelled first in
// the deleter's name (reason thread_deleted), its run.cancelled reaches the
// tabs before thread.deleted, and thread.deleted is the last event. A stale
// version refuses the whole command before anything is cancelled.
func TestDeleteThreadCancelsItsRunFirst(t *testing.T) {
	h, m, sub, a, ack := streamingOnA(t, time.Hour)
	snap := h.snapshot(h.run(ack.RunID).ThreadID)
	stale := snap.StateVersion - 1
	if _, err := a.DeleteThread(context.Background(), chat.DeleteThread{UserID: chat.LocalUserID, ThreadID: snap.ThreadID,
		ExpectedStateVersion: &stale, RequestedBy: "tab:d"}); chat.ErrorCode(err) != chat.CodeStateVersionConflict {
		t.Fatalf("delete at a stale version = %v, want state_version_conflict", err)
	}
	if r := h.run(ack.RunID); r.Status != chat.RunRunning {
		t.Fatalf("the refused delete touched the run: %+v", r)
	}

	current := snap.StateVersion
	del, err := a.DeleteThread(context.Background(), chat.DeleteThread{UserID: chat.LocalUserID, ThreadID: snap.ThreadID,
		ExpectedStateVersion: &current, RequestedBy: "tab:d"})
	if err != nil || del.ThreadID != snap.ThreadID {
		t.Fatalf("delete = %+v, %v", del, err)
	}
	select {
	case <-m.stopped:
	default:
		t.Fatal("the delete answered before the run's model call was cancelled")
	}
	r := h.run(ack.RunID)
	if r.Status != chat.RunCancelled || r.CancelReason == nil || *r.CancelReason != chat.ReasonThreadDeleted || r.RequestedBy == nil || *r.RequestedBy != "tab:d" {
		t.Fatalf("run after the delete = %+v", r)
	}
	cancelled := waitFor(t, sub, "run.cancelled", isType(chat.EventRunCancelled, ack.RunID))
	deleted := waitFor(t, sub, "thread.deleted", isType(chat.EventThreadDeleted, ""))
	if deleted.Seq <= cancelled.Seq {
		t.Fatalf("thread.deleted (seq %d) before run.cancelled (seq %d)", deleted.Seq, cancelled.Seq)
	}
	if _, err := h.st.Snapshot(context.Background(), chat.LocalUserID, snap.ThreadID); chat.ErrorCode(err) != chat.CodeNotFound {
		t.Fatalf("snapshot after the delete = %v, want not_found", err)
	}
	log, err := h.st.ThreadEvents(context.Background(), snap.ThreadID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if last := log.Events[len(log.Events)-1]; last.Seq != deleted.Seq {
		t.Fatalf("the log's last event is seq %d (%s), want thread.deleted at %d", last.Seq, last.Type, deleted.Seq)
	}
}
