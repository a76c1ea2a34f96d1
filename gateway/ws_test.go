package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/bus"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/gateway"
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

// ---- tests ----

// TestWSTwoTabsSeeTheSameEvents: two tabs on one thread apply identical
// event sequences, seq +1 each; each tab's commands are answered before
// any event they caused reaches that tab.
func TestWSTwoTabsSeeTheSameEvents(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("ws")
	th := snap.ThreadID
	a, b := h.dial(t), h.dial(t)
	for _, c := range []*wsClient{a, b} {
		ack := c.subscribe(th, wsAfter(0))
		if ack["recovered"] != true || wsNum(ack, "last_seq") != snap.LastSeq || wsNum(ack, "state_version") != snap.StateVersion {
			t.Fatalf("subscribe: %v", ack)
		}
		wsWantKeys(t, "subscribe ack", ack, "type", "re", "thread_id", "recovered", "state_version", "last_seq")
	}
	v := snap.StateVersion
	for i, c := range []*wsClient{a, b, a} {
		ack := c.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": v,
			"user_message": fmt.Sprintf("question %d about websockets and tabs", i)})
		wsWantKeys(t, "run.start ack", ack, "type", "re", "run_id", "status", "state_version")
		runID := wsStr(ack, "run_id")
		if ack["status"] != string(chat.RunQueued) || !strings.HasPrefix(runID, chat.PrefixRun) || wsNum(ack, "state_version") <= v {
			t.Fatalf("run.start ack %v (expected version %d)", ack, v)
		}
		for _, o := range []*wsClient{a, b} {
			o.untilEvent(th, chat.EventRunCompleted, runID)
		}
		from, to := v, wsNum(ack, "state_version")
		n := c.causedAfter(wsStr(ack, "re"), func(m map[string]any) bool {
			sv := wsNum(m, "state_version")
			return m["thread_id"] == th && (m["run_id"] == runID || (sv > from && sv <= to))
		})
		if n < 5 {
			t.Errorf("run %s: %d events on the tab that started it", runID, n)
		}
		if a.view(th).version != b.view(th).version {
			t.Fatalf("tabs at versions %d and %d", a.view(th).version, b.view(th).version)
		}
		v = a.view(th).version
	}
	evA, evB := a.eventLines(th), b.eventLines(th)
	if !slices.Equal(evA, evB) || len(evA) < 15 {
		t.Fatalf("tabs saw different events: A %d, B %d", len(evA), len(evB))
	}
	final := h.snapshot(th)
	if a.view(th).last() != final.LastSeq || int64(len(evA)) != final.LastSeq {
		t.Errorf("tabs applied up to seq %d (%d events), thread is at %d", a.view(th).last(), len(evA), final.LastSeq)
	}
	// Every published run message is exactly its deltas.
	for _, it := range a.view(th).events {
		if it.m["type"] != chat.EventMessagePublished || it.m["run_id"] == nil {
			continue
		}
		msg, _ := it.m["message"].(map[string]any)
		if msg["role"] != string(chat.RoleAssistant) {
			continue
		}
		if got := a.text(th, wsStr(msg, "message_id"), wsNum(it.m, "seq")); got != wsStr(msg, "content") || got == "" {
			t.Errorf("published %q, deltas %q", wsStr(msg, "content"), got)
		}
	}
}

// TestWSReconnectWithAfterSeq: a tab closed mid-run and reopened with
// after_seq receives exactly what it missed, then live events; closing it
// never cancelled the run.
func TestWSReconnectWithAfterSeq(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 5*time.Millisecond)
	th, runID, a, b := h.twoTabsMidRun(t, "Explain how vector clocks order events across replicas", 3)
	last := b.view(th).last()
	if err := b.conn.Close(websocket.StatusGoingAway, "tab closed"); err != nil {
		t.Fatalf("close the tab: %v", err)
	}
	a.untilDeltas(th, runID, 6) // the run goes on without the tab

	b2 := h.dial(t)
	ack := b2.subscribe(th, wsAfter(last))
	if ack["recovered"] != true || wsNum(ack, "last_seq") < last {
		t.Fatalf("resubscribe after seq %d: %v", last, ack)
	}
	done := a.untilEvent(th, chat.EventRunCompleted, runID)
	b2.untilEvent(th, chat.EventRunCompleted, runID)
	if wsNum(done, "seq") <= wsNum(ack, "last_seq") {
		t.Errorf("the run ended (seq %d) before the tab came back (seq %d): nothing was live", wsNum(done, "seq"), wsNum(ack, "last_seq"))
	}
	got := append(b.eventLines(th), b2.eventLines(th)...)
	if want := a.eventLines(th); !slices.Equal(got, want) {
		t.Errorf("closed and reopened tab saw %d+%d events, the open tab %d", len(b.eventLines(th)), len(b2.eventLines(th)), len(want))
	}
	if first := b2.view(th).events[0].m; wsNum(first, "seq") != last+1 {
		t.Errorf("after reconnecting the first event is %v, want seq %d", first, last+1)
	}
	for _, it := range a.view(th).events {
		if strings.HasPrefix(wsStr(it.m, "type"), "run.cancel") {
			t.Errorf("closing a tab cancelled the run: %s", it.raw)
		}
	}
	if run := h.run(runID); run.Status != chat.RunCompleted || run.CancelRequestedAt != nil || run.RequestedBy != nil {
		t.Errorf("run after a tab closed: %+v", run)
	}
	// Live events keep coming on the reopened tab.
	v := b2.view(th).version
	next := wsStr(b2.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": v, "user_message": "short follow-up"}), "run_id")
	b2.untilEvent(th, chat.EventRunCompleted, next)
}

