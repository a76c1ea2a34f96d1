// Package gateway is the network edge: the JSON HTTP API under /api, the
// WebSocket at /ws (wshub.go, wsconn.go, wscommands.go), the Server-Sent
// Events stream of a thread, OpenAI's Responses API under /v1 over the same
// runs (responses*.go), and health endpoints. It decodes
// and validates requests, calls the store and the engine through the small
// interfaces declared here, and maps every error to the protocol's one
// error shape in one place (errors.go).
package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// Store is the persistence the API reads from and the commands that need no
// worker. Every method checks ownership: another user's id is not_found.
type Store interface {
	CreateThread(ctx context.Context, userID, title string) (chat.Snapshot, error)
	ListThreads(ctx context.Context, userID string, limit int, cursor, search string) ([]chat.Thread, string, error)
	Snapshot(ctx context.Context, userID, threadID string) (chat.Snapshot, error)
	// History is a page of the head's history before the message before
	// ("": the latest), oldest first (store.History).
	History(ctx context.Context, userID, threadID, before string, limit int, maxBytes int64) (chat.HistoryPage, error)
	Run(ctx context.Context, userID, runID string) (chat.Run, error)
	// MessagesByID is messages of the thread on any branch, by id
	// (…/messages?ids=, store.MessagesByID).
	MessagesByID(ctx context.Context, userID, threadID string, ids []string, maxBytes int64) ([]chat.Message, error)
	Checkpoints(ctx context.Context, userID, threadID string) (string, []chat.Checkpoint, error)
	// CheckpointDeltas is Checkpoints with each checkpoint's lists told as
	// what they change from its parent's (…/checkpoints?lists=delta).
	CheckpointDeltas(ctx context.Context, userID, threadID string) (string, []chat.CheckpointDelta, error)
	Operations(ctx context.Context, userID, threadID string) ([]chat.Operation, error)
	Fork(ctx context.Context, p chat.Fork) (chat.Thread, error)
	Checkout(ctx context.Context, p chat.Checkout) (chat.CheckoutAck, error)
	SaveFragment(ctx context.Context, p chat.SaveFragment) (chat.FragmentSaved, error)
	StreamedText(ctx context.Context, q chat.StreamedTextQuery) (chat.StreamedText, error)
	DeleteDraft(ctx context.Context, p chat.DeleteDraft) (chat.DraftDeleted, error)
	Events(ctx context.Context, userID, threadID string, afterSeq int64) (chat.Replay, error)
	// Response is a run as a response of the OpenAI Responses API
	// (responses.go, store.Response).
	Response(ctx context.Context, userID, runID string) (chat.Response, error)
}

// Runs starts and cancels runs (the engine).
type Runs interface {
	StartRun(ctx context.Context, p chat.StartRun) (chat.RunStartAck, error)
	CancelRun(ctx context.Context, p chat.CancelRun) (chat.CancelAck, error)
	DecideOperation(ctx context.Context, p chat.Decide) (chat.ConfirmAck, error)
	// DeleteThread cancels the thread's run in flight, if any, then
	// deletes the thread.
	DeleteThread(ctx context.Context, p chat.DeleteThread) (chat.ThreadDeletedAck, error)
	// The message queue's commands (queue.go).
	Queue
}

// Feed delivers a thread's live events to sinks (WebSocket connections
// and event streams). A sink that is also bus.LossAware is told when
// events of a thread are lost for good.
type Feed interface {
	Add(threadID string, sink chat.EventSink)
	Remove(threadID string, sink chat.EventSink)
}

// RecentFeed is a Feed that also keeps the events it delivered lately
// (bus.NATS): with several instances, the one streaming a thread writes
// its deltas after it fans them out, so the event log of another instance
// can end before what that instance's tabs were already given. A
// subscriber joining there is caught up from both.
type RecentFeed interface {
	Feed
	// Recent returns the delivered events after seq after, and whether it
	// holds every one of them.
	Recent(threadID string, after int64) ([]*chat.Event, bool)
	// Reach waits, until ctx ends, for the feed to have delivered the
	// thread up to seq (a subscriber may have seen it on another
	// instance first), and reports whether it has.
	Reach(ctx context.Context, threadID string, seq int64) bool
}

// Authenticator tells who is calling (package auth).
type Authenticator interface {
	// Authenticate returns the caller, or an unauthorized, forbidden or
	// rate_limited *chat.Error saying how to get in.
	Authenticate(r *http.Request) (chat.Principal, error)
	// Revalidate reports whether a connection's credential still holds,
	// asking the store (the keep-alive re-check).
	Revalidate(ctx context.Context, p chat.Principal) error
	// RevalidateCached is Revalidate that may answer from a recent
	// positive answer (auth.Config.CredentialCache): the check before
	// every WebSocket command.
	RevalidateCached(ctx context.Context, p chat.Principal) error
}

