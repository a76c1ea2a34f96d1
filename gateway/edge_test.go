package gateway_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/honestcancel/gateway/gateway"
)

func TestHostsMatch(t *testing.T) {
	loop := gateway.LoopbackHosts()
	list, err := gateway.ParseHosts(" Chat.Example.com., *.corp.example , 192.0.2.7, [2001:DB8::1], ::2")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		hosts gateway.Hosts
		host  string
		want  bool
	}{
		{loop, "localhost", true},
		{loop, "localhost:8080", true},
		{loop, "LOCALHOST:1", true},
		{loop, "localhost.:8080", true},
		{loop, "127.0.0.1:8080", true},
		{loop, "127.0.0.1.:8080", true},
		{loop, "[::1]:8080", true},
		{loop, "[::1]", true},
		{loop, "[0:0:0:0:0:0:0:1]:80", true},
		{loop, "[::ffff:127.0.0.1]:80", true},
		{loop, "", false},
		{loop, ":8080", false},
		{loop, "::1", false}, // IPv6 in Host needs brackets
		{loop, "[::1", false},
		{loop, "[::1]x", false},
		{loop, "[::1]:80a", false},
		{loop, "localhost:http", false},
		{loop, "localhost..", false},
		{loop, "[localhost]", false},
		{loop, "127.0.0.2", false},
		{loop, "evil.example", false},
		{loop, "localhost.evil.example", false},
		{loop, "127.0.0.1.nip.io", false},
		{loop, "evil.localhost", false},
		{loop, "xn--lcalhost-9za", false},
		{loop, "lоcalhost", false}, // Cyrillic о
		{list, "chat.example.com", true},
		{list, "CHAT.EXAMPLE.COM:443", true},
		{list, "chat.example.com.", true},
		{list, "a.corp.example", true},
		{list, "a.b.corp.example:8443", true},
		{list, "corp.example", false},
		{list, "acorp.example", false},
		{list, "a.corp.example.evil", false},
		{list, "192.0.2.7:80", true},
		{list, "[2001:db8::1]:443", true},
		{list, "[2001:db8:0::1]", true},
		{list, "[::2]", true},
		{list, "localhost", false},
		{list, "www.chat.example.com", false},
		{list.Union(loop), "localhost:1", true},
		{list.Union(loop), "chat.example.com", true},
		{gateway.Hosts{}, "localhost", false},
	} {
		if got := tc.hosts.Allows(tc.host); got != tc.want {
			t.Errorf("%s allows %q = %v, want %v", tc.hosts, tc.host, got, tc.want)
		}
	}
	anyHost, err := gateway.ParseHosts("*")
	if err != nil || !anyHost.Any() || !anyHost.Allows("whatever.example:1") || anyHost.Allows("") {
		t.Errorf(`ParseHosts("*") = %v, %v: want every name but an empty one`, anyHost, err)
	}
	if h, err := gateway.ParseHosts(" , "); err != nil || !h.IsZero() {
		t.Errorf(`ParseHosts(" , ") = %v, %v: want no names`, h, err)
	}
	if got := list.String(); got != "*.corp.example,192.0.2.7,[2001:db8::1],[::2],chat.example.com" {
		t.Errorf("String() = %q", got)
	}
}

func TestParseHostsRefusesMalformedEntries(t *testing.T) {
	for _, list := range []string{
		"*.", "*", "*.*.example.com", "foo.*.example.com", "*example.com", "example.*",
		"http://chat.example.com", "chat.example.com/", "chat.example.com:443", "[::1]:443",
		"chat..example.com", ".example.com", "bücher.example", "chat example.com", "[::1", "[127.0.0.1]",
		"*.10.0.0.1", strings.Repeat("a", 64) + ".example", "*, chat.example.com",
	} {
		if list == "*" {
			continue // accepted alone
		}
		if h, err := gateway.ParseHosts(list); err == nil {
			t.Errorf("ParseHosts(%q) = %v, want an error", list, h)
		} else if !strings.Contains(err.Error(), "\"") {
			t.Errorf("ParseHosts(%q): %q does not quote the entry", list, err)
		}
	}
}

