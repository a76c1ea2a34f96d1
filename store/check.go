package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/honestcancel/gateway/chat"
)

// The audit: Check verifies the ten invariants of the protocol (PROTOCOL.md)
// over a whole database. Each invariant is one function below, listed in
// the invariants table; per-thread rules see one thread's rows at a time
// (read a page of auditPage threads per query, so a large database is
// streamed, never loaded whole), database-wide rules run once. Rows
// another thread owns (a fork's copied history) are looked up by id when a
// rule needs them.
//
// What the database alone cannot show is said, not assumed: Audit.Unchecked
// names it (e.g. the records of providers outside this database).

// Violation is one broken invariant found by Check.
type Violation struct {
	Invariant int    // 1..10 as numbered in the protocol; 0 for other consistency rules
	Detail    string // what is wrong, with ids
}

func (v Violation) String() string {
	if v.Invariant == 0 {
		return "consistency: " + v.Detail
	}
	return fmt.Sprintf("invariant %d: %s", v.Invariant, v.Detail)
}

// Audit is the result of Check.
type Audit struct {
	Violations []Violation
	// Unchecked says, per invariant, what this database cannot show, so
	// what the audit does not cover.
	Unchecked []string
	// What was read.
	Threads, Runs, Operations, Events, Deltas int
}

// invariant is one row of the audit's table: per-thread rules in thread,
// database-wide ones in global (either may be nil).
type invariant struct {
	n      int
	rule   string
	thread func(a *auditor, th *auditThread)
	global func(a *auditor) error
}

// invariants is the audit, in the protocol's order. Invariant 0 holds the
// consistency rules the others rely on (purge watermarks).
var invariants = []invariant{
	{0, "purge watermarks are possible", checkWatermarks, nil},
	{0, "a deleted thread ended: thread.deleted is its last event, no run of it goes on", checkDeleted, nil},
	{1, "no published message exists without a checkpoint that contains it", checkMessagesInCheckpoints, nil},
	{2, "one idempotency key causes at most one external action", nil, checkOneActionPerKey},
	{3, "every resume references an existing checkpoint of the same thread (or of its fork source)", checkResumeLineage, nil},
	{4, "after run.cancelled nothing of the run is published or emitted but tool.updated", checkNothingAfterCancelled, nil},
	{5, "state_version moves by exactly one per durable event and no other way", checkStateVersion, nil},
	{6, "history holds only published messages; delta text is never history", checkHistoryIsPublished, nil},
	{7, "a run has at most one terminal status; once cancel_requested it is cancelled", checkTerminalStatus, nil},
	{8, "seqs are gapless except recorded absences; one event per message and checkpoint", checkEventLog, nil},
	{9, "each step of a run is published at most once", checkStepsOnce, nil},
	{10, "a reported outcome never contradicts the provider", checkOutcomes, checkOutcomesAtProvider},
}

// Check audits the invariants and returns every violation (none =
// healthy); Audit says what it could not see.
func (s *Store) Check(ctx context.Context) ([]Violation, error) {
	a, err := s.Audit(ctx)
	return a.Violations, err
}

// auditPage is how many threads the audit reads per query: what it holds
// in memory at a time.
const auditPage = 100

// Audit runs the whole audit in one consistent read.
func (s *Store) Audit(ctx context.Context) (Audit, error) {
	a := &auditor{ctx: ctx, pg: s.pg,
		cpThread: map[string]string{}, msgThread: map[string]string{}, opThread: map[string]string{}, forkedFrom: map[string]string{}}
	err := s.read(ctx, func(q *sqlx.Tx) error {
		a.q = q
		a.out = Audit{}
		for _, inv := range invariants {
			if inv.global != nil {
				if err := inv.global(a); err != nil {
					return err
				}
			}
		}
		after := ""
		for {
			var rows []threadRow
			if err := q.SelectContext(ctx, &rows, q.Rebind(`SELECT `+threadCols+` FROM threads WHERE thread_id > ?
				ORDER BY thread_id LIMIT ?`), after, auditPage); err != nil {
				return fmt.Errorf("audit: list threads: %w", err)
			}
			page, err := a.loadPage(rows)
			if err != nil {
				return err
			}
			for _, th := range page {
				for _, inv := range invariants {
					if inv.thread != nil {
						inv.thread(a, th)
					}
				}
			}
			if len(rows) < auditPage {
				return nil
			}
			after = rows[len(rows)-1].ThreadID
		}
	})
	return a.out, err
}

// auditor carries the audit's read transaction, its findings and the
// look-ups it shares between threads. Used by one goroutine.
type auditor struct {
	ctx context.Context
	q   *sqlx.Tx
	pg  bool
	out Audit
	// Caches of rows of other threads (fork lineage): checkpoint, message
	// and operation id -> thread id ("" = no such row), thread -> fork
	// source.
	cpThread, msgThread, opThread, forkedFrom map[string]string
}

func (a *auditor) add(inv int, format string, args ...any) {
	a.out.Violations = append(a.out.Violations, Violation{Invariant: inv, Detail: fmt.Sprintf(format, args...)})
}

func (a *auditor) unchecked(format string, args ...any) {
	a.out.Unchecked = append(a.out.Unchecked, fmt.Sprintf(format, args...))
}

// auditEvent is one held durable event, with the ids its payload names.
type auditEvent struct {
	ThreadID     string         `db:"thread_id"`
	Seq          int64          `db:"seq"`
	Type         string         `db:"type"`
	RunID        sql.NullString `db:"run_id"`
	MessageID    sql.NullString `db:"message_id"`
	StateVersion int64          `db:"state_version"`
	TS           int64          `db:"ts"`
	Payload      string         `db:"payload"`
	body         eventBody
	bodyErr      error
}

// eventBody is the union of the payload fields the audit reads.
type eventBody struct {
	Type         string  `json:"type"`
	Seq          int64   `json:"seq"`
	StateVersion int64   `json:"state_version"`
	RunID        string  `json:"run_id"`
	CheckpointID string  `json:"checkpoint_id"`
	ParentID     *string `json:"parent_checkpoint_id"`
	HeadID       string  `json:"head_checkpoint_id"`
	PreviousHead string  `json:"previous_head_checkpoint_id"`
	MessageID    string  `json:"message_id"`
	Message      *struct {
		MessageID string `json:"message_id"`
		Content   string `json:"content"`
	} `json:"message"`
	Operation *struct {
		OperationID string `json:"operation_id"`
	} `json:"operation"`
}

type auditDelta = bufferedDelta

// lostSeqs is one stream_gaps row: seqs handed out (or reserved) by a
// process that stopped before writing them, recorded at the next start.
type lostSeqs struct {
	ThreadID string `db:"thread_id"`
	FirstSeq int64  `db:"first_seq"`
	LastSeq  int64  `db:"last_seq"`
}

// streamCount is a message's stream_messages row: how many of its deltas
// were written to the stream buffer (parts 0..Parts-1, in seq order), the
// first at FirstSeq. A delta lost in a crash or a write-past was never
// written, so it is not counted; a counted one leaves the buffer only by
// retention (PurgeStream), at or below the thread's stream purge mark.
type streamCount struct {
	Parts    int   `db:"parts"`
	FirstSeq int64 `db:"first_seq"`
}

// auditThread is one thread's rows.
type auditThread struct {
	row     threadRow
	cps     []chat.Checkpoint // by state_version
	cpByID  map[string]chat.Checkpoint
	msgs    []messageRow
	msgByID map[string]messageRow
	runs    []runRow
	runByID map[string]runRow
	ops     []operationRow
	opByID  map[string]operationRow
	events  []auditEvent           // by seq
	deltas  []auditDelta           // by seq
	lost    []lostSeqs             // stream_gaps: seqs a crash lost, by first seq
	written map[string]streamCount // streamed message id -> its stream_messages row
	// Derived once: a run's terminal events and its run.cancelled seq.
	terminal    map[string][]auditEvent
	cancelledAt map[string]int64
}

