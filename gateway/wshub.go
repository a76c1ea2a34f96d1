package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/chat"
)

// WSConfig tunes the WebSocket endpoint, the slow-consumer bounds that event
// streams (GET /api/threads/{id}/events) share with it, and the per-user
// limits that the HTTP API shares with it (see limits.go). Zero values take
// the defaults.
type WSConfig struct {
	// OriginPatterns lists extra hosts (path.Match patterns, e.g.
	// "app.example.com") whose pages may connect; same-origin pages and
	// clients without an Origin header are always accepted.
	OriginPatterns []string
	// ReadLimit bounds one client frame (default 1 MiB; over it the
	// connection closes with 1009).
	ReadLimit int64
	// QueueBytes bounds what may wait for one connection's writer, or one
	// event stream's (default 4 MiB); a connection over it is closed as
	// too slow, a stream is ended. A subscribe's replay or snapshot, and a
	// stream's first catch-up, may exceed it on their own (see
	// queueReplayLocked).
	QueueBytes int
	// PingInterval is the keep-alive period (default 20s). A connection
	// re-checks its credential at each ping, and ends within one interval
	// of a sign-out, token revocation, password change or account
	// deletion. Event streams take Config.KeepAlive instead.
	PingInterval time.Duration
	// MaxConnAge ends a WebSocket connection (close 1000, "connection age
	// limit: reconnect") or an event stream (a comment, then the end of
	// the response) this long after it opened, whatever it is doing; the
	// client reconnects and is authenticated afresh. It is what bounds a
	// connection in auth mode header, where the server cannot re-check a
	// credential that only the proxy sees. 0: no bound.
	MaxConnAge time.Duration
	// StuckWrite is how long one write may block before the sweeper closes
	// the connection (default 10s). It is also an event stream's write
	// deadline: a write still blocked after it ends the stream.
	StuckWrite time.Duration
	// CommandRate and CommandBurst bound the frames of one connection
	// (default 20/s, burst 40), so one tab cannot take its user's whole
	// budget; over them a command is answered rate_limited. run.cancel is
	// not charged here (see CancelRate).
	CommandRate  float64
	CommandBurst int
	// MaxSubscriptions bounds the threads one connection watches (default 100).
	MaxSubscriptions int

	// UserCommandRate and UserCommandBurst bound the commands of one user
	// over all its WebSocket connections and its state-changing HTTP
	// requests together (default 60/s, burst 120: three busy tabs at the
	// per-connection rate, and a burst that lets a page resubscribe to a
	// hundred threads on reconnect). Over them a WebSocket command is
	// answered rate_limited with its re, an HTTP request 429 rate_limited
	// with Retry-After; both carry retry_after_seconds. Nothing of a
	// refused command is executed.
	UserCommandRate  float64
	UserCommandBurst int
	// CancelRate and CancelBurst are the cancel reserve: run.cancel and
	// POST /api/runs/{id}/cancel are charged to this bucket of their user
	// only, never to UserCommand* nor to the connection's CommandRate
	// (default 20/s, burst 64: every run the engine executes at once by
	// default, cancelled in one go).
	//
	// Why: the product's promise is that Cancel always works. A user whose
	// own script, runaway tab or reconnect loop floods commands would
	// otherwise find the one command that stops the damage refused. With a
	// bucket of its own, no amount of other traffic, on any connection of
	// the user, can make a cancel rate_limited. It is not unlimited: a
	// cancel is a database transaction, and HTTP has no per-connection
	// bucket, so an exempt cancel would be an unbounded write path; only a
	// flood of cancels themselves can exhaust this bucket, and then the
	// cancel is refused loudly (rate_limited with retry_after_seconds),
	// never silently. A repeated cancel of a run already cancelled
	// answers already_requested and is charged like any other.
	CancelRate  float64
	CancelBurst int
	// MaxConnsPerUser bounds one user's open WebSocket connections and
	// event streams (GET /api/threads/{id}/events) together (default 32:
	// plenty of tabs and programs; it stops a reconnect loop from holding
	// thousands of sockets). Both hold a socket, a goroutine and a live
	// feed, so they share one bound. Over it the upgrade or the stream is
	// refused before it starts with 429 rate_limited in the protocol's
	// JSON error shape; a slot frees when one of them closes.
	MaxConnsPerUser int
	// MaxSubscriptionsPerUser bounds the threads one user watches over all
	// its WebSocket connections (default 500: five connections at
	// MaxSubscriptions); an event stream watches one thread and counts as
	// a connection instead. Over it subscribe answers rate_limited and
	// changes nothing.
	MaxSubscriptionsPerUser int
	// Now is the clock of every rate limit (default time.Now); tests move
	// it.
	Now func() time.Time
}

