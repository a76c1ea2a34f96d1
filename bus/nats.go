package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/honestcancel/gateway/chat"
)

// EventLog is what the NATS bus needs from the store: the event log it
// recovers missed events from. The database is the source of truth; NATS
// only carries copies.
type EventLog interface {
	// ThreadEvents returns every event of the thread with seq > after, in
	// seq order, with ThreadID, Type, Seq and Raw set, and the thread's
	// LastSeq at the time of the read. Complete is false when the store
	// cannot give them all (purged deltas, too long a gap).
	ThreadEvents(ctx context.Context, threadID string, after int64) (chat.Replay, error)
	// LastSeqs returns the last_seq of each thread that exists; unknown
	// threads are left out.
	LastSeqs(ctx context.Context, threadIDs []string) (map[string]int64, error)
}

// NATSConfig configures DialNATS.
type NATSConfig struct {
	// Log is the event log missed events are recovered from. Required.
	Log EventLog
	// Subject prefixes every subject the bus uses ("gateway" when empty):
	// instances share events only with the same prefix.
	Subject string
	// SweepEvery is how often the bus compares the log's last seqs with
	// what it delivered (2s when zero).
	SweepEvery time.Duration
	// LogTimeout bounds each read of the log (5s when zero).
	LogTimeout time.Duration
	// MaxPending bounds the events held per thread while a gap before them
	// is recovered (1024 when zero).
	MaxPending int
	// Logger receives connection changes and recovery failures; nil
	// discards them.
	Logger *slog.Logger
	// Name identifies this instance to the NATS server.
	Name string
	// Holder is this process's run lease owner: the name other instances
	// ask (YieldStream, ForwardCancel) about threads it streams on and runs
	// it executes. Empty: it is asked nothing.
	Holder string
}

// Handlers connect the bus to the parts that answer other instances; see
// NATS.SetHandlers.
type Handlers struct {
	// OnCancel is called with the run id of each cancel wake-up another
	// instance publishes (never for this instance's own), from one bus
	// goroutine, one call at a time, outside every bus lock. Nil ignores
	// wake-ups.
	OnCancel func(runID string)
	// OnYield gives a thread this process streams on back to the asking
	// instance (store.Store.YieldStream): it writes the pending deltas and
	// the reservation goes. OnCancelRun accepts a cancel another instance
	// forwards to the process executing the run (engine.CancelRunHere).
	// Both are called from bus goroutines, several at once (at most
	// maxHolderRequests), outside every bus lock, with a context that ends
	// at Close or after holderAnswerTimeout. See holders.go.
	OnYield     func(ctx context.Context, threadID string) error
	OnCancelRun func(ctx context.Context, p chat.CancelRun) (chat.CancelAck, error)
}

// NATS is the event bus for several gateway instances sharing one
// database. Each instance delivers its own commits locally in Publish and
// sends them over NATS; the others deliver what they receive to their
// local sinks. NATS is only a fast path: per thread with local sinks the
// bus keeps the last seq delivered, holds events that arrive after a gap,
// and fills the gap from the event log (EventLog.ThreadEvents), so sinks
// see each thread's events in seq order, without duplicates, whether
// messages arrive late (two instances committing on one thread), get lost,
// or NATS restarts. A periodic sweep (EventLog.LastSeqs) catches a lost
// event that nothing follows.
//
// All methods are safe for concurrent use. Publish and PublishCancel never
// block; Add may block for one log read (LogTimeout) when it is the
// thread's first local sink. Sinks are called with the bus's lock held and
// must not block or call back into the bus (chat.EventSink). The bus owns
// every goroutine it starts (two receivers, the publisher, the sweeper and
// at most one recovery per thread); Close stops them and waits.
type NATS struct {
	cfg      NATSConfig
	handlers atomic.Pointer[Handlers] // nil until SetHandlers
	log      *slog.Logger
	nc       *nats.Conn
	evSub    *nats.Subscription
	evCh     chan *nats.Msg
	cnSub    *nats.Subscription
	cnCh     chan *nats.Msg
	evPfx    string // "<prefix>.ev."
	cancelS  string // "<prefix>.cancel"
	holderS  string // "<prefix>.holder."
	hSub     *nats.Subscription
	hCh      chan *nats.Msg

	ctx    context.Context // ends at Close: stops every goroutine and log read
	stop   context.CancelFunc
	wg     sync.WaitGroup
	resync chan struct{} // cap 1: sweep now (reconnected, slow consumer)
	ncDone chan struct{} // closed by the NATS closed handler
	once   sync.Once

	out outbox

	// reads bounds the log reads of recoveries in flight (they share the
	// store's read pool with subscribes and snapshots): after a NATS
	// restart every thread behind would read at once.
	reads chan struct{}

	mu       sync.Mutex
	closed   bool
	threads  map[string]*threadState // threads with local sinks only
	stats    NATSStats
	warnedAt time.Time // last "recover … failed" warning (at most one per warnEvery)
}