// loadPage reads the rows of a page of threads, a query per table for the
// whole page (a database of many small threads is read in few queries),
// and returns them by thread, in rows' order.
func (a *auditor) loadPage(rows []threadRow) ([]*auditThread, error) {
	if len(rows) == 0 {
		return nil, nil
	}
	ctx, q := a.ctx, a.q
	ids := make([]string, len(rows))
	byID := make(map[string]*auditThread, len(rows))
	out := make([]*auditThread, len(rows))
	for i, row := range rows {
		ids[i] = row.ThreadID
		th := &auditThread{row: row, cpByID: map[string]chat.Checkpoint{}, msgByID: map[string]messageRow{},
			runByID: map[string]runRow{}, opByID: map[string]operationRow{}, written: map[string]streamCount{},
			terminal: map[string][]auditEvent{}, cancelledAt: map[string]int64{}}
		byID[row.ThreadID], out[i] = th, th
	}
	sel := func(dest any, what, query string) error {
		query, args, err := sqlx.In(query, ids)
		if err != nil {
			return err
		}
		if err := q.SelectContext(ctx, dest, q.Rebind(query), args...); err != nil {
			return fmt.Errorf("audit: %s: %w", what, err)
		}
		return nil
	}
	var cpRows []checkpointRow
	if err := sel(&cpRows, "checkpoints", `SELECT `+checkpointCols+` FROM checkpoints WHERE thread_id IN (?) ORDER BY thread_id, state_version, checkpoint_id`); err != nil {
		return nil, err
	}
	decodeEach(a, 0, cpRows, checkpointRow.checkpoint, func(_ checkpointRow, cp chat.Checkpoint) {
		th := byID[cp.ThreadID]
		th.cps = addByID(th.cps, th.cpByID, cp.CheckpointID, cp)
	})
	// Messages, runs and operations: each in its thread's list, in the
	// query's order, and in its map by id.
	for _, load := range []func() error{
		func() error {
			return selectEach(sel, "messages", `SELECT `+messageCols+` FROM messages WHERE thread_id IN (?) ORDER BY thread_id, state_version, message_id`,
				func(m messageRow) { th := byID[m.ThreadID]; th.msgs = addByID(th.msgs, th.msgByID, m.MessageID, m) })
		},
		func() error {
			return selectEach(sel, "runs", `SELECT `+runCols+` FROM runs WHERE thread_id IN (?) ORDER BY thread_id, created_at, run_id`,
				func(r runRow) { th := byID[r.ThreadID]; th.runs = addByID(th.runs, th.runByID, r.RunID, r) })
		},
		func() error {
			return selectEach(sel, "operations", `SELECT `+operationCols+` FROM operations WHERE thread_id IN (?) ORDER BY thread_id, created_at, operation_id`,
				func(o operationRow) { th := byID[o.ThreadID]; th.ops = addByID(th.ops, th.opByID, o.OperationID, o) })
		},
	} {
		if err := load(); err != nil {
			return nil, err
		}
	}
	var events []auditEvent
	if err := sel(&events, "events", `SELECT thread_id, seq, type, run_id, message_id, state_version, ts, payload
		FROM events WHERE thread_id IN (?) ORDER BY thread_id, seq`); err != nil {
		return nil, err
	}
	for _, e := range events {
		e.bodyErr = json.Unmarshal([]byte(e.Payload), &e.body)
		th := byID[e.ThreadID]
		th.events = append(th.events, e)
		if e.RunID.Valid {
			switch e.Type {
			case chat.EventRunCompleted, chat.EventRunFailed, chat.EventRunCancelled:
				th.terminal[e.RunID.String] = append(th.terminal[e.RunID.String], e)
				if e.Type == chat.EventRunCancelled {
					th.cancelledAt[e.RunID.String] = e.Seq
				}
			}
		}
	}
	var batches []deltaBatch
	if err := sel(&batches, "deltas", `SELECT `+batchCols+`
		FROM stream_batches WHERE thread_id IN (?) ORDER BY thread_id, first_seq`); err != nil {
		return nil, err
	}
	var deltas []auditDelta
	// A damaged batch holds seqs nobody can replay (invariant 8).
	decodeEach(a, 8, batches, deltaBatch.deltas, func(b deltaBatch, ds []auditDelta) {
		th := byID[b.ThreadID]
		th.deltas = append(th.deltas, ds...)
		deltas = append(deltas, ds...)
	})
	var lost []lostSeqs
	if err := sel(&lost, "lost stream seqs", `SELECT thread_id, first_seq, last_seq FROM stream_gaps WHERE thread_id IN (?) ORDER BY thread_id, first_seq`); err != nil {
		return nil, err
	}
	for _, l := range lost {
		byID[l.ThreadID].lost = append(byID[l.ThreadID].lost, l)
	}
	var streamed []struct {
		ThreadID  string `db:"thread_id"`
		MessageID string `db:"message_id"`
		streamCount
	}
	if err := sel(&streamed, "streamed messages", `SELECT r.thread_id, sm.message_id, sm.parts, sm.first_seq FROM runs r
		JOIN stream_messages sm ON sm.run_id = r.run_id WHERE r.thread_id IN (?)`); err != nil {
		return nil, err
	}
	for _, m := range streamed {
		byID[m.ThreadID].written[m.MessageID] = m.streamCount
	}
	a.out.Threads += len(rows)
	for _, th := range out {
		a.out.Runs += len(th.runs)
		a.out.Operations += len(th.ops)
	}
	a.out.Events += len(events)
	a.out.Deltas += len(deltas)
	return out, nil
}

// selectEach runs query through sel (what names it in an error) into rows
// of type R and hands each row to file, in the query's order.
func selectEach[R any](sel func(dest any, what, query string) error, what, query string, file func(R)) error {
	var rows []R
	if err := sel(&rows, what, query); err != nil {
		return err
	}
	for _, r := range rows {
		file(r)
	}
	return nil
}

// decodeEach decodes each of rows, in order: a row that does not decode is
// a violation of invariant inv (its error says which row and why) and is
// left out; file gets each other row with what it decoded to.
func decodeEach[R, V any](a *auditor, inv int, rows []R, decode func(R) (V, error), file func(R, V)) {
	for _, r := range rows {
		v, err := decode(r)
		if err != nil {
			a.add(inv, "%v", err)
			continue
		}
		file(r, v)
	}
}

// addByID appends v to list, files it under id in byID, and returns the
// list.
func addByID[R any](list []R, byID map[string]R, id string, v R) []R {
	byID[id] = v
	return append(list, v)
}

// Retention (see retention.go): the event log is purged per thread as a
// prefix of seqs, the stream buffer likewise. An event at or below
// events_purged_through may be absent (its state_version at or below
// events_purged_version, its ts at or before events_purged_ts); a delta at
// or below deltas_purged_through is absent. Everything above is held to
// the rules as strictly as in a log never purged.

// publishedPurged: a message's message.published carries the message's
// state_version, so it was purged exactly when that version lies within
// the mark. The same holds for a checkpoint's checkpoint.created.
func (th *auditThread) versionPurged(v int64) bool { return v <= th.row.EventsPurgedVersion }

// terminalPurged: a run's terminal event has the run's finished_at as ts
// and comes after its run.started (at start_state_version): it can have
// been purged only when both lie within the mark.
func (th *auditThread) terminalPurged(r runRow) bool {
	return r.FinishedAt.Valid && r.StartStateVersion <= th.row.EventsPurgedVersion && r.FinishedAt.Int64 <= th.row.EventsPurgedTS
}

