package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/honestcancel/gateway/chat"
)

// txn is one write transaction. It tracks the sequencer of every thread it
// touched and the events it appended; write() flushes the thread rows and
// publishes the events after commit. Used by one goroutine.
type txn struct {
	ctx     context.Context
	tx      *sqlx.Tx
	now     time.Time
	threads map[string]*threadCursor
	events  []*chat.Event
	// For Metrics, reported after the commit: deltas added to the stream
	// buffer (less those purged), and the cancel_requested_at (ms) of each
	// run whose cancel it finished.
	buffered        int64
	cancelsAccepted []int64
	// wrote is set by every exec: a grouped write that fails after
	// writing spoils the whole transaction (see group.go).
	wrote bool
	pg    bool // on PostgreSQL (see forUpdate)
	// horizon is how long an unknown outcome is reconciled (reconcile.go).
	horizon time.Duration
	// undo, while a group commit runs one of its requests, holds each
	// thread cursor as it was before the request first took it (nil: the
	// request loaded it), so that a refused request can be undone without
	// copying every cursor of the batch before every request.
	undo map[string]*threadCursor
	// The stream buffer (SQLite; nil on PostgreSQL) and what this
	// transaction holds of it and does to it (see streambuf.go).
	buf         *streamBuffer
	cps         *chainCache // the store's (checkpoints.go)
	held        map[string]*threadStream
	heldOnly    map[string]bool // held by runChanged, pending deltas not taken along yet
	live        []stagedLive
	changedRuns []string
	// On PostgreSQL: the threads whose reservation this transaction gave
	// back to another instance (yield) or took by a claim (unyield); the
	// other processes' reservations it may write past (thread → the
	// reservation's seq_reserved, see Store.acrossHolders); and skipHeld,
	// set while it only visits a thread that may be another's.
	yield, unyield []string
	pastOK         map[string]int64
	skipHeld       bool
	wrotePast      bool         // it recorded another process's reservation lost (adoptShared)
	leases         []leaseUntil // granted or renewed here (leaseHolds)
	// runsRead are the runs loaded by run(): with changedRuns, what the
	// cancel journal must not decide on while this commits.
	runsRead []string
	// queueStarted: a run was started from a thread's queue (startItem),
	// so the dispatcher is woken at commit (Store.QueueStarts). Left set
	// when a grouped request is undone: a wake-up too many claims nothing.
	queueStarted bool
}

// keep records, for undo, the cursor of threadID as it is before the
// running request first takes it (c nil: not in the transaction yet).
func (t *txn) keep(threadID string, c *threadCursor) {
	if t.undo == nil {
		return
	}
	if _, ok := t.undo[threadID]; ok {
		return
	}
	if c == nil {
		t.undo[threadID] = nil
		return
	}
	before := *c
	t.undo[threadID] = &before
}

// rollBackCursors undoes what the running request did to the cursors.
func (t *txn) rollBackCursors() {
	for id, before := range t.undo {
		if before == nil {
			delete(t.threads, id)
		} else {
			*t.threads[id] = *before
		}
	}
}

// newTxn starts the bookkeeping of write transaction tx.
func (s *Store) newTxn(ctx context.Context, tx *sqlx.Tx) *txn {
	return &txn{ctx: ctx, tx: tx, now: s.clock(), threads: map[string]*threadCursor{}, pg: s.pg, horizon: s.horizon,
		buf: s.buf, cps: s.cps}
}

// leaseClock is the time, in ms, that leases are granted and judged by: on
// PostgreSQL the database's own clock (read once per call), which every
// instance shares whatever its own clock says; on SQLite, with one
// instance, the transaction's time.
func (t *txn) leaseClock() (int64, error) {
	if !t.pg {
		return ms(t.now), nil
	}
	var now int64
	if err := t.tx.GetContext(t.ctx, &now, dbClockSQL); err != nil {
		return 0, fmt.Errorf("read the database clock: %w", err)
	}
	return now, nil
}

// dbClockSQL reads PostgreSQL's clock in Unix milliseconds.
const dbClockSQL = `SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)`

