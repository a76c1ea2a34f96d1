package gateway_test

// The stack with accounts (authHarness), callers with credentials
// (apiCaller: token, password sign-in) and the checks of a refusal; used by
// the ownership, credential-cache and stream tests.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
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
		Auth: a, Store: h.st, Runs: h.eng, Model: "demo",
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
// protocol's error shape (type error, a message, no re) as JSON, or under
// /v1 OpenAI's ({"error": {message, type, param, code}}, code the
// protocol's). It reports with Errorf and returns whether it held.
func wantRefusal(t *testing.T, what string, r reply, code string) bool {
	t.Helper()
	status := map[string]int{
		chat.CodeNotFound: 404, chat.CodeCheckpointNotFound: 404,
		chat.CodeUnauthorized: 401, chat.CodeForbidden: 403,
	}[code]
	var body map[string]any
	if strings.HasPrefix(r.path, "/v1/") {
		var oa struct {
			Error *struct {
				Message, Type, Code string
				Param               *string
			}
		}
		if r.status != status || json.Unmarshal(r.body, &oa) != nil || oa.Error == nil || oa.Error.Code != code ||
			oa.Error.Message == "" || oa.Error.Type == "" || !strings.HasPrefix(r.header.Get("Content-Type"), "application/json") {
			t.Errorf("%s: %v, want %d and OpenAI's error shape with code %s", what, r, status, code)
			return false
		}
		return true
	}
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
