package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/chat"
)

// ConnOptions configure a WebSocket connection (Client.Connect). The zero
// value is usable.
type ConnOptions struct {
	// TabID, when set, is sent in hello on every connection: the server
	// then records cancels and deletes made over it as requested_by
	// "tab:<TabID>" (1–64 of A-Za-z0-9._:-). Without it they are
	// "tab:<connection_id>", which changes at every reconnect.
	TabID string
	// ReadLimit bounds one server frame (default 16 MiB: a snapshot holds
	// a thread's whole history).
	ReadLimit int64
	// Buffer is how many events a Subscription holds for its reader
	// (default 1024). When its reader falls that far behind, the
	// Subscription stops taking events and, once read empty, resumes from
	// the last one it took: nothing is lost, nothing blocks the
	// connection (Stats.Lagged).
	Buffer int
	// MaxAttempts bounds consecutive failed reconnection attempts before
	// the Conn gives up (its Err says why); 0 = no bound, until Close.
	MaxAttempts int
	// WriteTimeout bounds writing one command (default 10 s); a write
	// stuck past it drops the connection, which then reconnects.
	WriteTimeout time.Duration
}

// Conn is a WebSocket connection to the gateway (GET /ws) that survives
// the network: it sends the protocol's commands, each answered by its own
// ack or *Error, and feeds Subscriptions with their threads' events. When
// the connection drops (a network failure, a server restart or shutdown,
// the server closing a slow or old connection, the idle timeout) the Conn
// reconnects with bounded, jittered backoff, says hello again, and
// resubscribes every Subscription after the last seq it received, so each
// Subscription delivers every seq exactly once, in order; a gap the server
// can no longer fill arrives as a thread.snapshot with Event.Gap set.
//
// Commands issued while the Conn is reconnecting wait for the next
// connection (bounded by their ctx). A command whose connection dropped
// after it was sent and before its answer returns ErrConnectionLost:
// whether it ran is unknown (a run.start with a ClientRequestID is resent,
// since the server answers a repeat with the same run). A dropped
// connection never cancels anything on the server.
//
// A Conn owns one goroutine, which reads the connection and reconnects;
// Close stops it and waits for it. Every method of Conn is safe for
// concurrent use. The Conn gives up only after MaxAttempts failed
// reconnections or when the server refuses it for good (unauthorized, a
// 1008 close after a sign-out, forbidden): Done is then closed and Err
// says why; commands and Subscriptions return that error.
type Conn struct {
	cl      *Client
	opts    ConnOptions
	ctx     context.Context // the Conn's life; Close cancels it
	cancel  context.CancelFunc
	done    chan struct{} // closed when the run goroutine returned
	closing atomic.Bool
	once    sync.Once
	ids     atomic.Uint64
	stats   stats

	// Owned by the run goroutine (and by Connect before it starts).
	bo   backoff
	idle *watchdog

	mu      sync.Mutex
	ws      *websocket.Conn // the connection; nil while reconnecting
	ready   chan struct{}   // closed iff ws != nil or err != nil
	gone    chan struct{}   // closed when ws goes (made with it)
	epoch   uint64          // connections made
	connID  string
	pending map[string]*pending
	subs    map[string]*Subscription
	leaving map[string]int // thread -> unsubscribes in flight on this connection
	err     error          // why the Conn ended; nil while it runs
}

// pending is a command waiting for its answer.
type pending struct {
	typ string
	fn  func(answer) // run first, on the reader goroutine (must not block)
	ch  chan answer  // then the answer goes here (cap 1), if set
}

type answer struct {
	raw []byte    // the ack
	err error     // an *Error, or the connection lost
	at  time.Time // when the frame holding it was read; zero when none was
}