// TestWSStaleTabGetsConflict: a tab that did not apply the latest events
// and starts a run is refused with state_version_conflict, offered reload
// and a fork from the checkpoint it was based on; nothing changes, and the
// tab recovers by catching up.
func TestWSStaleTabGetsConflict(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	th := h.createThread("").ThreadID
	a, b := h.dial(t), h.dial(t)
	ack := b.subscribe(th, nil)
	if ack["recovered"] != false {
		t.Fatalf("subscribe without after_seq: %v", ack)
	}
	first := b.untilEvent(th, chat.EventThreadSnapshot, "")
	staleVersion, staleHead := wsNum(first, "state_version"), wsStr(first, "head_checkpoint_id")

	a.subscribe(th, wsAfter(0))
	runID := wsStr(a.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": staleVersion, "user_message": "short first question"}), "run_id")
	a.untilEvent(th, chat.EventRunCompleted, runID)
	cur := h.snapshot(th)
	before := h.snapshotBytes(th)

	e := b.cmd(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": staleVersion, "user_message": "a question from a stale tab"})
	if e["type"] != "error" || e["error"] != chat.CodeStateVersionConflict || wsNum(e, "current_state_version") != cur.StateVersion ||
		e["current_checkpoint_id"] != cur.HeadCheckpointID {
		t.Fatalf("stale run.start: %v (thread at v%d head %s)", e, cur.StateVersion, cur.HeadCheckpointID)
	}
	if acts, _ := e["allowed_actions"].([]any); !slices.Equal(acts, []any{"reload", "fork_from_" + staleHead}) {
		t.Errorf("allowed_actions %v, want [reload fork_from_%s]", e["allowed_actions"], staleHead)
	}
	if got := h.snapshotBytes(th); got != before {
		t.Errorf("a refused run.start changed the thread:\n%s\n%s", before, got)
	}
	// Offered action: fork from the checkpoint the tab was based on.
	fork := b.ack(map[string]any{"type": "thread.fork", "thread_id": th, "from_checkpoint_id": staleHead})
	if forked := h.snapshot(wsStr(fork, "new_thread_id")); len(forked.Messages) != 0 {
		t.Errorf("fork from the stale head has %d messages", len(forked.Messages))
	}
	// Offered action: reload (catch up), then the same command succeeds.
	b.untilSeq(th, cur.LastSeq)
	if b.view(th).version != cur.StateVersion {
		t.Fatalf("caught-up tab at version %d, thread at %d", b.view(th).version, cur.StateVersion)
	}
	again := wsStr(b.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": cur.StateVersion, "user_message": "short retry"}), "run_id")
	b.untilEvent(th, chat.EventRunCompleted, again)
}

// When the bus reports events of a thread lost for good (neither NATS nor
// the event log holds them), the connection closes like one that missed an
// event, and the page starts over from after_seq.
func TestWSLostEventsCloseTheConnection(t *testing.T) {
	t.Parallel()
	spy := &feedSpy{}
	h := newHarness(t, 0, withFeedSpy(spy))
	th := h.createThread("").ThreadID
	other := h.createThread("").ThreadID
	a := h.dial(t)
	a.subscribe(th, wsAfter(0))
	sinks := spy.added(th)
	if len(sinks) != 1 {
		t.Fatalf("%d sinks added for the thread, want the connection's one", len(sinks))
	}
	lossAware, ok := sinks[0].(bus.LossAware)
	if !ok {
		t.Fatal("a WebSocket connection is not bus.LossAware: a bus could not tell it about lost events")
	}
	if lossAware.Lost(other, 1) { // a thread it does not watch: nothing happens
		t.Error("a connection kept a thread it does not watch")
	}
	a.subscribe(other, wsAfter(0))
	// Seqs it already has (it caught up from the log before the bus gave
	// them up): it misses nothing and stays.
	last := h.snapshot(th).LastSeq
	if !lossAware.Lost(th, last) {
		t.Errorf("a connection that has every seq through %d was dropped for losing them", last)
	}
	a.subscribe(th, nil) // still open: it answers
	if lossAware.Lost(th, last+3) {
		t.Error("a connection that misses seqs stays subscribed")
	}
	ce := a.closed()
	if ce.Code != websocket.StatusTryAgainLater || !strings.Contains(ce.Reason, "after_seq") {
		t.Errorf("closed with %d %q, want 1013 and a reason naming after_seq", ce.Code, ce.Reason)
	}
}

// A loss the bus reports while a subscribe is still catching up (another
// instance gave seqs up between the connection's Add and its read of the
// log) is judged by what the catch-up brings: a connection whose catch-up
// reaches past the loss stays, one left short of it is closed like one
// that missed an event.
func TestWSLossDuringSubscribeIsJudgedByTheCatchUp(t *testing.T) {
	t.Parallel()
	spy := &feedSpy{}
	var through atomic.Int64 // what the bus reports lost at the next Add
	spy.onAdd = func(threadID string, sink chat.EventSink) {
		if la, ok := sink.(bus.LossAware); ok && !la.Lost(threadID, through.Load()) {
			t.Error("a subscribing connection was dropped before its catch-up said what it has")
		}
	}
	h := newHarness(t, 0, withFeedSpy(spy))
	th := h.createThread("").ThreadID
	last := h.snapshot(th).LastSeq
	through.Store(last)
	a := h.dial(t)
	a.subscribe(th, wsAfter(0)) // the catch-up brings every seq through last
	a.subscribe(th, nil)        // still open: it answers
	through.Store(last + 3)
	a.post(map[string]any{"type": "subscribe", "thread_id": th, "after_seq": int64(0)})
	ce := a.closed()
	if ce.Code != websocket.StatusTryAgainLater || !strings.Contains(ce.Reason, "after_seq") {
		t.Errorf("closed with %d %q, want 1013 and a reason naming after_seq", ce.Code, ce.Reason)
	}
}

// TestWSStalledClientIsClosed: a client that stops reading is closed with
// 1013 and a reason that says to resubscribe with after_seq, while the
// other tabs on the thread keep up and receive everything. What the
// stalled client did receive is a gap-free prefix, and after_seq recovers
// exactly the rest.
func TestWSStalledClientIsClosed(t *testing.T) {
	t.Parallel()
	const queue = 32 << 10
	ml := newMetricsLog()
	h := newHarness(t, 0, withWS(gateway.WSConfig{QueueBytes: queue, StuckWrite: time.Minute}), withMetrics(ml))
	snap := h.createThread("")
	th := snap.ThreadID
	s := h.dialStalled(t)
	s.post(map[string]any{"type": "subscribe", "thread_id": th, "after_seq": int64(0)}) // and never reads again
	a, b := h.dial(t), h.dial(t)
	a.subscribe(th, wsAfter(0))
	b.subscribe(th, wsAfter(0))

	// Enough traffic to fill what the kernel holds for the stalled client
	// (a few tens of KiB with its socket options), the frame its writer
	// is stuck in, and the queue bound, with a wide margin.
	v, total := snap.StateVersion, 0
	for i := 0; total < 2*queue+384<<10; i++ {
		if i == 60 {
			t.Fatalf("%d runs did not produce %d bytes", i, 2*queue+384<<10)
		}
		n := len(a.items)
		runID := wsStr(a.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": v,
			"user_message": fmt.Sprintf("question %d about readers that stall", i)}), "run_id")
		for _, c := range []*wsClient{a, b} {
			c.untilEvent(th, chat.EventRunCompleted, runID)
		}
		for _, it := range a.items[n:] {
			total += len(it.raw)
		}
		v = a.view(th).version
	}
	final := h.snapshot(th)
	for _, c := range []*wsClient{a, b} {
		if c.view(th).last() != final.LastSeq {
			t.Errorf("a reading tab applied up to %d of %d", c.view(th).last(), final.LastSeq)
		}
		if extra := c.sync(); len(extra) != 0 {
			t.Errorf("a reading tab got more after the last run: %v", extra)
		}
	}
	if !slices.Equal(a.eventLines(th), b.eventLines(th)) {
		t.Errorf("the reading tabs saw different events")
	}

	ce := s.closed()
	if ce.Code != websocket.StatusTryAgainLater || !strings.Contains(ce.Reason, "after_seq") {
		t.Errorf("stalled client closed with %d %q, want 1013 and a reason naming after_seq", ce.Code, ce.Reason)
	}
	if q, st := ml.count("slow:websocket:queue_overflow"), ml.count("slow:websocket:stuck_write"); q != 1 || st != 0 {
		t.Errorf("slow closes counted: %d queue_overflow, %d stuck_write; want 1 and 0", q, st)
	}
	if got := ml.waitCount("open:websocket", 2); got != 2 {
		t.Errorf("%d WebSocket connections counted open after the slow close, want the 2 reading tabs", got)
	}
	last := s.view(th).last()
	if last >= final.LastSeq {
		t.Fatalf("the stalled client got all %d events: the test did not stall it", last)
	}
	got := s.eventLines(th)
	if want := a.eventLines(th); len(got) > len(want) || !slices.Equal(got, want[:len(got)]) {
		t.Errorf("the stalled client's %d events are not a prefix of the thread's", len(got))
	}
	t.Logf("stalled client cut at seq %d of %d after %d bytes to the others", last, final.LastSeq, total)

	s2 := h.dial(t)
	if ack := s2.subscribe(th, wsAfter(last)); ack["recovered"] != true {
		t.Fatalf("resubscribe after the slow close: %v", ack)
	}
	s2.untilSeq(th, final.LastSeq)
	if got := append(got, s2.eventLines(th)...); !slices.Equal(got, a.eventLines(th)) {
		t.Errorf("prefix + recovery = %d events, the thread has %d", len(got), len(a.eventLines(th)))
	}
}

// TestWSStuckWriterIsDropped: a client that stops reading while the queue
// bound is not reached is dropped by the sweeper once a write has been
// blocked for StuckWrite (no close frame can get through a full pipe);
// what it received is a gap-free prefix that after_seq completes.
func TestWSStuckWriterIsDropped(t *testing.T) {
	t.Parallel()
	const stuck = 150 * time.Millisecond
	ml := newMetricsLog()
	h := newHarness(t, 0, withWS(gateway.WSConfig{StuckWrite: stuck, CommandRate: 1000, CommandBurst: 1000}), withMetrics(ml))
	snap := h.createThread("")
	th := snap.ThreadID
	s := h.dialStalled(t)
	s.post(map[string]any{"type": "subscribe", "thread_id": th, "after_seq": int64(0)}) // and never reads again
	a := h.dial(t)
	a.subscribe(th, wsAfter(0))
	// Fill the stalled client's path (a few tens of KiB, say at most
	// 256 KiB), then keep the thread busy for several times StuckWrite.
	v, total := snap.StateVersion, 0
	var filled time.Time
	for i := 0; filled.IsZero() || time.Since(filled) < 4*stuck; i++ {
		if i == 200 {
			t.Fatalf("%d runs", i)
		}
		if filled.IsZero() && total >= 256<<10 {
			filled = time.Now()
		}
		n := len(a.items)
		runID := wsStr(a.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": v,
			"user_message": fmt.Sprintf("question %d about stuck writes", i)}), "run_id")
		a.untilEvent(th, chat.EventRunCompleted, runID)
		for _, it := range a.items[n:] {
			total += len(it.raw)
		}
		v = a.view(th).version
	}
	final := h.snapshot(th)
	deadline := time.Now().Add(waitTimeout)
	var err error
	for err == nil {
		_, err = s.readItem(deadline)
	}
	if code := websocket.CloseStatus(err); code != -1 {
		t.Errorf("stuck client ended with close code %d (%v), want a dropped connection", code, err)
	}
	if q, st := ml.count("slow:websocket:queue_overflow"), ml.count("slow:websocket:stuck_write"); q != 0 || st != 1 {
		t.Errorf("slow closes counted: %d queue_overflow, %d stuck_write; want 0 and 1", q, st)
	}
	last := s.view(th).last()
	if last >= final.LastSeq {
		t.Fatalf("the stuck client got all %d events", last)
	}
	s2 := h.dial(t)
	if ack := s2.subscribe(th, wsAfter(last)); ack["recovered"] != true {
		t.Fatalf("resubscribe: %v", ack)
	}
	s2.untilSeq(th, final.LastSeq)
	if got := append(s.eventLines(th), s2.eventLines(th)...); !slices.Equal(got, a.eventLines(th)) {
		t.Errorf("prefix + recovery = %d events, the thread has %d", len(got), len(a.eventLines(th)))
	}
}

