package gateway

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/chat"
)

// maxFrame bounds one coalesced server frame.
const maxFrame = 256 << 10

// wsConn is one browser tab (or program) on GET /ws. Its reader is the HTTP
// handler goroutine, which runs commands one at a time in arrival order; its
// writer goroutine drains the send queue, coalescing whatever is queued into
// one frame (objects separated by "\n"). Deliver, called by the feed while
// the store publishes a commit, never blocks: it appends the event's shared
// encoding to the queue, or, past the queue's byte bound, marks the
// connection too slow and lets the writer close it.
//
// While a command runs, events for this connection are held back and queued
// after the command's ack, so the ack always precedes the events the
// command caused.
type wsConn struct {
	hub       *wsHub
	ws        *websocket.Conn
	id        string
	user      string         // principal.UserID: the owner of everything it touches
	principal chat.Principal // re-checked every ping interval

	ctx    context.Context // the connection's lifetime; ends when it closes
	cancel context.CancelFunc
	// wake (cap 1) is the writer's only wake-up: the queue has frames,
	// closeCode is set, ctx ended, or a timed flag (pingDue, agedOut) is set.
	wake chan struct{}

	writeStarted atomic.Int64 // unix nanos of the write in progress, 0 when idle
	swept        atomic.Bool  // the sweeper closed it for a stuck write (counted once)
	pingDue      atomic.Bool  // the ping interval passed (set by a timer, taken by the writer)
	agedOut      atomic.Bool  // MaxConnAge passed (set by a timer, taken by the writer)

	mu          sync.Mutex
	tab         string
	queue       [][]byte
	queuedBytes int // live frames queued (the QueueBytes bound)
	replayBytes int // subscribe replays queued (see queueReplayLocked)
	answered    int // queue[:answered] ends with the last command's frames (release): an urgent answer goes no further ahead
	holding     bool
	held        []*chat.Event
	heldBytes   int
	// subs: thread -> last seq queued (-1 while subscribing). Only the
	// reader adds or removes keys; each key holds one of its user's
	// subscription slots (userLimits.watch), given back when it goes.
	subs map[string]int64
	// lostWhileSubscribing: thread -> the last seq a bus gave up as lost
	// while the thread's subscribe was catching up (subs -1): judged once
	// the catch-up says how far the connection got (settleLossLocked).
	lostWhileSubscribing map[string]int64
	closeCode            websocket.StatusCode
	closeReason          string
	closed               bool
	limiter              tokenBucket // this connection's command budget (its user's is in hub.s.limits)
}

func newWSConn(h *wsHub, ws *websocket.Conn, p chat.Principal) *wsConn {
	ctx, cancel := context.WithCancel(context.Background())
	return &wsConn{
		hub: h, ws: ws, id: chat.NewID("con_"), user: p.UserID, principal: p, ctx: ctx, cancel: cancel,
		wake: make(chan struct{}, 1), subs: map[string]int64{},
		limiter: newTokenBucket(h.cfg.CommandRate, h.cfg.CommandBurst, h.cfg.Now()),
	}
}

// run serves the connection until either side ends it, then unsubscribes
// it everywhere and waits for its writer.
func (c *wsConn) run() {
	var writer sync.WaitGroup
	writer.Go(c.write)
	defer func() {
		c.mu.Lock()
		c.closed = true
		threads := make([]string, 0, len(c.subs))
		for t := range c.subs {
			threads = append(threads, t)
		}
		c.mu.Unlock()
		for _, t := range threads {
			c.hub.s.feed.Remove(t, c)
		}
		c.hub.s.limits.unwatch(c.user, len(threads))
		// The reader is done, so is the connection: a write still blocked
		// on the peer is cut off rather than left to the sweeper.
		c.cancel()
		c.ws.CloseNow()
		writer.Wait()
	}()
	for {
		typ, data, err := c.ws.Read(c.ctx)
		if err != nil {
			return
		}
		c.hub.s.metrics.FrameReceived(len(data))
		if typ != websocket.MessageText {
			err := c.admit("")
			if err == nil {
				err = chat.Invalid("binary frames are not understood: send one JSON object per text frame")
			}
			c.reply(errorFrame("", err, c.hub.s.log))
			continue
		}
		c.command(data)
	}
}

