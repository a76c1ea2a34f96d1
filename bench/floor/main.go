// Command floor is the benchmark's floor: a bare github.com/coder/websocket
// broadcast server with no protocol, no store and no authentication. The
// load generator (bench/cmd/loadgen) drives it with the same fan-out shape
// as the gateway, so each fan-out figure of the gateway has a same-run ratio
// to what the library alone costs on this machine. It repeats, on purpose,
// what any fan-out server needs (a subscriber map, a writer per connection,
// a byte-bounded queue) instead of importing the gateway's: a floor built on
// the gateway's code would measure the gateway.
//
// Wire format (text frames):
//
//	sub TOPIC            subscribe this connection to TOPIC; answered "ok TOPIC"
//	pub TOPIC PAYLOAD    send PAYLOAD, unchanged, to every subscriber of TOPIC
//
// Each connection has one reader (the handler goroutine) and one writer
// goroutine draining a byte-bounded queue, like any sane server: publishing
// never blocks, whatever is queued goes out in one frame (payloads separated
// by "\n", at most 256 KiB), and a connection more than -queue-bytes behind
// is closed with 1013. It binds loopback only and logs
// `msg="floor serving" addr=http://HOST:PORT` once it listens; SIGINT or
// SIGTERM closes every connection (1001) and exits.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "floor:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("floor", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "listen address (loopback only)")
	queueBytes := fs.Int("queue-bytes", 4<<20, "bytes one connection may fall behind before it is closed with 1013")
	if err := fs.Parse(args); err != nil {
		return err
	}
	host, _, err := net.SplitHostPort(*addr)
	if err != nil {
		return fmt.Errorf("-addr: %w", err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("-addr %s: the floor listens on a loopback address only", *addr)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	h := newHub(*queueBytes)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("floor serving", "addr", "http://"+ln.Addr().String())

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	closing, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h.shutdown(closing)
	if err := srv.Shutdown(closing); err != nil {
		log.Warn("http shutdown", "err", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// maxFrame bounds one coalesced frame, as in the gateway.
const maxFrame = 256 << 10

// hub maps topics to their subscribers. Safe for concurrent use.
type hub struct {
	queueBytes int

	mu      sync.RWMutex
	topics  map[string]map[*conn]struct{}
	conns   map[*conn]struct{}
	closing bool
	active  sync.WaitGroup // one per serving handler
}

func newHub(queueBytes int) *hub {
	return &hub{queueBytes: queueBytes, topics: map[string]map[*conn]struct{}{}, conns: map[*conn]struct{}{}}
}

// ServeHTTP upgrades every request and serves the connection until it ends.
func (h *hub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	if h.closing {
		h.mu.Unlock()
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	h.active.Add(1)
	h.mu.Unlock()
	defer h.active.Done()

	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return
	}
	ws.SetReadLimit(1 << 20)
	c := &conn{hub: h, ws: ws, wake: make(chan struct{}, 1)}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	h.mu.Lock()
	h.conns[c] = struct{}{}
	h.mu.Unlock()
	c.serve()
	h.mu.Lock()
	delete(h.conns, c)
	for _, t := range c.topics {
		delete(h.topics[t], c)
		if len(h.topics[t]) == 0 {
			delete(h.topics, t)
		}
	}
	h.mu.Unlock()
}

func (h *hub) subscribe(c *conn, topic string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	subs := h.topics[topic]
	if subs == nil {
		subs = map[*conn]struct{}{}
		h.topics[topic] = subs
	}
	if _, ok := subs[c]; !ok {
		subs[c] = struct{}{}
		c.topics = append(c.topics, topic)
	}
}

// publish queues payload for every subscriber of topic; it never blocks on
// a connection.
func (h *hub) publish(topic string, payload []byte) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	for c := range h.topics[topic] {
		c.queue(payload)
	}
}

// shutdown closes every connection with 1001 in parallel and waits for the
// handlers until ctx ends, then drops what is left.
func (h *hub) shutdown(ctx context.Context) {
	h.mu.Lock()
	h.closing = true
	conns := make([]*conn, 0, len(h.conns))
	for c := range h.conns {
		conns = append(conns, c)
	}
	h.mu.Unlock()
	var closing sync.WaitGroup
	for _, c := range conns {
		closing.Go(func() { c.ws.Close(websocket.StatusGoingAway, "shutting down") })
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
}

// conn is one WebSocket. Its reader is the handler goroutine; its writer
// goroutine drains the queue. queue never blocks.
type conn struct {
	hub    *hub
	ws     *websocket.Conn
	ctx    context.Context
	cancel context.CancelFunc
	wake   chan struct{} // cap 1
	topics []string      // touched by the reader only (under hub.mu)

	mu     sync.Mutex
	frames [][]byte
	queued int
	slow   bool
}

func (c *conn) serve() {
	var writer sync.WaitGroup
	writer.Go(c.write)
	defer func() {
		c.cancel()
		writer.Wait()
		c.ws.CloseNow()
	}()
	for {
		_, data, err := c.ws.Read(c.ctx)
		if err != nil {
			return
		}
		switch {
		case bytes.HasPrefix(data, []byte("pub ")):
			rest := data[4:]
			i := bytes.IndexByte(rest, ' ')
			if i <= 0 {
				continue
			}
			c.hub.publish(string(rest[:i]), rest[i+1:])
		case bytes.HasPrefix(data, []byte("sub ")):
			topic := string(data[4:])
			c.hub.subscribe(c, topic)
			c.queue([]byte("ok " + topic))
		}
	}
}

func (c *conn) queue(frame []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.slow {
		return
	}
	c.frames = append(c.frames, frame)
	c.queued += len(frame)
	if c.queued > c.hub.queueBytes {
		c.slow, c.frames, c.queued = true, nil, 0
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *conn) write() {
	defer c.cancel()
	var buf bytes.Buffer
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-c.wake:
		}
		c.mu.Lock()
		frames, slow := c.frames, c.slow
		c.frames, c.queued = nil, 0
		c.mu.Unlock()
		if slow {
			c.ws.Close(websocket.StatusTryAgainLater, "too slow")
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
			if err := c.ws.Write(c.ctx, websocket.MessageText, buf.Bytes()); err != nil {
				return
			}
		}
	}
}
