package engine

import (
	"context"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// Admission (docs/protocol.md): the worker slots, the claims that fill
// them, and what a waiting run is told about its place.

// QueuePosition is docs/protocol.md's queue_position of a run: 0 when it does
// not wait for capacity (it is not queued, or a worker here is free for it
// and it will be claimed in a moment), else its place among the runs that
// wait for a slot (1 = the next to start). A run of a user who holds their
// share of executing runs waits whatever slots are free (store.Options
// MaxRunsPerUser). With several instances each counts only its own free
// slots, so a run another instance is about to claim may be said to wait
// for a moment.
func (e *Engine) QueuePosition(ctx context.Context, runID string) (int, error) {
	// Free slots first, then the queue: a slot reserved for a claim counts
	// as free until the claim committed, so a slot counted free here and
	// taken in the meantime shows as the run claimed (position 0) in the
	// read below; counted the other way round, a run claimed between the
	// two reads would be said to wait for the slot it holds.
	free := e.freeSlots()
	pos, atShare, err := e.store.QueueState(ctx, runID)
	if err != nil || pos == 0 || atShare {
		return pos, err
	}
	if pos <= free {
		return 0, nil
	}
	return pos - free, nil
}

// ModelName is the name of the model the engine asks (Config.ModelName):
// what its replies say they were asked of.
func (e *Engine) ModelName() string { return e.cfg.ModelName }

// Admission is the engine's admission state for /readyz: its capacity,
// the runs its workers execute now, and the queued runs not yet claimed
// as dispatch last counted them (they wait for a slot, or for a moment
// for the next claim).
func (e *Engine) Admission() chat.Admission {
	return chat.Admission{
		Capacity: cap(e.slots), Executing: cap(e.slots) - e.freeSlots(), Waiting: int(e.waiting.Load()),
	}
}

// defaultClaimBatch bounds the runs one claim transaction takes: a burst
// of runs started at once is claimed in a few writes, not one each.
const defaultClaimBatch = 16

// dispatch claims queued runs while a worker slot is free: it reserves the
// free slots (up to Config.ClaimBatch), claims as many runs, launches each
// and gives back the slots left over.
func (e *Engine) dispatch() {
	poll := time.NewTicker(e.cfg.ClaimPoll)
	defer poll.Stop()
	for {
		if e.ctx.Err() != nil {
			return
		}
		if free := e.reserve(e.cfg.ClaimBatch); free > 0 {
			claims, err := e.store.ClaimBatch(e.ctx, e.cfg.InstanceID, e.cfg.LeaseTTL, free)
			if err != nil && e.ctx.Err() == nil {
				e.log.Error("claim run", "err", err)
			}
			claimed := time.Now()
			for _, claim := range claims {
				e.launch(claim, claimed)
			}
			e.unreserve(free - len(claims))
			if len(claims) == free {
				continue // there may be more to claim
			}
		}
		e.countWaiting()
		select {
		case <-e.wake:
		case <-e.store.QueueStarts():
		case <-poll.C:
		case <-e.ctx.Done():
			return
		}
	}
}

// reserve takes up to n free slots for a claim about to be made, without
// waiting, and says how many it took. Each is then either handed to an
// execution (launch) or given back (unreserve).
func (e *Engine) reserve(n int) int {
	took := 0
	for took < n {
		// Counted before the token goes in, so that freeSlots never
		// counts a reserved slot as taken (QueuePosition's rule); for a
		// moment it may count one too many free, as unreserve does.
		e.reserving.Add(1)
		select {
		case e.slots <- struct{}{}:
			took++
		default:
			e.reserving.Add(-1)
			return took
		}
	}
	return took
}

// unreserve gives back n reserved slots a claim did not use (the token
// first: see reserve).
func (e *Engine) unreserve(n int) {
	for range n {
		<-e.slots
		e.reserving.Add(-1)
	}
}

// freeSlots is the slots no execution holds: free, or reserved for a claim
// that has not committed (it may leave them free).
func (e *Engine) freeSlots() int {
	return cap(e.slots) - len(e.slots) + int(e.reserving.Load())
}

// launch executes a claimed run in the slot reserved for it. Under e.mu,
// as CancelRun's goroutines: after Close began none starts, and the run
// stays claimed by this instance until its lease expires and recovery
// takes it over, as after a crash between a claim and its execution.
func (e *Engine) launch(claim *chat.Claim, claimed time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reserving.Add(-1)
	if e.ctx.Err() != nil {
		<-e.slots
		return
	}
	e.wg.Go(func() {
		defer func() { <-e.slots; e.poke() }()
		e.execute(claim, claimed)
	})
}

// countWaiting counts the queued runs no instance has claimed, for the
// metrics and /readyz, after a claim pass.
func (e *Engine) countWaiting() {
	read, stop := context.WithTimeout(e.ctx, storeTimeout)
	n, err := e.store.QueuedRuns(read)
	stop()
	if err != nil {
		if e.ctx.Err() == nil {
			e.log.Warn("count the runs waiting for a slot", "err", err)
		}
		return
	}
	e.waiting.Store(int64(n))
	e.metrics.Admission(cap(e.slots), n)
}