// Connect opens a WebSocket connection (and says hello with
// ConnOptions.TabID) before it returns, so a refused credential or origin
// is its error (an *Error); ctx bounds that first connection only. The
// Conn then lives until Close.
func (c *Client) Connect(ctx context.Context, o ConnOptions) (*Conn, error) {
	if o.ReadLimit <= 0 {
		o.ReadLimit = 16 << 20
	}
	if o.Buffer <= 0 {
		o.Buffer = 1024
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 10 * time.Second
	}
	cctx, cancel := context.WithCancel(context.Background())
	conn := &Conn{cl: c, opts: o, ctx: cctx, cancel: cancel, done: make(chan struct{}),
		bo: backoff{min: c.minBackoff, max: c.maxBackoff},
		ready: make(
			chan struct{},
		), pending: map[string]*pending{}, subs: map[string]*Subscription{}, leaving: map[string]int{}}
	ws, err := conn.dial(ctx)
	if err != nil {
		cancel()
		close(conn.done)
		return nil, err
	}
	hello := conn.up(ws, true)
	go conn.run(ws)
	if hello != nil {
		select {
		case a := <-hello:
			if a.err != nil {
				conn.Close()
				return nil, a.err
			}
		case <-ctx.Done():
			conn.Close()
			return nil, ctx.Err()
		}
	}
	return conn, nil
}

// ConnectionID is the server's name of the current connection (hello's
// ack); "" without a TabID.
func (c *Conn) ConnectionID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.connID
}

// Stats says what the Conn did to keep its Subscriptions exact.
func (c *Conn) Stats() Stats { return c.stats.snapshot() }

// Done is closed when the Conn has ended: Close, or it gave up (see Err).
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err is why the Conn ended (ErrClosed after Close), or nil while it runs.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close ends the connection (with a normal close, when there is one),
// stops the Conn's goroutine and waits for it. Commands waiting and every
// Subscription's Next return ErrClosed. It never cancels anything on the
// server. Calling it again is harmless.
func (c *Conn) Close() error {
	c.once.Do(func() {
		c.closing.Store(true)
		c.mu.Lock()
		ws := c.ws
		c.mu.Unlock()
		if ws != nil {
			// A normal close, given a second for the handshake: a peer
			// that does not answer is cut off.
			cut := startWatchdog(time.Second, func() { ws.CloseNow() })
			ws.Close(websocket.StatusNormalClosure, "client closed")
			cut.stop()
		}
		c.cancel()
	})
	<-c.done
	return nil
}

func (c *Conn) newID() string { return "c" + strconv.FormatUint(c.ids.Add(1), 10) }

// dial makes one connection.
func (c *Conn) dial(ctx context.Context) (*websocket.Conn, error) {
	cl := c.cl
	h := http.Header{}
	cl.authorize(h)
	if cl.origin != "" {
		h.Set("Origin", cl.origin)
	}
	ws, resp, err := websocket.Dial(ctx, cl.endpoint("/ws", nil), &websocket.DialOptions{
		HTTPClient: cl.streaming, HTTPHeader: h, Host: cl.host,
		CompressionMode: websocket.CompressionDisabled,
		OnPingReceived: func(context.Context, []byte) bool {
			c.idle.kick() // called by Read, on the run goroutine
			return true
		},
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols && resp.Body != nil {
			data, _ := io.ReadAll(resp.Body)
			return nil, parseError(resp.StatusCode, resp.Header, data)
		}
		return nil, fmt.Errorf("client: WebSocket connection to %s: %w", cl.BaseURL(), err)
	}
	ws.SetReadLimit(c.opts.ReadLimit)
	c.stats.connects.Add(1)
	return ws, nil
}

// up makes ws the Conn's connection: hello first (so that every command
// after it is the tab's), then it is ready for commands, then every
// Subscription is subscribed again from its last seq. Write errors are
// left to the reader, which sees the connection fail. first returns the
// channel of hello's answer (nil without a TabID).
func (c *Conn) up(ws *websocket.Conn, first bool) chan answer {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil
	}
	c.epoch++
	var hello []byte
	var answered chan answer
	if c.opts.TabID != "" {
		id := c.newID()
		p := &pending{typ: "hello", fn: func(a answer) {
			var ack struct {
				ConnectionID string `json:"connection_id"`
			}
			if a.err == nil && json.Unmarshal(a.raw, &ack) == nil {
				c.mu.Lock()
				c.connID = ack.ConnectionID
				c.mu.Unlock()
			} else if a.err != nil && !first {
				c.stats.note(&c.stats.unanswered, "hello refused on reconnect: %v", a.err)
			}
		}}
		if first {
			answered = make(chan answer, 1)
			p.ch = answered
		}
		c.pending[id] = p
		hello, _ = frame("hello", id, map[string]string{"tab_id": c.opts.TabID})
	}
	c.mu.Unlock()
	if hello != nil {
		c.write(ws, hello)
	}

	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return answered
	}
	c.ws, c.gone = ws, make(chan struct{})
	close(c.ready)
	var frames [][]byte
	for _, s := range c.subs {
		if f := c.subscribeFrameLocked(s); f != nil {
			frames = append(frames, f)
		}
	}
	c.mu.Unlock()
	for _, f := range frames {
		c.write(ws, f)
	}
	return answered
}

