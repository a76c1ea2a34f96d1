package store

import (
	"time"

	"context"
	"errors"
)

// SetPurgeLimits makes retention work in transactions of batch rows, at
// most maxBatches per call, until the test ends (restore).
func SetPurgeLimits(batch, maxBatches int) (restore func()) {
	b, m := purgeBatch, purgeMaxBatches
	purgeBatch, purgeMaxBatches = batch, maxBatches
	return func() { purgeBatch, purgeMaxBatches = b, m }
}

// HoldWriter takes the writer, as a long transaction would, until release.
func (s *Store) HoldWriter() (release func()) {
	s.gate.lock()
	return s.gate.unlock
}

// Retries counts the transactions run again after another instance made
// them fail (a deadlock).
func (s *Store) Retries() int64 { return s.retries.Load() }

// QueuedWrites is how many grouped writes wait for the writer.
func (s *Store) QueuedWrites() int {
	s.queue.mu.Lock()
	defer s.queue.mu.Unlock()
	return len(s.queue.pending)
}

// PlainWritesWaiting is how many plain (ungrouped) writes wait for the
// writer.
func (s *Store) PlainWritesWaiting() int { return s.gate.waiting(false) }

// GroupCommitsWaiting is how many group-commit leaders wait for the writer.
func (s *Store) GroupCommitsWaiting() int { return s.gate.waiting(true) }

// PretendLeading marks the group-commit queue as led, as while a leader
// waits for the writer: callers that queue now wait to be answered.
func (s *Store) PretendLeading() {
	s.queue.mu.Lock()
	s.queue.leading = true
	s.queue.mu.Unlock()
}

// TakeQueued takes every queued grouped write, as a leader does for its
// batch. handBack returns them to the queue and hands the lead to the
// first, as a leader does whose batch a cancel cut short and whose own
// request was answered.
func (s *Store) TakeQueued() (handBack func()) {
	batch := s.queue.take(false)
	return func() {
		s.queue.putBack(batch)
		s.queue.mu.Lock()
		s.queue.passLeadLocked()
		s.queue.mu.Unlock()
	}
}

// LateWithdrawals counts callers that stopped waiting after their request
// was taken into a batch.
func (s *Store) LateWithdrawals() int64 { return s.queue.late.Load() }

// UrgentWrites is how many urgent writes (cancels) wait for the writer.
func (s *Store) UrgentWrites() int { return int(s.queue.waiting.Load()) }

// GroupedWriteThatFails queues a grouped write that inserts a user named
// name and then fails: the failure comes after writing, so the whole
// transaction must be rolled back and the others run again without it.
func (s *Store) GroupedWriteThatFails(ctx context.Context, name string) error {
	return s.writeGrouped(ctx, func(t *txn) error {
		if _, err := t.exec(`INSERT INTO users (user_id, name, created_at) VALUES (?, ?, 0)`, "usr_"+name, name); err != nil {
			return err
		}
		return errors.New("failed after writing")
	})
}

// SetMaxReplayBytes bounds replays to n bytes until restore.
func SetMaxReplayBytes(n int64) (restore func()) {
	old := maxReplayBytes
	maxReplayBytes = n
	return func() { maxReplayBytes = old }
}

// Synchronous reads PRAGMA synchronous on the writer connection, where the
// store's commits happen: 1 is NORMAL, 2 FULL.
func (s *Store) Synchronous(ctx context.Context) (int, error) {
	s.gate.lock()
	defer s.gate.unlock()
	var n int
	err := s.writer.GetContext(ctx, &n, `PRAGMA synchronous`)
	return n, err
}

// Crash ends the store as a killed process would: what only memory holds
// (deltas fanned out and not yet written) is lost, and the reserved seqs
// stay reserved.
func (s *Store) Crash() { s.CrashWhileHeld(nil) }

// CrashWhileHeld is Crash while the test holds the writer (HoldWriter):
// the database is closed before release lets anything waiting for the
// writer go, so nothing more is written. What the cancel journal's file
// holds stays there.
func (s *Store) CrashWhileHeld(release func()) {
	if j := s.journal; j != nil {
		j.stop()
		j.f.Close()
	}
	if release != nil {
		s.writer.Close()
		release()
	}
	if j := s.journal; j != nil {
		<-j.done
	}
	if s.buf != nil {
		s.buf.closed.Store(true)
		s.buf.stop()
		<-s.buf.done
		s.buf = nil
	}
	s.reader.Close()
	s.writer.Close()
	if s.lock != nil {
		s.lock.Close()
	}
}

// StopFlusher stops the stream buffer's flusher without writing: what is
// pending stays in memory only (for a crash test, before letting the
// writer go).
func (s *Store) StopFlusher() {
	if s.buf != nil {
		s.buf.closed.Store(true)
		s.buf.stop()
		<-s.buf.done
	}
}

// PendingDeltas is how many deltas only memory holds.
func (s *Store) PendingDeltas() int64 {
	if s.buf == nil {
		return 0
	}
	return s.buf.pending.Load()
}

// FlushStream writes every delta only memory holds now, as the flusher
// would (for a test that reads the database right after streaming).
func (s *Store) FlushStream(ctx context.Context) error { return s.WriteStreams(ctx) }

// ChangeRunThenLoadThread runs, in one write transaction, what a
// transaction that changes a run before it loads the run's thread does:
// runChanged, then the thread (touched, so it is written back).
func (s *Store) ChangeRunThenLoadThread(ctx context.Context, runID, threadID string) error {
	return s.write(ctx, func(t *txn) error {
		t.runChanged(runID)
		c, err := t.engineThread(threadID)
		if err != nil {
			return err
		}
		c.touched = true
		return nil
	})
}

// ClaimCandidate is the query by which a claim picks its run.
const ClaimCandidate = `SELECT run_id FROM runs WHERE ` + claimable + ` ORDER BY updated_at, run_id LIMIT 1`

// ClaimCandidateShared is ClaimCandidate with a user's share of 2
// (Options.MaxRunsPerUser).
var ClaimCandidateShared = `SELECT run_id FROM runs WHERE ` + claimable + ` AND (status <> 'queued' OR ` + userExecuting(`runs.thread_id`) + ` < 2) ORDER BY updated_at, run_id LIMIT 1`

// PauseFlusher stops the stream buffer's flusher and nothing else: deltas
// keep taking the fast path and stay pending until a write of their
// thread (or FlushStream) takes them along. Close still writes them.
func (s *Store) PauseFlusher() {
	if s.buf != nil {
		s.buf.stop()
		<-s.buf.done
	}
}

// JournalMismatches counts journaled cancels the writer recorded with
// another state_version than their ack gave.
func (s *Store) JournalMismatches() int64 { return s.journal.mismatches.Load() }

// HoldWriterStalled holds the writer as a transaction stalled in its
// commit would (for the cancel journal), until release.
func (s *Store) HoldWriterStalled() (release func()) { return s.HoldWriterCommitting() }

// HoldWriterCommitting holds the writer as a transaction that touched the
// given threads or runs and has been committing for long (stalled in its
// sync).
func (s *Store) HoldWriterCommitting(ids ...string) (release func()) {
	s.gate.lock()
	j := s.journal
	j.mu.Lock()
	j.since = time.Now().Add(-time.Second)
	j.committing = map[string]bool{}
	for _, id := range ids {
		j.committing[id] = true
	}
	j.mu.Unlock()
	return func() {
		j.mu.Lock()
		j.committing = nil
		j.mu.Unlock()
		s.gate.unlock()
	}
}
