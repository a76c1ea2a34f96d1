package mcp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/tools"
	"github.com/honestcancel/gateway/tools/mcp"
)

// wait bounds every wait of these tests.
const wait = 20 * time.Second

// everything is the stdio config of @modelcontextprotocol/server-everything,
// installed by npm ci (package.json's devDependencies).
func everything(t *testing.T) mcp.ServerConfig {
	t.Helper()
	script, err := filepath.Abs("../../node_modules/@modelcontextprotocol/server-everything/dist/index.js")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(script); err != nil {
		t.Fatalf("the MCP reference server is not installed (%v): run npm ci at the repository root", err)
	}
	return mcp.ServerConfig{Name: "everything", Command: "node", Args: []string{script, "stdio"}}
}

// everythingOverHTTP starts the reference server in its Streamable HTTP
// mode on a free port of 127.0.0.1 (testdata/loopback.cjs makes it take
// that address; on its own it listens on every interface) and returns its
// config. The server is killed when the test ends.
func everythingOverHTTP(t *testing.T) mcp.ServerConfig {
	t.Helper()
	stdio := everything(t)
	cmd := exec.Command("node", "--require", "./testdata/loopback.cjs", stdio.Args[0], "streamableHttp")
	cmd.Env = append(os.Environ(), "PORT=0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		lines := bufio.NewScanner(stderr)
		for lines.Scan() {
			if a, ok := strings.CutPrefix(lines.Text(), "loopback-listening "); ok {
				addr <- a
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-drained
		cmd.Wait()
	})
	select {
	case a := <-addr:
		return mcp.ServerConfig{Name: "everything", URL: "http://" + a + "/mcp"}
	case <-drained:
		t.Fatal("server-everything exited before it listened")
	case <-time.After(wait):
		t.Fatal("server-everything did not listen in time")
	}
	return mcp.ServerConfig{}
}

// overEachTransport runs test against the reference server over stdio and
// over Streamable HTTP.
func overEachTransport(t *testing.T, test func(t *testing.T, cfg mcp.ServerConfig)) {
	t.Run("stdio", func(t *testing.T) { test(t, everything(t)) })
	t.Run("streamable-http", func(t *testing.T) { test(t, everythingOverHTTP(t)) })
}

// connected returns a connected server of cfg, closed when the test ends.
func connected(t *testing.T, cfg mcp.ServerConfig) *mcp.Server {
	t.Helper()
	s := mcp.NewServer(cfg, nil)
	ctx, stop := context.WithTimeout(context.Background(), wait)
	defer stop()
	if err := s.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// tool returns the server's tool named name.
func tool(t *testing.T, s *mcp.Server, name string) tools.Tool {
	t.Helper()
	var names []string
	for _, tl := range s.Tools() {
		if tl.Spec().Name == name {
			return tl
		}
		names = append(names, tl.Spec().Name)
	}
	t.Fatalf("no tool %s among %v", name, names)
	return nil
}

func TestContractFromAnnotationsUnlessConfigured(t *testing.T) {
	yes := true
	cases := []struct {
		configured string
		a          *sdk.ToolAnnotations
		want       string
	}{
		{"", nil, tools.Consequential},
		{"", &sdk.ToolAnnotations{}, tools.Consequential},
		{"", &sdk.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true}, tools.Cancellable},
		{"", &sdk.ToolAnnotations{IdempotentHint: true, DestructiveHint: &yes}, tools.Idempotent},
		{tools.Consequential, &sdk.ToolAnnotations{ReadOnlyHint: true}, tools.Consequential},
		{tools.Cancellable, nil, tools.Cancellable},
	}
	for _, c := range cases {
		if got := mcp.ContractFor(c.configured, c.a); got != c.want {
			t.Errorf("ContractFor(%q, %+v) = %s, want %s", c.configured, c.a, got, c.want)
		}
	}
}

func TestParseServersNamesEveryProblem(t *testing.T) {
	t.Setenv("MCP_TEST_TOKEN", "")
	_, err := mcp.ParseServers(json.RawMessage(`[
		{"name": "Bad Name", "command": "node"},
		{"name": "both", "command": "node", "url": "http://127.0.0.1:1/mcp"},
		{"name": "none"},
		{"name": "hdr", "url": "http://127.0.0.1:1/mcp", "headers": {"Authorization": "Bearer ${MCP_TEST_TOKEN}"}},
		{"name": "creds", "url": "http://u:p@127.0.0.1:1/mcp"},
		{"name": "ctr", "command": "node", "contracts": {"x": "maybe"}},
		{"name": "ctr", "command": "node", "timeout": "forever"},
		{"name": "extra", "command": "node", "colour": "red"},
		{"name": "hid", "command": "node", "hide": ["", "rm"], "contracts": {"rm": "consequential"}}
	]`))
	if err == nil {
		t.Fatal("a broken config was accepted")
	}
	for _, want := range []string{
		`mcp_servers[0] (Bad Name): field "name"`,
		`mcp_servers[1] (both): field "url": give "command"`,
		`mcp_servers[2] (none): field "command": one of`,
		`mcp_servers[3] (hdr): field "headers": Authorization: environment variable MCP_TEST_TOKEN is not set`,
		`mcp_servers[4] (creds): field "url": must not carry credentials`,
		`mcp_servers[5] (ctr): field "contracts": tool "x": "maybe" is not a contract`,
		`mcp_servers[6] (ctr): field "name": another server is named "ctr"`,
		`mcp_servers[6] (ctr): field "timeout"`,
		`mcp_servers[7]: json: unknown field "colour"`,
		`mcp_servers[8] (hid): field "hide": names a tool with an empty name`,
		`mcp_servers[8] (hid): field "hide": tool "rm" is hidden and also given a contract`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "Bearer") {
		t.Errorf("the error shows a header value: %v", err)
	}
}

// TestEverything: the reference server's tools are listed under
// "everything__", with contracts from their annotations, and a call
// returns the server's answer.
func TestEverything(t *testing.T) { overEachTransport(t, testEverything) }

func testEverything(t *testing.T, cfg mcp.ServerConfig) {
	s := connected(t, cfg)
	echo := tool(t, s, "everything__echo")
	if c := echo.Spec().Contract; c != tools.Cancellable {
		t.Errorf("echo (readOnlyHint) has contract %s, want cancellable", c)
	}
	if _, err := echo.Validate(json.RawMessage(`{"message": 7}`)); err == nil {
		t.Error("arguments that do not fit the server's schema were accepted")
	}
	ctx, stop := context.WithTimeout(context.Background(), wait)
	defer stop()
	res, err := echo.(tools.Runner).Run(ctx, "op_1", json.RawMessage(`{"message":"hello"}`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(res), "Echo: hello") {
		t.Errorf("result %s does not hold the echo", res)
	}
	if st := s.State(); !st.Connected || st.Tools != len(s.Tools()) || st.Tools < 5 {
		t.Errorf("state %+v", st)
	}
}

// TestTaskOnlyToolIsRefusedClearly: the reference server's
// simulate-research-query must run as an MCP task, which this gateway
// does not support. The server answers a plain call with isError, which
// for a consequential call stays "may have acted" (the gateway does not
// read refusals into a tool's error text), and the error says why.
func TestTaskOnlyToolIsRefusedClearly(t *testing.T) {
	s := connected(t, everything(t))
	research, ok := tool(t, s, "everything__simulate-research-query").(tools.Committer)
	if !ok {
		t.Fatal("simulate-research-query (no readOnlyHint, no idempotentHint) is not consequential")
	}
	args := json.RawMessage(`{"topic":"honest cancel"}`)
	_, key, err := research.Prepare("step-1", args)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithTimeout(context.Background(), wait)
	defer stop()
	_, err = research.Commit(ctx, key, args)
	if err == nil || errors.Is(err, tools.ErrRejected) {
		t.Fatalf("an isError answer was taken as done or as refused: %v", err)
	}
	for _, want := range []string{"may have acted", "requires task augmentation", "does not support"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}

	// The operator hides it: the model is never offered it.
	cfg := everything(t)
	cfg.Hide = []string{"simulate-research-query"}
	hidden := connected(t, cfg)
	names := toolNames(hidden)
	if slices.Contains(names, "everything__simulate-research-query") || !slices.Contains(names, "everything__echo") || len(names) != len(s.Tools())-1 {
		t.Errorf("with the tool hidden, the server offers %v", names)
	}
}

// TestEverythingProgressAndCancel: a long-running call reports progress;
// cancelling its context returns at once and the session stays usable.
func TestEverythingProgressAndCancel(t *testing.T) {
	overEachTransport(t, testEverythingProgressAndCancel)
}

func testEverythingProgressAndCancel(t *testing.T, cfg mcp.ServerConfig) {
	s := connected(t, cfg)
	long := tool(t, s, "everything__trigger-long-running-operation").(tools.Runner)
	var mu sync.Mutex
	var seen []chat.ToolProgress
	first := make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	ctx = tools.WithProgress(ctx, func(p chat.ToolProgress) {
		mu.Lock()
		seen = append(seen, p)
		if len(seen) == 1 {
			close(first)
		}
		mu.Unlock()
	})
	done := make(chan error, 1)
	go func() {
		_, err := long.Run(ctx, "op_long", json.RawMessage(`{"duration": 10, "steps": 50}`))
		done <- err
	}()
	select {
	case <-first:
	case err := <-done:
		t.Fatalf("the call ended before any progress: %v", err)
	case <-time.After(wait):
		t.Fatal("no progress notification")
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("a cancelled call returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a cancelled call did not return")
	}
	mu.Lock()
	p := seen[0]
	mu.Unlock()
	if p.Total != 50 || p.Progress < 1 {
		t.Errorf("progress %+v", p)
	}
	ctx2, stop := context.WithTimeout(context.Background(), wait)
	defer stop()
	if _, err := tool(t, s, "everything__echo").(tools.Runner).Run(ctx2, "op_2", json.RawMessage(`{"message":"still here"}`)); err != nil {
		t.Errorf("the session did not survive a cancelled call: %v", err)
	}
}

// ledger is an in-process MCP server with one consequential tool, "pay",
// that counts the calls of each idempotency key it is sent.
type ledger struct {
	srv     *sdk.Server
	mu      sync.Mutex
	calls   map[string]int
	hold    chan struct{} // when set, pay waits for it (ignoring cancellation)
	entered chan struct{}
}

func newLedger(t *testing.T) (*ledger, string) {
	t.Helper()
	l := &ledger{calls: map[string]int{}, entered: make(chan struct{}, 8)}
	srv := sdk.NewServer(&sdk.Implementation{Name: "ledger", Version: "1"}, nil)
	l.srv = srv
	l.addPay()
	return l, l.serve(t, "127.0.0.1:0").URL
}

// serve serves the ledger over Streamable HTTP on addr (127.0.0.1:0: any
// free port) until the test ends or the caller closes it.
func (l *ledger) serve(t *testing.T, addr string) *httptest.Server {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return l.srv }, nil))
	hs.Listener.Close()
	hs.Listener = ln
	hs.Start()
	t.Cleanup(func() {
		// A client's event stream is a request that never ends by itself:
		// Close would wait for it (the client may be stopped only by a
		// later cleanup).
		hs.CloseClientConnections()
		hs.Close()
	})
	return hs
}

