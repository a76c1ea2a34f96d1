package app_test

// Sign-in and credentials for the scenario tests under -auth password or
// header (Config.AuthMode): accounts made in the store, raw requests as a
// credential (who), the sign-in form, raw WebSocket connections for the
// tests whose subject is how the server ends one.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/crypto/bcrypt"

	"github.com/honestcancel/gateway/app"
	"github.com/honestcancel/gateway/auth"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
	"github.com/honestcancel/gateway/store"
)

// dbWithUser is a new database in the test's temporary folder holding one
// account, name with password; it returns the database's path.
func dbWithUser(t *testing.T, name, password string) string {
	t.Helper()
	db := filepath.Join(t.TempDir(), "gw.db")
	addUser(t, db, name, password)
	return db
}

// dbWithFastUser is dbWithUser with the password hashed at bcrypt's lowest
// cost, for the tests whose subject is the sign-in limiter's wall time (a
// lock of 1 s against password checks): a check is then quick even under
// the race detector, which slows bcrypt several times.
func dbWithFastUser(t *testing.T, name, password string) string {
	t.Helper()
	db := filepath.Join(t.TempDir(), "gw.db")
	addFastUser(t, db, name, password)
	return db
}

// addFastUser adds the account name to db with a password hashed at
// bcrypt.MinCost (see dbWithFastUser).
func addFastUser(t *testing.T, db, name, password string) {
	t.Helper()
	hash, err := auth.HashPassword(password, bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(context.Background(), db, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Accounts().CreateUser(context.Background(), name, hash); err != nil {
		t.Fatalf("add user %s: %v", name, err)
	}
}

// noRedirects is an HTTP client that shows redirects instead of following
// them and keeps no cookies: each request carries exactly what the test
// gives it.
var noRedirects = &http.Client{
	Timeout:       15 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// who is the credential a request carries: a session cookie, a bearer
// token, a trusted proxy's user header, or nothing.
type who struct {
	cookie string // value of gateway_session
	bearer string
	proxy  [2]string   // a proxy's user header: its name, the user
	header http.Header // more headers (Origin, a __Host- cookie…)
}

func (w who) apply(h http.Header) {
	if w.cookie != "" {
		h.Set("Cookie", "gateway_session="+w.cookie)
	}
	if w.bearer != "" {
		h.Set("Authorization", "Bearer "+w.bearer)
	}
	if w.proxy[0] != "" {
		h.Set(w.proxy[0], w.proxy[1])
	}
	for k, v := range w.header {
		h[k] = v
	}
}

// send makes one raw request as w and returns the answer with its body
// read: for pages, forms, redirects and refusals whose answer on the wire
// (status, headers, body) is what the test checks. Typed API calls go
// through the protocol client (as).
func send(s *apptest.Server, w who, method, path string, body any) (*http.Response, []byte) {
	s.T.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			s.T.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, s.Base+path, rd)
	if err != nil {
		s.T.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	w.apply(req.Header)
	resp, err := noRedirects.Do(req)
	if err != nil {
		s.T.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		s.T.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp, raw
}

// as is the server seen through a protocol client carrying w's
// credential: its typed calls (snapshot, startRun, threads, connect, …)
// are made as w.
func as(s *apptest.Server, w who) *apptest.Server {
	var opts []client.Option
	if w.cookie != "" {
		opts = append(opts, client.WithSessionCookie(w.cookie))
	}
	if w.bearer != "" {
		opts = append(opts, client.WithBearerToken(w.bearer))
	}
	if w.proxy[0] != "" {
		opts = append(opts, client.WithProxyUser(w.proxy[0], w.proxy[1]))
	}
	return s.As(w.header, opts...)
}

// wantUnauthorized requires the API's 401 in the protocol's error shape.
// Raw: its subject is the answer on the wire (status, Content-Type, the
// "type" field), which the client does not show.
func wantUnauthorized(s *apptest.Server, w who, method, path, why string) {
	s.T.Helper()
	var body any
	if method == "POST" {
		body = map[string]any{}
	}
	resp, raw := send(s, w, method, path, body)
	var e struct{ Type, Error, Message string }
	_ = json.Unmarshal(raw, &e)
	if resp.StatusCode != http.StatusUnauthorized || e.Type != "error" || e.Error != "unauthorized" || e.Message == "" ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		s.T.Fatalf("%s: %s %s answered %d %q %s, want 401 JSON {type:error, error:unauthorized, message}", why, method, path, resp.StatusCode, resp.Header.Get("Content-Type"), raw)
	}
}

// login posts the sign-in form (as the page does: same origin) and returns
// the answer, the body and the new session cookie ("" when none was set).
func login(s *apptest.Server, name, password, next string, extra http.Header) (*http.Response, string, string) {
	s.T.Helper()
	form := url.Values{"name": {name}, "password": {password}, "next": {next}}
	req, err := http.NewRequest("POST", s.Base+"/login", strings.NewReader(form.Encode()))
	if err != nil {
		s.T.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range extra {
		req.Header[k] = v
	}
	resp, err := noRedirects.Do(req)
	if err != nil {
		s.T.Fatalf("POST /login: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	cookie := ""
	for _, c := range resp.Cookies() {
		if c.Name == "gateway_session" && c.MaxAge >= 0 && c.Value != "" {
			cookie = c.Value
		}
	}
	return resp, string(body), cookie
}

// signIn requires a successful sign-in and returns the session cookie.
func signIn(s *apptest.Server, name, password string) string {
	s.T.Helper()
	resp, body, cookie := login(s, name, password, "/", nil)
	if resp.StatusCode != http.StatusSeeOther || cookie == "" {
		s.T.Fatalf("sign in as %s: %d, cookie %q, body %.300s; want 303 with a session cookie", name, resp.StatusCode, cookie, body)
	}
	return cookie
}

// wantSignInRefused requires a sign-in to fail with status (401 or 429)
// and the page's error, and no cookie.
func wantSignInRefused(s *apptest.Server, name, password string, status int, why string) *http.Response {
	s.T.Helper()
	resp, body, cookie := login(s, name, password, "/", nil)
	if resp.StatusCode != status || cookie != "" || !strings.Contains(body, `data-testid="login-error"`) {
		s.T.Fatalf("%s: sign in as %s answered %d (cookie %q), want %d with the form's error; body %.400s", why, name, resp.StatusCode, cookie, status, body)
	}
	return resp
}

// wsClient is one raw WebSocket connection speaking the /ws protocol, for
// tests whose subject is how the server ends a connection (its close code)
// or what it leaves unanswered, which client.Conn handles by itself (it
// reconnects, or ends with an *Error). The others connect with the
// protocol client (connect).
type wsClient struct {
	t    testing.TB
	conn *websocket.Conn
	n    int
}

// dialWS opens /ws as w. It returns the handshake answer (its body is
// readable when the upgrade was refused).
func dialWS(s *apptest.Server, w who) (*wsClient, *http.Response, error) {
	s.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := http.Header{}
	w.apply(h)
	conn, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(s.Base, "http")+"/ws", &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		return nil, resp, err
	}
	conn.SetReadLimit(16 << 20)
	s.T.Cleanup(func() { conn.CloseNow() })
	return &wsClient{t: s.T, conn: conn}, resp, nil
}

// mustDialWS requires the upgrade to succeed and the hello to be acked.
func mustDialWS(s *apptest.Server, w who, why string) *wsClient {
	s.T.Helper()
	c, resp, err := dialWS(s, w)
	if err != nil {
		status, body := 0, []byte(nil)
		if resp != nil {
			status = resp.StatusCode
			body, _ = io.ReadAll(resp.Body)
		}
		s.T.Fatalf("%s: /ws refused (%d %s): %v", why, status, body, err)
	}
	if ack := c.cmd(map[string]any{"type": "hello", "tab_id": "auth-test"}); ack["type"] != "ack" {
		s.T.Fatalf("%s: hello answered %v, want an ack", why, ack)
	}
	return c
}

// send writes one command as it is (with its own id) and does not wait
// for an answer.
func (c *wsClient) send(m map[string]any) {
	c.t.Helper()
	b, _ := json.Marshal(m)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.conn.Write(ctx, websocket.MessageText, b); err != nil {
		c.t.Fatalf("ws send %s: %v", m["type"], err)
	}
}

// cmd sends one command and returns its ack or error, skipping events.
func (c *wsClient) cmd(m map[string]any) map[string]any {
	c.t.Helper()
	c.n++
	id := fmt.Sprintf("c%d", c.n)
	m["id"] = id
	c.send(m)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		_, frame, err := c.conn.Read(ctx)
		if err != nil {
			c.t.Fatalf("ws: no answer to %s: %v", m["type"], err)
		}
		for _, line := range bytes.Split(frame, []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			var obj map[string]any
			if err := json.Unmarshal(line, &obj); err != nil {
				c.t.Fatalf("ws frame line is not JSON: %v: %s", err, line)
			}
			if obj["re"] == id {
				return obj
			}
		}
	}
}

// waitRun polls the run until it is completed.
func waitRun(s *apptest.Server, runID string) {
	s.T.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := s.Run(runID)
		switch r.Status {
		case chat.RunCompleted:
			return
		case chat.RunFailed, chat.RunCancelled:
			s.T.Fatalf("run %s ended %s", runID, r.Status)
		}
		if time.Now().After(deadline) {
			s.T.Fatalf("run %s still %s after 30s", runID, r.Status)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
}

// threadList is the ids of GET /api/threads as w.
func threadList(s *apptest.Server, w who) []string {
	s.T.Helper()
	var ids []string
	for _, th := range as(s, w).Threads() {
		ids = append(ids, th.ThreadID)
	}
	return ids
}

// authConfig is CommandConfig (5ms a word) under -auth mode, with
// -trusted-proxies proxies ("": none).
func authConfig(t *testing.T, db string, mode auth.Mode, proxies string) app.Config {
	t.Helper()
	cfg := apptest.CommandConfig(db, 5*time.Millisecond)
	cfg.AuthMode, cfg.TrustedProxies = mode, prefixesOf(t, proxies)
	return cfg
}

// headerConfig is authConfig under -auth header, the user named by the
// header header of the proxies.
func headerConfig(t *testing.T, db, proxies, header string) app.Config {
	t.Helper()
	cfg := authConfig(t, db, auth.ModeHeader, proxies)
	cfg.AuthHeader = header
	return cfg
}
