package gateway_test

// A real WebSocket client of GET /ws for the tests: dialing (also a client
// that stops reading), sending commands, reading and waiting for frames,
// and observe, which checks every frame against the protocol.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/chat"
)

// ---- a real WebSocket client of GET /ws ----

// wsItem is one JSON object of a server frame, decoded and verbatim.
type wsItem struct {
	m   map[string]any
	raw string
}

// wsView is what one connection has applied of one thread.
type wsView struct {
	subscribed bool
	next       int64 // the seq the next event must carry; 0 = a thread.snapshot must come first
	version    int64 // state_version of the last durable event applied; -1 unknown
	events     []wsItem
}

// last is the last seq applied (-1 before the first).
func (v *wsView) last() int64 { return v.next - 1 }

// wsClient is a real WebSocket client of GET /ws. It splits server frames
// into their JSON objects and checks, object by object, what one
// connection can see of the protocol: events only for subscribed threads,
// per thread a seq exactly one above the previous (after the position the
// subscribe ack promised, or after the thread.snapshot), state_version +1
// on every durable event and none on deltas, ts and run_id where required,
// and one ack or error per command id.
type wsClient struct {
	t        *testing.T
	name     string
	conn     *websocket.Conn
	next     int
	pending  []wsItem // read from the wire, not yet applied
	items    []wsItem // every object applied, in order
	sent     map[string]map[string]any
	answered map[string]int // command id -> index in items of its answer
	views    map[string]*wsView
}

func (h *harness) dial(t *testing.T) *wsClient {
	t.Helper()
	return h.dialWith(t, "tab", nil)
}

// tabsMidRun creates a thread and dials tabs tabs, each subscribed to it
// from seq 0; the first starts a run with userMessage, and tabsMidRun
// returns once each tab has seen n of the run's deltas.
func (h *harness) tabsMidRun(t *testing.T, tabs int, userMessage string, n int) (threadID, runID string, clients []*wsClient) {
	t.Helper()
	snap := h.createThread("")
	threadID = snap.ThreadID
	for range tabs {
		c := h.dial(t)
		c.subscribe(threadID, wsAfter(0))
		clients = append(clients, c)
	}
	runID = wsStr(clients[0].ack(map[string]any{"type": "run.start", "thread_id": threadID, "expected_state_version": snap.StateVersion,
		"user_message": userMessage}), "run_id")
	for _, c := range clients {
		c.untilDeltas(threadID, runID, n)
	}
	return threadID, runID, clients
}

// twoTabsMidRun is tabsMidRun with two tabs: a started the run.
func (h *harness) twoTabsMidRun(t *testing.T, userMessage string, n int) (threadID, runID string, a, b *wsClient) {
	t.Helper()
	threadID, runID, tabs := h.tabsMidRun(t, 2, userMessage, n)
	return threadID, runID, tabs[0], tabs[1]
}

func (h *harness) wsURL() string { return "ws" + strings.TrimPrefix(h.srv.URL, "http") + "/ws" }

func (h *harness) dialWith(t *testing.T, name string, opts *websocket.DialOptions) *wsClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, h.wsURL(), opts)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	// The server coalesces queued events into frames of up to 256 KiB; the
	// client library's default limit is 32 KiB.
	conn.SetReadLimit(16 << 20)
	t.Cleanup(func() { conn.CloseNow() })
	return &wsClient{t: t, name: name, conn: conn, sent: map[string]map[string]any{}, answered: map[string]int{}, views: map[string]*wsView{}}
}

// dialStalled connects a WebSocket client over stalledClient.
func (h *harness) dialStalled(t *testing.T) *wsClient {
	t.Helper()
	return h.dialWith(t, "stalled tab", &websocket.DialOptions{HTTPClient: stalledClient(t)})
}

// stalledClient is an HTTP client whose TCP path holds very little: a tiny
// receive buffer and a small segment size, set before connecting, so that a
// peer that stops reading fills the kernel buffers with a few tens of KiB
// instead of megabytes, and the server's own bounds decide.
func stalledClient(t *testing.T) *http.Client {
	d := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024)
			if serr == nil {
				serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, 536)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}}
	tr := &http.Transport{DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func (c *wsClient) sendRaw(typ websocket.MessageType, b []byte) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := c.conn.Write(ctx, typ, b); err != nil {
		c.t.Fatalf("%s: send: %v", c.name, err)
	}
}

