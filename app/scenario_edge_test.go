package app_test

// The edge of a whole gateway: the Host allowlist that stops a web page
// reaching the server through DNS rebinding (-allowed-hosts: Config.Hosts;
// the flags themselves are tested in the root package), the security
// headers, and (with shortened timeouts) the body read deadline and the
// idle timeout.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
)

// hostCall sends method path to base with the Host header host and the
// extra headers; body "" sends none. It returns the answer's status,
// headers and body. Raw: the subject of these tests is the request and
// the answer on the wire (Host, Origin, Sec-Fetch-Site, security headers,
// the exact status and error shape of a refusal).
func hostCall(t *testing.T, base, method, path, host string, hdr map[string]string, body string) (int, http.Header, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s (Host %s): %v", method, path, host, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s (Host %s): read body: %v", method, path, host, err)
	}
	return resp.StatusCode, resp.Header, raw
}

// dialHost opens /ws of base with the Host header host and headers hdr,
// raw: for the refusal's wire shape (see wantForbidden).
func dialHost(base, host string, hdr map[string]string) (*websocket.Conn, *http.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := http.Header{}
	for k, v := range hdr {
		h.Set(k, v)
	}
	return websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/ws", &websocket.DialOptions{Host: host, HTTPHeader: h})
}

// wantForbidden requires a 403 answer in the protocol's error shape.
func wantForbidden(t *testing.T, what string, status int, raw []byte) {
	t.Helper()
	var e struct{ Type, Error, Message string }
	if err := json.Unmarshal(raw, &e); err != nil || status != http.StatusForbidden || e.Type != "error" || e.Error != "forbidden" || e.Message == "" {
		t.Errorf("%s: %d %.300s; want 403 {type:error, error:forbidden, message}", what, status, raw)
	}
}