// run reads the connection, and reconnects when it drops, until Close or
// until it gives up.
func (c *Conn) run(ws *websocket.Conn) {
	defer close(c.done)
	for {
		err := c.serve(ws)
		c.down(err)
		if c.closing.Load() || c.ctx.Err() != nil {
			c.finish(ErrClosed)
			return
		}
		c.stats.dropped(dropReason(err))
		if end := terminalClose(err); end != nil {
			c.finish(end)
			return
		}
		ws = nil
		for attempts := 0; ws == nil; {
			if !sleep(c.ctx, c.bo.next()) {
				c.finish(ErrClosed)
				return
			}
			w, err := c.dial(c.ctx)
			if err != nil {
				if c.ctx.Err() != nil {
					c.finish(ErrClosed)
					return
				}
				attempts++
				if !retryable(err) || c.opts.MaxAttempts > 0 && attempts >= c.opts.MaxAttempts {
					c.finish(err)
					return
				}
				continue
			}
			ws = w
		}
		c.up(ws, false)
	}
}

// terminalClose is the end of the Conn when the server closed the
// connection with a code that says not to reconnect as is: 1008, the
// credential ended. Anything else (1000 age limit, 1001 shutdown, 1013
// too slow, a network failure) is reconnected.
func terminalClose(err error) error {
	if websocket.CloseStatus(err) == websocket.StatusPolicyViolation {
		var ce websocket.CloseError
		errors.As(err, &ce)
		return &Error{Status: http.StatusUnauthorized, Code: chat.CodeUnauthorized, Message: ce.Reason}
	}
	return nil
}

// dropReason says in words why a connection ended by itself: the
// server's close code and reason, or the error that ended it.
func dropReason(err error) string {
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return fmt.Sprintf("closed by the server: %d %s", int(ce.Code), ce.Reason)
	}
	return err.Error()
}

// serve reads ws until it fails; the idle timeout fails it with
// errIdle.
func (c *Conn) serve(ws *websocket.Conn) error {
	c.idle = startWatchdog(c.cl.idle, func() { ws.CloseNow() })
	defer func() {
		c.idle.stop()
		c.idle = nil
		ws.CloseNow()
	}()
	// Reads take no context (one registration per read is a cost per
	// frame): the end of the Conn closes the connection instead.
	defer context.AfterFunc(c.ctx, func() { ws.CloseNow() })()
	for {
		_, data, err := ws.Read(context.Background())
		if err != nil {
			if c.idle.hasFired() {
				return fmt.Errorf("%w (nothing received for %v)", errIdle, c.cl.idle)
			}
			return err
		}
		c.idle.kick()
		c.bo.reset()
		now := time.Now()
		for len(data) > 0 {
			var obj []byte
			if i := bytes.IndexByte(data, '\n'); i >= 0 {
				obj, data = data[:i], data[i+1:]
			} else {
				obj, data = data, nil
			}
			if obj = bytes.TrimSpace(obj); len(obj) > 0 {
				c.object(obj, now)
			}
		}
	}
}