// lineage reports whether checkpoint cpID belongs to thread threadID or to
// the thread it was forked from, and so on up.
func (a *auditor) lineage(threadID, cpID string) (bool, error) {
	owner, err := a.rowThread(a.cpThread, `SELECT thread_id FROM checkpoints WHERE checkpoint_id = ?`, cpID)
	if err != nil || owner == "" {
		return false, err
	}
	for id, depth := threadID, 0; id != "" && depth < 1000; depth++ {
		if owner == id {
			return true, nil
		}
		if id, err = a.forkSource(id); err != nil {
			return false, err
		}
	}
	return false, nil
}

// rowThread looks up (and caches) the thread of the row q selects by id.
func (a *auditor) rowThread(cache map[string]string, q, id string) (string, error) {
	if t, ok := cache[id]; ok {
		return t, nil
	}
	var t string
	err := a.q.GetContext(a.ctx, &t, a.q.Rebind(q), id)
	if errors.Is(err, sql.ErrNoRows) {
		err = nil
	}
	if err != nil {
		return "", fmt.Errorf("audit: look up %s: %w", id, err)
	}
	cache[id] = t
	return t, nil
}

func (a *auditor) forkSource(threadID string) (string, error) {
	if t, ok := a.forkedFrom[threadID]; ok {
		return t, nil
	}
	var src sql.NullString
	err := a.q.GetContext(a.ctx, &src, a.q.Rebind(`SELECT forked_from_thread_id FROM threads WHERE thread_id = ?`), threadID)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("audit: fork source of %s: %w", threadID, err)
	}
	a.forkedFrom[threadID] = src.String
	return src.String, nil
}

// lookupErr records a failed look-up as a finding: the audit goes on.
func (a *auditor) lookupErr(err error) {
	if err != nil {
		a.add(0, "%v", err)
	}
}

// ---- 0: the purge watermarks themselves ----

func checkWatermarks(a *auditor, th *auditThread) {
	t := th.row
	if t.EventsPurgedThrough < 0 || t.EventsPurgedThrough > t.LastSeq || (t.EventsPurgedThrough == 0) != (t.EventsPurgedVersion == 0) ||
		(t.EventsPurgedThrough > 0 && t.EventsPurgedVersion >= t.StateVersion) {
		a.add(0, "thread %s has an impossible event purge watermark (seq %d, v%d; thread at seq %d, v%d)",
			t.ThreadID, t.EventsPurgedThrough, t.EventsPurgedVersion, t.LastSeq, t.StateVersion)
	}
	if t.DeltasPurgedThrough < 0 || t.DeltasPurgedThrough > t.LastSeq {
		a.add(0, "thread %s has an impossible stream purge mark %d (thread at seq %d)", t.ThreadID, t.DeltasPurgedThrough, t.LastSeq)
	}
	if len(th.events) > 0 && th.events[0].Seq <= t.EventsPurgedThrough {
		a.add(0, "thread %s still holds event seq %d at or below its purge watermark %d", t.ThreadID, th.events[0].Seq, t.EventsPurgedThrough)
	}
	if len(th.deltas) > 0 && th.deltas[0].Seq <= t.DeltasPurgedThrough {
		a.add(0, "thread %s still holds delta seq %d at or below its stream purge mark %d", t.ThreadID, th.deltas[0].Seq, t.DeltasPurgedThrough)
	}
}

// ---- 1: no published message without a checkpoint that contains it ----

func checkMessagesInCheckpoints(a *auditor, th *auditThread) {
	for _, m := range th.msgs {
		cp, ok := th.cpByID[m.CheckpointID]
		if !ok || !slices.Contains(cp.MessageIDs, m.MessageID) {
			a.add(1, "message %s (thread %s) names checkpoint %s, which is not one of the thread's that contains it", m.MessageID, m.ThreadID, m.CheckpointID)
		}
	}
}

// ---- 2: one key, at most one external action ----

// checkOneActionPerKey audits what this database can show: the embedded
// email provider's records (at most one acceptance per key; its table of
// accepted keys and its log of calls agree, both ways), that every key it
// accepted is one an operation carries, and that every consequential
// operation that reached its system named a key. Several operations may
// share a key (a step resumed or forked is the same action): the
// provider's acceptances are what counts. Neither the provider's rows nor
// operations are ever deleted (retention leaves them), so nothing ages
// out of these comparisons.
func checkOneActionPerKey(a *auditor) error {
	ctx, q := a.ctx, a.q
	var keyless []string
	if err := q.SelectContext(ctx, &keyless, `SELECT operation_id FROM operations WHERE contract = 'consequential'
		AND (commit_started_at IS NOT NULL OR phase IN ('committing', 'committed', 'unknown', 'reconciled')) AND idempotency_key IS NULL`); err != nil {
		return fmt.Errorf("audit: keyless operations: %w", err)
	}
	for _, id := range keyless {
		a.add(2, "consequential operation %s reached its system without an idempotency key", id)
	}
	has, err := a.hasProvider()
	if err != nil {
		return err
	}
	if !has {
		a.unchecked("2, 10: this database holds no embedded email provider records (outbox, outbox_attempts), so no provider's acceptances were compared")
	} else {
		var twice []struct {
			Key string `db:"idempotency_key"`
			N   int    `db:"n"`
		}
		if err := q.SelectContext(ctx, &twice, `SELECT idempotency_key, COUNT(*) AS n FROM outbox_attempts
			WHERE result = 'accepted' GROUP BY idempotency_key HAVING COUNT(*) > 1 ORDER BY idempotency_key`); err != nil {
			return fmt.Errorf("audit: provider log: %w", err)
		}
		for _, k := range twice {
			a.add(2, "idempotency key %q was accepted by the provider %d times", k.Key, k.N)
		}
		// The provider takes a key by inserting its outbox row and logging
		// the acceptance in one transaction: each without the other is a
		// lost record (without the row it would accept the key again).
		var unlogged, unheld []string
		if err := q.SelectContext(ctx, &unlogged, `SELECT p.idempotency_key FROM outbox p WHERE NOT EXISTS (SELECT 1 FROM outbox_attempts l
			WHERE l.idempotency_key = p.idempotency_key AND l.result = 'accepted') ORDER BY p.idempotency_key`); err != nil {
			return fmt.Errorf("audit: provider records: %w", err)
		}
		for _, key := range unlogged {
			a.add(2, "the provider holds key %q as accepted (outbox), but its log (outbox_attempts) has no acceptance of it", key)
		}
		if err := q.SelectContext(ctx, &unheld, `SELECT DISTINCT l.idempotency_key FROM outbox_attempts l WHERE l.result = 'accepted'
			AND NOT EXISTS (SELECT 1 FROM outbox p WHERE p.idempotency_key = l.idempotency_key) ORDER BY l.idempotency_key`); err != nil {
			return fmt.Errorf("audit: provider records: %w", err)
		}
		for _, key := range unheld {
			a.add(2, "the provider's log accepted key %q, but it holds no record of it (outbox): it would accept the key again", key)
		}
		// The outer direction of "every operation's key": every key the
		// provider took is carried by an operation (the send_email tool
		// sends no other), or an action happened that no operation accounts for.
		var orphans []struct {
			Key        string `db:"idempotency_key"`
			ProviderID string `db:"provider_id"`
		}
		if err := q.SelectContext(ctx, &orphans, `SELECT p.idempotency_key, p.provider_id FROM outbox p
			WHERE NOT EXISTS (SELECT 1 FROM operations o WHERE o.idempotency_key = p.idempotency_key) ORDER BY p.idempotency_key`); err != nil {
			return fmt.Errorf("audit: keys the provider accepted: %w", err)
		}
		for _, o := range orphans {
			a.add(2, "the provider accepted key %q (%s), which no operation carries: an external action no operation accounts for", o.Key, o.ProviderID)
		}
	}
	var outside []struct {
		Tool string `db:"tool"`
		N    int    `db:"n"`
	}
	if err := q.SelectContext(ctx, &outside, `SELECT tool, COUNT(*) AS n FROM operations WHERE contract = 'consequential'
		AND tool <> 'send_email' AND commit_started_at IS NOT NULL GROUP BY tool ORDER BY tool`); err != nil {
		return fmt.Errorf("audit: operations of other providers: %w", err)
	}
	for _, o := range outside {
		a.unchecked("2, 10: %d operations of %s reached a provider outside this database; whether each key acted at most once, and as reported, only that provider's records can tell", o.N, o.Tool)
	}
	return nil
}

