package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// Subscription is one thread's events on a Conn (subscribe), read with
// Next: each seq exactly once, in order, across reconnections (see Conn).
//
// The Conn's reader queues events for the Subscription without ever
// blocking on it; when its reader falls ConnOptions.Buffer events behind,
// the Subscription stops taking events and, once read empty, resumes
// after the last one it took (docs/protocol.md: subscribe with after_seq).
// Resuming, and resubscribing after a refusal for rate_limited, happen in
// Next: a Subscription nobody reads does not resume.
//
// Next must not be called concurrently with itself; every other method is
// safe for concurrent use.
type Subscription struct {
	conn   *Conn
	thread string
	limit  int
	notify chan struct{} // cap 1: something changed for Next
	ready  chan struct{} // closed at the first answer to subscribe, or the end

	mu        sync.Mutex
	queue     []Event
	head      int
	pos       int64     // last seq taken (queued); FromSnapshot until one is
	gen       uint64    // subscribe commands sent; the latest one's ack clears lagging
	lagging   bool      // events are dropped until the latest subscribe's ack
	syncing   bool      // the latest subscribe is in flight (or will be sent on reconnect)
	syncAt    time.Time // Next resubscribes no earlier (rate_limited)
	acked     bool      // ready is closed
	ack       SubscribeAck
	err       error // the end; Next returns it once the queue is read
	delivered int64 // last seq Next returned
	version   int64 // state_version of the last durable event or snapshot Next returned
	replayTo  int64 // last_seq of the latest subscribe's ack: events up to it are Replayed
}

type subscribeBody struct {
	ThreadID string `json:"thread_id"`
	AfterSeq *int64 `json:"after_seq,omitempty"`
}

// Subscribe starts delivering a thread's events after seq after (0: from
// the start; FromSnapshot: a thread.snapshot, then live events) and
// returns once the server acknowledged it (the answer is Ack). One
// Subscription per thread per Conn. The server's refusal (not_found,
// rate_limited, …) is an *Error.
func (c *Conn) Subscribe(ctx context.Context, threadID string, after int64) (*Subscription, error) {
	if after < FromSnapshot {
		return nil, fmt.Errorf("client: Subscribe after seq %d: want FromSnapshot or a seq >= 0", after)
	}
	s := &Subscription{conn: c, thread: threadID, limit: c.opts.Buffer, pos: after, delivered: after,
		notify: make(chan struct{}, 1), ready: make(chan struct{})}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	if c.subs[threadID] != nil {
		c.mu.Unlock()
		return nil, fmt.Errorf("client: this Conn already subscribes to %s", threadID)
	}
	c.subs[threadID] = s
	ws := c.ws
	var f []byte
	if ws != nil {
		f = c.subscribeFrameLocked(s)
	} else {
		s.syncing = true // the next connection subscribes it
	}
	c.mu.Unlock()
	if f != nil {
		c.write(ws, f) // an error: the reader sees the connection fail, the next one subscribes
	}
	select {
	case <-s.ready:
		s.mu.Lock()
		err := s.err
		s.mu.Unlock()
		if err != nil && !errors.Is(err, ErrThreadDeleted) {
			return nil, err
		}
		return s, nil
	case <-ctx.Done():
		uctx, cancel := context.WithTimeout(context.Background(), c.opts.WriteTimeout)
		s.Unsubscribe(uctx)
		cancel()
		return nil, ctx.Err()
	}
}

// subscribeFrameLocked encodes a subscribe of s from its position and
// registers its answer (c.mu held; c.ws set).
func (c *Conn) subscribeFrameLocked(s *Subscription) []byte {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil
	}
	s.gen++
	gen := s.gen
	body := subscribeBody{ThreadID: s.thread}
	if s.pos >= 0 {
		after := s.pos
		body.AfterSeq = &after
	}
	s.syncing = true
	s.mu.Unlock()
	id := c.newID()
	c.pending[id] = &pending{typ: "subscribe", fn: func(a answer) { c.subscribed(s, gen, a) }}
	f, _ := frame("subscribe", id, body)
	return f
}

