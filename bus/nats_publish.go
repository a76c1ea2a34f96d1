package bus

import (
	"encoding/json"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/honestcancel/gateway/chat"
)

// Publish delivers this instance's committed events to its local sinks and
// queues them for the other instances. The caller publishes each thread's
// events in seq order, right after their commit (the store does, under its
// write lock). It never blocks: NATS is written by the publisher goroutine,
// and past its queue bound events are not sent (the other instances then
// recover them from the log).
func (b *NATS) Publish(events []*chat.Event) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	for _, ev := range events {
		b.receiveLocked(ev)
	}
	b.mu.Unlock()
	msgs := make([]outMsg, 0, len(events))
	for _, ev := range events {
		if len(ev.Raw) == 0 {
			continue
		}
		msgs = append(msgs, outMsg{subject: b.threadSubject(ev.ThreadID), data: ev.Raw})
	}
	b.out.push(msgs...)
}

// PublishCancel sends a cancel wake-up for runID to the other instances
// (their OnCancel). Best effort and never blocking: the engine also finds
// cancels when it renews the run's lease.
func (b *NATS) PublishCancel(runID string) {
	b.out.push(outMsg{subject: b.cancelS, data: []byte(runID)})
}

// receive hands each message of ch to handle, one at a time, until the bus
// closes.
func (b *NATS) receive(ch <-chan *nats.Msg, handle func(*nats.Msg)) {
	for {
		select {
		case <-b.ctx.Done():
			return
		case m := <-ch:
			handle(m)
		}
	}
}

// receiveMsg decodes another instance's event and hands it to
// receiveLocked. Threads without local sinks are dropped by subject,
// before decoding.
func (b *NATS) receiveMsg(m *nats.Msg) {
	token := strings.TrimPrefix(m.Subject, b.evPfx)
	if token != otherThreads {
		b.mu.Lock()
		_, wanted := b.threads[token]
		b.mu.Unlock()
		if !wanted {
			return
		}
	}
	var h chat.EventHeader
	if err := json.Unmarshal(m.Data, &h); err != nil || h.ThreadID == "" || h.Seq <= 0 {
		b.log.Warn("dropped an undecodable event message", "subject", m.Subject, "bytes", len(m.Data), "err", err)
		return
	}
	ev := h.Event(nil)
	ev.Raw = m.Data
	b.mu.Lock()
	if !b.closed {
		b.receiveLocked(&ev)
	}
	b.mu.Unlock()
}

// receiveCancel calls OnCancel for a wake-up of another instance.
func (b *NATS) receiveCancel(m *nats.Msg) {
	if h := b.handlers.Load(); h != nil && h.OnCancel != nil && len(m.Data) > 0 {
		h.OnCancel(string(m.Data))
	}
}

// otherThreads is the subject token of a thread id that is not a valid
// NATS token; receivers then read the id from the payload.
const otherThreads = "_"

func (b *NATS) threadSubject(threadID string) string {
	if threadID == otherThreads || !validToken(threadID) {
		return b.evPfx + otherThreads
	}
	return b.evPfx + threadID
}

// publisher writes the queued messages to NATS, in queue order (so each
// thread's events go out in seq order). A failed publish is logged and
// dropped: the other instances recover from the log.
func (b *NATS) publisher() {
	for {
		select {
		case <-b.ctx.Done():
			b.send(b.out.take()) // what was committed before Close
			return
		case <-b.out.wake:
			b.send(b.out.take())
		}
	}
}

func (b *NATS) send(msgs []outMsg, dropped int) {
	if dropped > 0 {
		b.log.Warn(
			"nats publish queue full: messages not sent (the other instances recover them from the log)",
			"dropped", dropped,
		)
	}
	var failed int
	var last error
	for _, m := range msgs {
		if err := b.nc.Publish(m.subject, m.data); err != nil {
			failed++
			last = err
		}
	}
	if unsent := int64(dropped + failed); unsent > 0 {
		b.mu.Lock()
		b.stats.Unsent += unsent
		b.mu.Unlock()
	}
	if failed > 0 {
		b.log.Warn("nats publish failed (the other instances recover from the log)", "messages", failed, "err", last)
	}
}

type outMsg struct {
	subject string
	data    []byte
}

// outbox is the publisher's queue: push never blocks, and past maxOutbound
// messages are counted and dropped.
type outbox struct {
	mu      sync.Mutex
	q       []outMsg
	dropped int
	wake    chan struct{} // cap 1
}

func (o *outbox) push(msgs ...outMsg) {
	if len(msgs) == 0 {
		return
	}
	o.mu.Lock()
	for _, m := range msgs {
		if len(o.q) >= maxOutbound {
			o.dropped++
			continue
		}
		o.q = append(o.q, m)
	}
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

func (o *outbox) take() ([]outMsg, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	q, d := o.q, o.dropped
	o.q, o.dropped = nil, 0
	return q, d
}
