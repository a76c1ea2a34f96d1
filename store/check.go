package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/honestcancel/gateway/chat"
)

// The audit: Check verifies the eleven invariants of the protocol (docs/protocol.md)
// over a whole database. Each invariant is one function (in check_*.go,
// by what it audits), listed in the invariants table below; per-thread rules see one thread's rows at a time
// (read a page of auditPage threads per query, so a large database is
// streamed, never loaded whole), database-wide rules run once. Rows
// another thread owns (a fork's copied history) are looked up by id when a
// rule needs them.
//
// What the database alone cannot show is said, not assumed: Audit.Unchecked
// names it (e.g. the records of providers outside this database).

// Violation is one broken invariant found by Check.
type Violation struct {
	Invariant int    // 1..11 as numbered in the protocol; 0 for other consistency rules
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
	{
		3,
		"every resume references an existing checkpoint of the same thread (or of its fork source)",
		checkResumeLineage,
		nil,
	},
	{
		4,
		"after run.cancelled nothing of the run is published or emitted but tool.updated",
		checkNothingAfterCancelled,
		nil,
	},
	{5, "state_version moves by exactly one per durable event and no other way", checkStateVersion, nil},
	{6, "history holds only published messages; delta text is never history", checkHistoryIsPublished, nil},
	{7, "a run has at most one terminal status; once cancel_requested it is cancelled", checkTerminalStatus, nil},
	{8, "seqs are gapless except recorded absences; one event per message and checkpoint", checkEventLog, nil},
	{9, "each step of a run is published at most once", checkStepsOnce, nil},
	{10, "a reported outcome never contradicts the provider", checkOutcomes, checkOutcomesAtProvider},
	{
		11,
		"a queue item starts at most one run, never after it was removed, never while the queue is paused",
		checkQueue,
		nil,
	},
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
	a := &auditor{
		ctx:        ctx,
		pg:         s.pg,
		cpThread:   map[string]string{},
		msgThread:  map[string]string{},
		opThread:   map[string]string{},
		forkedFrom: map[string]string{},
	}
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
	if err == nil && s.path != "" && s.journal == nil {
		if n := journaledOutside(s.path); n > 0 {
			a.unchecked("7: the cancel journal (%s%s) holds %d cancels acknowledged and not yet in the "+
				"database: a running server records them at once, a stopped one at its next start", s.path,
				journalSuffix, n)
		}
	}
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
	QueueItemID string `json:"queue_item_id"`
	Queue       *struct {
		Items []struct {
			ItemID string `json:"item_id"`
		} `json:"items"`
		Paused bool `json:"paused"`
	} `json:"queue"`
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
	items   []queueItemRow         // every queue item, waiting or not
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
	if err := sel(&cpRows, "checkpoints", `SELECT `+checkpointCols+` FROM checkpoints WHERE thread_id IN (?)
		ORDER BY thread_id, state_version, checkpoint_id`); err != nil {
		return nil, err
	}
	// Each with its lists whole; one that cannot be made whole (its parent
	// is not a checkpoint of its thread) breaks invariant 3.
	cps, errs := wholeCheckpoints(cpRows)
	for _, err := range errs {
		a.add(3, "%v", err)
	}
	for _, cp := range cps {
		th := byID[cp.ThreadID]
		th.cps = addByID(th.cps, th.cpByID, cp.CheckpointID, cp)
	}
	// Messages, runs and operations: each in its thread's list, in the
	// query's order, and in its map by id.
	for _, load := range []func() error{
		func() error {
			return selectEach(sel, "messages", `SELECT `+messageCols+` FROM messages WHERE thread_id IN (?)
				ORDER BY thread_id, state_version, message_id`,
				func(m messageRow) { th := byID[m.ThreadID]; th.msgs = addByID(th.msgs, th.msgByID, m.MessageID, m) })
		},
		func() error {
			return selectEach(sel, "runs", `SELECT `+runCols+` FROM runs WHERE thread_id IN (?)
				ORDER BY thread_id, created_at, run_id`,
				func(r runRow) { th := byID[r.ThreadID]; th.runs = addByID(th.runs, th.runByID, r.RunID, r) })
		},
		func() error {
			return selectEach(sel, "operations", `SELECT `+operationCols+` FROM operations WHERE thread_id IN (?)
				ORDER BY thread_id, created_at, operation_id`,
				func(o operationRow) { th := byID[o.ThreadID]; th.ops = addByID(th.ops, th.opByID, o.OperationID, o) })
		},
	} {
		if err := load(); err != nil {
			return nil, err
		}
	}
	if err := selectEach(sel, "queue items", `SELECT `+queueItemCols+` FROM queue_items WHERE thread_id IN (?)
		ORDER BY thread_id, created_at, item_id`,
		func(it queueItemRow) { th := byID[it.ThreadID]; th.items = append(th.items, it) }); err != nil {
		return nil, err
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
	if err := sel(&lost, "lost stream seqs", `SELECT thread_id, first_seq, last_seq FROM stream_gaps
		WHERE thread_id IN (?) ORDER BY thread_id, first_seq`); err != nil {
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
	return r.FinishedAt.Valid && r.StartStateVersion <= th.row.EventsPurgedVersion &&
		r.FinishedAt.Int64 <= th.row.EventsPurgedTS
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
	err := a.q.GetContext(
		a.ctx, &src,
		a.q.Rebind(`SELECT forked_from_thread_id FROM threads WHERE thread_id = ?`),
		threadID,
	)
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
