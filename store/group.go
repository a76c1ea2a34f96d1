package store

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Group commit for the stream buffer, and a fast lane for cancels.
//
// Every streaming run writes its deltas in small batches (AppendDeltas).
// With many runs at once, a transaction per batch would make the single
// writer the bottleneck: each commit costs far more than the rows in it.
// So concurrent AppendDeltas calls share transactions: one caller at a time
// leads, taking the writer and draining the queue into one transaction per
// batch. Events still reach OnCommit in commit order, so each thread's seq
// order is kept. On SQLite run starts are grouped too, so that a burst of
// starts does not make every claim and first delta wait behind a commit
// each (StartRun). Other writes keep a transaction of their own (write):
// claims among them, which waited longer for a first delta as one of a
// queue of grouped writes than with the writer handed to them between two
// batches (BENCHMARKS.md, issue 31's run starts).
//
// One run's refusal (cancelled, lease lost) must not undo another's rows.
// A grouped write checks everything before it writes anything, so a
// refusal leaves nothing to roll back; only a failure after writing (an SQL
// error) rolls the whole transaction back, and the batch is then run again
// without that request.
//
// Cancels are urgent (writeUrgent): they are committed in transactions of
// their own, ahead of the queue, and a transaction in progress stops taking
// requests as soon as one waits, so a cancel waits for a request or two
// instead of a whole batch. (Routing every write through the queue made
// cancels faster still, but then a cancel at the front can overtake a
// worker's hand-over queued before it, which the engine does not yet
// expect — see BENCHMARKS.md as of 6e7e314; plain writes stay out until
// it does.)

// maxGroup bounds the requests in one transaction, so one commit never
// holds the writer for long.
const maxGroup = 64

// groupReq is one queued write; done gets its result exactly once, lead a
// signal when its caller is to drain the queue.
type groupReq struct {
	ctx    context.Context
	fn     func(t *txn) error
	urgent bool          // a cancel (writeUrgent)
	done   chan error    // buffered 1
	lead   chan struct{} // buffered 1
}

// writeQueue is the group-commit queue. Its lock is taken with or without
// the writer gate held, and nothing is called with it held.
type writeQueue struct {
	mu      sync.Mutex
	urgent  []*groupReq // cancels, first in the next batch
	pending []*groupReq
	waiting atomic.Int32 // len(urgent), readable without mu
	late    atomic.Int64 // callers that stopped waiting after their request was taken (for tests)
	leading bool         // some caller drains the queue
}

// writeGrouped runs fn like write, but possibly in one transaction with
// other grouped writes. fn must check before it writes (see above) and
// touch only its own run's thread.
func (s *Store) writeGrouped(ctx context.Context, fn func(t *txn) error) error {
	return s.acrossHolders(ctx, func(ctx context.Context) error { return s.enqueue(ctx, fn, false) })
}

// writeUrgent is writeGrouped ahead of every queued request (cancels).
func (s *Store) writeUrgent(ctx context.Context, fn func(t *txn) error) error {
	return s.acrossHolders(ctx, func(ctx context.Context) error { return s.enqueue(ctx, fn, true) })
}