// object handles one server object, read at now: an answer, or an event.
func (c *Conn) object(obj []byte, now time.Time) {
	var h struct {
		chat.EventHeader
		Re string `json:"re"`
	}
	if err := json.Unmarshal(obj, &h); err != nil || h.Type == "" {
		c.stats.note(&c.stats.malformed, "unreadable server object: %.200s", obj)
		return
	}
	if h.Type == "ack" || h.Type == "error" {
		c.mu.Lock()
		p := c.pending[h.Re]
		delete(c.pending, h.Re)
		c.mu.Unlock()
		if h.Re == "" || p == nil {
			c.stats.note(&c.stats.unanswered, "an answer to no command in flight: %.200s", obj)
			return
		}
		a := answer{at: now}
		if h.Type == "error" {
			a.err = parseError(0, nil, obj)
		} else {
			a.raw = obj
		}
		if p.fn != nil {
			p.fn(a)
		}
		if p.ch != nil {
			p.ch <- a
		}
		return
	}
	c.mu.Lock()
	s := c.subs[h.ThreadID]
	leaving := c.leaving[h.ThreadID] > 0
	c.mu.Unlock()
	if s == nil {
		if !leaving {
			c.stats.note(&c.stats.stray, "event of thread %s, not subscribed: %.200s", h.ThreadID, obj)
		}
		return
	}
	ev, err := decodeEventHead(obj, h.EventHeader)
	if err != nil {
		// The seq it had is missing now: the next event is a jump, which
		// resumes from the store.
		c.stats.note(&c.stats.malformed, "%v", err)
		return
	}
	ev.Received = now
	if s.offer(ev, leaving) {
		// thread.deleted: nothing follows it. Give the server its
		// subscription slot back; the Subscription ends once read.
		c.mu.Lock()
		if c.subs[s.thread] == s {
			delete(c.subs, s.thread)
		}
		c.mu.Unlock()
		c.leave(s.thread, nil)
	}
}

// down forgets a connection that ended: the commands waiting for an
// answer on it lose it (ErrConnectionLost), Subscriptions are subscribed
// again on the next one.
func (c *Conn) down(cause error) {
	c.mu.Lock()
	if c.ws != nil {
		c.ws = nil
		close(c.gone)
		if c.err == nil {
			c.ready = make(chan struct{})
		}
	}
	lost := c.pending
	c.pending = map[string]*pending{}
	c.leaving = map[string]int{}
	c.connID = ""
	c.mu.Unlock()
	closing := c.closing.Load()
	for _, p := range lost {
		if p.ch == nil {
			continue
		}
		if closing {
			p.ch <- answer{err: ErrClosed}
		} else {
			p.ch <- answer{err: lostError(p.typ, cause)}
		}
	}
}

// finish ends the Conn for good with err.
func (c *Conn) finish(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
		if c.ws == nil {
			close(c.ready)
		}
	}
	subs := c.subs
	c.subs = map[string]*Subscription{}
	lost := c.pending
	c.pending = map[string]*pending{}
	c.mu.Unlock()
	for _, p := range lost {
		if p.ch != nil {
			p.ch <- answer{err: err}
		}
	}
	for _, s := range subs {
		s.end(err)
	}
}

// write sends one frame on ws, bounded by WriteTimeout; a write that
// fails or times out leaves the connection closed, for the reader to see.
func (c *Conn) write(ws *websocket.Conn, f []byte) error {
	ctx, cancel := context.WithTimeout(c.ctx, c.opts.WriteTimeout)
	defer cancel()
	err := ws.Write(ctx, websocket.MessageText, f)
	if err != nil {
		ws.CloseNow()
	}
	return err
}