// hasProvider reports whether the database holds the embedded email
// provider's tables (migration 00013 creates both).
func (a *auditor) hasProvider() (bool, error) {
	for _, table := range []string{"outbox", "outbox_attempts"} {
		if has, err := a.hasTable(table); err != nil || !has {
			return false, err
		}
	}
	return true, nil
}

// hasTable reports whether the database holds a table of that name (the
// embedded provider's tables exist once it was opened on it).
func (a *auditor) hasTable(name string) (bool, error) {
	q := `SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?`
	if a.pg {
		q = `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = ?`
	}
	var n int
	if err := a.q.GetContext(a.ctx, &n, a.q.Rebind(q), name); err != nil {
		return false, fmt.Errorf("audit: look for the provider log: %w", err)
	}
	return n > 0, nil
}

// ---- 3: resumes reference real checkpoints of their lineage ----

func checkResumeLineage(a *auditor, th *auditThread) {
	in := func(cpID string) bool {
		ok, err := a.lineage(th.row.ThreadID, cpID)
		a.lookupErr(err)
		return ok
	}
	for _, r := range th.runs {
		if !in(r.BaseCheckpointID) {
			a.add(3, "run %s starts from checkpoint %s, not in thread %s or its fork source", r.RunID, r.BaseCheckpointID, r.ThreadID)
		}
		if r.ResumeCheckpointID.Valid && !in(r.ResumeCheckpointID.String) {
			a.add(3, "run %s resumes from checkpoint %s, not in thread %s or its fork source", r.RunID, r.ResumeCheckpointID.String, r.ThreadID)
		}
	}
	if t := th.row; t.ForkedFromCheckpointID.Valid {
		ok, err := a.lineage(t.ForkedFromThreadID.String, t.ForkedFromCheckpointID.String)
		a.lookupErr(err)
		if !ok {
			a.add(3, "thread %s is forked from checkpoint %s, which is not in its source thread %s", t.ThreadID, t.ForkedFromCheckpointID.String, t.ForkedFromThreadID.String)
		}
	}
	for _, cp := range th.cps {
		if cp.ParentCheckpointID == nil {
			continue
		}
		if _, ok := th.cpByID[*cp.ParentCheckpointID]; !ok {
			a.add(3, "checkpoint %s continues %s, which is not a checkpoint of thread %s", cp.CheckpointID, *cp.ParentCheckpointID, th.row.ThreadID)
		}
	}
}

// ---- 4: nothing of a run after its run.cancelled but reconciliation ----

func checkNothingAfterCancelled(a *auditor, th *auditThread) {
	at := func(runID string) (int64, bool) {
		if seq, ok := th.cancelledAt[runID]; ok {
			return seq, true
		}
		// A purged run.cancelled lay at or below the watermark: whatever of
		// the run is left above it came after it.
		if r, ok := th.runByID[runID]; ok && r.status() == chat.RunCancelled && len(th.terminal[runID]) == 0 && th.terminalPurged(r) {
			return th.row.EventsPurgedThrough, true
		}
		return 0, false
	}
	for _, e := range th.events {
		if !e.RunID.Valid {
			continue
		}
		if seq, ok := at(e.RunID.String); ok && e.Seq > seq && e.Type != chat.EventToolUpdated {
			a.add(4, "run %s emitted %s (seq %d) after run.cancelled (seq %d)", e.RunID.String, e.Type, e.Seq, seq)
		}
	}
	for _, d := range th.deltas {
		if seq, ok := at(d.RunID); ok && d.Seq > seq {
			a.add(4, "run %s streamed a delta (seq %d) after run.cancelled (seq %d)", d.RunID, d.Seq, seq)
		}
	}
}

// checkDeleted: a thread is deleted (deleted_at) exactly when its log holds
// a thread.deleted, which is its last event (the event log's purge keeps a
// thread's last event, so it is never purged); nothing follows it, no
// delta either, and no run of the thread is still going on.
func checkDeleted(a *auditor, th *auditThread) {
	t := th.row
	var at int64
	for _, e := range th.events {
		if e.Type == chat.EventThreadDeleted {
			if at != 0 {
				a.add(0, "thread %s has two thread.deleted events (seq %d and %d)", t.ThreadID, at, e.Seq)
			}
			at = e.Seq
		}
	}
	switch {
	case at == 0 && t.DeletedAt.Valid:
		a.add(0, "thread %s is deleted but its log has no thread.deleted", t.ThreadID)
	case at != 0 && !t.DeletedAt.Valid:
		a.add(0, "thread %s has thread.deleted (seq %d) but is not deleted", t.ThreadID, at)
	}
	if at == 0 {
		return
	}
	if t.LastSeq != at {
		a.add(0, "thread %s was deleted at seq %d, but its last seq is %d", t.ThreadID, at, t.LastSeq)
	}
	for _, e := range th.events {
		if e.Seq > at {
			a.add(0, "thread %s emitted %s (seq %d) after thread.deleted (seq %d)", t.ThreadID, e.Type, e.Seq, at)
		}
	}
	for _, d := range th.deltas {
		if d.Seq > at {
			a.add(0, "thread %s streamed a delta (seq %d) after thread.deleted (seq %d)", t.ThreadID, d.Seq, at)
		}
	}
	for _, r := range th.runs {
		if !r.status().Terminal() {
			a.add(0, "thread %s was deleted with run %s still %s", t.ThreadID, r.RunID, r.Status)
		}
	}
}

// ---- 5: state_version moves by exactly one per durable event ----

func checkStateVersion(a *auditor, th *auditThread) {
	t := th.row
	// The held log starts right after the purge mark and counts up by one.
	want := t.EventsPurgedVersion + 1
	for _, e := range th.events {
		if e.StateVersion != want {
			a.add(5, "thread %s event seq %d (%s) has state_version %d, want %d (one more than the durable event before it)", t.ThreadID, e.Seq, e.Type, e.StateVersion, want)
		}
		want = e.StateVersion + 1
	}
	if want-1 != t.StateVersion {
		a.add(5, "thread %s is at state_version %d but its last durable event says %d", t.ThreadID, t.StateVersion, want-1)
	}
	// A checkpoint and a message carry the version of their own event.
	versionOf := map[string]int64{} // checkpoint or message id -> its event's version
	for _, e := range th.events {
		switch e.Type {
		case chat.EventCheckpointCreated:
			versionOf[e.body.CheckpointID] = e.StateVersion
		case chat.EventMessagePublished:
			if e.MessageID.Valid {
				versionOf[e.MessageID.String] = e.StateVersion
			}
		}
	}
	for _, cp := range th.cps {
		if v, ok := versionOf[cp.CheckpointID]; ok && v != cp.StateVersion {
			a.add(5, "checkpoint %s has state_version %d but its checkpoint.created says %d", cp.CheckpointID, cp.StateVersion, v)
		}
		if cp.StateVersion > t.StateVersion {
			a.add(5, "checkpoint %s (v%d) is newer than its thread %s (v%d)", cp.CheckpointID, cp.StateVersion, t.ThreadID, t.StateVersion)
		}
		if cp.ParentCheckpointID != nil {
			if p, ok := th.cpByID[*cp.ParentCheckpointID]; ok && p.StateVersion >= cp.StateVersion {
				a.add(5, "checkpoint %s (v%d) has parent %s with version %d", cp.CheckpointID, cp.StateVersion, p.CheckpointID, p.StateVersion)
			}
		}
	}
	for _, m := range th.msgs {
		if v, ok := versionOf[m.MessageID]; ok && v != m.StateVersion {
			a.add(5, "message %s has state_version %d but its message.published says %d", m.MessageID, m.StateVersion, v)
		}
	}
	if head, ok := th.cpByID[t.HeadCheckpointID]; !ok {
		a.add(5, "thread %s has head %s, not one of its checkpoints", t.ThreadID, t.HeadCheckpointID)
	} else if head.StateVersion > t.StateVersion {
		a.add(5, "thread %s head %s is newer (v%d) than the thread (v%d)", t.ThreadID, head.CheckpointID, head.StateVersion, t.StateVersion)
	}
}

