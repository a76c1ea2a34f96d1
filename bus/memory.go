// Package bus fans a thread's committed events out to the subscribers in
// this process. Memory is the single-instance bus; a NATS bus for several
// instances comes with scale-out. The store stays the source of truth: a
// subscriber that falls behind is dropped and resyncs from the event log.
package bus

import (
	"errors"
	"sync"

	"github.com/honestcancel/gateway/chat"
)

// ErrLagged ends a subscription whose reader fell more than its buffer
// behind. The reader resumes from its last seq through the store.
var ErrLagged = errors.New("subscriber fell behind and was dropped: resync from the last seq")

// Memory is an in-process event bus. Publish never blocks; it is safe for
// concurrent use.
type Memory struct {
	mu   sync.RWMutex
	subs map[string]map[*Subscription]struct{}
}

// NewMemory returns an empty bus.
func NewMemory() *Memory {
	return &Memory{subs: map[string]map[*Subscription]struct{}{}}
}

// Subscription receives one thread's events in seq order until it is closed
// by its owner (Close) or by the bus (Err then says why). The events are
// shared with other subscribers and must not be modified.
type Subscription struct {
	c        chan *chat.Event
	bus      *Memory
	threadID string
	once     sync.Once
	err      error
}

// Subscribe starts receiving the thread's events committed from now on.
// buffer bounds how far the reader may fall behind before it is dropped.
func (b *Memory) Subscribe(threadID string, buffer int) *Subscription {
	c := make(chan *chat.Event, buffer)
	s := &Subscription{c: c, bus: b, threadID: threadID}
	b.mu.Lock()
	if b.subs[threadID] == nil {
		b.subs[threadID] = map[*Subscription]struct{}{}
	}
	b.subs[threadID][s] = struct{}{}
	b.mu.Unlock()
	return s
}

// Publish hands events to every subscriber of their thread without
// blocking. The caller publishes each thread's events in seq order.
func (b *Memory) Publish(events []*chat.Event) {
	var lagged map[*Subscription]bool
	b.mu.RLock()
	for _, ev := range events {
		for s := range b.subs[ev.ThreadID] {
			if lagged[s] {
				continue // never deliver past a dropped event: no gap
			}
			select {
			case s.c <- ev:
			default:
				if lagged == nil {
					lagged = map[*Subscription]bool{}
				}
				lagged[s] = true
			}
		}
	}
	b.mu.RUnlock()
	for s := range lagged {
		s.end(ErrLagged)
	}
}

// Events delivers the thread's events; it is closed when the subscription
// ends.
func (s *Subscription) Events() <-chan *chat.Event { return s.c }

// Close ends the subscription; Events is closed. Safe to call more than once.
func (s *Subscription) Close() { s.end(nil) }

// Err reports why the bus ended the subscription (nil if its owner did).
// Valid once Events is closed.
func (s *Subscription) Err() error { return s.err }

func (s *Subscription) end(err error) {
	s.once.Do(func() {
		s.bus.mu.Lock()
		delete(s.bus.subs[s.threadID], s)
		if len(s.bus.subs[s.threadID]) == 0 {
			delete(s.bus.subs, s.threadID)
		}
		s.err = err
		close(s.c)
		s.bus.mu.Unlock()
	})
}