// write drains the queue until the connection ends. It pings on an idle
// interval; a failed write or ping ends the connection, and so does a
// credential that no longer holds (signed out, revoked, expired), checked
// at the same interval, and reaching MaxConnAge.
//
// The writer sleeps on one channel, wake, for everything: queued frames,
// a close, the end of the connection's context, the ping interval and the
// age limit (the last three through callbacks that set a flag and wake it).
// A select over a channel per cause cost the fan-out path a sixth of its CPU
// (BENCHMARKS.md as of 6e7e314, "Fan-out, profiled").
func (c *wsConn) write() {
	defer c.cancel()
	stop := context.AfterFunc(c.ctx, c.nudge)
	defer stop()
	ping := time.AfterFunc(c.hub.cfg.PingInterval, func() { c.flag(&c.pingDue) })
	defer ping.Stop()
	if age := c.hub.cfg.MaxConnAge; age > 0 {
		t := time.AfterFunc(age, func() { c.flag(&c.agedOut) })
		defer t.Stop()
	}
	var buf bytes.Buffer
	for {
		<-c.wake
		if c.ctx.Err() != nil {
			return
		}
		if c.agedOut.CompareAndSwap(true, false) {
			c.aged()
		}
		if c.pingDue.CompareAndSwap(true, false) {
			c.recheck()
			ctx, cancel := context.WithTimeout(c.ctx, c.hub.cfg.StuckWrite)
			err := c.ws.Ping(ctx)
			cancel()
			if err != nil {
				return
			}
			ping.Reset(c.hub.cfg.PingInterval)
		}
		c.mu.Lock()
		frames, code, reason := c.queue, c.closeCode, c.closeReason
		c.queue, c.queuedBytes, c.replayBytes, c.answered = nil, 0, 0, 0
		c.mu.Unlock()
		if code != 0 {
			c.ws.Close(code, reason)
			return
		}
		for len(frames) > 0 {
			buf.Reset()
			n := 0
			for n < len(frames) && (n == 0 || buf.Len()+len(frames[n]) < maxFrame) {
				if n > 0 {
					buf.WriteByte('\n')
				}
				buf.Write(frames[n])
				n++
			}
			frames = frames[n:]
			c.writeStarted.Store(time.Now().UnixNano())
			// No cancellable context per write: coder/websocket would arm
			// a watcher for it on every frame. A write blocked on a dead
			// peer is ended by the hub's stuck-write sweeper (CloseNow),
			// and a closing connection fails its writes anyway.
			err := c.ws.Write(context.Background(), websocket.MessageText, buf.Bytes())
			c.writeStarted.Store(0)
			if err != nil {
				return
			}
			c.hub.s.metrics.FrameSent(buf.Len())
		}
	}
}

// nudge wakes the writer (never blocks; a wake-up already pending covers
// this one too).
func (c *wsConn) nudge() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// flag sets one of the writer's timed flags and wakes it.
func (c *wsConn) flag(f *atomic.Bool) {
	f.Store(true)
	c.nudge()
}

// recheck asks whether the connection's credential still holds; when it
// ended, the connection is closed with 1008 through the queue like any other
// server close. A failed check (the store unreachable) keeps the connection
// and is logged: the next interval or command asks again.
func (c *wsConn) recheck() {
	if c.hub.s.credentialEnded(c.ctx, c.principal, c.id) != nil {
		c.mu.Lock()
		c.closeLocked(closeAuthEnded, closeAuthEndedReason)
		c.mu.Unlock()
	}
}

