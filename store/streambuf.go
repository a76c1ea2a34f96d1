package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/mattn/go-sqlite3"

	"github.com/honestcancel/gateway/chat"
)

// The stream path: a delta is sequenced in memory, fanned out at once and
// written later, in batches (on SQLite, where this process is the only
// writer, and on PostgreSQL with Options.StreamBuffer), so that a delta
// waits for no write; durable events keep persist-then-fan-out. Lock
// order: the writer gate, then thread mutexes. The rules that keep this
// honest, and how instances share a thread on PostgreSQL: ARCHITECTURE.md,
// "The stream buffer: deltas before the writer".

const (
	// reserveBlock seqs are reserved at once; a transaction that writes a
	// thread's deltas reserves more when fewer than reserveLow are left.
	reserveBlock = 4096
	reserveLow   = 1024
	// flushDelay gathers deltas into one transaction: the flusher writes
	// what is pending this long after the first delta it was woken for.
	flushDelay = 10 * time.Millisecond
	// pgFlushDelay is flushDelay on PostgreSQL, where every statement is
	// a round trip: longer, so each thread's statements are paid for more
	// deltas at once.
	pgFlushDelay = 50 * time.Millisecond
	// maxPendingDeltas bounds the deltas held in memory for all threads;
	// beyond it a batch takes the slow path (written before it is fanned
	// out), which slows the streams to the writer's pace.
	maxPendingDeltas = 1 << 16
	// flushThreads bounds the threads one flush transaction writes.
	flushThreads = 16
	// yieldTimeout bounds the wait for another instance to give a
	// thread's reservation back (PostgreSQL) before it is written past,
	// once it confirmed that it got the request (a holder that does not
	// confirm at once is written past sooner: see bus/holders.go).
	yieldTimeout = 2 * time.Second
	// maxHeldRounds bounds how often one write asks holders before it
	// gives up with an error.
	maxHeldRounds = 6
)

// streamBuffer is the store's in-memory stream path (nil unless Exclusive on
// SQLite or StreamBuffer on PostgreSQL).
// Safe for concurrent use; its flusher goroutine is owned by the Store
// (started by Open, stopped and waited for by Close).
type streamBuffer struct {
	s *Store

	mu      sync.Mutex
	threads map[string]*threadStream
	runs    map[string]liveRun // runs whose deltas may skip the database
	// until is, on PostgreSQL, how long each live run's lease surely
	// holds (by this process's monotonic clock): past it a batch takes the
	// slow path, which asks the database. Another instance takes a run
	// over only once its lease expired, so an execution that stalled
	// (SIGSTOP, a long pause) and wakes up fans out no delta of a run that is
	// no longer its own (checked again right before each fan-out; a stop
	// within those last instructions is not covered).
	until map[string]leaseUntil
	dirty map[string]struct{} // threads that may hold pending deltas: what the flusher visits
	// lost names the messages (→ their run) this process dropped deltas
	// of because another instance wrote past them (PostgreSQL): refused
	// from then on (chat.ErrDeltasLost), until their run changes.
	lost map[string]string

	pending atomic.Int64 // deltas held in memory, all threads
	stats   streamCounters
	closed  atomic.Bool   // close began: every batch takes the slow path
	wake    chan struct{} // cap 1: there is something to write
	stop    context.CancelFunc
	done    chan struct{}
}

// threadStream is one thread's sequencer. Its fields are guarded by mu.
type threadStream struct {
	mu       sync.Mutex
	known    bool  // loaded from the database once
	written  int64 // the thread's last_seq in the database
	next     int64 // the last seq handed out (≥ written)
	reserved int64 // seqs up to it may be handed out without a write
	pending  []*pendingBatch
	// holder is the lease owner the reservation was taken under (""
	// none); yielded is set when another instance asked for the thread
	// (PostgreSQL) and keeps the slow path from reserving again until the
	// next claim.
	holder  string
	yielded bool
}

// pendingBatch is a run's batch of deltas fanned out and not yet written.
type pendingBatch struct {
	runID, messageID string
	texts            []string
	first, last      int64
	ts               int64
	events           []*chat.Event
}

// liveRun is a run confirmed running under lease, streaming messageID
// ("" when confirmed by its claim: whichever message it streams first).
type liveRun struct {
	lease     chat.Lease
	threadID  string
	messageID string
}