// ---- 6: history holds only published messages ----

func checkHistoryIsPublished(a *auditor, th *auditThread) {
	for _, cp := range th.cps {
		for _, id := range cp.MessageIDs {
			if _, ok := th.msgByID[id]; ok {
				continue
			}
			// A fork's history starts with its source's messages.
			owner, err := a.rowThread(a.msgThread, `SELECT thread_id FROM messages WHERE message_id = ?`, id)
			a.lookupErr(err)
			ok := false
			for src, depth := th.row.ThreadID, 0; owner != "" && src != "" && depth < 1000 && !ok; depth++ {
				src, err = a.forkSource(src)
				a.lookupErr(err)
				ok = src == owner
			}
			if !ok {
				a.add(6, "checkpoint %s holds %s, which is not a published message of its thread or fork source", cp.CheckpointID, id)
			}
		}
	}
	// Text built from the stream buffer is exactly its deltas (PROTOCOL.md):
	// a run's published message all of them, a saved fragment those up to
	// its last_seq. A written delta leaves the buffer only by retention, so
	// text is excused from the comparison only where its missing deltas
	// can lie at or below the stream purge mark; one gone above it is a
	// violation, also where stream_gaps records its seq as lost (a crash or
	// a write-past loses only deltas never written, never counted).
	texts := th.bufferedTexts()
	for _, m := range th.msgs {
		switch {
		case m.Kind == chat.KindFragment && m.FragmentOf.Valid && !m.RedactedAt.Valid:
			var of chat.FragmentOf
			if err := json.Unmarshal([]byte(m.FragmentOf.String), &of); err != nil {
				a.add(0, "fragment %s has unreadable fragment_of: %v", m.MessageID, err)
				continue
			}
			b := texts[of.MessageID]
			switch {
			case b == nil || !b.counted:
				// A fragment is saved only from a message the thread streamed
				// (stream_messages), and that row is never deleted.
				a.add(6, "saved fragment %s (thread %s) is the text of message %s, which thread %s never streamed", m.MessageID, m.ThreadID, of.MessageID, m.ThreadID)
			case b.misnumbered != "":
				a.add(6, "saved fragment %s (thread %s) cannot be the text of message %s: %s", m.MessageID, m.ThreadID, of.MessageID, b.misnumbered)
			case len(b.gone) > 0 && b.goneFrom <= of.LastSeq:
				a.add(6, "saved fragment %s (thread %s) is the text of message %s up to seq %d, but %s of it (seq %d or later) is gone and no retention purge explains it",
					m.MessageID, m.ThreadID, of.MessageID, of.LastSeq, partList(b.gone), b.goneFrom)
			case b.purged:
				// Its first deltas went with the stream TTL: no longer comparable.
			case b.text(of.LastSeq) != m.Content:
				a.add(6, "saved fragment %s is not exactly the text of message %s up to seq %d", m.MessageID, of.MessageID, of.LastSeq)
			}
		case m.RunID.Valid && m.Kind != chat.KindFragment && !m.RedactedAt.Valid:
			b := texts[m.MessageID]
			if b == nil {
				continue // not streamed (a tool result)
			}
			b.published = true
			switch {
			case b.misnumbered != "":
				a.add(6, "message %s (thread %s, run %s) is published, but its deltas are not what was written of it: %s", m.MessageID, m.ThreadID, m.RunID.String, b.misnumbered)
			case len(b.gone) > 0:
				a.add(6, "message %s (thread %s, run %s) is published, but %s of its %d written deltas (seq %d or later) is gone and no retention purge explains it (stream purge mark %d): its content is not the concatenation of its deltas",
					m.MessageID, m.ThreadID, m.RunID.String, partList(b.gone), b.written.Parts, b.goneFrom, th.row.DeltasPurgedThrough)
			case b.purged:
				// Its first deltas went with the stream TTL: the rest is the
				// end of its text.
				if !strings.HasSuffix(m.Content, b.text(-1)) {
					a.add(6, "message %s does not end with the text of its deltas still buffered (the first ones were purged)", m.MessageID)
				}
			case b.text(-1) != m.Content:
				a.add(6, "message %s differs from the text of its deltas", m.MessageID)
			}
		}
	}
	// A written delta of a message nobody published is gone without a
	// purge: the log lost it, whatever stream_gaps records (invariant 8).
	for _, id := range slices.Sorted(maps.Keys(texts)) {
		switch b := texts[id]; {
		case b.published:
		case b.misnumbered != "":
			a.add(8, "thread %s: the deltas of message %s are not what was written of it: %s", th.row.ThreadID, id, b.misnumbered)
		case len(b.gone) > 0:
			a.add(8, "thread %s: %s of the %d written deltas of message %s (seq %d or later) is gone and no retention purge explains it",
				th.row.ThreadID, partList(b.gone), b.written.Parts, id, b.goneFrom)
		}
	}
}

// bufferedText is what the stream buffer holds of one message, against
// what was written of it (its stream_messages row).
type bufferedText struct {
	written streamCount
	counted bool         // the message has a stream_messages row
	held    []auditDelta // by seq
	// purged: a written delta is missing where retention may have removed
	// it (the earliest seq it can have had is at or below the stream purge
	// mark): the text can no longer be compared whole.
	purged bool
	// gone: the written parts missing where no purge can explain them
	// (the earliest seq each can have had is above the mark), and the
	// earliest seq the first of them can have had.
	gone     []int
	goneFrom int64
	// misnumbered says how held deltas are not the written parts in seq
	// order ("" when they are).
	misnumbered string
	published   bool // a run's published message (set by its check)
}

// bufferedTexts sorts the thread's held deltas by message and finds, for
// each streamed message, which of its written deltas are missing and
// whether retention can have removed them: the parts are numbered in seq
// order from first_seq, so part j lies at least j seqs after first_seq,
// and after any held part before it.
func (th *auditThread) bufferedTexts() map[string]*bufferedText {
	out := map[string]*bufferedText{}
	get := func(id string) *bufferedText {
		b := out[id]
		if b == nil {
			b = &bufferedText{}
			out[id] = b
		}
		return b
	}
	for _, d := range th.deltas {
		b := get(d.MessageID)
		b.held = append(b.held, d)
	}
	for id, w := range th.written {
		b := get(id)
		b.written, b.counted = w, true
	}
	mark := th.row.DeltasPurgedThrough
	for id, b := range out {
		next, prevPart, prevSeq := 0, -1, b.written.FirstSeq-1
		missing := func(upTo int) { // parts next..upTo-1 are not held
			for j := next; j < upTo; j++ {
				at := prevSeq + int64(j-prevPart) // the earliest seq part j can have had
				if at <= mark {
					b.purged = true
					continue
				}
				if len(b.gone) == 0 {
					b.goneFrom = at
				}
				b.gone = append(b.gone, j)
			}
		}
		for _, d := range b.held {
			switch {
			case !b.counted:
				b.misnumbered = fmt.Sprintf("message %s has deltas (seq %d on) but no stream_messages row counting them", id, d.Seq)
			case d.Part < next || d.Part >= b.written.Parts:
				b.misnumbered = fmt.Sprintf("delta seq %d of message %s is part %d, not the next of the %d parts written in seq order", d.Seq, id, d.Part, b.written.Parts)
			}
			if b.misnumbered != "" {
				break
			}
			missing(d.Part)
			next, prevPart, prevSeq = d.Part+1, d.Part, d.Seq
		}
		if b.misnumbered == "" {
			missing(b.written.Parts)
		}
	}
	return out
}