// aged closes the connection once it is MaxConnAge old, through the queue
// like any other server close; the client reconnects, and its credential
// is decided afresh (by the proxy, in auth mode header).
func (c *wsConn) aged() {
	c.mu.Lock()
	c.closeLocked(closeAged, closeAgedReason)
	c.mu.Unlock()
}

// credentialEnded re-checks a long-lived connection's credential (a
// WebSocket's or an event stream's, connID naming it in the log), always
// reading the store (never the authenticator's cache): the
// unauthorized *chat.Error when it no longer holds (signed out, revoked,
// password changed, account deleted, expired), nil otherwise. A check
// that fails for another reason (the store unreachable) keeps the
// connection and is logged: the next interval asks again.
func (s *Server) credentialEnded(ctx context.Context, p chat.Principal, connID string) error {
	var err error
	shallow(func() {
		ctx, cancel := context.WithTimeout(ctx, s.ws.cfg.StuckWrite)
		defer cancel()
		err = s.auth.Revalidate(ctx, p)
	})
	switch {
	case err == nil:
		return nil
	case chat.ErrorCode(err) == chat.CodeUnauthorized:
		return err
	case ctx.Err() == nil:
		s.log.Warn("recheck connection credential", "connection_id", connID, "err", err)
	}
	return nil
}

// Deliver implements chat.EventSink. It never blocks.
func (c *wsConn) Deliver(ev *chat.Event) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.closeCode != 0 {
		return false
	}
	if _, ok := c.subs[ev.ThreadID]; !ok {
		return false
	}
	if c.holding {
		c.held = append(c.held, ev)
		c.heldBytes += len(ev.Raw)
		if c.queuedBytes+c.heldBytes > c.hub.cfg.QueueBytes {
			c.slowLocked(slowQueue, closeSlowReason)
			return false
		}
		return true
	}
	return c.queueEventLocked(ev)
}

// Lost implements bus.LossAware: events of the thread up to seq through
// are gone for good (the bus could recover them neither from NATS nor from
// the event log). A connection that already has them all (it caught up
// from the log, or resubscribed after seeing them elsewhere) misses
// nothing and stays. Otherwise the client must start over: the connection
// is closed like one that missed an event, and the page resubscribes with
// after_seq (answered with a snapshot). Called by the bus, never blocks.
func (c *wsConn) Lost(threadID string, through int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	last, ok := c.subs[threadID]
	switch {
	case !ok:
		return false
	case last == -1:
		// Subscribing: what the catch-up brings decides (it may reach past
		// the loss, from the log or another instance's recent events).
		if c.lostWhileSubscribing == nil {
			c.lostWhileSubscribing = map[string]int64{}
		}
		c.lostWhileSubscribing[threadID] = max(c.lostWhileSubscribing[threadID], through)
		return true
	case last >= through:
		return true
	}
	c.slowLocked(slowMissed, "missed events: reconnect and subscribe with after_seq")
	return false
}

// settleLossLocked judges a loss reported while the thread's subscribe was
// catching up, now that the connection has everything through last: it
// stays if that covers the loss, and is closed as having missed events
// otherwise.
func (c *wsConn) settleLossLocked(threadID string, last int64) {
	through, ok := c.lostWhileSubscribing[threadID]
	if !ok {
		return
	}
	delete(c.lostWhileSubscribing, threadID)
	if last < through {
		c.slowLocked(slowMissed, "missed events: reconnect and subscribe with after_seq")
	}
}

// queueEventLocked queues ev unless this connection already has it; a seq
// beyond the next one means an event was lost on the way, which the client
// can only repair by resyncing.
func (c *wsConn) queueEventLocked(ev *chat.Event) bool {
	last, ok := c.subs[ev.ThreadID]
	switch {
	case !ok:
		return false
	case ev.Seq <= last:
		return true
	case ev.Seq != last+1:
		c.slowLocked(slowMissed, "missed events: reconnect and subscribe with after_seq")
		return false
	}
	c.subs[ev.ThreadID] = ev.Seq
	return c.queueLocked(ev.Raw)
}