// leaseUntil: lease holds at least until at.
type leaseUntil struct {
	lease chat.Lease
	at    time.Time
}

// leaseSafe is the share of a lease's TTL the fast path trusts from the
// moment before the write that granted or renewed it.
const leaseSafe = 3.0 / 4

// stagedLive is a confirmation a transaction makes, effective at commit
// unless the transaction changes the run after it: after counts the
// transaction's run changes made before the confirmation.
type stagedLive struct {
	liveRun
	after int
}

func newStreamBuffer(s *Store) *streamBuffer {
	ctx, stop := context.WithCancel(context.Background())
	b := &streamBuffer{s: s, threads: map[string]*threadStream{}, runs: map[string]liveRun{}, until: map[string]leaseUntil{}, dirty: map[string]struct{}{},
		lost: map[string]string{}, wake: make(chan struct{}, 1), stop: stop, done: make(chan struct{})}
	go b.flusher(ctx)
	return b
}

// thread returns threadID's sequencer, created unknown.
func (b *streamBuffer) thread(threadID string) *threadStream {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.threadLocked(threadID)
}

func (b *streamBuffer) threadLocked(threadID string) *threadStream {
	ts, ok := b.threads[threadID]
	if !ok {
		ts = &threadStream{}
		b.threads[threadID] = ts
	}
	return ts
}

// live returns the run's confirmation and its thread's sequencer, if the
// run is confirmed live.
func (b *streamBuffer) live(runID string) (liveRun, *threadStream, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	lr, ok := b.runs[runID]
	if !ok {
		return lr, nil, false
	}
	if b.s.pg && !b.leaseTrusted(lr) {
		return lr, nil, false
	}
	return lr, b.threadLocked(lr.threadID), true
}

// stillLive reports whether runID is still confirmed as lr and, if so,
// marks its thread dirty for the flusher, in one lock.
func (b *streamBuffer) stillLive(lr liveRun) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if cur, ok := b.runs[lr.lease.RunID]; !ok || cur != lr {
		return false
	}
	// Checked again here, under the thread's mutex and right before the
	// fan-out: waiting for that mutex (a flush holds it) is where an
	// execution that stalls would otherwise outlive its lease unseen.
	if b.s.pg && !b.leaseTrusted(lr) {
		return false
	}
	b.dirty[lr.threadID] = struct{}{}
	return true
}

// leaseTrusted reports whether lr's lease surely still holds (see until).
// Called with b.mu held.
func (b *streamBuffer) leaseTrusted(lr liveRun) bool {
	u := b.until[lr.lease.RunID]
	return u.lease == lr.lease && time.Now().Before(u.at)
}

// lostDeltas is chat.ErrDeltasLost for messageID, if this process dropped
// deltas of it (see lost), else nil.
func (b *streamBuffer) lostDeltas(messageID string) error {
	b.mu.Lock()
	_, lost := b.lost[messageID]
	b.mu.Unlock()
	if !lost {
		return nil
	}
	return fmt.Errorf("%w: message %s: another instance wrote past the seqs its deltas were given while this process "+
		"did not answer, so deltas already fanned out are lost and the message cannot be whole", chat.ErrDeltasLost, messageID)
}

// markDirty gives threads back to the flusher's next pass.
func (b *streamBuffer) markDirty(ids []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, id := range ids {
		b.dirty[id] = struct{}{}
	}
}

