// Package gateway is the network edge: the JSON HTTP API under /api, the
// Server-Sent Events stream of a thread, and health endpoints. It decodes
// and validates requests, calls the store and the engine through the small
// interfaces declared here, and maps every error to the protocol's one
// error shape in one place (errors.go).
package gateway

import (
	"context"
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
	ListThreads(ctx context.Context, userID string, limit int, cursor string) ([]chat.Thread, string, error)
	Snapshot(ctx context.Context, userID, threadID string) (chat.Snapshot, error)
	Run(ctx context.Context, userID, runID string) (chat.Run, error)
	Checkpoints(ctx context.Context, userID, threadID string) (string, []chat.Checkpoint, error)
	Operations(ctx context.Context, userID, threadID string) ([]chat.Operation, error)
	Fork(ctx context.Context, userID, threadID, fromCheckpointID string) (chat.Thread, error)
	SaveFragment(ctx context.Context, p chat.SaveFragment) (chat.FragmentSaved, error)
	DeleteDraft(ctx context.Context, userID, threadID, messageID string, expected int64) (chat.DraftDeleted, error)
	Events(ctx context.Context, userID, threadID string, afterSeq int64) (chat.Replay, error)
}

// Runs starts and cancels runs (the engine).
type Runs interface {
	StartRun(ctx context.Context, p chat.StartRun) (chat.RunStartAck, error)
	CancelRun(ctx context.Context, p chat.CancelRun) (chat.CancelAck, error)
	DecideOperation(ctx context.Context, userID, opID string, expected int64, confirm bool) (chat.ConfirmAck, error)
}

// Subscription delivers one thread's committed events in seq order until it
// ends; Err says why the feed ended it (nil when closed by its owner).
type Subscription interface {
	Events() <-chan *chat.Event
	Err() error
	Close()
}

// Subscribe starts a channel subscription to a thread's live events (SSE).
type Subscribe func(threadID string, buffer int) Subscription

// Feed delivers a thread's live events to sinks (WebSocket connections).
type Feed interface {
	Add(threadID string, sink chat.EventSink)
	Remove(threadID string, sink chat.EventSink)
}

// Config wires a Server.
type Config struct {
	Store     Store
	Runs      Runs
	Subscribe Subscribe
	Feed      Feed
	Log       *slog.Logger
	// KeepAlive is the SSE comment interval (default 15s).
	KeepAlive time.Duration
	// WebSocket settings; zero values take the defaults of WSConfig.
	WS WSConfig
}

// Server serves the API. It holds no per-request state; it is safe for
// concurrent use.
type Server struct {
	store     Store
	runs      Runs
	subscribe Subscribe
	feed      Feed
	log       *slog.Logger
	keepAlive time.Duration
	ready     atomic.Bool
	ws        *wsHub
}

// New returns a Server; it answers /readyz 503 until SetReady(true).
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = 15 * time.Second
	}
	s := &Server{store: cfg.Store, runs: cfg.Runs, subscribe: cfg.Subscribe, feed: cfg.Feed, log: cfg.Log, keepAlive: cfg.KeepAlive}
	s.ws = newWSHub(s, cfg.WS.withDefaults())
	return s
}

// SetReady switches /readyz between 200 and 503.
func (s *Server) SetReady(ready bool) { s.ready.Store(ready) }

// Routes registers every route on mux.
func (s *Server) Routes(mux *http.ServeMux) {
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.HandleFunc("GET /ws", s.ws.serve)

	mux.Handle("POST /api/threads", s.guard(s.createThread))
	mux.HandleFunc("GET /api/threads", s.listThreads)
	mux.HandleFunc("GET /api/threads/{id}", s.getThread)
	mux.Handle("POST /api/threads/{id}/runs", s.guard(s.startRun))
	mux.HandleFunc("GET /api/runs/{id}", s.getRun)
	mux.Handle("POST /api/runs/{id}/cancel", s.guard(s.cancelRun))
	mux.Handle("POST /api/threads/{id}/fragments", s.guard(s.saveFragment))
	mux.Handle("POST /api/threads/{id}/drafts/{message_id}/delete", s.guard(s.deleteDraft))
	mux.Handle("POST /api/threads/{id}/fork", s.guard(s.fork))
	mux.HandleFunc("GET /api/threads/{id}/operations", s.listOperations)
	mux.Handle("POST /api/operations/{id}/confirm", s.guard(s.decide(true)))
	mux.Handle("POST /api/operations/{id}/reject", s.guard(s.decide(false)))
	mux.HandleFunc("GET /api/threads/{id}/checkpoints", s.listCheckpoints)
	mux.HandleFunc("GET /api/threads/{id}/events", s.events)
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, s.log, chat.Errorf(chat.CodeNotFound, "no API endpoint %s %s: see the README's API section", r.Method, r.URL.Path))
	})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if !s.ready.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "starting"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// guard refuses state-changing requests that a browser sends from another
// site (cross-site request forgery): Go's CrossOriginProtection, answering
// in the protocol's error shape. Programs (no Origin or Sec-Fetch-Site
// header) and same-origin pages pass.
func (s *Server) guard(h http.HandlerFunc) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, s.log, chat.Errorf(chat.CodeForbidden, "cross-origin request refused: send it from this server's own pages, or from a program without an Origin header"))
	}))
	return cop.Handler(h)
}

// userID is the caller. Until accounts exist everything belongs to the one
// local user.
func userID(*http.Request) string { return chat.LocalUserID }