// text is the concatenated text of the held deltas with seq up to upTo
// (all of them for -1).
func (b *bufferedText) text(upTo int64) string {
	var s strings.Builder
	for _, d := range b.held {
		if upTo < 0 || d.Seq <= upTo {
			s.WriteString(d.Text)
		}
	}
	return s.String()
}

// partList names written parts for a report: "part 3", "parts 3–5".
func partList(parts []int) string {
	if len(parts) == 1 {
		return fmt.Sprintf("part %d", parts[0])
	}
	if parts[len(parts)-1]-parts[0] == len(parts)-1 {
		return fmt.Sprintf("parts %d–%d", parts[0], parts[len(parts)-1])
	}
	s := make([]string, len(parts))
	for i, p := range parts {
		s[i] = fmt.Sprint(p)
	}
	return "parts " + strings.Join(s, ", ")
}

// ---- 7: one terminal status; cancelled once a cancel was accepted ----

var terminalEventOf = map[chat.RunStatus]string{
	chat.RunCompleted: chat.EventRunCompleted,
	chat.RunFailed:    chat.EventRunFailed,
	chat.RunCancelled: chat.EventRunCancelled,
}

func checkTerminalStatus(a *auditor, th *auditThread) {
	var active []string
	for _, r := range th.runs {
		st := r.status()
		if !st.Valid() {
			a.add(7, "run %s has unknown status %q", r.RunID, r.Status)
		}
		evs := th.terminal[r.RunID]
		switch {
		case len(evs) > 1:
			a.add(7, "run %s has %d terminal events", r.RunID, len(evs))
		case st.Terminal() && len(evs) == 0 && !th.terminalPurged(r):
			a.add(7, "run %s is %s without its terminal event", r.RunID, st)
		case !st.Terminal() && len(evs) > 0:
			a.add(7, "run %s is %s but emitted %s", r.RunID, st, evs[0].Type)
		case st.Terminal() && len(evs) == 1 && evs[0].Type != terminalEventOf[st]:
			a.add(7, "run %s is %s but its terminal event is %s", r.RunID, st, evs[0].Type)
		}
		if r.CancelRequestedAt.Valid && !st.CancelAccepted() {
			a.add(7, "run %s had its cancel accepted but is %s", r.RunID, st)
		}
		if st.Terminal() != r.FinishedAt.Valid {
			a.add(7, "run %s is %s with finished_at %v", r.RunID, st, r.FinishedAt.Valid)
		}
		if !st.Terminal() {
			active = append(active, r.RunID)
		}
	}
	if len(active) > 1 {
		a.add(7, "thread %s has %d active runs: %s", th.row.ThreadID, len(active), strings.Join(active, ", "))
	}
}

// ---- 8: the log is gapless but for recorded absences; one event each ----

func checkEventLog(a *auditor, th *auditThread) {
	t := th.row
	// Durable events and deltas share one sequence: merged, every seq from
	// 1 to last_seq appears once, except an event at or below the event
	// purge mark or a delta at or below the stream purge mark. (A seq
	// missing at or below the stream mark is taken for a purged delta; were
	// it a durable event, invariant 5 sees the version it took.)
	held := make([]int64, 0, len(th.events)+len(th.deltas))
	for i, j := 0, 0; i < len(th.events) || j < len(th.deltas); {
		if j >= len(th.deltas) || (i < len(th.events) && th.events[i].Seq <= th.deltas[j].Seq) {
			held = append(held, th.events[i].Seq)
			i++
		} else {
			held = append(held, th.deltas[j].Seq)
			j++
		}
	}
	mark := max(t.EventsPurgedThrough, t.DeltasPurgedThrough)
	var missing []string
	report := func(from, to int64) {
		switch {
		case from > to:
		case from == to:
			missing = append(missing, fmt.Sprint(from))
		default:
			missing = append(missing, fmt.Sprintf("%d–%d", from, to))
		}
	}
	// Seqs recorded lost in a crash may be absent; one of them held, or a
	// record past last_seq, contradicts the record.
	for i, l := range th.lost {
		if l.FirstSeq < 1 || l.LastSeq < l.FirstSeq || l.LastSeq > t.LastSeq || (i > 0 && l.FirstSeq <= th.lost[i-1].LastSeq) {
			a.add(8, "thread %s records seqs %d–%d lost, outside 1..last_seq (%d) or overlapping another record", t.ThreadID, l.FirstSeq, l.LastSeq, t.LastSeq)
		}
	}
	for _, seq := range held {
		for _, l := range th.lost {
			if seq >= l.FirstSeq && seq <= l.LastSeq {
				a.add(8, "thread %s holds seq %d, which it records lost (%d–%d)", t.ThreadID, seq, l.FirstSeq, l.LastSeq)
			}
		}
	}
	gap := func(from, to int64) { // seqs from..to are absent
		from = max(from, mark+1)
		to = min(to, t.LastSeq)
		for _, l := range th.lost {
			if from > to {
				return
			}
			if l.LastSeq < from || l.FirstSeq > to {
				continue
			}
			report(from, l.FirstSeq-1)
			from = l.LastSeq + 1
		}
		report(from, to)
	}
	prev := int64(0)
	for _, seq := range held {
		switch {
		case seq == prev:
			a.add(8, "thread %s has seq %d twice", t.ThreadID, seq)
		case seq < 1 || seq > t.LastSeq:
			a.add(8, "thread %s holds seq %d, outside 1..last_seq (%d)", t.ThreadID, seq, t.LastSeq)
		}
		gap(prev+1, seq-1)
		prev = max(prev, seq)
	}
	gap(prev+1, t.LastSeq)
	for _, r := range missing {
		a.add(8, "thread %s is missing seq %s from its log, and no purge explains it", t.ThreadID, r)
	}

	// Every published message has exactly one message.published and every
	// checkpoint exactly one checkpoint.created, each naming it; every such
	// event has its row.
	published := map[string]int{}
	created := map[string]int{}
	// logHead is the head the log's events put the thread at: every
	// checkpoint.created makes its checkpoint the head, a
	// thread.head_moved its own ("": no such event held).
	logHead := ""
	for _, e := range th.events {
		if e.bodyErr != nil {
			a.add(8, "thread %s event seq %d has an unreadable payload: %v", t.ThreadID, e.Seq, e.bodyErr)
			continue
		}
		b := e.body
		if b.Type != e.Type || b.Seq != e.Seq || b.StateVersion != e.StateVersion || b.RunID != e.RunID.String {
			a.add(8, "thread %s event seq %d (%s) carries other fields than its log row (type %s, seq %d, v%d, run %q)", t.ThreadID, e.Seq, e.Type, b.Type, b.Seq, b.StateVersion, b.RunID)
		}
		switch e.Type {
		case chat.EventMessagePublished:
			id := e.MessageID.String
			published[id]++
			m, ok := th.msgByID[id]
			switch {
			case b.Message == nil || b.Message.MessageID != id:
				a.add(8, "message.published seq %d of thread %s does not carry message %s", e.Seq, t.ThreadID, id)
			case !ok:
				a.add(8, "message.published seq %d of thread %s names message %s, which does not exist", e.Seq, t.ThreadID, id)
			case b.Message.Content != m.Content:
				a.add(8, "message.published seq %d of thread %s carries another text than message %s", e.Seq, t.ThreadID, id)
			}
		case chat.EventCheckpointCreated:
			created[b.CheckpointID]++
			cp, ok := th.cpByID[b.CheckpointID]
			switch {
			case !ok:
				a.add(8, "checkpoint.created seq %d of thread %s names checkpoint %q, which does not exist", e.Seq, t.ThreadID, b.CheckpointID)
			case (cp.ParentCheckpointID == nil) != (b.ParentID == nil) || (b.ParentID != nil && *b.ParentID != *cp.ParentCheckpointID):
				a.add(8, "checkpoint.created seq %d of thread %s names another parent than checkpoint %s has", e.Seq, t.ThreadID, cp.CheckpointID)
			}
			logHead = b.CheckpointID
		case chat.EventThreadHeadMoved:
			if _, ok := th.cpByID[b.HeadID]; !ok {
				a.add(8, "thread.head_moved seq %d of thread %s moves the head to %q, which is not one of its checkpoints", e.Seq, t.ThreadID, b.HeadID)
			}
			if logHead != "" && b.PreviousHead != logHead {
				a.add(8, "thread.head_moved seq %d of thread %s says the head was %q, but the log put it at %s", e.Seq, t.ThreadID, b.PreviousHead, logHead)
			}
			logHead = b.HeadID
		case chat.EventMessageDeleted:
			if _, ok := th.msgByID[b.MessageID]; !ok {
				a.add(8, "message.deleted seq %d of thread %s names message %q, which is not the thread's", e.Seq, t.ThreadID, b.MessageID)
			}
		case chat.EventToolPrepared, chat.EventToolUpdated:
			if b.Operation == nil {
				a.add(8, "%s seq %d of thread %s carries no operation", e.Type, e.Seq, t.ThreadID)
			} else if op, ok := th.opByID[b.Operation.OperationID]; !ok || op.RunID != e.RunID.String {
				a.add(8, "%s seq %d of thread %s names operation %q, which is not one of run %s", e.Type, e.Seq, t.ThreadID, b.Operation.OperationID, e.RunID.String)
			}
		}
		if strings.HasPrefix(e.Type, "run.") || strings.HasPrefix(e.Type, "tool.") {
			if _, ok := th.runByID[e.RunID.String]; !ok {
				a.add(8, "%s seq %d of thread %s names run %q, which is not one of the thread's", e.Type, e.Seq, t.ThreadID, e.RunID.String)
			}
		}
	}
	if logHead != "" && logHead != t.HeadCheckpointID {
		a.add(8, "thread %s has head %s, but its last checkpoint.created or thread.head_moved put it at %s", t.ThreadID, t.HeadCheckpointID, logHead)
	}
	for _, m := range th.msgs {
		if n := published[m.MessageID]; n != 1 && !(n == 0 && th.versionPurged(m.StateVersion)) {
			a.add(8, "message %s has %d message.published events", m.MessageID, n)
		}
		if m.RedactedAt.Valid && (m.Content != "" || (!t.DeletedAt.Valid && (!m.DeletedAt.Valid || m.Kind != chat.KindFragment))) {
			a.add(0, "message %s is marked redacted but is not an emptied deleted draft or message of a deleted thread", m.MessageID)
		}
	}
	for _, cp := range th.cps {
		if n := created[cp.CheckpointID]; n != 1 && !(n == 0 && th.versionPurged(cp.StateVersion)) {
			a.add(8, "checkpoint %s has %d checkpoint.created events", cp.CheckpointID, n)
		}
	}
}

