package main

// Scenario tests of MCP tool servers configured in -tools-config, against
// the reference servers from npm (@modelcontextprotocol/server-everything
// and server-memory, installed by npm ci), run by node over stdio: their
// tools reach the model, run under their contracts, and a consequential
// call acts once, after the confirmation, or not at all — here where the
// gateway's process is the subject (killed mid-call, restarted). The
// scenarios in one serving gateway are app/scenario_mcp_test.go.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/tools/mcp"
)

// npmServer is the path of an MCP reference server's entry script.
func npmServer(t *testing.T, pkg, script string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("node_modules", "@modelcontextprotocol", pkg, "dist", script))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the MCP reference server %s is not installed (%v): run npm ci", pkg, err)
	}
	return p
}

// entityCount is how many times the memory server's file records the
// entity name.
func entityCount(t *testing.T, memory, name string) int {
	t.Helper()
	data, err := os.ReadFile(memory)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(data), fmt.Sprintf(`"name":%q`, name))
}

func createEntity(name string) string {
	return fmt.Sprintf(`use memory__create_entities with {"entities":[{"name":%q,"entityType":"person","observations":["met at the gateway test"]}]}`, name)
}

// holdingServer is an MCP server over Streamable HTTP (in the test's
// process) with one tool, "transfer", without hints: consequential. Each
// call counts its idempotency key, then waits until the test lets it
// answer.
type holdingServer struct {
	url     string
	entered chan string // the key of each call, as it arrives
	release chan struct{}

	mu    sync.Mutex
	calls map[string]int
}

func newHoldingServer(t *testing.T) *holdingServer {
	t.Helper()
	h := &holdingServer{entered: make(chan string, 4), release: make(chan struct{}), calls: map[string]int{}}
	s := sdk.NewServer(&sdk.Implementation{Name: "bank", Version: "1"}, nil)
	type transfer struct {
		To     string `json:"to"`
		Amount int    `json:"amount"`
	}
	sdk.AddTool(s, &sdk.Tool{Name: "transfer", Description: "Transfer money."}, func(ctx context.Context, req *sdk.CallToolRequest, in transfer) (*sdk.CallToolResult, any, error) {
		key, _ := req.Params.Meta[mcp.IdempotencyKeyMeta].(string)
		h.mu.Lock()
		h.calls[key]++
		h.mu.Unlock()
		h.entered <- key
		<-h.release // as a slow bank would: the cancel of the request does not stop it
		return nil, map[string]any{"transferred": in.Amount, "to": in.To}, nil
	})
	hs := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, nil))
	t.Cleanup(func() {
		select {
		case <-h.release:
		default:
			close(h.release)
		}
		hs.Close()
	})
	h.url = hs.URL
	return h
}

func (h *holdingServer) count(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls[key]
}

// TestMCPGatewayKilledMidCall: the gateway process is killed while a
// confirmed consequential MCP call is at the server. The server then
// acts. Restarted, the gateway does not send the key again (an MCP server
// is not known to deduplicate): the outcome is reported unknown, with the
// key, and the server saw the key once.
func TestMCPGatewayKilledMidCall(t *testing.T) {
	bank := newHoldingServer(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "tools.json")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, `{"mcp_servers": [{"name": "bank", "url": %q}]}`, bank.url+"/"), 0o600); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(dir, "gw.db")
	srv := startProcess(t, db, "5ms", "-tools-config", cfg)
	thread := srv.CreateThread()
	tid := thread.ThreadID
	evs := srv.Events(tid, thread.LastSeq)
	runID, op := srv.askConsequential(evs, tid, thread.StateVersion, `use bank__transfer with {"to": "ada", "amount": 500}`, "bank__transfer")
	key := *op.IdempotencyKey
	srv.confirm(tid, op.OperationID)
	select {
	case got := <-bank.entered:
		if got != key {
			t.Fatalf("the server got key %q, want %q", got, key)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the confirmed call did not reach the server")
	}
	evs.WaitFor(time.Now().Add(20*time.Second), "tool.updated committing", func(ev client.Event) bool {
		return ev.Type == chat.EventToolUpdated && eventOperation(t, ev).Phase == "committing"
	})
	seen := evs.LastSeq()
	evs.Close()
	srv.Kill()
	close(bank.release) // the server acts; its answer goes nowhere

	srv = startProcess(t, db, "5ms", "-tools-config", cfg)
	evs = srv.Events(tid, seen)
	defer evs.Close()
	got := waitCompleted(t, evs, runID, op.OperationID)
	if !slices.Equal(got.phases, []string{"unknown"}) || got.last.Outcome == nil || *got.last.Outcome != "unknown" {
		t.Errorf("after the restart: phases %v, operation %+v; want unknown, not sent again", got.phases, got.last)
	}
	if n := bank.count(key); n != 1 {
		t.Errorf("the server saw the key %d times, want 1", n)
	}
	checkNotSentAgain(t, got, key)
	srv.Stop()
	checkDB(t, db)
}