func (c WSConfig) withDefaults() WSConfig {
	orDefault(&c.ReadLimit, 1<<20)
	orDefault(&c.QueueBytes, 4<<20)
	orDefault(&c.PingInterval, 20*time.Second)
	orDefault(&c.StuckWrite, 10*time.Second)
	orDefault(&c.CommandRate, 20)
	orDefault(&c.CommandBurst, 40)
	orDefault(&c.MaxSubscriptions, 100)
	orDefault(&c.UserCommandRate, 60)
	orDefault(&c.UserCommandBurst, 120)
	orDefault(&c.CancelRate, 20)
	orDefault(&c.CancelBurst, 64)
	orDefault(&c.MaxConnsPerUser, 32)
	orDefault(&c.MaxSubscriptionsPerUser, 500)
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// orDefault sets *v to def unless it is already more than zero (zero and
// negative settings take the default).
func orDefault[T int | int64 | float64 | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// Close codes the server uses. The reasons tell the client what to do.
const (
	// closeSlow: the client fell too far behind (or its writes stalled);
	// reconnect and subscribe with after_seq = the last seq it applied.
	closeSlow       = websocket.StatusTryAgainLater
	closeSlowReason = "too slow: reconnect and subscribe with after_seq"
	// closeAuthEnded: the connection's session or token was ended; sign
	// in again before reconnecting.
	closeAuthEnded       = websocket.StatusPolicyViolation
	closeAuthEndedReason = "signed out: sign in again"
	// closeAged: the connection reached MaxConnAge; reconnect, which
	// authenticates it again.
	closeAged       = websocket.StatusNormalClosure
	closeAgedReason = "connection age limit: reconnect"
	// closeGoingAway: the server is shutting down; reconnect (elsewhere).
	closeGoingAway       = websocket.StatusGoingAway
	closeGoingAwayReason = "server shutting down: reconnect"
)

// wsHub owns the live WebSocket connections: it registers them, sweeps
// stuck writers, and closes them all on shutdown. Each connection owns its
// reader (the HTTP handler goroutine) and its writer goroutine; the hub owns
// the sweeper. Safe for concurrent use.
type wsHub struct {
	s   *Server
	cfg WSConfig

	mu      sync.Mutex
	conns   map[*wsConn]struct{}
	closing bool
	active  sync.WaitGroup // one per serving handler

	sweepOnce sync.Once
	stopOnce  sync.Once
	stop      chan struct{}
	swept     sync.WaitGroup
}

func newWSHub(s *Server, cfg WSConfig) *wsHub {
	return &wsHub{s: s, cfg: cfg, conns: map[*wsConn]struct{}{}, stop: make(chan struct{})}
}

// serve upgrades GET /ws and runs the connection until it ends. The
// connection's context is its own: a run started over it outlives it.
func (h *wsHub) serve(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	if h.closing {
		h.mu.Unlock()
		writeError(w, h.s.log, chat.Errorf(chat.CodeInternal, "server shutting down: reconnect"))
		return
	}
	h.active.Add(1)
	h.mu.Unlock()
	defer h.active.Done()
	h.sweepOnce.Do(func() { h.swept.Go(h.sweep) })

	// websocket.Accept refuses a foreign origin with a plain-text 403; the
	// protocol's errors have one JSON shape everywhere, so refuse it here
	// first, by the same rule.
	if err := checkOrigin(r, h.cfg.OriginPatterns); err != nil {
		writeError(w, h.s.log, chat.Errorf(chat.CodeForbidden, "%v: open the app from its own address or configure the origin", err))
		return
	}
	// Past the user's connection bound, refuse before accepting, so the
	// client gets the protocol's JSON error with its 429.
	p, _ := chat.PrincipalFromContext(r.Context())
	if err := h.s.limits.join(p.UserID); err != nil {
		h.s.metrics.ConnRefused(transportWebSocket)
		writeError(w, h.s.log, err)
		return
	}
	defer h.s.limits.leave(p.UserID)
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		OriginPatterns:  h.cfg.OriginPatterns,
		CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		return // Accept answered the client (403 for a foreign origin)
	}
	ws.SetReadLimit(h.cfg.ReadLimit)
	c := newWSConn(h, ws, p)
	h.mu.Lock()
	closing := h.closing
	if !closing {
		h.conns[c] = struct{}{}
	}
	h.mu.Unlock()
	if closing {
		ws.Close(closeGoingAway, closeGoingAwayReason)
		return
	}
	h.s.metrics.ConnOpened(transportWebSocket)
	defer func() {
		h.mu.Lock()
		delete(h.conns, c)
		h.mu.Unlock()
		h.s.metrics.ConnClosed(transportWebSocket)
	}()
	c.run()
}

// checkOrigin is websocket.Accept's origin rule: no Origin header, the
// request's own host, or a host (or scheme://host) matching one of the
// patterns (path.Match, case-insensitive).
func checkOrigin(r *http.Request, patterns []string) error {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil
	}
	u, err := url.Parse(origin)
	if err != nil {
		return fmt.Errorf("the Origin %q is not a URL", origin)
	}
	if strings.EqualFold(r.Host, u.Host) {
		return nil
	}
	for _, p := range patterns {
		target := u.Host
		if strings.Contains(p, "://") {
			target = u.Scheme + "://" + u.Host
		}
		if ok, _ := path.Match(strings.ToLower(p), strings.ToLower(target)); ok {
			return nil
		}
	}
	if u.Host == "" {
		return fmt.Errorf("the Origin %q is not a URL with a host", origin)
	}
	return fmt.Errorf("pages from %q may not connect", u.Host)
}

