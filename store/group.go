package store

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Group commit for the stream buffer.
//
// Every streaming run writes its deltas in small batches (AppendDeltas).
// With many runs at once, a transaction per batch would make the single
// writer the bottleneck: each commit costs far more than the rows in it.
// So concurrent AppendDeltas calls share transactions: a caller queues its
// work, then takes the writer; whoever holds the writer first drains the
// whole queue into one transaction. Each request runs in its own savepoint,
// so one run's refusal (cancelled, lease lost) rolls back only that run's
// rows, never another's. Events still reach OnCommit in commit order, so
// each thread's seq order is kept.

// maxGroup bounds the requests in one transaction, so one commit never
// holds the writer for long: a cancel waits for at most the transaction in
// progress (32 requests take about 2-3 ms here), while commits are still
// shared widely enough to cost little each.
const maxGroup = 32

// groupReq is one queued write; done gets its result exactly once.
type groupReq struct {
	ctx  context.Context
	fn   func(t *txn) error
	done chan error // buffered 1
}

// writeQueue is the group-commit queue. Its lock is taken with or without
// writeMu held, and nothing is called with it held.
type writeQueue struct {
	mu      sync.Mutex
	pending []*groupReq
}

// writeGrouped runs fn like write, but possibly in one transaction with
// other writeGrouped calls (each in its own savepoint). fn must touch only
// its own run's thread.
func (s *Store) writeGrouped(ctx context.Context, fn func(t *txn) error) error {
	req := &groupReq{ctx: ctx, fn: fn, done: make(chan error, 1)}
	s.queue.mu.Lock()
	s.queue.pending = append(s.queue.pending, req)
	s.queue.mu.Unlock()

	s.writeMu.Lock()
	for {
		s.queue.mu.Lock()
		batch := s.queue.pending
		if len(batch) > maxGroup {
			batch = batch[:maxGroup:maxGroup]
			s.queue.pending = s.queue.pending[maxGroup:]
		} else {
			s.queue.pending = nil
		}
		s.queue.mu.Unlock()
		if len(batch) == 0 {
			break
		}
		start := time.Now()
		s.commitGroupLocked(batch)
		s.observe(txGrouped, start)
		s.metrics.GroupCommitted(len(batch))
		if len(req.done) > 0 {
			break // ours is done; later callers drain the rest
		}
	}
	s.writeMu.Unlock()
	return <-req.done
}

// commitGroupLocked writes batch in one transaction, one savepoint per
// request, and answers every request. Called with writeMu held.
func (s *Store) commitGroupLocked(batch []*groupReq) {
	results := make([]error, len(batch))
	answer := func(err error) {
		for i, r := range batch {
			if results[i] == nil {
				results[i] = err
			}
			r.done <- results[i]
		}
	}
	// The transaction outlives any one caller: a caller whose context
	// ends is skipped, it does not abort the others' work.
	ctx := context.Background()
	tx, err := s.writer.BeginTxx(ctx, nil)
	if err != nil {
		answer(fmt.Errorf("begin: %w", err))
		return
	}
	t := &txn{ctx: ctx, tx: tx, now: time.Now(), threads: map[string]*threadCursor{}}
	ran := 0
	for i, r := range batch {
		if err := r.ctx.Err(); err != nil {
			results[i] = err
			continue
		}
		if _, err := tx.ExecContext(ctx, `SAVEPOINT grouped`); err != nil {
			results[i] = fmt.Errorf("savepoint: %w", err)
			continue
		}
		mark, buffered, cancels := len(t.events), t.buffered, len(t.cancelsAccepted)
		saved := make(map[string]threadCursor, len(t.threads))
		for id, c := range t.threads {
			saved[id] = *c
		}
		if err := r.fn(t); err != nil {
			results[i] = err
			t.events, t.buffered, t.cancelsAccepted = t.events[:mark], buffered, t.cancelsAccepted[:cancels]
			for id, c := range t.threads {
				if old, ok := saved[id]; ok {
					*c = old
				} else {
					delete(t.threads, id)
				}
			}
			if _, rerr := tx.ExecContext(ctx, `ROLLBACK TO grouped`); rerr != nil {
				_ = tx.Rollback()
				for j := range batch {
					if results[j] == nil {
						results[j] = fmt.Errorf("roll back one request: %w", rerr)
					}
				}
				answer(nil)
				return
			}
		} else {
			ran++
		}
		if _, err := tx.ExecContext(ctx, `RELEASE grouped`); err != nil {
			_ = tx.Rollback()
			answer(fmt.Errorf("release savepoint: %w", err))
			return
		}
	}
	if ran == 0 {
		_ = tx.Rollback()
		answer(nil)
		return
	}
	if err := t.flushThreads(); err != nil {
		_ = tx.Rollback()
		answer(err)
		return
	}
	if err := tx.Commit(); err != nil {
		answer(fmt.Errorf("commit: %w", err))
		return
	}
	s.committedLocked(t)
	answer(nil)
}