func (c *wsClient) send(v any) {
	c.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		c.t.Fatal(err)
	}
	c.sendRaw(websocket.MessageText, b)
}

// post sends a command without reading anything and returns its id.
func (c *wsClient) post(fields map[string]any) string {
	c.t.Helper()
	c.next++
	id := fmt.Sprintf("c%d", c.next)
	fields["id"] = id
	c.sent[id] = fields
	c.send(fields)
	return id
}

// readItem applies the next JSON object from the server, reading frames as
// needed, within the deadline. A read error (the connection closed) is
// returned.
func (c *wsClient) readItem(deadline time.Time) (wsItem, error) {
	c.t.Helper()
	for len(c.pending) == 0 {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		typ, data, err := c.conn.Read(ctx)
		cancel()
		if err != nil {
			return wsItem{}, err
		}
		if typ != websocket.MessageText {
			c.t.Errorf("%s: server sent a %v frame", c.name, typ)
		}
		for _, line := range strings.Split(string(data), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				c.t.Fatalf("%s: frame line %q: %v", c.name, line, err)
			}
			c.pending = append(c.pending, wsItem{m: m, raw: line})
		}
	}
	it := c.pending[0]
	c.pending = c.pending[1:]
	c.observe(it)
	return it, nil
}

// read returns the next object; a closed connection fails the test.
func (c *wsClient) read(deadline time.Time) map[string]any {
	c.t.Helper()
	it, err := c.readItem(deadline)
	if err != nil {
		c.t.Fatalf("%s: read: %v", c.name, err)
	}
	return it.m
}

// until reads objects until pred holds, returning every object read.
func (c *wsClient) until(what string, pred func(map[string]any) bool) []map[string]any {
	c.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	var seen []map[string]any
	for {
		it, err := c.readItem(deadline)
		if err != nil {
			c.t.Fatalf("%s: waiting for %s: %v", c.name, what, err)
		}
		seen = append(seen, it.m)
		if pred(it.m) {
			return seen
		}
	}
}

// closed reads until the server ends the connection and returns how: the
// close frame's code and reason.
func (c *wsClient) closed() websocket.CloseError {
	c.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		_, err := c.readItem(deadline)
		if err == nil {
			continue
		}
		var ce websocket.CloseError
		if !errors.As(err, &ce) {
			c.t.Fatalf("%s: connection ended without a close frame: %v", c.name, err)
		}
		return ce
	}
}

// answer reads until the ack or error of command id and returns it.
func (c *wsClient) answer(id string) map[string]any {
	c.t.Helper()
	seen := c.until("answer to "+id, func(m map[string]any) bool { return wsIsAnswer(m) && m["re"] == id })
	return seen[len(seen)-1]
}

// cmd sends a command and returns its ack or error (which must come before
// anything else the command caused).
func (c *wsClient) cmd(fields map[string]any) map[string]any {
	c.t.Helper()
	return c.answer(c.post(fields))
}

// ack sends a command that must succeed and returns its ack.
func (c *wsClient) ack(fields map[string]any) map[string]any {
	c.t.Helper()
	a := c.cmd(fields)
	if a["type"] != "ack" {
		c.t.Fatalf("%s: %v answered %v", c.name, fields, a)
	}
	return a
}

// sync is a round trip with a command that changes nothing; it returns the
// objects that arrived before its ack.
func (c *wsClient) sync() []map[string]any {
	c.t.Helper()
	id := c.post(map[string]any{"type": "unsubscribe", "thread_id": "thr_not_watched"})
	seen := c.until("answer to "+id, func(m map[string]any) bool { return wsIsAnswer(m) && m["re"] == id })
	if a := seen[len(seen)-1]; a["type"] != "ack" {
		c.t.Fatalf("%s: sync answered %v", c.name, a)
	}
	return seen[:len(seen)-1]
}

// subscribe subscribes with after_seq (nil: from a snapshot) and returns
// the ack.
func (c *wsClient) subscribe(threadID string, after *int64) map[string]any {
	c.t.Helper()
	f := map[string]any{"type": "subscribe", "thread_id": threadID}
	if after != nil {
		f["after_seq"] = *after
	}
	return c.ack(f)
}