// TestWSMaxSubscriptions: past MaxSubscriptions a subscribe is refused
// (rate_limited) and changes nothing; resubscribing a watched thread and
// subscribing after an unsubscribe work.
func TestWSMaxSubscriptions(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond, withWS(gateway.WSConfig{MaxSubscriptions: 2}))
	t1, t2, t3 := h.createThread("").ThreadID, h.createThread("").ThreadID, h.createThread("").ThreadID
	c := h.dial(t)
	c.subscribe(t1, wsAfter(1))
	c.subscribe(t2, wsAfter(1))
	if e := c.cmd(map[string]any{"type": "subscribe", "thread_id": t3, "after_seq": int64(1)}); e["type"] != "error" || e["error"] != chat.CodeRateLimited {
		t.Errorf("third subscribe: %v", e)
	}
	c.subscribe(t1, wsAfter(1))
	c.ack(map[string]any{"type": "unsubscribe", "thread_id": t2})
	c.subscribe(t3, wsAfter(1))
	// t3 is watched, t2 is not.
	r3 := wsStr(c.ack(map[string]any{"type": "run.start", "thread_id": t3, "expected_state_version": 1, "user_message": "short three"}), "run_id")
	r2 := h.startRun(t2, 1, "short two").RunID
	c.untilEvent(t3, chat.EventRunCompleted, r3)
	h.openSSE(t2, "after_seq=0", "").waitType(chat.EventRunCompleted, r2)
	if extra := c.sync(); len(extra) != 0 {
		t.Errorf("events after the runs: %v", extra)
	}
}

// TestWSLongReplayIsNotTooSlow: a subscribe whose replay or snapshot is
// larger than the queue bound is delivered whole to a client that reads;
// the bound is for live events a client falls behind on, so a reconnect is
// not closed as too slow again and again.
func TestWSLongReplayIsNotTooSlow(t *testing.T) {
	t.Parallel()
	const queue = 16 << 10
	h := newHarness(t, 0, withWS(gateway.WSConfig{QueueBytes: queue}))
	snap := h.createThread("")
	th := snap.ThreadID
	// Not watched live: with so small a bound a live stream may be ended
	// as too slow (the bound doing its job); this test is about replays.
	_, msg := h.runUnwatched(th, 1, "Explain consistent hashing with virtual nodes")
	cur := h.snapshot(th)
	h.runUnwatched(th, cur.StateVersion, "Explain "+strings.Repeat("replicas ", queue/9))
	cur = h.snapshot(th)
	if len(h.snapshotBytes(th)) < queue {
		t.Fatalf("the snapshot is only %d bytes", len(h.snapshotBytes(th)))
	}

	c := h.dial(t)
	c.subscribe(th, wsAfter(0))
	c.untilSeq(th, cur.LastSeq)
	if got := c.text(th, msg.MessageID, cur.LastSeq); got != msg.Content {
		t.Errorf("replayed deltas %q, published %q", got, msg.Content)
	}
	d := h.dial(t)
	d.subscribe(th, nil)
	if ev := d.untilEvent(th, chat.EventThreadSnapshot, ""); wsNum(ev, "seq") != cur.LastSeq {
		t.Errorf("snapshot at %d, thread at %d", wsNum(ev, "seq"), cur.LastSeq)
	}
	for _, x := range []*wsClient{c, d} {
		x.sync()
	}
}

// TestWSStalledResubscribesAreBounded: replays are exempt from the queue
// bound one at a time only; a client that stops reading and keeps
// subscribing is closed as too slow instead of making the server hold
// replay after replay.
func TestWSStalledResubscribesAreBounded(t *testing.T) {
	t.Parallel()
	const queue = 32 << 10
	h := newHarness(t, 0, withWS(gateway.WSConfig{QueueBytes: queue, StuckWrite: time.Minute, CommandRate: 1000, CommandBurst: 1000}))
	th := h.createThread("").ThreadID
	for v := int64(1); len(h.snapshotBytes(th)) < 2*queue; v = h.snapshot(th).StateVersion {
		h.runUnwatched(th, v, "Explain "+strings.Repeat("backlogs ", 2<<10))
	}
	s := h.dialStalled(t)
	for range 40 { // 40 replays of the whole thread if nothing stopped it
		s.post(map[string]any{"type": "subscribe", "thread_id": th, "after_seq": int64(0)})
	}
	// Only now does it read: the connection was closed as too slow.
	if ce := s.closed(); ce.Code != websocket.StatusTryAgainLater {
		t.Errorf("closed with %d %q, want 1013", ce.Code, ce.Reason)
	}
	if n := len(s.answered); n >= 40 {
		t.Errorf("all %d subscribes were answered", n)
	}
}

// TestWSSnapshotWhenBufferExpired: a reconnect whose missed deltas are no
// longer buffered gets recovered: false and a thread.snapshot at last_seq,
// then live events; a durable-only gap still replays.
func TestWSSnapshotWhenBufferExpired(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 5*time.Millisecond)
	th, runID, a, w := h.twoTabsMidRun(t, "Explain write-ahead logging", 3)
	last := a.view(th).last()
	a.conn.Close(websocket.StatusGoingAway, "tab closed")
	w.untilEvent(th, chat.EventRunCompleted, runID)
	n, err := h.st.Retention().PurgeStream(context.Background(), time.Now().Add(time.Minute))
	if err != nil || n == 0 {
		t.Fatalf("purge: %d deltas, %v", n, err)
	}
	cur := h.snapshot(th)

	a2 := h.dial(t)
	ack := a2.subscribe(th, wsAfter(last))
	if ack["recovered"] != false || wsNum(ack, "last_seq") != cur.LastSeq || wsNum(ack, "state_version") != cur.StateVersion {
		t.Fatalf("resubscribe over purged deltas: %v (thread at seq %d v%d)", ack, cur.LastSeq, cur.StateVersion)
	}
	ev := a2.read(time.Now().Add(waitTimeout))
	msgs, _ := ev["messages"].([]any)
	if ev["type"] != chat.EventThreadSnapshot || wsNum(ev, "seq") != cur.LastSeq || len(msgs) != 2 || ev["head_checkpoint_id"] != cur.HeadCheckpointID || ev["active_run"] != nil {
		t.Fatalf("after recovered false came %v", ev)
	}
	// The last three events are durable: that gap still replays.
	a3 := h.dial(t)
	if ack := a3.subscribe(th, wsAfter(cur.LastSeq-3)); ack["recovered"] != true {
		t.Errorf("durable-only gap: %v", ack)
	}
	a3.untilSeq(th, cur.LastSeq)
	// Then live.
	h.model.setPace(time.Millisecond)
	next := wsStr(a2.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": cur.StateVersion, "user_message": "short again"}), "run_id")
	for _, c := range []*wsClient{a2, a3} {
		c.untilEvent(th, chat.EventRunCompleted, next)
	}
	if !slices.Equal(a2.eventLines(th)[1:], a3.eventLines(th)[3:]) {
		t.Errorf("live events differ between the tabs")
	}
}