// maxRecoveryReads bounds the recoveries reading the log at once;
// warnEvery spaces out warnings of a log that keeps failing.
const (
	maxRecoveryReads = 4
	warnEvery        = 5 * time.Second
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

// NATSStats counts what the bus did since DialNATS.
type NATSStats struct {
	// Recoveries counts log reads that filled gaps (or found none).
	Recoveries int64
	// Recovered counts events taken from the log because neither NATS nor
	// Publish had brought them yet when it was read (some may arrive
	// later, and are then dropped as duplicates).
	Recovered int64
	// Skipped counts seqs delivered past because neither NATS nor the log
	// could give them (the sinks saw a gap).
	Skipped int64
	// Unsent counts messages not sent to NATS (queue full or publish
	// failed).
	Unsent int64
}

// Stats reports the bus's counters.
func (b *NATS) Stats() NATSStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats
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

// Defaults for NATSConfig.
const (
	defaultSubject    = "gateway"
	defaultSweepEvery = 2 * time.Second
	defaultLogTimeout = 5 * time.Second
	defaultMaxPending = 1024
	// maxOutbound bounds the messages waiting for the publisher; past it
	// new ones are dropped (the other instances recover them from the log).
	maxOutbound = 1 << 16
	// receiveBuffer is the NATS subscriptions' channel size; past it NATS
	// drops messages (slow consumer) and the bus resyncs from the log.
	receiveBuffer = 8192
)

// DialNATS connects to the NATS server at url, subscribes to the events and
// cancel wake-ups of the configured subject prefix (registered on the
// server before it returns) and starts the bus's goroutines. The
// connection reconnects forever; Close ends it.
func DialNATS(url string, cfg NATSConfig) (*NATS, error) {
	if cfg.Log == nil {
		return nil, errors.New("bus: NATSConfig.Log is required")
	}
	if cfg.Subject == "" {
		cfg.Subject = defaultSubject
	}
	if !validSubject(cfg.Subject) {
		return nil, fmt.Errorf("bus: subject prefix %q is not a NATS subject without wildcards", cfg.Subject)
	}
	if cfg.SweepEvery <= 0 {
		cfg.SweepEvery = defaultSweepEvery
	}
	if cfg.LogTimeout <= 0 {
		cfg.LogTimeout = defaultLogTimeout
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = defaultMaxPending
	}
	lg := cfg.Logger
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	ctx, stop := context.WithCancel(context.Background())
	b := &NATS{
		cfg: cfg, log: lg.With("bus", "nats"),
		evCh: make(chan *nats.Msg, receiveBuffer), cnCh: make(chan *nats.Msg, 256),
		evPfx: cfg.Subject + ".ev.", cancelS: cfg.Subject + ".cancel", holderS: cfg.Subject + ".holder.",
		hCh: make(chan *nats.Msg, 256),
		ctx: ctx, stop: stop,
		resync: make(chan struct{}, 1), ncDone: make(chan struct{}),
		threads: map[string]*threadState{}, reads: make(chan struct{}, maxRecoveryReads),
	}
	b.out.wake = make(chan struct{}, 1)
	nc, err := nats.Connect(url,
		nats.Name(cfg.Name),
		nats.NoEcho(), // our own commits are delivered locally by Publish
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500*time.Millisecond),
		nats.ReconnectJitter(500*time.Millisecond, time.Second),
		nats.PingInterval(10*time.Second),
		nats.Timeout(5*time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				b.log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			b.log.Info("nats reconnected: recovering missed events from the log", "server", nc.ConnectedUrlRedacted())
			b.wakeSweep()
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			b.log.Warn("nats error", "err", err)
			if errors.Is(err, nats.ErrSlowConsumer) {
				b.wakeSweep() // messages were dropped: the log has them
			}
		}),
		nats.ClosedHandler(func(*nats.Conn) { close(b.ncDone) }),
	)
	if err != nil {
		stop()
		return nil, fmt.Errorf("bus: connect to nats: %w", err)
	}
	b.nc = nc
	fail := func(err error) (*NATS, error) {
		nc.Close()
		stop()
		return nil, err
	}
	if b.evSub, err = nc.ChanSubscribe(b.evPfx+"*", b.evCh); err != nil {
		return fail(fmt.Errorf("bus: subscribe to events: %w", err))
	}
	if b.cnSub, err = nc.ChanSubscribe(b.cancelS, b.cnCh); err != nil {
		return fail(fmt.Errorf("bus: subscribe to cancels: %w", err))
	}
	if cfg.Holder != "" {
		if b.hSub, err = nc.ChanSubscribe(b.holderSubject(cfg.Holder), b.hCh); err != nil {
			return fail(fmt.Errorf("bus: subscribe to requests for this process: %w", err))
		}
	}
	if err := nc.FlushTimeout(cfg.LogTimeout); err != nil {
		return fail(fmt.Errorf("bus: register subscriptions: %w", err))
	}
	b.wg.Go(func() { b.receive(b.evCh, b.receiveMsg) })
	b.wg.Go(func() { b.receive(b.cnCh, b.receiveCancel) })
	b.wg.Go(b.receiveHolderRequests)
	b.wg.Go(b.publisher)
	b.wg.Go(b.sweeper)
	return b, nil
}