// enqueue queues one request and waits for its result. At most one caller
// at a time leads: it takes the writer and commits batches until its own
// request is answered, then hands the lead to the next request still
// queued. The others only wait for their answer, so a busy writer is never
// kept waiting by callers that merely collect a result.
func (s *Store) enqueue(ctx context.Context, fn func(t *txn) error, urgent bool) error {
	req := &groupReq{ctx: ctx, fn: fn, urgent: urgent, done: make(chan error, 1), lead: make(chan struct{}, 1)}
	q := &s.queue
	q.mu.Lock()
	if urgent {
		q.urgent = append(q.urgent, req)
		q.waiting.Add(1)
	} else {
		q.pending = append(q.pending, req)
	}
	lead := !q.leading
	q.leading = true
	q.mu.Unlock()
	if !lead {
		select {
		case err := <-req.done:
			return err
		case <-req.lead:
		case <-ctx.Done():
			// A caller that stops waiting (its run was cancelled) takes
			// its request back if it is still queued: it never runs, and
			// the caller need not wait for the writer to reach it.
			if q.withdraw(req) {
				return ctx.Err()
			}
			// Already in a batch: wait for its outcome. The batch may yet
			// be cut short by a cancel and the request put back, and then
			// handed the lead, which it must take up (it will skip itself,
			// its context being done).
			q.late.Add(1)
			select {
			case err := <-req.done:
				return err
			case <-req.lead:
			}
		}
	}
	for drained := false; len(req.done) == 0 && !drained; {
		// The batch is taken once the writer is ours: whatever queued
		// while we waited for it joins.
		s.gate.lockGroup()
		for {
			batch := q.take(s.pg)
			if len(batch) == 0 {
				drained = true
				break
			}
			start := time.Now()
			ran := s.commitGroupLocked(batch)
			s.observe(txWrite, start)
			s.metrics.GroupCommitted(ran)
			// Cancels that queued meanwhile go next, before the writer
			// is handed on: otherwise each cancel of a burst waits for
			// a plain write (a run start, a claim) handed the writer in
			// between. On PostgreSQL, where each cancel is a batch of its
			// own, that made a burst of cancels wait 160-450 ms in the
			// cluster benchmark.
			if q.waiting.Load() == 0 {
				break
			}
		}
		s.gate.unlock()
	}
	q.mu.Lock()
	q.passLeadLocked()
	q.mu.Unlock()
	return <-req.done
}

// withdraw removes req from the queue if it is still there, passing on
// the lead if req was just handed it, and reports whether it did.
func (q *writeQueue) withdraw(req *groupReq) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	found := false
	for _, list := range []*[]*groupReq{&q.urgent, &q.pending} {
		if i := slices.Index(*list, req); i >= 0 {
			*list = slices.Delete(*list, i, i+1)
			if list == &q.urgent {
				q.waiting.Add(-1)
			}
			found = true
			break
		}
	}
	if !found {
		return false
	}
	if len(req.lead) == 1 { // it was to lead: the next request does
		q.passLeadLocked()
	}
	return true
}

// passLeadLocked hands the lead to the oldest queued request, urgent ones
// first, or ends it when nothing waits. Called with mu held.
func (q *writeQueue) passLeadLocked() {
	switch {
	case len(q.urgent) > 0:
		q.urgent[0].lead <- struct{}{}
	case len(q.pending) > 0:
		q.pending[0].lead <- struct{}{}
	default:
		q.leading = false
	}
}

// take removes the next batch from the queue. Cancels waiting make a batch
// of their own, without the stream writes queued behind them: a cancel's
// answer waits for its own commit, never for a batch of deltas (measured:
// a cancel sharing its transaction with up to 63 stream writes waited up
// to 19 ms for it under the scale benchmark's load, alone 1.5-6 ms). With
// alone, one cancel is a batch (PostgreSQL: a cancel is often of another
// instance's run, and a transaction holding that run's thread together
// with this instance's own threads could wait in a cycle with the other
// instance's, see txn.lockRunThread).
func (q *writeQueue) take(alone bool) []*groupReq {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.urgent) > 0 {
		n := min(len(q.urgent), maxGroup)
		if alone {
			n = 1
		}
		batch := slices.Clone(q.urgent[:n])
		q.urgent = q.urgent[n:]
		q.waiting.Add(-int32(n))
		return batch
	}
	n := min(maxGroup, len(q.pending))
	batch := slices.Clone(q.pending[:n])
	q.pending = q.pending[n:]
	return batch
}

// putBack returns requests not run to the front of their lanes: cancels
// stay urgent.
func (q *writeQueue) putBack(rest []*groupReq) {
	var urgent, pending []*groupReq
	for _, r := range rest {
		if r.urgent {
			urgent = append(urgent, r)
		} else {
			pending = append(pending, r)
		}
	}
	q.mu.Lock()
	q.urgent = append(urgent, q.urgent...)
	q.waiting.Add(int32(len(urgent)))
	q.pending = append(pending, q.pending...)
	q.mu.Unlock()
}

