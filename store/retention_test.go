package store_test

import (
	"database/sql"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
)

// The retention tests build threads by hand as a worker would, with a
// cutoff between phases, purge, and after every purge expect Check to find
// nothing.

func version(t *testing.T, st *store.Store, threadID string) int64 {
	t.Helper()
	th, err := st.Thread(ctx, user, threadID)
	if err != nil {
		t.Fatal(err)
	}
	return th.StateVersion
}

// startAndClaim starts a run with a user message and claims it as worker w.
func startAndClaim(t *testing.T, st *store.Store, threadID, question string) string {
	t.Helper()
	runID := startRun(t, st, threadID, version(t, st, threadID), question)
	run, err := st.Claim(ctx, "w", time.Hour)
	if err != nil || run == nil || run.Run.RunID != runID {
		t.Fatalf("claim = %+v, %v; want %s", run, err, runID)
	}
	return runID
}

// completeRun runs one run to completion; it returns the run and its message.
func completeRun(t *testing.T, st *store.Store, threadID, question, answer string) (string, string) {
	t.Helper()
	runID := startAndClaim(t, st, threadID, question)
	msgID := chat.NewID(chat.PrefixMessage)
	if err := st.AppendDeltas(ctx, leaseW(runID), msgID, strings.SplitAfter(answer, " ")); err != nil {
		t.Fatal(err)
	}
	if err := st.PublishStep(ctx, leaseW(runID), chat.StepOutput{Step: pendingStep(t, st, runID), MessageID: msgID, Kind: chat.KindText, Content: answer}); err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(ctx, leaseW(runID)); err != nil {
		t.Fatal(err)
	}
	return runID, msgID
}

func failRun(t *testing.T, st *store.Store, threadID string) string {
	t.Helper()
	runID := startAndClaim(t, st, threadID, "fail please")
	if err := st.AppendDeltas(ctx, leaseW(runID), chat.NewID(chat.PrefixMessage), []string{"half"}); err != nil {
		t.Fatal(err)
	}
	if err := st.Fail(ctx, leaseW(runID), "the model went away"); err != nil {
		t.Fatal(err)
	}
	return runID
}

// runningRun leaves a run running with some text streamed.
func runningRun(t *testing.T, st *store.Store, threadID string) string {
	t.Helper()
	runID := startAndClaim(t, st, threadID, "keep going")
	if err := st.AppendDeltas(ctx, leaseW(runID), chat.NewID(chat.PrefixMessage), []string{"still", " streaming"}); err != nil {
		t.Fatal(err)
	}
	return runID
}

// waitingRun leaves a run waiting for the confirmation of an email.
func waitingRun(t *testing.T, st *store.Store, threadID string) string {
	t.Helper()
	runID := startAndClaim(t, st, threadID, "send it")
	opID := chat.NewID("op_")
	err := st.PublishStep(ctx, leaseW(runID), chat.StepOutput{Step: pendingStep(t, st, runID), MessageID: chat.NewID(chat.PrefixMessage), Kind: chat.KindText, Content: "I will send this.",
		Call: &chat.ToolCall{OperationID: opID, Tool: "send_email", Contract: "consequential", Args: json.RawMessage(`{"to":"a@example.com"}`),
			Preview: json.RawMessage(`{"to":"a@example.com"}`), IdempotencyKey: "email:" + opID}})
	if err != nil {
		t.Fatal(err)
	}
	return runID
}

func saveDraft(t *testing.T, st *store.Store, threadID, streamedMsg string, lastSeq int64) chat.FragmentSaved {
	t.Helper()
	saved, err := st.SaveFragment(ctx, chat.SaveFragment{UserID: user, ThreadID: threadID, MessageID: streamedMsg, LastSeq: lastSeq, ExpectedStateVersion: version(t, st, threadID)})
	if err != nil {
		t.Fatal(err)
	}
	return saved
}

