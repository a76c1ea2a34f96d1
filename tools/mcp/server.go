// Package mcp offers the tools of Model Context Protocol servers to the
// engine under the gateway's contracts (see package tools).
//
// A Server is one configured MCP server: it owns the session to it (stdio:
// a child process; Streamable HTTP: a URL), reconnects with backoff when
// the session drops, and lists the server's tools at each connection and
// whenever the server says they changed. Each
// tool is offered as "<server>__<tool>" with a contract taken from the
// configuration or, failing that, from the tool's annotations (hints the
// server gives, not trusted by default; see ContractFor).
//
// Cancel: a call runs on the context the engine gives it. When that
// context ends, the SDK sends notifications/cancelled for the request and
// the call returns at once; the server may or may not stop. A
// consequential call is sent at most once per key (tools.Committer
// without tools.Resender): an MCP server is not known to deduplicate, so
// a call whose answer was lost stays unknown rather than being sent again.
//
// A Server is safe for concurrent use. Run owns the connection loop and
// returns when its context ends; Close ends the session.
package mcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os/exec"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/tools"
)

// IdempotencyKeyMeta is the name, in a tools/call request's _meta, of the
// business idempotency key of a consequential call, for servers that
// deduplicate by it.
const IdempotencyKeyMeta = "io.honestcancel/idempotency-key"

// backoff bounds the waits between reconnect attempts.
const (
	minBackoff = 500 * time.Millisecond
	maxBackoff = 30 * time.Second
)

// State is what a Server can say about its session, for /readyz and the
// logs.
type State struct {
	Name      string    `json:"name"`
	Connected bool      `json:"connected"`
	Tools     int       `json:"tools"`
	Error     string    `json:"error,omitempty"` // the last failure, while not connected
	Since     time.Time `json:"since"`           // when Connected last changed
}

// Server is one configured MCP server and its current session.
type Server struct {
	cfg    ServerConfig
	log    *slog.Logger
	client *mcp.Client

	mu       sync.Mutex
	session  *mcp.ClientSession // nil while not connected
	tools    []tools.Tool       // from the first session that listed them
	state    State
	progress map[string]func(chat.ToolProgress) // by progress token (the call's key)
	// listChanged is signalled when the server says its tool list
	// changed; Run lists the tools again.
	listChanged chan struct{}
	// sent holds every key a consequential call of this server sent, for
	// the life of the process (one entry per confirmed call), whichever
	// listing's tool sent it.
	sent map[string]bool
}

// NewServer returns the server of cfg, not connected yet (see Run and
// Connect).
func NewServer(cfg ServerConfig, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: log.With("mcp_server", cfg.Name), progress: map[string]func(chat.ToolProgress){}, listChanged: make(chan struct{}, 1), sent: map[string]bool{}}
	s.state = State{Name: cfg.Name, Error: "not connected yet", Since: time.Now()}
	s.client = mcp.NewClient(&mcp.Implementation{Name: "honestcancel-gateway", Version: "1"}, &mcp.ClientOptions{
		Logger:                      s.log,
		ProgressNotificationHandler: s.onProgress,
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case s.listChanged <- struct{}{}:
			default: // a listing is due already
			}
		},
	})
	return s
}

// Name is the server's configured name.
func (s *Server) Name() string { return s.cfg.Name }

// State reports the session's state.
func (s *Server) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// Tools returns the server's tools as last listed (nil before a session
// listed them): at each connection, and when the server says its list
// changed. While the server is down, its last tools stay offered, and a
// call to one fails at once, sending nothing.
func (s *Server) Tools() []tools.Tool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tools
}

// Connect opens a session and lists the tools, once. Run calls it again
// whenever the session drops.
func (s *Server) Connect(ctx context.Context) error {
	transport, err := s.transport()
	if err != nil {
		return s.failed(err)
	}
	cctx, stop := context.WithTimeout(ctx, s.cfg.timeout())
	defer stop()
	cs, err := s.client.Connect(cctx, transport, nil)
	if err != nil {
		return s.failed(fmt.Errorf("connect: %w", err))
	}
	offered, err := s.list(cctx, cs)
	if err != nil {
		cs.Close()
		return s.failed(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tools = offered
	s.session = cs
	s.state = State{Name: s.cfg.Name, Connected: true, Tools: len(s.tools), Since: time.Now()}
	s.log.Info("MCP server connected", "tools", len(offered))
	return nil
}

// list lists the tools of cs and adapts them (see adapt).
func (s *Server) list(ctx context.Context, cs *mcp.ClientSession) ([]tools.Tool, error) {
	var listed []*mcp.Tool
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return nil, fmt.Errorf("list tools: %w", err)
		}
		listed = append(listed, t)
	}
	return s.adapt(listed), nil
}

// relist lists the tools again after the server said they changed; on
// failure the tools stay as they were, and the failure is logged.
func (s *Server) relist(ctx context.Context, cs *mcp.ClientSession) {
	lctx, stop := context.WithTimeout(ctx, s.cfg.timeout())
	defer stop()
	offered, err := s.list(lctx, cs)
	if err != nil {
		s.log.Warn("MCP server's tools changed, but listing them again failed; the previous ones stay offered", "err", err)
		return
	}
	s.mu.Lock()
	if s.session == cs {
		s.tools, s.state.Tools = offered, len(offered)
	}
	s.mu.Unlock()
	s.log.Info("MCP server's tools changed", "tools", len(offered))
}