// forUpdate is the suffix of a SELECT whose rows drive a decision of this
// transaction: on PostgreSQL it locks them (and a read that had to wait
// returns the rows as the other transaction committed them), so instances
// sharing the database take turns on a thread or run instead of failing
// the thread's compare-and-set. SQLite has one writer: nothing to add.
func (t *txn) forUpdate() string {
	if t.pg {
		return " FOR UPDATE"
	}
	return ""
}

// skipLocked is forUpdate for work that never waits for another
// transaction's rows (claims, retention): on PostgreSQL a row another
// transaction holds is left out (another run is claimed; it is purged at
// the next pass).
func (t *txn) skipLocked() string {
	if t.pg {
		return " FOR UPDATE SKIP LOCKED"
	}
	return ""
}

// lockRunThread takes, on PostgreSQL, the lock of the run's thread row
// before the run row is read FOR UPDATE, so every transaction locks a
// thread before its runs (as every write that starts from a thread does).
// A run's thread never changes, so reading it without a lock is safe.
// SQLite has one writer: nothing to do.
//
// Instances then wait for each other without a cycle as long as each
// transaction holds one thread of another instance's: a cancel of another
// instance's run commits alone (writeQueue.take), a group batch holds only
// threads of runs this instance leases, and retention never waits
// (skipLocked). What is left — a takeover racing a previous owner that is
// slow rather than dead — PostgreSQL breaks after its deadlock_timeout
// (1 s by default), and the loser runs again (retry.go).
func (t *txn) lockRunThread(runID string) error {
	if !t.pg {
		return nil
	}
	if _, err := t.tx.ExecContext(t.ctx, t.tx.Rebind(`SELECT 1 FROM threads
		WHERE thread_id = (SELECT thread_id FROM runs WHERE run_id = ?) FOR UPDATE`), runID); err != nil {
		return fmt.Errorf("lock the run's thread: %w", err)
	}
	return nil
}

// threadCursor is a thread's sequencer inside one transaction.
type threadCursor struct {
	row         threadRow
	origSeq     int64
	headChanged bool
	touched     bool
}

func (t *txn) exec(q string, args ...any) (sql.Result, error) {
	t.wrote = true
	return t.tx.ExecContext(t.ctx, t.tx.Rebind(q), args...)
}

// execRow runs a writing statement that returns a row (UPDATE …
// RETURNING); like exec it marks the transaction written.
func (t *txn) execRow(q string, args ...any) *sql.Row {
	t.wrote = true
	return t.tx.QueryRowContext(t.ctx, t.tx.Rebind(q), args...)
}

func (t *txn) get(dest any, q string, args ...any) error {
	return t.tx.GetContext(t.ctx, dest, t.tx.Rebind(q), args...)
}

func (t *txn) sel(dest any, q string, args ...any) error {
	return t.tx.SelectContext(t.ctx, dest, t.tx.Rebind(q), args...)
}

// thread loads a thread of userID into the transaction as its sequencer. A
// thread of another user — and any thread when userID is "" (a caller that
// was never authenticated) — answers not_found.
func (t *txn) thread(userID, threadID string) (*threadCursor, error) {
	if userID == "" {
		return nil, chat.NotFound("thread", threadID)
	}
	return t.loadThread(userID, threadID)
}

// engineThread loads a thread for the engine's own writes (a run it
// executes, recovery), which act for the thread's owner.
func (t *txn) engineThread(threadID string) (*threadCursor, error) {
	return t.loadThread("", threadID)
}

// adoptThread makes row, read by the caller for the engine's own write,
// the transaction's sequencer of its thread (or returns the one already
// loaded, which is newer).
func (t *txn) adoptThread(row threadRow) (*threadCursor, error) {
	if c, ok := t.threads[row.ThreadID]; ok {
		t.keep(row.ThreadID, c)
		return c, nil
	}
	c := &threadCursor{row: row, origSeq: row.LastSeq}
	t.keep(row.ThreadID, nil)
	t.threads[row.ThreadID] = c
	return c, t.holdStream(c)
}