// appendFast hands out seqs for texts and fans them out without writing,
// when the run is confirmed running under lease on messageID and its
// thread has seqs reserved. handled false: take the slow path.
func (b *streamBuffer) appendFast(ctx context.Context, lease chat.Lease, messageID string, texts []string) (handled bool, err error) {
	lr, ts, ok := b.live(lease.RunID)
	if !ok || lr.lease != lease || (lr.messageID != "" && lr.messageID != messageID) || b.pending.Load() >= maxPendingDeltas {
		return false, nil
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	n := int64(len(texts))
	// Checked again under the thread's mutex, which a transaction that
	// forgets the run holds while it does.
	if !ts.known || ts.next+n > ts.reserved || b.closed.Load() || !b.stillLive(lr) {
		return false, nil
	}
	if err := ctx.Err(); err != nil {
		return true, err // a cancel wake-up or shutdown: nothing taken
	}
	now := ms(b.s.clock())
	// The caller reuses texts once this returns: keep a copy.
	pb := &pendingBatch{runID: lease.RunID, messageID: messageID, texts: slices.Clone(texts), first: ts.next + 1, last: ts.next + n, ts: now,
		events: make([]*chat.Event, len(texts))}
	for i, text := range texts {
		ev := &chat.Event{Type: chat.EventMessageDelta, ThreadID: lr.threadID, Seq: pb.first + int64(i), TS: now,
			RunID: lease.RunID, MessageID: messageID, Body: chat.MessageDeltaBody{MessageID: messageID, Text: text}}
		if err := ev.Encode(); err != nil {
			return true, err
		}
		pb.events[i] = ev
	}
	ts.next = pb.last
	ts.pending = append(ts.pending, pb)
	b.pending.Add(n)
	b.s.published(pb.events)
	select {
	case b.wake <- struct{}{}:
	default:
	}
	return true, nil
}

// flusher writes what is pending, flushDelay after being woken, until
// stopped.
func (b *streamBuffer) flusher(ctx context.Context) {
	defer close(b.done)
	delay := flushDelay
	if b.s.pg {
		delay = pgFlushDelay
	}
	timer := time.NewTimer(delay)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-b.wake:
		}
		timer.Reset(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		if err := b.flush(ctx); err != nil && ctx.Err() == nil {
			// The deltas stay pending: the next wake-up (or the next
			// write of their thread) tries again.
			select {
			case b.wake <- struct{}{}:
			default:
			}
		}
	}
}

// flush writes the pending deltas of every dirty thread, a few threads per
// transaction, so that a cancel (or any write) waits for one short
// transaction, not for every stream's backlog. Threads it did not get to
// (an error) stay dirty.
func (b *streamBuffer) flush(ctx context.Context) error {
	b.mu.Lock()
	dirty := make([]*threadStream, 0, len(b.dirty))
	names := make([]string, 0, len(b.dirty))
	for id := range b.dirty {
		dirty, names = append(dirty, b.threads[id]), append(names, id)
	}
	clear(b.dirty)
	b.mu.Unlock()
	// b.mu is taken inside thread mutexes, never around them. A thread
	// whose deltas a durable write took along meanwhile has none left.
	var ids []string
	for i, ts := range dirty {
		ts.mu.Lock()
		if len(ts.pending) > 0 {
			ids = append(ids, names[i])
		}
		ts.mu.Unlock()
	}
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), flushThreads)]
		done := 0
		err := b.s.write(ctx, func(t *txn) error {
			var extended bool
			var err error
			done, extended, err = b.flushChunk(t, chunk)
			if err == nil && t.pg && !extended && done > 0 {
				// On PostgreSQL the flush does not wait for its commit to
				// reach the disk (measured: cancels waited behind flushes
				// holding the writer and their threads' rows through an
				// fsync each, BENCHMARKS.md as of 6e7e314). A crash of PostgreSQL can
				// lose it whole: its deltas then lie in this process's
				// reservation, which is recorded lost at its next write
				// (see the package doc), as after a crash of this process.
				// Any durable commit after it makes it durable too (one
				// WAL, written in order). A flush that moved a reservation
				// ahead waits: seqs handed out are never handed out again.
				_, err = t.exec(`SET LOCAL synchronous_commit TO OFF`)
			}
			return err
		})
		if err != nil {
			b.markDirty(ids)
			return err
		}
		ids = ids[done:]
	}
	return nil
}

// flushChunk writes the pending deltas of the threads named, in t, until a
// cancel waits; it reports how many it went through and whether it moved
// a reservation ahead.
func (b *streamBuffer) flushChunk(t *txn, ids []string) (done int, extended bool, err error) {
	for _, id := range ids {
		if done > 0 && b.s.queue.waiting.Load() > 0 {
			return done, extended, nil // a cancel waits: commit these first
		}
		t.skipHeld = true
		c, err := t.engineThread(id)
		t.skipHeld = false
		if errors.Is(err, errHeldElsewhere) {
			done++ // another instance's now: its deltas here were dropped
			continue
		}
		if err != nil {
			return done, extended, err
		}
		if c.row.LastSeq > c.origSeq {
			// It streams on: keep seqs ahead. (A thread whose deltas a
			// publish wrote meanwhile gave its reservation back, and
			// keeps it given back.)
			before := c.row.SeqReserved
			t.reserve(c, c.row.SeqHolder, false)
			extended = extended || c.row.SeqReserved != before
		}
		done++
	}
	return done, extended, nil
}