// commitGroupLocked runs batch in one transaction and answers every
// request it ran; when an urgent request arrives meanwhile it stops early
// and puts the rest back. It reports how many requests it answered.
// Called with the writer gate held.
//
// A transaction that another instance made fail (a deadlock on PostgreSQL,
// see retry.go) is run again, every request from scratch, a few times
// before the requests are answered with the failure. The short wait in
// between holds the writer gate: this instance's writers wait with it.
func (s *Store) commitGroupLocked(batch []*groupReq) int {
	for attempt := 1; ; attempt++ {
		n, again := s.tryGroupLocked(batch, attempt < txAttempts)
		if again == nil {
			return n
		}
		batch = again
		s.retries.Add(1)
		_ = backoff(context.Background(), attempt)
	}
}

// tryGroupLocked is one attempt of commitGroupLocked. With mayRetry, a
// retryable failure answers nothing and returns the requests to run again.
func (s *Store) tryGroupLocked(batch []*groupReq, mayRetry bool) (int, []*groupReq) {
	results := make([]error, len(batch))
	answered := len(batch)
	var t *txn
	var turn *journalTurn
	answer := func(err error) (int, []*groupReq) {
		if t != nil {
			t.endStreams(false) // after a rollback or a failed commit
		}
		turn.end(false)
		if mayRetry && retryable(err) {
			return 0, batch[:answered]
		}
		for i, r := range batch[:answered] {
			if results[i] == nil {
				results[i] = err
			}
			r.done <- results[i]
		}
		return answered, nil
	}
	// The transaction outlives any one caller: a caller whose context
	// ends is skipped, it does not abort the others' work.
	ctx := context.Background()
	tx, err := s.writer.BeginTxx(ctx, nil)
	if err != nil {
		return answer(fmt.Errorf("begin: %w", err))
	}
	t = s.newTxn(ctx, tx)
	// The journaled cancels first (canceljournal.go): if they cannot be
	// recorded, nothing of the batch runs.
	turn = s.journal.beginBody()
	if err := turn.apply(t); err != nil {
		_ = tx.Rollback()
		return answer(err)
	}
	t.undo = map[string]*threadCursor{} // per request, to undo a refusal
	ran := 0
	for i, r := range batch {
		if ran > 0 && s.queue.waiting.Load() > 0 {
			answered = i // a cancel waits: commit what ran, the rest goes back
			s.queue.putBack(batch[i:])
			break
		}
		if err := r.ctx.Err(); err != nil {
			results[i] = err
			continue
		}
		mark, buffered, cancels, live := len(t.events), t.buffered, len(t.cancelsAccepted), len(t.live)
		yields, unyields := len(t.yield), len(t.unyield)
		clear(t.undo)
		t.wrote = false
		t.pastOK = pastFrom(r.ctx)
		err := r.fn(t)
		if err == nil {
			ran++
			continue
		}
		results[i] = err
		if t.wrote || (s.pg && !refusal(err)) {
			// It failed after writing (or, on PostgreSQL, the database
			// failed it, which aborts the transaction): nothing of this
			// transaction can be trusted.
			_ = tx.Rollback()
			t.endStreams(false)
			turn.end(false)
			if mayRetry && retryable(err) {
				return 0, batch // another instance's doing: every request again
			}
			// Run the others again, without it.
			r.done <- err
			rest := append(slices.Clone(batch[:i]), batch[i+1:]...)
			if len(rest) == 0 {
				return 1, nil
			}
			return 1 + s.commitGroupLocked(rest), nil
		}
		t.events, t.buffered, t.cancelsAccepted, t.live = t.events[:mark], buffered, t.cancelsAccepted[:cancels],
			t.live[:live]
		t.yield, t.unyield = t.yield[:yields], t.unyield[:unyields]
		t.rollBackCursors()
	}
	if ran == 0 && len(turn.recorded()) == 0 {
		_ = tx.Rollback()
		return answer(nil)
	}
	if err := t.flushThreads(); err != nil {
		_ = tx.Rollback()
		return answer(err)
	}
	turn.commitStarts(t)
	if err := tx.Commit(); err != nil {
		return answer(fmt.Errorf("commit: %w", err))
	}
	s.committedLocked(t)
	t.endStreams(true)
	t = nil
	turn.end(true)
	return answer(nil)
}