// Close stops every goroutine of the bus, waits for them and closes the
// NATS connection (what the publisher still held is sent first). Sinks get
// nothing more. Safe to call more than once.
func (b *NATS) Close() {
	b.once.Do(func() {
		b.mu.Lock()
		b.closed = true
		for _, t := range b.threads {
			if t.baselining {
				close(t.ready)
				t.baselining = false
			}
		}
		b.threads = map[string]*threadState{}
		b.mu.Unlock()
		b.stop()
		b.wg.Wait()
		b.nc.Close()
		// The closed handler runs last on the connection's callback
		// goroutine: once it has, the client's own goroutines are ending.
		select {
		case <-b.ncDone:
		case <-time.After(5 * time.Second):
			b.log.Warn("nats connection did not report closed within 5s")
		}
	})
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
	t = &threadState{sinks: map[Sink]struct{}{sink: {}}, baselining: true, ready: make(chan struct{}), pending: map[int64]*chat.Event{}}
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
		b.log.Warn("read thread baseline failed: the first event will be the baseline", "thread_id", threadID, "err", err)
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
		b.log.Warn("too many events held behind a gap: delivering past it", "thread_id", ev.ThreadID, "missing_from", t.last+1, "missing_to", first-1)
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

// recoverLocked starts the thread's recovery goroutine, or asks the
// running one for another pass.
func (b *NATS) recoverLocked(threadID string, t *threadState) {
	if b.closed {
		return
	}
	if t.recovering {
		t.again = true
		return
	}
	t.recovering = true
	b.wg.Go(func() { b.recover(threadID, t) })
}

// recover reads the thread's events after the last delivered one from the
// log and delivers them with the held ones, in order; it reruns while new
// gaps appeared during a read. On a read error it stops: the sweep retries.
func (b *NATS) recover(threadID string, t *threadState) {
	var idle time.Duration
	for {
		b.mu.Lock()
		if b.threads[threadID] != t {
			b.mu.Unlock()
			return
		}
		after := t.last
		t.again = false
		b.mu.Unlock()

		var rep chat.Replay
		var err error
		select {
		case b.reads <- struct{}{}:
			ctx, cancel := context.WithTimeout(b.ctx, b.cfg.LogTimeout)
			rep, err = b.cfg.Log.ThreadEvents(ctx, threadID, after)
			cancel()
			<-b.reads
		case <-b.ctx.Done():
			err = b.ctx.Err()
		}

		b.mu.Lock()
		if b.threads[threadID] != t {
			b.mu.Unlock()
			return
		}
		if err != nil {
			t.recovering = false
			warn := b.ctx.Err() == nil && time.Since(b.warnedAt) >= warnEvery
			if warn {
				b.warnedAt = time.Now()
			}
			b.mu.Unlock()
			if warn {
				b.log.Warn("recover thread events from the log failed: the sweep retries (further failures within 5s are not logged)", "thread_id", threadID, "after_seq", after, "err", err)
			}
			return
		}
		b.stats.Recoveries++
		b.applyReplayLocked(threadID, t, rep)
		if b.threads[threadID] != t || !t.again || b.closed {
			t.recovering = false
			b.mu.Unlock()
			return
		}
		progress := t.last > after
		b.mu.Unlock()
		if progress {
			idle = 0
			continue
		}
		// The log is behind what NATS brought (the instance streaming the
		// thread writes its deltas after it fans them out, every few ms):
		// read it again a little later, later each time.
		idle = min(max(2*idle, time.Millisecond), 250*time.Millisecond)
		select {
		case <-time.After(idle):
		case <-b.ctx.Done():
			b.mu.Lock()
			t.recovering = false
			b.mu.Unlock()
			return
		}
	}
}

// applyReplayLocked merges a log read into the held events and delivers
// them in order. A gap that remains below rep.LastSeq was committed before
// the read yet the log cannot give it (Complete=false: purged deltas, too
// long a gap): it is skipped, and the sinks, which check seqs, see it and
// close their connections so the clients resync from a snapshot. A gap
// above rep.LastSeq was committed after the read: another pass reads it.
func (b *NATS) applyReplayLocked(threadID string, t *threadState, rep chat.Replay) {
	for _, ev := range rep.Events {
		if ev.Seq <= t.last {
			continue
		}
		if _, held := t.pending[ev.Seq]; held {
			continue
		}
		if ev.ThreadID != threadID {
			cp := *ev
			cp.ThreadID = threadID
			ev = &cp
		}
		t.pending[ev.Seq] = ev
		b.stats.Recovered++
	}
	for {
		b.drainLocked(threadID, t)
		if b.threads[threadID] != t {
			return
		}
		if len(t.pending) == 0 {
			if t.last < rep.LastSeq {
				// Not held by the log and nothing after it yet: the next
				// event shows the gap to the sinks.
				b.log.Warn("events missing from the log: delivering past them", "thread_id", threadID, "missing_from", t.last+1, "missing_to", rep.LastSeq)
				b.skipLocked(threadID, t, rep.LastSeq)
			}
			return
		}
		first := minSeq(t.pending)
		if first-1 > rep.LastSeq {
			t.again = true
			return
		}
		b.log.Warn("events missing from the log: delivering past them", "thread_id", threadID, "missing_from", t.last+1, "missing_to", first-1)
		b.skipLocked(threadID, t, first-1)
		if b.threads[threadID] != t {
			return
		}
	}
}

// skipLocked gives up the seqs after t.last up to through, which nobody
// can deliver any more: LossAware sinks are told, and those that miss some
// of them dropped (their clients start over from a snapshot); the others
// see the gap in the next event's seq. The thread's state goes with its last sink.
func (b *NATS) skipLocked(threadID string, t *threadState, through int64) {
	b.stats.Skipped += through - t.last
	t.last = through
	t.wake()
	t.recent, t.recentAt = nil, nil // no longer consecutive up to last
	for s := range t.sinks {
		if la, ok := s.(LossAware); ok && !la.Lost(threadID, through) {
			delete(t.sinks, s)
		}
	}
	if len(t.sinks) == 0 && b.threads[threadID] == t {
		delete(b.threads, threadID)
	}
}

// sweeper compares, every SweepEvery and when NATS asks (reconnect, slow
// consumer), the log's last seq of each thread with local sinks with what
// was delivered, and recovers the threads that are behind: it catches an
// event whose NATS message was lost when nothing follows it.
func (b *NATS) sweeper() {
	tick := time.NewTicker(b.cfg.SweepEvery)
	defer tick.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-tick.C:
		case <-b.resync:
		}
		b.sweep()
	}
}