// Config wires a Server.
type Config struct {
	// Auth authenticates every /api and /ws request; nil serves everyone
	// as the one local user (auth mode none).
	Auth  Authenticator
	Store Store
	Runs  Runs
	Feed  Feed
	Log   *slog.Logger
	// KeepAlive is the SSE comment interval (default 15s).
	KeepAlive time.Duration
	// WebSocket and event stream settings; zero values take the defaults
	// of WSConfig.
	WS WSConfig
	// Metrics records connections, frames, slow consumers, refusals and
	// cancel ack latency (nil: nothing is recorded).
	Metrics Metrics
	// ToolServers reports the tool servers (MCP) the gateway calls, for
	// /readyz (nil: none). One that is down does not make the gateway
	// unready: every instance shares it, and its tools fail clearly.
	// /readyz lists them only to a request that names an allowed Host
	// (AllowedHost): a load balancer probing by address, or anyone else
	// sending a foreign Host, is told the status alone.
	ToolServers func() []ToolServer
	// Admission reports the engine's capacity, runs executing and runs
	// waiting for a slot, for /readyz (nil: not shown).
	Admission func() chat.Admission
	// Model is the name of the model the engine serves ("demo", or the
	// -openai-model name): what GET /v1/models lists and the one model
	// POST /v1/responses accepts ("": none, every model is refused).
	Model string
}

// ToolServer is what /readyz tells of one tool server: its name, whether
// it is connected, how many tools it offers and since when its connection
// state holds. Why it is down is in the logs, not here: /readyz answers
// whoever can name the server.
type ToolServer struct {
	Name      string    `json:"name"`
	Connected bool      `json:"connected"`
	Tools     int       `json:"tools"`
	Since     time.Time `json:"since"`
}

// Server serves the API. It holds no per-request state; its shared state
// is the WebSocket hub and the per-user limits (limits.go), each guarded by
// its own lock. It is safe for concurrent use.
type Server struct {
	auth      Authenticator
	store     Store
	runs      Runs
	feed      Feed
	log       *slog.Logger
	keepAlive time.Duration
	servers   func() []ToolServer
	admission func() chat.Admission
	phase     atomic.Uint32 // what /readyz answers: starting, then ready (SetReady), then stopping (SetStopping)
	ws        *wsHub
	limits    *userLimits
	metrics   Metrics
	model     string    // Config.Model
	started   time.Time // when New ran: the served model's created time
}

// New returns a Server; it answers /readyz 503 "starting" until SetReady.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = 15 * time.Second
	}
	if cfg.Auth == nil {
		cfg.Auth = localAuth{}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = noMetrics{}
	}
	s := &Server{auth: cfg.Auth, store: cfg.Store, runs: cfg.Runs, feed: cfg.Feed, log: cfg.Log, keepAlive: cfg.KeepAlive, metrics: cfg.Metrics, servers: cfg.ToolServers, admission: cfg.Admission,
		model: cfg.Model, started: time.Now()}
	ws := cfg.WS.withDefaults()
	s.limits = newUserLimits(ws)
	s.ws = newWSHub(s, ws)
	return s
}

// The phases /readyz reports (Server.phase).
const (
	phaseStarting uint32 = iota
	phaseReady
	phaseStopping
)

// SetReady makes /readyz answer 200: the server takes requests.
func (s *Server) SetReady() { s.phase.Store(phaseReady) }

// SetStopping makes /readyz answer 503 "stopping" from now on: the server
// drains before it stops, and a balancer should send nothing new here.
func (s *Server) SetStopping() { s.phase.Store(phaseStopping) }