// ---- 9: each step of a run is published at most once ----

// checkStepsOnce reads each run's steps from the checkpoints it wrote. A
// step's checkpoint completes the pending step of its parent: a generate
// step adds at most one message of the run (and may leave a tool call
// pending), a tool step records the result of exactly the operation its
// parent waited on (or, when a cancel stopped that call, prepares it again
// as a new operation). A checkpoint whose parent had no such step pending
// is a step published twice; so is a second step checkpoint on one
// parent, or a second result of one operation.
func checkStepsOnce(a *auditor, th *auditThread) {
	stepChildren := map[string][]string{}
	for _, cp := range th.cps {
		if cp.RunID == nil {
			continue
		}
		runID := *cp.RunID
		if _, ok := th.runByID[runID]; !ok {
			a.add(9, "checkpoint %s names run %s, which is not one of thread %s", cp.CheckpointID, runID, th.row.ThreadID)
			continue
		}
		if cp.ParentCheckpointID == nil {
			a.add(9, "checkpoint %s of run %s continues no checkpoint", cp.CheckpointID, runID)
			continue
		}
		parent, ok := th.cpByID[*cp.ParentCheckpointID]
		if !ok {
			continue // invariant 3 reports it
		}
		stepChildren[parent.CheckpointID] = append(stepChildren[parent.CheckpointID], cp.CheckpointID)
		added, ok := appended(parent.MessageIDs, cp.MessageIDs)
		if !ok {
			a.add(9, "checkpoint %s of run %s does not extend its parent's history", cp.CheckpointID, runID)
			continue
		}
		if len(added) > 1 {
			a.add(9, "checkpoint %s of run %s published %d messages in one step", cp.CheckpointID, runID, len(added))
		}
		for _, id := range added {
			if m, ok := th.msgByID[id]; !ok || m.RunID.String != runID || m.CheckpointID != cp.CheckpointID {
				a.add(9, "checkpoint %s of run %s adds message %s, which that step did not publish", cp.CheckpointID, runID, id)
			}
		}
		p := parent.Pending
		switch {
		case p == nil:
			a.add(9, "run %s published checkpoint %s on top of %s, which had no step left to run (a step published twice)", runID, cp.CheckpointID, parent.CheckpointID)
		case p.Step == chat.StepGenerate:
			if cp.Pending != nil && cp.Pending.Step != chat.StepTool {
				a.add(9, "generate step checkpoint %s of run %s leaves a %s step pending", cp.CheckpointID, runID, cp.Pending.Step)
			}
			if cp.Pending != nil {
				if op, ok := th.opByID[cp.Pending.InputHash]; !ok || op.RunID != runID {
					a.add(9, "checkpoint %s of run %s waits on operation %s, which is not the run's", cp.CheckpointID, runID, cp.Pending.InputHash)
				}
			}
			if len(added) == 0 && cp.Pending == nil {
				a.add(9, "generate step checkpoint %s of run %s produced neither a message nor a call", cp.CheckpointID, runID)
			}
		case p.Step == chat.StepTool:
			waited, ok := th.opByID[p.InputHash]
			inherited := false
			if !ok {
				// A fork's first checkpoint may wait on a call of the thread
				// it was forked from; the fork prepares it again.
				owner, err := a.rowThread(a.opThread, `SELECT thread_id FROM operations WHERE operation_id = ?`, p.InputHash)
				a.lookupErr(err)
				for src, depth := th.row.ThreadID, 0; owner != "" && src != "" && depth < 1000 && !inherited; depth++ {
					src, err = a.forkSource(src)
					a.lookupErr(err)
					inherited = src == owner
				}
			}
			switch {
			case inherited && len(added) == 0 && cp.Pending != nil && cp.Pending.Step == chat.StepTool:
				// The source's call, prepared again in the fork.
			case !ok:
				a.add(9, "checkpoint %s waited on operation %s, which is not one of its thread or fork source", parent.CheckpointID, p.InputHash)
			case len(added) == 1:
				m := th.msgByID[added[0]]
				if m.Role != chat.RoleTool || toolMessageOp(m) != waited.OperationID {
					a.add(9, "tool step checkpoint %s of run %s records %s, not the result of operation %s", cp.CheckpointID, runID, added[0], waited.OperationID)
				}
			case len(added) == 0 && cp.Pending != nil && cp.Pending.Step == chat.StepTool && cp.Pending.InputHash != waited.OperationID &&
				(waited.Phase == chat.PhaseAborted || waited.Phase == chat.PhaseVoided):
				// The call a cancel stopped, prepared again.
			default:
				a.add(9, "checkpoint %s of run %s completes the tool step of %s without recording operation %s's result", cp.CheckpointID, runID, parent.CheckpointID, waited.OperationID)
			}
		}
	}
	for parent, kids := range stepChildren {
		if len(kids) > 1 {
			sort.Strings(kids)
			a.add(9, "the step pending at checkpoint %s was published %d times: %s", parent, len(kids), strings.Join(kids, ", "))
		}
	}
	// One recorded result per tool call.
	results := map[string][]string{}
	for _, m := range th.msgs {
		if m.Role != chat.RoleTool {
			continue
		}
		op := toolMessageOp(m)
		o, ok := th.opByID[op]
		if !ok || !m.RunID.Valid || o.RunID != m.RunID.String {
			a.add(9, "tool message %s reports operation %q, which is not one of its run", m.MessageID, op)
			continue
		}
		results[op] = append(results[op], m.MessageID)
	}
	for _, o := range th.ops {
		got := results[o.OperationID]
		if len(got) > 1 {
			a.add(9, "operation %s has %d recorded results: %s", o.OperationID, len(got), strings.Join(got, ", "))
		}
		if o.ResultRef.Valid && !slices.Contains(got, o.ResultRef.String) {
			a.add(9, "operation %s names result %s, which is not a tool message reporting it", o.OperationID, o.ResultRef.String)
		}
	}
}