// queueLocked appends one frame for the writer; over the byte bound the
// connection is closed as too slow.
func (c *wsConn) queueLocked(frame []byte) bool {
	if c.closeCode != 0 {
		return false
	}
	c.queue = append(c.queue, frame)
	c.queuedBytes += len(frame)
	if c.queuedBytes > c.hub.cfg.QueueBytes {
		c.slowLocked(slowQueue, closeSlowReason)
		return false
	}
	c.nudge()
	return true
}

// queueReplayLocked appends what a subscribe sends at once (its replay or
// snapshot). One replay is not held to QueueBytes: that bound catches a
// client falling behind live events, while the size of a replay is the
// server's choice (at most store.MaxReplay events and a few MiB, or one
// snapshot), and counting it would close a client that reads perfectly
// well, and close it again on every reconnect, whenever its gap is larger
// than the bound.
// Replays the writer has not taken yet do count, so a client that stops
// reading and keeps subscribing is closed as too slow.
func (c *wsConn) queueReplayLocked(frames [][]byte) {
	n := 0
	for _, f := range frames {
		n += len(f)
	}
	if c.replayBytes > 0 && c.replayBytes+n > c.hub.cfg.QueueBytes {
		c.slowLocked(slowQueue, closeSlowReason)
	}
	if c.closeCode != 0 {
		return
	}
	c.queue = append(c.queue, frames...)
	c.replayBytes += n
	c.nudge()
}

// closeLocked asks the writer to close the connection with code; queued
// frames are dropped (the client resyncs by seq).
func (c *wsConn) closeLocked(code websocket.StatusCode, reason string) {
	if c.closeCode != 0 {
		return
	}
	c.closeCode, c.closeReason = code, reason
	c.queue, c.queuedBytes, c.replayBytes, c.held, c.heldBytes, c.answered = nil, 0, 0, nil, 0, 0
	c.nudge()
}

// slowLocked closes the connection as a slow consumer (closeSlow with
// reason), counted once by why (slowQueue, slowMissed).
func (c *wsConn) slowLocked(why, reason string) {
	if c.closeCode == 0 {
		c.hub.s.metrics.SlowClosed(transportWebSocket, why)
	}
	c.closeLocked(closeSlow, reason)
}

// closeWith closes the connection now (shutdown): no more frames, then the
// close handshake.
func (c *wsConn) closeWith(code websocket.StatusCode, reason string) {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.ws.Close(code, reason)
}

// hold starts a command: events for this connection wait until release.
func (c *wsConn) hold() {
	c.mu.Lock()
	c.holding = true
	c.mu.Unlock()
}

// release queues the command's answer, then whatever it made wait, then
// more frames (replay) given by extra, which runs with the lock held. An
// urgent answer (a cancel's) goes ahead of the frames the writer has not
// taken yet that came after the previous command's frames: events queued
// before the command was read, none of which it caused, so an ack still
// precedes every event its command caused, answers keep the order of
// their commands, and a tab that is behind learns its cancel was accepted
// without waiting for its backlog. (Not for every command: an
// unsubscribe's ack must follow the events of the thread queued before
// it.)
func (c *wsConn) release(answer []byte, extra func(), urgent bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if at := c.answered; urgent && at < len(c.queue) && c.closeCode == 0 {
		c.queue = append(c.queue, nil)
		copy(c.queue[at+1:], c.queue[at:])
		c.queue[at] = answer
		c.queuedBytes += len(answer)
		c.nudge()
	} else {
		c.queueLocked(answer)
	}
	defer func() { c.answered = len(c.queue) }()
	if extra != nil {
		extra()
	}
	held := c.held
	c.held, c.heldBytes, c.holding = nil, 0, false
	for _, ev := range held {
		c.queueEventLocked(ev)
	}
}

// reply queues a frame outside any command (errors for unreadable frames).
func (c *wsConn) reply(frame []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queueLocked(frame)
	c.answered = len(c.queue)
}