func deleteDraft(t *testing.T, st *store.Store, threadID, msgID string) {
	t.Helper()
	if _, err := st.DeleteDraft(ctx, chat.DeleteDraft{UserID: user, ThreadID: threadID, MessageID: msgID, ExpectedStateVersion: version(t, st, threadID)}); err != nil {
		t.Fatal(err)
	}
}

func fork(t *testing.T, st *store.Store, threadID string) string {
	t.Helper()
	snap, err := st.Snapshot(ctx, user, threadID)
	if err != nil {
		t.Fatal(err)
	}
	f, err := st.Fork(ctx, chat.Fork{UserID: user, ThreadID: threadID, FromCheckpointID: snap.HeadCheckpointID})
	if err != nil {
		t.Fatal(err)
	}
	return f.ThreadID
}

// cutoff returns a time strictly between what was written before and what
// is written after it (event times are whole milliseconds).
func cutoff() time.Time {
	time.Sleep(3 * time.Millisecond)
	c := time.Now()
	time.Sleep(3 * time.Millisecond)
	return c
}

func mustCheck(t *testing.T, st *store.Store, when string) {
	t.Helper()
	vs, err := st.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		t.Errorf("%s: %v", when, v)
	}
}

type logState struct {
	watermark int64
	lastSeq   int64 // the last durable event's seq
	events    int
}

func eventLog(t *testing.T, db *rawConn, threadID string) logState {
	t.Helper()
	var s logState
	if err := db.QueryRow(`SELECT events_purged_through FROM threads WHERE thread_id = ?`, threadID).Scan(&s.watermark); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`SELECT COALESCE(MAX(seq), 0), COUNT(*) FROM events WHERE thread_id = ?`, threadID).Scan(&s.lastSeq, &s.events); err != nil {
		t.Fatal(err)
	}
	return s
}