// frame encodes a command: {"type":…,"id":…} and the fields of body.
func frame(typ, id string, body any) ([]byte, error) {
	head, err := json.Marshal(struct {
		Type string `json:"type"`
		ID   string `json:"id"`
	}{typ, id})
	if err != nil || body == nil {
		return head, err
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("client: encode %s: %w", typ, err)
	}
	if len(b) < 2 || b[0] != '{' {
		return nil, fmt.Errorf("client: %s: fields must encode as a JSON object", typ)
	}
	if string(b) == "{}" {
		return head, nil
	}
	return append(append(head[:len(head)-1:len(head)-1], ','), b[1:]...), nil
}

// connection waits for a connection other than the one of epoch skip (0:
// any) and registers p on it under a new id.
func (c *Conn) connection(ctx context.Context, p *pending, skip uint64) (*websocket.Conn, string, uint64, error) {
	for {
		c.mu.Lock()
		if c.err != nil {
			err := c.err
			c.mu.Unlock()
			return nil, "", 0, err
		}
		if c.ws != nil && c.epoch != skip {
			id := c.newID()
			c.pending[id] = p
			ws, epoch := c.ws, c.epoch
			c.mu.Unlock()
			return ws, id, epoch, nil
		}
		wait := c.ready
		if c.ws != nil { // the one to skip: wait for it to go
			wait = c.gone
		}
		c.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, "", 0, ctx.Err()
		}
	}
}

func (c *Conn) forget(id string) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// do sends a command and decodes its ack into out. resend: the command
// is safe to repeat, so a connection lost before the answer sends it
// again on the next one.
func (c *Conn) do(ctx context.Context, typ string, body any, resend bool, out any) error {
	timing, _ := ctx.Value(timingKey{}).(*CommandTiming)
	var skip uint64
	for {
		p := &pending{typ: typ, ch: make(chan answer, 1)}
		ws, id, epoch, err := c.connection(ctx, p, skip)
		if err != nil {
			return err
		}
		f, err := frame(typ, id, body)
		if err != nil {
			c.forget(id)
			return err
		}
		if timing != nil {
			*timing = CommandTiming{Sent: time.Now()}
		}
		if err := c.write(ws, f); err != nil {
			c.forget(id)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			skip = epoch // not sent whole, so not run: send it on the next connection
			continue
		}
		select {
		case a := <-p.ch:
			if timing != nil {
				timing.Answered = a.at
			}
			if a.err != nil {
				if resend && errors.Is(a.err, ErrConnectionLost) {
					skip = epoch
					continue
				}
				return a.err
			}
			if out != nil {
				if err := json.Unmarshal(a.raw, out); err != nil {
					return fmt.Errorf("client: %s: unreadable ack: %w", typ, err)
				}
			}
			return nil
		case <-ctx.Done():
			c.forget(id)
			return ctx.Err()
		}
	}
}

// watchdog runs f once unless kicked within d each time. Owned by one
// goroutine (kick, stop); a nil watchdog does nothing.
type watchdog struct {
	d     time.Duration
	t     *time.Timer
	hit   atomic.Bool   // set before f runs
	fired chan struct{} // closed after f ran
}

func startWatchdog(d time.Duration, f func()) *watchdog {
	if d <= 0 {
		return nil
	}
	w := &watchdog{d: d, fired: make(chan struct{})}
	w.t = time.AfterFunc(d, func() {
		defer close(w.fired)
		w.hit.Store(true)
		f()
	})
	return w
}

// hasFired reports whether f was run (or is running).
func (w *watchdog) hasFired() bool { return w != nil && w.hit.Load() }

func (w *watchdog) kick() {
	if w != nil && w.t.Stop() {
		w.t.Reset(w.d)
	}
}

// stop disarms it, waiting for f if it fired.
func (w *watchdog) stop() {
	if w != nil && !w.t.Stop() {
		<-w.fired
	}
}
