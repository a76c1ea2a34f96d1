// Helpers of the accounts tests (main_auth_test.go): users and tokens made
// with the CLI, sign-in as a browser does it, a WebSocket client with a
// session or a token, and the flags' refusals.

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
)

// addUser runs `gateway user add NAME -db DB` with the password on stdin.
func addUser(t *testing.T, db, name, password string) {
	t.Helper()
	code, out, errOut := runCLIWith(t, nil, password+"\n", "user", "add", name, "-db", db)
	if code != 0 || !strings.Contains(out, "created user "+strings.ToLower(name)) {
		t.Fatalf("user add %s: exit %d, stdout %q, stderr %q; want 0 and \"created user\"", name, code, out, errOut)
	}
}

// dbWithUser is a new database in the test's temporary folder holding one
// account, name with password; it returns the database's path.
func dbWithUser(t *testing.T, name, password string) string {
	t.Helper()
	db := filepath.Join(t.TempDir(), "gw.db")
	addUser(t, db, name, password)
	return db
}

var tokenLine = regexp.MustCompile(`^(tok_[A-Za-z0-9]+)\.[A-Za-z0-9]+\n$`)

// createToken runs `gateway token create` and returns the whole token and
// its id; the token is the only line on stdout.
func createToken(t *testing.T, db, user string, extra ...string) (token, id string) {
	t.Helper()
	code, out, errOut := runCLI(t, nil, append([]string{"token", "create", "-user", user, "-db", db}, extra...)...)
	m := tokenLine.FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("token create -user %s: exit %d, stdout %q, stderr %q; want 0 and one line tok_<id>.<secret>", user, code, out, errOut)
	}
	if !strings.Contains(errOut, m[1]) || !strings.Contains(errOut, "gateway token revoke "+m[1]) {
		t.Errorf("token create: stderr %q does not name the token id %s and how to revoke it", errOut, m[1])
	}
	return strings.TrimSpace(out), m[1]
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
func (s *server) send(w who, method, path string, body any) (*http.Response, []byte) {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			s.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, s.base+path, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	w.apply(req.Header)
	resp, err := noRedirects.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp, raw
}

// as is the server seen through a protocol client carrying w's
// credential: its typed calls (snapshot, startRun, threads, connect, …)
// are made as w.
func (s *server) as(w who) *server {
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
	return &server{t: s.t, db: s.db, base: s.base, Server: s.Server.As(w.header, opts...)}
}

// wantUnauthorized requires the API's 401 in the protocol's error shape.
// Raw: its subject is the answer on the wire (status, Content-Type, the
// "type" field), which the client does not show.
func (s *server) wantUnauthorized(w who, method, path, why string) {
	s.t.Helper()
	var body any
	if method == "POST" {
		body = map[string]any{}
	}
	resp, raw := s.send(w, method, path, body)
	var e struct{ Type, Error, Message string }
	_ = json.Unmarshal(raw, &e)
	if resp.StatusCode != http.StatusUnauthorized || e.Type != "error" || e.Error != "unauthorized" || e.Message == "" ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		s.t.Fatalf("%s: %s %s answered %d %q %s, want 401 JSON {type:error, error:unauthorized, message}", why, method, path, resp.StatusCode, resp.Header.Get("Content-Type"), raw)
	}
}

// wantLoginRedirect requires a page to send the browser to /login?next=path.
func (s *server) wantLoginRedirect(w who, path, why string) {
	s.t.Helper()
	resp, raw := s.send(w, "GET", path, nil)
	want := "/login?next=" + url.QueryEscape(path)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != want {
		s.t.Fatalf("%s: GET %s answered %d Location %q (%.200s), want 303 to %s", why, path, resp.StatusCode, resp.Header.Get("Location"), raw, want)
	}
}

// login posts the sign-in form (as the page does: same origin) and returns
// the answer, the body and the new session cookie ("" when none was set).
func (s *server) login(name, password, next string, extra http.Header) (*http.Response, string, string) {
	s.t.Helper()
	form := url.Values{"name": {name}, "password": {password}, "next": {next}}
	req, err := http.NewRequest("POST", s.base+"/login", strings.NewReader(form.Encode()))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range extra {
		req.Header[k] = v
	}
	resp, err := noRedirects.Do(req)
	if err != nil {
		s.t.Fatalf("POST /login: %v", err)
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
func (s *server) signIn(name, password string) string {
	s.t.Helper()
	resp, body, cookie := s.login(name, password, "/", nil)
	if resp.StatusCode != http.StatusSeeOther || cookie == "" {
		s.t.Fatalf("sign in as %s: %d, cookie %q, body %.300s; want 303 with a session cookie", name, resp.StatusCode, cookie, body)
	}
	return cookie
}

// wantSignInRefused requires a sign-in to fail with status (401 or 429)
// and the page's error, and no cookie.
func (s *server) wantSignInRefused(name, password string, status int, why string) *http.Response {
	s.t.Helper()
	resp, body, cookie := s.login(name, password, "/", nil)
	if resp.StatusCode != status || cookie != "" || !strings.Contains(body, `data-testid="login-error"`) {
		s.t.Fatalf("%s: sign in as %s answered %d (cookie %q), want %d with the form's error; body %.400s", why, name, resp.StatusCode, cookie, status, body)
	}
	return resp
}

// wsClient is one raw WebSocket connection speaking the /ws protocol, for
// tests whose subject is how the server ends a connection (its close code)
// or what it leaves unanswered, which client.Conn handles by itself (it
// reconnects, or ends with an *Error). The others connect with the
// protocol client (connect).
type wsClient struct {
	t    *testing.T
	conn *websocket.Conn
	n    int
}

// dialWS opens /ws as w. It returns the handshake answer (its body is
// readable when the upgrade was refused).
func (s *server) dialWS(w who) (*wsClient, *http.Response, error) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := http.Header{}
	w.apply(h)
	conn, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(s.base, "http")+"/ws", &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		return nil, resp, err
	}
	conn.SetReadLimit(16 << 20)
	s.t.Cleanup(func() { conn.CloseNow() })
	return &wsClient{t: s.t, conn: conn}, resp, nil
}

