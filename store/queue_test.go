package store_test

import (
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
)

// The message queue in the store: the durable step of a start, the
// pauses (cancel, failure, head move) surviving a restart, and the audit
// of invariant 11. (The wire behaviour, tabs and races are in
// gateway/queue_test.go.)

func queueAdd(t *testing.T, st *store.Store, threadID, text, mode string) chat.QueueAddAck {
	t.Helper()
	ack, _, err := st.QueueAdd(ctx, chat.QueueAdd{UserID: user, ThreadID: threadID, UserMessage: text, Mode: mode,
		RequestedBy: "tab:t"})
	if err != nil {
		t.Fatal(err)
	}
	return ack
}

func snapshotQueue(t *testing.T, st *store.Store, threadID string) (chat.Queue, *chat.ActiveRun) {
	t.Helper()
	snap, err := st.Snapshot(ctx, user, threadID)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Queue == nil {
		t.Fatal("snapshot without a queue")
	}
	return *snap.Queue, snap.ActiveRun
}

// finishWith publishes text as the run's answer and completes it.
func finishWith(t *testing.T, st *store.Store, lease chat.Lease, text string) {
	t.Helper()
	msg := chat.NewID(chat.PrefixMessage)
	step := pendingStep(t, st, lease.RunID)
	if err := st.AppendDeltas(ctx, lease, msg, []string{text}); err != nil {
		t.Fatal(err)
	}
	if err := st.PublishStep(ctx, lease, chat.StepOutput{Step: step, MessageID: msg, Kind: chat.KindText, Content: text}); err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(ctx, lease); err != nil {
		t.Fatal(err)
	}
}

// TestQueueStartIsTheCompletionsStep: the completion of a run and the
// start of the first queued item are one commit: right after Complete
// returns, the item's run exists, queued, naming the item, and the item
// is gone from the queue; nothing else starts.
func TestQueueStartIsTheCompletionsStep(t *testing.T) {
	st, _ := open(t)
	th := newThread(t, st)
	run1 := startAndClaim(t, st, th.ThreadID, "first")
	a := queueAdd(t, st, th.ThreadID, "second", "")
	queueAdd(t, st, th.ThreadID, "third", chat.QueueAfter)
	if a.Position != 1 || a.RunID != "" {
		t.Fatalf("add behind a run: %+v", a)
	}
	finishWith(t, st, leaseW(run1), "one")
	q, active := snapshotQueue(t, st, th.ThreadID)
	if active == nil || active.Status != chat.RunQueued || len(q.Items) != 1 || q.Items[0].UserMessage != "third" || q.Paused {
		t.Fatalf("after the completion: active %+v, queue %+v", active, q)
	}
	run2, err := st.Run(ctx, user, active.RunID)
	if err != nil || run2.QueueItemID != a.ItemID {
		t.Fatalf("the started run %+v (%v): want queue_item_id %s", run2, err, a.ItemID)
	}
	mustCheck(t, st, "after a start from the queue")
}