// TestWSSubscribeSnapshotThenLive: subscribe without after_seq mid-run:
// ack (recovered false), a thread.snapshot whose partial_text is exactly
// the deltas so far, then live events from the next seq.
func TestWSSubscribeSnapshotThenLive(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 5*time.Millisecond)
	th, runID, tabs := h.tabsMidRun(t, 1, "Explain how gossip protocols spread state", 3)
	a := tabs[0]

	b := h.dial(t)
	ack := b.subscribe(th, nil)
	wsWantKeys(t, "subscribe ack", ack, "type", "re", "thread_id", "recovered", "state_version", "last_seq")
	ev := b.read(time.Now().Add(waitTimeout))
	if ev["type"] != chat.EventThreadSnapshot || wsNum(ev, "seq") != wsNum(ack, "last_seq") || wsNum(ev, "state_version") != wsNum(ack, "state_version") {
		t.Fatalf("after the ack (%v) came %v", ack, ev)
	}
	active, _ := ev["active_run"].(map[string]any)
	if active == nil || active["run_id"] != runID || wsNum(active, "last_seq") != wsNum(ev, "seq") {
		t.Fatalf("snapshot of a running thread: active_run %v", ev["active_run"])
	}
	a.untilSeq(th, wsNum(ev, "seq"))
	if want := a.text(th, wsStr(active, "message_id"), wsNum(active, "last_seq")); wsStr(active, "partial_text") != want || want == "" {
		t.Errorf("partial_text %q, deltas %q", active["partial_text"], want)
	}
	b.untilEvent(th, chat.EventRunCompleted, runID)
	a.untilEvent(th, chat.EventRunCompleted, runID)
	la, lb := a.eventLines(th), b.eventLines(th)[1:]
	if len(lb) == 0 || !slices.Equal(la[len(la)-len(lb):], lb) {
		t.Errorf("live events after the snapshot differ from the other tab's")
	}
}

// TestWSTwoThreadsAndUnsubscribe: one connection watching two threads gets
// each thread's events in its own seq order; unsubscribing one stops its
// events (and never its run) while the other continues.
func TestWSTwoThreadsAndUnsubscribe(t *testing.T) {
	t.Parallel()
	// Frequent pings: keep-alive runs alongside the traffic.
	h := newHarness(t, 5*time.Millisecond, withWS(gateway.WSConfig{PingInterval: 2 * time.Millisecond}))
	t1, t2 := h.createThread("one").ThreadID, h.createThread("two").ThreadID
	c := h.dial(t)
	c.subscribe(t1, wsAfter(0))
	c.subscribe(t2, wsAfter(0))
	r1 := wsStr(c.ack(map[string]any{"type": "run.start", "thread_id": t1, "expected_state_version": 1, "user_message": "Explain quorum reads"}), "run_id")
	r2 := wsStr(c.ack(map[string]any{"type": "run.start", "thread_id": t2, "expected_state_version": 1, "user_message": "Explain leader leases"}), "run_id")
	c.untilDeltas(t1, r1, 3)
	c.untilDeltas(t2, r2, 3)
	interleaved := 0
	for i := 1; i < len(c.items); i++ {
		if p, q := wsStr(c.items[i-1].m, "thread_id"), wsStr(c.items[i].m, "thread_id"); p != "" && q != "" && p != q {
			interleaved++
		}
	}
	if interleaved == 0 {
		t.Errorf("the two runs' events did not interleave on the connection")
	}
	u := c.ack(map[string]any{"type": "unsubscribe", "thread_id": t1})
	wsWantKeys(t, "unsubscribe ack", u, "type", "re")
	stoppedAt := c.view(t1).last()
	c.untilEvent(t2, chat.EventRunCompleted, r2) // observe fails on any t1 event after the ack
	s1 := h.openSSE(t1, "after_seq=0", "")
	s1.waitType(chat.EventRunCompleted, r1)
	if extra := c.sync(); len(extra) != 0 {
		t.Errorf("events after unsubscribe: %v", extra)
	}
	if run := h.run(r1); run.Status != chat.RunCompleted {
		t.Errorf("run of the unsubscribed thread: %s", run.Status)
	}
	// Resubscribing where it stopped fills the gap exactly.
	if ack := c.subscribe(t1, wsAfter(stoppedAt)); ack["recovered"] != true {
		t.Fatalf("resubscribe: %v", ack)
	}
	final := h.snapshot(t1)
	c.untilSeq(t1, final.LastSeq)
	var want []string
	for _, e := range s1.events {
		want = append(want, string(e.Data))
	}
	if got := c.eventLines(t1); !slices.Equal(got, want) {
		t.Errorf("t1 over the connection: %d events, over SSE %d", len(got), len(want))
	}
}

