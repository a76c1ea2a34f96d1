package store

import (
	"sync"
	"sync/atomic"
)

// writerGate is the store's single writer, taken for every write
// transaction. Unlike a plain mutex it lets cancels pass: while a cancel
// waits in the group-commit queue (urgent > 0), plain writes (claims,
// publishes, completions …) do not take the writer, so the group leader
// that will commit the cancel gets it next. A cancel then waits for at most
// the one transaction in progress, however many writes queue behind it.
// Without a waiting cancel, plain writes and group commits take turns as
// the Go scheduler wakes them. urgent only drops inside a group commit,
// with the gate held, so the broadcast of its unlock wakes the plain
// writes it held back.
type writerGate struct {
	mu     sync.Mutex
	free   sync.Cond // broadcast when held goes false
	held   bool
	urgent *atomic.Int32 // cancels waiting in the queue (writeQueue.waiting)
	plain  int           // plain writes waiting (for tests)
}

func newWriterGate(urgent *atomic.Int32) *writerGate {
	g := &writerGate{urgent: urgent}
	g.free.L = &g.mu
	return g
}

// lock takes the writer for a plain write: after every waiting cancel.
func (g *writerGate) lock() {
	g.mu.Lock()
	g.plain++
	for g.held || g.urgent.Load() > 0 {
		g.free.Wait()
	}
	g.plain--
	g.held = true
	g.mu.Unlock()
}

// lockGroup takes the writer for a group commit, which carries the
// cancels: it only waits for the transaction in progress.
func (g *writerGate) lockGroup() {
	g.mu.Lock()
	for g.held {
		g.free.Wait()
	}
	g.held = true
	g.mu.Unlock()
}

func (g *writerGate) unlock() {
	g.mu.Lock()
	g.held = false
	g.mu.Unlock()
	g.free.Broadcast()
}