type payArgs struct {
	Amount int    `json:"amount" jsonschema:"the amount, in cents"`
	To     string `json:"to"`
}

// addPay (re)adds the tool pay.
func (l *ledger) addPay() {
	sdk.AddTool(l.srv, &sdk.Tool{Name: "pay", Description: "Pay someone."}, func(ctx context.Context, req *sdk.CallToolRequest, in payArgs) (*sdk.CallToolResult, any, error) {
		key, _ := req.Params.Meta[mcp.IdempotencyKeyMeta].(string)
		l.mu.Lock()
		l.calls[key]++
		hold := l.hold
		l.mu.Unlock()
		l.entered <- struct{}{}
		if hold != nil {
			<-hold
		}
		if in.Amount <= 0 {
			return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: "amount must be positive"}}}, nil, nil
		}
		return nil, map[string]any{"paid": in.Amount, "to": in.To}, nil
	})
}

// commitHeld starts pay.Commit(ctx, key, args) with the ledger holding
// its calls, and returns once the call reached the server: the Commit's
// error comes on done; release lets the server answer (and take later
// calls without holding them).
func (l *ledger) commitHeld(t *testing.T, ctx context.Context, pay tools.Committer, key, args string) (done <-chan error, release func()) {
	t.Helper()
	hold := make(chan struct{})
	l.mu.Lock()
	l.hold = hold
	l.mu.Unlock()
	for len(l.entered) > 0 {
		<-l.entered
	}
	errc := make(chan error, 1)
	go func() {
		_, err := pay.Commit(ctx, key, json.RawMessage(args))
		errc <- err
	}()
	select {
	case <-l.entered:
	case <-time.After(wait):
		t.Fatal("the call did not reach the server")
	}
	return errc, func() {
		l.mu.Lock()
		l.hold = nil
		l.mu.Unlock()
		close(hold)
	}
}