// TestWSHelloAndCancel: hello answers the connection id; a cancel over
// the connection records requested_by tab:<tab_id> (tab:<connection_id>
// without hello); its ack precedes its event; a second cancel is
// already_requested and changes nothing.
func TestWSHelloAndCancel(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 20*time.Millisecond)
	snap := h.createThread("")
	th := snap.ThreadID
	a := h.dial(t)
	hello := a.ack(map[string]any{"type": "hello", "tab_id": "tab-7"})
	wsWantKeys(t, "hello ack", hello, "type", "re", "connection_id")
	conn := wsStr(hello, "connection_id")
	if !strings.HasPrefix(conn, "con_") {
		t.Errorf("connection_id %q", conn)
	}
	a.subscribe(th, wsAfter(0))
	runID := wsStr(a.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": 1, "user_message": "Explain backpressure in streaming systems"}), "run_id")
	a.untilDeltas(th, runID, 2)
	before := a.view(th).version
	cancel := a.ack(map[string]any{"type": "run.cancel", "run_id": runID})
	wsWantKeys(t, "run.cancel ack", cancel, "type", "re", "run_id", "status", "accepted_state_version", "resume_checkpoint_id", "published_message_id", "already_requested")
	if cancel["status"] != string(chat.RunCancelRequested) || cancel["already_requested"] != false || cancel["run_id"] != runID ||
		wsNum(cancel, "accepted_state_version") <= before || !strings.HasPrefix(wsStr(cancel, "resume_checkpoint_id"), chat.PrefixCheckpoint) {
		t.Errorf("run.cancel ack %v", cancel)
	}
	done := a.untilEvent(th, chat.EventRunCancelled, runID)
	if n := a.causedAfter(wsStr(cancel, "re"), func(m map[string]any) bool {
		return m["type"] == chat.EventRunCancelRequested && m["run_id"] == runID
	}); n != 1 {
		t.Errorf("%d run.cancel_requested events", n)
	}
	for _, it := range a.view(th).events {
		if it.m["type"] == chat.EventRunCancelRequested {
			if it.m["requested_by"] != "tab:tab-7" || it.m["reason"] != "user_requested" || wsNum(it.m, "state_version") != wsNum(cancel, "accepted_state_version") {
				t.Errorf("run.cancel_requested %s", it.raw)
			}
		}
	}
	if run := h.run(runID); run.RequestedBy == nil || *run.RequestedBy != "tab:tab-7" || run.Status != chat.RunCancelled {
		t.Errorf("run after a cancel over WebSocket: %+v", run)
	}
	cur := h.snapshotBytes(th)
	again := a.cmd(map[string]any{"type": "run.cancel", "run_id": runID, "reason": "clicked twice"})
	if again["type"] != "ack" || again["already_requested"] != true || again["status"] != string(chat.RunCancelled) {
		t.Errorf("second cancel: %v", again)
	}
	if extra := a.sync(); len(extra) != 0 {
		t.Errorf("a second cancel emitted %v", extra)
	}
	if got := h.snapshotBytes(th); got != cur {
		t.Errorf("a second cancel changed the thread")
	}

	// Without hello the connection id names the tab; a stale
	// expected_state_version does not block a cancel.
	b := h.dial(t)
	b.subscribe(th, wsAfter(wsNum(done, "seq")))
	h.model.setPace(10 * time.Millisecond)
	run2 := wsStr(b.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": wsNum(done, "state_version")}), "run_id")
	b.untilDeltas(th, run2, 1)
	c2 := b.ack(map[string]any{"type": "run.cancel", "run_id": run2, "reason": "changed my mind", "expected_state_version": 1})
	if c2["already_requested"] != false {
		t.Errorf("cancel with a stale version: %v", c2)
	}
	ev := b.untilEvent(th, chat.EventRunCancelRequested, run2)
	by := wsStr(ev, "requested_by")
	if !strings.HasPrefix(by, "tab:con_") || by == "tab:"+conn || ev["reason"] != "changed my mind" {
		t.Errorf("cancel without hello: requested_by %q, reason %v", by, ev["reason"])
	}
	b.untilEvent(th, chat.EventRunCancelled, run2)
	if run := h.run(run2); run.RequestedBy == nil || *run.RequestedBy != by {
		t.Errorf("run requested_by %v, event %q", run.RequestedBy, by)
	}
}

// TestWSFragmentDraftFork: fragment.save, draft.delete and thread.fork over
// the connection answer the protocol's fields, before their events.
func TestWSFragmentDraftFork(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 20*time.Millisecond)
	th, runID, tabs := h.tabsMidRun(t, 1, "Explain vector clocks", 3)
	c := tabs[0]
	deltas := c.untilDeltas(th, runID, 3)
	msgID, upTo := wsStr(deltas[0], "message_id"), wsNum(deltas[1], "seq")
	version := c.view(th).version

	saved := c.ack(map[string]any{"type": "fragment.save", "thread_id": th, "message_id": msgID, "last_seq": upTo, "expected_state_version": version})
	wsWantKeys(t, "fragment.save ack", saved, "type", "re", "message_id", "checkpoint_id", "state_version")
	fragID := wsStr(saved, "message_id")
	if !strings.HasPrefix(fragID, chat.PrefixMessage) || fragID == msgID || wsNum(saved, "state_version") <= version {
		t.Errorf("fragment.save ack %v", saved)
	}
	c.until("the fragment's checkpoint", func(m map[string]any) bool {
		return m["type"] == chat.EventCheckpointCreated && m["checkpoint_id"] == saved["checkpoint_id"]
	})
	var frag map[string]any
	if n := c.causedAfter(wsStr(saved, "re"), func(m map[string]any) bool {
		sv := wsNum(m, "state_version")
		if msg, _ := m["message"].(map[string]any); msg != nil && msg["message_id"] == fragID {
			frag = m
		}
		return m["thread_id"] == th && m["type"] != chat.EventMessageDelta && sv > version && sv <= wsNum(saved, "state_version")
	}); n != 2 || frag == nil {
		t.Fatalf("fragment.save caused %d events (published: %v)", n, frag)
	}
	msg := frag["message"].(map[string]any)
	of, _ := msg["fragment_of"].(map[string]any)
	if _, ok := frag["run_id"]; ok || msg["kind"] != string(chat.KindFragment) || msg["run_id"] != nil || msg["content"] != c.text(th, msgID, upTo) ||
		of["run_id"] != runID || of["message_id"] != msgID || wsNum(of, "last_seq") != upTo {
		t.Errorf("fragment published as %v (deltas up to %d: %q)", frag, upTo, c.text(th, msgID, upTo))
	}
	c.ack(map[string]any{"type": "run.cancel", "run_id": runID})
	c.untilEvent(th, chat.EventRunCancelled, runID)

	version = c.view(th).version
	del := c.ack(map[string]any{"type": "draft.delete", "thread_id": th, "message_id": fragID, "expected_state_version": version})
	wsWantKeys(t, "draft.delete ack", del, "type", "re", "checkpoint_id", "state_version")
	if wsNum(del, "state_version") <= version || !strings.HasPrefix(wsStr(del, "checkpoint_id"), chat.PrefixCheckpoint) {
		t.Errorf("draft.delete ack %v", del)
	}
	gone := c.untilEvent(th, chat.EventMessageDeleted, "")
	c.until("the delete's checkpoint", func(m map[string]any) bool {
		return m["type"] == chat.EventCheckpointCreated && m["checkpoint_id"] == del["checkpoint_id"]
	})
	if _, ok := gone["run_id"]; ok || gone["message_id"] != fragID || gone["checkpoint_id"] != del["checkpoint_id"] {
		t.Errorf("message.deleted %v", gone)
	}
	if n := c.causedAfter(wsStr(del, "re"), func(m map[string]any) bool {
		return m["type"] == chat.EventMessageDeleted || (m["type"] == chat.EventCheckpointCreated && m["checkpoint_id"] == del["checkpoint_id"])
	}); n != 2 {
		t.Errorf("draft.delete caused %d events", n)
	}
	after := h.snapshot(th)
	if slices.Contains(messageIDs(after.Messages), fragID) || after.HeadCheckpointID != wsStr(del, "checkpoint_id") {
		t.Errorf("history after draft.delete: %v head %s", messageIDs(after.Messages), after.HeadCheckpointID)
	}

	// Fork from the fragment's checkpoint: the new thread holds the
	// fragment, the original is untouched.
	before := h.snapshotBytes(th)
	fork := c.ack(map[string]any{"type": "thread.fork", "thread_id": th, "from_checkpoint_id": saved["checkpoint_id"]})
	wsWantKeys(t, "thread.fork ack", fork, "type", "re", "new_thread_id", "head_checkpoint_id")
	newTh := wsStr(fork, "new_thread_id")
	if !strings.HasPrefix(newTh, chat.PrefixThread) || newTh == th || !strings.HasPrefix(wsStr(fork, "head_checkpoint_id"), chat.PrefixCheckpoint) {
		t.Fatalf("thread.fork ack %v", fork)
	}
	if extra := c.sync(); len(extra) != 0 {
		t.Errorf("the fork emitted on the original thread: %v", extra)
	}
	if got := h.snapshotBytes(th); got != before {
		t.Errorf("the fork changed the original thread")
	}
	c.subscribe(newTh, nil)
	fs := c.untilEvent(newTh, chat.EventThreadSnapshot, "")
	msgs, _ := fs["messages"].([]any)
	if len(msgs) != 2 || fs["head_checkpoint_id"] != fork["head_checkpoint_id"] || msgs[1].(map[string]any)["content"] != msg["content"] {
		t.Errorf("forked thread snapshot %v", fs)
	}
}