// runEvents is every stored event of a run, as stored.
func runEvents(t *testing.T, db *rawConn, runID string) []string {
	t.Helper()
	rows, err := db.Query(`SELECT seq || ' ' || payload FROM events WHERE run_id = ? ORDER BY seq`, runID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestPurgeEventsKeepsEveryInvariant(t *testing.T) {
	st, path := open(t)
	db := rawDB(t, path)

	// Phase 1: a completed run, a cancelled one with a saved and a deleted
	// draft and a fork holding them, a failed one.
	a, b, c, d, e := newThread(t, st).ThreadID, newThread(t, st).ThreadID, newThread(t, st).ThreadID, newThread(t, st).ThreadID, newThread(t, st).ThreadID
	completeRun(t, st, a, "q1", "a one")
	cancelled, streamed, lastDelta := streamAndCancel(t, st, b, version(t, st, b), "draft", " text")
	saveDraft(t, st, b, streamed, lastDelta-1)
	gone := saveDraft(t, st, b, streamed, lastDelta)
	forkB := fork(t, st, b)
	deleteDraft(t, st, b, gone.MessageID)
	failRun(t, st, c)
	completeRun(t, st, d, "q1", "d one")
	completeRun(t, st, e, "q1", "e one")
	cut1 := cutoff()

	// Phase 2: more on some threads; one run left running, one waiting for
	// a confirmation; a fork of a.
	completeRun(t, st, a, "q2", "a two")
	running := runningRun(t, st, d)
	waiting := waitingRun(t, st, e)
	forkA := fork(t, st, a)
	cut2 := cutoff()

	// Phase 3.
	streamAndCancel(t, st, a, version(t, st, a), "x")
	completeRun(t, st, c, "q2", "c two")
	mustCheck(t, st, "before any purge")

	threads := []string{a, b, c, d, e, forkA, forkB}
	before := map[string]logState{}
	for _, id := range threads {
		before[id] = eventLog(t, db, id)
	}
	inFlight := map[string][]string{running: runEvents(t, db, running), waiting: runEvents(t, db, waiting)}

	prevMark := map[string]int64{}
	for i, cut := range []time.Time{cut1, cut1, cut2, time.Now().Add(time.Minute)} {
		n, err := st.Retention().PurgeEvents(ctx, cut)
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 && n != 0 {
			t.Errorf("purging again at the same cutoff removed %d events", n)
		}
		if i != 1 && n == 0 {
			t.Errorf("purge %d removed nothing", i)
		}
		mustCheck(t, st, "after purge "+cut.Format(time.StampMilli))
		for _, id := range threads {
			got := eventLog(t, db, id)
			if got.lastSeq != before[id].lastSeq {
				t.Errorf("thread %s: last event seq %d, was %d", id, got.lastSeq, before[id].lastSeq)
			}
			if got.watermark < prevMark[id] || got.watermark >= got.lastSeq {
				t.Errorf("thread %s: watermark %d (was %d, last event %d)", id, got.watermark, prevMark[id], got.lastSeq)
			}
			prevMark[id] = got.watermark
			// A replay from below the watermark is a gap (the reader takes a
			// snapshot); from the watermark on it is exact.
			if got.watermark > 0 {
				gap, err := st.Events(ctx, user, id, got.watermark-1)
				if err != nil || gap.Complete || gap.Events != nil {
					t.Errorf("thread %s: replay from below the watermark = complete %v, %d events, %v", id, gap.Complete, len(gap.Events), err)
				}
				if zero, _ := st.Events(ctx, user, id, 0); zero.Complete {
					t.Errorf("thread %s: replay from 0 claims to be complete", id)
				}
			}
			tail, err := st.Events(ctx, user, id, got.watermark)
			if err != nil || !tail.Complete || len(tail.Events) == 0 || tail.Events[0].Seq != got.watermark+1 {
				t.Errorf("thread %s: replay from the watermark %d = complete %v, %d events, %v", id, got.watermark, tail.Complete, len(tail.Events), err)
			}
		}
		for runID, want := range inFlight {
			if got := runEvents(t, db, runID); !reflect.DeepEqual(got, want) {
				t.Errorf("purge touched the events of run %s in flight:\n got %q\nwant %q", runID, got, want)
			}
		}
	}

	// Everything purgeable went: a thread keeps its last event, and one
	// with a run in flight everything from that run's first event on.
	for _, id := range []string{a, b, c, forkA, forkB} {
		if got := eventLog(t, db, id); got.events != 1 || got.watermark != before[id].lastSeq-1 {
			t.Errorf("thread %s after purging everything: %+v", id, got)
		}
	}
	for id, runID := range map[string]string{d: running, e: waiting} {
		got := eventLog(t, db, id)
		first := strings.Fields(inFlight[runID][0])[0]
		var firstSeq int64
		if err := db.QueryRow(`SELECT MIN(seq) FROM events WHERE thread_id = ?`, id).Scan(&firstSeq); err != nil {
			t.Fatal(err)
		}
		if got.watermark == 0 || first != itoa(firstSeq) {
			t.Errorf("thread %s: watermark %d, first remaining event %d, want the run in flight's first %s", id, got.watermark, firstSeq, first)
		}
	}
	if cancelledEvents := runEvents(t, db, cancelled); len(cancelledEvents) != 0 {
		t.Errorf("the cancelled run kept %d events", len(cancelledEvents))
	}

	// The threads go on: the run in flight finishes, new runs start, and
	// another purge still leaves a healthy log.
	if err := st.AppendDeltas(ctx, leaseW(running), "msg_more", []string{"done"}); err != nil {
		t.Fatal(err)
	}
	if err := st.PublishStep(ctx, leaseW(running), chat.StepOutput{Step: pendingStep(t, st, running), MessageID: "msg_more", Kind: chat.KindText, Content: "done"}); err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(ctx, leaseW(running)); err != nil {
		t.Fatal(err)
	}
	completeRun(t, st, a, "q4", "a four")
	completeRun(t, st, forkB, "q1", "fork b one")
	mustCheck(t, st, "after new runs")
	if _, err := st.Retention().PurgeEvents(ctx, time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got := eventLog(t, db, d); got.events != 1 {
		t.Errorf("thread %s after its run finished and another purge: %+v", d, got)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// Purging works in bounded transactions and bounded calls: with batches of
// one event and at most ten of them per call, a long log goes over several
// calls, each leaving a healthy database.
func TestPurgeEventsIsBounded(t *testing.T) {
	defer store.SetPurgeLimits(1, 10)()
	st, path := open(t)
	db := rawDB(t, path)
	th := newThread(t, st).ThreadID
	other := newThread(t, st).ThreadID
	for range 3 {
		completeRun(t, st, th, "q", "an answer")
		completeRun(t, st, other, "q", "an answer")
	}
	want := eventLog(t, db, th).events - 1 + eventLog(t, db, other).events - 1
	total := 0
	for calls := 1; ; calls++ {
		n, err := st.Retention().PurgeEvents(ctx, time.Now().Add(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if n > 10 {
			t.Fatalf("one call purged %d events, bound 10", n)
		}
		total += int(n)
		mustCheck(t, st, "after a bounded purge")
		if n == 0 {
			break
		}
		if calls > 20 {
			t.Fatal("purge does not converge")
		}
	}
	if total != want {
		t.Fatalf("purged %d events, want %d", total, want)
	}
}

func TestRedactDeletedDrafts(t *testing.T) {
	st, path := open(t)
	db := rawDB(t, path)
	// A draft whose message.published is purged before its text is.
	other := newThread(t, st).ThreadID
	_, streamed2, last2 := streamAndCancel(t, st, other, 1, "old", " draft")
	purgedEvent := saveDraft(t, st, other, streamed2, last2)
	deleteDraft(t, st, other, purgedEvent.MessageID)
	cut := cutoff()
	if _, err := st.Retention().PurgeEvents(ctx, cut); err != nil {
		t.Fatal(err)
	}
	if publishedPayload(t, db, purgedEvent.MessageID) != "" {
		t.Fatal("the draft's message.published was not purged")
	}

	th := newThread(t, st).ThreadID
	_, streamed, lastDelta := streamAndCancel(t, st, th, 1, "Secret", " draft", " text")
	// back is deleted, then its checkpoint is continued: history again.
	back := saveDraft(t, st, th, streamed, lastDelta-2)
	deleteDraft(t, st, th, back.MessageID)
	kept := saveDraft(t, st, th, streamed, lastDelta-1) // deleted here, but a fork holds it
	forked := fork(t, st, th)
	redacted := saveDraft(t, st, th, streamed, lastDelta) // deleted, in no head
	deleteDraft(t, st, th, kept.MessageID)
	deleteDraft(t, st, th, redacted.MessageID)
	resumed, err := st.StartRun(ctx, chat.StartRun{UserID: user, ThreadID: th, ExpectedStateVersion: version(t, st, th), ResumeFromCheckpointID: back.CheckpointID})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: resumed.RunID, Reason: "user_requested", RequestedBy: "tab:a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FinishCancel(ctx, resumed.RunID, nil, 0); err != nil {
		t.Fatal(err)
	}
	payloads := map[string]string{}
	for _, id := range []string{kept.MessageID, redacted.MessageID, back.MessageID} {
		payloads[id] = publishedPayload(t, db, id)
	}

	if n, err := st.Retention().RedactDeletedDrafts(ctx, cut.Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("redact drafts deleted an hour ago = %d, %v", n, err)
	}
	later := time.Now().Add(time.Minute)
	n, err := st.Retention().RedactDeletedDrafts(ctx, later)
	if err != nil || n != 2 {
		t.Fatalf("redacted %d drafts, %v; want 2", n, err)
	}
	mustCheck(t, st, "after redaction")
	if n, err := st.Retention().RedactDeletedDrafts(ctx, later); err != nil || n != 0 {
		t.Fatalf("second redaction = %d, %v", n, err)
	}

	for _, id := range []string{redacted.MessageID, purgedEvent.MessageID} {
		var content string
		var redactedAt sql.NullInt64
		if err := db.QueryRow(`SELECT content, redacted_at FROM messages WHERE message_id = ?`, id).Scan(&content, &redactedAt); err != nil {
			t.Fatal(err)
		}
		if content != "" || !redactedAt.Valid {
			t.Errorf("draft %s: content %q, redacted_at %v", id, content, redactedAt)
		}
	}
	// The event keeps everything but the text, in the store's field order.
	got := publishedPayload(t, db, redacted.MessageID)
	var before, after map[string]any
	if err := json.Unmarshal([]byte(payloads[redacted.MessageID]), &before); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(got), &after); err != nil {
		t.Fatal(err)
	}
	before["message"].(map[string]any)["content"] = ""
	if !reflect.DeepEqual(before, after) || strings.Contains(got, "Secret") {
		t.Errorf("redacted message.published = %s, was %s", got, payloads[redacted.MessageID])
	}
	if !strings.HasPrefix(got, `{"type":"message.published","thread_id":`) {
		t.Errorf("redacted payload lost the event's field order: %s", got)
	}
	// A replay serves the redacted event.
	replay, err := st.Events(ctx, user, th, 0)
	if err != nil || !replay.Complete {
		t.Fatalf("replay = %+v, %v", replay, err)
	}
	served := false
	for _, ev := range replay.Events {
		if ev.Type == chat.EventMessagePublished && strings.Contains(string(ev.Raw), redacted.MessageID) {
			served = string(ev.Raw) == got
		}
	}
	if !served {
		t.Error("the replay does not serve the redacted message.published")
	}
	// Drafts in a head keep their text, in the row and in the event.
	for _, id := range []string{kept.MessageID, back.MessageID} {
		var content string
		var redactedAt sql.NullInt64
		if err := db.QueryRow(`SELECT content, redacted_at FROM messages WHERE message_id = ?`, id).Scan(&content, &redactedAt); err != nil {
			t.Fatal(err)
		}
		if content == "" || redactedAt.Valid || publishedPayload(t, db, id) != payloads[id] {
			t.Errorf("draft %s in a head was redacted: content %q, redacted_at %v", id, content, redactedAt)
		}
	}
	snap, err := st.Snapshot(ctx, user, forked)
	if err != nil {
		t.Fatal(err)
	}
	if last := snap.Messages[len(snap.Messages)-1]; last.MessageID != kept.MessageID || last.Content != "Secret draft" {
		t.Errorf("the fork's copy of the draft = %+v", last)
	}
	snap, err = st.Snapshot(ctx, user, th)
	if err != nil {
		t.Fatal(err)
	}
	if last := snap.Messages[len(snap.Messages)-1]; last.MessageID != back.MessageID || last.Content != "Secret" {
		t.Errorf("the continued checkpoint's draft = %+v", last)
	}
}

// publishedPayload is the stored message.published of a message ("" when
// the log no longer holds it).
func publishedPayload(t *testing.T, db *rawConn, msgID string) string {
	t.Helper()
	var p string
	err := db.QueryRow(`SELECT payload FROM events WHERE message_id = ? AND type = 'message.published'`, msgID).Scan(&p)
	if err == sql.ErrNoRows {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPurgeCancelAudit(t *testing.T) {
	st, path := open(t)
	db := rawDB(t, path)
	audit := func(runID string) int {
		t.Helper()
		var n int
		if err := db.QueryRow(`SELECT COUNT(*) FROM cancel_audit WHERE run_id = ?`, runID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	cancel := func(runID string) {
		t.Helper()
		if _, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: runID, Reason: "user_requested", RequestedBy: "tab:a"}); err != nil {
			t.Fatal(err)
		}
	}
	a := newThread(t, st).ThreadID
	done, _, _ := streamAndCancel(t, st, a, 1, "x")
	cancel(done) // a second request: two audit rows
	b := newThread(t, st).ThreadID
	pending := startAndClaim(t, st, b, "q") // cancel accepted, the worker has not stopped yet
	cancel(pending)
	cut := cutoff()
	c := newThread(t, st).ThreadID
	late, _, _ := streamAndCancel(t, st, c, 1, "y")

	if n, err := st.Retention().PurgeCancelAudit(ctx, cut); err != nil || n != 2 {
		t.Fatalf("purge = %d, %v; want the finished run's 2 rows", n, err)
	}
	if audit(done) != 0 || audit(pending) != 1 || audit(late) != 1 {
		t.Fatalf("audit rows: finished %d, unfinished %d, recent %d", audit(done), audit(pending), audit(late))
	}
	if _, err := st.FinishCancel(ctx, pending, ptr(leaseW(pending)), 0); err != nil {
		t.Fatal(err)
	}
	if n, err := st.Retention().PurgeCancelAudit(ctx, cut); err != nil || n != 1 || audit(pending) != 0 {
		t.Fatalf("purge after the run finished = %d, %v", n, err)
	}
	if n, err := st.Retention().PurgeCancelAudit(ctx, time.Now().Add(time.Minute)); err != nil || n != 1 || audit(late) != 0 {
		t.Fatalf("purge of everything = %d, %v", n, err)
	}
	mustCheck(t, st, "after audit purge")
}

// What the purge removed is tolerated; nothing else is: a violation above
// the watermark is still reported.
func TestCheckAfterPurgeStillCatchesViolations(t *testing.T) {
	st, path := openStore(t, false)
	db := rawDB(t, path)
	th := newThread(t, st).ThreadID
	cancelled, _, _ := streamAndCancel(t, st, th, 1, "x")
	completeRun(t, st, th, "q1", "one")
	cut := cutoff()
	run2, msg2 := completeRun(t, st, th, "q2", "two")
	completeRun(t, st, th, "q3", "three")
	other := newThread(t, st).ThreadID
	completeRun(t, st, other, "q", "other")
	if n, err := st.Retention().PurgeEvents(ctx, cut); err != nil || n == 0 {
		t.Fatalf("purge = %d, %v", n, err)
	}
	mustCheck(t, st, "after purge")
	mark := eventLog(t, db, th).watermark
	if n := len(runEvents(t, db, cancelled)); n != 0 {
		t.Fatalf("the cancelled run kept %d events", n)
	}

	corrupt := []string{
		// 8: a message.published above the watermark is gone.
		`DELETE FROM events WHERE message_id = '` + msg2 + `' AND type = 'message.published'`,
		// 7: a terminal event above the watermark is gone.
		`DELETE FROM events WHERE run_id = '` + run2 + `' AND type = 'run.completed'`,
		// 4: the cancelled run (its run.cancelled purged) emits again.
		`INSERT INTO events (thread_id, seq, type, run_id, state_version, ts, payload) VALUES ('` + th + `', 10000, 'tool.prepared', '` + cancelled + `', 10000, 0, '{}')`,
		// 0: an event reappears below the watermark.
		`INSERT INTO events (thread_id, seq, type, state_version, ts, payload) VALUES ('` + th + `', ` + itoa(mark) + `, 'checkpoint.created', 1, 0, '{}')`,
		// 0: a published event's text differs from its message.
		`UPDATE events SET payload = replace(payload, '"content":"other"', '"content":"changed"') WHERE thread_id = '` + other + `' AND type = 'message.published' AND payload LIKE '%"other"%'`,
		// 0: a watermark beyond the thread's log.
		`UPDATE threads SET events_purged_through = last_seq + 1, events_purged_version = state_version WHERE thread_id = '` + other + `'`,
	}
	for _, q := range corrupt {
		if res, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		} else if n, _ := res.RowsAffected(); n != 1 {
			t.Fatalf("%s changed %d rows", q, n)
		}
	}
	vs, err := st.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, v := range vs {
		all = append(all, v.String())
	}
	report := strings.Join(all, "\n")
	for _, want := range []string{
		"invariant 8: message " + msg2 + " has 0 message.published events",
		"invariant 7: run " + run2 + " is completed without its terminal event",
		"invariant 4: run " + cancelled + " emitted tool.prepared (seq 10000) after run.cancelled (seq " + itoa(mark) + ")",
		"at or below its purge watermark",
		"carries another text than message",
		"thread " + other + " has an impossible event purge watermark",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("check did not report %q; got:\n%s", want, report)
		}
	}
}
