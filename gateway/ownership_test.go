package gateway_test

// Ownership (issue #8): with accounts, everything a user creates is theirs
// alone. Another authenticated user naming any of it — on every HTTP route,
// the event stream and every WebSocket command — gets not_found, exactly as
// for an id that never existed, and nothing changes; callers without valid
// credentials get 401 before anything runs; and a page of another site
// cannot drive a signed-in user's browser.
//
// The routes and commands are not listed by hand only: they are read from
// the package's source (every mux.Handle / HandleFunc pattern, every case
// of the WebSocket dispatch), so a route or command added later without an
// ownership case here fails TestOwnershipCoversEveryRouteAndCommand.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/auth"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/gateway"
	"github.com/honestcancel/gateway/store"
	"github.com/honestcancel/gateway/tools/email"
)

// ---- what the package registers ----

// Route kinds: how the ownership tests cover a registered pattern.
const (
	routePublic    = "public"    // health: no credentials, no user data
	routeWebSocket = "websocket" // GET /ws: its commands are probed one by one
	routeCreate    = "create"    // makes a thread of the caller; names no id
	routeList      = "list"      // the caller's threads only
	routeIDs       = "ids"       // names ids: probed with another user's
)

// routeCoverage is every pattern gateway.Server.Routes registers. It must
// equal what the source registers (registeredRoutes); a new pattern needs
// an entry here and a case in sampleRequest (and, for routeIDs, probes in
// ownershipProbes).
var routeCoverage = map[string]string{
	"GET /livez":  routePublic,
	"GET /readyz": routePublic,
	"GET /ws":     routeWebSocket,

	"POST /api/threads":                                 routeCreate,
	"GET /api/threads":                                  routeList,
	"GET /api/threads/{id}":                             routeIDs,
	"POST /api/threads/{id}/runs":                       routeIDs,
	"GET /api/runs/{id}":                                routeIDs,
	"POST /api/runs/{id}/cancel":                        routeIDs,
	"POST /api/threads/{id}/fragments":                  routeIDs,
	"GET /api/threads/{id}/streamed/{message_id}":       routeIDs,
	"POST /api/threads/{id}/drafts/{message_id}/delete": routeIDs,
	"POST /api/threads/{id}/fork":                       routeIDs,
	"GET /api/threads/{id}/operations":                  routeIDs,
	"POST /api/operations/{id}/confirm":                 routeIDs,
	"POST /api/operations/{id}/reject":                  routeIDs,
	"GET /api/threads/{id}/checkpoints":                 routeIDs,
	"GET /api/threads/{id}/messages":                    routeIDs,
	"POST /api/threads/{id}/head":                       routeIDs,
	"DELETE /api/threads/{id}":                          routeIDs,
	"GET /api/threads/{id}/events":                      routeIDs,
	"/api/":                                             routeIDs, // unknown endpoints: not_found, ids in the path or not
}

// wsCoverage is every command the WebSocket dispatch understands. It must
// equal registeredCommands; every command but hello needs probes.
var wsCoverage = map[string]string{
	"hello":           "names no id",
	"subscribe":       "thread",
	"unsubscribe":     "thread (acknowledged whatever the id: it only stops this connection's own feed)",
	"run.start":       "thread, checkpoint",
	"run.cancel":      "run",
	"fragment.save":   "thread, streamed message",
	"draft.delete":    "thread, message",
	"thread.fork":     "thread, checkpoint",
	"thread.checkout": "thread, checkpoint",
	"thread.delete":   "thread",
	"tool.confirm":    "operation",
	"tool.reject":     "operation",
}

// packageFiles parses the gateway package's non-test sources.
func packageFiles(t *testing.T) (*token.FileSet, []*ast.File) {
	t.Helper()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatalf("parse %s: %v", name, err)
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		t.Fatal("no gateway sources found: run the test from the package folder")
	}
	return fset, files
}

// registeredRoutes lists the pattern of every X.Handle / X.HandleFunc call
// in the package. A pattern that is not a string literal cannot be checked
// and fails the test.
func registeredRoutes(t *testing.T) []string {
	t.Helper()
	fset, files := packageFiles(t)
	var out []string
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 2 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "Handle" && sel.Sel.Name != "HandleFunc") {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				t.Errorf("%s: a route with a computed pattern: the ownership tests cannot see it; register it with a literal", fset.Position(call.Pos()))
				return true
			}
			p, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, p)
			return true
		})
	}
	slices.Sort(out)
	return out
}

// registeredCommands lists the string cases of the switch on typ in
// (*wsConn).dispatch: every WebSocket command type.
func registeredCommands(t *testing.T) []string {
	t.Helper()
	_, files := packageFiles(t)
	var out []string
	found := false
	for _, f := range files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Name.Name != "dispatch" || fn.Recv == nil {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				sw, ok := n.(*ast.SwitchStmt)
				if !ok {
					return true
				}
				if id, ok := sw.Tag.(*ast.Ident); !ok || id.Name != "typ" {
					return true
				}
				found = true
				for _, s := range sw.Body.List {
					for _, e := range s.(*ast.CaseClause).List {
						lit, ok := e.(*ast.BasicLit)
						if !ok || lit.Kind != token.STRING {
							t.Errorf("a WebSocket command case that is not a string literal: the ownership tests cannot see it")
							continue
						}
						v, _ := strconv.Unquote(lit.Value)
						out = append(out, v)
					}
				}
				return false
			})
		}
	}
	if !found {
		t.Fatal("no switch on typ in a dispatch method: update registeredCommands to find the WebSocket commands")
	}
	slices.Sort(out)
	return out
}

// ---- the stack with accounts ----

// authHarness is the whole stack, with the tools, behind the real
// authenticator in header mode (127.0.0.1 is the trusted proxy). Its
// harness methods (do, call, …) send no credentials; callers and proxies
// add them.
type authHarness struct {
	*toolHarness
	auth *auth.Authenticator
	ws   gateway.WSConfig
}

func newAuthHarness(t *testing.T, ws gateway.WSConfig) *authHarness {
	t.Helper()
	var a *auth.Authenticator
	th := newToolHarness(t, time.Millisecond, email.OutboxConfig{}, withWS(ws),
		withAuth(func(st *store.Store) gateway.Authenticator {
			a = headerAuth(t, st)
			return a
		}))
	return &authHarness{toolHarness: th, auth: a, ws: ws}
}

// generousLimits lifts the per-connection and per-user rate limits (limits
// have tests of their own): these tests send far more commands than a
// person would, and every one must reach the ownership check.
func generousLimits() gateway.WSConfig {
	return gateway.WSConfig{
		CommandRate: 1000, CommandBurst: 1000,
		UserCommandRate: 1000, UserCommandBurst: 1000,
		CancelRate: 1000, CancelBurst: 1000,
	}
}

// extraServer serves handler on a listener of its own, closed before the stack.
func extraServer(t *testing.T, handler http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(handler)
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv
}

// proxy is a trusted reverse proxy in front of the gateway that signs every
// request in as user: the harness helpers (createThread, openSSE, dial,
// askEmail, …) then act as that user.
func (h *authHarness) proxy(t *testing.T, user string) *toolHarness {
	t.Helper()
	srv := extraServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Set("X-Forwarded-User", user)
		h.mux.ServeHTTP(w, r)
	}))
	c := *h.harness
	c.t, c.srv = t, srv
	return &toolHarness{harness: &c, outbox: h.outbox}
}

// passwordServer serves the same store and engine behind a password-mode
// authenticator (session cookies, bearer tokens).
func (h *authHarness) passwordServer(t *testing.T) (*httptest.Server, *auth.Authenticator) {
	t.Helper()
	return h.passwordServerWith(t, 0, h.ws)
}

// passwordServerWith is passwordServer with the event streams' keep-alive
// (0: the default) and the WebSocket settings given. The authenticator
// caches credentials as the server's does (auth.DefaultCredentialCache).
func (h *authHarness) passwordServerWith(t *testing.T, keepAlive time.Duration, ws gateway.WSConfig) (*httptest.Server, *auth.Authenticator) {
	t.Helper()
	return h.passwordServerAuth(t, auth.Config{CredentialCache: auth.DefaultCredentialCache}, keepAlive, ws)
}