// dbFingerprint is every table's row count and each thread's version,
// last seq, title and update time, read from the SQLite file (read-only) while the server runs:
// if a request changed anything a user could see, it changes.
func dbFingerprint(t *testing.T, path string) string {
	t.Helper()
	db := auditDB(t, path)
	defer db.Close()
	rows, err := db.Query(`SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, name)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	var b strings.Builder
	for _, name := range tables {
		fmt.Fprintf(&b, "%s=%d ", name, queryValue[int](t, db, `SELECT count(*) FROM "`+name+`"`))
	}
	threads := queryValue[string](t, db, `SELECT coalesce(group_concat(v, ','), '') FROM (SELECT thread_id || ':' || state_version || ':' || last_seq || ':' || title || ':' || updated_at AS v FROM threads ORDER BY thread_id)`)
	if len(tables) < 5 || !strings.Contains(b.String(), "threads=") {
		t.Fatalf("the database %s has tables %v: not the gateway's?", path, tables)
	}
	return b.String() + "threads: " + threads
}

func portOf(t *testing.T, base string) string {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil || u.Port() == "" {
		t.Fatalf("no port in %q", base)
	}
	return u.Port()
}

// A page served under a name of its own that resolves to 127.0.0.1 (DNS
// rebinding) sends that name as Host and, being "same-origin" to itself,
// a matching Origin. In the default mode (-auth none, loopback) every
// surface refuses it with 403 forbidden before doing anything: nothing in
// the database changes. The loopback names, on any port, pass.
func TestHostAllowlistStopsDNSRebinding(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	srv := apptest.Start(t, apptest.CommandConfig(db, 5*time.Millisecond))
	port := portOf(t, srv.Base)
	th := srv.CreateThread()
	threadsBefore := threadList(srv, who{})
	before := dbFingerprint(t, db)

	surfaces := []struct {
		name, method, path, body string
		api                      bool // answered in the protocol's JSON error shape
	}{
		{"create a thread", "POST", "/api/threads", `{}`, true},
		{"list every conversation", "GET", "/api/threads", "", true},
		{"read a conversation", "GET", "/api/threads/" + th.ThreadID, "", true},
		{"start a run", "POST", "/api/threads/" + th.ThreadID + "/runs", `{"expected_state_version":1,"user_message":"short: leak"}`, true},
		{"the event stream (SSE)", "GET", "/api/threads/" + th.ThreadID + "/events?after_seq=0", "", true},
		{"the home page", "GET", "/", "", false},
		{"a conversation's page", "GET", "/t/" + th.ThreadID, "", false},
		{"the new-conversation form", "POST", "/threads", "", false},
		{"a rename form", "POST", "/t/" + th.ThreadID + "/rename", "title=pwned", false},
	}
	for _, host := range []string{"evil.example:" + port, "evil.example", "127.0.0.1.nip.io:" + port, "localhost.evil.example:" + port, "xn--lcalhost-9za:" + port} {
		for _, origin := range []bool{false, true} {
			hdr := map[string]string{}
			if origin {
				hdr["Origin"] = "http://" + host
				hdr["Sec-Fetch-Site"] = "same-origin"
			}
			for _, s := range surfaces {
				h := map[string]string{}
				for k, v := range hdr {
					h[k] = v
				}
				switch {
				case s.body != "" && s.api:
					h["Content-Type"] = "application/json"
				case s.body != "":
					h["Content-Type"] = "application/x-www-form-urlencoded"
				}
				if strings.HasSuffix(s.path, "/events?after_seq=0") {
					h["Accept"] = "text/event-stream"
				}
				what := fmt.Sprintf("%s (%s %s, Host %s, Origin %v)", s.name, s.method, s.path, host, origin)
				status, header, raw := hostCall(t, srv.Base, s.method, s.path, host, h, s.body)
				if s.api {
					wantForbidden(t, what, status, raw)
					continue
				}
				if status != http.StatusForbidden || !strings.HasPrefix(header.Get("Content-Type"), "text/plain") ||
					!strings.Contains(string(raw), "Forbidden") || header.Get("X-Content-Type-Options") != "nosniff" {
					t.Errorf("%s: %d %q %.200s; want a plain 403 page", what, status, header.Get("Content-Type"), raw)
				}
			}
			c, resp, err := dialHost(srv.Base, host, hdr)
			if err == nil {
				c.CloseNow()
				t.Errorf("GET /ws with Host %s (Origin %v) was upgraded", host, origin)
				continue
			}
			if resp == nil {
				t.Errorf("GET /ws with Host %s: no HTTP answer: %v", host, err)
				continue
			}
			raw, _ := io.ReadAll(resp.Body)
			wantForbidden(t, fmt.Sprintf("GET /ws with Host %s (Origin %v)", host, origin), resp.StatusCode, raw)
		}
	}

	// A request without Host (HTTP/1.0) is refused too.
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(srv.Base, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "POST /api/threads HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("HTTP/1.0 without Host: %v", err)
	}
	raw, _ := io.ReadAll(resp.Body)
	conn.Close()
	wantForbidden(t, "POST /api/threads over HTTP/1.0 without Host", resp.StatusCode, raw)

	if after := dbFingerprint(t, db); after != before {
		t.Errorf("refused requests changed the database:\nbefore %s\nafter  %s", before, after)
	}
	if got := threadList(srv, who{}); len(got) != len(threadsBefore) {
		t.Errorf("refused requests changed the conversations: %v, had %v", got, threadsBefore)
	}
	if snap := srv.Snapshot(th.ThreadID); snap.StateVersion != th.StateVersion || snap.LastSeq != th.LastSeq {
		t.Errorf("refused requests changed the thread: version %d last seq %d, was %d %d", snap.StateVersion, snap.LastSeq, th.StateVersion, th.LastSeq)
	}

	// Health probes come from load balancers by address: they answer
	// whatever the Host, and tell nothing.
	for _, path := range []string{"/livez", "/readyz"} {
		if status, _, raw := hostCall(t, srv.Base, "GET", path, "10.1.2.3:"+port, nil, ""); status != http.StatusOK {
			t.Errorf("GET %s with Host 10.1.2.3: %d %s, want 200", path, status, raw)
		}
	}

	// The loopback names pass, on any port, in any case, with a trailing
	// dot; so does a page on them (same Origin).
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "[::1]:" + port, "LocalHost.:8443", "[0:0:0:0:0:0:0:1]:1", "127.0.0.1"} {
		same := map[string]string{"Origin": "http://" + host, "Sec-Fetch-Site": "same-origin", "Content-Type": "application/json"}
		if status, _, raw := hostCall(t, srv.Base, "GET", "/api/threads", host, nil, ""); status != http.StatusOK {
			t.Errorf("GET /api/threads with Host %s: %d %s, want 200", host, status, raw)
		}
		if status, _, raw := hostCall(t, srv.Base, "POST", "/api/threads", host, same, `{}`); status != http.StatusCreated {
			t.Errorf("POST /api/threads with Host %s from its own page: %d %s, want 201", host, status, raw)
		}
		if status, _, raw := hostCall(t, srv.Base, "GET", "/", host, nil, ""); status != http.StatusOK {
			t.Errorf("GET / with Host %s: %d %.200s, want 200", host, status, raw)
		}
		// A tab of a page on that name: the protocol client sends the
		// name as Host and the page's Origin, and says hello.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		conn, err := apptest.NewAPI(t, srv.Base, 15*time.Second, nil, client.WithHost(host), client.WithOrigin("http://"+host)).
			Connect(ctx, client.ConnOptions{TabID: "edge"})
		cancel()
		if err != nil {
			t.Errorf("GET /ws with Host %s, then hello: %v, want an upgrade and an ack", host, err)
			continue
		}
		conn.Close()
	}
	srv.Stop()
	checkDB(t, db)
}

// /readyz answers whatever the Host (load balancers probe it by address),
// but names the MCP servers only to a Host the server answers to: a page
// on a rebinding name, or anyone probing by address, learns "ready" and
// nothing of the configuration. The page's own fetch (its own Host) still
// gets the list it shows.
func TestReadyzNamesToolServersToItsOwnHostOnly(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "tools.json")
	// A server that refuses connections: listed, not connected.
	if err := os.WriteFile(cfg, []byte(`{"mcp_servers": [{"name": "crm_internal", "url": "http://127.0.0.1:1/"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	gw := apptest.CommandConfig(filepath.Join(dir, "gw.db"), 5*time.Millisecond)
	gw.ToolsConfig = cfg
	srv := apptest.Start(t, gw)
	port := portOf(t, srv.Base)
	for _, host := range []string{"evil.example:" + port, "10.1.2.3:" + port, "127.0.0.1.nip.io"} {
		status, _, raw := hostCall(t, srv.Base, "GET", "/readyz", host, nil, "")
		if status != http.StatusOK || strings.TrimSpace(string(raw)) != `{"status":"ready"}` {
			t.Errorf("GET /readyz with the foreign Host %s: %d %s, want 200 {\"status\":\"ready\"} alone", host, status, raw)
		}
	}
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port} {
		status, _, raw := hostCall(t, srv.Base, "GET", "/readyz", host, nil, "")
		var ready struct {
			Status      string `json:"status"`
			ToolServers []struct {
				Name      string `json:"name"`
				Connected bool   `json:"connected"`
			} `json:"tool_servers"`
		}
		if err := json.Unmarshal(raw, &ready); err != nil || status != http.StatusOK || ready.Status != "ready" ||
			len(ready.ToolServers) != 1 || ready.ToolServers[0].Name != "crm_internal" || ready.ToolServers[0].Connected {
			t.Errorf("GET /readyz with its own Host %s: %d %s, want 200 naming crm_internal, not connected", host, status, raw)
		}
	}
	srv.Stop()
}

// -allowed-hosts adds names (and *.NAME patterns) to the loopback ones;
// everything else is still refused.
func TestAllowedHostsPatterns(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	cfg := apptest.CommandConfig(db, 5*time.Millisecond)
	cfg.Hosts = hostsOf(t, "*.example.test, chat.other.test").Union(cfg.Hosts)
	srv := apptest.Start(t, cfg)
	port := portOf(t, srv.Base)
	for host, want := range map[string]bool{
		"a.example.test:" + port:   true,
		"A.B.Example.Test.":        true,
		"chat.other.test:" + port:  true,
		"CHAT.OTHER.TEST":          true,
		"localhost:" + port:        true,
		"127.0.0.1:" + port:        true,
		"example.test:" + port:     false, // the pattern covers names under it only
		"x.chat.other.test":        false,
		"evilexample.test":         false,
		"a.example.test.evil.test": false,
		"other.test":               false,
	} {
		status, _, raw := hostCall(t, srv.Base, "GET", "/api/threads", host, nil, "")
		if want && status != http.StatusOK {
			t.Errorf("Host %s: %d %s, want 200", host, status, raw)
		}
		if !want {
			wantForbidden(t, "Host "+host, status, raw)
		}
	}
	if !strings.Contains(srv.Stderr(), `msg="answering to host names" hosts=`) || !strings.Contains(srv.Stderr(), "*.example.test") {
		t.Errorf("the log does not say which names the server answers to:\n%s", srv.Stderr())
	}
	srv.Stop()

	// '*' said explicitly answers to every name, with a warning.
	db = filepath.Join(t.TempDir(), "any.db")
	cfg = apptest.CommandConfig(db, 5*time.Millisecond)
	cfg.Hosts = hostsOf(t, "*").Union(cfg.Hosts)
	srv = apptest.Start(t, cfg)
	if status, _, raw := hostCall(t, srv.Base, "GET", "/api/threads", "anything.example", nil, ""); status != http.StatusOK {
		t.Errorf("-allowed-hosts '*': Host anything.example answered %d %s, want 200", status, raw)
	}
	if srv.Logged("-allowed-hosts '*': answering to every host name, so a web page can reach this server through DNS rebinding") != 1 {
		t.Errorf("-allowed-hosts '*' did not warn:\n%s", srv.Stderr())
	}
	srv.Stop()
}

// The admin listener (profiles, metrics) is on loopback and answers to
// the loopback names only: a rebinding page cannot read it either.
func TestAdminListenerAnswersLoopbackNamesOnly(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	cfg := apptest.CommandConfig(db, 5*time.Millisecond)
	cfg.AdminAddr, cfg.AdminHosts = "127.0.0.1:0", cfg.Hosts
	cfg.Hosts = hostsOf(t, "chat.example.test").Union(cfg.Hosts)
	srv := apptest.Start(t, cfg)
	admin := strings.TrimSuffix(srv.AdminURL(), "/debug/pprof/")
	port := portOf(t, admin)
	for _, host := range []string{"evil.example:" + port, "chat.example.test:" + port} {
		for _, path := range []string{"/metrics", "/debug/pprof/goroutine?debug=1"} {
			if status, _, raw := hostCall(t, admin, "GET", path, host, nil, ""); status != http.StatusForbidden {
				t.Errorf("admin %s with Host %s: %d %.200s, want 403", path, host, status, raw)
			}
		}
	}
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port} {
		if status, _, raw := hostCall(t, admin, "GET", "/metrics", host, nil, ""); status != http.StatusOK || !strings.Contains(string(raw), "gateway_") {
			t.Errorf("admin /metrics with Host %s: %d %.200s, want 200 and the metrics", host, status, raw)
		}
	}
	srv.Stop()
}

// The admin listener (-admin-addr: Config.AdminAddr) serves Go's
// profiles; the public listener does not. (A public -admin-addr is
// refused at start: TestAdminAddrMustBeLoopback, in the root package.)
func TestAdminListener(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	cfg := apptest.CommandConfig(db, 5*time.Millisecond)
	cfg.AdminAddr, cfg.AdminHosts = "127.0.0.1:0", cfg.Hosts
	srv := apptest.Start(t, cfg)
	admin := srv.AdminURL()
	resp, err := http.Get(admin + "goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "goroutine profile") {
		t.Fatalf("pprof goroutine profile: %d %.200s", resp.StatusCode, body)
	}
	// The public listener does not serve profiles.
	resp, err = http.Get(srv.Base + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == 200 {
		t.Fatal("the public listener serves /debug/pprof/")
	}
	srv.Stop()
}

// Strict-Transport-Security only when the request came over HTTPS: here,
// a trusted proxy that says so (the binary itself serves no TLS; TLS on the
// connection is tested in package gateway). Pages carry COOP and a
// Permissions-Policy besides their CSP.
func TestEdgeHeaders(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	cfg := apptest.CommandConfig(db, 5*time.Millisecond)
	cfg.TrustedProxies = prefixesOf(t, "127.0.0.1")
	srv := apptest.Start(t, cfg)
	host := "127.0.0.1:" + portOf(t, srv.Base)
	https := map[string]string{"X-Forwarded-Proto": "https"}
	for _, path := range []string{"/", "/api/threads", "/login", "/static/nonexistent"} {
		if _, h, _ := hostCall(t, srv.Base, "GET", path, host, https, ""); h.Get("Strict-Transport-Security") != "max-age=31536000" {
			t.Errorf("GET %s from a trusted proxy saying https: Strict-Transport-Security %q, want max-age=31536000", path, h.Get("Strict-Transport-Security"))
		}
		if _, h, _ := hostCall(t, srv.Base, "GET", path, host, nil, ""); h.Get("Strict-Transport-Security") != "" {
			t.Errorf("GET %s over plain HTTP: Strict-Transport-Security %q, want none", path, h.Get("Strict-Transport-Security"))
		}
	}
	status, h, _ := hostCall(t, srv.Base, "GET", "/", host, nil, "")
	if status != http.StatusOK {
		t.Fatalf("GET /: %d", status)
	}
	for k, want := range map[string]string{
		"Cross-Origin-Opener-Policy": "same-origin",
		"X-Content-Type-Options":     "nosniff",
	} {
		if got := h.Get(k); got != want {
			t.Errorf("GET /: %s = %q, want %q", k, got, want)
		}
	}
	if pp := h.Get("Permissions-Policy"); !strings.Contains(pp, "camera=()") || !strings.Contains(pp, "microphone=()") || !strings.Contains(pp, "geolocation=()") {
		t.Errorf("GET /: Permissions-Policy %q, want camera, microphone and geolocation off", pp)
	}
	if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("GET /: Content-Security-Policy %q lost frame-ancestors 'none'", csp)
	}
	srv.Stop()

	// A proxy that is not trusted cannot turn HSTS on.
	db = filepath.Join(t.TempDir(), "untrusted.db")
	cfg = apptest.CommandConfig(db, 5*time.Millisecond)
	cfg.TrustedProxies = prefixesOf(t, "10.0.0.0/8")
	srv = apptest.Start(t, cfg)
	if _, h, _ := hostCall(t, srv.Base, "GET", "/", "127.0.0.1", https, ""); h.Get("Strict-Transport-Security") != "" {
		t.Errorf("X-Forwarded-Proto from an untrusted peer set Strict-Transport-Security %q", h.Get("Strict-Transport-Security"))
	}
	srv.Stop()
}

// The server the App wires cuts a request body that does not arrive
// within the body timeout, and an idle keep-alive connection after the
// idle timeout, while an event stream and a WebSocket opened before stay
// open past both and keep delivering. The timeouts are shortened (30s and
// 2min in the binary).
func TestSlowBodyIsCutStreamsStay(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	cfg := apptest.CommandConfig(db, 5*time.Millisecond)
	cfg.BodyTimeout, cfg.IdleTimeout = 400*time.Millisecond, 400*time.Millisecond
	srv := apptest.Start(t, cfg)
	// Run must end without error once the test is done with it (the
	// command's exit status 0).
	defer srv.Stop()
	th := srv.CreateThread()
	sse := srv.Events(th.ThreadID, th.LastSeq)
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	ws, err := srv.API().Connect(sctx, client.ConnOptions{})
	if err != nil {
		cancel()
		t.Fatalf("open /ws: %v", err)
	}
	defer ws.Close()
	sub, err := ws.Subscribe(sctx, th.ThreadID, th.LastSeq)
	cancel()
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}

	addr := strings.TrimPrefix(srv.Base, "http://")
	// An idle keep-alive connection is closed by the server.
	idle, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	_ = idle.SetDeadline(time.Now().Add(15 * time.Second))
	fmt.Fprintf(idle, "GET /livez HTTP/1.1\r\nHost: %s\r\n\r\n", addr)
	idleR := bufio.NewReader(idle)
	resp, err := http.ReadResponse(idleR, nil)
	if err != nil {
		t.Fatalf("GET /livez on the keep-alive connection: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	// A client sends the headers of a body, then a byte at a time, slower
	// than it could ever finish: the server cuts it.
	slow, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	fmt.Fprintf(slow, "POST /api/threads HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{", addr)
	writerDone := make(chan struct{})
	stopWriting := make(chan struct{})
	go func() {
		defer close(writerDone)
		tick := time.NewTicker(10 * time.Millisecond) // the slow client's pace, not a wait for anything
		defer tick.Stop()
		for {
			select {
			case <-stopWriting:
				return
			case <-tick.C:
				if _, err := slow.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	_ = slow.SetReadDeadline(time.Now().Add(15 * time.Second))
	resp, err = http.ReadResponse(bufio.NewReader(slow), nil)
	var ne net.Error
	switch {
	case err == nil:
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct{ Error, Message string }
		_ = json.Unmarshal(raw, &e)
		if resp.StatusCode != http.StatusBadRequest || e.Error != "invalid_request" || !strings.Contains(e.Message, "did not arrive within") {
			t.Errorf("the slow body was answered %d %s; want 400 invalid_request saying it did not arrive in time", resp.StatusCode, raw)
		}
	case errors.As(err, &ne) && ne.Timeout():
		t.Fatalf("a body sent a byte every 10ms was still being read after 15s: no body read deadline")
	default:
		// The server closed the connection (a reset can overtake the answer).
	}
	close(stopWriting)
	<-writerDone
	if got := threadList(srv, who{}); len(got) != 1 {
		t.Errorf("the cut request created something: threads %v", got)
	}

	// The idle connection was closed by now or is shortly.
	if _, err := idleR.ReadByte(); err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Errorf("the idle keep-alive connection is still open after 15s (read: %v): no idle timeout", err)
	}

	// The streams opened before the slow request outlived its deadline:
	// a run's events reach both.
	run := srv.StartRun(th.ThreadID, th.StateVersion, "short: still there?")
	deadline := time.Now().Add(20 * time.Second)
	sse.WaitFor(deadline, "run.completed on the event stream", func(ev client.Event) bool { return ev.Type == chat.EventRunCompleted && ev.RunID == run.RunID })
	wsCtx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	for seen := false; !seen; {
		ev, err := sub.Next(wsCtx)
		if err != nil {
			t.Fatalf("the WebSocket ended before run.completed: %v", err)
		}
		seen = ev.Type == chat.EventRunCompleted
	}
	// (The client would have reconnected a connection the server cut:
	// one connection means it was not.)
	if n := ws.Stats().Connects; n != 1 {
		t.Errorf("the WebSocket was cut and reconnected (%d connections)", n)
	}
	sse.Close()
}