func (l *ledger) count(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls[key]
}

// TestConsequentialSentOncePerKey: a tool without annotations is
// consequential; Prepare shows the arguments and names the key; Commit
// sends the key in _meta, once, and never again for that key.
func TestConsequentialSentOncePerKey(t *testing.T) {
	l, url := newLedger(t)
	s := connected(t, mcp.ServerConfig{Name: "ledger", URL: url})
	pay, ok := tool(t, s, "ledger__pay").(tools.Committer)
	if !ok || pay.Spec().Contract != tools.Consequential {
		t.Fatalf("pay is %T %s, want a consequential Committer", pay, pay.Spec().Contract)
	}
	if tools.ResendSafe(pay) {
		t.Error("an MCP tool claims its server deduplicates: the engine would send a lost call again")
	}
	args := json.RawMessage(`{"to":"bob","amount":500}`)
	preview, key, err := pay.Prepare("step-1", args)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(preview), `"arguments":{"amount":500,"to":"bob"}`) || !strings.HasPrefix(key, "ledger__pay:step-1:") {
		t.Errorf("preview %s, key %s", preview, key)
	}
	ctx, stop := context.WithTimeout(context.Background(), wait)
	defer stop()
	res, err := pay.Commit(ctx, key, args)
	if err != nil || !strings.Contains(string(res), `"paid":500`) {
		t.Fatalf("commit: %s, %v", res, err)
	}
	if _, err := pay.Commit(ctx, key, args); err == nil || errors.Is(err, tools.ErrRejected) {
		t.Errorf("a second commit of the same key returned %v, want an unknown-outcome error", err)
	}
	if n := l.count(key); n != 1 {
		t.Errorf("the server saw the key %d times, want 1", n)
	}
	if st, err := pay.Status(ctx, key); err == nil || st.Known {
		t.Errorf("Status claimed to know: %+v, %v", st, err)
	}
}