// failed records err as the reason the server is not connected.
func (s *Server) failed(err error) error {
	s.mu.Lock()
	if s.state.Connected {
		s.state.Since = time.Now()
	}
	s.state.Connected, s.state.Error = false, err.Error()
	s.mu.Unlock()
	return fmt.Errorf("MCP server %s: %w", s.cfg.Name, err)
}

// Run keeps the server connected until ctx ends: it connects, lists the
// tools again whenever the server says they changed, waits for the
// session to end, and reconnects with backoff (doubling from 0.5 s to
// 30 s, reset by a session that lived a minute). It closes the session
// before it returns.
func (s *Server) Run(ctx context.Context) {
	wait := minBackoff
	for ctx.Err() == nil {
		s.mu.Lock()
		cs := s.session
		s.mu.Unlock()
		if cs == nil {
			if err := s.Connect(ctx); err != nil {
				if ctx.Err() == nil {
					s.log.Warn("MCP server unavailable; retrying", "err", err, "retry_in", wait)
				}
				select {
				case <-ctx.Done():
				case <-time.After(wait):
				}
				wait = min(2*wait, maxBackoff)
				continue
			}
			s.mu.Lock()
			cs = s.session
			s.mu.Unlock()
		}
		began := time.Now()
		ended := make(chan error, 1)
		go func() { ended <- cs.Wait() }()
	session:
		for {
			select {
			case <-ctx.Done():
				s.Close()
				<-ended
				return
			case <-s.listChanged:
				s.relist(ctx, cs)
			case err := <-ended:
				if err == nil {
					err = errors.New("the session ended")
				}
				s.dropped(cs, err)
				if time.Since(began) > time.Minute {
					wait = minBackoff
				}
				break session
			}
		}
	}
}

// dropped forgets cs, which ended with err.
func (s *Server) dropped(cs *mcp.ClientSession, err error) {
	s.mu.Lock()
	if s.session == cs {
		s.session = nil
	}
	s.mu.Unlock()
	s.failed(fmt.Errorf("session dropped: %w", err))
	s.log.Warn("MCP server session dropped", "err", err)
}

// Close ends the current session, if any.
func (s *Server) Close() error {
	s.mu.Lock()
	cs := s.session
	s.session = nil
	s.mu.Unlock()
	if cs == nil {
		return nil
	}
	s.failed(errors.New("closed"))
	return cs.Close()
}

// current returns the live session, or an error saying that none is.
func (s *Server) current() (*mcp.ClientSession, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.session == nil {
		return nil, &NotConnectedError{Server: s.cfg.Name, Reason: s.state.Error}
	}
	return s.session, nil
}

// transport builds the transport of the configuration.
func (s *Server) transport() (mcp.Transport, error) {
	if s.cfg.URL != "" {
		headers, err := s.cfg.headers()
		if err != nil {
			return nil, err
		}
		return &mcp.StreamableClientTransport{
			Endpoint:   s.cfg.URL,
			HTTPClient: &http.Client{Transport: headerTransport{headers: headers, next: http.DefaultTransport}},
			MaxRetries: -1, // Run reconnects; a call never silently resends
		}, nil
	}
	env, err := s.cfg.environment()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(s.cfg.Command, s.cfg.Args...)
	cmd.Env = env
	cmd.Stderr = &logWriter{log: s.log}
	// Wait returns this long after the process exited even if a child of
	// it still holds its stderr open, so a Close never hangs on one.
	cmd.WaitDelay = 2 * time.Second
	return &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}, nil
}

// onProgress hands a progress notification to the call it is about.
func (s *Server) onProgress(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
	token, _ := req.Params.ProgressToken.(string)
	s.mu.Lock()
	f := s.progress[token]
	s.mu.Unlock()
	if f != nil {
		f(chat.ToolProgress{Progress: req.Params.Progress, Total: req.Params.Total, Message: req.Params.Message})
	}
}

// markSent records that key is being sent, and reports false when it was
// sent before (then it must not be sent again).
func (s *Server) markSent(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sent[key] {
		return false
	}
	s.sent[key] = true
	return true
}

// unmarkSent forgets key, whose call never left the gateway.
func (s *Server) unmarkSent(key string) {
	s.mu.Lock()
	delete(s.sent, key)
	s.mu.Unlock()
}

// watchProgress routes the progress notifications of token to f until the
// returned func is called.
func (s *Server) watchProgress(token string, f func(chat.ToolProgress)) (stop func()) {
	if f == nil {
		return func() {}
	}
	s.mu.Lock()
	s.progress[token] = f
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.progress, token)
		s.mu.Unlock()
	}
}

// headerTransport adds the configured headers to every request.
type headerTransport struct {
	headers http.Header
	next    http.RoundTripper
}

func (t headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, vs := range t.headers {
		r.Header[k] = vs
	}
	return t.next.RoundTrip(r)
}

// logWriter logs a child process's stderr, a line at a time at most 4 KiB.
type logWriter struct {
	log *slog.Logger
}

func (w *logWriter) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) > 4096 {
		p = p[:4096]
	}
	w.log.Debug("MCP server stderr", "text", string(p))
	return n, nil
}

// NotConnectedError is the error of a call made while the server has no
// session: nothing was sent.
type NotConnectedError struct {
	Server string
	Reason string // why it is not connected
}

func (e *NotConnectedError) Error() string {
	return fmt.Sprintf("MCP server %s is not connected (%s); nothing was sent", e.Server, e.Reason)
}