// passwordServerAuth is passwordServerWith behind a password-mode
// authenticator made of cfg (Mode, BcryptCost and, when nil, Store filled
// in): tests give it a clock, a cache time or a store that counts reads.
func (h *authHarness) passwordServerAuth(t *testing.T, cfg auth.Config, keepAlive time.Duration, ws gateway.WSConfig) (*httptest.Server, *auth.Authenticator) {
	t.Helper()
	cfg.Mode, cfg.BcryptCost = auth.ModePassword, 4
	if cfg.Store == nil {
		cfg.Store = h.st.Accounts()
	}
	a, err := auth.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	api := gateway.New(gateway.Config{
		Auth: a, Store: h.st, Runs: h.eng,
		Feed:      h.feed,
		KeepAlive: keepAlive,
		WS:        ws,
	})
	mux := http.NewServeMux()
	api.Routes(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		closing, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		api.CloseWebSockets(closing)
		cancel()
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv, a
}

// apiCaller is a client with its credentials, on one server.
type apiCaller struct {
	name string
	srv  *httptest.Server
	hdr  []string // credentials as name, value pairs (none: unauthenticated)
}

func (c apiCaller) header() http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(c.hdr); i += 2 {
		h.Set(c.hdr[i], c.hdr[i+1])
	}
	return h
}

func (c apiCaller) send(t *testing.T, method, path string, body any, extra ...string) reply {
	t.Helper()
	return httpSend(t, c.srv, method, path, body, append(slices.Clone(c.hdr), extra...)...)
}

// dial opens a WebSocket with the caller's credentials.
func (c apiCaller) dial(t *testing.T, h *harness) *wsClient {
	t.Helper()
	hh := *h
	hh.t, hh.srv = t, c.srv
	return hh.dialWith(t, c.name, &websocket.DialOptions{HTTPHeader: c.header()})
}

// httpSend makes one request. An event stream or an upgraded connection is not
// read (the request ends on return), so one that should not have opened
// fails the caller's status check instead of hanging the test. body: nil
// (none), a string (sent as is) or a value to encode as JSON.
func httpSend(t *testing.T, srv *httptest.Server, method, path string, body any, hdr ...string) reply {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	r := reply{method: method, path: path, status: resp.StatusCode, header: resp.Header}
	if resp.StatusCode == http.StatusSwitchingProtocols || strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return r
	}
	if r.body, err = io.ReadAll(resp.Body); err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return r
}

// dialStatus tries a WebSocket upgrade and returns the HTTP status of the
// answer (101 when it connected, which it then closes).
func dialStatus(t *testing.T, srv *httptest.Server, hdr http.Header) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/ws",
		&websocket.DialOptions{HTTPHeader: hdr, HTTPClient: srv.Client()})
	if err == nil {
		conn.CloseNow()
		return http.StatusSwitchingProtocols
	}
	if resp == nil {
		t.Fatalf("dial: no answer: %v", err)
	}
	return resp.StatusCode
}

// upgradeHeaders make a plain request look like a WebSocket upgrade, so the
// refusal's JSON body can be read.
var upgradeHeaders = []string{"Connection", "Upgrade", "Upgrade", "websocket",
	"Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}

// wantRefusal checks an HTTP error answer: the status of code, the
// protocol's error shape (type error, a message, no re) as JSON. It
// reports with Errorf and returns whether it held.
func wantRefusal(t *testing.T, what string, r reply, code string) bool {
	t.Helper()
	status := map[string]int{
		chat.CodeNotFound: 404, chat.CodeCheckpointNotFound: 404,
		chat.CodeUnauthorized: 401, chat.CodeForbidden: 403,
	}[code]
	var body map[string]any
	if r.status != status || json.Unmarshal(r.body, &body) != nil || body["error"] != code {
		t.Errorf("%s: %v, want %d %s", what, r, status, code)
		return false
	}
	ok := true
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("%s: %v: Content-Type %q, want JSON", what, r, ct)
		ok = false
	}
	if msg, _ := body["message"].(string); msg == "" || body["type"] != "error" {
		t.Errorf("%s: %v: want the protocol's error shape with a message", what, r)
		ok = false
	}
	if _, has := body["re"]; has {
		t.Errorf("%s: %v: an HTTP error carries re", what, r)
		ok = false
	}
	return ok
}

// normalizedAnswer is an answer with id replaced by a placeholder and without re,
// to compare the answer for a foreign id with the one for an unknown id.
func normalizedAnswer(t *testing.T, raw []byte, id string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(strings.ReplaceAll(string(raw), id, "<id>")), &m); err != nil {
		t.Errorf("answer is not a JSON object: %v: %s", err, raw)
	}
	delete(m, "re")
	return m
}