// TestConsequentialOutcomes: arguments that do not fit the server's
// schema are refused before anything is sent; a tool that reports an error, or a call
// cancelled while the server works on it, leaves the outcome unknown.
func TestConsequentialOutcomes(t *testing.T) {
	l, url := newLedger(t)
	s := connected(t, mcp.ServerConfig{Name: "ledger", URL: url})
	pay := tool(t, s, "ledger__pay").(tools.Committer)
	ctx, stop := context.WithTimeout(context.Background(), wait)
	defer stop()

	_, err := pay.Commit(ctx, "k-invalid", json.RawMessage(`{"to":"bob","amount":"lots"}`))
	if !errors.Is(err, tools.ErrRejected) {
		t.Errorf("arguments that do not fit the schema: %v, want ErrRejected", err)
	}
	if n := l.count("k-invalid"); n != 0 {
		t.Errorf("arguments that do not fit reached the server %d times", n)
	}

	_, err = pay.Commit(ctx, "k-error", json.RawMessage(`{"to":"bob","amount":0}`))
	if err == nil || errors.Is(err, tools.ErrRejected) || !strings.Contains(err.Error(), "amount must be positive") {
		t.Errorf("a tool error: %v, want an unknown outcome with the server's words", err)
	}

	l.srv.RemoveTools("pay")
	_, err = pay.Commit(ctx, "k-gone", json.RawMessage(`{"to":"bob","amount":1}`))
	if !errors.Is(err, tools.ErrRejected) {
		t.Errorf("a tool the server no longer has: %v, want ErrRejected", err)
	}
	if n := l.count("k-gone"); n != 0 {
		t.Errorf("a removed tool ran %d times", n)
	}
	l.addPay()

	cctx, cancel := context.WithCancel(ctx)
	done, release := l.commitHeld(t, cctx, pay, "k-cancel", `{"to":"bob","amount":1}`)
	cancel()
	select {
	case err := <-done:
		if err == nil || errors.Is(err, tools.ErrRejected) {
			t.Errorf("a call cancelled at the server: %v, want an unknown outcome", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a cancelled commit did not return")
	}
	release()
	if n := l.count("k-cancel"); n != 1 {
		t.Errorf("the server saw the cancelled key %d times", n)
	}
}

// TestDeadServerFailsTheCallClearly: a call while the server is down says
// so and sends nothing; Run reconnects once the server is back.
func TestDeadServerFailsTheCallClearly(t *testing.T) {
	l, url := newLedger(t)
	_ = l
	s := connected(t, mcp.ServerConfig{Name: "ledger", URL: url})
	pay := tool(t, s, "ledger__pay").(tools.Committer)
	s.Close()
	ctx, stop := context.WithTimeout(context.Background(), wait)
	defer stop()
	_, err := pay.Commit(ctx, "k-down", json.RawMessage(`{"to":"bob","amount":1}`))
	var nc *mcp.NotConnectedError
	if !errors.As(err, &nc) || !errors.Is(err, tools.ErrRejected) || !strings.Contains(err.Error(), "nothing was sent") {
		t.Errorf("a call to a closed server: %v", err)
	}
	if st := s.State(); st.Connected || st.Error == "" {
		t.Errorf("state of a closed server: %+v", st)
	}
}

// ParseFile reads the "mcp_servers" of a tools config file and nothing
// else; a file without it has no servers.
func TestParseFile(t *testing.T) {
	got, err := mcp.ParseFile([]byte(`{"tools": [], "mcp_servers": [{"name": "files", "command": "node", "args": ["s.js"], "contracts": {"write_file": "consequential"}}]}`))
	if err != nil || len(got) != 1 || got[0].Name != "files" || got[0].Command != "node" || got[0].Contracts["write_file"] != tools.Consequential {
		t.Fatalf("ParseFile: %+v, %v", got, err)
	}
	if got, err := mcp.ParseFile([]byte(`{"tools": []}`)); err != nil || got != nil {
		t.Fatalf("a file without mcp_servers: %+v, %v", got, err)
	}
	if _, err := mcp.ParseFile([]byte(`{"mcp_servers": {}}`)); err == nil || !strings.Contains(err.Error(), "must be an array") {
		t.Fatalf("mcp_servers not an array: %v", err)
	}
}

// runServer runs s (its Run loop) until the test ends, and returns once s
// is connected, with the context Run runs on.
func runServer(t *testing.T, s *mcp.Server) context.Context {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	running := make(chan struct{})
	go func() {
		defer close(running)
		s.Run(ctx)
	}()
	t.Cleanup(func() {
		stop()
		<-running
	})
	until(t, "connected", func() bool { return s.State().Connected })
	return ctx
}

// until polls cond (a server's state, which changes on its own goroutine)
// until it holds, failing the test after wait.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not %s after %v", what, wait)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, bounded by the deadline
	}
}

