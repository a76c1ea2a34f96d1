package bus

import (
	"context"
	"slices"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// LossAware is a Sink that can be told that the events of a thread up to
// seq through, after the ones the bus delivered, are lost: neither NATS nor
// the log can give them any more (purged, recorded as a gap, or too long to
// replay). A sink that misses some of them makes its client start over
// from a snapshot (a WebSocket closes as having missed events, a
// Subscription ends with ErrLagged) and answers false: the bus drops it
// from the thread. One that already has every event through seq through
// (a WebSocket that caught up from the log, or saw them on another
// instance) misses nothing and answers true: it stays. A sink that is not
// LossAware sees the gap in the seqs of the next event instead.
type LossAware interface {
	Lost(threadID string, through int64) (kept bool)
}

// threadState is the delivery state of one thread with local sinks,
// guarded by NATS.mu. A state removed from NATS.threads is dead: whoever
// still holds it (a recovery, a baseline read) must check
// b.threads[id] == t before using it.
type threadState struct {
	sinks map[Sink]struct{}
	// last is the last seq delivered (or the baseline: the thread's last
	// seq when its first sink came). Valid when based.
	last  int64
	based bool
	// baselining is set while the first Add reads the baseline; ready is
	// closed when that read ends.
	baselining bool
	ready      chan struct{}
	// pending holds events with seq > last+1 until the gap is filled.
	pending    map[int64]*chat.Event
	dropped    bool // an event arrived during the baseline read and was not held
	recovering bool // a recovery goroutine runs for this thread
	again      bool // run the recovery once more when it ends
	// recent are the last events delivered, consecutive seqs, oldest
	// first, with when each was (unix ns): what a subscriber joining
	// here may need that the log does not hold yet (Recent).
	recent   []*chat.Event
	recentAt []int64
	// moved, when a Reach caller waits for the thread to reach a seq, is
	// closed (and cleared) when last moves or the state is dropped.
	moved chan struct{}
}

// wake releases the Reach callers waiting on this state. Under b.mu.
func (t *threadState) wake() {
	if t.moved != nil {
		close(t.moved)
		t.moved = nil
	}
}

// Add subscribes sink to the thread's events committed from now on. The
// first local sink of a thread reads the thread's last seq from the log as
// the baseline (concurrent Adds for the thread wait for that read): every
// event after it is delivered, so a caller that reads the log after Add
// returns misses nothing. If that read fails, the first event to arrive
// becomes the baseline: a sink that missed events before it sees the gap.
func (b *NATS) Add(threadID string, sink Sink) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	t := b.threads[threadID]
	if t != nil {
		t.sinks[sink] = struct{}{}
		wait := t.ready
		b.mu.Unlock()
		<-wait // closed unless the first Add still reads the baseline
		return
	}
	t = &threadState{
		sinks:      map[Sink]struct{}{sink: {}},
		baselining: true,
		ready:      make(chan struct{}),
		pending:    map[int64]*chat.Event{},
	}
	b.threads[threadID] = t
	b.mu.Unlock()

	ctx, cancel := context.WithTimeout(b.ctx, b.cfg.LogTimeout)
	seqs, err := b.cfg.Log.LastSeqs(ctx, []string{threadID})
	cancel()

	b.mu.Lock()
	defer b.mu.Unlock()
	if !t.baselining { // Close ran
		return
	}
	t.baselining = false
	close(t.ready)
	if b.threads[threadID] != t {
		return // every sink went meanwhile
	}
	if err != nil {
		b.log.Warn(
			"read thread baseline failed: the first event will be the baseline",
			"thread_id", threadID,
			"err", err,
		)
		if len(t.pending) > 0 {
			t.based, t.last = true, minSeq(t.pending)-1
			t.wake()
			b.drainLocked(threadID, t)
		}
		return
	}
	t.based, t.last = true, seqs[threadID]
	t.wake()
	for seq := range t.pending {
		if seq <= t.last {
			delete(t.pending, seq)
		}
	}
	b.drainLocked(threadID, t)
	if b.threads[threadID] == t && (len(t.pending) > 0 || t.dropped) {
		t.dropped = false
		b.recoverLocked(threadID, t)
	}
}

// Remove unsubscribes sink from the thread. Safe to call when it is not
// subscribed. A thread without local sinks keeps no state.
func (b *NATS) Remove(threadID string, sink Sink) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.threads[threadID]
	if t == nil {
		return
	}
	delete(t.sinks, sink)
	if len(t.sinks) == 0 {
		delete(b.threads, threadID)
		t.wake()
	}
}

// Subscribe starts a channel subscription to the thread's events committed
// from now on; buffer bounds how far its reader may fall behind. Like Add,
// it may block for one log read.
func (b *NATS) Subscribe(threadID string, buffer int) *Subscription {
	s := &Subscription{c: make(chan *chat.Event, buffer), bus: b, threadID: threadID}
	b.Add(threadID, s)
	return s
}