// subscribed applies the answer to a subscribe (on the reader goroutine).
func (c *Conn) subscribed(s *Subscription, gen uint64, a answer) {
	s.mu.Lock()
	var e *Error
	switch {
	case a.err != nil && s.acked && errors.As(a.err, &e) && e.Code == chat.CodeRateLimited:
		// A resubscribe refused for now: Next tries again when allowed,
		// dropping events until then.
		if gen == s.gen {
			s.lagging, s.syncing = true, false
			s.syncAt = time.Now().Add(max(e.RetryAfter, time.Second))
		}
		s.mu.Unlock()
		s.signal()
		return
	case a.err != nil:
		s.mu.Unlock()
		c.drop(s)
		s.end(a.err)
		return
	}
	var ack SubscribeAck
	if err := json.Unmarshal(a.raw, &ack); err != nil {
		c.stats.note(&c.stats.malformed, "unreadable subscribe ack: %.200s", a.raw)
	}
	if gen == s.gen {
		s.lagging, s.syncing = false, false
		s.replayTo = ack.LastSeq
	}
	if !s.acked {
		s.ack, s.acked = ack, true
		if ack.Recovered && ack.LastSeq == s.pos && s.version == 0 {
			// Nothing to replay: the thread's version is the one applied.
			s.version = ack.StateVersion
		}
		close(s.ready)
	}
	s.mu.Unlock()
	s.signal()
}

// drop removes s from the Conn's subscriptions.
func (c *Conn) drop(s *Subscription) {
	c.mu.Lock()
	if c.subs[s.thread] == s {
		delete(c.subs, s.thread)
	}
	c.mu.Unlock()
}

// resubscribe subscribes s again from its position: at once when
// connected, else on the next connection.
func (c *Conn) resubscribe(s *Subscription) {
	c.mu.Lock()
	if c.err != nil || c.subs[s.thread] != s {
		c.mu.Unlock()
		return
	}
	ws := c.ws
	var f []byte
	if ws != nil {
		f = c.subscribeFrameLocked(s)
	} else {
		s.mu.Lock()
		s.syncing = true
		s.mu.Unlock()
	}
	c.mu.Unlock()
	if f != nil {
		c.write(ws, f)
	}
}

// leave sends unsubscribe for thread on the current connection, if there
// is one (a new connection does not subscribe it anyway). Events of the
// thread still in flight are not counted as stray until its answer. The
// answer goes to done, if not nil; a lost connection answers nil.
func (c *Conn) leave(thread string, done chan answer) {
	c.mu.Lock()
	ws := c.ws
	if ws == nil || c.err != nil {
		c.mu.Unlock()
		if done != nil {
			done <- answer{}
		}
		return
	}
	id := c.newID()
	c.leaving[thread]++
	epoch := c.epoch
	c.pending[id] = &pending{typ: "unsubscribe", ch: done, fn: func(answer) {
		c.mu.Lock()
		if c.epoch == epoch && c.leaving[thread] > 0 {
			c.leaving[thread]--
		}
		c.mu.Unlock()
	}}
	c.mu.Unlock()
	f, _ := frame("unsubscribe", id, map[string]string{"thread_id": thread})
	c.write(ws, f)
}

// offer queues ev (on the reader goroutine) under the seq rules; it
// reports whether ev is the thread's last event (thread.deleted).
// leaving: an unsubscribe of the thread is in flight on the connection,
// so events of the subscription it ends may still come.
func (s *Subscription) offer(ev Event, leaving bool) (last bool) {
	s.mu.Lock()
	defer s.signal()
	defer s.mu.Unlock()
	if s.err != nil || s.lagging {
		return false
	}
	st := &s.conn.stats
	if s.syncing && !leaving {
		// Not lagging nor leaving, so no subscription of the thread was
		// left on the server: this event came before the answer to the
		// subscribe.
		st.note(&st.early, "event %s of %s before the answer to its subscribe", ev, s.thread)
	}
	switch {
	case ev.Type == chat.EventThreadSnapshot:
		if s.pos >= 0 {
			ev.Gap = &Gap{After: s.pos, Through: ev.Seq}
		}
	case s.pos < 0:
		// Before its snapshot (the server sends it first): taken as the
		// position anyway.
	case ev.Seq <= s.pos:
		st.note(&st.duplicates, "event %s of %s after seq %d", ev, s.thread, s.pos)
		return false
	case ev.Seq != s.pos+1:
		st.note(&st.jumps, "event %s of %s after seq %d: resuming from %d", ev, s.thread, s.pos, s.pos)
		s.lagging = true
		return false
	}
	if len(s.queue)-s.head >= s.limit {
		st.note(
			&st.lagged,
			"subscription of %s: %d events unread; resuming from %d once read",
			s.thread, s.limit, s.pos,
		)
		s.lagging = true
		return false
	}
	if ev.Gap != nil {
		st.resyncs.Add(1)
	}
	s.pos = ev.Seq
	ev.Replayed = ev.Seq <= s.replayTo
	s.queue = append(s.queue, ev)
	if ev.Type == chat.EventThreadDeleted {
		s.err = ErrThreadDeleted
		return true
	}
	return false
}