// TestWSBadInput: every malformed or refused command gets the protocol's
// error (re only when the frame had a readable id), changes nothing, and
// leaves the connection usable.
func TestWSBadInput(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond, withWS(gateway.WSConfig{CommandRate: 1000, CommandBurst: 1000}))
	snap := h.createThread("")
	th := snap.ThreadID
	runAck, reply := h.runToEnd(th, 1, "short question")
	cur := h.snapshot(th)
	userMsg := cur.Messages[0].MessageID
	c := h.dial(t)
	c.subscribe(th, nil)
	c.untilEvent(th, chat.EventThreadSnapshot, "")

	const inv, nf = chat.CodeInvalidRequest, chat.CodeNotFound
	v := cur.StateVersion
	q := func(format string, args ...any) string { return fmt.Sprintf(format, args...) }
	cases := []struct {
		name, frame, re, code string
	}{
		{"malformed JSON", `{"type":"hello","id":"b1",`, "", inv},
		{"not JSON", `hello`, "", inv},
		{"JSON array", `[{"type":"hello","id":"b2","tab_id":"x"}]`, "", inv},
		{"empty array", `[]`, "", inv},
		{"JSON string", `"hello"`, "", inv},
		{"JSON null", `null`, "", inv},
		{"JSON number", `42`, "", inv},
		{"two objects", `{"type":"hello","id":"b3","tab_id":"x"} {"type":"hello","id":"b4","tab_id":"y"}`, "", inv},
		{"trailing garbage", `{"type":"hello","id":"b5","tab_id":"x"}}`, "", inv},
		{"empty frame", ``, "", inv},
		{"missing id", `{"type":"hello","tab_id":"x"}`, "", inv},
		{"empty id", `{"type":"hello","id":"","tab_id":"x"}`, "", inv},
		{"numeric id", `{"type":"hello","id":5,"tab_id":"x"}`, "", inv},
		{"object id", `{"type":"hello","id":{"n":1},"tab_id":"x"}`, "", inv},
		{"missing type", `{"id":"b6"}`, "b6", inv},
		{"numeric type", `{"type":7,"id":"b7"}`, "b7", inv},
		{"unknown type", q(`{"type":"thread.archive","id":"b8","thread_id":%q}`, th), "b8", inv},
		{"type in another case", q(`{"type":"Subscribe","id":"b9","thread_id":%q}`, th), "b9", inv},
		{"unknown field", q(`{"type":"subscribe","id":"b10","thread_id":%q,"after":0}`, th), "b10", inv},
		{"field name in another case", q(`{"type":"run.start","id":"b11","Thread_Id":%q,"expected_state_version":%d,"user_message":"hi"}`, th, v), "b11", inv},
		{"hello without tab_id", `{"type":"hello","id":"b12"}`, "b12", inv},
		{"hello with a space in tab_id", `{"type":"hello","id":"b13","tab_id":"two words"}`, "b13", inv},
		{"hello with a long tab_id", q(`{"type":"hello","id":"b14","tab_id":%q}`, strings.Repeat("t", 65)), "b14", inv},
		{"hello with tab_id as number", `{"type":"hello","id":"b15","tab_id":3}`, "b15", inv},
		{"subscribe without thread_id", `{"type":"subscribe","id":"b16"}`, "b16", inv},
		{"subscribe with thread_id as number", `{"type":"subscribe","id":"b17","thread_id":1}`, "b17", inv},
		{"subscribe with negative after_seq", q(`{"type":"subscribe","id":"b18","thread_id":%q,"after_seq":-1}`, th), "b18", inv},
		{"subscribe with after_seq as string", q(`{"type":"subscribe","id":"b19","thread_id":%q,"after_seq":"3"}`, th), "b19", inv},
		{"subscribe with fractional after_seq", q(`{"type":"subscribe","id":"b20","thread_id":%q,"after_seq":1.5}`, th), "b20", inv},
		{"subscribe to an unknown thread", `{"type":"subscribe","id":"b21","thread_id":"thr_00000000000000000000000000","after_seq":0}`, "b21", nf},
		{"subscribe to an unknown thread from a snapshot", `{"type":"subscribe","id":"b22","thread_id":"thr_00000000000000000000000000"}`, "b22", nf},
		{"subscribe to a run id", q(`{"type":"subscribe","id":"b23","thread_id":%q}`, runAck.RunID), "b23", nf},
		{"unsubscribe without thread_id", `{"type":"unsubscribe","id":"b24"}`, "b24", inv},
		{"run.start without thread_id", q(`{"type":"run.start","id":"b25","expected_state_version":%d,"user_message":"hi"}`, v), "b25", inv},
		{"run.start without expected_state_version", q(`{"type":"run.start","id":"b26","thread_id":%q,"user_message":"hi"}`, th), "b26", inv},
		{"run.start with expected_state_version as string", q(`{"type":"run.start","id":"b27","thread_id":%q,"expected_state_version":"%d","user_message":"hi"}`, th, v), "b27", inv},
		{"run.start with an empty user_message", q(`{"type":"run.start","id":"b28","thread_id":%q,"expected_state_version":%d,"user_message":""}`, th, v), "b28", inv},
		{"run.start with a user_message over 32768 bytes", q(`{"type":"run.start","id":"b29","thread_id":%q,"expected_state_version":%d,"user_message":%q}`, th, v, strings.Repeat("w", 32769)), "b29", inv},
		{"run.start with user_message as number", q(`{"type":"run.start","id":"b30","thread_id":%q,"expected_state_version":%d,"user_message":5}`, th, v), "b30", inv},
		{"run.start on an unknown thread", q(`{"type":"run.start","id":"b31","thread_id":"thr_00000000000000000000000000","expected_state_version":%d,"user_message":"hi"}`, v), "b31", nf},
		{"run.start from an unknown checkpoint", q(`{"type":"run.start","id":"b32","thread_id":%q,"expected_state_version":%d,"resume_from_checkpoint_id":"cp_00000000000000000000000000"}`, th, v), "b32", chat.CodeCheckpointNotFound},
		{"run.start with a stale version", q(`{"type":"run.start","id":"b33","thread_id":%q,"expected_state_version":1,"user_message":"hi"}`, th), "b33", chat.CodeStateVersionConflict},
		{"run.cancel without run_id", `{"type":"run.cancel","id":"b34"}`, "b34", inv},
		{"run.cancel of an unknown run", `{"type":"run.cancel","id":"b35","run_id":"run_00000000000000000000000000"}`, "b35", nf},
		{"run.cancel with an empty reason", q(`{"type":"run.cancel","id":"b36","run_id":%q,"reason":""}`, runAck.RunID), "b36", inv},
		{"run.cancel with version as string", q(`{"type":"run.cancel","id":"b37","run_id":%q,"expected_state_version":"2"}`, runAck.RunID), "b37", inv},
		{"run.cancel of a completed run", q(`{"type":"run.cancel","id":"b38","run_id":%q}`, runAck.RunID), "b38", chat.CodeRunNotActive},
		{"fragment.save without last_seq", q(`{"type":"fragment.save","id":"b39","thread_id":%q,"message_id":%q,"expected_state_version":%d}`, th, reply.MessageID, v), "b39", inv},
		{"fragment.save with last_seq as string", q(`{"type":"fragment.save","id":"b40","thread_id":%q,"message_id":%q,"last_seq":"4","expected_state_version":%d}`, th, reply.MessageID, v), "b40", inv},
		{"fragment.save of a user message", q(`{"type":"fragment.save","id":"b41","thread_id":%q,"message_id":%q,"last_seq":2,"expected_state_version":%d}`, th, userMsg, v), "b41", nf},
		{"draft.delete without message_id", q(`{"type":"draft.delete","id":"b42","thread_id":%q,"expected_state_version":%d}`, th, v), "b42", inv},
		{"draft.delete without expected_state_version", q(`{"type":"draft.delete","id":"b43","thread_id":%q,"message_id":%q}`, th, reply.MessageID), "b43", inv},
		{"draft.delete of a published text message", q(`{"type":"draft.delete","id":"b44","thread_id":%q,"message_id":%q,"expected_state_version":%d}`, th, reply.MessageID, v), "b44", inv},
		{"thread.fork without from_checkpoint_id", q(`{"type":"thread.fork","id":"b45","thread_id":%q}`, th), "b45", inv},
		{"thread.fork from an unknown checkpoint", q(`{"type":"thread.fork","id":"b46","thread_id":%q,"from_checkpoint_id":"cp_00000000000000000000000000"}`, th), "b46", chat.CodeCheckpointNotFound},
		{"thread.fork of an unknown thread", q(`{"type":"thread.fork","id":"b47","thread_id":"thr_00000000000000000000000000","from_checkpoint_id":%q}`, cur.HeadCheckpointID), "b47", nf},
		{"thread.checkout without checkpoint_id", q(`{"type":"thread.checkout","id":"b48","thread_id":%q,"expected_state_version":%d}`, th, v), "b48", inv},
		{"thread.checkout without expected_state_version", q(`{"type":"thread.checkout","id":"b49","thread_id":%q,"checkpoint_id":%q}`, th, cur.HeadCheckpointID), "b49", inv},
		{"thread.checkout of an unknown checkpoint", q(`{"type":"thread.checkout","id":"b50","thread_id":%q,"checkpoint_id":"cp_00000000000000000000000000","expected_state_version":%d}`, th, v), "b50", chat.CodeCheckpointNotFound},
	}
	nThreads, before := h.threadCount(""), h.snapshotBytes(th)
	runBefore := string(h.call(http.MethodGet, "/api/runs/"+runAck.RunID, nil, http.StatusOK, nil).body)
	check := func(name string, m map[string]any, re, code string) {
		t.Helper()
		got, hasRe := m["re"]
		if m["type"] != "error" || m["error"] != code || (re == "" && hasRe) || (re != "" && got != re) {
			t.Errorf("%s: answered %v, want error %s with re %q", name, m, code, re)
		}
		if s := h.snapshotBytes(th); s != before {
			t.Errorf("%s: the thread changed: %.200s", name, s)
			before = s
		}
	}
	for _, tc := range cases {
		c.sendRaw(websocket.MessageText, []byte(tc.frame))
		check(tc.name, c.read(time.Now().Add(waitTimeout)), tc.re, tc.code)
	}
	c.sendRaw(websocket.MessageBinary, []byte(`{"type":"hello","id":"bin","tab_id":"x"}`))
	check("binary frame", c.read(time.Now().Add(waitTimeout)), "", inv)

	if n := h.threadCount(""); n != nThreads {
		t.Errorf("%d threads, want %d", n, nThreads)
	}
	if got := string(h.call(http.MethodGet, "/api/runs/"+runAck.RunID, nil, http.StatusOK, nil).body); got != runBefore {
		t.Errorf("the run changed:\n%s\n%s", runBefore, got)
	}
	// Still usable: a valid command is answered, and nothing was emitted.
	if extra := c.sync(); len(extra) != 0 {
		t.Errorf("bad input emitted %v", extra)
	}
	c.ack(map[string]any{"type": "hello", "tab_id": "after-bad-input"})
	next := wsStr(c.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": v, "user_message": "short valid"}), "run_id")
	c.untilEvent(th, chat.EventRunCompleted, next)
}

// padded is a hello command padded with spaces to n bytes.
func wsPadded(id string, n int) []byte {
	b := []byte(fmt.Sprintf(`{"type":"hello","id":%q,"tab_id":"big"}`, id))
	return append(b, []byte(strings.Repeat(" ", n-len(b)))...)
}