// Routes registers every route on mux.
func (s *Server) Routes(mux *http.ServeMux) {
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.Handle("GET /ws", s.authed(s.ws.serve))

	// State-changing requests: cross-site ones refused, then charged to
	// the user's command budget (a cancel to its own reserve, see
	// WSConfig.CancelRate) before anything of them is read.
	changing := func(h http.HandlerFunc) http.Handler { return s.authed(s.guard(s.limited(false, h))) }
	mux.Handle("POST /api/threads", changing(s.createThread))
	mux.Handle("GET /api/threads", s.authed(s.listThreads))
	mux.Handle("GET /api/threads/{id}", s.authed(s.getThread))
	mux.Handle("DELETE /api/threads/{id}", changing(s.deleteThread))
	mux.Handle("POST /api/threads/{id}/runs", changing(s.startRun))
	mux.Handle("GET /api/runs/{id}", s.authed(s.getRun))
	mux.Handle("POST /api/runs/{id}/cancel", s.timedCancel(s.authed(s.guard(s.limited(true, s.cancelRun)))))
	mux.Handle("POST /api/threads/{id}/fragments", changing(s.saveFragment))
	// A read that runs on the writer (it writes what memory holds first):
	// charged like a command.
	mux.Handle("GET /api/threads/{id}/streamed/{message_id}", s.authed(s.limited(false, s.streamedText)))
	mux.Handle("POST /api/threads/{id}/drafts/{message_id}/delete", changing(s.deleteDraft))
	mux.Handle("POST /api/threads/{id}/fork", changing(s.fork))
	mux.Handle("POST /api/threads/{id}/queue", changing(s.queueAdd))
	mux.Handle("POST /api/threads/{id}/queue/resume", changing(s.queueResume))
	mux.Handle("PATCH /api/threads/{id}/queue/{item_id}", changing(s.queueUpdate))
	mux.Handle("DELETE /api/threads/{id}/queue/{item_id}", changing(s.queueRemove))
	mux.Handle("POST /api/threads/{id}/head", changing(s.checkout))
	mux.Handle("GET /api/threads/{id}/operations", s.authed(s.listOperations))
	mux.Handle("POST /api/operations/{id}/confirm", changing(s.decide(true)))
	mux.Handle("POST /api/operations/{id}/reject", changing(s.decide(false)))
	mux.Handle("GET /api/threads/{id}/checkpoints", s.authed(s.listCheckpoints))
	mux.Handle("GET /api/threads/{id}/messages", s.authed(s.listMessages))
	mux.Handle("GET /api/threads/{id}/events", s.authed(s.events))
	mux.Handle("/api/", s.authed(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, s.log, chat.Errorf(chat.CodeNotFound, "no API endpoint %s %s: see docs/http-api.md", r.Method, r.URL.Path))
	}))
	s.openAIRoutes(mux) // /v1: the OpenAI Responses API (responses.go)
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	switch s.phase.Load() {
	case phaseStarting:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "starting"})
		return
	case phaseStopping:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "stopping"})
		return
	}
	var servers []ToolServer
	var admission *chat.Admission
	if AllowedHost(r) {
		if s.servers != nil {
			servers = s.servers()
		}
		if s.admission != nil {
			a := s.admission()
			admission = &a
		}
	}
	writeJSON(w, http.StatusOK, struct {
		Status      string          `json:"status"`
		ToolServers []ToolServer    `json:"tool_servers,omitempty"`
		Admission   *chat.Admission `json:"admission,omitempty"`
	}{"ready", servers, admission})
}

// guard refuses state-changing requests that a browser sends from another
// site (cross-site request forgery): Go's CrossOriginProtection, answering
// in the protocol's error shape. Programs (no Origin or Sec-Fetch-Site
// header) and same-origin pages pass.
func (s *Server) guard(h http.HandlerFunc) http.HandlerFunc { return s.guardAs(writeError, h) }

// guardAs is guard answering its refusal with write.
func (s *Server) guardAs(write errorWriter, h http.HandlerFunc) http.HandlerFunc {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		write(w, s.log, chat.Errorf(chat.CodeForbidden, "cross-origin request refused: send it from this server's own pages, or from a program without an Origin header"))
	}))
	return cop.Handler(h).ServeHTTP
}

// authed runs h for authenticated callers only, with the caller in the
// request's context; everybody else gets the authenticator's error (401,
// 403 or 429) and nothing runs.
func (s *Server) authed(h http.HandlerFunc) http.Handler { return s.authedAs(writeError, h) }

// authedAs is authed answering its refusal with write.
func (s *Server) authedAs(write errorWriter, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := s.auth.Authenticate(r)
		if err == nil && p.UserID == "" {
			err = errors.New("authenticator returned a caller without a user id")
		}
		if err != nil {
			write(w, s.log, err)
			return
		}
		h.ServeHTTP(w, r.WithContext(chat.NewContextWithPrincipal(r.Context(), p)))
	})
}

// userID is the authenticated caller ("" if authed did not run, which the
// store answers with not_found).
func userID(r *http.Request) string { return chat.UserIDFromContext(r.Context()) }

// localAuth is auth mode none: everyone is the one local user.
type localAuth struct{}

func (localAuth) Authenticate(*http.Request) (chat.Principal, error) {
	return chat.LocalPrincipal(), nil
}

func (localAuth) Revalidate(context.Context, chat.Principal) error       { return nil }
func (localAuth) RevalidateCached(context.Context, chat.Principal) error { return nil }
