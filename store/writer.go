package store

import (
	"sync"
	"sync/atomic"
)

// writerGate is the store's single writer, taken for every write
// transaction, and handed over in a fixed order:
//
//   - while a cancel waits in the group-commit queue (urgent > 0), to the
//     first waiting group commit, which carries the cancel: a cancel waits
//     for the transaction in progress, not for every write queued before
//     it;
//   - otherwise to whoever has waited longest, so neither plain writes
//     (run starts, claims, publishes, completions) nor group commits of
//     the stream buffer starve the other.
//
// Unlock hands the gate to the next waiter directly (it never goes free in
// between), so a releasing goroutine that asks again at once queues behind
// the others instead of overtaking them.
type writerGate struct {
	mu      sync.Mutex
	held    bool
	waiters []*gateWaiter // in arrival order
	urgent  *atomic.Int32 // cancels waiting in the queue (writeQueue.waiting)
}

type gateWaiter struct {
	group bool          // a group commit (may carry cancels)
	ready chan struct{} // closed when the gate is handed to it
}

func newWriterGate(urgent *atomic.Int32) *writerGate {
	return &writerGate{urgent: urgent}
}

// lock takes the writer for a plain write.
func (g *writerGate) lock() { g.acquire(false) }

// lockGroup takes the writer for a group commit.
func (g *writerGate) lockGroup() { g.acquire(true) }

func (g *writerGate) acquire(group bool) {
	g.mu.Lock()
	if !g.held && len(g.waiters) == 0 {
		g.held = true
		g.mu.Unlock()
		return
	}
	w := &gateWaiter{group: group, ready: make(chan struct{})}
	g.waiters = append(g.waiters, w)
	g.mu.Unlock()
	<-w.ready
}

// unlock hands the writer to the next waiter, or frees it.
func (g *writerGate) unlock() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.waiters) == 0 {
		g.held = false
		return
	}
	next := 0
	if g.urgent.Load() > 0 {
		for i, w := range g.waiters {
			if w.group {
				next = i
				break
			}
		}
	}
	w := g.waiters[next]
	g.waiters = append(g.waiters[:next], g.waiters[next+1:]...)
	close(w.ready) // held stays true: it is w's now
}

// free reports whether nobody holds or waits for the writer.
func (g *writerGate) free() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.held && len(g.waiters) == 0
}

// waiting counts the group commits (group) or plain writes waiting (for
// tests).
func (g *writerGate) waiting(group bool) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, w := range g.waiters {
		if w.group == group {
			n++
		}
	}
	return n
}