// appended returns the ids child adds at the end of parent (ok false when
// child does not start with parent).
func appended(parent, child []string) ([]string, bool) {
	if len(child) < len(parent) || !slices.Equal(parent, child[:len(parent)]) {
		return nil, false
	}
	return child[len(parent):], true
}

// toolMessageOp is the operation a tool message reports.
func toolMessageOp(m messageRow) string {
	var rec struct {
		OperationID string `json:"operation_id"`
	}
	_ = json.Unmarshal([]byte(m.Content), &rec)
	return rec.OperationID
}

// ---- 10: reported outcomes never contradict the provider ----

// checkOutcomes audits what the gateway itself recorded: an operation that
// reached its system is never reported not_started; an ended run leaves no
// call in flight; an unknown outcome is still being reconciled, or its
// horizon passed and the receipt says so.
func checkOutcomes(a *auditor, th *auditThread) {
	for _, o := range th.ops {
		r, ok := th.runByID[o.RunID]
		if !ok {
			a.add(10, "operation %s names run %s, which is not one of thread %s", o.OperationID, o.RunID, th.row.ThreadID)
			continue
		}
		outcome := o.Outcome.String
		if o.CommitStartedAt.Valid && (outcome == chat.OutcomeNotStarted || o.Phase == chat.PhaseVoided) {
			a.add(10, "operation %s reached its system but reports %s/%s", o.OperationID, o.Phase, outcome)
		}
		if r.status().Terminal() {
			switch o.Phase {
			case chat.PhasePrepared, chat.PhaseConfirmed, chat.PhaseRunning, chat.PhaseCommitting:
				a.add(10, "run %s ended %s with operation %s still %s", r.RunID, r.Status, o.OperationID, o.Phase)
			case chat.PhaseUnknown:
				// Still asked (a next lookup), or given up at the horizon
				// (no next lookup, the horizon on record: the receipt says so).
				if !o.ReconcileNextAt.Valid && !o.ReconcileUntil.Valid {
					a.add(10, "run %s ended %s with operation %s unknown and no reconciliation going on", r.RunID, r.Status, o.OperationID)
				}
			}
		}
		want := map[string]string{
			chat.PhaseVoided: chat.OutcomeNotStarted, chat.PhaseRejected: chat.OutcomeNotStarted,
			chat.PhaseAborted: chat.OutcomeAborted, chat.PhaseCompleted: chat.OutcomeCompleted,
			chat.PhaseCommitted: chat.OutcomeCommitted, chat.PhaseReconciled: chat.OutcomeCommitted,
			chat.PhaseFailed: chat.OutcomeFailed, chat.PhaseUnknown: chat.OutcomeUnknown,
		}[o.Phase]
		if want != "" && outcome != want {
			a.add(10, "operation %s is %s but reports outcome %q", o.OperationID, o.Phase, outcome)
		}
	}
}

// checkOutcomesAtProvider compares the outcomes with the embedded email
// provider's records, both ways. A key it accepted caused an action, so at
// least one operation with that key must report it (committed) or say it
// does not know (unknown); if every one says not_started, aborted or
// failed, the receipts deny an action that happened. And an operation of
// send_email reported committed names a key the provider accepted: a
// commit the provider never saw is a receipt claiming an action that did
// not happen. (A key taken under the record-late fault has its row from
// the start, so it counts as accepted.)
func checkOutcomesAtProvider(a *auditor) error {
	has, err := a.hasProvider()
	if err != nil || !has {
		return err
	}
	var denied []struct {
		Key         string `db:"idempotency_key"`
		OperationID string `db:"operation_id"`
	}
	if err := a.q.SelectContext(a.ctx, &denied, `SELECT o.idempotency_key, MIN(o.operation_id) AS operation_id FROM operations o
		JOIN outbox p ON p.idempotency_key = o.idempotency_key
		WHERE o.contract = 'consequential'
		GROUP BY o.idempotency_key
		HAVING SUM(CASE WHEN o.outcome IN ('committed', 'unknown') THEN 1 ELSE 0 END) = 0
			AND SUM(CASE WHEN o.outcome IN ('not_started', 'aborted', 'failed') THEN 1 ELSE 0 END) > 0
		ORDER BY o.idempotency_key`); err != nil {
		return fmt.Errorf("audit: outcomes against the provider: %w", err)
	}
	for _, d := range denied {
		a.add(10, "the provider accepted key %q, but operation %s (and every other with that key) reports no action", d.Key, d.OperationID)
	}
	// Committed for a key the provider never accepted: the app's send_email
	// commits through the embedded provider only.
	var claimed []struct {
		OperationID string `db:"operation_id"`
		ThreadID    string `db:"thread_id"`
		Key         string `db:"idempotency_key"`
		Calls       int    `db:"calls"`
	}
	if err := a.q.SelectContext(a.ctx, &claimed, `SELECT o.operation_id, o.thread_id, o.idempotency_key,
		(SELECT COUNT(*) FROM outbox_attempts l WHERE l.idempotency_key = o.idempotency_key) AS calls FROM operations o
		WHERE o.contract = 'consequential' AND o.tool = 'send_email' AND o.outcome = 'committed' AND o.idempotency_key IS NOT NULL
		AND NOT EXISTS (SELECT 1 FROM outbox p WHERE p.idempotency_key = o.idempotency_key)
		ORDER BY o.operation_id`); err != nil {
		return fmt.Errorf("audit: commits against the provider: %w", err)
	}
	for _, c := range claimed {
		a.add(10, "operation %s (thread %s) reports committed, but the provider never accepted its key %q (it logged %d calls with it)", c.OperationID, c.ThreadID, c.Key, c.Calls)
	}
	return nil
}
