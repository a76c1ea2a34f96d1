package store_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
	"github.com/honestcancel/gateway/tools/email"
)

// healthy is a database that exercises every rule of the audit: a
// completed run, a cancelled one with a saved fragment, an email confirmed
// and accepted by the embedded provider, and a fork continued by a run of
// its own. run1's answer and run2's stream are written one delta per
// batch, so a corruption can remove one delta of them. The ids name what
// the corruptions below touch.
type healthy struct {
	st                      *store.Store
	db                      *rawConn
	a, b                    string // the thread and its fork
	run1, run2, run3, run4  string // completed; cancelled; the email; the fork's
	answer1                 string // run1's published answer
	answer1CP               string // the checkpoint run1's answer is published in
	rootA, rootB            string // the threads' first checkpoints
	fragment, fragmentCP    string // saved from run2's stream, and its checkpoint
	streamed2               string // run2's streamed message (never published)
	deltas2                 []int64
	op, key                 string // the email's operation and idempotency key
	deltas1                 []int64
	deltas3                 []int64 // run3's deltas: after run2's run.cancelled
	lastSeqA, lastVersionA  int64
	lastTypeA, lastPayloadA string
}

func newHealthy(t *testing.T) *healthy {
	t.Helper()
	st, path := openStore(t, false)
	h := &healthy{st: st, db: rawDB(t, path)}
	outbox, err := email.NewOutbox(st.ServiceDB(), email.OutboxConfig{})
	if err != nil {
		t.Fatal(err)
	}
	snap := newThread(t, st)
	h.a, h.rootA = snap.ThreadID, snap.HeadCheckpointID

	// run1 answers.
	h.run1 = startAndClaim(t, st, h.a, "hello")
	h.answer1 = chat.NewID(chat.PrefixMessage)
	step := pendingStep(t, st, h.run1)
	h.appendBatches(t, leaseW(h.run1), h.answer1, "Hel", "lo")
	h.deltas1 = h.deltaSeqs(t, h.run1)
	if err := st.PublishStep(ctx, leaseW(h.run1), chat.StepOutput{Step: step, MessageID: h.answer1, Kind: chat.KindText, Content: "Hello"}); err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(ctx, leaseW(h.run1)); err != nil {
		t.Fatal(err)
	}
	if err := h.db.QueryRow(`SELECT checkpoint_id FROM messages WHERE message_id = ?`, h.answer1).Scan(&h.answer1CP); err != nil {
		t.Fatal(err)
	}

	// run2 streams, a tab saves what it saw, the user cancels.
	h.run2 = startAndClaim(t, st, h.a, "more")
	h.streamed2 = chat.NewID(chat.PrefixMessage)
	h.appendBatches(t, leaseW(h.run2), h.streamed2, "a", "b", "c")
	h.deltas2 = h.deltaSeqs(t, h.run2)
	saved := saveDraft(t, st, h.a, h.streamed2, h.deltas2[1])
	h.fragment, h.fragmentCP = saved.MessageID, saved.CheckpointID
	if _, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: h.run2, Reason: "user_requested", RequestedBy: "tab:a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FinishCancel(ctx, h.run2, ptr(leaseW(h.run2)), 0); err != nil {
		t.Fatal(err)
	}

	// run3 sends an email: prepared, confirmed, accepted by the provider.
	h.run3 = startAndClaim(t, st, h.a, "send it")
	if err := st.AppendDeltas(ctx, leaseW(h.run3), chat.NewID(chat.PrefixMessage), []string{"Sending", "."}); err != nil {
		t.Fatal(err)
	}
	h.deltas3 = h.deltaSeqs(t, h.run3)
	h.op = chat.NewID(chat.PrefixOperation)
	h.key = "email:" + h.op + ":send"
	args := json.RawMessage(`{"to":"ann@example.com","subject":"Quote","body":"Here."}`)
	if err := st.PublishStep(ctx, leaseW(h.run3), chat.StepOutput{Step: pendingStep(t, st, h.run3),
		Call: &chat.ToolCall{OperationID: h.op, Tool: "send_email", Contract: "consequential", Args: args, Preview: args, IdempotencyKey: h.key}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.DecideOperation(ctx, chat.Decide{UserID: user, OperationID: h.op, ExpectedStateVersion: version(t, st, h.a), Confirm: true}); err != nil {
		t.Fatal(err)
	}
	again := claimOnly(t, st, "w", h.run3, time.Hour).Lease
	if err := st.SetOperationPhase(ctx, again, h.op, chat.PhaseCommitting, "", true); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Send(ctx, h.key, email.Email{To: "ann@example.com", Subject: "Quote", Body: "Here."}); err != nil {
		t.Fatal(err)
	}
	if err := st.RecordToolResult(ctx, again, h.op, chat.ToolOutcome{Phase: chat.PhaseCommitted, Outcome: chat.OutcomeCommitted,
		Result: json.RawMessage(`{"status":"committed"}`)}); err != nil {
		t.Fatal(err)
	}
	answer := chat.NewID(chat.PrefixMessage)
	step = pendingStep(t, st, h.run3)
	if err := st.AppendDeltas(ctx, again, answer, []string{"Sent", "."}); err != nil {
		t.Fatal(err)
	}
	if err := st.PublishStep(ctx, again, chat.StepOutput{Step: step, MessageID: answer, Kind: chat.KindText, Content: "Sent."}); err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(ctx, again); err != nil {
		t.Fatal(err)
	}

	// A fork from before the email, continued there.
	f, err := st.Fork(ctx, chat.Fork{UserID: user, ThreadID: h.a, FromCheckpointID: saved.CheckpointID})
	if err != nil {
		t.Fatal(err)
	}
	h.b = f.ThreadID
	if err := h.db.QueryRow(`SELECT head_checkpoint_id FROM threads WHERE thread_id = ?`, h.b).Scan(&h.rootB); err != nil {
		t.Fatal(err)
	}
	ack, err := st.StartRun(ctx, chat.StartRun{UserID: user, ThreadID: h.b, ExpectedStateVersion: version(t, st, h.b)})
	if err != nil {
		t.Fatal(err)
	}
	h.run4 = ack.RunID
	c := claimOnly(t, st, "w", h.run4, time.Hour)
	msg4 := chat.NewID(chat.PrefixMessage)
	step = pendingStep(t, st, h.run4)
	if err := st.AppendDeltas(ctx, c.Lease, msg4, []string{"Again"}); err != nil {
		t.Fatal(err)
	}
	if err := st.PublishStep(ctx, c.Lease, chat.StepOutput{Step: step, MessageID: msg4, Kind: chat.KindText, Content: "Again"}); err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(ctx, c.Lease); err != nil {
		t.Fatal(err)
	}

	if err := h.db.QueryRow(`SELECT seq, state_version, type, payload FROM events WHERE thread_id = ? ORDER BY seq DESC LIMIT 1`, h.a).
		Scan(&h.lastSeqA, &h.lastVersionA, &h.lastTypeA, &h.lastPayloadA); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, st, "before the corruption")
	return h
}