func wsAfter(n int64) *int64 { return &n }

// untilEvent reads until an event of typ (of run runID, when given) on the
// thread and returns it.
func (c *wsClient) untilEvent(threadID, typ, runID string) map[string]any {
	c.t.Helper()
	seen := c.until(fmt.Sprintf("%s %s on %s", typ, runID, threadID), func(m map[string]any) bool {
		return m["thread_id"] == threadID && m["type"] == typ && (runID == "" || m["run_id"] == runID) && !wsIsAnswer(m)
	})
	return seen[len(seen)-1]
}

// untilSeq reads until the thread's event with seq n was applied.
func (c *wsClient) untilSeq(threadID string, n int64) {
	c.t.Helper()
	if v := c.views[threadID]; v != nil && v.last() >= n {
		return
	}
	c.until(fmt.Sprintf("seq %d on %s", n, threadID), func(m map[string]any) bool {
		return m["thread_id"] == threadID && !wsIsAnswer(m) && wsNum(m, "seq") >= n
	})
}

// untilDeltas reads until n deltas of the run were applied on the thread.
func (c *wsClient) untilDeltas(threadID, runID string, n int) []map[string]any {
	c.t.Helper()
	var out []map[string]any
	for _, it := range c.view(threadID).events {
		if it.m["type"] == chat.EventMessageDelta && it.m["run_id"] == runID {
			out = append(out, it.m)
		}
	}
	if len(out) >= n {
		return out
	}
	c.until(fmt.Sprintf("%d deltas of %s", n, runID), func(m map[string]any) bool {
		if m["thread_id"] == threadID && m["type"] == chat.EventMessageDelta && m["run_id"] == runID {
			out = append(out, m)
		}
		return len(out) >= n
	})
	return out
}

func (c *wsClient) view(threadID string) *wsView {
	v := c.views[threadID]
	if v == nil {
		v = &wsView{version: -1}
		c.views[threadID] = v
	}
	return v
}

// eventLines is every event of the thread this connection applied, verbatim.
func (c *wsClient) eventLines(threadID string) []string {
	var out []string
	for _, it := range c.view(threadID).events {
		out = append(out, it.raw)
	}
	return out
}

// text is the delta text of a message applied here with seq <= upTo.
func (c *wsClient) text(threadID, messageID string, upTo int64) string {
	var b strings.Builder
	for _, it := range c.view(threadID).events {
		if it.m["type"] == chat.EventMessageDelta && it.m["message_id"] == messageID && wsNum(it.m, "seq") <= upTo {
			b.WriteString(wsStr(it.m, "text"))
		}
	}
	return b.String()
}

// causedAfter checks that every event matching caused came after the answer
// to command id on this connection, and returns how many came.
func (c *wsClient) causedAfter(id string, caused func(map[string]any) bool) int {
	c.t.Helper()
	at, ok := c.answered[id]
	if !ok {
		c.t.Fatalf("%s: command %s has no answer", c.name, id)
	}
	n := 0
	for i, it := range c.items {
		if wsIsAnswer(it.m) || !caused(it.m) {
			continue
		}
		if i < at {
			c.t.Errorf("%s: %s came before the answer to %s, which caused it", c.name, it.raw, id)
		}
		n++
	}
	return n
}

func wsIsAnswer(m map[string]any) bool { return m["type"] == "ack" || m["type"] == "error" }

func wsNum(m map[string]any, k string) int64 {
	f, _ := m[k].(float64)
	return int64(f)
}

func wsStr(m map[string]any, k string) string {
	s, _ := m[k].(string)
	return s
}

func wsKeys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// wantKeys fails unless m has exactly the keys.
func wsWantKeys(t *testing.T, what string, m map[string]any, want ...string) {
	t.Helper()
	slices.Sort(want)
	if got := wsKeys(m); !slices.Equal(got, want) {
		t.Errorf("%s has fields %v, want %v: %v", what, got, want, m)
	}
}