// receiveLocked handles one event of this instance or another, in the
// order of arrival: it is delivered if it is the thread's next, dropped if
// already delivered, held otherwise while the gap before it is recovered.
func (b *NATS) receiveLocked(ev *chat.Event) {
	t := b.threads[ev.ThreadID]
	if t == nil {
		return
	}
	if !t.based {
		if !t.baselining {
			// The baseline read failed: this event is the baseline.
			t.based, t.last = true, ev.Seq-1
			t.wake()
		} else {
			if len(t.pending) < b.cfg.MaxPending {
				t.pending[ev.Seq] = ev
			} else {
				t.dropped = true // recovered from the log once the baseline is known
			}
			return
		}
	}
	switch {
	case ev.Seq <= t.last:
		return // already delivered (own commit and recovery, redelivery)
	case ev.Seq == t.last+1:
		b.deliverLocked(ev.ThreadID, t, ev)
		b.drainLocked(ev.ThreadID, t)
		return
	}
	t.pending[ev.Seq] = ev
	if len(t.pending) > b.cfg.MaxPending {
		// Too far behind to hold more: deliver what is held from its
		// first event on. The sinks see the gap and close their
		// connections; the clients resync from the log by after_seq.
		first := minSeq(t.pending)
		b.log.Warn(
			"too many events held behind a gap: delivering past it",
			"thread_id", ev.ThreadID,
			"missing_from", t.last+1,
			"missing_to", first-1,
		)
		b.skipLocked(ev.ThreadID, t, first-1)
		b.drainLocked(ev.ThreadID, t)
		if b.threads[ev.ThreadID] == t && len(t.pending) > 0 {
			b.recoverLocked(ev.ThreadID, t)
		}
		return
	}
	b.recoverLocked(ev.ThreadID, t)
}

// deliverLocked hands ev to every sink of the thread; a sink that refuses
// it is unsubscribed (and never sees a later event of the thread). The
// thread's state goes with its last sink.
func (b *NATS) deliverLocked(threadID string, t *threadState, ev *chat.Event) {
	t.last = ev.Seq
	t.wake()
	if n := len(t.recent); n >= 2*recentMax {
		t.recent = append(t.recent[:0], t.recent[n-recentMax:]...)
		t.recentAt = append(t.recentAt[:0], t.recentAt[n-recentMax:]...)
	}
	t.recent = append(t.recent, ev)
	t.recentAt = append(t.recentAt, time.Now().UnixNano())
	for s := range t.sinks {
		if !s.Deliver(ev) {
			delete(t.sinks, s)
		}
	}
	if len(t.sinks) == 0 && b.threads[threadID] == t {
		delete(b.threads, threadID)
	}
}

// drainLocked delivers the held events that follow the last delivered one.
func (b *NATS) drainLocked(threadID string, t *threadState) {
	for b.threads[threadID] == t {
		ev, ok := t.pending[t.last+1]
		if !ok {
			break
		}
		delete(t.pending, ev.Seq)
		b.deliverLocked(threadID, t, ev)
	}
	for seq := range t.pending { // anything at or below last is stale
		if seq <= t.last {
			delete(t.pending, seq)
		}
	}
}

// Recent returns the events this bus delivered for the thread after seq
// after, and true, when it still holds every one of them in order (the
// last recentMax, for up to about recentAge): what a subscriber joining
// here missed that the event log may not hold yet, because the instance
// that streams the thread writes its deltas after it fans them out. false
// when it does not (the caller reads the log, or sends a snapshot).
func (b *NATS) Recent(threadID string, after int64) ([]*chat.Event, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.threads[threadID]
	if t == nil || !t.based || after > t.last {
		return nil, false
	}
	if after == t.last {
		return nil, true
	}
	if len(t.recent) == 0 || t.recent[0].Seq > after+1 {
		return nil, false
	}
	i := int(after + 1 - t.recent[0].Seq)
	return slices.Clone(t.recent[i:]), true
}

// Reach waits until this bus has delivered the thread up to seq (or
// skipped past it as lost), and reports whether it has; false when ctx
// ends first or the thread has no sink here. A subscriber may have seen
// on another instance seqs this bus has not delivered yet: NATS is a hop
// behind, or this bus read the log for its baseline before the instance
// streaming the thread wrote them. Waiting for them makes Recent able to
// answer instead of a snapshot.
func (b *NATS) Reach(ctx context.Context, threadID string, seq int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		t := b.threads[threadID]
		if t == nil {
			return false
		}
		if t.based && seq <= t.last {
			return true
		}
		if t.moved == nil {
			t.moved = make(chan struct{})
		}
		moved := t.moved
		b.mu.Unlock()
		select {
		case <-moved:
			b.mu.Lock()
		case <-ctx.Done():
			b.mu.Lock()
			return false
		}
	}
}

// How much of each thread Recent keeps.
const (
	recentMax = 512
	recentAge = 10 * time.Second
)

// pruneRecent drops the recent events delivered before old (unix ns), so
// a quiet thread holds none.
func (t *threadState) pruneRecent(old int64) {
	i := 0
	for i < len(t.recentAt) && t.recentAt[i] < old {
		i++
	}
	switch {
	case i == len(t.recent):
		t.recent, t.recentAt = nil, nil
	case i > 0:
		t.recent, t.recentAt = slices.Clone(t.recent[i:]), slices.Clone(t.recentAt[i:])
	}
}

func minSeq(m map[int64]*chat.Event) int64 {
	first := int64(-1)
	for seq := range m {
		if first < 0 || seq < first {
			first = seq
		}
	}
	return first
}