// appendBatches streams texts as messageID's deltas, writing each in a
// batch of its own.
func (h *healthy) appendBatches(t *testing.T, lease chat.Lease, messageID string, texts ...string) {
	t.Helper()
	count := func() int {
		var n int
		if err := h.db.QueryRow(`SELECT COUNT(*) FROM stream_batches WHERE message_id = ?`, messageID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := count()
	for _, text := range texts {
		if err := h.st.AppendDeltas(ctx, lease, messageID, []string{text}); err != nil {
			t.Fatal(err)
		}
		if err := h.st.FlushStream(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := count() - before; n != len(texts) {
		t.Fatalf("%d deltas of message %s went into %d batches, want one each", len(texts), messageID, n)
	}
}

// loseDeltas deletes the deltas of thread at seqs first..last and records
// them lost in a crash, as a recovery would for seqs never written.
func (h *healthy) loseDeltas(t *testing.T, thread string, first, last int64) {
	t.Helper()
	h.exec(t, `DELETE FROM stream_batches WHERE thread_id = ? AND first_seq >= ? AND last_seq <= ?`, thread, first, last)
	h.exec(t, `INSERT INTO stream_gaps (thread_id, first_seq, last_seq, recorded_at) VALUES (?, ?, ?, ?)`, thread, first, last, time.Now().UnixMilli())
}

func (h *healthy) deltaSeqs(t *testing.T, runID string) []int64 {
	t.Helper()
	if err := h.st.FlushStream(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := h.db.Query(`SELECT first_seq, last_seq FROM stream_batches WHERE run_id = ? ORDER BY first_seq`, runID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var first, last int64
		if err := rows.Scan(&first, &last); err != nil {
			t.Fatal(err)
		}
		for s := first; s <= last; s++ {
			out = append(out, s)
		}
	}
	return out
}

// eventRow inserts a durable event at the end of thread's log the way the
// store writes one, and moves the thread's sequencer past it.
func (h *healthy) appendEvent(t *testing.T, thread string, ev chat.Event) {
	t.Helper()
	var seq, v int64
	if err := h.db.QueryRow(`SELECT last_seq, state_version FROM threads WHERE thread_id = ?`, thread).Scan(&seq, &v); err != nil {
		t.Fatal(err)
	}
	ev.ThreadID, ev.Seq, ev.StateVersion, ev.TS = thread, seq+1, v+1, time.Now().UnixMilli()
	if err := ev.Encode(); err != nil {
		t.Fatal(err)
	}
	h.exec(t, `INSERT INTO events (thread_id, seq, type, run_id, message_id, state_version, ts, payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		thread, ev.Seq, ev.Type, nullable(ev.RunID), nullable(ev.MessageID), ev.StateVersion, ev.TS, string(ev.Raw))
	h.exec(t, `UPDATE threads SET last_seq = ?, state_version = ? WHERE thread_id = ?`, ev.Seq, ev.StateVersion, thread)
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func (h *healthy) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	res, err := h.db.Exec(q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		t.Fatalf("%s changed nothing", q)
	}
}

// The judge must see every rule broken: each case corrupts a healthy
// database once, the way a bug would, and the audit must report exactly
// that violation — the invariant and what is wrong — and nothing but the
// listed knock-on effects of the same corruption.
func TestCheckReportsEachInvariantBroken(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt func(t *testing.T, h *healthy)
		inv     int
		want    string // in the violation's text
		also    []int  // invariants the same corruption also breaks
	}{
		{"a purge watermark beyond the log", func(t *testing.T, h *healthy) {
			h.exec(t, `UPDATE threads SET events_purged_through = last_seq + 5, events_purged_version = state_version WHERE thread_id = ?`, h.a)
		}, 0, "impossible event purge watermark", []int{5}},
		{"a message outside the checkpoint it names", func(t *testing.T, h *healthy) {
			h.exec(t, `UPDATE messages SET checkpoint_id = ? WHERE message_id = ?`, h.rootA, h.answer1)
		}, 1, "which is not one of the thread's that contains it", []int{9}},
		{"a key the provider accepted twice", func(t *testing.T, h *healthy) {
			h.exec(t, `INSERT INTO outbox_attempts (idempotency_key, at, result) VALUES (?, 1, 'accepted')`, h.key)
		}, 2, "accepted by the provider 2 times", nil},
		{"a commit without a key", func(t *testing.T, h *healthy) {
			h.exec(t, `UPDATE operations SET idempotency_key = NULL WHERE operation_id = ?`, h.op)
		}, 2, "without an idempotency key", nil},
		{"a run starting from another conversation's checkpoint", func(t *testing.T, h *healthy) {
			h.exec(t, `UPDATE runs SET base_checkpoint_id = ? WHERE run_id = ?`, h.rootB, h.run1)
		}, 3, "not in thread", nil},
		{"a delta of a run after its run.cancelled", func(t *testing.T, h *healthy) {
			h.exec(t, `UPDATE stream_batches SET run_id = ? WHERE thread_id = ? AND first_seq <= ? AND last_seq >= ?`, h.run2, h.a, h.deltas3[0], h.deltas3[0])
		}, 4, "streamed a delta", nil},
		{"state_version moved without an event", func(t *testing.T, h *healthy) {
			h.exec(t, `UPDATE threads SET state_version = state_version + 1 WHERE thread_id = ?`, h.a)
		}, 5, "but its last durable event says", nil},
		{"a version jump in the log", func(t *testing.T, h *healthy) {
			from := fmt.Sprintf(`"state_version":%d`, h.lastVersionA)
			to := fmt.Sprintf(`"state_version":%d`, h.lastVersionA+1)
			if strings.Count(h.lastPayloadA, from) != 1 {
				t.Fatalf("last event %s %s", h.lastTypeA, h.lastPayloadA)
			}
			h.exec(t, `UPDATE events SET state_version = state_version + 1, payload = ? WHERE thread_id = ? AND seq = ?`,
				strings.Replace(h.lastPayloadA, from, to, 1), h.a, h.lastSeqA)
			h.exec(t, `UPDATE threads SET state_version = state_version + 1 WHERE thread_id = ?`, h.a)
		}, 5, "one more than the durable event before it", nil},
		{"a message at another version than its event", func(t *testing.T, h *healthy) {
			h.exec(t, `UPDATE messages SET state_version = state_version + 1 WHERE message_id = ?`, h.answer1)
		}, 5, "but its message.published says", nil},
		{"history holding an id that was never published", func(t *testing.T, h *healthy) {
			var ids string
			if err := h.db.QueryRow(`SELECT message_ids FROM checkpoints WHERE checkpoint_id = ?`, h.fragmentCP).Scan(&ids); err != nil {
				t.Fatal(err)
			}
			h.exec(t, `UPDATE checkpoints SET message_ids = ? WHERE checkpoint_id = ?`, strings.TrimSuffix(ids, "]")+`,"msg_ghost"]`, h.fragmentCP)
		}, 6, "msg_ghost, which is not a published message", nil},
		{"a checkpoint stored as appended to a parent that is not there", func(t *testing.T, h *healthy) {
			h.exec(t, `UPDATE checkpoints SET parent_checkpoint_id = 'cp_missing' WHERE checkpoint_id = ? AND appended = 1`, h.fragmentCP)
		}, 3, "lists continue cp_missing, which is not a checkpoint of thread", []int{1, 5, 8}}, // its descendants cannot be made whole either
		{"an answer that is not its deltas", func(t *testing.T, h *healthy) {
			h.exec(t, `UPDATE messages SET content = 'Help' WHERE message_id = ?`, h.answer1)
		}, 6, "differs from the text of its deltas", []int{8}},
		{"a saved fragment that is not what the tab saw", func(t *testing.T, h *healthy) {
			h.exec(t, `UPDATE messages SET content = 'abc' WHERE message_id = ?`, h.fragment)
		}, 6, "is not exactly the text of message", []int{8}},
		{"a completed run running again", func(t *testing.T, h *healthy) {
			h.exec(t, `UPDATE runs SET status = 'running', finished_at = NULL WHERE run_id = ?`, h.run1)
		}, 7, "is running but emitted run.completed", nil},
		{"a gap in the seqs", func(t *testing.T, h *healthy) {
			h.exec(t, `DELETE FROM stream_batches WHERE thread_id = ? AND first_seq <= ? AND last_seq >= ?`, h.a, h.deltas1[1], h.deltas1[1])
		}, 8, "from its log, and no purge explains it", []int{6}},
		{"a message without its event", func(t *testing.T, h *healthy) {
			h.exec(t, `DELETE FROM events WHERE message_id = ? AND type = 'message.published'`, h.answer1)
		}, 8, "has 0 message.published events", []int{5}},
		{"a checkpoint without its event", func(t *testing.T, h *healthy) {
			h.exec(t, `DELETE FROM events WHERE thread_id = ? AND type = 'checkpoint.created' AND payload LIKE ?`, h.a, `%"checkpoint_id":"`+h.answer1CP+`"%`)
		}, 8, "has 0 checkpoint.created events", []int{5}},
		{"an event without its row", func(t *testing.T, h *healthy) {
			h.exec(t, `UPDATE events SET payload = replace(payload, ?, 'cp_ghost') WHERE thread_id = ? AND type = 'checkpoint.created' AND payload LIKE ?`,
				h.answer1CP, h.a, `%"checkpoint_id":"`+h.answer1CP+`"%`)
		}, 8, `names checkpoint "cp_ghost", which does not exist`, nil},
		{"a head moved without its event", func(t *testing.T, h *healthy) {
			h.exec(t, `UPDATE threads SET head_checkpoint_id = ? WHERE thread_id = ?`, h.answer1CP, h.a)
		}, 8, "but its last checkpoint.created or thread.head_moved put it at", nil},
		{"a head_moved from a head the log never had", func(t *testing.T, h *healthy) {
			var head string
			if err := h.db.QueryRow(`SELECT head_checkpoint_id FROM threads WHERE thread_id = ?`, h.a).Scan(&head); err != nil {
				t.Fatal(err)
			}
			h.appendEvent(t, h.a, chat.Event{Type: chat.EventThreadHeadMoved, Body: chat.ThreadHeadMovedBody{HeadCheckpointID: head, PreviousHeadCheckpointID: h.answer1CP}})
		}, 8, "says the head was", nil},
		{"a thread deleted without its event", func(t *testing.T, h *healthy) {
			h.exec(t, `UPDATE threads SET deleted_at = 1 WHERE thread_id = ?`, h.a)
		}, 0, "is deleted but its log has no thread.deleted", nil},
		{"an event after thread.deleted", func(t *testing.T, h *healthy) {
			h.appendEvent(t, h.a, chat.Event{Type: chat.EventThreadDeleted})
			h.exec(t, `UPDATE threads SET deleted_at = 1 WHERE thread_id = ?`, h.a)
			h.appendEvent(t, h.a, chat.Event{Type: chat.EventThreadHeadMoved, Body: chat.ThreadHeadMovedBody{HeadCheckpointID: h.answer1CP, PreviousHeadCheckpointID: h.answer1CP}})
		}, 0, "after thread.deleted", []int{8}},
		{"a thread deleted while its run goes on", func(t *testing.T, h *healthy) {
			h.appendEvent(t, h.a, chat.Event{Type: chat.EventThreadDeleted})
			h.exec(t, `UPDATE threads SET deleted_at = 1 WHERE thread_id = ?`, h.a)
			h.exec(t, `UPDATE runs SET status = 'running', finished_at = NULL WHERE run_id = ?`, h.run1)
		}, 0, "was deleted with run", []int{7}},
		{"a live thread's message emptied as if redacted", func(t *testing.T, h *healthy) {
			h.exec(t, `UPDATE messages SET content = '', redacted_at = 1 WHERE message_id = ?`, h.answer1)
		}, 0, "is marked redacted but is not an emptied deleted draft", []int{8}},
		{"a step published twice", func(t *testing.T, h *healthy) {
			// What a stale execution of run1 did before fencing: a second
			// answer on top of run1's, whose checkpoint had no step left;
			// its checkpoint stored as the store writes one that continues
			// its parent: what it appended (checkpoints.go).
			var seq, v int64
			if err := h.db.QueryRow(`SELECT last_seq, state_version FROM threads WHERE thread_id = ?`, h.a).Scan(&seq, &v); err != nil {
				t.Fatal(err)
			}
			dup, cp := chat.NewID(chat.PrefixMessage), chat.NewID(chat.PrefixCheckpoint)
			now := time.Now().UnixMilli()
			h.exec(t, `INSERT INTO messages (message_id, thread_id, role, kind, content, state_version, checkpoint_id, run_id, created_at)
				VALUES (?, ?, 'assistant', 'text', 'Hello again', ?, ?, ?, ?)`, dup, h.a, v+1, cp, h.run1, now)
			h.appendEvent(t, h.a, chat.Event{Type: chat.EventMessagePublished, RunID: h.run1, MessageID: dup,
				Body: chat.MessagePublishedBody{Message: chat.Message{MessageID: dup, ThreadID: h.a, Role: chat.RoleAssistant, Kind: chat.KindText,
					Content: "Hello again", StateVersion: v + 1, CheckpointID: cp, RunID: &h.run1, CreatedAt: time.UnixMilli(now).UTC()}, CheckpointID: cp}})
			h.exec(t, `INSERT INTO checkpoints (checkpoint_id, thread_id, parent_checkpoint_id, state_version, message_ids, completed_steps, tool_results, run_id, created_at, appended)
				VALUES (?, ?, ?, ?, ?, '["generate"]', '[]', ?, ?, 1)`, cp, h.a, h.answer1CP, v+2, `["`+dup+`"]`, h.run1, now)
			h.appendEvent(t, h.a, chat.Event{Type: chat.EventCheckpointCreated, RunID: h.run1,
				Body: chat.CheckpointCreatedBody{CheckpointID: cp, ParentCheckpointID: &h.answer1CP}})
			h.exec(t, `UPDATE threads SET head_checkpoint_id = ? WHERE thread_id = ?`, cp, h.a) // as every new checkpoint does
		}, 9, "which had no step left to run", nil},
		{"not_started for a key the provider accepted", func(t *testing.T, h *healthy) {
			h.exec(t, `UPDATE operations SET phase = 'voided', outcome = 'not_started', commit_started_at = NULL WHERE operation_id = ?`, h.op)
		}, 10, "the provider accepted key", nil},
		{"not_started after the call reached its system", func(t *testing.T, h *healthy) {
			h.exec(t, `UPDATE operations SET phase = 'voided', outcome = 'not_started' WHERE operation_id = ?`, h.op)
		}, 10, "reached its system but reports voided/not_started", nil},
		{"an ended run with its call still in flight", func(t *testing.T, h *healthy) {
			h.exec(t, `UPDATE operations SET phase = 'committing', outcome = NULL WHERE operation_id = ?`, h.op)
		}, 10, "still committing", nil},
		{"an unknown outcome nobody reconciles", func(t *testing.T, h *healthy) {
			h.exec(t, `UPDATE operations SET phase = 'unknown', outcome = 'unknown', reconcile_next_at = NULL, reconcile_until = NULL WHERE operation_id = ?`, h.op)
		}, 10, "no reconciliation going on", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHealthy(t)
			tc.corrupt(t, h)
			assertReported(t, h, tc.inv, tc.want, tc.also, nil)
		})
	}
}

// assertReported audits h and requires a violation of invariant inv whose
// text holds want and every one of names, and no violation of an
// invariant outside inv and also.
func assertReported(t *testing.T, h *healthy, inv int, want string, also []int, names []string) {
	t.Helper()
	audit, err := h.st.Audit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[int]bool{inv: true}
	for _, n := range also {
		allowed[n] = true
	}
	found := false
	var report []string
	for _, v := range audit.Violations {
		report = append(report, v.String())
		if v.Invariant == inv && strings.Contains(v.Detail, want) {
			named := true
			for _, n := range names {
				named = named && strings.Contains(v.Detail, n)
			}
			found = found || named
		}
		if !allowed[v.Invariant] {
			t.Errorf("reported a violation of invariant %d the corruption does not explain: %s", v.Invariant, v)
		}
	}
	if !found {
		t.Errorf("invariant %d (%q naming %q) not reported; got:\n%s", inv, want, names, strings.Join(report, "\n"))
	}
}

// The blind spots an outside review found (issue 30): each corruption
// hides behind a one-way comparison or a recorded gap. The violation must
// name what is wrong (thread, message, operation or key).
func TestCheckReportsWhatOneWayQueriesMissed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt func(t *testing.T, h *healthy)
		inv     int
		want    string
		also    []int
		names   func(h *healthy) []string
	}{
		{"a key the provider accepted that no operation carries", func(t *testing.T, h *healthy) {
			h.exec(t, `INSERT INTO outbox (idempotency_key, recipient, subject, body, provider_id, accepted_at) VALUES ('email:ghost:send', 'x@example.com', 's', 'b', 'prov_ghost', 1)`)
			h.exec(t, `INSERT INTO outbox_attempts (idempotency_key, at, result) VALUES ('email:ghost:send', 1, 'accepted')`)
		}, 2, "which no operation carries", nil, func(h *healthy) []string { return []string{`"email:ghost:send"`, "prov_ghost"} }},
		{"an operation's key replaced after the provider accepted it", func(t *testing.T, h *healthy) {
			h.exec(t, `UPDATE operations SET idempotency_key = 'email:other:send' WHERE operation_id = ?`, h.op)
		}, 2, "which no operation carries", []int{10}, func(h *healthy) []string { return []string{h.key} }},
		{"committed for a key the provider refused", func(t *testing.T, h *healthy) {
			h.exec(t, `DELETE FROM outbox WHERE idempotency_key = ?`, h.key)
			h.exec(t, `UPDATE outbox_attempts SET result = 'rejected' WHERE idempotency_key = ?`, h.key)
		}, 10, "reports committed, but the provider never accepted its key", nil, func(h *healthy) []string { return []string{h.op, h.a, h.key} }},
		{"committed for a key the provider never saw", func(t *testing.T, h *healthy) {
			h.exec(t, `DELETE FROM outbox WHERE idempotency_key = ?`, h.key)
			h.exec(t, `DELETE FROM outbox_attempts WHERE idempotency_key = ?`, h.key)
			h.exec(t, `INSERT INTO outbox_attempts (idempotency_key, at, result) VALUES ('email:other:send', 1, 'rejected')`)
		}, 10, "reports committed, but the provider never accepted its key", nil, func(h *healthy) []string { return []string{h.op, h.a, h.key} }},
		{"the provider's record of an accepted key lost", func(t *testing.T, h *healthy) {
			h.exec(t, `DELETE FROM outbox WHERE idempotency_key = ?`, h.key)
		}, 2, "holds no record of it (outbox)", []int{10}, func(h *healthy) []string { return []string{h.key} }},
		{"the provider's log of an acceptance lost", func(t *testing.T, h *healthy) {
			h.exec(t, `DELETE FROM outbox_attempts WHERE idempotency_key = ?`, h.key)
		}, 2, "has no acceptance of it", nil, func(h *healthy) []string { return []string{h.key} }},
		{"a published answer's last delta deleted and recorded lost", func(t *testing.T, h *healthy) {
			h.loseDeltas(t, h.a, h.deltas1[1], h.deltas1[1])
		}, 6, "is published, but part 1 of its 2 written deltas", nil, func(h *healthy) []string { return []string{h.answer1, h.a, h.run1} }},
		{"a published answer's first delta deleted and recorded lost", func(t *testing.T, h *healthy) {
			h.loseDeltas(t, h.a, h.deltas1[0], h.deltas1[0])
		}, 6, "is published, but part 0 of its 2 written deltas", nil, func(h *healthy) []string { return []string{h.answer1, h.a, h.run1} }},
		{"all of a published answer's deltas deleted and recorded lost", func(t *testing.T, h *healthy) {
			h.loseDeltas(t, h.a, h.deltas1[0], h.deltas1[1])
		}, 6, "is published, but parts 0–1 of its 2 written deltas", nil, func(h *healthy) []string { return []string{h.answer1, h.a, h.run1} }},
		{"a saved fragment's delta deleted and recorded lost", func(t *testing.T, h *healthy) {
			h.loseDeltas(t, h.a, h.deltas2[0], h.deltas2[0])
		}, 6, "but part 0 of it", []int{8}, func(h *healthy) []string { return []string{h.fragment, h.streamed2, h.a} }},
		{"a delta past the saved fragment deleted and recorded lost", func(t *testing.T, h *healthy) {
			h.loseDeltas(t, h.a, h.deltas2[2], h.deltas2[2])
		}, 8, "part 2 of the 3 written deltas of message", nil, func(h *healthy) []string { return []string{h.streamed2, h.a} }},
		{"a published answer's deltas uncounted", func(t *testing.T, h *healthy) {
			h.exec(t, `DELETE FROM stream_messages WHERE message_id = ?`, h.answer1)
		}, 6, "no stream_messages row counting them", nil, func(h *healthy) []string { return []string{h.answer1, h.a} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHealthy(t)
			tc.corrupt(t, h)
			assertReported(t, h, tc.inv, tc.want, tc.also, tc.names(h))
		})
	}
}

// The audit says what this database cannot show.
func TestCheckSaysWhatItCannotSee(t *testing.T) {
	h := newHealthy(t)
	audit, err := h.st.Audit(ctx)
	if err != nil || len(audit.Violations) != 0 {
		t.Fatalf("audit = %+v, %v", audit, err)
	}
	if len(audit.Unchecked) != 0 {
		t.Fatalf("with the embedded provider's log and no other provider, nothing is out of sight: %v", audit.Unchecked)
	}
	h.exec(t, `UPDATE operations SET tool = 'refund_order' WHERE operation_id = ?`, h.op)
	audit, err = h.st.Audit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(audit.Unchecked) != 1 || !strings.Contains(audit.Unchecked[0], "refund_order") {
		t.Fatalf("unchecked = %v, want the webhook provider named", audit.Unchecked)
	}
	if audit.Threads != 2 || audit.Runs != 4 || audit.Operations != 1 {
		t.Fatalf("read %d threads, %d runs, %d operations; want 2, 4, 1", audit.Threads, audit.Runs, audit.Operations)
	}

	// A send_email committed with every record of the embedded provider
	// wiped is still a commit the provider never accepted (the gateway's
	// send_email has no other provider; tests' stand-ins have other names).
	h.exec(t, `UPDATE operations SET tool = 'send_email' WHERE operation_id = ?`, h.op)
	h.exec(t, `DELETE FROM outbox WHERE idempotency_key = ?`, h.key)
	h.exec(t, `DELETE FROM outbox_attempts WHERE idempotency_key = ?`, h.key)
	audit, err = h.st.Audit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(audit.Violations) != 1 || audit.Violations[0].Invariant != 10 || !strings.Contains(audit.Violations[0].Detail, h.op) {
		t.Fatalf("violations %v; want invariant 10 naming operation %s, committed with the provider's records wiped", audit.Violations, h.op)
	}
}

// Retention removes a published answer's first deltas (PurgeStream takes a
// prefix of seqs): the rest can no longer be compared whole, and that is
// no violation. What is left must still be the end of its text, and a
// delta gone above the stream purge mark is still a violation, also when
// a stream_gaps record covers its seq.
func TestCheckTellsPurgedDeltasFromLostOnes(t *testing.T) {
	st, path := openStore(t, false)
	h := &healthy{st: st, db: rawDB(t, path)}
	// Two threads, each with an answer whose first delta is older than the
	// cut and whose second is newer.
	var threads, answers, runs []string
	var steps []chat.Pending
	for range 2 {
		th := newThread(t, st).ThreadID
		runID := startAndClaim(t, st, th, "hello")
		answer := chat.NewID(chat.PrefixMessage)
		steps = append(steps, pendingStep(t, st, runID))
		h.appendBatches(t, leaseW(runID), answer, "Hel")
		threads, answers, runs = append(threads, th), append(answers, answer), append(runs, runID)
	}
	cut := cutoff()
	for i, runID := range runs {
		h.appendBatches(t, leaseW(runID), answers[i], "lo")
		if err := st.PublishStep(ctx, leaseW(runID), chat.StepOutput{Step: steps[i], MessageID: answers[i], Kind: chat.KindText, Content: "Hello"}); err != nil {
			t.Fatal(err)
		}
		if err := st.Complete(ctx, leaseW(runID)); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := st.Retention().PurgeStream(ctx, cut); err != nil || n != 2 {
		t.Fatalf("purge = %d, %v; want each answer's first delta", n, err)
	}
	for _, id := range answers {
		var held int
		if err := h.db.QueryRow(`SELECT COUNT(*) FROM stream_batches WHERE message_id = ?`, id).Scan(&held); err != nil || held != 1 {
			t.Fatalf("answer %s keeps %d batches (%v), want its second", id, held, err)
		}
	}
	mustCheck(t, st, "after the purge")

	// The first thread's buffered end is not its answer's end; the second
	// thread's last delta goes, recorded lost.
	h.exec(t, `UPDATE stream_batches SET texts = '["LO"]' WHERE message_id = ?`, answers[0])
	var last int64
	if err := h.db.QueryRow(`SELECT last_seq FROM stream_batches WHERE message_id = ?`, answers[1]).Scan(&last); err != nil {
		t.Fatal(err)
	}
	h.loseDeltas(t, threads[1], last, last)
	assertReported(t, h, 6, "does not end with the text of its deltas still buffered", nil, []string{answers[0]})
	assertReported(t, h, 6, "is published, but part 1 of its 2 written deltas", nil, []string{answers[1], threads[1], runs[1]})
}