// TestWSFrameOverReadLimit: a frame at the limit is served; one over it
// closes the connection with 1009 and changes nothing.
func TestWSFrameOverReadLimit(t *testing.T) {
	t.Parallel()
	const limit = 4 << 10
	h := newHarness(t, time.Millisecond, withWS(gateway.WSConfig{ReadLimit: limit}))
	th := h.createThread("").ThreadID
	c := h.dial(t)
	c.subscribe(th, nil)
	c.untilEvent(th, chat.EventThreadSnapshot, "")
	before := h.snapshotBytes(th)
	c.sendRaw(websocket.MessageText, wsPadded("at-limit", limit))
	if a := c.answer("at-limit"); a["type"] != "ack" {
		t.Errorf("a frame of exactly the limit: %v", a)
	}
	c.sendRaw(websocket.MessageText, wsPadded("over", limit+1024))
	if ce := c.closed(); ce.Code != websocket.StatusMessageTooBig {
		t.Errorf("frame over the limit: closed with %d %q, want 1009", ce.Code, ce.Reason)
	}
	if _, ok := c.answered["over"]; ok {
		t.Errorf("the oversized frame was answered")
	}
	if got := h.snapshotBytes(th); got != before {
		t.Errorf("the thread changed")
	}
	h.dial(t).ack(map[string]any{"type": "hello", "tab_id": "next"})
}

// TestWSDefaultReadLimit: by default a frame of 1 MiB is served and a larger
// one closes the connection with 1009.
func TestWSDefaultReadLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	c := h.dial(t)
	c.sendRaw(websocket.MessageText, wsPadded("one-mib", 1<<20))
	if a := c.answer("one-mib"); a["type"] != "ack" {
		t.Errorf("a frame of 1 MiB: %v", a)
	}
	c.sendRaw(websocket.MessageText, wsPadded("over", 1<<20+1))
	if ce := c.closed(); ce.Code != websocket.StatusMessageTooBig {
		t.Errorf("frame over 1 MiB: closed with %d %q, want 1009", ce.Code, ce.Reason)
	}
}