// mustDialWS requires the upgrade to succeed and the hello to be acked.
func (s *server) mustDialWS(w who, why string) *wsClient {
	s.t.Helper()
	c, resp, err := s.dialWS(w)
	if err != nil {
		status, body := 0, []byte(nil)
		if resp != nil {
			status = resp.StatusCode
			body, _ = io.ReadAll(resp.Body)
		}
		s.t.Fatalf("%s: /ws refused (%d %s): %v", why, status, body, err)
	}
	if ack := c.cmd(map[string]any{"type": "hello", "tab_id": "auth-test"}); ack["type"] != "ack" {
		s.t.Fatalf("%s: hello answered %v, want an ack", why, ack)
	}
	return c
}

// wantWSRefused requires the upgrade to be answered 401 in JSON. Raw: the
// subject is the refusal's wire shape (the client's *Error drops "type").
func (s *server) wantWSRefused(w who, why string) {
	s.t.Helper()
	c, resp, err := s.dialWS(w)
	if err == nil {
		c.conn.CloseNow()
		s.t.Fatalf("%s: /ws was upgraded, want 401", why)
	}
	if resp == nil {
		s.t.Fatalf("%s: /ws failed without an HTTP answer: %v", why, err)
	}
	body, _ := io.ReadAll(resp.Body)
	var e struct{ Type, Error string }
	_ = json.Unmarshal(body, &e)
	if resp.StatusCode != http.StatusUnauthorized || e.Type != "error" || e.Error != "unauthorized" {
		s.t.Fatalf("%s: /ws answered %d %s, want 401 {type:error, error:unauthorized}", why, resp.StatusCode, body)
	}
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

// subscribe subscribes conn to a thread from its start, requiring the ack.
func subscribe(t *testing.T, conn *client.Conn, threadID string, why string) *client.Subscription {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub, err := conn.Subscribe(ctx, threadID, 0)
	if err != nil {
		t.Fatalf("%s: subscribe to %s: %v", why, threadID, err)
	}
	return sub
}

// waitRun polls the run until it is completed.
func (s *server) waitRun(runID string) {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := s.Run(runID)
		switch r.Status {
		case chat.RunCompleted:
			return
		case chat.RunFailed, chat.RunCancelled:
			s.t.Fatalf("run %s ended %s", runID, r.Status)
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("run %s still %s after 30s", runID, r.Status)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
}

// threadList is the ids of GET /api/threads as w.
func (s *server) threadList(w who) []string {
	s.t.Helper()
	var ids []string
	for _, th := range s.as(w).Threads() {
		ids = append(ids, th.ThreadID)
	}
	return ids
}

// startOrRefuse runs `gateway serve args…` until it exits (its code and
// stderr) or logs "gateway serving" (then it is killed at once: served).
func startOrRefuse(t *testing.T, env []string, args ...string) (code int, stderr string, served bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, gatewayBinary(t), args...)
	cmd.Env = childEnv(env...)
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var lines []string
	sc := bufio.NewScanner(pipe)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if strings.Contains(sc.Text(), `msg="gateway serving"`) {
			served = true
			_ = cmd.Process.Kill()
			break
		}
	}
	_, _ = io.Copy(io.Discard, pipe)
	err = cmd.Wait()
	if ctx.Err() != nil {
		t.Fatalf("gateway %s neither exited nor served within 30s; stderr:\n%s", strings.Join(args, " "), strings.Join(lines, "\n"))
	}
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("gateway %s: %v", strings.Join(args, " "), err)
	}
	noRace(t, "gateway "+strings.Join(args, " "), strings.Join(lines, "\n"))
	return cmd.ProcessState.ExitCode(), strings.Join(lines, "\n"), served
}

// unreachableAddr is an address of TEST-NET-1 (RFC 5737) that no
// interface holds, for a non-loopback -addr whose configuration must pass
// while nothing is ever reachable on it; it skips the test on a host that
// holds the address.
func unreachableAddr(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if strings.HasPrefix(a.String(), "192.0.2.1/") {
			t.Skip("this host holds 192.0.2.1: listening on it could be reachable")
		}
	}
	return "192.0.2.1:0"
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// ---------------------------------------------------------------------------
// (a) Starting: what the serve flags refuse and accept.