// end ends the Subscription with err (Next returns it once the queue is
// read); the first end wins.
func (s *Subscription) end(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	if !s.acked {
		s.acked = true
		close(s.ready)
	}
	s.mu.Unlock()
	s.signal()
}

func (s *Subscription) signal() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// Next returns the next event of the thread. It blocks until one comes,
// ctx ends (nothing is lost: the next call goes on), or the Subscription
// ends: ErrThreadDeleted after thread.deleted was returned, ErrClosed
// after Unsubscribe or Conn.Close, the reason the Conn gave up, or the
// server's refusal of a resubscribe (not_found: the thread was deleted
// while the connection was down).
func (s *Subscription) Next(ctx context.Context) (Event, error) {
	for {
		s.mu.Lock()
		if s.head < len(s.queue) {
			ev := s.queue[s.head]
			s.queue[s.head] = Event{}
			s.head++
			if s.head == len(s.queue) {
				s.queue, s.head = s.queue[:0], 0
			}
			s.delivered = ev.Seq
			if ev.Type != chat.EventMessageDelta && ev.StateVersion > 0 {
				s.version = ev.StateVersion
			}
			s.mu.Unlock()
			return ev, nil
		}
		if s.err != nil {
			err := s.err
			s.mu.Unlock()
			return Event{}, err
		}
		var timer *time.Timer
		var wait <-chan time.Time
		if s.lagging && !s.syncing {
			d := time.Until(s.syncAt)
			if d <= 0 {
				s.mu.Unlock()
				s.conn.resubscribe(s)
				continue
			}
			timer = time.NewTimer(d)
			wait = timer.C
		}
		s.mu.Unlock()
		select {
		case <-s.notify:
		case <-wait:
		case <-ctx.Done():
		}
		if timer != nil {
			timer.Stop()
		}
		if err := ctx.Err(); err != nil {
			return Event{}, err
		}
	}
}

// ThreadID is the thread subscribed to.
func (s *Subscription) ThreadID() string { return s.thread }

// Ack is the server's answer to the subscribe that started the
// Subscription.
func (s *Subscription) Ack() SubscribeAck {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ack
}

// LastSeq is the seq of the last event Next returned (the position given
// to Subscribe before the first).
func (s *Subscription) LastSeq() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.delivered
}

// StateVersion is the state_version of the last durable event or snapshot
// Next returned (or the subscribe's, when it had nothing to replay); 0
// before either. It is what a command based on the events read sends as
// expected_state_version.
func (s *Subscription) StateVersion() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version
}

// Unsubscribe stops the thread's events (unsubscribe) and ends the
// Subscription: Next returns ErrClosed once the queue is read. It waits
// for the server's answer, bounded by ctx.
func (s *Subscription) Unsubscribe(ctx context.Context) error {
	c := s.conn
	c.mu.Lock()
	mine := c.subs[s.thread] == s
	if mine {
		delete(c.subs, s.thread)
	}
	c.mu.Unlock()
	s.end(ErrClosed)
	if !mine {
		return nil
	}
	done := make(chan answer, 1)
	c.leave(s.thread, done)
	select {
	case a := <-done:
		if a.err != nil && !errors.Is(a.err, ErrConnectionLost) && !errors.Is(a.err, ErrClosed) {
			return a.err
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
