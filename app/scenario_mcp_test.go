package app_test

// MCP servers through a whole gateway (-tools-config: Config.ToolsConfig):
// the reference servers (everything, memory; run npm ci at the
// repository's root) with read-only and consequential tools, and a cancel
// mid-call. A gateway killed mid-call is tested in the root package,
// through the binary.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
)

// npmServer is the path of an MCP reference server's entry script.
func npmServer(t *testing.T, pkg, script string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "node_modules", "@modelcontextprotocol", pkg, "dist", script))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the MCP reference server %s is not installed (%v): run npm ci", pkg, err)
	}
	return p
}

// mcpGateway serves a gateway whose tools config names the everything
// server and a memory server keeping its graph in the returned file.
func mcpGateway(t *testing.T) (srv *apptest.Server, memory string) {
	t.Helper()
	dir := t.TempDir()
	memory = filepath.Join(dir, "memory.jsonl")
	cfg := map[string]any{"mcp_servers": []map[string]any{
		{"name": "everything", "command": "node", "args": []string{npmServer(t, "server-everything", "index.js"), "stdio"}},
		{"name": "memory", "command": "node", "args": []string{npmServer(t, "server-memory", "index.js")},
			"env": map[string]string{"MEMORY_FILE_PATH": memory}},
	}}
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "tools.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	gw := apptest.CommandConfig(filepath.Join(dir, "gw.db"), 5*time.Millisecond)
	gw.ToolsConfig = path
	return apptest.Start(t, gw), memory
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

// TestMCPServersThroughTheGateway: /readyz reports both servers connected;
// a read-only tool (cancellable) runs at once and its answer reaches the
// model; a tool without hints is consequential: confirmed, it acts once;
// rejected or cancelled while it waits, it never acts.
func TestMCPServersThroughTheGateway(t *testing.T) {
	srv, memory := mcpGateway(t)

	resp, err := http.Get(srv.Base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	var ready struct {
		Status      string `json:"status"`
		ToolServers []struct {
			Name      string `json:"name"`
			Connected bool   `json:"connected"`
			Tools     int    `json:"tools"`
		} `json:"tool_servers"`
	}
	err = json.NewDecoder(resp.Body).Decode(&ready)
	resp.Body.Close()
	if err != nil || ready.Status != "ready" || len(ready.ToolServers) != 2 {
		t.Fatalf("/readyz: %+v, %v", ready, err)
	}
	for _, s := range ready.ToolServers {
		if !s.Connected || s.Tools < 3 {
			t.Errorf("/readyz tool server %+v, want connected with its tools", s)
		}
	}

	thread := srv.CreateThread()
	tid := thread.ThreadID
	evs := srv.Events(tid, thread.LastSeq)
	defer evs.Close()

	// A read-only tool: no confirmation, the answer in the conversation.
	echo := srv.StartRun(tid, thread.StateVersion, `use everything__echo with {"message":"hello through MCP"}`)
	got := waitCompleted(t, evs, echo.RunID, "")
	roles := func(ms []chat.Message) []string {
		var out []string
		for _, m := range ms {
			out = append(out, m.Role)
		}
		return out
	}
	if !slices.Equal(roles(got.messages), []string{"assistant", "tool", "assistant"}) ||
		!strings.Contains(got.messages[1].Content, "Echo: hello through MCP") ||
		!strings.Contains(got.messages[2].Content, "The everything__echo tool returned") {
		t.Fatalf("the echo run published %+v", got.messages)
	}

	// A consequential tool, confirmed: it acts once.
	runID, op := askConsequential(srv, evs, tid, srv.Snapshot(tid).StateVersion, createEntity("Ada"), "memory__create_entities")
	if !strings.HasPrefix(*op.IdempotencyKey, "memory__create_entities:step-") ||
		!strings.Contains(string(op.Preview), `"server":"memory"`) || !strings.Contains(string(op.Preview), `"Ada"`) {
		t.Errorf("prepared %+v, preview %s", op, op.Preview)
	}
	if n := entityCount(t, memory, "Ada"); n != 0 {
		t.Fatalf("the entity exists %d times before the confirmation", n)
	}
	confirm(srv, tid, op.OperationID)
	got = waitCompleted(t, evs, runID, op.OperationID)
	if !slices.Equal(got.phases, []string{"confirmed", "committing", "committed"}) {
		t.Errorf("tool.updated phases %v", got.phases)
	}
	if n := entityCount(t, memory, "Ada"); n != 1 {
		t.Errorf("the confirmed entity is recorded %d times, want 1", n)
	}

	// Rejected: nothing happens.
	runID, op = askConsequential(srv, evs, tid, srv.Snapshot(tid).StateVersion, createEntity("Bob"), "memory__create_entities")
	v := srv.Snapshot(tid).StateVersion
	if _, err := srv.API().RejectTool(context.Background(), op.OperationID, v); err != nil {
		t.Fatal(err)
	}
	got = waitCompleted(t, evs, runID, op.OperationID)
	if got.last.Phase != "rejected" {
		t.Errorf("after the reject the operation is %+v", got.last)
	}

	// Cancelled while it waits: voided, nothing happens.
	runID, op = askConsequential(srv, evs, tid, srv.Snapshot(tid).StateVersion, createEntity("Cy"), "memory__create_entities")
	srv.CancelRun(runID)
	cancelled := evs.WaitFor(time.Now().Add(20*time.Second), "run.cancelled", func(ev client.Event) bool {
		return ev.Type == chat.EventRunCancelled && ev.RunID == runID
	})
	ops := cancelled.Body.(*chat.RunCancelledBody).Operations
	if len(ops) != 1 || ops[0].OperationID != op.OperationID || ops[0].Phase != "voided" || ops[0].Outcome != "not_started" {
		t.Errorf("the receipt of a cancel while waiting: %+v", ops)
	}
	for _, name := range []string{"Bob", "Cy"} {
		if n := entityCount(t, memory, name); n != 0 {
			t.Errorf("%s is recorded %d times, want 0", name, n)
		}
	}
	if n := entityCount(t, memory, "Ada"); n != 1 {
		t.Errorf("Ada is recorded %d times at the end, want 1", n)
	}
	srv.Stop()
	checkDB(t, srv.DB)
}

// TestMCPCancelMidCall: the progress of a long read-only MCP tool reaches
// the tabs; cancelling the run while the tool works stops the run at once
// (notifications/cancelled goes to the server); the receipt says the step
// was aborted, no progress follows run.cancelled, and the session serves
// the next call.
func TestMCPCancelMidCall(t *testing.T) {
	srv, _ := mcpGateway(t)
	thread := srv.CreateThread()
	tid := thread.ThreadID
	evs := srv.Events(tid, thread.LastSeq)
	defer evs.Close()

	started := srv.StartRun(tid, thread.StateVersion, `use everything__trigger-long-running-operation with {"duration": 60, "steps": 60}`)
	op := eventOperation(t, evs.WaitFor(time.Now().Add(20*time.Second), "tool.updated", func(ev client.Event) bool {
		return ev.Type == chat.EventToolUpdated && ev.RunID == started.RunID
	}))
	if op.Contract != "cancellable" {
		t.Fatalf("the long-running tool (readOnlyHint) is %s, want cancellable", op.Contract)
	}
	// The server's progress notifications arrive as tool.updated events:
	// the call is at the server when the cancel comes.
	working := eventOperation(t, evs.WaitFor(time.Now().Add(20*time.Second), "tool.updated with progress", func(ev client.Event) bool {
		return ev.Type == chat.EventToolUpdated && ev.RunID == started.RunID && eventOperation(t, ev).Progress != nil
	}))
	if p := working.Progress; working.Phase != "running" || p.Total != 60 || p.Progress < 1 || p.Progress > 60 {
		t.Errorf("progress report %+v in phase %s", p, working.Phase)
	}
	asked := time.Now()
	srv.CancelRun(started.RunID)
	cancelled := evs.WaitFor(time.Now().Add(20*time.Second), "run.cancelled", func(ev client.Event) bool {
		return ev.Type == chat.EventRunCancelled && ev.RunID == started.RunID
	})
	if took := time.Since(asked); took > 15*time.Second {
		t.Errorf("the cancel took %v: the tool's 60 s were waited for", took)
	}
	ops := cancelled.Body.(*chat.RunCancelledBody).Operations
	if len(ops) != 1 || ops[0].OperationID != op.OperationID || ops[0].Outcome != "aborted" {
		t.Errorf("the receipt of a cancel mid-call: %+v", ops)
	}
	cancelledAt := cancelled.Seq

	next := srv.StartRun(tid, srv.Snapshot(tid).StateVersion, `use everything__echo with {"message":"still here"}`)
	got := waitCompleted(t, evs, next.RunID, "")
	if len(got.messages) < 2 || !strings.Contains(got.messages[1].Content, "Echo: still here") {
		t.Errorf("the call after the cancel published %+v", got.messages)
	}
	for _, ev := range evs.Seen() {
		if ev.Seq > cancelledAt && ev.RunID == started.RunID {
			t.Errorf("an event of the cancelled run after run.cancelled: %s", ev.Raw)
		}
	}
	srv.Stop()
	checkDB(t, srv.DB)
}