// loadThread checks ownership unless owner is "" (engine writes only); a
// deleted thread is not_found to its owner too, and the engine's writes
// may load it but append no event to it (see append).
func (t *txn) loadThread(owner, threadID string) (*threadCursor, error) {
	if c, ok := t.threads[threadID]; ok {
		if owner != "" && (c.row.UserID != owner || c.row.DeletedAt.Valid) {
			return nil, chat.NotFound("thread", threadID)
		}
		t.keep(threadID, c)
		return c, nil
	}
	var row threadRow
	err := t.get(&row, `SELECT `+threadCols+` FROM threads WHERE thread_id = ?`+t.forUpdate(), threadID)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && owner != "" && (row.UserID != owner || row.DeletedAt.Valid)) {
		return nil, chat.NotFound("thread", threadID)
	}
	if err != nil {
		return nil, fmt.Errorf("load thread: %w", err)
	}
	c := &threadCursor{row: row, origSeq: row.LastSeq}
	t.keep(threadID, nil)
	t.threads[threadID] = c
	return c, t.holdStream(c)
}

// event reserves the next seq (and, for durable types, the next
// state_version) of the thread. The caller fills Body and calls append.
func (t *txn) event(c *threadCursor, typ, runID string) *chat.Event {
	c.touched = true
	c.row.LastSeq++
	ev := &chat.Event{Type: typ, ThreadID: c.row.ThreadID, Seq: c.row.LastSeq, TS: ms(t.now), RunID: runID}
	if ev.Durable() {
		c.row.StateVersion++
		ev.StateVersion = c.row.StateVersion
	}
	return ev
}

// append encodes ev and writes it to the event log (durable events; deltas
// are written to the stream buffer by their caller).
func (t *txn) append(ev *chat.Event) error {
	if c := t.threads[ev.ThreadID]; c != nil && c.row.DeletedAt.Valid {
		// thread.deleted is a thread's last event (docs/protocol.md: nothing after it).
		return fmt.Errorf("append %s to thread %s: it was deleted", ev.Type, ev.ThreadID)
	}
	if err := ev.Encode(); err != nil {
		return err
	}
	if ev.Durable() {
		if _, err := t.exec(`INSERT INTO events (thread_id, seq, type, run_id, message_id, state_version, ts, payload)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			ev.ThreadID, ev.Seq, ev.Type, nullStr(ev.RunID), nullStr(ev.MessageID), ev.StateVersion, ev.TS,
			string(ev.Raw)); err != nil {
			return fmt.Errorf("append %s: %w", ev.Type, err)
		}
	}
	t.events = append(t.events, ev)
	return nil
}

// setHead moves the thread's head checkpoint.
func (t *txn) setHead(c *threadCursor, checkpointID string) {
	c.row.HeadCheckpointID = checkpointID
	c.headChanged = true
	c.touched = true
}

// flushThreads writes back every thread whose sequencer moved. The WHERE on
// the original last_seq is a compare-and-set: a concurrent writer makes the
// transaction fail rather than fork the sequence. (On PostgreSQL the thread
// rows were read FOR UPDATE, so another instance cannot have moved them: a
// failure here is a bug, not a race.)
func (t *txn) flushThreads() error {
	for _, c := range t.threads {
		if !c.touched {
			continue
		}
		res, err := t.exec(
			`UPDATE threads SET state_version = ?, last_seq = ?, head_checkpoint_id = ?, updated_at = ?,
				seq_reserved = ?, seq_holder = ?
			WHERE thread_id = ? AND last_seq = ?`,
			c.row.StateVersion, c.row.LastSeq, c.row.HeadCheckpointID, ms(t.now), c.row.SeqReserved, c.row.SeqHolder,
			c.row.ThreadID, c.origSeq,
		)
		if err != nil {
			return fmt.Errorf("update thread: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("thread %s changed concurrently", c.row.ThreadID)
		}
	}
	return nil
}

func nullStr(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func nullStrPtr(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}