// A refused Host never reaches the handler (nothing is authenticated,
// read or upgraded): /api and /ws answer the protocol's forbidden error,
// other paths a plain page, and the connection closes after it.
func TestEdgeRefusesForeignHostsBeforeAnything(t *testing.T) {
	var reached atomic.Int32
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	})
	srv := httptest.NewServer(gateway.Edge(gateway.EdgeConfig{Hosts: gateway.LoopbackHosts(), Unchecked: []string{"/livez"}}, next))
	defer srv.Close()
	send := func(method, path, host, body string) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatalf("%s %s (Host %s): %v", method, path, host, err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp, raw
	}
	for _, path := range []string{"/api/threads", "/api", "/ws"} {
		resp, raw := send("POST", path, "evil.example", `{}`)
		var e struct{ Type, Error, Message string }
		if err := json.Unmarshal(raw, &e); err != nil || resp.StatusCode != http.StatusForbidden || e.Type != "error" || e.Error != "forbidden" ||
			!strings.Contains(e.Message, `"evil.example"`) || !strings.Contains(e.Message, "-allowed-hosts") {
			t.Errorf("POST %s with a foreign Host: %d %s; want 403 forbidden naming the host and -allowed-hosts", path, resp.StatusCode, raw)
		}
		if !resp.Close || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("POST %s with a foreign Host: close %v, nosniff %q; want the connection closed and nosniff", path, resp.Close, resp.Header.Get("X-Content-Type-Options"))
		}
	}
	for _, path := range []string{"/", "/t/thr_x", "/static/app.js", "/metrics", "/apiary", "/wsx"} {
		resp, raw := send("GET", path, "evil.example:8080", "")
		if resp.StatusCode != http.StatusForbidden || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") ||
			!strings.HasPrefix(string(raw), "Forbidden: This server does not answer to the host name") || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s with a foreign Host: %d %q %q; want a plain 403", path, resp.StatusCode, resp.Header.Get("Content-Type"), raw)
		}
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("%d refused requests reached the handler", n)
	}
	if resp, raw := send("GET", "/livez", "10.0.0.1:8080", ""); resp.StatusCode != http.StatusNoContent {
		t.Errorf("GET /livez (unchecked) with a foreign Host: %d %s, want it served", resp.StatusCode, raw)
	}
	if resp, raw := send("POST", "/api/threads", "localhost:9", `{}`); resp.StatusCode != http.StatusNoContent {
		t.Errorf("POST /api/threads with Host localhost: %d %s, want it served", resp.StatusCode, raw)
	}
	if n := reached.Load(); n != 2 {
		t.Fatalf("%d requests reached the handler, want 2", n)
	}
}

// Strict-Transport-Security marks answers that went over HTTPS only: TLS
// on the connection, or what HTTPS says (a trusted proxy).
func TestEdgeStrictTransportSecurity(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	hsts := func(srv *httptest.Server, hdr map[string]string) string {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+"/", nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.Header.Get("Strict-Transport-Security")
	}
	tlsSrv := httptest.NewTLSServer(gateway.Edge(gateway.EdgeConfig{Hosts: gateway.LoopbackHosts()}, ok))
	defer tlsSrv.Close()
	if got := hsts(tlsSrv, nil); got != "max-age=31536000" {
		t.Errorf("over TLS: Strict-Transport-Security %q, want max-age=31536000", got)
	}
	plain := httptest.NewServer(gateway.Edge(gateway.EdgeConfig{Hosts: gateway.LoopbackHosts()}, ok))
	defer plain.Close()
	if got := hsts(plain, map[string]string{"X-Forwarded-Proto": "https"}); got != "" {
		t.Errorf("plain HTTP (X-Forwarded-Proto believed from nobody): Strict-Transport-Security %q, want none", got)
	}
	proxied := httptest.NewServer(gateway.Edge(gateway.EdgeConfig{Hosts: gateway.LoopbackHosts(),
		HTTPS: func(r *http.Request) bool { return r.Header.Get("X-Forwarded-Proto") == "https" }}, ok))
	defer proxied.Close()
	if got := hsts(proxied, map[string]string{"X-Forwarded-Proto": "https"}); got != "max-age=31536000" {
		t.Errorf("a trusted proxy saying https: Strict-Transport-Security %q, want max-age=31536000", got)
	}
	if got := hsts(proxied, nil); got != "" {
		t.Errorf("a trusted proxy saying http: Strict-Transport-Security %q, want none", got)
	}
}