func jsonOf(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// idPrefix is the kind prefix of an id ("thr_", "run_", …).
func idPrefix(id string) string {
	i := strings.IndexByte(id, '_')
	if i < 0 {
		return ""
	}
	return id[:i+1]
}

// ---- Alice's world ----

// aliceWorld is one of every kind of id Alice owns, and the versions at which a
// command on them would succeed for her.
type aliceWorld struct {
	t1, t2, t3 string // the main thread; the email thread; a fork of t1
	r1, r2, r3 string // completed (with a client_request_id); cancelled; waiting for a confirmation
	crid       string // r1's client_request_id
	u1, a1     string // t1's first user and assistant messages
	draft      string // a saved fragment in t1's history
	streamed   string // r2's streamed message (never published)
	deltaSeq   int64  // the seq of a delta of it
	cpRoot     string // t1's first checkpoint
	op         string // t2's prepared send_email operation
	version    map[string]int64
	head       map[string]string
	runThread  map[string]string
}

func (w *aliceWorld) threads() []string { return []string{w.t1, w.t2, w.t3} }
func (w *aliceWorld) runs() []string    { return []string{w.r1, w.r2, w.r3} }
func (w *aliceWorld) checkpoints() []string {
	return []string{w.cpRoot, w.head[w.t1], w.head[w.t2], w.head[w.t3]}
}

// buildWorld has alice (through her proxy) make a thread with a completed
// run, a run cancelled mid-stream with a fragment saved from it, an email
// thread whose run waits for a confirmation, and a fork.
func buildWorld(t *testing.T, h *authHarness, alice *toolHarness) *aliceWorld {
	t.Helper()
	w := &aliceWorld{crid: "alice-request-1", version: map[string]int64{}, head: map[string]string{}, runThread: map[string]string{}}
	snap := alice.createThread("alice: lighthouses")
	w.t1, w.cpRoot = snap.ThreadID, snap.HeadCheckpointID
	s := alice.openSSE(w.t1, "after_seq=0", "")
	var r1 chat.RunStartAck
	alice.call(http.MethodPost, "/api/threads/"+w.t1+"/runs", map[string]any{
		"expected_state_version": 1, "user_message": "short question about lighthouses", "client_request_id": w.crid,
	}, http.StatusCreated, &r1)
	w.r1 = r1.RunID
	waitRunEnd(t, s, w.r1, chat.EventRunCompleted)

	h.model.setPace(20 * time.Millisecond)
	r2 := alice.startRun(w.t1, alice.snapshot(w.t1).StateVersion, "Explain how the old lighthouses were kept lit at night")
	w.r2 = r2.RunID
	deltas := s.waitDeltas(w.r2, 3)
	w.streamed, w.deltaSeq = deltas[0].MessageID, deltas[1].Seq
	var saved chat.FragmentSaved
	alice.call(http.MethodPost, "/api/threads/"+w.t1+"/fragments", map[string]any{
		"message_id": w.streamed, "last_seq": w.deltaSeq, "expected_state_version": s.lastVersion,
	}, http.StatusCreated, &saved)
	w.draft = saved.MessageID
	alice.cancel(w.r2, nil)
	waitRunEnd(t, s, w.r2, chat.EventRunCancelled)
	h.model.setPace(time.Millisecond)
	s.close()

	hist := alice.snapshot(w.t1).Messages
	if len(hist) != 4 || hist[0].Role != chat.RoleUser || hist[1].Role != chat.RoleAssistant || hist[3].MessageID != w.draft {
		t.Fatalf("alice's main thread: %+v", hist)
	}
	w.u1, w.a1 = hist[0].MessageID, hist[1].MessageID

	w.t2 = alice.createThread("alice: email").ThreadID
	s2 := alice.openSSE(w.t2, "after_seq=0", "")
	r3, op, _ := alice.askEmail(s2, w.t2, "ann@example.com", "Send an email to ann@example.com about the quote")
	w.r3, w.op = r3.RunID, op.OperationID
	s2.close()

	var fork chat.ForkAck
	alice.call(http.MethodPost, "/api/threads/"+w.t1+"/fork", map[string]any{"from_checkpoint_id": alice.snapshot(w.t1).HeadCheckpointID}, http.StatusCreated, &fork)
	w.t3 = fork.NewThreadID

	for _, th := range w.threads() {
		snap := alice.snapshot(th)
		w.version[th], w.head[th] = snap.StateVersion, snap.HeadCheckpointID
	}
	w.runThread = map[string]string{w.r1: w.t1, w.r2: w.t1, w.r3: w.t2}
	return w
}

// fakeWorld has well-formed ids that exist nowhere (routing checks).
func fakeWorld() *aliceWorld {
	w := &aliceWorld{
		t1: chat.NewID(chat.PrefixThread), t2: chat.NewID(chat.PrefixThread), t3: chat.NewID(chat.PrefixThread),
		r1: chat.NewID(chat.PrefixRun), r2: chat.NewID(chat.PrefixRun), r3: chat.NewID(chat.PrefixRun),
		crid: "x", u1: chat.NewID(chat.PrefixMessage), a1: chat.NewID(chat.PrefixMessage),
		draft: chat.NewID(chat.PrefixMessage), streamed: chat.NewID(chat.PrefixMessage), deltaSeq: 3,
		cpRoot: chat.NewID(chat.PrefixCheckpoint), op: chat.NewID(chat.PrefixOperation),
		version: map[string]int64{}, head: map[string]string{},
	}
	for _, th := range w.threads() {
		w.version[th], w.head[th] = 1, chat.NewID(chat.PrefixCheckpoint)
	}
	w.runThread = map[string]string{w.r1: w.t1, w.r2: w.t1, w.r3: w.t2}
	return w
}

// ---- requests and probes ----

// probeRequest is one command in its HTTP form (route: the registered pattern
// it must reach) and its WebSocket form (ws), either may be absent.
type probeRequest struct {
	route, method, path string
	body                any
	hdr                 []string
	ws                  map[string]any
	wsAck               bool // the WebSocket form is acknowledged whatever the id
}

func withFields(a, b map[string]any) map[string]any {
	out := maps.Clone(a)
	if out == nil {
		out = map[string]any{}
	}
	maps.Copy(out, b)
	return out
}

func reqSnapshot(th string) probeRequest {
	return probeRequest{route: "GET /api/threads/{id}", method: http.MethodGet, path: "/api/threads/" + th}
}

func reqCheckpoints(th string) probeRequest {
	return probeRequest{route: "GET /api/threads/{id}/checkpoints", method: http.MethodGet, path: "/api/threads/" + th + "/checkpoints"}
}

func reqHistory(th, before string) probeRequest {
	r := probeRequest{route: "GET /api/threads/{id}/messages", method: http.MethodGet, path: "/api/threads/" + th + "/messages"}
	if before != "" {
		r.path += "?before=" + before
	}
	return r
}

func reqOperations(th string) probeRequest {
	return probeRequest{route: "GET /api/threads/{id}/operations", method: http.MethodGet, path: "/api/threads/" + th + "/operations"}
}

func reqEvents(th, query, lastEventID string) probeRequest {
	r := probeRequest{route: "GET /api/threads/{id}/events", method: http.MethodGet, path: "/api/threads/" + th + "/events"}
	if query != "" {
		r.path += "?" + query
	}
	if lastEventID != "" {
		r.hdr = []string{"Last-Event-ID", lastEventID}
	}
	return r
}

func reqSubscribe(th string, after *int64) probeRequest {
	f := map[string]any{"type": "subscribe", "thread_id": th}
	if after != nil {
		f["after_seq"] = *after
	}
	return probeRequest{ws: f}
}

func reqUnsubscribe(th string) probeRequest {
	return probeRequest{ws: map[string]any{"type": "unsubscribe", "thread_id": th}, wsAck: true}
}

func reqRunStart(th string, f map[string]any) probeRequest {
	return probeRequest{route: "POST /api/threads/{id}/runs", method: http.MethodPost, path: "/api/threads/" + th + "/runs",
		body: f, ws: withFields(map[string]any{"type": "run.start", "thread_id": th}, f)}
}

func reqRun(run string) probeRequest {
	return probeRequest{route: "GET /api/runs/{id}", method: http.MethodGet, path: "/api/runs/" + run}
}

// reqCancel: f nil sends no body (allowed for a cancel).
func reqCancel(run string, f map[string]any) probeRequest {
	r := probeRequest{route: "POST /api/runs/{id}/cancel", method: http.MethodPost, path: "/api/runs/" + run + "/cancel",
		ws: withFields(map[string]any{"type": "run.cancel", "run_id": run}, f)}
	if f != nil {
		r.body = f
	}
	return r
}

func reqFragment(th, msg string, lastSeq, version int64) probeRequest {
	f := map[string]any{"message_id": msg, "last_seq": lastSeq, "expected_state_version": version}
	return probeRequest{route: "POST /api/threads/{id}/fragments", method: http.MethodPost, path: "/api/threads/" + th + "/fragments",
		body: f, ws: withFields(map[string]any{"type": "fragment.save", "thread_id": th}, f)}
}

func reqStreamed(th, msg string, lastSeq int64) probeRequest {
	return probeRequest{route: "GET /api/threads/{id}/streamed/{message_id}", method: http.MethodGet,
		path: fmt.Sprintf("/api/threads/%s/streamed/%s?last_seq=%d", th, msg, lastSeq)}
}

func reqDraftDelete(th, msg string, version int64) probeRequest {
	f := map[string]any{"expected_state_version": version}
	return probeRequest{route: "POST /api/threads/{id}/drafts/{message_id}/delete", method: http.MethodPost,
		path: "/api/threads/" + th + "/drafts/" + msg + "/delete", body: f,
		ws: withFields(map[string]any{"type": "draft.delete", "thread_id": th, "message_id": msg}, f)}
}

func reqFork(th, cp string) probeRequest {
	f := map[string]any{"from_checkpoint_id": cp}
	return probeRequest{route: "POST /api/threads/{id}/fork", method: http.MethodPost, path: "/api/threads/" + th + "/fork",
		body: f, ws: withFields(map[string]any{"type": "thread.fork", "thread_id": th}, f)}
}

func reqCheckout(th, cp string, version int64) probeRequest {
	f := map[string]any{"checkpoint_id": cp, "expected_state_version": version}
	return probeRequest{route: "POST /api/threads/{id}/head", method: http.MethodPost, path: "/api/threads/" + th + "/head",
		body: f, ws: withFields(map[string]any{"type": "thread.checkout", "thread_id": th}, f)}
}

// reqDeleteThread: f nil sends no body (allowed).
func reqDeleteThread(th string, f map[string]any) probeRequest {
	r := probeRequest{route: "DELETE /api/threads/{id}", method: http.MethodDelete, path: "/api/threads/" + th,
		ws: withFields(map[string]any{"type": "thread.delete", "thread_id": th}, f)}
	if f != nil {
		r.body = f
	}
	return r
}

func reqDecide(op string, confirm bool, version int64) probeRequest {
	verb, typ := "reject", "tool.reject"
	if confirm {
		verb, typ = "confirm", "tool.confirm"
	}
	f := map[string]any{"expected_state_version": version}
	return probeRequest{route: "POST /api/operations/{id}/" + verb, method: http.MethodPost, path: "/api/operations/" + op + "/" + verb,
		body: f, ws: withFields(map[string]any{"type": typ, "operation_id": op}, f)}
}

func reqUnknownEndpoint(method, path string) probeRequest {
	return probeRequest{route: "/api/", method: method, path: path}
}

// ownershipProbe is a command naming an id of somebody else. build makes it for a
// given id, so the same command can be sent with an id that exists nowhere
// and the answers compared.
type ownershipProbe struct {
	name    string
	foreign string
	want    string // the error code: not_found, or checkpoint_not_found on the caller's own thread
	// replay: Alice must not get not_found for the same command (it names
	// objects she can see); false for unknown endpoints and for commands
	// on the caller's own thread.
	replay bool
	build  func(id string) probeRequest
}

// ownershipProbes names each of Alice's ids in every command that takes an
// id of its kind, with values that would succeed for Alice (her current
// versions, a buffered delta, a pending operation); own is the caller's
// thread at ownVersion, for commands naming Alice's checkpoints and
// messages on the caller's own thread.
func ownershipProbes(w *aliceWorld, own string, ownVersion int64) []ownershipProbe {
	const nf, cpnf = chat.CodeNotFound, chat.CodeCheckpointNotFound
	var ps []ownershipProbe
	add := func(name, foreign, want string, replay bool, build func(string) probeRequest) {
		ps = append(ps, ownershipProbe{name: name, foreign: foreign, want: want, replay: replay, build: build})
	}
	zero := int64(0)
	for _, th := range w.threads() {
		v, head := w.version[th], w.head[th]
		add("snapshot", th, nf, true, reqSnapshot)
		add("checkpoints", th, nf, true, reqCheckpoints)
		add("history", th, nf, true, func(id string) probeRequest { return reqHistory(id, "") })
		add("operations", th, nf, true, reqOperations)
		add("events from a snapshot", th, nf, true, func(id string) probeRequest { return reqEvents(id, "", "") })
		add("events after_seq=0", th, nf, true, func(id string) probeRequest { return reqEvents(id, "after_seq=0", "") })
		add("events after Last-Event-ID", th, nf, true, func(id string) probeRequest { return reqEvents(id, "", "1") })
		add("subscribe", th, nf, true, func(id string) probeRequest { return reqSubscribe(id, nil) })
		add("subscribe after_seq 0", th, nf, true, func(id string) probeRequest { return reqSubscribe(id, &zero) })
		add("unsubscribe", th, "", true, reqUnsubscribe)
		add("run.start with a message", th, nf, true, func(id string) probeRequest {
			return reqRunStart(id, map[string]any{"expected_state_version": v, "user_message": "short: what did you tell alice?"})
		})
		add("run.start from a checkpoint", th, nf, true, func(id string) probeRequest {
			return reqRunStart(id, map[string]any{"expected_state_version": v, "user_message": "short: branch", "resume_from_checkpoint_id": head})
		})
		add("fork", th, nf, true, func(id string) probeRequest { return reqFork(id, head) })
		add("checkout", th, nf, true, func(id string) probeRequest { return reqCheckout(id, head, v) })
		add("unknown endpoint under the thread", th, nf, false, func(id string) probeRequest {
			return reqUnknownEndpoint(http.MethodGet, "/api/threads/"+id+"/archive")
		})
		add("unregistered method on the thread", th, nf, false, func(id string) probeRequest {
			return reqUnknownEndpoint(http.MethodPut, "/api/threads/"+id)
		})
		// Not replayed as alice: it would delete her thread for the probes
		// after it (TestWSThreadDelete shows that the owner can).
		add("delete", th, nf, false, func(id string) probeRequest { return reqDeleteThread(id, nil) })
		add("delete at a version", th, nf, false, func(id string) probeRequest {
			return reqDeleteThread(id, map[string]any{"expected_state_version": v})
		})
	}
	v1 := w.version[w.t1]
	add("run.start continuing the saved point", w.t1, nf, true, func(id string) probeRequest {
		return reqRunStart(id, map[string]any{"expected_state_version": v1})
	})
	add("run.start from the root checkpoint", w.t1, nf, true, func(id string) probeRequest {
		return reqRunStart(id, map[string]any{"expected_state_version": v1, "user_message": "short: again", "resume_from_checkpoint_id": w.cpRoot})
	})
	add("run.start with alice's client_request_id", w.t1, nf, true, func(id string) probeRequest {
		return reqRunStart(id, map[string]any{"expected_state_version": v1, "user_message": "short: same id", "client_request_id": w.crid})
	})
	add("fragment.save of the streamed message", w.t1, nf, true, func(id string) probeRequest {
		return reqFragment(id, w.streamed, w.deltaSeq, v1)
	})
	add("streamed text of the streamed message", w.t1, nf, true, func(id string) probeRequest {
		return reqStreamed(id, w.streamed, w.deltaSeq)
	})
	add("draft.delete of the draft", w.t1, nf, true, func(id string) probeRequest { return reqDraftDelete(id, w.draft, v1) })
	add("draft.delete of a published message", w.t1, nf, true, func(id string) probeRequest { return reqDraftDelete(id, w.a1, v1) })
	for _, run := range w.runs() {
		v := w.version[w.runThread[run]]
		add("run", run, nf, true, reqRun)
		add("cancel", run, nf, true, func(id string) probeRequest { return reqCancel(id, nil) })
		add("cancel with reason and version", run, nf, true, func(id string) probeRequest {
			return reqCancel(id, map[string]any{"reason": "not yours", "expected_state_version": v})
		})
	}
	v2 := w.version[w.t2]
	add("confirm", w.op, nf, true, func(id string) probeRequest { return reqDecide(id, true, v2) })
	add("reject", w.op, nf, true, func(id string) probeRequest { return reqDecide(id, false, v2) })
	add("unknown endpoint under the operation", w.op, nf, false, func(id string) probeRequest {
		return reqUnknownEndpoint(http.MethodPost, "/api/operations/"+id+"/retry")
	})

	// Alice's checkpoints and messages named on the caller's own thread.
	for _, cp := range w.checkpoints() {
		add("run.start on own thread from alice's checkpoint", cp, cpnf, false, func(id string) probeRequest {
			return reqRunStart(own, map[string]any{"expected_state_version": ownVersion, "user_message": "short: steal", "resume_from_checkpoint_id": id})
		})
		add("fork own thread from alice's checkpoint", cp, cpnf, false, func(id string) probeRequest { return reqFork(own, id) })
		add("checkout of alice's checkpoint on own thread", cp, cpnf, false, func(id string) probeRequest { return reqCheckout(own, id, ownVersion) })
	}
	add("fragment.save on own thread of alice's streamed message", w.streamed, nf, false, func(id string) probeRequest {
		return reqFragment(own, id, w.deltaSeq, ownVersion)
	})
	add("streamed text on own thread of alice's streamed message", w.streamed, nf, false, func(id string) probeRequest {
		return reqStreamed(own, id, w.deltaSeq)
	})
	for _, m := range []string{w.draft, w.a1, w.u1} {
		add("draft.delete on own thread of alice's message", m, nf, false, func(id string) probeRequest {
			return reqDraftDelete(own, id, ownVersion)
		})
		add("history of own thread before alice's message", m, nf, false, func(id string) probeRequest { return reqHistory(own, id) })
	}
	add("history of alice's thread before her message", w.a1, nf, true, func(id string) probeRequest { return reqHistory(w.t1, id) })
	return ps
}

// sampleRequest is one request per registered pattern, naming Alice's ids
// with values that would succeed for her (used where every route must
// refuse before anything runs). A pattern without a case fails.
func sampleRequest(t *testing.T, pattern string, w *aliceWorld) (probeRequest, bool) {
	t.Helper()
	switch pattern {
	case "GET /livez":
		return probeRequest{route: pattern, method: http.MethodGet, path: "/livez"}, true
	case "GET /readyz":
		return probeRequest{route: pattern, method: http.MethodGet, path: "/readyz"}, true
	case "GET /ws":
		return probeRequest{route: pattern, method: http.MethodGet, path: "/ws", hdr: upgradeHeaders}, true
	case "POST /api/threads":
		return probeRequest{route: pattern, method: http.MethodPost, path: "/api/threads", body: map[string]any{"title": "sneaky"}}, true
	case "GET /api/threads":
		return probeRequest{route: pattern, method: http.MethodGet, path: "/api/threads"}, true
	case "GET /api/threads/{id}":
		return reqSnapshot(w.t1), true
	case "POST /api/threads/{id}/runs":
		return reqRunStart(w.t1, map[string]any{"expected_state_version": w.version[w.t1], "user_message": "short: hi"}), true
	case "GET /api/runs/{id}":
		return reqRun(w.r1), true
	case "POST /api/runs/{id}/cancel":
		return reqCancel(w.r3, nil), true
	case "POST /api/threads/{id}/fragments":
		return reqFragment(w.t1, w.streamed, w.deltaSeq, w.version[w.t1]), true
	case "GET /api/threads/{id}/streamed/{message_id}":
		return reqStreamed(w.t1, w.streamed, w.deltaSeq), true
	case "POST /api/threads/{id}/drafts/{message_id}/delete":
		return reqDraftDelete(w.t1, w.draft, w.version[w.t1]), true
	case "POST /api/threads/{id}/fork":
		return reqFork(w.t1, w.head[w.t1]), true
	case "POST /api/threads/{id}/head":
		return reqCheckout(w.t1, w.cpRoot, w.version[w.t1]), true
	case "DELETE /api/threads/{id}":
		return reqDeleteThread(w.t1, nil), true
	case "GET /api/threads/{id}/operations":
		return reqOperations(w.t2), true
	case "POST /api/operations/{id}/confirm":
		return reqDecide(w.op, true, w.version[w.t2]), true
	case "POST /api/operations/{id}/reject":
		return reqDecide(w.op, false, w.version[w.t2]), true
	case "GET /api/threads/{id}/checkpoints":
		return reqCheckpoints(w.t1), true
	case "GET /api/threads/{id}/messages":
		return reqHistory(w.t1, w.a1), true
	case "GET /api/threads/{id}/events":
		return reqEvents(w.t1, "after_seq=0", ""), true
	case "/api/":
		return reqUnknownEndpoint(http.MethodPost, "/api/threads/"+w.t1+"/archive"), true
	}
	t.Errorf("route %q has no sample request: add a case to sampleRequest (and ownership probes if it names ids)", pattern)
	return probeRequest{}, false
}

// routedTo is the pattern the mux picks for the request's HTTP form.
func routedTo(mux *http.ServeMux, r probeRequest) string {
	req := httptest.NewRequest(r.method, r.path, nil)
	_, pattern := mux.Handler(req)
	return pattern
}

// ---- state that must not move ----

// stateOf is everything a refused command could have changed, as bytes:
// Alice's snapshots, checkpoints, operations, runs and thread list (read as
// Alice), the callers' own threads (read from the store), the email
// provider's calls, the accounts, and the threads of nobody.
func stateOf(t *testing.T, h *authHarness, alice *toolHarness, w *aliceWorld, own map[string]string) map[string]string {
	t.Helper()
	ctx := context.Background()
	m := map[string]string{}
	get := func(path string) {
		m["alice GET "+path] = string(alice.call(http.MethodGet, path, nil, http.StatusOK, nil).body)
	}
	for _, th := range w.threads() {
		get("/api/threads/" + th)
		get("/api/threads/" + th + "/checkpoints")
		get("/api/threads/" + th + "/operations")
	}
	for _, r := range w.runs() {
		get("/api/runs/" + r)
	}
	get("/api/threads?limit=200")
	for th, user := range own {
		snap, err := h.st.Snapshot(ctx, user, th)
		if err != nil {
			t.Fatal(err)
		}
		head, cps, err := h.st.Checkpoints(ctx, user, th)
		if err != nil {
			t.Fatal(err)
		}
		m["own thread "+th] = string(jsonOf(t, snap)) + string(jsonOf(t, cps)) + head
	}
	m["outbox calls"] = fmt.Sprint(len(h.attempts("")))
	m["outbox accepted"] = fmt.Sprint(h.accepted())
	users, err := h.st.Accounts().Users(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m["accounts"] = string(jsonOf(t, users))
	for _, user := range []string{chat.LocalUserID, ""} {
		ths, _, err := h.st.ListThreads(ctx, user, 200, "", "")
		if err != nil {
			t.Fatal(err)
		}
		m[fmt.Sprintf("threads of user %q", user)] = string(jsonOf(t, ths))
	}
	return m
}

func wantSameState(t *testing.T, what string, before, after map[string]string) {
	t.Helper()
	for _, k := range slices.Sorted(maps.Keys(before)) {
		if before[k] != after[k] {
			t.Errorf("%s changed %s:\nbefore %s\nafter  %s", what, k, before[k], after[k])
		}
	}
}

func wantNoViolations(t *testing.T, h *authHarness) {
	t.Helper()
	vs, err := h.st.Check(context.Background())
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	for _, v := range vs {
		t.Errorf("check: %v", v)
	}
}

// ---- the attacks ----

// probeTally counts what one caller tried.
type probeTally struct {
	probes, http, sse, ws int
	routes, commands      map[string]int
}

func (c probeTally) String() string {
	return fmt.Sprintf("%d probes: %d HTTP requests (%d of them SSE) over %d routes, %d WebSocket commands over %d types; each also sent with an unknown id",
		c.probes, c.http, c.sse, len(c.routes), c.ws, len(c.commands))
}

// attack sends every probe as who, over HTTP and over one WebSocket, and
// the same with an id that exists nowhere: each must be refused with the
// probe's code (unsubscribe: acknowledged) and answered exactly as for the
// unknown id but for the id itself. ownThread is subscribed first: the
// connection must never receive anything but that thread's events.
func attack(t *testing.T, h *authHarness, who apiCaller, createOwnThread string, ps []ownershipProbe) probeTally {
	t.Helper()
	n := probeTally{routes: map[string]int{}, commands: map[string]int{}}
	c := who.dial(t, h.harness)
	c.ack(map[string]any{"type": "hello", "tab_id": who.name + "-tab"})
	c.subscribe(createOwnThread, wsAfter(0))
	for _, p := range ps {
		unknown := chat.NewID(idPrefix(p.foreign))
		f, u := p.build(p.foreign), p.build(unknown)
		label := fmt.Sprintf("%s: %s %s", who.name, p.name, p.foreign)
		n.probes++
		if f.route != "" {
			if got := routedTo(h.mux, f); got != f.route {
				t.Errorf("%s: %s %s reaches route %q, want %q", label, f.method, f.path, got, f.route)
			}
			rf := who.send(t, f.method, f.path, f.body, f.hdr...)
			ru := who.send(t, u.method, u.path, u.body, u.hdr...)
			if wantRefusal(t, label, rf, p.want) && rf.status == ru.status {
				if a, b := normalizedAnswer(t, rf.body, p.foreign), normalizedAnswer(t, ru.body, unknown); !reflect.DeepEqual(a, b) {
					t.Errorf("%s: the answer for a foreign id differs from the one for an unknown id:\n%s\n%s", label, rf.body, ru.body)
				}
			} else if rf.status != ru.status {
				t.Errorf("%s: status %d for the foreign id, %d for an unknown one", label, rf.status, ru.status)
			}
			n.http++
			n.routes[f.route]++
			if f.route == "GET /api/threads/{id}/events" {
				n.sse++
			}
		}
		if f.ws != nil {
			typ := f.ws["type"].(string)
			mf := c.cmd(f.ws)
			mu := c.cmd(u.ws)
			switch {
			case f.wsAck && mf["type"] != "ack":
				t.Errorf("%s over WebSocket: %v, want an ack (as for any id)", label, mf)
			case !f.wsAck && (mf["type"] != "error" || mf["error"] != p.want):
				t.Errorf("%s over WebSocket: %v, want error %s", label, mf, p.want)
			}
			if a, b := normalizedAnswer(t, jsonOf(t, mf), p.foreign), normalizedAnswer(t, jsonOf(t, mu), unknown); !reflect.DeepEqual(a, b) {
				t.Errorf("%s over WebSocket: the answer for a foreign id differs from the one for an unknown id:\n%v\n%v", label, mf, mu)
			}
			n.ws++
			n.commands[typ]++
		}
	}
	// Nothing of anybody else's arrived (observe fails any event of a
	// thread this connection does not watch), and nothing at all since.
	if extra := c.sync(); len(extra) != 0 {
		t.Errorf("%s: the probes sent %d objects to the connection: %v", who.name, len(extra), extra)
	}
	c.conn.Close(websocket.StatusNormalClosure, "")
	return n
}

// wantOnlyOwnThreads lists who's threads in several ways, Alice's cursor
// included: every thread listed is one of own, none is Alice's.
func wantOnlyOwnThreads(t *testing.T, who apiCaller, own []string, w *aliceWorld, aliceCursor string) {
	t.Helper()
	for _, q := range []string{"", "?limit=200", "?limit=1", "?cursor=" + aliceCursor, "?limit=1&cursor=" + aliceCursor, "?q=short", "?q=alice", "?q=a"} {
		r := who.send(t, http.MethodGet, "/api/threads"+q, nil)
		if strings.Contains(q, "cursor") && r.status == http.StatusBadRequest {
			continue // a cursor it cannot use is refused: fine, it shows nothing
		}
		var page threadPage
		if r.status != http.StatusOK || json.Unmarshal(r.body, &page) != nil {
			t.Errorf("%s lists threads: %v", who.name, r)
			continue
		}
		for _, th := range page.Threads {
			if slices.Contains(w.threads(), th.ThreadID) {
				t.Errorf("%s's list (%s) shows alice's thread %s", who.name, q, th.ThreadID)
			} else if !slices.Contains(own, th.ThreadID) {
				t.Errorf("%s's list (%s) shows thread %s, which is not theirs", who.name, q, th.ThreadID)
			}
		}
		if q == "" && len(page.Threads) != len(own) {
			t.Errorf("%s's list has %d threads, want their %d", who.name, len(page.Threads), len(own))
		}
	}
}

// createOwnThread creates a thread as who and returns it with its version.
func createOwnThread(t *testing.T, who apiCaller) (string, int64) {
	t.Helper()
	r := who.send(t, http.MethodPost, "/api/threads", map[string]any{"title": who.name + "'s own"})
	var snap chat.Snapshot
	if r.status != http.StatusCreated || json.Unmarshal(r.body, &snap) != nil {
		t.Fatalf("%s creates a thread: %v", who.name, r)
	}
	return snap.ThreadID, snap.StateVersion
}

// ---- tests ----

// TestOwnershipCoversEveryRouteAndCommand: the route and command tables
// here are exactly what the package registers (read from its source and
// confirmed on a live mux), every probe reaches the route it names, and
// every route and command that takes ids has probes.
func TestOwnershipCoversEveryRouteAndCommand(t *testing.T) {
	t.Parallel()
	routes := registeredRoutes(t)
	if want := slices.Sorted(maps.Keys(routeCoverage)); !slices.Equal(routes, want) {
		t.Errorf("registered routes %q\nownership table  %q\nadd every new route to routeCoverage, sampleRequest and ownershipProbes", routes, want)
	}
	cmds := registeredCommands(t)
	if want := slices.Sorted(maps.Keys(wsCoverage)); !slices.Equal(cmds, want) {
		t.Errorf("WebSocket commands %q\nownership table   %q\nadd every new command to wsCoverage and ownershipProbes", cmds, want)
	}

	mux := http.NewServeMux()
	gateway.New(gateway.Config{}).Routes(mux)
	// Each pattern found in the source is really registered: registering it
	// again conflicts.
	for _, p := range routes {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("pattern %q from the source is not registered by Routes", p)
				}
			}()
			mux.Handle(p, http.NotFoundHandler())
		}()
	}

	w := fakeWorld()
	for _, p := range routes {
		if r, ok := sampleRequest(t, p, w); ok {
			if got := routedTo(mux, r); got != p {
				t.Errorf("sample request %s %s reaches %q, want %q", r.method, r.path, got, p)
			}
		}
	}
	byRoute, byCommand := map[string]int{}, map[string]int{}
	for _, p := range ownershipProbes(w, chat.NewID(chat.PrefixThread), 1) {
		r := p.build(p.foreign)
		if r.route != "" {
			byRoute[r.route]++
			if got := routedTo(mux, r); got != r.route {
				t.Errorf("probe %q: %s %s reaches %q, want %q", p.name, r.method, r.path, got, r.route)
			}
		}
		if r.ws != nil {
			typ, _ := r.ws["type"].(string)
			if !slices.Contains(cmds, typ) {
				t.Errorf("probe %q sends unknown command %q", p.name, typ)
			}
			byCommand[typ]++
		}
	}
	for _, p := range routes {
		if routeCoverage[p] == routeIDs && byRoute[p] == 0 {
			t.Errorf("route %q takes ids but has no ownership probe", p)
		}
	}
	for _, c := range cmds {
		if c != "hello" && byCommand[c] == 0 {
			t.Errorf("command %q has no ownership probe", c)
		}
	}
}