// sweep closes connections whose current write has been blocked for too
// long: a peer that stopped reading and lets TCP fill up. One goroutine for
// all connections, instead of a deadline on every write.
func (h *wsHub) sweep() {
	t := time.NewTicker(h.cfg.StuckWrite / 4)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case now := <-t.C:
			h.mu.Lock()
			for c := range h.conns {
				if started := c.writeStarted.Load(); started != 0 && now.Sub(time.Unix(0, started)) > h.cfg.StuckWrite {
					if c.swept.CompareAndSwap(false, true) {
						h.s.metrics.SlowClosed(transportWebSocket, slowStuck)
					}
					c.ws.CloseNow()
				}
			}
			h.mu.Unlock()
		}
	}
}

// Shutdown closes every connection in parallel with "going away", gives the
// close handshakes until ctx ends, then drops what is left, and waits for
// every connection's goroutines and the sweeper. Calling it again is
// harmless.
func (h *wsHub) shutdown(ctx context.Context) {
	h.mu.Lock()
	h.closing = true
	conns := make([]*wsConn, 0, len(h.conns))
	for c := range h.conns {
		conns = append(conns, c)
	}
	h.mu.Unlock()
	var closing sync.WaitGroup
	for _, c := range conns {
		closing.Go(func() { c.closeWith(closeGoingAway, closeGoingAwayReason) })
	}
	done := make(chan struct{})
	go func() {
		closing.Wait()
		h.active.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		for _, c := range conns {
			c.ws.CloseNow()
		}
		<-done
	}
	h.stopOnce.Do(func() { close(h.stop) })
	h.swept.Wait()
}

// CloseWebSockets ends every WebSocket connection (see wsHub.shutdown). Call
// it before http.Server.Shutdown, which does not wait for hijacked
// connections.
func (s *Server) CloseWebSockets(ctx context.Context) { s.ws.shutdown(ctx) }