// TestWSRateLimited: a flood of commands is answered in order, one answer
// each with its re, the excess rate_limited and not executed; the
// connection serves commands again once the rate allows.
func TestWSRateLimited(t *testing.T) {
	t.Parallel()
	ml := newMetricsLog()
	h := newHarness(t, 20*time.Millisecond, withWS(gateway.WSConfig{CommandRate: 100, CommandBurst: 5}), withMetrics(ml))
	th := h.createThread("").ThreadID
	c := h.dial(t)
	c.subscribe(th, nil)
	c.untilEvent(th, chat.EventThreadSnapshot, "")
	before := h.snapshotBytes(th)
	ids := make([]string, 40)
	for i := range ids {
		ids[i] = c.post(map[string]any{"type": "hello", "tab_id": fmt.Sprintf("flood-%d", i)})
	}
	acked, limited, lastTab := 0, 0, ""
	for i, id := range ids {
		m := c.read(time.Now().Add(waitTimeout))
		switch {
		case m["re"] != id:
			t.Fatalf("answer %d is %v, want the answer to %s", i, m, id)
		case m["type"] == "ack":
			acked++
			lastTab = fmt.Sprintf("flood-%d", i)
		case m["error"] == chat.CodeRateLimited:
			limited++
		default:
			t.Errorf("flood answer %v", m)
		}
	}
	if acked < 4 || limited == 0 {
		t.Errorf("flood of %d: %d acked, %d rate_limited", len(ids), acked, limited)
	}
	if got := ml.count("limited:connection_commands"); got != limited {
		t.Errorf("%d rate_limited answers counted as connection_commands, want %d", got, limited)
	}
	if in := ml.count("frames_in"); in < len(ids)+1 || ml.count("bytes_in") < in*20 {
		t.Errorf("%d frames of %d bytes counted in, want at least %d", in, ml.count("bytes_in"), len(ids)+1)
	}
	if got := h.snapshotBytes(th); got != before {
		t.Errorf("the flood changed the thread")
	}
	// Usable again; what was refused was not executed: the tab is the one
	// the last accepted hello named.
	retry := func(fields map[string]any) map[string]any {
		t.Helper()
		deadline := time.Now().Add(waitTimeout)
		for time.Now().Before(deadline) {
			f := maps.Clone(fields)
			if m := c.cmd(f); m["error"] != chat.CodeRateLimited {
				if m["type"] != "ack" {
					t.Fatalf("%v answered %v", fields, m)
				}
				return m
			}
		}
		t.Fatalf("%v still rate limited after %v", fields, waitTimeout)
		return nil
	}
	runID := wsStr(retry(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": 1, "user_message": "Explain token buckets"}), "run_id")
	c.untilDeltas(th, runID, 1)
	retry(map[string]any{"type": "run.cancel", "run_id": runID})
	ev := c.untilEvent(th, chat.EventRunCancelRequested, runID)
	if ev["requested_by"] != "tab:"+lastTab {
		t.Errorf("requested_by %v, want tab:%s (the last hello accepted)", ev["requested_by"], lastTab)
	}
	c.untilEvent(th, chat.EventRunCancelled, runID)
	if got := ml.count("ack:websocket"); got != 1 {
		t.Errorf("%d cancel acks measured, want 1", got)
	}
	if ml.count("frames_out") == 0 || ml.count("bytes_out") == 0 {
		t.Errorf("no frames counted out")
	}
	c.conn.CloseNow()
	if got := ml.waitCount("open:websocket", 0); got != 0 {
		t.Errorf("%d WebSocket connections counted open after the last closed", got)
	}
}

// TestWSShutdownClosesGoingAway: shutting the endpoint down closes every
// connection with 1001 and a reason to reconnect, refuses new ones, and
// never cancels a run.
func TestWSShutdownClosesGoingAway(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 5*time.Millisecond)
	th, s := h.threadWithStream("")
	a, b := h.dial(t), h.dial(t)
	a.subscribe(th, wsAfter(0))
	b.subscribe(th, nil)
	runID := wsStr(a.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": 1, "user_message": "Explain graceful shutdown"}), "run_id")
	a.untilDeltas(th, runID, 2)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	shut := make(chan struct{})
	go func() { // it waits for the close handshakes, which need the clients reading
		defer close(shut)
		h.api.CloseWebSockets(ctx) // the harness calls it again at cleanup
	}()
	for _, c := range []*wsClient{a, b} {
		if ce := c.closed(); ce.Code != websocket.StatusGoingAway || !strings.Contains(ce.Reason, "reconnect") {
			t.Errorf("%s closed with %d %q, want 1001 and a reason to reconnect", c.name, ce.Code, ce.Reason)
		}
	}
	<-shut // bounded by ctx
	conn, _, err := websocket.Dial(ctx, h.wsURL(), nil)
	if err == nil {
		conn.CloseNow()
		t.Errorf("a connection was accepted after shutdown")
	}
	s.waitType(chat.EventRunCompleted, runID)
	for _, e := range s.events {
		if strings.HasPrefix(e.Type, "run.cancel") {
			t.Errorf("shutting the WebSockets down cancelled the run: %v", e)
		}
	}
	if run := h.run(runID); run.Status != chat.RunCompleted || run.CancelRequestedAt != nil {
		t.Errorf("run after shutdown: %+v", run)
	}
}

// TestWSOrigin: no Origin (a program), the server's own origin and a
// configured one connect; a foreign origin gets 403 in the protocol's error
// shape.
func TestWSOrigin(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond, withWS(gateway.WSConfig{OriginPatterns: []string{"app.example.com"}}))
	dial := func(origin string) (*http.Response, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		hdr := http.Header{}
		if origin != "" {
			hdr.Set("Origin", origin)
		}
		conn, resp, err := websocket.Dial(ctx, h.wsURL(), &websocket.DialOptions{HTTPHeader: hdr})
		if err == nil {
			conn.CloseNow()
		}
		return resp, err
	}
	for _, origin := range []string{"", h.srv.URL, "https://app.example.com", "https://APP.example.com"} {
		if _, err := dial(origin); err != nil {
			t.Errorf("Origin %q refused: %v", origin, err)
		}
	}
	for _, origin := range []string{"https://evil.example", "https://app.example.com.evil.example", "null"} {
		resp, err := dial(origin)
		if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Errorf("Origin %q: %v, want 403", origin, err)
			continue
		}
		// The same check over plain HTTP shows the body.
		r := h.do(http.MethodGet, "/ws", nil, "Origin", origin, "Connection", "Upgrade", "Upgrade", "websocket",
			"Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		h.wantError(t, r, http.StatusForbidden, chat.CodeForbidden)
	}
}

// TestWSCheckoutSwitchesBranch: after an edited request, thread.checkout
// moves the head back to the original branch; every tab gets
// thread.head_moved and a snapshot then shows that branch's messages; a
// tab that has not applied the move is refused with the conflict and
// changes nothing; the head itself is a no-op; a running run refuses it.
func TestWSCheckoutSwitchesBranch(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("")
	th, root := snap.ThreadID, snap.HeadCheckpointID
	a, b := h.dial(t), h.dial(t)
	a.subscribe(th, wsAfter(0))
	b.subscribe(th, wsAfter(0))

	first := wsStr(a.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": snap.StateVersion, "user_message": "short original question"}), "run_id")
	a.untilEvent(th, chat.EventRunCompleted, first)
	original := h.snapshot(th)
	edited := wsStr(a.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": original.StateVersion,
		"resume_from_checkpoint_id": root, "user_message": "short edited question"}), "run_id")
	a.untilEvent(th, chat.EventRunCompleted, edited)
	cur := h.snapshot(th)
	if len(cur.Messages) != 2 || cur.Messages[0].Content != "short edited question" {
		t.Fatalf("after the edit the head holds %+v", cur.Messages)
	}
	b.untilSeq(th, cur.LastSeq)

	ack := b.ack(map[string]any{"type": "thread.checkout", "thread_id": th, "checkpoint_id": original.HeadCheckpointID, "expected_state_version": cur.StateVersion})
	if ack["head_checkpoint_id"] != original.HeadCheckpointID || wsNum(ack, "state_version") != cur.StateVersion+1 {
		t.Fatalf("checkout ack %v, want head %s at v%d", ack, original.HeadCheckpointID, cur.StateVersion+1)
	}
	for _, c := range []*wsClient{a, b} {
		ev := c.untilEvent(th, chat.EventThreadHeadMoved, "")
		if ev["head_checkpoint_id"] != original.HeadCheckpointID || ev["previous_head_checkpoint_id"] != cur.HeadCheckpointID ||
			wsNum(ev, "seq") != cur.LastSeq+1 || wsNum(ev, "state_version") != cur.StateVersion+1 {
			t.Errorf("%s got %v, want the move from %s to %s at seq %d, v%d", c.name, ev, cur.HeadCheckpointID, original.HeadCheckpointID, cur.LastSeq+1, cur.StateVersion+1)
		}
	}
	moved := h.snapshot(th)
	if moved.HeadCheckpointID != original.HeadCheckpointID || len(moved.Messages) != 2 || moved.Messages[0].Content != "short original question" ||
		moved.Messages[1].MessageID != original.Messages[1].MessageID {
		t.Fatalf("after checkout the snapshot is at %s with %+v, want the original branch", moved.HeadCheckpointID, moved.Messages)
	}

	// A tab that had not applied the move: conflict, nothing changes.
	before := h.snapshotBytes(th)
	e := a.cmd(map[string]any{"type": "thread.checkout", "thread_id": th, "checkpoint_id": cur.HeadCheckpointID, "expected_state_version": cur.StateVersion})
	if e["type"] != "error" || e["error"] != chat.CodeStateVersionConflict || wsNum(e, "current_state_version") != moved.StateVersion {
		t.Fatalf("stale checkout: %v", e)
	}
	// The head itself: acknowledged, no event, no new version.
	same := a.ack(map[string]any{"type": "thread.checkout", "thread_id": th, "checkpoint_id": moved.HeadCheckpointID, "expected_state_version": moved.StateVersion})
	if wsNum(same, "state_version") != moved.StateVersion {
		t.Errorf("checkout of the head answered %v, want v%d unchanged", same, moved.StateVersion)
	}
	if got := h.snapshotBytes(th); got != before {
		t.Errorf("a refused or empty checkout changed the thread:\n%s\n%s", before, got)
	}

	// While a run streams: run_already_active, nothing changes.
	h.model.setPace(50 * time.Millisecond)
	long := wsStr(a.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": moved.StateVersion, "user_message": "What is a write ahead log?"}), "run_id")
	a.untilDeltas(th, long, 1)
	running := h.snapshot(th)
	e = b.cmd(map[string]any{"type": "thread.checkout", "thread_id": th, "checkpoint_id": cur.HeadCheckpointID, "expected_state_version": running.StateVersion})
	if e["type"] != "error" || e["error"] != chat.CodeRunAlreadyActive || e["run_id"] != long {
		t.Fatalf("checkout while %s runs: %v", long, e)
	}
	h.model.setPace(time.Millisecond)
	a.untilEvent(th, chat.EventRunCompleted, long)
	after := h.snapshot(th)
	if after.HeadCheckpointID == cur.HeadCheckpointID {
		t.Error("the refused checkout moved the head")
	}
	// Over HTTP, back to the edited branch.
	var back chat.CheckoutAck
	h.call(http.MethodPost, "/api/threads/"+th+"/head", map[string]any{"checkpoint_id": cur.HeadCheckpointID, "expected_state_version": after.StateVersion}, http.StatusOK, &back)
	if back.HeadCheckpointID != cur.HeadCheckpointID || back.StateVersion != after.StateVersion+1 {
		t.Fatalf("POST /head answered %+v", back)
	}
	if got := h.snapshot(th); got.HeadCheckpointID != cur.HeadCheckpointID || got.Messages[0].Content != "short edited question" {
		t.Fatalf("after POST /head the snapshot is at %s with %+v", got.HeadCheckpointID, got.Messages)
	}
}

// TestWSThreadDelete: a tab deletes a conversation whose reply streams;
// every tab on it gets the run's run.cancelled, then thread.deleted, and
// nothing after it; the thread is then not_found everywhere (snapshot,
// subscribe, a second delete) and gone from the list. Over HTTP, DELETE
// deletes another conversation and its event stream ends with
// thread.deleted. A stale version is a conflict that deletes nothing.
func TestWSThreadDelete(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 50*time.Millisecond)
	th, run, a, b := h.twoTabsMidRun(t, "What is a write ahead log?", 1)
	cur := h.snapshot(th)

	e := b.cmd(map[string]any{"type": "thread.delete", "thread_id": th, "expected_state_version": cur.StateVersion - 1})
	if e["type"] != "error" || e["error"] != chat.CodeStateVersionConflict {
		t.Fatalf("delete at a stale version: %v", e)
	}
	ack := b.ack(map[string]any{"type": "thread.delete", "thread_id": th, "expected_state_version": cur.StateVersion})
	if ack["thread_id"] != th {
		t.Fatalf("delete ack %v", ack)
	}
	for _, c := range []*wsClient{a, b} {
		cancelled := c.untilEvent(th, chat.EventRunCancelled, run)
		deleted := c.untilEvent(th, chat.EventThreadDeleted, "")
		if wsNum(deleted, "seq") <= wsNum(cancelled, "seq") || deleted["run_id"] != nil {
			t.Errorf("%s: thread.deleted %v after run.cancelled %v", c.name, deleted, cancelled)
		}
	}
	if r := h.run(run); r.Status != chat.RunCancelled || r.CancelReason == nil || *r.CancelReason != chat.ReasonThreadDeleted {
		t.Fatalf("the run after the delete: %+v", r)
	}
	h.wantError(t, h.do(http.MethodGet, "/api/threads/"+th, nil), http.StatusNotFound, chat.CodeNotFound)
	c := h.dial(t)
	if e := c.cmd(map[string]any{"type": "subscribe", "thread_id": th, "after_seq": 0}); e["error"] != chat.CodeNotFound {
		t.Fatalf("subscribe to the deleted thread: %v", e)
	}
	if e := a.cmd(map[string]any{"type": "thread.delete", "thread_id": th}); e["error"] != chat.CodeNotFound {
		t.Fatalf("second delete: %v", e)
	}
	// Nothing reached the tabs after thread.deleted: a hello's ack is the
	// next frame either reads.
	for _, c := range []*wsClient{a, b} {
		c.ack(map[string]any{"type": "hello", "tab_id": "after-the-delete"})
	}

	// Over HTTP, with an event stream open on it.
	other := h.createThread("")
	h.runToEnd(other.ThreadID, other.StateVersion, "short: hello")
	stream := h.openSSE(other.ThreadID, "after_seq=0", "")
	defer stream.close()
	stream.catchUp(h.snapshot(other.ThreadID).LastSeq)
	var del chat.ThreadDeletedAck
	h.call(http.MethodDelete, "/api/threads/"+other.ThreadID, nil, http.StatusOK, &del)
	if del.ThreadID != other.ThreadID {
		t.Fatalf("DELETE answered %+v", del)
	}
	rest, err := stream.rest()
	if len(rest) != 1 || rest[0].Type != chat.EventThreadDeleted {
		t.Fatalf("after the DELETE the stream sent %v and ended with %v, want thread.deleted alone", rest, err)
	}
	var list struct {
		Threads []chat.Thread `json:"threads"`
	}
	h.call(http.MethodGet, "/api/threads", nil, http.StatusOK, &list)
	for _, got := range list.Threads {
		if got.ThreadID == th || got.ThreadID == other.ThreadID {
			t.Errorf("the list still holds deleted %s", got.ThreadID)
		}
	}
}