// TestOwnershipForeignIDsAreNotFound: three more users — bob (trusted proxy
// header), carol (bearer token) and dave (password session) — try every
// route, the event stream and every WebSocket command on each of Alice's
// ids (threads, completed / cancelled / waiting runs, messages, a draft, a
// streamed message, checkpoints, a pending operation) with values that
// would succeed for her. Each is answered not_found, indistinguishable
// from an id that never existed; their lists never show her threads; and
// nothing of hers (or theirs) changed. Then Alice repeats the commands and
// none is not_found for her: the probes named real objects.
func TestOwnershipForeignIDsAreNotFound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newAuthHarness(t, generousLimits())
	alice := h.proxy(t, "alice")
	w := buildWorld(t, h, alice)

	bob := apiCaller{name: "bob", srv: h.srv, hdr: []string{"X-Forwarded-User", "bob"}}
	if _, err := h.st.Accounts().CreateUser(ctx, "carol", ""); err != nil {
		t.Fatal(err)
	}
	carol, _ := tokenCaller(t, h, h.srv, "carol")
	pwSrv, pwAuth := h.passwordServer(t)
	dave := apiCaller{name: "dave", srv: pwSrv, hdr: []string{"Cookie", signIn(t, h, pwAuth, "dave")}}

	own := map[string]string{} // thread -> its owner's user id
	ownThreads := map[string]string{}
	ownVersions := map[string]int64{}
	for _, who := range []apiCaller{bob, carol, dave} {
		th, v := createOwnThread(t, who)
		ownThreads[who.name], ownVersions[who.name] = th, v
		u, _, err := h.st.Accounts().UserByName(ctx, who.name)
		if err != nil {
			t.Fatal(err)
		}
		own[th] = u.UserID
	}
	var firstPage threadPage
	alice.call(http.MethodGet, "/api/threads?limit=1", nil, http.StatusOK, &firstPage)
	if firstPage.NextCursor == nil {
		t.Fatal("alice's first page of one thread has no next_cursor")
	}

	before := stateOf(t, h, alice, w, own)
	for _, who := range []apiCaller{bob, carol, dave} {
		n := attack(t, h, who, ownThreads[who.name], ownershipProbes(w, ownThreads[who.name], ownVersions[who.name]))
		t.Logf("%s: %v", who.name, n)
		wantOnlyOwnThreads(t, who, []string{ownThreads[who.name]}, w, *firstPage.NextCursor)
	}
	// The users are isolated from each other too, not only from Alice.
	for _, pair := range [][2]apiCaller{{bob, carol}, {carol, dave}, {dave, bob}} {
		th := ownThreads[pair[1].name]
		for _, r := range []probeRequest{reqSnapshot(th), reqEvents(th, "after_seq=0", ""), reqFork(th, "cp_x"),
			reqRunStart(th, map[string]any{"expected_state_version": ownVersions[pair[1].name], "user_message": "short: hi"})} {
			wantRefusal(t, pair[0].name+" on "+pair[1].name+"'s thread", pair[0].send(t, r.method, r.path, r.body, r.hdr...), chat.CodeNotFound)
		}
	}
	after := stateOf(t, h, alice, w, own)
	wantSameState(t, "a refused command", before, after)
	if ops := alice.operations(w.t2); len(ops) != 1 || ops[0].Phase != chat.PhasePrepared {
		t.Errorf("alice's operation after the attempts: %+v, want still prepared", ops)
	}
	wantNoViolations(t, h)

	// Control: the same commands from Alice, at versions one behind (so
	// that nothing but the cancel of r3 and the forks runs), are never
	// not_found: each probe named something that exists and is hers.
	stale := *w
	stale.version = map[string]int64{}
	for th, v := range w.version {
		stale.version[th] = v - 1
	}
	aliceCaller := apiCaller{name: "alice", srv: h.srv, hdr: []string{"X-Forwarded-User", "alice"}}
	s2 := alice.openSSE(w.t2, "after_seq="+strconv.FormatInt(alice.snapshot(w.t2).LastSeq, 10), "")
	r3Waiting := alice.run(w.r3).Status == chat.RunWaitingConfirmation // else a failure above already ended it
	replayed := 0
	for _, p := range ownershipProbes(&stale, w.t1, w.version[w.t1]) {
		r := p.build(p.foreign)
		if !p.replay || r.route == "" {
			continue
		}
		got := aliceCaller.send(t, r.method, r.path, r.body, r.hdr...)
		if got.status == http.StatusNotFound {
			t.Errorf("control: alice's own %s %s %s is %v: the probe named nothing of hers", p.name, r.method, r.path, got)
		}
		replayed++
	}
	t.Logf("control: alice replayed %d probes; none was not_found", replayed)
	if r3Waiting {
		waitRunEnd(t, s2, w.r3, chat.EventRunCancelled) // the control's cancel of r3, finished before cleanup
	}
}

