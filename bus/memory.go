// Package bus fans a thread's committed events out to the subscribers in
// this process. Memory is the single-instance bus; NATS is the bus for
// several instances sharing one database. The store stays the source of
// truth: a subscriber that falls behind is dropped and resyncs from the
// event log.
package bus

import (
	"errors"
	"sync"

	"github.com/honestcancel/gateway/chat"
)

// ErrLagged ends a subscription whose reader fell more than its buffer
// behind. The reader resumes from its last seq through the store.
var ErrLagged = errors.New("subscriber fell behind and was dropped: resync from the last seq")

// Sink is what the bus delivers to (see chat.EventSink for the rules).
type Sink = chat.EventSink

// Memory is an in-process event bus. Publish never blocks; it is safe for
// concurrent use.
type Memory struct {
	mu    sync.RWMutex
	sinks map[string]map[Sink]struct{}
}

// NewMemory returns an empty bus.
func NewMemory() *Memory {
	return &Memory{sinks: map[string]map[Sink]struct{}{}}
}

// Add subscribes sink to the thread's events committed from now on.
func (b *Memory) Add(threadID string, sink Sink) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sinks[threadID] == nil {
		b.sinks[threadID] = map[Sink]struct{}{}
	}
	b.sinks[threadID][sink] = struct{}{}
}

// Remove unsubscribes sink from the thread. Safe to call when it is not
// subscribed.
func (b *Memory) Remove(threadID string, sink Sink) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.remove(threadID, sink)
}

func (b *Memory) remove(threadID string, sink Sink) {
	delete(b.sinks[threadID], sink)
	if len(b.sinks[threadID]) == 0 {
		delete(b.sinks, threadID)
	}
}

// Publish hands events to every sink of their thread without blocking. The
// caller publishes each thread's events in seq order (the store does, under
// its write lock).
func (b *Memory) Publish(events []*chat.Event) {
	type key struct {
		thread string
		sink   Sink
	}
	var refused map[key]bool
	b.mu.RLock()
	for _, ev := range events {
		for s := range b.sinks[ev.ThreadID] {
			k := key{ev.ThreadID, s}
			if refused[k] {
				continue // never deliver past a refused event: no gap
			}
			if !s.Deliver(ev) {
				if refused == nil {
					refused = map[key]bool{}
				}
				refused[k] = true
			}
		}
	}
	b.mu.RUnlock()
	if refused != nil {
		b.mu.Lock()
		for k := range refused {
			b.remove(k.thread, k.sink)
		}
		b.mu.Unlock()
	}
}

// Subscription is a channel Sink for one thread: it receives the thread's
// events in seq order until its owner closes it or it falls more than its
// buffer behind (Err then says ErrLagged). The events are shared with other
// subscribers and must not be modified.
type Subscription struct {
	c        chan *chat.Event
	bus      interface{ Remove(string, Sink) }
	threadID string
	mu       sync.Mutex
	done     bool
	err      error
}

// Subscribe starts a channel subscription to the thread's events committed
// from now on; buffer bounds how far its reader may fall behind.
func (b *Memory) Subscribe(threadID string, buffer int) *Subscription {
	s := &Subscription{c: make(chan *chat.Event, buffer), bus: b, threadID: threadID}
	b.Add(threadID, s)
	return s
}

// Deliver implements Sink.
func (s *Subscription) Deliver(ev *chat.Event) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return false
	}
	select {
	case s.c <- ev:
		return true
	default:
		s.finish(ErrLagged)
		return false
	}
}

// Lost implements LossAware: the subscription ends with ErrLagged, and its
// reader starts over from the store.
func (s *Subscription) Lost(string, int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.finish(ErrLagged)
	return false
}

// Events delivers the thread's events; it is closed when the subscription
// ends.
func (s *Subscription) Events() <-chan *chat.Event { return s.c }

// Close ends the subscription; Events is closed. Safe to call more than once.
func (s *Subscription) Close() {
	s.bus.Remove(s.threadID, s)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.finish(nil)
}

// Err reports why the bus ended the subscription (nil if its owner did).
// Valid once Events is closed.
func (s *Subscription) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *Subscription) finish(err error) {
	if s.done {
		return
	}
	s.done = true
	s.err = err
	close(s.c)
}