// TestQueuePausesSurviveARestart: a cancel pauses the queue (the receipt
// counts what waits), a failure does too, each with its reason; the pause and the items are still there after the store is
// closed and opened again, and a resume then starts the first item.
func TestQueuePausesSurviveARestart(t *testing.T) {
	path := testDSN(t)
	opts := store.Options{Exclusive: true, StreamBuffer: true}
	st, err := store.Open(ctx, path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { st.Close() }()
	th := newThread(t, st)

	// A cancel.
	run1 := startAndClaim(t, st, th.ThreadID, "first")
	queueAdd(t, st, th.ThreadID, "later one", "")
	queueAdd(t, st, th.ThreadID, "later two", "")
	if _, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: run1, Reason: chat.ReasonUserRequested, RequestedBy: "tab:t"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FinishCancel(ctx, run1, ptr(leaseW(run1)), 0); err != nil {
		t.Fatal(err)
	}
	q, active := snapshotQueue(t, st, th.ThreadID)
	if active != nil || !q.Paused || q.PausedReason == nil || *q.PausedReason != chat.PausedRunCancelled || len(q.Items) != 2 {
		t.Fatalf("after a cancel: active %+v, queue %+v", active, q)
	}

	// Restart.
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err = store.Open(ctx, path, opts); err != nil {
		t.Fatal(err)
	}
	q, _ = snapshotQueue(t, st, th.ThreadID)
	if !q.Paused || len(q.Items) != 2 || q.Items[0].UserMessage != "later one" {
		t.Fatalf("after a restart: %+v", q)
	}

	// A resume starts the first; its run fails: the queue pauses again.
	res, err := st.QueueResume(ctx, chat.QueueResume{UserID: user, ThreadID: th.ThreadID})
	if err != nil || res.RunID == "" {
		t.Fatalf("resume: %+v, %v", res, err)
	}
	c := claimOnly(t, st, "w", res.RunID, time.Hour)
	if err := st.Fail(ctx, c.Lease, chat.ErrorInterrupted); err != nil {
		t.Fatal(err)
	}
	q, active = snapshotQueue(t, st, th.ThreadID)
	if active != nil || !q.Paused || *q.PausedReason != chat.PausedRunFailed || len(q.Items) != 1 {
		t.Fatalf("after a failure: active %+v, queue %+v", active, q)
	}

	// A resume with a run active only unpauses: the item starts when that
	// run completes.
	run3 := startAndClaim(t, st, th.ThreadID, "by hand")
	if res, err := st.QueueResume(ctx, chat.QueueResume{UserID: user, ThreadID: th.ThreadID}); err != nil || res.RunID != "" {
		t.Fatalf("resume with a run active: %+v, %v", res, err)
	}
	finishWith(t, st, leaseW(run3), "done")
	q, active = snapshotQueue(t, st, th.ThreadID)
	if active == nil || len(q.Items) != 0 {
		t.Fatalf("the last item did not start after the run: active %+v, queue %+v", active, q)
	}
	mustCheck(t, st, "after pauses and resumes")
}

// TestQueueHeadMovePauses: a fragment saved while a run streams moves the
// head under the items waiting (they were written against the old one):
// the queue pauses for head_moved, and the run's completion starts
// nothing.
func TestQueueHeadMovePauses(t *testing.T) {
	st, _ := open(t)
	th := newThread(t, st)
	run1 := startAndClaim(t, st, th.ThreadID, "first")
	queueAdd(t, st, th.ThreadID, "queued", "")
	streamed := chat.NewID(chat.PrefixMessage)
	if err := st.AppendDeltas(ctx, leaseW(run1), streamed, []string{"part", "ial"}); err != nil {
		t.Fatal(err)
	}
	snap, err := st.Snapshot(ctx, user, th.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	saveDraft(t, st, th.ThreadID, streamed, snap.ActiveRun.LastSeq)
	q, _ := snapshotQueue(t, st, th.ThreadID)
	if !q.Paused || q.PausedReason == nil || *q.PausedReason != chat.PausedHeadMoved {
		t.Fatalf("after a fragment saved under the queue: %+v", q)
	}
	finishWith(t, st, leaseW(run1), "one")
	q, active := snapshotQueue(t, st, th.ThreadID)
	if active != nil || len(q.Items) != 1 || !q.Paused {
		t.Fatalf("a paused queue started after the run: active %+v, queue %+v", active, q)
	}
	mustCheck(t, st, "after a head move")
}

// TestQueueInterruptRemovedBeforeItsCancelEnds: an interrupt item removed
// while its cancel is under way leaves the after items paused by that
// cancel, not waiting for nothing with no run to follow.
func TestQueueInterruptRemovedBeforeItsCancelEnds(t *testing.T) {
	st, _ := open(t)
	th := newThread(t, st)
	run1 := startAndClaim(t, st, th.ThreadID, "first")
	queueAdd(t, st, th.ThreadID, "after", "")
	now, interrupted, err := st.QueueAdd(ctx, chat.QueueAdd{UserID: user, ThreadID: th.ThreadID, UserMessage: "now",
		Mode: chat.QueueInterrupt, RequestedBy: "tab:t"})
	if err != nil || interrupted == nil || interrupted.RunID != run1 || now.Position != 1 {
		t.Fatalf("interrupt: %+v, %+v, %v", now, interrupted, err)
	}
	if _, err := st.QueueRemove(ctx, chat.QueueRemove{UserID: user, ThreadID: th.ThreadID, ItemID: now.ItemID}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FinishCancel(ctx, run1, ptr(leaseW(run1)), 0); err != nil {
		t.Fatal(err)
	}
	q, active := snapshotQueue(t, st, th.ThreadID)
	if active != nil || len(q.Items) != 1 || !q.Paused || *q.PausedReason != chat.PausedRunCancelled {
		t.Fatalf("after the interrupt's cancel, its item removed: active %+v, queue %+v", active, q)
	}
	mustCheck(t, st, "after an interrupt withdrawn")
}

// TestQueueGoesWithItsThread: deleting a thread drops the messages that
// waited in its queue and empties their text at once (they were never
// sent); check stays clean.
func TestQueueGoesWithItsThread(t *testing.T) {
	st, path := open(t)
	db := rawDB(t, path)
	th := newThread(t, st)
	run1 := startAndClaim(t, st, th.ThreadID, "first")
	queueAdd(t, st, th.ThreadID, "private follow-up", "")
	if _, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: run1, Reason: chat.ReasonUserRequested, RequestedBy: "tab:t"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FinishCancel(ctx, run1, ptr(leaseW(run1)), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := st.DeleteThread(ctx, user, th.ThreadID, nil); err != nil {
		t.Fatal(err)
	}
	var state, text string
	if err := db.QueryRow(`SELECT state, user_message FROM queue_items WHERE thread_id = ?`, th.ThreadID).Scan(&state, &text); err != nil {
		t.Fatal(err)
	}
	if state != "removed" || text != "" {
		t.Errorf("the deleted thread's queued message: %s %q, want removed and emptied", state, text)
	}
}

// TestCheckReportsQueueViolations: invariant 11 broken three ways behind
// the store's back is reported, naming the item.
func TestCheckReportsQueueViolations(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt func(t *testing.T, db *rawConn, thread, started, removed string)
		want    string
	}{
		{"a removed item that started a run", func(t *testing.T, db *rawConn, thread, started, removed string) {
			mustExec(t, db, `UPDATE queue_items SET state = 'removed', run_id = NULL WHERE item_id = ?`, started)
		}, "which was removed"},
		{"an item started twice in the log", func(t *testing.T, db *rawConn, thread, started, removed string) {
			mustExec(t, db, `UPDATE events SET payload = replace(payload, ?, ?) WHERE thread_id = ? AND type = 'run.started'
				AND payload NOT LIKE '%queue_item_id%'`, `"attempt":1`, `"attempt":1,"queue_item_id":"`+started+`"`, thread)
		}, "started twice in the log"},
		{"a start while paused", func(t *testing.T, db *rawConn, thread, started, removed string) {
			mustExec(t, db, `UPDATE events SET payload = replace(payload, '"paused":false', '"paused":true')
				WHERE thread_id = ? AND type = 'queue.updated'`, thread)
		}, "while the queue was paused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, path := openStore(t, false)
			db := rawDB(t, path)
			th := newThread(t, st)
			run1 := startAndClaim(t, st, th.ThreadID, "first")
			started := queueAdd(t, st, th.ThreadID, "starts", "").ItemID
			removed := queueAdd(t, st, th.ThreadID, "removed", "").ItemID
			if _, err := st.QueueRemove(ctx, chat.QueueRemove{UserID: user, ThreadID: th.ThreadID, ItemID: removed}); err != nil {
				t.Fatal(err)
			}
			finishWith(t, st, leaseW(run1), "one")
			mustCheck(t, st, "before the corruption")
			tc.corrupt(t, db, th.ThreadID, started, removed)
			vs, err := st.Check(ctx)
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, v := range vs {
				if v.Invariant == 11 && strings.Contains(v.Detail, tc.want) {
					found = true
				}
			}
			if !found {
				t.Errorf("want an invariant 11 violation saying %q, got %v", tc.want, vs)
			}
		})
	}
}

func mustExec(t *testing.T, db *rawConn, q string, args ...any) {
	t.Helper()
	res, err := db.Exec(q, args...)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		t.Fatalf("%s changed no row", q)
	}
}