// WriteStreams writes every delta that only this process's memory holds
// (fanned out to tabs, not yet written). A graceful stop calls it before
// Close, and again while it fails because another process holds the
// database's write lock (Busy): what tabs were shown must be written
// before the process exits, or it is recorded lost at the next start.
func (s *Store) WriteStreams(ctx context.Context) error {
	b := s.buf
	if b == nil {
		return nil
	}
	// The flusher may have taken the dirty threads and not yet committed
	// them: an empty write waits for its transaction.
	for range 100 {
		if err := b.flush(ctx); err != nil {
			return err
		}
		if err := s.write(ctx, func(*txn) error { return nil }); err != nil {
			return err
		}
		if b.pending.Load() == 0 {
			return nil
		}
	}
	return fmt.Errorf("still %d deltas pending after 100 flushes", b.pending.Load())
}

// Busy reports whether err is SQLite's answer to a write while another
// connection (another process: a backup, an sqlite3 shell) holds the
// database's write lock longer than a transaction waits for it; trying
// again later can succeed.
func Busy(err error) bool {
	var se sqlite3.Error
	return errors.As(err, &se) && (se.Code == sqlite3.ErrBusy || se.Code == sqlite3.ErrLocked)
}

// close stops the flusher, writes what is pending and gives every unused
// reservation back. Called by Store.Close once nothing streams any more.
func (b *streamBuffer) close(ctx context.Context) error {
	b.closed.Store(true)
	b.stop()
	<-b.done
	if err := b.flush(ctx); err != nil {
		return fmt.Errorf("write the stream buffer: %w", err)
	}
	if b.s.pg {
		// Only this process's own reservations: each is given back if
		// the row is still as this process left it.
		type given struct {
			threadID, holder string
			written          int64
		}
		b.mu.Lock()
		threads := make(map[string]*threadStream, len(b.threads))
		maps.Copy(threads, b.threads)
		b.mu.Unlock()
		var mine []given
		for id, ts := range threads { // (b.mu is never held around a thread mutex)
			ts.mu.Lock()
			if ts.holder != "" && ts.reserved > ts.written {
				mine = append(mine, given{id, ts.holder, ts.written})
			}
			ts.mu.Unlock()
		}
		return b.s.write(ctx, func(t *txn) error {
			for _, g := range mine {
				if _, err := t.exec(`UPDATE threads SET seq_reserved = 0, seq_holder = '' WHERE thread_id = ? AND seq_holder = ? AND last_seq = ?`,
					g.threadID, g.holder, g.written); err != nil {
					return fmt.Errorf("give back reserved seqs: %w", err)
				}
			}
			return nil
		})
	}
	return b.s.write(ctx, func(t *txn) error {
		if _, err := t.exec(`UPDATE threads SET seq_reserved = last_seq WHERE seq_reserved > last_seq`); err != nil {
			return fmt.Errorf("give back reserved seqs: %w", err)
		}
		return nil
	})
}

// ---- inside a write transaction ----

// holdStream takes the sequencer of c's thread for the rest of the
// transaction and writes its pending deltas into it (see above). Called
// once per thread, when the transaction loads it.
func (t *txn) holdStream(c *threadCursor) error {
	if t.buf == nil {
		return nil
	}
	id := c.row.ThreadID
	ts, held := t.held[id]
	if held && !t.heldOnly[id] {
		return nil // taken along by this transaction already
	}
	if !held {
		if t.held == nil {
			t.held = map[string]*threadStream{}
		}
		ts = t.buf.thread(id)
		ts.mu.Lock()
		t.held[id] = ts
	}
	// Held by runChanged until now, or just taken: its pending deltas
	// come along either way.
	delete(t.heldOnly, id)
	if t.pg {
		if err := t.adoptShared(c, ts); err != nil {
			return err
		}
		return t.writePending(c, ts)
	}
	if !ts.known {
		ts.known, ts.written, ts.next, ts.reserved = true, c.row.LastSeq, c.row.LastSeq, max(c.row.SeqReserved, c.row.LastSeq)
	}
	if c.row.LastSeq != ts.written {
		if len(ts.pending) > 0 {
			return fmt.Errorf("thread %s: the database's last_seq %d is not the %d this process wrote, so the deltas held in memory have no place: another process writes this database", id, c.row.LastSeq, ts.written)
		}
		// Nothing in memory: the database is the truth.
		ts.written, ts.next, ts.reserved = c.row.LastSeq, c.row.LastSeq, max(c.row.SeqReserved, c.row.LastSeq)
	}
	return t.writePending(c, ts)
}