// observe checks one object against what this connection applied before.
func (c *wsClient) observe(it wsItem) {
	t := c.t
	t.Helper()
	m := it.m
	c.items = append(c.items, it)
	typ := wsStr(m, "type")
	if wsIsAnswer(m) {
		re, hasRe := m["re"].(string)
		if _, ok := m["re"]; ok && !hasRe {
			t.Errorf("%s: answer with a non-string re: %s", c.name, it.raw)
		}
		if typ == "error" {
			if wsStr(m, "error") == "" || wsStr(m, "message") == "" {
				t.Errorf("%s: error without code or message: %s", c.name, it.raw)
			}
		}
		if !hasRe {
			return
		}
		if _, dup := c.answered[re]; dup {
			t.Errorf("%s: a second answer to %s: %s", c.name, re, it.raw)
		}
		c.answered[re] = len(c.items) - 1
		cmd := c.sent[re]
		if cmd == nil || typ != "ack" {
			return
		}
		switch cmd["type"] {
		case "subscribe":
			th, _ := cmd["thread_id"].(string)
			v := c.view(th)
			v.subscribed = true
			if m["thread_id"] != th {
				t.Errorf("%s: subscribe ack for %v, want %s", c.name, m["thread_id"], th)
			}
			if wsNum(m, "state_version") <= 0 || wsNum(m, "last_seq") <= 0 {
				t.Errorf("%s: subscribe ack without state_version or last_seq: %s", c.name, it.raw)
			}
			if m["recovered"] == true {
				after, ok := cmd["after_seq"].(int64)
				if !ok {
					t.Errorf("%s: recovered without after_seq: %s", c.name, it.raw)
				}
				v.next, v.version = after+1, -1
				if after == 0 {
					v.version = 0
				}
			} else {
				v.next = 0
			}
		case "unsubscribe":
			th, _ := cmd["thread_id"].(string)
			c.view(th).subscribed = false
		}
		return
	}

	th := wsStr(m, "thread_id")
	seq := wsNum(m, "seq")
	v := c.views[th]
	if v == nil || !v.subscribed {
		t.Errorf("%s: event of a thread this connection does not watch: %s", c.name, it.raw)
		return
	}
	v.events = append(v.events, it)
	if wsNum(m, "ts") <= 0 {
		t.Errorf("%s: event without ts: %s", c.name, it.raw)
	}
	if typ == chat.EventThreadSnapshot {
		if v.next != 0 {
			t.Errorf("%s: thread.snapshot where seq %d was due: %.200s", c.name, v.next, it.raw)
		}
		if seq != wsNum(m, "last_seq") || !strings.HasPrefix(wsStr(m, "head_checkpoint_id"), chat.PrefixCheckpoint) {
			t.Errorf("%s: snapshot seq %d, last_seq %d, head %q", c.name, seq, wsNum(m, "last_seq"), wsStr(m, "head_checkpoint_id"))
		}
		if _, ok := m["messages"].([]any); !ok {
			t.Errorf("%s: snapshot without messages: %.200s", c.name, it.raw)
		}
		v.next, v.version = seq+1, wsNum(m, "state_version")
		return
	}
	if v.next == 0 {
		t.Errorf("%s: %s came before the thread.snapshot", c.name, it.raw)
	} else if seq != v.next {
		t.Errorf("%s: event %.160s has seq %d, want %d (no gap, no duplicate)", c.name, it.raw, seq, v.next)
	}
	v.next = seq + 1
	_, hasVersion := m["state_version"]
	if typ == chat.EventMessageDelta {
		if hasVersion {
			t.Errorf("%s: delta with a state_version: %s", c.name, it.raw)
		}
		if !strings.HasPrefix(wsStr(m, "message_id"), chat.PrefixMessage) || wsStr(m, "text") == "" {
			t.Errorf("%s: delta without message_id or text: %s", c.name, it.raw)
		}
	} else {
		sv := wsNum(m, "state_version")
		if sv <= 0 || (v.version >= 0 && sv != v.version+1) {
			t.Errorf("%s: durable event %.160s has state_version %d after %d", c.name, it.raw, sv, v.version)
		}
		v.version = sv
	}
	if strings.HasPrefix(typ, "run.") || strings.HasPrefix(typ, "tool.") || typ == chat.EventMessageDelta {
		if !strings.HasPrefix(wsStr(m, "run_id"), chat.PrefixRun) {
			t.Errorf("%s: %s without run_id", c.name, it.raw)
		}
	}
}