// The body deadline ends with the body: a handler that read its body in
// time and then works past the deadline keeps its request's context (once
// the body is read the server watches the connection for the client going
// away; that watch must not inherit the deadline).
func TestEdgeBodyDeadlineEndsWithTheBody(t *testing.T) {
	const timeout = 200 * time.Millisecond
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		work := time.NewTimer(4 * timeout) // the handler's work, longer than the deadline
		defer work.Stop()
		select {
		case <-r.Context().Done():
			http.Error(w, "context ended: "+context.Cause(r.Context()).Error(), http.StatusInternalServerError)
		case <-work.C:
			w.WriteHeader(http.StatusOK)
		}
	})
	srv := httptest.NewServer(gateway.Edge(gateway.EdgeConfig{Hosts: gateway.LoopbackHosts(), BodyTimeout: timeout}, next))
	defer srv.Close()
	for range 2 { // the second on the kept-alive connection
		resp, err := srv.Client().Post(srv.URL+"/api/threads", "application/json", strings.NewReader(`{"title":"x"}`))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("a handler working past the body deadline: %d %s, want 200", resp.StatusCode, raw)
		}
	}
}

// /readyz answers any Host, since load balancers probe it by address; but
// it names the tool servers (MCP) only to a request naming a Host the
// server answers to. A foreign Host (a rebinding page, a scanner, a
// balancer probing by address) learns the status and nothing else: not
// the names, not how many there are. Before it is ready, the same for all.
func TestReadyzTellsAForeignHostOnlyItsStatus(t *testing.T) {
	since := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	api := gateway.New(gateway.Config{ToolServers: func() []gateway.ToolServer {
		return []gateway.ToolServer{{Name: "crm-internal", Connected: true, Tools: 7, Since: since},
			{Name: "payroll", Connected: false, Since: since}}
	}})
	mux := http.NewServeMux()
	api.Routes(mux)
	hosts, err := gateway.ParseHosts("chat.example.com")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gateway.Edge(gateway.EdgeConfig{Hosts: hosts.Union(gateway.LoopbackHosts()),
		Unchecked: []string{"/livez", "/readyz"}}, mux))
	defer srv.Close()
	readyz := func(host string) (int, string) {
		t.Helper()
		req, err := http.NewRequest("GET", srv.URL+"/readyz", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(raw))
	}
	foreign := []string{"evil.example", "evil.example:8080", "10.0.0.1:8080", "[2001:db8::9]", "chat.example.com.evil.example"}
	for _, host := range foreign {
		if code, body := readyz(host); code != http.StatusServiceUnavailable || body != `{"status":"starting"}` {
			t.Errorf("/readyz with Host %q before ready: %d %s, want 503 {\"status\":\"starting\"}", host, code, body)
		}
	}
	api.SetReady()
	for _, host := range foreign {
		if code, body := readyz(host); code != http.StatusOK || body != `{"status":"ready"}` {
			t.Errorf("/readyz with the foreign Host %q: %d %s, want 200 {\"status\":\"ready\"} and nothing else", host, code, body)
		}
	}
	for _, host := range []string{"chat.example.com", "CHAT.example.com:443", "127.0.0.1:8080", "localhost"} {
		code, body := readyz(host)
		var got struct {
			Status      string               `json:"status"`
			ToolServers []gateway.ToolServer `json:"tool_servers"`
		}
		if err := json.Unmarshal([]byte(body), &got); err != nil || code != http.StatusOK || got.Status != "ready" ||
			len(got.ToolServers) != 2 || got.ToolServers[0].Name != "crm-internal" || got.ToolServers[0].Tools != 7 ||
			got.ToolServers[1].Name != "payroll" || got.ToolServers[1].Connected {
			t.Errorf("/readyz with its own Host %q: %d %s, want 200 with both tool servers", host, code, body)
		}
	}
	// Without the edge (nothing says the Host was checked), the status only.
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if body := strings.TrimSpace(rec.Body.String()); body != `{"status":"ready"}` {
		t.Errorf("/readyz not served through the edge: %s, want the status only", body)
	}
	// A drain before a stop says so, to every Host.
	api.SetStopping()
	for _, host := range append(foreign, "chat.example.com") {
		if code, body := readyz(host); code != http.StatusServiceUnavailable || body != `{"status":"stopping"}` {
			t.Errorf("/readyz with Host %q while stopping: %d %s, want 503 {\"status\":\"stopping\"}", host, code, body)
		}
	}
}
