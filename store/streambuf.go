package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

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
	// flushDelay gathers deltas into few transactions: the flusher writes
	// what is pending this long after the first delta it was woken for.
	// Every commit on SQLite waits for a sync, and a cancel waits for the
	// commit in progress, whose sync is what stalls under load: fewer
	// commits carrying more deltas make fewer syncs to wait behind
	// (BENCHMARKS.md, issue 31: with 10 ms the scale benchmark made
	// 281-293 commits/s, with 50 ms 167, for a third less server CPU).
	// On PostgreSQL every statement is also a round trip.
	flushDelay = 50 * time.Millisecond
	// maxPendingDeltas bounds the deltas held in memory for all threads;
	// beyond it a batch takes the slow path (written before it is fanned
	// out), which slows the streams to the writer's pace.
	maxPendingDeltas = 1 << 16
	// flushThreads bounds the threads one flush transaction writes (a
	// flush also stops early for a waiting cancel, see flushChunk). A
	// transaction holds each thread's stream until it commits, so a delta
	// of a thread being flushed waits for that commit: 64 made the fan-out
	// benchmark's delivery p99 50 ms against 26-40 ms with 16, and on
	// PostgreSQL a flush holds its threads' rows, which another
	// instance's cancel waits for (BENCHMARKS.md, issue 31).
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
	// flushing is held by a flush from the moment it takes threads off
	// dirty until their write is done: a flush that comes after it (a
	// graceful stop's, while the flusher's is under way) waits for it,
	// instead of finding nothing dirty while those deltas are not written.
	flushing sync.Mutex
	stats    streamCounters
	closed   atomic.Bool   // close began: every batch takes the slow path
	wake     chan struct{} // cap 1: there is something to write
	stop     context.CancelFunc
	done     chan struct{}
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
	b := &streamBuffer{
		s:       s,
		threads: map[string]*threadStream{},
		runs:    map[string]liveRun{},
		until:   map[string]leaseUntil{},
		dirty:   map[string]struct{}{},
		lost:    map[string]string{},
		wake:    make(chan struct{}, 1),
		stop:    stop,
		done:    make(chan struct{}),
	}
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
		"did not answer, so deltas already fanned out are lost and the message cannot be "+
		"whole", chat.ErrDeltasLost, messageID)
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
func (b *streamBuffer) appendFast(
	ctx context.Context,
	lease chat.Lease,
	messageID string,
	texts []string,
) (handled bool, err error) {
	lr, ts, ok := b.live(lease.RunID)
	if !ok || lr.lease != lease || (lr.messageID != "" && lr.messageID != messageID) ||
		b.pending.Load() >= maxPendingDeltas {
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
	pb := &pendingBatch{
		runID:     lease.RunID,
		messageID: messageID,
		texts:     slices.Clone(texts),
		first:     ts.next + 1,
		last:      ts.next + n,
		ts:        now,
		events:    make([]*chat.Event, len(texts)),
	}
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
	timer := time.NewTimer(flushDelay)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-b.wake:
		}
		timer.Reset(flushDelay)
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
	b.flushing.Lock()
	defer b.flushing.Unlock()
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
	// (A flush the flusher has under way is waited for: see flushing.
	// Deltas that come meanwhile are written by the next round.)
	for range 100 {
		if err := b.flush(ctx); err != nil {
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
				if _, err := t.exec(`UPDATE threads SET seq_reserved = 0, seq_holder = '' WHERE thread_id = ?
					AND seq_holder = ? AND last_seq = ?`,
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

// recoverStream records, at start, the seqs a previous process handed out
// (or reserved) and never wrote, and moves each thread's last_seq past
// them; it returns how many threads had such a gap.
func recoverStream(ctx context.Context, s *Store) (int64, error) {
	var n int64
	err := s.write(ctx, func(t *txn) error {
		if _, err := t.exec(`INSERT INTO stream_gaps (thread_id, first_seq, last_seq, recorded_at, reason)
			SELECT thread_id, last_seq + 1, seq_reserved, ?, ? FROM threads
			WHERE seq_reserved > last_seq`, ms(t.now), gapStopped); err != nil {
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