func (b *NATS) sweep() {
	b.mu.Lock()
	ids := make([]string, 0, len(b.threads))
	for id, t := range b.threads {
		if !t.baselining {
			ids = append(ids, id)
		}
	}
	b.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	// The server must hold our subscription before the log is read: after
	// a reconnect the client resends it, and until the server has it
	// another instance may append and publish an event that neither this
	// read nor NATS brings here. A round trip orders them (the server
	// handles a connection's SUB before its PING); when it fails we are
	// disconnected, and the reconnect sweeps again.
	_ = b.nc.FlushTimeout(b.cfg.LogTimeout)
	ctx, cancel := context.WithTimeout(b.ctx, b.cfg.LogTimeout)
	seqs, err := b.cfg.Log.LastSeqs(ctx, ids)
	cancel()
	if err != nil {
		if b.ctx.Err() == nil {
			b.log.Warn("sweep: read last seqs failed", "threads", len(ids), "err", err)
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	old := time.Now().Add(-recentAge).UnixNano()
	for _, id := range ids {
		t := b.threads[id]
		if t != nil {
			t.pruneRecent(old)
		}
		last, ok := seqs[id]
		if t == nil || t.baselining || !ok {
			continue
		}
		if !t.based {
			// The baseline read failed and nothing arrived since: start
			// from here (a later event shows any gap to the sinks).
			t.based, t.last = true, last
			t.wake()
			b.drainLocked(id, t)
			continue
		}
		if last > t.last || len(t.pending) > 0 {
			b.recoverLocked(id, t)
		}
	}
}

// SetHandlers connects the bus to what answers other instances (the
// store's YieldStream, the engine's CancelRunHere and WakeCancels), once
// those exist: the bus is dialed first because the store and the engine
// are built on it. Until then another instance's request is answered
// "this instance is still starting" (it then decides without this one, as
// for a process that does not answer) and a cancel wake-up is ignored (the
// engine finds the cancel at its next poll). Safe to call while the bus
// runs; a later call replaces the handlers.
func (b *NATS) SetHandlers(h Handlers) { b.handlers.Store(&h) }

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

// wakeSweep asks the sweeper for a sweep now; never blocks.
func (b *NATS) wakeSweep() {
	select {
	case b.resync <- struct{}{}:
	default:
	}
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
		b.log.Warn("nats publish queue full: messages not sent (the other instances recover them from the log)", "dropped", dropped)
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

func minSeq(m map[int64]*chat.Event) int64 {
	first := int64(-1)
	for seq := range m {
		if first < 0 || seq < first {
			first = seq
		}
	}
	return first
}

// validToken reports whether s can be one token of a NATS subject.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '.' || c == '*' || c == '>' || c <= ' ' || c >= 0x7f:
			return false
		}
	}
	return true
}

func validSubject(s string) bool {
	for tok := range strings.SplitSeq(s, ".") {
		if !validToken(tok) {
			return false
		}
	}
	return true
}