// tokenCaller creates an API token of the account name and returns a
// caller on srv presenting it, and the token.
func tokenCaller(t *testing.T, h *authHarness, srv *httptest.Server, name string) (apiCaller, chat.APIToken) {
	t.Helper()
	tok, secret, err := auth.CreateToken(context.Background(), h.st.Accounts(), name, "test", 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return apiCaller{name: name, srv: srv, hdr: []string{"Authorization", "Bearer " + secret}}, tok
}

// signIn creates a password account and signs it in; it returns the
// session cookie header value.
func signIn(t *testing.T, h *authHarness, a *auth.Authenticator, name string) string {
	t.Helper()
	const password = "correct horse battery"
	hash, err := auth.HashPassword(password, 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.st.Accounts().CreateUser(context.Background(), name, hash); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	if _, err := a.SignIn(rec, httptest.NewRequest(http.MethodPost, "/login", nil), name, password); err != nil {
		t.Fatalf("sign in %s: %v", name, err)
	}
	for _, c := range rec.Result().Cookies() {
		if c.Name == auth.SessionCookie {
			return c.Name + "=" + c.Value
		}
	}
	t.Fatalf("sign in %s set no session cookie", name)
	return ""
}

// TestOwnershipLiveThreadStaysPrivate: while Alice's run streams, bob
// keeps trying to subscribe to her thread (with and without after_seq),
// to open its event stream and to cancel the run: every attempt is
// not_found, not one of her events reaches him, and her run completes
// uncancelled. The attempts go on while her thread moves (bounded in
// rounds and time), and fail the test unless it moved during them.
func TestOwnershipLiveThreadStaysPrivate(t *testing.T) {
	t.Parallel()
	h := newAuthHarness(t, generousLimits())
	alice := h.proxy(t, "alice")
	bob := apiCaller{name: "bob", srv: h.srv, hdr: []string{"X-Forwarded-User", "bob"}}
	bobThread, _ := createOwnThread(t, bob)

	th := alice.createThread("alice: live").ThreadID
	s := alice.openSSE(th, "after_seq=0", "")
	h.model.setPace(10 * time.Millisecond)
	run := alice.startRun(th, 1, "Explain in detail how tides depend on the moon and the sun").RunID
	s.waitDeltas(run, 2)
	h.model.setPace(time.Millisecond)

	c := bob.dial(t, h.harness)
	c.subscribe(bobThread, wsAfter(0))
	start := alice.snapshot(th).LastSeq
	deadline := time.Now().Add(waitTimeout)
	const rounds, moved, enough = 500, 3, 20
	tried, done := 0, 0
	for done < rounds && time.Now().Before(deadline) {
		done++
		var ids []string
		for _, f := range []map[string]any{
			{"type": "subscribe", "thread_id": th},
			{"type": "subscribe", "thread_id": th, "after_seq": int64(0)},
			{"type": "subscribe", "thread_id": th, "after_seq": start},
			{"type": "run.cancel", "run_id": run},
		} {
			ids = append(ids, c.post(f))
		}
		for _, id := range ids {
			if m := c.answer(id); m["type"] != "error" || m["error"] != chat.CodeNotFound {
				t.Fatalf("bob's %v on alice's live thread answered %v, want not_found", c.sent[id], m)
			}
		}
		tried += len(ids)
		r := reqEvents(th, "after_seq=0", "")
		wantRefusal(t, "bob's event stream of alice's live thread", bob.send(t, r.method, r.path, nil), chat.CodeNotFound)
		tried++
		// Keep going while her run streams (the more overlap the better),
		// within the bounds.
		if now := alice.snapshot(th); now.LastSeq >= start+enough || now.ActiveRun == nil {
			break
		}
	}
	if last := alice.snapshot(th).LastSeq; last < start+moved {
		t.Errorf("alice's thread moved from seq %d to %d during %d rounds of attempts: they did not overlap her run", start, last, done)
	}
	if extra := c.sync(); len(extra) != 0 {
		t.Errorf("bob's connection received %d objects: %v", len(extra), extra)
	}
	t.Logf("bob: %d attempts in %d rounds while alice's thread moved from seq %d to %d", tried, done, start, alice.snapshot(th).LastSeq)
	waitRunEnd(t, s, run, chat.EventRunCompleted)
	if r := alice.run(run); r.Status != chat.RunCompleted || r.CancelRequestedAt != nil {
		t.Errorf("alice's run after bob's cancels: %+v", r)
	}
	if extra := c.sync(); len(extra) != 0 {
		t.Errorf("bob's connection received %d objects after her run ended: %v", len(extra), extra)
	}
}

// TestOwnershipRevokedTokenIsUnauthorized: a bearer token works until it is
// revoked; then every route answers 401 unauthorized, the WebSocket upgrade
// too, and a connection opened with it is closed (1008) at its next
// revalidation. The token's user's thread is untouched.
func TestOwnershipRevokedTokenIsUnauthorized(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newAuthHarness(t, gateway.WSConfig{PingInterval: 50 * time.Millisecond})
	if _, err := h.st.Accounts().CreateUser(ctx, "carol", ""); err != nil {
		t.Fatal(err)
	}
	carol, tok := tokenCaller(t, h, h.srv, "carol")
	th, v := createOwnThread(t, carol)
	c := carol.dial(t, h.harness)
	c.subscribe(th, wsAfter(0))
	snap := func() string {
		s, err := h.st.Snapshot(ctx, tok.UserID, th)
		if err != nil {
			t.Fatal(err)
		}
		return string(jsonOf(t, s))
	}
	before := snap()

	if err := h.st.Accounts().RevokeToken(ctx, tok.TokenID); err != nil {
		t.Fatal(err)
	}
	w := fakeWorld()
	w.t1, w.version[th], w.head[th] = th, v, chat.NewID(chat.PrefixCheckpoint)
	n := 0
	for _, p := range registeredRoutes(t) {
		if routeCoverage[p] == routePublic {
			continue
		}
		r, ok := sampleRequest(t, p, w)
		if !ok {
			continue
		}
		wantRefusal(t, "revoked token: "+p, carol.send(t, r.method, r.path, r.body, r.hdr...), chat.CodeUnauthorized)
		n++
	}
	if got := dialStatus(t, h.srv, carol.header()); got != http.StatusUnauthorized {
		t.Errorf("WebSocket upgrade with a revoked token: %d, want 401", got)
	}
	if ce := c.closed(); ce.Code != websocket.StatusPolicyViolation || ce.Reason == "" {
		t.Errorf("the open connection of a revoked token closed with %v, want 1008 and a reason", ce)
	}
	if after := snap(); after != before {
		t.Errorf("carol's thread changed:\n%s\n%s", before, after)
	}
	t.Logf("revoked token: %d routes answered 401, the upgrade too, the open connection closed", n)
}

// TestUnauthenticatedRequestsAreRefused: every registered route (but the
// health checks) without credentials, or with bad ones, answers 401
// unauthorized (403 forbidden for a proxy-named user that cannot exist)
// before anything runs — in header mode and in password mode — including
// the WebSocket upgrade; the requests name Alice's ids with values that
// would succeed for her, and nothing of hers changes, no account and no
// thread is created.
func TestUnauthenticatedRequestsAreRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newAuthHarness(t, gateway.WSConfig{})
	alice := h.proxy(t, "alice")
	w := buildWorld(t, h, alice)
	pwSrv, _ := h.passwordServer(t)
	tok, _, err := auth.CreateToken(ctx, h.st.Accounts(), "alice", "test", 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	before := stateOf(t, h, alice, w, nil)

	const unauth, forbidden = chat.CodeUnauthorized, chat.CodeForbidden
	type variant struct {
		name string
		srv  *httptest.Server
		hdr  []string
		code string
	}
	variants := []variant{
		{"header mode, no credentials", h.srv, nil, unauth},
		{"header mode, an empty proxy header", h.srv, []string{"X-Forwarded-User", ""}, unauth},
		{"header mode, Basic credentials", h.srv, []string{"Authorization", "Basic YWxpY2U6c2VjcmV0"}, unauth},
		{"header mode, a malformed bearer token", h.srv, []string{"Authorization", "Bearer not-a-token"}, unauth},
		{"header mode, an unknown bearer token", h.srv, []string{"Authorization", "Bearer tok_00000000000000000000000000.c2VjcmV0"}, unauth},
		{"header mode, alice's token id with a wrong secret", h.srv, []string{"Authorization", "Bearer " + tok.TokenID + ".wrong"}, unauth},
		{"header mode, a bad bearer token next to alice's proxy header", h.srv, []string{"X-Forwarded-User", "alice", "Authorization", "Bearer tok_x.y"}, unauth},
		{"header mode, a session cookie", h.srv, []string{"Cookie", auth.SessionCookie + "=abc"}, unauth},
		{"header mode, a proxy-named user that cannot exist", h.srv, []string{"X-Forwarded-User", "alice smith!"}, forbidden},
		{"password mode, no cookie", pwSrv, nil, unauth},
		{"password mode, an unknown session cookie", pwSrv, []string{"Cookie", auth.SessionCookie + "=not-a-session"}, unauth},
		{"password mode, a proxy header", pwSrv, []string{"X-Forwarded-User", "alice"}, unauth},
		{"password mode, an unknown bearer token", pwSrv, []string{"Authorization", "Bearer tok_00000000000000000000000000.c2VjcmV0"}, unauth},
	}
	requests := 0
	routes := registeredRoutes(t)
	for _, p := range routes {
		r, ok := sampleRequest(t, p, w)
		if !ok {
			continue
		}
		if got := routedTo(h.mux, r); got != p {
			t.Errorf("sample %s %s reaches %q, want %q", r.method, r.path, got, p)
		}
		for _, v := range variants {
			got := httpSend(t, v.srv, r.method, r.path, r.body, append(slices.Clone(v.hdr), r.hdr...)...)
			requests++
			if routeCoverage[p] == routePublic {
				// Health checks need no credentials and tell nothing.
				var body map[string]any
				if (got.status != http.StatusOK && got.status != http.StatusServiceUnavailable) ||
					json.Unmarshal(got.body, &body) != nil || len(body) != 1 || body["status"] == nil {
					t.Errorf("%s: %s: %v, want a bare health answer", v.name, p, got)
				}
				continue
			}
			wantRefusal(t, v.name+": "+p, got, v.code)
		}
	}
	dials := 0
	for _, v := range variants {
		if got := dialStatus(t, v.srv, apiCaller{hdr: v.hdr}.header()); got != map[string]int{unauth: 401, forbidden: 403}[v.code] {
			t.Errorf("%s: WebSocket upgrade answered %d, want %s", v.name, got, v.code)
		}
		dials++
	}
	wantSameState(t, "an unauthenticated request", before, stateOf(t, h, alice, w, nil))
	wantNoViolations(t, h)
	t.Logf("%d routes × %d credential variants = %d requests and %d WebSocket dials refused", len(routes), len(variants), requests, dials)
}

// TestCrossOriginWithCredentialsIsRefused: a page of another site driving a
// signed-in browser: every state-changing route, sent with Alice's
// credentials and a body that would succeed for her, is refused 403
// forbidden when the browser says cross-site or same-site, or sends a
// foreign Origin; nothing changes. Without credentials the answer is 401
// (authentication comes first). The WebSocket upgrade from a foreign
// origin is refused 403 with her credentials; from her own page it
// connects, and so does a same-origin API request.
func TestCrossOriginWithCredentialsIsRefused(t *testing.T) {
	t.Parallel()
	h := newAuthHarness(t, gateway.WSConfig{})
	alice := h.proxy(t, "alice")
	w := buildWorld(t, h, alice)
	before := stateOf(t, h, alice, w, nil)
	creds := []string{"X-Forwarded-User", "alice"}
	foreign := [][]string{
		{"Sec-Fetch-Site", "cross-site"},
		{"Sec-Fetch-Site", "same-site"},
		{"Origin", "https://evil.example"},
		{"Origin", "null"},
		{"Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example"},
	}
	n := 0
	for _, p := range registeredRoutes(t) {
		if !strings.HasPrefix(p, http.MethodPost+" ") {
			continue // only POST routes change state (the /api/ fallback changes nothing)
		}
		r, ok := sampleRequest(t, p, w)
		if !ok {
			continue
		}
		for _, f := range foreign {
			got := httpSend(t, h.srv, r.method, r.path, r.body, append(slices.Clone(creds), f...)...)
			wantRefusal(t, fmt.Sprintf("%s with alice's credentials and %v", p, f), got, chat.CodeForbidden)
			n++
		}
		got := httpSend(t, h.srv, r.method, r.path, r.body, foreign[0]...)
		wantRefusal(t, p+" cross-site without credentials", got, chat.CodeUnauthorized)
	}
	if n == 0 {
		t.Fatal("no state-changing route found")
	}

	hdr := apiCaller{hdr: creds}.header()
	for _, origin := range []string{"https://evil.example", "null"} {
		hdr.Set("Origin", origin)
		if got := dialStatus(t, h.srv, hdr); got != http.StatusForbidden {
			t.Errorf("WebSocket upgrade from %s with alice's credentials: %d, want 403", origin, got)
		}
		r := httpSend(t, h.srv, http.MethodGet, "/ws", nil, append(slices.Clone(creds), append([]string{"Origin", origin}, upgradeHeaders...)...)...)
		wantRefusal(t, "upgrade from "+origin+" with alice's credentials", r, chat.CodeForbidden)
		r = httpSend(t, h.srv, http.MethodGet, "/ws", nil, append([]string{"Origin", origin}, upgradeHeaders...)...)
		wantRefusal(t, "upgrade from "+origin+" without credentials", r, chat.CodeUnauthorized)
	}
	wantSameState(t, "a cross-origin request", before, stateOf(t, h, alice, w, nil))
	wantNoViolations(t, h)

	// Her own page passes, over HTTP and WebSocket.
	hdr.Set("Origin", h.srv.URL)
	if got := dialStatus(t, h.srv, hdr); got != http.StatusSwitchingProtocols {
		t.Errorf("WebSocket upgrade from alice's own page: %d, want 101", got)
	}
	if r := httpSend(t, h.srv, http.MethodPost, "/api/threads", map[string]any{}, append(slices.Clone(creds), "Origin", h.srv.URL, "Sec-Fetch-Site", "same-origin")...); r.status != http.StatusCreated {
		t.Errorf("same-origin create with alice's credentials: %v, want 201", r)
	}
	t.Logf("%d cross-origin requests with credentials refused", n)
}
