package apptest

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
)

// apiTransport is the transport of the tests' protocol clients. It holds
// every successful answer under /api to the status docs/protocol.md gives
// its route (the client takes any 2xx as success; these tests always
// required the exact one: 201 for a created thread, a started run, a
// saved fragment, a fork and a queued message, 202 for a cancel, 200 for the rest), and it
// adds header, headers the client has no option for (a __Host- session
// cookie over plain http, which a server with SecureCookies names so).
type apiTransport struct {
	t      testing.TB
	header http.Header
}

func (a apiTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if len(a.header) > 0 {
		req = req.Clone(req.Context())
		for k, v := range a.header {
			req.Header[k] = v
		}
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil && resp.StatusCode/100 == 2 && strings.HasPrefix(req.URL.Path, "/api/") {
		if want := apiStatus(req.Method, req.URL.Path); resp.StatusCode != want {
			a.t.Errorf("%s %s answered %d, want %d (docs/protocol.md)", req.Method, req.URL.Path, resp.StatusCode, want)
		}
	}
	return resp, err
}

// apiStatus is the status docs/protocol.md gives a successful answer of
// method path.
func apiStatus(method, path string) int {
	if method != http.MethodPost {
		return http.StatusOK
	}
	switch {
	case path == "/api/threads",
		strings.HasPrefix(path, "/api/threads/") && (strings.HasSuffix(path, "/runs") || strings.HasSuffix(path, "/fragments") || strings.HasSuffix(path, "/fork") ||
			strings.HasSuffix(path, "/queue")):
		return http.StatusCreated
	case strings.HasPrefix(path, "/api/runs/") && strings.HasSuffix(path, "/cancel"):
		return http.StatusAccepted
	}
	return http.StatusOK
}

// NewAPI is a protocol client of the gateway at base: each request
// bounded by timeout, its event streams and connections by their callers
// (no idle timer: a test may hold a stream it reads later), header added
// to every request, and every successful answer under /api held to the
// status docs/protocol.md gives its route (a different one fails the
// test). It is closed when the test ends.
func NewAPI(t testing.TB, base string, timeout time.Duration, header http.Header, opts ...client.Option) *client.Client {
	t.Helper()
	hc := &http.Client{Timeout: timeout, Transport: apiTransport{t: t, header: header}}
	c, err := client.New(base, append([]client.Option{client.WithHTTPClient(hc), client.WithIdleTimeout(-1)}, opts...)...)
	if err != nil {
		t.Fatalf("protocol client of %s: %v", base, err)
	}
	t.Cleanup(c.Close)
	return c
}

// API is the Server's protocol client (NewAPI, made by Start), without
// credentials; safe for concurrent use.
func (s *Server) API() *client.Client { return s.api }

// As is the Server seen through a protocol client with opts (a
// credential: client.WithBearerToken, WithSessionCookie, WithProxyUser)
// and header added to every request: its typed calls (Snapshot,
// StartRun, Threads, Connect, …) are made with them. It shares the
// Server's App; stopping either stops it.
func (s *Server) As(header http.Header, opts ...client.Option) *Server {
	c := *s
	c.api = NewAPI(s.T, s.Base, 15*time.Second, header, opts...)
	return &c
}

// Refusal is the server's refusal err holds (*client.Error), or nil: err
// is none, or no answer came.
func Refusal(err error) *client.Error {
	var e *client.Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// RefusedStatus is the HTTP status of the server's refusal err holds (0:
// none).
func RefusedStatus(err error) int {
	if e := Refusal(err); e != nil {
		return e.Status
	}
	return 0
}

// answer is what call (a method of the Server's protocol client) answers
// for arg; any error stops the test, saying what was asked.
func answer[A, T any](s *Server, what string, call func(context.Context, A) (T, error), arg A) T {
	s.T.Helper()
	v, err := call(context.Background(), arg)
	if err != nil {
		s.T.Fatalf("%s: %v", what, err)
	}
	return v
}

// Snapshot is GET /api/threads/ID.
func (s *Server) Snapshot(threadID string) chat.Snapshot {
	s.T.Helper()
	return answer(s, "GET /api/threads/"+threadID, s.API().Thread, threadID)
}

// Run is GET /api/runs/ID.
func (s *Server) Run(runID string) chat.Run {
	s.T.Helper()
	return answer(s, "GET /api/runs/"+runID, s.API().Run, runID)
}

// CreateThread creates an untitled thread (NewThread).
func (s *Server) CreateThread() chat.Snapshot {
	s.T.Helper()
	return s.NewThread("")
}

// NewThread creates a thread titled title ("": none) and requires a new
// thread's snapshot: a thr_ id, state_version 1, a checkpoint, no
// message.
func (s *Server) NewThread(title string) chat.Snapshot {
	s.T.Helper()
	snap := answer(s, "POST /api/threads", s.API().CreateThread, title)
	if !strings.HasPrefix(snap.ThreadID, "thr_") {
		s.T.Fatalf("new thread id %q does not start with thr_", snap.ThreadID)
	}
	if snap.StateVersion != 1 || snap.HeadCheckpointID == "" || len(snap.Messages) != 0 {
		s.T.Fatalf("new thread: state_version %d, head %q, %d messages; want 1, a checkpoint, none",
			snap.StateVersion, snap.HeadCheckpointID, len(snap.Messages))
	}
	return snap
}

// StartRun starts a run with text at the thread's version expected (text
// "": continue from the saved point).
func (s *Server) StartRun(threadID string, expected int64, text string) chat.RunStartAck {
	s.T.Helper()
	return answer(s, "POST /api/threads/"+threadID+"/runs", s.API().StartRun,
		client.StartRunRequest{ThreadID: threadID, ExpectedStateVersion: expected, UserMessage: text})
}

// CancelRun requests a run's cancel (an empty body).
func (s *Server) CancelRun(runID string) chat.CancelAck {
	s.T.Helper()
	return answer(s, "POST /api/runs/"+runID+"/cancel", s.API().CancelRun, client.CancelRunRequest{RunID: runID})
}

// Threads is the first page of GET /api/threads.
func (s *Server) Threads() []chat.Thread {
	s.T.Helper()
	return answer(s, "GET /api/threads", s.API().ListThreads, client.ListThreadsOptions{}).Threads
}

// Connect opens a WebSocket connection with the protocol client, says
// hello (tab id "auth-test") and requires its ack; it is closed when the
// test ends.
func (s *Server) Connect(why string) *client.Conn {
	s.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := s.API().Connect(ctx, client.ConnOptions{TabID: "auth-test"})
	if err != nil {
		s.T.Fatalf("%s: /ws refused: %v", why, err)
	}
	s.T.Cleanup(func() { conn.Close() })
	return conn
}

// IsEnd reports whether ev ends run runID (completed, failed, cancelled).
func IsEnd(runID string) func(client.Event) bool {
	return func(ev client.Event) bool {
		return ev.RunID == runID && (ev.Type == chat.EventRunCompleted || ev.Type == chat.EventRunFailed || ev.Type == chat.EventRunCancelled)
	}
}
