package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/honestcancel/gateway/chat"
)

// Violation is one broken invariant found by Check.
type Violation struct {
	Invariant int    // 1..8 as numbered in the protocol; 0 for other consistency rules
	Detail    string // what is wrong, with ids
}

func (v Violation) String() string {
	if v.Invariant == 0 {
		return "consistency: " + v.Detail
	}
	return fmt.Sprintf("invariant %d: %s", v.Invariant, v.Detail)
}

// Check audits the invariants of the protocol over the whole database in
// one consistent read and returns every violation found (none = healthy).
func (s *Store) Check(ctx context.Context) ([]Violation, error) {
	var out []Violation
	err := s.read(ctx, func(q *sqlx.Tx) error {
		var err error
		out, err = check(ctx, q, s.pg)
		return err
	})
	return out, err
}

type checkEvent struct {
	ThreadID     string  `db:"thread_id"`
	Seq          int64   `db:"seq"`
	Type         string  `db:"type"`
	RunID        *string `db:"run_id"`
	MessageID    *string `db:"message_id"`
	StateVersion int64   `db:"state_version"`
	Payload      string  `db:"payload"`
}

func check(ctx context.Context, q *sqlx.Tx, pg bool) ([]Violation, error) {
	var vs []Violation
	add := func(inv int, format string, args ...any) {
		vs = append(vs, Violation{Invariant: inv, Detail: fmt.Sprintf(format, args...)})
	}
	var threads []threadRow
	if err := q.SelectContext(ctx, &threads, `SELECT `+threadCols+` FROM threads`); err != nil {
		return nil, err
	}
	var cpRows []checkpointRow
	if err := q.SelectContext(ctx, &cpRows, `SELECT `+checkpointCols+` FROM checkpoints`); err != nil {
		return nil, err
	}
	var msgRows []messageRow
	if err := q.SelectContext(ctx, &msgRows, `SELECT `+messageCols+` FROM messages`); err != nil {
		return nil, err
	}
	var runRows []runRow
	if err := q.SelectContext(ctx, &runRows, `SELECT `+runCols+` FROM runs`); err != nil {
		return nil, err
	}
	var events []checkEvent
	if err := q.SelectContext(ctx, &events, `SELECT thread_id, seq, type, run_id, message_id, state_version, payload FROM events ORDER BY thread_id, seq`); err != nil {
		return nil, err
	}
	var deltaSeqs []struct {
		ThreadID  string `db:"thread_id"`
		Seq       int64  `db:"seq"`
		RunID     string `db:"run_id"`
		MessageID string `db:"message_id"`
		Part      int    `db:"part"`
		Text      string `db:"text"`
	}
	if err := q.SelectContext(ctx, &deltaSeqs, `SELECT thread_id, seq, run_id, message_id, part, text FROM stream_deltas ORDER BY thread_id, seq`); err != nil {
		return nil, err
	}

	cps := map[string]chat.Checkpoint{}
	inSomeCheckpoint := map[string]bool{}
	for _, r := range cpRows {
		cp, err := r.checkpoint()
		if err != nil {
			add(0, "%v", err)
			continue
		}
		cps[cp.CheckpointID] = cp
		for _, id := range cp.MessageIDs {
			inSomeCheckpoint[id] = true
		}
	}
	msgs := map[string]messageRow{}
	for _, m := range msgRows {
		msgs[m.MessageID] = m
	}
	threadByID := map[string]threadRow{}
	for _, t := range threads {
		threadByID[t.ThreadID] = t
	}

	// Retention: a thread's watermark says what PurgeEvents removed from its
	// event log: every event with seq <= events_purged_through, the last of
	// them at events_purged_version, none with a ts after events_purged_ts.
	// Only an event that lies there may be absent; everything above it is
	// held to the rules as strictly as in a log never purged.
	//
	// A message's message.published carries the message's state_version, so
	// it was purged exactly when that version is at or below the mark.
	publishedPurged := func(m messageRow) bool {
		return m.StateVersion <= threadByID[m.ThreadID].EventsPurgedVersion
	}
	// A run's terminal event has the run's finished_at as ts and comes after
	// its run.started (at start_state_version): it can have been purged only
	// when both lie within the mark.
	terminalPurged := func(r runRow) bool {
		th := threadByID[r.ThreadID]
		return r.FinishedAt.Valid && r.StartStateVersion <= th.EventsPurgedVersion && r.FinishedAt.Int64 <= th.EventsPurgedTS
	}
	for _, t := range threads {
		if t.EventsPurgedThrough < 0 || t.EventsPurgedThrough > t.LastSeq || (t.EventsPurgedThrough == 0) != (t.EventsPurgedVersion == 0) ||
			(t.EventsPurgedThrough > 0 && t.EventsPurgedVersion >= t.StateVersion) {
			add(0, "thread %s has an impossible purge watermark (seq %d, v%d; thread at seq %d, v%d)",
				t.ThreadID, t.EventsPurgedThrough, t.EventsPurgedVersion, t.LastSeq, t.StateVersion)
		}
	}
	firstSeen := map[string]bool{}
	for _, e := range events {
		th := threadByID[e.ThreadID]
		if e.Seq <= th.EventsPurgedThrough {
			add(0, "thread %s still holds event seq %d at or below its purge watermark %d", e.ThreadID, e.Seq, th.EventsPurgedThrough)
		}
		if !firstSeen[e.ThreadID] {
			firstSeen[e.ThreadID] = true
			if e.StateVersion <= th.EventsPurgedVersion {
				add(0, "thread %s event seq %d has state_version %d, at or below its purge watermark v%d", e.ThreadID, e.Seq, e.StateVersion, th.EventsPurgedVersion)
			}
		}
	}
	terminalEvents := map[string]int{}
	for _, e := range events {
		if e.RunID != nil && (e.Type == chat.EventRunCompleted || e.Type == chat.EventRunFailed || e.Type == chat.EventRunCancelled) {
			terminalEvents[*e.RunID]++
		}
	}

	// 1. No published message without a checkpoint that contains it.
	for _, m := range msgRows {
		if !inSomeCheckpoint[m.MessageID] {
			add(1, "message %s (thread %s) is in no checkpoint", m.MessageID, m.ThreadID)
		}
		if cp, ok := cps[m.CheckpointID]; !ok || !slices.Contains(cp.MessageIDs, m.MessageID) {
			add(1, "message %s names checkpoint %s, which does not contain it", m.MessageID, m.CheckpointID)
		}
	}

	// 2. One idempotency key causes at most one external action: the
	// embedded provider (send_email's outbox) logs every call; at most one
	// per key may have been accepted. (Several operations may share a key:
	// the same email asked for twice is one action.)
	var outboxLog int
	hasOutbox := `SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'outbox_attempts'`
	if pg {
		hasOutbox = `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = 'outbox_attempts'`
	}
	if err := q.GetContext(ctx, &outboxLog, hasOutbox); err != nil {
		return nil, err
	}
	if outboxLog > 0 {
		var dupKeys []struct {
			Key string `db:"idempotency_key"`
			N   int    `db:"n"`
		}
		if err := q.SelectContext(ctx, &dupKeys, `SELECT idempotency_key, COUNT(*) AS n FROM outbox_attempts
			WHERE result = 'accepted' GROUP BY idempotency_key HAVING COUNT(*) > 1`); err != nil {
			return nil, err
		}
		for _, d := range dupKeys {
			add(2, "idempotency key %q was accepted by the provider %d times", d.Key, d.N)
		}
	}
	// A committed operation must name a key.
	var keyless []string
	if err := q.SelectContext(ctx, &keyless, `SELECT operation_id FROM operations
		WHERE contract = 'consequential' AND phase IN ('committing', 'committed', 'unknown', 'reconciled') AND idempotency_key IS NULL`); err != nil {
		return nil, err
	}
	for _, id := range keyless {
		add(2, "consequential operation %s was committed without an idempotency key", id)
	}

	// 3. Every resume references an existing checkpoint of the same thread
	// (or of its fork source).
	sameLineage := func(threadID, cpID string) bool {
		cp, ok := cps[cpID]
		if !ok {
			return false
		}
		for id, depth := threadID, 0; id != "" && depth < 100; depth++ {
			if cp.ThreadID == id {
				return true
			}
			id = threadByID[id].ForkedFromThreadID.String
		}
		return false
	}
	for _, r := range runRows {
		if !sameLineage(r.ThreadID, r.BaseCheckpointID) {
			add(3, "run %s starts from checkpoint %s, not in thread %s or its fork source", r.RunID, r.BaseCheckpointID, r.ThreadID)
		}
		if r.ResumeCheckpointID.Valid && !sameLineage(r.ThreadID, r.ResumeCheckpointID.String) {
			add(3, "run %s resumes from checkpoint %s, not in thread %s or its fork source", r.RunID, r.ResumeCheckpointID.String, r.ThreadID)
		}
	}
	for _, t := range threads {
		if t.ForkedFromCheckpointID.Valid && !sameLineage(t.ForkedFromThreadID.String, t.ForkedFromCheckpointID.String) {
			add(3, "thread %s is forked from missing checkpoint %s", t.ThreadID, t.ForkedFromCheckpointID.String)
		}
	}

	// 4. After run.cancelled, no message of that run is published and no
	// event of it is emitted but tool.updated.
	cancelledAt := map[string]int64{}
	for _, e := range events {
		if e.Type == chat.EventRunCancelled && e.RunID != nil {
			cancelledAt[*e.RunID] = e.Seq
		}
	}
	// A purged run.cancelled lay at or below the watermark: whatever of the
	// run is left above it came after it.
	for _, r := range runRows {
		if _, ok := cancelledAt[r.RunID]; !ok && r.status() == chat.RunCancelled && terminalEvents[r.RunID] == 0 && terminalPurged(r) {
			cancelledAt[r.RunID] = threadByID[r.ThreadID].EventsPurgedThrough
		}
	}
	for _, e := range events {
		if e.RunID == nil {
			continue
		}
		if at, ok := cancelledAt[*e.RunID]; ok && e.Seq > at && e.Type != chat.EventToolUpdated {
			add(4, "run %s emitted %s (seq %d) after run.cancelled (seq %d)", *e.RunID, e.Type, e.Seq, at)
		}
	}
	for _, d := range deltaSeqs {
		if at, ok := cancelledAt[d.RunID]; ok && d.Seq > at {
			add(4, "run %s streamed a delta (seq %d) after run.cancelled (seq %d)", d.RunID, d.Seq, at)
		}
	}

	// 5. state_version strictly increases; a checkpoint's parent has a lower
	// version; the thread row holds the latest.
	for _, cp := range cps {
		if cp.ParentCheckpointID == nil {
			continue
		}
		parent, ok := cps[*cp.ParentCheckpointID]
		if !ok {
			add(5, "checkpoint %s has missing parent %s", cp.CheckpointID, *cp.ParentCheckpointID)
			continue
		}
		if parent.ThreadID == cp.ThreadID && parent.StateVersion >= cp.StateVersion {
			add(5, "checkpoint %s (v%d) has parent %s with version %d", cp.CheckpointID, cp.StateVersion, parent.CheckpointID, parent.StateVersion)
		}
	}
	lastVersion := map[string]int64{}
	lastSeq := map[string]int64{}
	for _, e := range events {
		if e.StateVersion <= lastVersion[e.ThreadID] {
			add(5, "thread %s event seq %d has state_version %d after %d", e.ThreadID, e.Seq, e.StateVersion, lastVersion[e.ThreadID])
		}
		lastVersion[e.ThreadID] = e.StateVersion
		lastSeq[e.ThreadID] = e.Seq
	}
	for _, t := range threads {
		if lastVersion[t.ThreadID] != t.StateVersion {
			add(5, "thread %s is at state_version %d but its last event says %d", t.ThreadID, t.StateVersion, lastVersion[t.ThreadID])
		}
		head, ok := cps[t.HeadCheckpointID]
		if !ok || head.ThreadID != t.ThreadID {
			add(5, "thread %s has head %s, not one of its checkpoints", t.ThreadID, t.HeadCheckpointID)
		} else if head.StateVersion > t.StateVersion {
			add(5, "thread %s head %s is newer (v%d) than the thread (v%d)", t.ThreadID, head.CheckpointID, head.StateVersion, t.StateVersion)
		}
	}

	// 6. History holds only published messages.
	for _, cp := range cps {
		for _, id := range cp.MessageIDs {
			if _, ok := msgs[id]; !ok {
				add(6, "checkpoint %s holds %s, which is not a published message", cp.CheckpointID, id)
			}
		}
	}
	// A published run message is exactly the text of its deltas while they
	// are buffered.
	streamed := map[string]*strings.Builder{}
	parts := map[string]int{}
	for _, d := range deltaSeqs {
		b := streamed[d.MessageID]
		if b == nil {
			b = &strings.Builder{}
			streamed[d.MessageID] = b
		}
		if d.Part == 0 || parts[d.MessageID] > 0 {
			parts[d.MessageID]++
		}
		b.WriteString(d.Text)
	}
	for id, b := range streamed {
		m, ok := msgs[id]
		if !ok || m.Kind == chat.KindFragment || parts[id] == 0 {
			continue // unpublished (discarded) or partly purged
		}
		if m.Content != b.String() {
			add(6, "message %s differs from the text of its deltas", id)
		}
	}

	// 7. One terminal status per run; once cancel_requested, cancelled.
	// (A terminal event may be missing only when the event purge took it.)
	active := map[string]string{}
	for _, r := range runRows {
		st := r.status()
		if !st.Valid() {
			add(7, "run %s has unknown status %q", r.RunID, r.Status)
		}
		if n := terminalEvents[r.RunID]; n > 1 || (st.Terminal() && n != 1 && !(n == 0 && terminalPurged(r))) || (!st.Terminal() && n != 0) {
			add(7, "run %s is %s with %d terminal events", r.RunID, st, n)
		}
		if r.CancelRequestedAt.Valid && !st.CancelAccepted() {
			add(7, "run %s had its cancel accepted but is %s", r.RunID, st)
		}
		if !st.Terminal() {
			if other, ok := active[r.ThreadID]; ok {
				add(7, "thread %s has two active runs: %s and %s", r.ThreadID, other, r.RunID)
			}
			active[r.ThreadID] = r.RunID
		}
	}

	// 8. Per thread, seqs strictly increase (durable events and deltas
	// share one sequence); every published message has exactly one
	// message.published event (none when the event purge took it), which
	// carries the message as it is stored (a redacted draft: without text).
	seen := map[string]map[int64]bool{}
	mark := func(thread string, seq int64, what string) {
		if seen[thread] == nil {
			seen[thread] = map[int64]bool{}
		}
		if seen[thread][seq] {
			add(8, "thread %s has seq %d twice (%s)", thread, seq, what)
		}
		seen[thread][seq] = true
		if t, ok := threadByID[thread]; !ok || seq > t.LastSeq || seq < 1 {
			add(8, "thread %s has %s at seq %d outside 1..last_seq", thread, what, seq)
		}
	}
	for _, e := range events {
		mark(e.ThreadID, e.Seq, e.Type)
	}
	for _, d := range deltaSeqs {
		mark(d.ThreadID, d.Seq, chat.EventMessageDelta)
	}
	publishedEvents := map[string]int{}
	for _, e := range events {
		if e.Type == chat.EventMessagePublished && e.MessageID != nil {
			publishedEvents[*e.MessageID]++
			var body struct {
				Message struct {
					MessageID string `json:"message_id"`
					Content   string `json:"content"`
				} `json:"message"`
			}
			if err := json.Unmarshal([]byte(e.Payload), &body); err != nil || body.Message.MessageID != *e.MessageID {
				add(8, "message.published seq %d of thread %s does not carry message %s", e.Seq, e.ThreadID, *e.MessageID)
			} else if m, ok := msgs[*e.MessageID]; ok && body.Message.Content != m.Content {
				add(0, "message.published seq %d of thread %s carries another text than message %s", e.Seq, e.ThreadID, *e.MessageID)
			}
		}
	}
	for _, m := range msgRows {
		if n := publishedEvents[m.MessageID]; n != 1 && !(n == 0 && publishedPurged(m)) {
			add(8, "message %s has %d message.published events", m.MessageID, n)
		}
		if m.RedactedAt.Valid && (m.Content != "" || !m.DeletedAt.Valid || m.Kind != chat.KindFragment) {
			add(0, "message %s is marked redacted but is not an emptied deleted draft", m.MessageID)
		}
	}
	return vs, nil
}