// heldMemory is a server-memory whose graph file the test holds: the file
// is a FIFO, so the server, which reads its graph before it applies a
// write, waits in that read, with the call in hand, until the test feeds
// it the graph. Once fed, the server saves the graph to a temporary file
// renamed over the FIFO, so the file is regular again until hold.
type heldMemory struct {
	t     *testing.T
	path  string
	graph []byte // the graph to feed, taken from the file by hold
}

// memoryHeldOnFIFO writes a tools config naming one server-memory, named
// "memory", whose graph file is returned held (see heldMemory).
func memoryHeldOnFIFO(t *testing.T) (cfg string, m *heldMemory) {
	t.Helper()
	dir := t.TempDir()
	m = &heldMemory{t: t, path: filepath.Join(dir, "memory.jsonl")}
	m.hold()
	data, err := json.Marshal(map[string]any{"mcp_servers": []map[string]any{
		{"name": "memory", "command": "node", "args": []string{npmServer(t, "server-memory", "index.js")},
			"env": map[string]string{"MEMORY_FILE_PATH": m.path}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	cfg = filepath.Join(dir, "tools.json")
	if err := os.WriteFile(cfg, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg, m
}

// hold replaces the graph file with a FIFO, keeping its graph to feed.
func (m *heldMemory) hold() {
	m.t.Helper()
	m.graph = nil
	if data, err := os.ReadFile(m.path); err == nil {
		m.graph = data
	} else if !os.IsNotExist(err) {
		m.t.Fatal(err)
	}
	if err := os.Remove(m.path); err != nil && !os.IsNotExist(err) {
		m.t.Fatal(err)
	}
	if err := syscall.Mkfifo(m.path, 0o600); err != nil {
		m.t.Fatal(err)
	}
}

// reading waits until the server opened the FIFO to read its graph: it
// has a write in hand and has not applied it.
func (m *heldMemory) reading() *os.File {
	m.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		// A writer's non-blocking open succeeds only while a reader has
		// the FIFO open (else ENXIO).
		f, err := os.OpenFile(m.path, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err == nil {
			return f
		}
		if !errors.Is(err, syscall.ENXIO) {
			m.t.Fatal(err)
		}
		if time.Now().After(deadline) {
			m.t.Fatal("the memory server did not start reading its graph: the write did not reach it")
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
}

// feed gives the waiting server its graph; it then applies the write.
func (m *heldMemory) feed(f *os.File) {
	m.t.Helper()
	if _, err := f.Write(m.graph); err != nil {
		m.t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		m.t.Fatal(err)
	}
}

// count is how many times the saved graph records the entity name, once
// the server has saved it (the file is regular again).
func (m *heldMemory) count(name string) int {
	m.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		fi, err := os.Lstat(m.path)
		if err == nil && fi.Mode().IsRegular() {
			return entityCount(m.t, m.path, name)
		}
		if time.Now().After(deadline) {
			m.t.Fatal("the memory server did not save its graph")
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
}

// TestMCPWriteHeldAtTheServer: a confirmed write to the real memory server
// is held at the server (after it took the call, before it applied it).
//   - Cancelled then: the run is cancelling, waiting for the server's word;
//     the server applies the write; the receipt says committed, and the
//     entity is recorded once.
//   - The gateway killed then: the server applies the write with nobody
//     listening. Restarted, the gateway reports unknown with the key and
//     does not send it again; the entity is recorded once.
func TestMCPWriteHeldAtTheServer(t *testing.T) {
	cfg, memory := memoryHeldOnFIFO(t)
	db := filepath.Join(filepath.Dir(cfg), "gw.db")
	srv := startProcess(t, db, "5ms", "-tools-config", cfg)
	thread := srv.CreateThread()
	tid := thread.ThreadID
	evs := srv.Events(tid, thread.LastSeq)

	runID, op := srv.askConsequential(evs, tid, thread.StateVersion, createEntity("Ada"), "memory__create_entities")
	srv.confirm(tid, op.OperationID)
	held := memory.reading()
	srv.CancelRun(runID)
	evs.WaitFor(time.Now().Add(20*time.Second), "run.cancelling", func(ev client.Event) bool {
		return ev.Type == chat.EventRunCancelling && ev.RunID == runID
	})
	memory.feed(held)
	cancelled := evs.WaitFor(time.Now().Add(20*time.Second), "run.cancelled", func(ev client.Event) bool {
		return ev.Type == chat.EventRunCancelled && ev.RunID == runID
	})
	ops := cancelled.Body.(*chat.RunCancelledBody).Operations
	if len(ops) != 1 || ops[0].OperationID != op.OperationID || ops[0].Phase != "committed" || ops[0].Outcome != "committed" {
		t.Errorf("the receipt of a cancel while the server held the write: %+v, want it committed", ops)
	}
	if n := memory.count("Ada"); n != 1 {
		t.Errorf("Ada is recorded %d times, want 1", n)
	}

	memory.hold()
	runID, op = srv.askConsequential(evs, tid, srv.Snapshot(tid).StateVersion, createEntity("Bob"), "memory__create_entities")
	key := *op.IdempotencyKey
	srv.confirm(tid, op.OperationID)
	held = memory.reading()
	seen := evs.LastSeq()
	evs.Close()
	srv.Kill()
	memory.feed(held) // the server, its gateway gone, applies the write
	if n := memory.count("Bob"); n != 1 {
		t.Fatalf("Bob is recorded %d times after the gateway died, want 1", n)
	}

	srv = startProcess(t, db, "5ms", "-tools-config", cfg)
	evs = srv.Events(tid, seen)
	defer evs.Close()
	got := waitCompleted(t, evs, runID, op.OperationID)
	if got.last.Phase != "unknown" || got.last.Outcome == nil || *got.last.Outcome != "unknown" {
		t.Errorf("after the restart: phases %v, operation %+v; want unknown, not sent again", got.phases, got.last)
	}
	checkNotSentAgain(t, got, key)
	for name, want := range map[string]int{"Ada": 1, "Bob": 1} {
		if n := memory.count(name); n != want {
			t.Errorf("%s is recorded %d times at the end, want %d", name, n, want)
		}
	}
	srv.Stop()
	checkDB(t, db)
}

// checkNotSentAgain asserts that the last tool result recorded names the
// business key and says the call was not sent again after a restart, and
// that nobody pretends to ask the server about it: an MCP server cannot be
// asked whether a key acted, so the operation is reported as not being
// looked up (no next lookup, a horizon on record) and the result says so.
func checkNotSentAgain(t *testing.T, got settled, key string) {
	t.Helper()
	var tool string
	for _, m := range got.messages {
		if m.Role == "tool" {
			tool = m.Content
		}
	}
	if !strings.Contains(tool, key) || !strings.Contains(tool, "not sent again") {
		t.Errorf("the recorded result does not name the key and why it was not sent again: %s", tool)
	}
	if !strings.Contains(tool, "cannot be asked") || strings.Contains(tool, "keeps looking") || !strings.Contains(tool, `"lookup":"none"`) {
		t.Errorf("the recorded result does not say the server cannot be asked about the key: %s", tool)
	}
	if got.last.ReconcileNextAt != nil || got.last.ReconcileUntil == nil {
		t.Errorf("the unknown outcome was reported with a lookup scheduled (next %v, until %v): an MCP server cannot be asked", got.last.ReconcileNextAt, got.last.ReconcileUntil)
	}
}