// TestServerDiesMidCallAndComesBack: the server goes away while a
// consequential call is at it: the call's outcome is unknown (it may have
// acted), the server is reported down, a call meanwhile says nothing was
// sent, and Run reconnects once the server is back, with the same tools.
func TestServerDiesMidCallAndComesBack(t *testing.T) {
	l := &ledger{calls: map[string]int{}, entered: make(chan struct{}, 8)}
	l.srv = sdk.NewServer(&sdk.Implementation{Name: "ledger", Version: "1"}, nil)
	l.addPay()
	hs := l.serve(t, "127.0.0.1:0")
	addr := hs.Listener.Addr().String()
	s := mcp.NewServer(mcp.ServerConfig{Name: "ledger", URL: hs.URL}, nil)
	ctx := runServer(t, s)
	pay := tool(t, s, "ledger__pay").(tools.Committer)

	done, release := l.commitHeld(t, ctx, pay, "k-dies", `{"to":"bob","amount":1}`)
	hs.CloseClientConnections() // the server goes away under the call …
	release()                   // … which it carries out; its answer goes nowhere
	hs.Close()
	select {
	case err := <-done:
		if err == nil || errors.Is(err, tools.ErrRejected) {
			t.Errorf("a call whose server died under it: %v, want an unknown outcome", err)
		}
	case <-time.After(wait):
		t.Fatal("the call did not return when its server died")
	}
	until(t, "reported down", func() bool { return !s.State().Connected })
	_, err := pay.Commit(ctx, "k-while-down", json.RawMessage(`{"to":"bob","amount":2}`))
	if !errors.Is(err, tools.ErrRejected) || !strings.Contains(err.Error(), "nothing was sent") {
		t.Errorf("a call while the server is down: %v", err)
	}

	l.serve(t, addr)
	until(t, "reconnected", func() bool { return s.State().Connected })
	if res, err := pay.Commit(ctx, "k-after", json.RawMessage(`{"to":"bob","amount":3}`)); err != nil || !strings.Contains(string(res), `"paid":3`) {
		t.Errorf("a call after the reconnect: %s, %v", res, err)
	}
	// The reconnect listed the tools again (new adapters): a key sent
	// before it is still never sent again.
	again := tool(t, s, "ledger__pay").(tools.Committer)
	if again == pay {
		t.Fatal("the reconnect did not list the tools again")
	}
	if _, err := again.Commit(ctx, "k-dies", json.RawMessage(`{"to":"bob","amount":1}`)); err == nil || errors.Is(err, tools.ErrRejected) {
		t.Errorf("a key sent before the reconnect, sent again after it: %v", err)
	}
	if a, b, c := l.count("k-dies"), l.count("k-while-down"), l.count("k-after"); a != 1 || b != 0 || c != 1 {
		t.Errorf("the server saw the keys %d, %d and %d times, want 1, 0 and 1", a, b, c)
	}
}

