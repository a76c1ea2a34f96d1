package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// SetHandlers connects the bus to what answers other instances (the
// store's YieldStream, the engine's CancelRunHere and WakeCancels), once
// those exist: the bus is dialed first because the store and the engine
// are built on it. Until then another instance's request is answered
// "this instance is still starting" (it then decides without this one, as
// for a process that does not answer) and a cancel wake-up is ignored (the
// engine finds the cancel at its next poll). Safe to call while the bus
// runs; a later call replaces the handlers.
func (b *NATS) SetHandlers(h Handlers) { b.handlers.Store(&h) }

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