// writePending writes the thread's pending deltas at c's next seqs.
func (t *txn) writePending(c *threadCursor, ts *threadStream) error {
	// Consecutive batches of one message become one row (each delta
	// keeps the time it was fanned out with).
	for i := 0; i < len(ts.pending); {
		pb := ts.pending[i]
		var texts []string
		var tss []int64
		j := i
		for ; j < len(ts.pending) && ts.pending[j].messageID == pb.messageID && ts.pending[j].runID == pb.runID; j++ {
			texts = append(texts, ts.pending[j].texts...)
			for range ts.pending[j].texts {
				tss = append(tss, ts.pending[j].ts)
			}
		}
		if err := t.writeBatch(c, pb.runID, pb.messageID, texts, tss); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// adoptShared is holdStream's check on PostgreSQL, where other instances
// write the thread too: the sequencer in memory counts only while the row
// still names this process's reservation exactly as the sequencer left
// it. Otherwise another instance wrote past it (recording it as a gap):
// the deltas held for it are dropped, lost, and the row is the truth.
// A live reservation of another process is not this transaction's to use:
// it is written past if the caller was allowed to (the holder did not
// answer, see Store.acrossHolders), skipped when the transaction only
// visits the thread (flush, yield), and refused with *threadHeld
// otherwise.
func (t *txn) adoptShared(c *threadCursor, ts *threadStream) error {
	row := &c.row
	reserved := row.SeqReserved > row.LastSeq
	mine := ts.known && ts.holder != "" && reserved && row.SeqHolder == ts.holder && row.LastSeq == ts.written
	if mine {
		return nil
	}
	if len(ts.pending) > 0 {
		var n int64
		t.buf.mu.Lock()
		for _, pb := range ts.pending {
			n += int64(len(pb.texts))
			t.buf.lost[pb.messageID] = pb.runID
		}
		t.buf.mu.Unlock()
		ts.pending = nil
		t.buf.pending.Add(-n)
		t.buf.stats.deltasLost.Add(n)
	}
	own := ts.holder != "" && row.SeqHolder == ts.holder
	ts.known, ts.written, ts.next, ts.reserved, ts.holder = true, row.LastSeq, row.LastSeq, row.LastSeq, ""
	if !reserved {
		return nil
	}
	switch {
	case own || t.pastOK[row.ThreadID] == row.SeqReserved:
		// This process's own reservation that no longer matches (the
		// database lost writes: it stopped), or one whose holder did not
		// answer: record it lost and go past it.
		reason := gapWrittenPast
		if own {
			reason = gapStopped
		}
		t.wrotePast = t.wrotePast || !own
		if _, err := t.exec(`INSERT INTO stream_gaps (thread_id, first_seq, last_seq, recorded_at, reason) VALUES (?, ?, ?, ?, ?)`,
			row.ThreadID, row.LastSeq+1, row.SeqReserved, ms(t.now), reason); err != nil {
			return fmt.Errorf("record the seqs reserved by %s as lost: %w", row.SeqHolder, err)
		}
		t.buf.stats.writtenPast.Add(1)
		row.LastSeq, row.SeqReserved, row.SeqHolder = row.SeqReserved, 0, ""
		c.touched = true
		return nil
	case t.skipHeld:
		delete(t.threads, row.ThreadID) // nothing of it may change here
		return errHeldElsewhere
	default:
		return &threadHeld{threadID: row.ThreadID, holder: row.SeqHolder, reserved: row.SeqReserved}
	}
}

// Why a stream_gaps row's seqs were never written (its reason column).
const (
	gapStopped     = "stopped"      // a process (or the database) stopped before writing them
	gapWrittenPast = "written_past" // another instance wrote past a holder that did not answer
)

// threadHeld refuses a write to a thread whose seqs another process
// reserved (PostgreSQL): Store.acrossHolders asks the holder to yield and
// runs the write again.
type threadHeld struct {
	threadID, holder string
	reserved         int64
}

func (e *threadHeld) Error() string {
	return fmt.Sprintf("thread %s is streaming on %s (seqs reserved up to %d)", e.threadID, e.holder, e.reserved)
}

// errHeldElsewhere is adoptShared's answer to a transaction that only
// visits threads (t.skipHeld): this one is another process's now.
var errHeldElsewhere = errors.New("thread held by another process")

// reserve moves the thread's reservation ahead, under holder (a run lease
// owner), when few seqs are left. fresh is a claim's reservation: on
// PostgreSQL only a claim reserves for a thread another instance asked
// for (see yielded).
func (t *txn) reserve(c *threadCursor, holder string, fresh bool) {
	if t.buf == nil || holder == "" {
		return
	}
	if t.pg {
		ts := t.held[c.row.ThreadID]
		if ts == nil {
			return
		}
		if fresh {
			t.unyield = append(t.unyield, c.row.ThreadID)
		} else if ts.yielded && !slices.Contains(t.unyield, c.row.ThreadID) {
			return
		}
		if c.row.SeqReserved > c.row.LastSeq && c.row.SeqHolder != holder {
			return // another run's execution holds it (adoptShared let it be)
		}
	}
	// While the transaction holds the thread, the database's row is at
	// least as far as the sequencer: it alone decides.
	if c.row.SeqReserved-c.row.LastSeq < reserveLow {
		c.row.SeqReserved = c.row.LastSeq + reserveBlock
		c.row.SeqHolder = holder
		c.touched = true
	}
}

// release gives back the thread's reserved seqs: the step that streamed
// ends in this transaction (published, or its run ends), so at a crash
// from here on nothing of it is lost and no seq is recorded lost. A run
// streaming again reserves anew (its first batch takes the slow path).
func (t *txn) release(c *threadCursor) {
	if t.buf == nil || (c.row.SeqReserved == 0 && c.row.SeqHolder == "") {
		return
	}
	c.row.SeqReserved, c.row.SeqHolder = 0, ""
	c.touched = true
}

// writeBatch writes one batch of a streamed message's deltas at c's next
// seqs (they were handed out already when the batch was fanned out, or
// are handed out now by the caller's events), counting it into its
// message's row; the first batch of a message creates the row.
func (t *txn) writeBatch(c *threadCursor, runID, messageID string, texts []string, tss []int64) error {
	chars := 0
	for _, text := range texts {
		chars += utf8.RuneCountInString(text)
	}
	first := c.row.LastSeq + 1
	var parts int
	err := t.execRow(`UPDATE stream_messages SET parts = parts + ?, chars = chars + ? WHERE message_id = ? RETURNING parts`,
		len(texts), chars, messageID).Scan(&parts)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if _, err := t.exec(`INSERT INTO stream_messages (message_id, thread_id, run_id, first_seq, parts, chars, created_at)
			VALUES (?, ?, ?, ?, ?, ?, ?)`, messageID, c.row.ThreadID, runID, first, len(texts), chars, ms(t.now)); err != nil {
			return fmt.Errorf("start streamed message: %w", err)
		}
		parts = 0
	case err != nil:
		return fmt.Errorf("count streamed text: %w", err)
	default:
		parts -= len(texts)
	}
	encoded, err := encodeTexts(texts)
	if err != nil {
		return err
	}
	ts, offsets, err := encodeTimes(tss)
	if err != nil {
		return err
	}
	c.row.LastSeq += int64(len(texts))
	c.touched = true
	if _, err := t.exec(`INSERT INTO stream_batches (`+batchCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		c.row.ThreadID, first, c.row.LastSeq, runID, messageID, parts, encoded, ts, offsets); err != nil {
		return fmt.Errorf("buffer deltas: %w", err)
	}
	t.buffered += int64(len(texts))
	return nil
}

// confirmLive stages runID as confirmed running under lease on
// messageID ("" any), effective when the transaction commits unless the
// transaction changes the run again after it (runChanged).
func (t *txn) confirmLive(lease chat.Lease, threadID, messageID string) {
	if t.buf != nil {
		t.live = append(t.live, stagedLive{liveRun{lease: lease, threadID: threadID, messageID: messageID}, len(t.changedRuns)})
	}
}

// leaseHolds stages, for commit, that lease holds for ttl from start (a
// moment before the write that grants or renews it) — of which the fast
// path trusts leaseSafe (PostgreSQL; see streamBuffer.until).
func (t *txn) leaseHolds(lease chat.Lease, start time.Time, ttl time.Duration) {
	if t.buf != nil && t.pg {
		t.leases = append(t.leases, leaseUntil{lease: lease, at: start.Add(time.Duration(float64(ttl) * leaseSafe))})
	}
}

// runChanged notes that the transaction changes runID's status or lease:
// at commit the buffer forgets it (see above).
//
// A run whose deltas may skip the database has its thread's sequencer
// held from here to the end of the transaction (if the transaction does
// not hold it already), so that no batch of it is fanned out between the
// commit and the forgetting.
func (t *txn) runChanged(runID string) {
	if t.buf == nil {
		return
	}
	t.changedRuns = append(t.changedRuns, runID)
	lr, ts, ok := t.buf.live(runID)
	if !ok {
		return
	}
	if _, held := t.held[lr.threadID]; held {
		return
	}
	ts.mu.Lock()
	if t.held == nil {
		t.held = map[string]*threadStream{}
	}
	t.held[lr.threadID] = ts
	if t.heldOnly == nil {
		t.heldOnly = map[string]bool{}
	}
	t.heldOnly[lr.threadID] = true
}

// endStreams ends the transaction's hold on its threads' sequencers, after
// it committed (and fanned out its events) or rolled back. On commit every
// held thread's pending deltas are written, so its sequencer moves to what
// the transaction left; runs it confirmed become live, runs it changed are
// forgotten.
func (t *txn) endStreams(committed bool) {
	if t.buf == nil {
		return
	}
	b := t.buf
	if committed {
		for id, ts := range t.held {
			c, ok := t.threads[id]
			if !ok {
				continue // held for runChanged, or loaded by a refused request only: nothing was written
			}
			for _, pb := range ts.pending {
				b.pending.Add(-int64(len(pb.texts)))
			}
			ts.pending = nil
			ts.written, ts.next = c.row.LastSeq, c.row.LastSeq
			ts.reserved = max(c.row.SeqReserved, c.row.LastSeq)
			ts.holder = ""
			if ts.reserved > ts.written {
				ts.holder = c.row.SeqHolder
			}
		}
		for _, id := range t.unyield {
			if ts := t.held[id]; ts != nil {
				ts.yielded = false
			}
		}
		for _, id := range t.yield {
			if ts := t.held[id]; ts != nil {
				ts.yielded = true
			}
		}
		b.mu.Lock()
		// Each changed run was live when runChanged held its thread,
		// which is still held. The transaction's last word on a run wins:
		// a confirmation made after its last change (a claim) stands, one
		// made before it goes.
		lastChange := make(map[string]int, len(t.changedRuns))
		for i, runID := range t.changedRuns {
			delete(b.runs, runID)
			delete(b.until, runID)
			lastChange[runID] = i + 1
		}
		for msg, runID := range b.lost {
			if _, changed := lastChange[runID]; changed {
				delete(b.lost, msg)
			}
		}
		for _, u := range t.leases {
			if cur, ok := b.until[u.lease.RunID]; !ok || cur.lease != u.lease || u.at.After(cur.at) {
				b.until[u.lease.RunID] = u
			}
		}
		for _, sl := range t.live {
			if sl.after >= lastChange[sl.lease.RunID] {
				b.runs[sl.lease.RunID] = sl.liveRun
			}
		}
		b.mu.Unlock()
	}
	for _, ts := range t.held {
		ts.mu.Unlock()
	}
	clear(t.held)
	clear(t.heldOnly)
	t.live, t.changedRuns, t.yield, t.unyield, t.leases = nil, nil, nil, nil, nil
}

// recoverStream records, at start, the seqs a previous process handed out
// (or reserved) and never wrote, and moves each thread's last_seq past
// them; it returns how many threads had such a gap.
func recoverStream(ctx context.Context, s *Store) (int64, error) {
	var n int64
	err := s.write(ctx, func(t *txn) error {
		if _, err := t.exec(`INSERT INTO stream_gaps (thread_id, first_seq, last_seq, recorded_at, reason)
			SELECT thread_id, last_seq + 1, seq_reserved, ?, ? FROM threads WHERE seq_reserved > last_seq`, ms(t.now), gapStopped); err != nil {
			return fmt.Errorf("record lost stream seqs: %w", err)
		}
		res, err := t.exec(`UPDATE threads SET last_seq = seq_reserved WHERE seq_reserved > last_seq`)
		if err != nil {
			return fmt.Errorf("move last_seq past lost stream seqs: %w", err)
		}
		n, err = res.RowsAffected()
		return err
	})
	return n, err
}