// toolNames lists the names of s's tools.
func toolNames(s *mcp.Server) []string {
	var out []string
	for _, tl := range s.Tools() {
		out = append(out, tl.Spec().Name)
	}
	return out
}

// TestToolListChanges: when the server adds or removes a tool
// (notifications/tools/list_changed), Run lists the tools again, and the
// offered ones follow; the new tool works.
func TestToolListChanges(t *testing.T) {
	l, url := newLedger(t)
	s := mcp.NewServer(mcp.ServerConfig{Name: "ledger", URL: url, Contracts: map[string]string{"balance": tools.Cancellable}}, nil)
	ctx := runServer(t, s)
	if got := toolNames(s); !slices.Equal(got, []string{"ledger__pay"}) {
		t.Fatalf("tools at the start: %v", got)
	}
	type none struct{}
	sdk.AddTool(l.srv, &sdk.Tool{Name: "balance", Description: "The balance."}, func(context.Context, *sdk.CallToolRequest, none) (*sdk.CallToolResult, any, error) {
		return nil, map[string]any{"cents": 1200}, nil
	})
	until(t, "the added tool offered", func() bool { return slices.Contains(toolNames(s), "ledger__balance") })
	balance := tool(t, s, "ledger__balance")
	if balance.Spec().Contract != tools.Cancellable {
		t.Errorf("the added tool's contract is %s, want the configured cancellable", balance.Spec().Contract)
	}
	res, err := balance.(tools.Runner).Run(ctx, "op_b", json.RawMessage(`{}`))
	if err != nil || !strings.Contains(string(res), `"cents":1200`) {
		t.Errorf("the added tool: %s, %v", res, err)
	}
	l.srv.RemoveTools("pay")
	until(t, "the removed tool withdrawn", func() bool { return !slices.Contains(toolNames(s), "ledger__pay") })
	if st := s.State(); st.Tools != 1 {
		t.Errorf("state after the changes: %+v", st)
	}
}
