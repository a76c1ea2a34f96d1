package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// wsClient is a real WebSocket client of GET /ws that splits server frames
// into their JSON objects.
type wsClient struct {
	t    *testing.T
	conn *websocket.Conn
	next int
	objs []map[string]any
	raw  []string
}

func (h *harness) dial(t *testing.T) *wsClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(h.srv.URL, "http")+"/ws", nil)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { conn.CloseNow() })
	return &wsClient{t: t, conn: conn}
}

func (c *wsClient) send(v any) {
	c.t.Helper()
	b, _ := json.Marshal(v)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.conn.Write(ctx, websocket.MessageText, b); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// read returns the next JSON object from the server, reading frames as
// needed, within the deadline.
func (c *wsClient) read(deadline time.Time) map[string]any {
	c.t.Helper()
	for len(c.objs) == 0 {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		_, data, err := c.conn.Read(ctx)
		cancel()
		if err != nil {
			c.t.Fatalf("read: %v", err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				c.t.Fatalf("frame line %q: %v", line, err)
			}
			c.objs = append(c.objs, m)
			c.raw = append(c.raw, line)
		}
	}
	m := c.objs[0]
	c.objs = c.objs[1:]
	return m
}

// until reads objects until pred holds, returning every object read.
func (c *wsClient) until(what string, pred func(map[string]any) bool) []map[string]any {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var seen []map[string]any
	for {
		m := c.read(deadline)
		seen = append(seen, m)
		if pred(m) {
			return seen
		}
	}
}

// cmd sends a command and returns its ack or error (which must come before
// anything else the command caused) plus any events read before it.
func (c *wsClient) cmd(fields map[string]any) map[string]any {
	c.t.Helper()
	c.next++
	id := fmt.Sprintf("c%d", c.next)
	fields["id"] = id
	c.send(fields)
	seen := c.until("answer to "+id, func(m map[string]any) bool {
		return (m["type"] == "ack" || m["type"] == "error") && m["re"] == id
	})
	return seen[len(seen)-1]
}

func TestWSTwoTabsSeeTheSameEvents(t *testing.T) {
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("ws")
	a, b := h.dial(t), h.dial(t)
	for _, c := range []*wsClient{a, b} {
		if ack := c.cmd(map[string]any{"type": "subscribe", "thread_id": snap.ThreadID, "after_seq": 0}); ack["type"] != "ack" || ack["recovered"] != true {
			t.Fatalf("subscribe: %v", ack)
		}
	}
	ack := a.cmd(map[string]any{"type": "run.start", "thread_id": snap.ThreadID, "expected_state_version": snap.StateVersion, "user_message": "hello over websocket"})
	if ack["type"] != "ack" || ack["status"] != "queued" {
		t.Fatalf("run.start: %v", ack)
	}
	done := func(m map[string]any) bool { return m["type"] == "run.completed" }
	a.until("run.completed", done)
	b.until("run.completed", done)
	var evA, evB []string
	for _, l := range a.raw {
		if !strings.Contains(l, `"type":"ack"`) {
			evA = append(evA, l)
		}
	}
	for _, l := range b.raw {
		if !strings.Contains(l, `"type":"ack"`) {
			evB = append(evB, l)
		}
	}
	if strings.Join(evA, "\n") != strings.Join(evB, "\n") || len(evA) < 5 {
		t.Fatalf("tabs saw different events:\nA %d\nB %d", len(evA), len(evB))
	}
}
