package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/honestcancel/gateway/bus"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/engine"
	"github.com/honestcancel/gateway/gateway"
	"github.com/honestcancel/gateway/model"
	"github.com/honestcancel/gateway/model/demo"
	"github.com/honestcancel/gateway/store"
	"github.com/honestcancel/gateway/tools"
)

// ---- harness ----

// pacedModel is the demo model with a pace the test can change between
// runs (a run takes the pace in force when its worker starts streaming).
type pacedModel struct{ pace atomic.Int64 }

func (m *pacedModel) setPace(d time.Duration) { m.pace.Store(int64(d)) }

func (m *pacedModel) Stream(ctx context.Context, req model.Request) (model.Stream, error) {
	return demo.New(time.Duration(m.pace.Load())).Stream(ctx, req)
}

// harness is the whole stack as main.go wires it, on a fresh SQLite file,
// served by an httptest server.
type harness struct {
	t     *testing.T
	srv   *httptest.Server
	st    *store.Store
	eng   *engine.Engine
	model *pacedModel
	feed  *bus.Memory
	api   *gateway.Server // to shut the WebSocket endpoint down mid-test
	mux   *http.ServeMux  // the routes, to serve behind a test proxy
}

type options struct {
	workers   int
	keepAlive time.Duration
	ws        gateway.WSConfig
	tools     *tools.Registry
	toolsOn   func(st *store.Store) *tools.Registry
	metrics   gateway.Metrics
	auth      func(*store.Store) gateway.Authenticator
	spy       *feedSpy
}

type option func(*options)

// feedSpy is the harness's feed with a record of the sinks the gateway
// adds to it, so a test can play the part of a bus that lost events.
type feedSpy struct {
	gateway.Feed
	mu    sync.Mutex
	sinks map[string][]chat.EventSink
	// onAdd, when set (before the harness serves), runs after each Add, in
	// the subscribing goroutine.
	onAdd func(threadID string, sink chat.EventSink)
}

func (f *feedSpy) Add(threadID string, sink chat.EventSink) {
	f.mu.Lock()
	if f.sinks == nil {
		f.sinks = map[string][]chat.EventSink{}
	}
	f.sinks[threadID] = append(f.sinks[threadID], sink)
	f.mu.Unlock()
	f.Feed.Add(threadID, sink)
	if f.onAdd != nil {
		f.onAdd(threadID, sink)
	}
}

func (f *feedSpy) added(threadID string) []chat.EventSink {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.sinks[threadID])
}

// withFeedSpy records in spy the sinks the gateway subscribes.
func withFeedSpy(spy *feedSpy) option { return func(o *options) { o.spy = spy } }

// withWorkers bounds the runs the engine executes at once.
func withWorkers(n int) option { return func(o *options) { o.workers = n } }

// withWS sets the WebSocket endpoint's configuration.
func withWS(cfg gateway.WSConfig) option { return func(o *options) { o.ws = cfg } }

// withKeepAlive sets the SSE keep-alive interval.
func withKeepAlive(d time.Duration) option { return func(o *options) { o.keepAlive = d } }

// withToolsOn gives the engine the registry mk builds on the harness's
// store (a tool that keeps tables in the gateway's database).
func withToolsOn(mk func(st *store.Store) *tools.Registry) option {
	return func(o *options) { o.toolsOn = mk }
}

// withMetrics records the gateway's measurements in m.
func withMetrics(m gateway.Metrics) option { return func(o *options) { o.metrics = m } }

// withAuth authenticates callers with what mk builds on the harness's store
// (default: everyone is the local user).
func withAuth(mk func(*store.Store) gateway.Authenticator) option {
	return func(o *options) { o.auth = mk }
}

// newHarness starts the stack. At the end of the test it closes the server,
// then the engine, then audits the database (every invariant of the
// protocol must hold) and closes the store.
func newHarness(t *testing.T, pace time.Duration, opts ...option) *harness {
	t.Helper()
	var o options
	for _, f := range opts {
		f(&o)
	}
	ctx := context.Background()
	feed := bus.NewMemory()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "gateway.db"), store.Options{OnCommit: feed.Publish, Exclusive: true})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	if o.toolsOn != nil {
		o.tools = o.toolsOn(st)
	}
	m := &pacedModel{}
	m.setPace(pace)
	eng := engine.New(engine.Config{Store: st, Retention: st.Retention(), Model: m, Tools: o.tools, SingleInstance: true, Workers: o.workers})
	if err := eng.Start(ctx); err != nil {
		st.Close()
		t.Fatalf("start engine: %v", err)
	}
	var authn gateway.Authenticator
	if o.auth != nil {
		authn = o.auth(st)
	}
	var gf gateway.Feed = feed
	if o.spy != nil {
		o.spy.Feed = feed
		gf = o.spy
	}
	api := gateway.New(gateway.Config{
		Auth: authn, Store: st, Runs: eng,
		Feed:      gf,
		KeepAlive: o.keepAlive,
		WS:        o.ws,
		Metrics:   o.metrics,
	})
	mux := http.NewServeMux()
	api.Routes(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		closing, cancel := context.WithTimeout(ctx, 5*time.Second)
		api.CloseWebSockets(closing)
		cancel()
		srv.CloseClientConnections()
		srv.Close()
		eng.Close()
		vs, err := st.Check(ctx)
		if err != nil {
			t.Errorf("check: %v", err)
		}
		for _, v := range vs {
			t.Errorf("check: %v", v)
		}
		if err := st.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	return &harness{t: t, srv: srv, st: st, eng: eng, model: m, feed: feed, api: api, mux: mux}
}

// with returns the harness reporting to t (a subtest).
func (h *harness) with(t *testing.T) *harness {
	c := *h
	c.t = t
	return &c
}

// reply is one HTTP answer.
type reply struct {
	method, path string
	status       int
	header       http.Header
	body         []byte
}

func (r reply) String() string {
	return fmt.Sprintf("%s %s -> %d %s", r.method, r.path, r.status, r.body)
}

// do sends one request. body: nil (none), string or []byte (sent as is), or
// a value to encode as JSON. hdr is name, value pairs.
func (h *harness) do(method, path string, body any, hdr ...string) reply {
	h.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			h.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, h.srv.URL+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	r := reply{method: method, path: path, status: resp.StatusCode, header: resp.Header, body: out}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		h.t.Errorf("%v: Content-Type %q, want application/json", r, ct)
	}
	if !json.Valid(out) {
		h.t.Errorf("%v: body is not JSON", r)
	}
	return r
}

// call sends a request, requires status want and decodes the answer into out
// (when not nil).
func (h *harness) call(method, path string, body any, want int, out any) reply {
	h.t.Helper()
	r := h.do(method, path, body)
	if r.status != want {
		h.t.Fatalf("%v: want status %d", r, want)
	}
	if out != nil {
		if err := json.Unmarshal(r.body, out); err != nil {
			h.t.Fatalf("%v: decode: %v", r, err)
		}
	}
	return r
}

// wantError checks an error answer: status, code, a non-empty message, and
// the protocol's one error shape: "type":"error", and no "re" over HTTP. It
// returns the decoded body.
func (h *harness) wantError(t *testing.T, r reply, status int, code string) map[string]any {
	t.Helper()
	var body map[string]any
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Fatalf("%v: error body is not a JSON object: %v", r, err)
	}
	if r.status != status || body["error"] != code {
		t.Errorf("%v: want %d %s", r, status, code)
	}
	if msg, _ := body["message"].(string); msg == "" {
		t.Errorf("%v: error without a message", r)
	}
	if body["type"] != "error" {
		t.Errorf("%v: HTTP error without \"type\":\"error\"", r)
	}
	if _, ok := body["re"]; ok {
		t.Errorf("%v: HTTP error carries \"re\"", r)
	}
	return body
}

func (h *harness) createThread(title string) chat.Snapshot {
	h.t.Helper()
	var body any = map[string]any{}
	if title != "" {
		body = map[string]any{"title": title}
	}
	var snap chat.Snapshot
	h.call(http.MethodPost, "/api/threads", body, http.StatusCreated, &snap)
	return snap
}

// getJSON is the answer to GET path, which must be 200, decoded as a T.
func getJSON[T any](h *harness, path string) T {
	h.t.Helper()
	var v T
	h.call(http.MethodGet, path, nil, http.StatusOK, &v)
	return v
}

func (h *harness) snapshot(threadID string) chat.Snapshot {
	h.t.Helper()
	return getJSON[chat.Snapshot](h, "/api/threads/"+threadID)
}

// snapshotBytes is the raw snapshot, to compare states byte for byte.
func (h *harness) snapshotBytes(threadID string) string {
	h.t.Helper()
	return string(h.call(http.MethodGet, "/api/threads/"+threadID, nil, http.StatusOK, nil).body)
}

// requireUnchanged fails when the thread moved from snap.
func (h *harness) requireUnchanged(snap chat.Snapshot) {
	h.t.Helper()
	now := h.snapshot(snap.ThreadID)
	if now.StateVersion != snap.StateVersion || now.LastSeq != snap.LastSeq || now.HeadCheckpointID != snap.HeadCheckpointID ||
		len(now.Messages) != len(snap.Messages) {
		h.t.Errorf("thread %s changed: v%d seq %d head %s -> v%d seq %d head %s", snap.ThreadID,
			snap.StateVersion, snap.LastSeq, snap.HeadCheckpointID, now.StateVersion, now.LastSeq, now.HeadCheckpointID)
	}
}

// runUntilDeltas creates a thread, opens its event stream from seq 0,
// starts a run on it with userMessage and returns once the stream has
// delivered n of the run's deltas, with those deltas.
func (h *harness) runUntilDeltas(userMessage string, n int) (chat.Snapshot, *sseStream, chat.RunStartAck, []*wireEvent) {
	h.t.Helper()
	snap := h.createThread("")
	s := h.openSSE(snap.ThreadID, "after_seq=0", "")
	ack := h.startRun(snap.ThreadID, snap.StateVersion, userMessage)
	return snap, s, ack, s.waitDeltas(ack.RunID, n)
}

func (h *harness) startRun(threadID string, expected int64, userMessage string) chat.RunStartAck {
	h.t.Helper()
	body := map[string]any{"expected_state_version": expected}
	if userMessage != "" {
		body["user_message"] = userMessage
	}
	var ack chat.RunStartAck
	h.call(http.MethodPost, "/api/threads/"+threadID+"/runs", body, http.StatusCreated, &ack)
	if !strings.HasPrefix(ack.RunID, chat.PrefixRun) || ack.Status != chat.RunQueued || ack.StateVersion <= expected {
		h.t.Fatalf("run.start ack %+v (expected version %d)", ack, expected)
	}
	return ack
}

func (h *harness) cancel(runID string, body any, hdr ...string) chat.CancelAck {
	h.t.Helper()
	r := h.do(http.MethodPost, "/api/runs/"+runID+"/cancel", body, hdr...)
	if r.status != http.StatusAccepted {
		h.t.Fatalf("%v: want 202", r)
	}
	var ack chat.CancelAck
	if err := json.Unmarshal(r.body, &ack); err != nil {
		h.t.Fatal(err)
	}
	return ack
}

func (h *harness) run(runID string) chat.Run {
	h.t.Helper()
	return getJSON[chat.Run](h, "/api/runs/"+runID)
}

// runUnwatched is runToEnd without a stream: it polls the run (bounded)
// until it completes and takes the message from the snapshot. For tests
// whose queue bound is so small that a live stream of a run (WebSocket or
// SSE) may fall behind it and be ended as too slow, the bound doing its job.
func (h *harness) runUnwatched(threadID string, expected int64, userMessage string) (chat.RunStartAck, chat.Message) {
	h.t.Helper()
	ack := h.startRun(threadID, expected, userMessage)
	if run := h.pollRun(ack.RunID); run.Status != chat.RunCompleted {
		h.t.Fatalf("run %s is %s, want completed", ack.RunID, run.Status)
	}
	msgs := h.snapshot(threadID).Messages
	for i := len(msgs) - 1; i >= 0; i-- {
		if m := msgs[i]; m.RunID != nil && *m.RunID == ack.RunID && m.Role == chat.RoleAssistant {
			return ack, m
		}
	}
	h.t.Fatalf("run %s completed without publishing", ack.RunID)
	return ack, chat.Message{}
}

// pollRun polls the run (bounded) until it ends and returns it.
func (h *harness) pollRun(runID string) chat.Run {
	h.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	run := h.run(runID)
	for !run.Status.Terminal() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
		run = h.run(runID)
	}
	return run
}

type checkpointList struct {
	HeadCheckpointID string            `json:"head_checkpoint_id"`
	Checkpoints      []chat.Checkpoint `json:"checkpoints"`
}

func (h *harness) checkpoints(threadID string) checkpointList {
	h.t.Helper()
	return getJSON[checkpointList](h, "/api/threads/"+threadID+"/checkpoints")
}

type threadPage struct {
	Threads    []chat.Thread `json:"threads"`
	NextCursor *string       `json:"next_cursor"`
}

// runToEnd starts a run and waits for its run.completed on a fresh stream;
// it returns the published assistant message.
func (h *harness) runToEnd(threadID string, expected int64, userMessage string) (chat.RunStartAck, chat.Message) {
	h.t.Helper()
	before := h.snapshot(threadID)
	s := h.openSSE(threadID, "after_seq="+strconv.FormatInt(before.LastSeq, 10), "")
	ack := h.startRun(threadID, expected, userMessage)
	var msg *chat.Message
	s.waitFor("run.completed "+ack.RunID, func(e *wireEvent) bool {
		if e.Type == chat.EventMessagePublished && e.RunID == ack.RunID {
			msg = e.Message
		}
		if e.Type == chat.EventRunFailed && e.RunID == ack.RunID {
			h.t.Fatalf("run failed: %s", e.Data)
		}
		return e.Type == chat.EventRunCompleted && e.RunID == ack.RunID
	})
	s.close()
	if msg == nil {
		h.t.Fatalf("run %s completed without publishing", ack.RunID)
	}
	return ack, *msg
}

func rawFields(t *testing.T, b []byte) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("not a JSON object: %v: %s", err, b)
	}
	return m
}

func messageIDs(ms []chat.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.MessageID
	}
	return out
}

// ---- tests ----

// TestThreadsCreateListGet: creation answers a snapshot at version 1 with a
// head; the list is newest first and pages without loss or duplicates.
func TestThreadsCreateListGet(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)

	r := h.call(http.MethodPost, "/api/threads", nil, http.StatusCreated, nil) // no body at all
	raw := rawFields(t, r.body)
	for _, k := range []string{"thread_id", "title", "state_version", "head_checkpoint_id", "last_seq", "messages", "active_run"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("snapshot lacks %q: %s", k, r.body)
		}
	}
	if string(raw["messages"]) != "[]" || string(raw["active_run"]) != "null" {
		t.Errorf("new thread: messages %s active_run %s, want [] and null", raw["messages"], raw["active_run"])
	}
	var first chat.Snapshot
	json.Unmarshal(r.body, &first)
	if !strings.HasPrefix(first.ThreadID, chat.PrefixThread) || first.StateVersion != 1 || first.LastSeq != 1 ||
		!strings.HasPrefix(first.HeadCheckpointID, chat.PrefixCheckpoint) || first.Title == "" {
		t.Errorf("new thread snapshot %s", r.body)
	}
	if got := h.snapshotBytes(first.ThreadID); got != string(r.body) {
		t.Errorf("GET thread = %s, create answered %s", got, r.body)
	}
	titled := h.createThread("Trip to Lisbon")
	if titled.Title != "Trip to Lisbon" || titled.StateVersion != 1 {
		t.Errorf("titled thread: %+v", titled)
	}
	cps := h.checkpoints(first.ThreadID)
	if len(cps.Checkpoints) != 1 || cps.HeadCheckpointID != first.HeadCheckpointID ||
		cps.Checkpoints[0].StateVersion != 1 || cps.Checkpoints[0].ParentCheckpointID != nil || len(cps.Checkpoints[0].MessageIDs) != 0 {
		t.Errorf("checkpoints of a new thread: %+v", cps)
	}

	ids := []string{first.ThreadID, titled.ThreadID}
	for i := range 3 {
		ids = append(ids, h.createThread(fmt.Sprintf("thread %d", i)).ThreadID)
	}
	// Updating the oldest thread moves it to the front.
	h.runToEnd(first.ThreadID, 1, "short hello")

	var all threadPage
	h.call(http.MethodGet, "/api/threads", nil, http.StatusOK, &all)
	if len(all.Threads) != 5 || all.NextCursor != nil {
		t.Fatalf("list: %d threads, next %v", len(all.Threads), all.NextCursor)
	}
	if all.Threads[0].ThreadID != first.ThreadID || all.Threads[0].StateVersion <= 1 {
		t.Errorf("most recently updated thread is not first: %+v", all.Threads[0])
	}
	for i := 1; i < len(all.Threads); i++ {
		a, b := all.Threads[i-1], all.Threads[i]
		if a.UpdatedAt.Before(b.UpdatedAt) || (a.UpdatedAt.Equal(b.UpdatedAt) && a.ThreadID < b.ThreadID) {
			t.Errorf("list not newest first at %d: %v %s then %v %s", i, a.UpdatedAt, a.ThreadID, b.UpdatedAt, b.ThreadID)
		}
	}
	var paged []string
	path := "/api/threads?limit=2"
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("paging does not end")
		}
		var p threadPage
		h.call(http.MethodGet, path, nil, http.StatusOK, &p)
		if len(p.Threads) > 2 {
			t.Fatalf("limit=2 gave %d threads", len(p.Threads))
		}
		for _, th := range p.Threads {
			paged = append(paged, th.ThreadID)
		}
		if p.NextCursor == nil {
			break
		}
		path = "/api/threads?limit=2&cursor=" + *p.NextCursor
	}
	var want []string
	for _, th := range all.Threads {
		want = append(want, th.ThreadID)
	}
	if !slices.Equal(paged, want) {
		t.Errorf("paged %v, want %v", paged, want)
	}
	slices.Sort(ids)
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Errorf("listed %v, created %v", want, ids)
	}

	for _, q := range []string{"limit=0", "limit=201", "limit=-1", "limit=abc", "limit=1.5", "cursor=not-a-cursor", "cursor=" + first.ThreadID, "q=two%0Alines", "q=%FF"} {
		h.wantError(t, h.do(http.MethodGet, "/api/threads?"+q, nil), http.StatusBadRequest, chat.CodeInvalidRequest)
	}
	var p threadPage
	h.call(http.MethodGet, "/api/threads?limit=200", nil, http.StatusOK, &p)
	if len(p.Threads) != 5 {
		t.Errorf("limit=200: %d threads", len(p.Threads))
	}
}

// TestRunHappyPath: a run streams deltas whose concatenation is the
// published message, with seqs and versions moving by one; the run, the
// checkpoints and the operations read back consistently.
func TestRunHappyPath(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("happy")
	s := h.openSSE(snap.ThreadID, "after_seq=0", "")
	r := h.call(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs",
		map[string]any{"expected_state_version": 1, "user_message": "How do B-trees keep lookups fast?"}, http.StatusCreated, nil)
	raw := rawFields(t, r.body)
	if len(raw) != 3 || raw["run_id"] == nil || raw["status"] == nil || raw["state_version"] == nil {
		t.Errorf("run.start answer %s, want exactly run_id, status, state_version", r.body)
	}
	var ack chat.RunStartAck
	json.Unmarshal(r.body, &ack)

	s.waitType(chat.EventRunCompleted, ack.RunID)
	all := s.events
	var types []string
	var user, assistant *chat.Message
	var deltas []*wireEvent
	for _, e := range all {
		if e.Type != chat.EventMessageDelta {
			types = append(types, e.Type)
		} else {
			deltas = append(deltas, e)
		}
		if e.Type == chat.EventMessagePublished {
			if e.Message.Role == chat.RoleUser {
				user = e.Message
			} else {
				assistant = e.Message
			}
		}
	}
	wantTypes := []string{
		chat.EventCheckpointCreated, // thread created
		chat.EventMessagePublished, chat.EventCheckpointCreated, chat.EventRunStarted,
		chat.EventMessagePublished, chat.EventCheckpointCreated, chat.EventRunCompleted,
	}
	if !slices.Equal(types, wantTypes) {
		t.Fatalf("durable events %v, want %v", types, wantTypes)
	}
	if len(deltas) == 0 || user == nil || assistant == nil {
		t.Fatalf("deltas %d, user %v, assistant %v", len(deltas), user, assistant)
	}
	if user.Content != "How do B-trees keep lookups fast?" || user.Kind != chat.KindText || user.RunID != nil {
		t.Errorf("user message %+v", user)
	}
	if assistant.Role != chat.RoleAssistant || assistant.Kind != chat.KindText || assistant.RunID == nil || *assistant.RunID != ack.RunID {
		t.Errorf("assistant message %+v", assistant)
	}
	var text strings.Builder
	for _, d := range deltas {
		if d.MessageID != assistant.MessageID || d.RunID != ack.RunID {
			t.Errorf("delta %v does not carry the published message id %s", d, assistant.MessageID)
		}
		text.WriteString(d.Text)
	}
	if text.String() != assistant.Content || len(strings.Fields(assistant.Content)) < 80 {
		t.Errorf("published %q, deltas %q", assistant.Content, text.String())
	}
	started := all[3]
	if started.Type != chat.EventRunStarted || started.StateVersion != ack.StateVersion || started.BaseCheckpointID != all[2].CheckpointID {
		t.Errorf("run.started %s; ack %+v", started.Data, ack)
	}

	after := h.snapshot(snap.ThreadID)
	last := all[len(all)-1]
	if after.StateVersion != last.StateVersion || after.LastSeq != last.Seq || after.ActiveRun != nil ||
		!slices.Equal(messageIDs(after.Messages), []string{user.MessageID, assistant.MessageID}) {
		t.Errorf("snapshot after the run: %+v", after)
	}
	if after.Messages[1].Content != assistant.Content {
		t.Errorf("history holds %q, published %q", after.Messages[1].Content, assistant.Content)
	}

	run := h.run(ack.RunID)
	if run.Status != chat.RunCompleted || run.ThreadID != snap.ThreadID || run.FinishedAt == nil || run.Error != nil ||
		run.CancelRequestedAt != nil || run.DiscardedStreamChars != 0 || run.Attempt != 1 || run.BaseCheckpointID != started.BaseCheckpointID {
		t.Errorf("run %+v", run)
	}

	cps := h.checkpoints(snap.ThreadID)
	if n := len(cps.Checkpoints); n != 3 || cps.HeadCheckpointID != cps.Checkpoints[n-1].CheckpointID || cps.HeadCheckpointID != after.HeadCheckpointID {
		t.Fatalf("checkpoints %+v", cps)
	}
	for i, cp := range cps.Checkpoints {
		if cp.ThreadID != snap.ThreadID {
			t.Errorf("checkpoint %s of thread %s", cp.CheckpointID, cp.ThreadID)
		}
		if i > 0 && (cp.ParentCheckpointID == nil || *cp.ParentCheckpointID != cps.Checkpoints[i-1].CheckpointID ||
			cp.StateVersion <= cps.Checkpoints[i-1].StateVersion) {
			t.Errorf("checkpoint %d not after %d: %+v", i, i-1, cp)
		}
	}
	mid, head := cps.Checkpoints[1], cps.Checkpoints[2]
	if mid.Pending == nil || mid.Pending.Step != chat.StepGenerate || !slices.Equal(mid.MessageIDs, []string{user.MessageID}) {
		t.Errorf("user checkpoint %+v", mid)
	}
	if head.Pending != nil || !slices.Equal(head.MessageIDs, []string{user.MessageID, assistant.MessageID}) ||
		!slices.Equal(head.CompletedSteps, []string{chat.StepGenerate}) {
		t.Errorf("head checkpoint %+v", head)
	}

	// Every object carries the protocol's fields (extra ones are allowed).
	requireKeys := func(what string, raw []byte, keys ...string) {
		t.Helper()
		m := rawFields(t, raw)
		for _, k := range keys {
			if _, ok := m[k]; !ok {
				t.Errorf("%s lacks %q: %s", what, k, raw)
			}
		}
	}
	requireKeys("run", h.call(http.MethodGet, "/api/runs/"+ack.RunID, nil, http.StatusOK, nil).body,
		"run_id", "thread_id", "status", "base_checkpoint_id", "resume_checkpoint_id", "cancel_requested_at", "cancel_reason",
		"requested_by", "discarded_stream_chars", "error", "attempt", "created_at", "finished_at")
	var rawCPs struct {
		Checkpoints []json.RawMessage `json:"checkpoints"`
	}
	json.Unmarshal(h.call(http.MethodGet, "/api/threads/"+snap.ThreadID+"/checkpoints", nil, http.StatusOK, nil).body, &rawCPs)
	for _, cp := range rawCPs.Checkpoints {
		requireKeys("checkpoint", cp, "checkpoint_id", "thread_id", "parent_checkpoint_id", "state_version", "message_ids",
			"completed_steps", "tool_results", "pending", "created_at")
	}
	var rawSnap struct {
		Messages []json.RawMessage `json:"messages"`
	}
	json.Unmarshal([]byte(h.snapshotBytes(snap.ThreadID)), &rawSnap)
	for _, m := range rawSnap.Messages {
		requireKeys("message", m, "message_id", "thread_id", "role", "kind", "content", "state_version", "checkpoint_id",
			"run_id", "fragment_of", "created_at")
	}
	var rawList struct {
		Threads []json.RawMessage `json:"threads"`
	}
	json.Unmarshal(h.call(http.MethodGet, "/api/threads", nil, http.StatusOK, nil).body, &rawList)
	for _, th := range rawList.Threads {
		requireKeys("thread", th, "thread_id", "title", "state_version", "head_checkpoint_id", "last_seq", "created_at", "updated_at")
	}

	r = h.call(http.MethodGet, "/api/threads/"+snap.ThreadID+"/operations", nil, http.StatusOK, nil)
	if strings.TrimSpace(string(r.body)) != `{"operations":[]}` {
		t.Errorf("operations %s", r.body)
	}
}

// TestCancelMidStream: a cancel is accepted at once with the resume point;
// the run ends cancelled, nothing of it is published, and a second cancel
// changes nothing.
func TestCancelMidStream(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 50*time.Millisecond)
	snap, s, ack, deltas := h.runUntilDeltas("Explain the CAP theorem with examples", 3)
	before := h.snapshot(snap.ThreadID)
	if before.ActiveRun == nil || before.ActiveRun.RunID != ack.RunID {
		t.Fatalf("no active run in %+v", before)
	}

	r := h.do(http.MethodPost, "/api/runs/"+ack.RunID+"/cancel", map[string]any{"expected_state_version": 1}, "X-Client-Name", "api-test")
	if r.status != http.StatusAccepted {
		t.Fatalf("%v: want 202", r)
	}
	raw := rawFields(t, r.body)
	for _, k := range []string{"run_id", "status", "accepted_state_version", "resume_checkpoint_id", "published_message_id", "already_requested"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("cancel ack lacks %q: %s", k, r.body)
		}
	}
	var cack chat.CancelAck
	json.Unmarshal(r.body, &cack)
	userMsg := before.Messages[0].MessageID
	if cack.RunID != ack.RunID || cack.Status != chat.RunCancelRequested || cack.AlreadyRequested ||
		cack.AcceptedStateVersion != before.StateVersion+1 || cack.ResumeCheckpointID != before.HeadCheckpointID ||
		cack.PublishedMessageID == nil || *cack.PublishedMessageID != userMsg {
		t.Errorf("cancel ack %+v; thread before %+v", cack, before)
	}

	req := s.waitType(chat.EventRunCancelRequested, ack.RunID)
	if req.StateVersion != cack.AcceptedStateVersion || req.Reason != chat.ReasonUserRequested || req.RequestedBy != "api:api-test" {
		t.Errorf("run.cancel_requested %s", req.Data)
	}
	done := s.waitType(chat.EventRunCancelled, ack.RunID)
	all := s.events
	for _, e := range all {
		if e.RunID == ack.RunID && e.Type == chat.EventMessagePublished {
			t.Errorf("cancelled run published %v", e)
		}
	}
	streamed := runeCount(filter(all, func(e *wireEvent) bool { return e.Type == chat.EventMessageDelta }))
	if done.DiscardedStreamChars < streamed || done.DiscardedStreamChars <= 0 || streamed < runeCount(deltas) {
		t.Errorf("discarded_stream_chars %d, streamed %d", done.DiscardedStreamChars, streamed)
	}
	if done.ResumePolicy != chat.ResumePolicyRegenerate || done.ResumeCheckpointID != cack.ResumeCheckpointID ||
		done.PublishedMessageID == nil || *done.PublishedMessageID != userMsg || len(done.Operations) != 0 ||
		!strings.Contains(string(done.Data), `"operations":[]`) {
		t.Errorf("run.cancelled %s", done.Data)
	}

	after := h.snapshot(snap.ThreadID)
	if after.ActiveRun != nil || !slices.Equal(messageIDs(after.Messages), []string{userMsg}) ||
		after.HeadCheckpointID != cack.ResumeCheckpointID || after.StateVersion != done.StateVersion {
		t.Errorf("snapshot after cancel %+v", after)
	}
	run := h.run(ack.RunID)
	if run.Status != chat.RunCancelled || run.CancelRequestedAt == nil || run.CancelReason == nil || *run.CancelReason != chat.ReasonUserRequested ||
		run.RequestedBy == nil || *run.RequestedBy != "api:api-test" || run.DiscardedStreamChars != done.DiscardedStreamChars ||
		run.ResumeCheckpointID == nil || *run.ResumeCheckpointID != cack.ResumeCheckpointID || run.FinishedAt == nil {
		t.Errorf("cancelled run %+v", run)
	}
	cps := h.checkpoints(snap.ThreadID)
	head := cps.Checkpoints[len(cps.Checkpoints)-1]
	if len(cps.Checkpoints) != 2 || head.Pending == nil || head.Pending.Step != chat.StepGenerate {
		t.Errorf("a cancel must create no checkpoint and keep the pending step: %+v", cps)
	}

	// A second cancel: already_requested, no event, no version bump.
	again := h.cancel(ack.RunID, nil)
	if !again.AlreadyRequested || again.RunID != ack.RunID || again.Status != chat.RunCancelled ||
		again.AcceptedStateVersion != cack.AcceptedStateVersion || again.ResumeCheckpointID != cack.ResumeCheckpointID {
		t.Errorf("second cancel %+v", again)
	}
	h.requireUnchanged(after)

	// The continue run's events follow run.cancelled directly: nothing of
	// the cancelled run came in between (the stream's observer fails any
	// event of a run after its run.cancelled).
	next := h.startRun(snap.ThreadID, after.StateVersion, "")
	if e := s.next(); e.Seq != done.Seq+1 || e.RunID != next.RunID {
		t.Errorf("after run.cancelled came %v", e)
	}
	h.cancel(next.RunID, map[string]any{"reason": "changed my mind"})
	if e := s.waitType(chat.EventRunCancelRequested, next.RunID); e.Reason != "changed my mind" || e.RequestedBy != "api:http" {
		t.Errorf("cancel_requested %s", e.Data)
	}
	s.waitType(chat.EventRunCancelled, next.RunID)

	// Cancelling a completed run is refused with its status.
	h.model.setPace(time.Millisecond)
	cur := h.snapshot(snap.ThreadID)
	okRun, _ := h.runToEnd(snap.ThreadID, cur.StateVersion, "short question")
	cur = h.snapshot(snap.ThreadID)
	body := h.wantError(t, h.do(http.MethodPost, "/api/runs/"+okRun.RunID+"/cancel", nil), http.StatusConflict, chat.CodeRunNotActive)
	if body["run_id"] != okRun.RunID || body["status"] != string(chat.RunCompleted) {
		t.Errorf("run_not_active body %v", body)
	}
	h.requireUnchanged(cur)
}

// TestConcurrentCancels: of several cancels at once exactly one is
// accepted; the others answer already_requested with the same version.
func TestConcurrentCancels(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 50*time.Millisecond)
	_, s, ack, _ := h.runUntilDeltas("Compare Raft and Paxos", 1)
	const n = 6
	acks := make([]chat.CancelAck, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { acks[i] = h.cancel(ack.RunID, nil) })
	}
	wg.Wait()
	fresh := 0
	for _, a := range acks {
		if !a.AlreadyRequested {
			fresh++
		}
		if a.AcceptedStateVersion != acks[0].AcceptedStateVersion || a.ResumeCheckpointID != acks[0].ResumeCheckpointID {
			t.Errorf("cancel acks disagree: %+v vs %+v", a, acks[0])
		}
	}
	if fresh != 1 {
		t.Errorf("%d cancels accepted as new, want 1: %+v", fresh, acks)
	}
	s.waitType(chat.EventRunCancelled, ack.RunID)
	n1 := len(filter(s.events, func(e *wireEvent) bool { return e.Type == chat.EventRunCancelRequested }))
	if n1 != 1 {
		t.Errorf("%d run.cancel_requested events, want 1", n1)
	}
}

// TestContinueFromSavedPoint: after a cancel, run.start without a message
// re-runs the pending step with a resume note; stale versions, a second
// active run and retried client_request_ids are answered honestly.
func TestContinueFromSavedPoint(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 50*time.Millisecond)
	const question = "What is a write ahead log?"
	snap, s, ack, _ := h.runUntilDeltas(question, 2)

	// While it runs: a second run.start is refused with the active run.
	cur := h.snapshot(snap.ThreadID)
	body := h.wantError(t, h.do(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs",
		map[string]any{"expected_state_version": cur.StateVersion, "user_message": "another"}), http.StatusConflict, chat.CodeRunAlreadyActive)
	if body["run_id"] != ack.RunID {
		t.Errorf("run_already_active names %v, want %s", body["run_id"], ack.RunID)
	}
	h.wantError(t, h.do(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs",
		map[string]any{"expected_state_version": cur.StateVersion}), http.StatusConflict, chat.CodeRunAlreadyActive)
	h.requireUnchanged(cur)

	staleVersion := cur.StateVersion
	cack := h.cancel(ack.RunID, nil)
	cancelled := s.waitType(chat.EventRunCancelled, ack.RunID)
	h.model.setPace(time.Millisecond)
	cur = h.snapshot(snap.ThreadID)
	if cur.StateVersion != cancelled.StateVersion {
		t.Fatalf("version %d after run.cancelled v%d", cur.StateVersion, cancelled.StateVersion)
	}

	// A stale continue is refused with what the server can do.
	cps := h.checkpoints(snap.ThreadID)
	var basedOn string
	for _, cp := range cps.Checkpoints {
		if cp.StateVersion <= staleVersion {
			basedOn = cp.CheckpointID
		}
	}
	body = h.wantError(t, h.do(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs",
		map[string]any{"expected_state_version": staleVersion}), http.StatusConflict, chat.CodeStateVersionConflict)
	actions, _ := body["allowed_actions"].([]any)
	if body["current_state_version"] != float64(cur.StateVersion) || body["current_checkpoint_id"] != cur.HeadCheckpointID ||
		!slices.Contains(actions, any("reload")) || !slices.Contains(actions, any("fork_from_"+basedOn)) {
		t.Errorf("conflict body %v; want fork_from_%s", body, basedOn)
	}
	h.requireUnchanged(cur)

	// Continue: a new run from the head, retried with the same
	// client_request_id.
	req := map[string]any{"expected_state_version": cur.StateVersion, "client_request_id": "tab-1:continue-1"}
	var cont chat.RunStartAck
	h.call(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs", req, http.StatusCreated, &cont)
	if cont.RunID == ack.RunID || cont.Status != chat.RunQueued || cont.StateVersion != cur.StateVersion+1 {
		t.Errorf("continue ack %+v", cont)
	}
	started := s.waitType(chat.EventRunStarted, cont.RunID)
	if started.BaseCheckpointID != cack.ResumeCheckpointID {
		t.Errorf("continue starts from %s, want the resume checkpoint %s", started.BaseCheckpointID, cack.ResumeCheckpointID)
	}
	s.waitType(chat.EventRunCompleted, cont.RunID)
	after := h.snapshot(snap.ThreadID)
	if len(after.Messages) != 2 || after.Messages[0].Content != question || after.Messages[1].Role != chat.RoleAssistant ||
		after.Messages[1].RunID == nil || *after.Messages[1].RunID != cont.RunID {
		t.Fatalf("history after continue: %+v", after.Messages)
	}
	resumed := after.Messages[1].Content
	if !strings.HasPrefix(resumed, "Picking up from the saved point") {
		t.Errorf("continued reply does not acknowledge the stop: %q", resumed)
	}

	var retry chat.RunStartAck
	h.call(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs", req, http.StatusCreated, &retry) // now stale
	if retry.RunID != cont.RunID || retry.StateVersion != cont.StateVersion {
		t.Errorf("retry answered %+v, first answer %+v", retry, cont)
	}
	h.requireUnchanged(after)
	// A new client_request_id with the stale version is a conflict.
	req["client_request_id"] = "tab-1:continue-2"
	h.wantError(t, h.do(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs", req), http.StatusConflict, chat.CodeStateVersionConflict)
	// Continuing a checkpoint with nothing pending is invalid.
	h.wantError(t, h.do(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs",
		map[string]any{"expected_state_version": after.StateVersion}), http.StatusBadRequest, chat.CodeInvalidRequest)
	h.requireUnchanged(after)

	// The same question without a stop gets a normal reply, which differs.
	other := h.createThread("")
	_, normal := h.runToEnd(other.ThreadID, 1, question)
	if normal.Content == resumed || strings.HasPrefix(normal.Content, "Picking up") {
		t.Errorf("normal reply %q vs continued %q", normal.Content, resumed)
	}
}

// TestConcurrentStarts: of several run.starts on one version exactly one
// wins; the rest are conflicts and change nothing.
func TestConcurrentStarts(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("")
	s := h.openSSE(snap.ThreadID, "after_seq=0", "")
	const n = 5
	replies := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			replies[i] = h.do(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs",
				map[string]any{"expected_state_version": 1, "user_message": fmt.Sprintf("short question %d", i)})
		})
	}
	wg.Wait()
	var winner chat.RunStartAck
	wins := 0
	for _, r := range replies {
		switch r.status {
		case http.StatusCreated:
			wins++
			json.Unmarshal(r.body, &winner)
		default:
			h.wantError(t, r, http.StatusConflict, chat.CodeStateVersionConflict)
		}
	}
	if wins != 1 {
		t.Fatalf("%d run.starts won, want 1", wins)
	}
	s.waitType(chat.EventRunCompleted, winner.RunID)
	if after := h.snapshot(snap.ThreadID); len(after.Messages) != 2 {
		t.Errorf("history %+v", after.Messages)
	}
}

// TestFragments: a saved fragment is exactly the deltas up to last_seq,
// published as kind fragment without a run; deleting it leaves it out of
// history with message.deleted.
// TestStreamedText: GET /api/threads/{id}/streamed/{message_id}?last_seq=N
// answers what fragment.save would keep (the deltas up to N, exactly), or
// its error, and changes nothing.
func TestStreamedText(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 50*time.Millisecond)
	snap, s, ack, deltas := h.runUntilDeltas("Explain vector clocks", 4)
	msgID, upTo := deltas[0].MessageID, deltas[2].Seq
	path := func(threadID, messageID, query string) string {
		return "/api/threads/" + threadID + "/streamed/" + messageID + query
	}
	before := h.snapshot(snap.ThreadID)

	var got chat.StreamedText
	r := h.call(http.MethodGet, path(snap.ThreadID, msgID, fmt.Sprintf("?last_seq=%d", upTo)), nil, http.StatusOK, &got)
	want := s.text(msgID, upTo)
	if want == "" || got.Content != want || got.MessageID != msgID || got.RunID != ack.RunID || got.LastSeq != upTo ||
		got.Chars != int64(len([]rune(want))) || len(rawFields(t, r.body)) != 5 {
		t.Errorf("streamed text %s, want content %q", r.body, want)
	}
	if first := h.call(http.MethodGet, path(snap.ThreadID, msgID, fmt.Sprintf("?last_seq=%d", deltas[0].Seq)), nil, http.StatusOK, &got); got.Content != deltas[0].Text {
		t.Errorf("streamed text up to the first delta: %s, want %q", first.body, deltas[0].Text)
	}

	other := h.createThread("")
	for _, c := range []struct {
		name, path string
		status     int
		code       string
	}{
		{"no last_seq", path(snap.ThreadID, msgID, ""), http.StatusBadRequest, chat.CodeInvalidRequest},
		{"last_seq not a number", path(snap.ThreadID, msgID, "?last_seq=x"), http.StatusBadRequest, chat.CodeInvalidRequest},
		{"last_seq 0", path(snap.ThreadID, msgID, "?last_seq=0"), http.StatusBadRequest, chat.CodeInvalidRequest},
		{"before the message's first delta", path(snap.ThreadID, msgID, fmt.Sprintf("?last_seq=%d", deltas[0].Seq-1)), http.StatusBadRequest, chat.CodeInvalidRequest},
		{"beyond the thread's last event", path(snap.ThreadID, msgID, "?last_seq=99999"), http.StatusBadRequest, chat.CodeInvalidRequest},
		{"a published message", path(snap.ThreadID, before.Messages[0].MessageID, "?last_seq=2"), http.StatusNotFound, chat.CodeNotFound},
		{"an unknown message", path(snap.ThreadID, "msg_00000000000000000000000000", "?last_seq=2"), http.StatusNotFound, chat.CodeNotFound},
		{"a message id of no message", path(snap.ThreadID, "nope", "?last_seq=2"), http.StatusNotFound, chat.CodeNotFound},
		{"another thread", path(other.ThreadID, msgID, fmt.Sprintf("?last_seq=%d", upTo)), http.StatusNotFound, chat.CodeNotFound},
		{"an unknown thread", path("thr_00000000000000000000000000", msgID, fmt.Sprintf("?last_seq=%d", upTo)), http.StatusNotFound, chat.CodeNotFound},
	} {
		if r := h.do(http.MethodGet, c.path, nil); r.status != c.status {
			t.Errorf("%s: %d %s, want %d %s", c.name, r.status, r.body, c.status, c.code)
		} else {
			h.wantError(t, r, c.status, c.code)
		}
	}
	if now := h.snapshot(snap.ThreadID); now.StateVersion != before.StateVersion || len(now.Messages) != len(before.Messages) {
		t.Errorf("asking for streamed text changed the thread: version %d → %d", before.StateVersion, now.StateVersion)
	}
	h.requireUnchanged(other)
	h.cancel(ack.RunID, nil)
	s.waitType(chat.EventRunCancelled, ack.RunID)
}

func TestFragments(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 50*time.Millisecond)
	snap, s, ack, deltas := h.runUntilDeltas("Explain vector clocks", 4)
	msgID, upTo := deltas[0].MessageID, deltas[2].Seq
	version := s.lastVersion
	fragPath := "/api/threads/" + snap.ThreadID + "/fragments"

	// Refusals first; none changes anything.
	cur := h.snapshot(snap.ThreadID)
	h.wantError(t, h.do(http.MethodPost, fragPath, map[string]any{"message_id": msgID, "last_seq": upTo, "expected_state_version": version - 1}),
		http.StatusConflict, chat.CodeStateVersionConflict)
	h.wantError(t, h.do(http.MethodPost, fragPath, map[string]any{"message_id": "msg_00000000000000000000000000", "last_seq": upTo, "expected_state_version": version}),
		http.StatusNotFound, chat.CodeNotFound)
	h.wantError(t, h.do(http.MethodPost, fragPath, map[string]any{"message_id": msgID, "last_seq": deltas[0].Seq - 1, "expected_state_version": version}),
		http.StatusBadRequest, chat.CodeInvalidRequest)
	h.wantError(t, h.do(http.MethodPost, fragPath, map[string]any{"message_id": msgID, "expected_state_version": version}),
		http.StatusBadRequest, chat.CodeInvalidRequest)
	h.wantError(t, h.do(http.MethodPost, fragPath, map[string]any{"last_seq": upTo, "expected_state_version": version}),
		http.StatusBadRequest, chat.CodeInvalidRequest)
	h.wantError(t, h.do(http.MethodPost, fragPath, map[string]any{"message_id": msgID, "last_seq": upTo}),
		http.StatusBadRequest, chat.CodeInvalidRequest)
	h.wantError(t, h.do(http.MethodPost, "/api/threads/thr_00000000000000000000000000/fragments",
		map[string]any{"message_id": msgID, "last_seq": upTo, "expected_state_version": version}), http.StatusNotFound, chat.CodeNotFound)
	other := h.createThread("")
	h.wantError(t, h.do(http.MethodPost, "/api/threads/"+other.ThreadID+"/fragments",
		map[string]any{"message_id": msgID, "last_seq": upTo, "expected_state_version": 1}), http.StatusNotFound, chat.CodeNotFound)
	if now := h.snapshot(snap.ThreadID); now.StateVersion != cur.StateVersion || len(now.Messages) != 1 {
		t.Errorf("a refused fragment.save changed the thread: %+v", now)
	}
	h.requireUnchanged(other)

	r := h.call(http.MethodPost, fragPath, map[string]any{"message_id": msgID, "last_seq": upTo, "expected_state_version": version}, http.StatusCreated, nil)
	var saved chat.FragmentSaved
	json.Unmarshal(r.body, &saved)
	if len(rawFields(t, r.body)) != 3 || !strings.HasPrefix(saved.MessageID, chat.PrefixMessage) || saved.MessageID == msgID ||
		saved.StateVersion != version+2 || !strings.HasPrefix(saved.CheckpointID, chat.PrefixCheckpoint) {
		t.Errorf("fragment.save answer %s (version was %d)", r.body, version)
	}
	pub := s.waitFor("fragment published", func(e *wireEvent) bool {
		return e.Type == chat.EventMessagePublished && e.Message.MessageID == saved.MessageID
	})
	pubEv := pub[len(pub)-1]
	cpEv := s.next()
	if pubEv.RunID != "" || hasField(pubEv.Data, "run_id") || cpEv.Type != chat.EventCheckpointCreated || cpEv.CheckpointID != saved.CheckpointID || cpEv.RunID != "" {
		t.Errorf("fragment events %s / %s", pubEv.Data, cpEv.Data)
	}
	wantText := s.text(msgID, upTo)
	if wantText == "" {
		t.Fatal("no delta text")
	}

	snapRaw := h.snapshotBytes(snap.ThreadID)
	var after chat.Snapshot
	json.Unmarshal([]byte(snapRaw), &after)
	if len(after.Messages) != 2 || after.HeadCheckpointID != saved.CheckpointID || after.ActiveRun == nil || after.ActiveRun.RunID != ack.RunID {
		t.Fatalf("snapshot after fragment.save: %s", snapRaw)
	}
	frag := after.Messages[1]
	if frag.MessageID != saved.MessageID || frag.Kind != chat.KindFragment || frag.Role != chat.RoleAssistant || frag.Content != wantText ||
		frag.RunID != nil || frag.FragmentOf == nil || *frag.FragmentOf != (chat.FragmentOf{RunID: ack.RunID, MessageID: msgID, LastSeq: upTo}) ||
		frag.CheckpointID != saved.CheckpointID || frag.StateVersion != pubEv.StateVersion {
		t.Errorf("fragment %+v, want content %q", frag, wantText)
	}
	var rawSnap struct {
		Messages []map[string]json.RawMessage `json:"messages"`
	}
	json.Unmarshal([]byte(snapRaw), &rawSnap)
	if string(rawSnap.Messages[1]["run_id"]) != "null" {
		t.Errorf("fragment run_id = %s, want null", rawSnap.Messages[1]["run_id"])
	}
	head := h.checkpoints(snap.ThreadID).Checkpoints
	if hc := head[len(head)-1]; hc.Pending == nil || hc.Pending.Step != chat.StepGenerate {
		t.Errorf("the fragment's checkpoint lost the pending step: %+v", hc)
	}

	// A second fragment of the same message, cut elsewhere.
	var saved2 chat.FragmentSaved
	h.call(http.MethodPost, fragPath, map[string]any{"message_id": msgID, "last_seq": deltas[0].Seq, "expected_state_version": saved.StateVersion}, http.StatusCreated, &saved2)
	if got := h.snapshot(snap.ThreadID); len(got.Messages) != 3 || got.Messages[2].Content != deltas[0].Text {
		t.Errorf("second fragment: %+v", got.Messages)
	}

	// Stop the run: the last published message is now the second fragment.
	cack := h.cancel(ack.RunID, nil)
	if cack.PublishedMessageID == nil || *cack.PublishedMessageID != saved2.MessageID || cack.ResumeCheckpointID != saved2.CheckpointID {
		t.Errorf("cancel after fragments: %+v, want published %s at %s", cack, saved2.MessageID, saved2.CheckpointID)
	}
	s.waitType(chat.EventRunCancelled, ack.RunID)
	cur = h.snapshot(snap.ThreadID)
	delPath := func(id string) string { return "/api/threads/" + snap.ThreadID + "/drafts/" + id + "/delete" }
	h.wantError(t, h.do(http.MethodPost, delPath(cur.Messages[0].MessageID), map[string]any{"expected_state_version": cur.StateVersion}),
		http.StatusBadRequest, chat.CodeInvalidRequest)
	h.wantError(t, h.do(http.MethodPost, delPath("msg_00000000000000000000000000"), map[string]any{"expected_state_version": cur.StateVersion}),
		http.StatusNotFound, chat.CodeNotFound)
	h.wantError(t, h.do(http.MethodPost, delPath(msgID), map[string]any{"expected_state_version": cur.StateVersion}),
		http.StatusNotFound, chat.CodeNotFound) // the streamed message was never published
	h.wantError(t, h.do(http.MethodPost, delPath(saved.MessageID), map[string]any{"expected_state_version": cur.StateVersion - 1}),
		http.StatusConflict, chat.CodeStateVersionConflict)
	h.wantError(t, h.do(http.MethodPost, delPath(saved.MessageID), map[string]any{}), http.StatusBadRequest, chat.CodeInvalidRequest)
	h.wantError(t, h.do(http.MethodPost, "/api/threads/"+other.ThreadID+"/drafts/"+saved.MessageID+"/delete",
		map[string]any{"expected_state_version": 1}), http.StatusNotFound, chat.CodeNotFound)
	h.requireUnchanged(cur)
	h.requireUnchanged(other)

	r = h.call(http.MethodPost, delPath(saved.MessageID), map[string]any{"expected_state_version": cur.StateVersion}, http.StatusOK, nil)
	var del chat.DraftDeleted
	json.Unmarshal(r.body, &del)
	if len(rawFields(t, r.body)) != 2 || del.StateVersion <= cur.StateVersion || !strings.HasPrefix(del.CheckpointID, chat.PrefixCheckpoint) {
		t.Errorf("draft.delete answer %s", r.body)
	}
	s.catchUp(cur.LastSeq)
	evs := s.waitSeq(cur.LastSeq + 2)
	if evs[0].Type != chat.EventMessageDeleted || evs[0].MessageID != saved.MessageID || evs[0].CheckpointID != del.CheckpointID || evs[0].RunID != "" ||
		evs[1].Type != chat.EventCheckpointCreated || evs[1].CheckpointID != del.CheckpointID || evs[1].StateVersion != del.StateVersion {
		t.Errorf("draft.delete events %v %v", evs[0], evs[1])
	}
	final := h.snapshot(snap.ThreadID)
	if !slices.Equal(messageIDs(final.Messages), []string{cur.Messages[0].MessageID, saved2.MessageID}) || final.HeadCheckpointID != del.CheckpointID {
		t.Errorf("history after delete %v", messageIDs(final.Messages))
	}
	// Deleting it again: it is no longer in history.
	h.wantError(t, h.do(http.MethodPost, delPath(saved.MessageID), map[string]any{"expected_state_version": final.StateVersion}),
		http.StatusNotFound, chat.CodeNotFound)
	h.requireUnchanged(final)

	// Continuing hands the remaining fragment to the model as a fragment.
	h.model.setPace(time.Millisecond)
	cont := h.startRun(snap.ThreadID, final.StateVersion, "")
	s.waitType(chat.EventRunCompleted, cont.RunID)
	end := h.snapshot(snap.ThreadID)
	if len(end.Messages) != 3 || end.Messages[1].MessageID != saved2.MessageID || !strings.Contains(end.Messages[2].Content, "saved fragment") {
		t.Errorf("history after continuing with a fragment: %+v", end.Messages)
	}
}

// TestFork: a fork copies the state at a checkpoint into a new thread and
// leaves the original untouched; checkpoints of other threads are not found.
func TestFork(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("origin")
	h.runToEnd(snap.ThreadID, 1, "short first")
	cur := h.snapshot(snap.ThreadID)
	_, second := h.runToEnd(snap.ThreadID, cur.StateVersion, "short second")
	orig := h.snapshotBytes(snap.ThreadID)
	var origSnap chat.Snapshot
	json.Unmarshal([]byte(orig), &origSnap)
	cps := h.checkpoints(snap.ThreadID)
	if len(origSnap.Messages) != 4 || second.MessageID != origSnap.Messages[3].MessageID {
		t.Fatalf("origin history %+v", origSnap.Messages)
	}
	// The checkpoint after the first answer: two messages, nothing pending.
	var from chat.Checkpoint
	for _, cp := range cps.Checkpoints {
		if len(cp.MessageIDs) == 2 && cp.Pending == nil {
			from = cp
		}
	}
	r := h.call(http.MethodPost, "/api/threads/"+snap.ThreadID+"/fork", map[string]any{"from_checkpoint_id": from.CheckpointID}, http.StatusCreated, nil)
	var fork chat.ForkAck
	json.Unmarshal(r.body, &fork)
	if len(rawFields(t, r.body)) != 2 || !strings.HasPrefix(fork.NewThreadID, chat.PrefixThread) || fork.NewThreadID == snap.ThreadID {
		t.Fatalf("fork answer %s", r.body)
	}
	fs := h.snapshot(fork.NewThreadID)
	if fs.HeadCheckpointID != fork.HeadCheckpointID || fs.StateVersion != 1 || fs.LastSeq != 1 || fs.ActiveRun != nil ||
		!slices.Equal(messageIDs(fs.Messages), from.MessageIDs) {
		t.Errorf("forked thread %+v, want the history of %s", fs, from.CheckpointID)
	}
	for i, m := range fs.Messages {
		if m.Content != origSnap.Messages[i].Content {
			t.Errorf("forked message %d = %q, want %q", i, m.Content, origSnap.Messages[i].Content)
		}
	}
	if got := h.snapshotBytes(snap.ThreadID); got != orig {
		t.Errorf("fork changed the original:\n%s\n%s", orig, got)
	}
	fcps := h.checkpoints(fork.NewThreadID)
	if len(fcps.Checkpoints) != 1 || fcps.Checkpoints[0].CheckpointID != fork.HeadCheckpointID || fcps.Checkpoints[0].ParentCheckpointID != nil {
		t.Errorf("forked checkpoints %+v", fcps)
	}
	var list threadPage
	h.call(http.MethodGet, "/api/threads", nil, http.StatusOK, &list)
	found := false
	for _, th := range list.Threads {
		if th.ThreadID == fork.NewThreadID {
			found = true
			if th.ForkedFrom == nil || th.ForkedFrom.ThreadID != snap.ThreadID || th.ForkedFrom.CheckpointID != from.CheckpointID {
				t.Errorf("forked thread in list: %+v", th)
			}
		}
	}
	if !found {
		t.Errorf("forked thread not listed")
	}

	// The fork lives on by itself.
	_, reply := h.runToEnd(fork.NewThreadID, 1, "short on the branch")
	if got := h.snapshot(fork.NewThreadID); len(got.Messages) != 4 || got.Messages[3].MessageID != reply.MessageID {
		t.Errorf("fork history after a run: %+v", got.Messages)
	}
	if got := h.snapshotBytes(snap.ThreadID); got != orig {
		t.Errorf("a run on the fork changed the original")
	}

	// Refusals.
	forkPath := "/api/threads/" + snap.ThreadID + "/fork"
	h.wantError(t, h.do(http.MethodPost, forkPath, map[string]any{"from_checkpoint_id": "cp_00000000000000000000000000"}), http.StatusNotFound, chat.CodeCheckpointNotFound)
	h.wantError(t, h.do(http.MethodPost, forkPath, map[string]any{"from_checkpoint_id": fork.HeadCheckpointID}), http.StatusNotFound, chat.CodeCheckpointNotFound)
	h.wantError(t, h.do(http.MethodPost, "/api/threads/"+fork.NewThreadID+"/fork", map[string]any{"from_checkpoint_id": from.CheckpointID}), http.StatusNotFound, chat.CodeCheckpointNotFound)
	h.wantError(t, h.do(http.MethodPost, "/api/threads/thr_00000000000000000000000000/fork", map[string]any{"from_checkpoint_id": from.CheckpointID}), http.StatusNotFound, chat.CodeNotFound)
	h.wantError(t, h.do(http.MethodPost, forkPath, map[string]any{}), http.StatusBadRequest, chat.CodeInvalidRequest)
	h.wantError(t, h.do(http.MethodPost, forkPath, map[string]any{"from_checkpoint_id": ""}), http.StatusBadRequest, chat.CodeInvalidRequest)
	h.wantError(t, h.do(http.MethodPost, forkPath, map[string]any{"from_checkpoint_id": 7}), http.StatusBadRequest, chat.CodeInvalidRequest)
	if got := h.snapshotBytes(snap.ThreadID); got != orig {
		t.Errorf("a refused fork changed the original")
	}
	if n := h.threadCount(""); n != 2 {
		t.Errorf("%d threads after refused forks, want 2", n)
	}
}

// TestBadInput: every malformed or wrong request is answered with the right
// code and status, changes nothing, and the server keeps serving.
func TestBadInput(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("main")
	runAck, reply := h.runToEnd(snap.ThreadID, 1, "short hello")
	other := h.createThread("other")
	cur := h.snapshot(snap.ThreadID)
	v := cur.StateVersion
	userMsg := cur.Messages[0].MessageID
	otherCP := other.HeadCheckpointID
	th := "/api/threads/" + snap.ThreadID
	runs := th + "/runs"
	valid := fmt.Sprintf(`{"expected_state_version":%d,"user_message":"hi"}`, v)
	long := strings.Repeat("x", 32769)
	huge := `{"expected_state_version":1,"user_message":"` + strings.Repeat("y", 1<<20) + `"}`

	type tc struct {
		name, method, path string
		body               any
		status             int
		code               string
	}
	const bad, nf = http.StatusBadRequest, http.StatusNotFound
	inv, notFound := chat.CodeInvalidRequest, chat.CodeNotFound
	cases := []tc{
		// run.start bodies
		{"malformed JSON", "POST", runs, `{"expected_state_version":`, bad, inv},
		{"not JSON", "POST", runs, `hello`, bad, inv},
		{"body is an array", "POST", runs, `[]`, bad, inv},
		{"array of objects", "POST", runs, `[` + valid + `]`, bad, inv},
		{"body is a string", "POST", runs, `"hi"`, bad, inv},
		{"body is null", "POST", runs, `null`, bad, inv},
		{"empty body", "POST", runs, ``, bad, inv},
		{"unknown field", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":"hi","colour":"red"}`, v), bad, inv},
		{"field in wrong case", "POST", runs, fmt.Sprintf(`{"Expected_State_Version":%d,"user_message":"hi"}`, v), bad, inv},
		{"version as string", "POST", runs, fmt.Sprintf(`{"expected_state_version":"%d","user_message":"hi"}`, v), bad, inv},
		{"version fractional", "POST", runs, `{"expected_state_version":1.5,"user_message":"hi"}`, bad, inv},
		{"version negative", "POST", runs, `{"expected_state_version":-1,"user_message":"hi"}`, bad, inv},
		{"user_message as number", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":5}`, v), bad, inv},
		{"user_message as object", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":{"text":"hi"}}`, v), bad, inv},
		{"missing version", "POST", runs, `{"user_message":"hi"}`, bad, inv},
		{"null version", "POST", runs, `{"expected_state_version":null,"user_message":"hi"}`, bad, inv},
		{"empty user_message", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":""}`, v), bad, inv},
		{"user_message 32769 bytes", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":"%s"}`, v, long), bad, inv},
		{"trailing garbage", "POST", runs, valid + ` x`, bad, inv},
		{"trailing brace", "POST", runs, valid + `}`, bad, inv},
		{"trailing bracket", "POST", runs, valid + ` ]`, bad, inv},
		{"two objects", "POST", runs, valid + valid, bad, inv},
		{"body over 1 MiB", "POST", runs, huge, bad, inv},
		{"duplicate key", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":"hi","user_message":"other"}`, v), bad, inv},
		{"duplicate version", "POST", runs, fmt.Sprintf(`{"expected_state_version":1,"user_message":"hi","expected_state_version":%d}`, v), bad, inv},
		{"duplicate key, escaped", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":"hi","user_m\u0065ssage":"other"}`, v), bad, inv},
		{"empty client_request_id", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":"hi","client_request_id":""}`, v), bad, inv},
		{"long client_request_id", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":"hi","client_request_id":"%s"}`, v, strings.Repeat("c", 129)), bad, inv},
		{"empty resume checkpoint", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"resume_from_checkpoint_id":""}`, v), bad, inv},
		{"resume from another thread's checkpoint", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"resume_from_checkpoint_id":%q,"user_message":"hi"}`, v, otherCP), nf, chat.CodeCheckpointNotFound},
		{"resume from unknown checkpoint", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"resume_from_checkpoint_id":"cp_00000000000000000000000000"}`, v), nf, chat.CodeCheckpointNotFound},
		{"stale version", "POST", runs, `{"expected_state_version":1,"user_message":"hi"}`, http.StatusConflict, chat.CodeStateVersionConflict},
		{"future version", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":"hi"}`, v+10), http.StatusConflict, chat.CodeStateVersionConflict},
		{"run.start on unknown thread", "POST", "/api/threads/thr_00000000000000000000000000/runs", valid, nf, notFound},
		{"run.start on a run id", "POST", "/api/threads/" + runAck.RunID + "/runs", valid, nf, notFound},
		{"validation before ids", "POST", "/api/threads/thr_00000000000000000000000000/runs", `{"user_message":"hi"}`, bad, inv},

		// threads
		{"title over 200 bytes", "POST", "/api/threads", `{"title":"` + strings.Repeat("t", 201) + `"}`, bad, inv},
		{"title over 200 bytes in UTF-8", "POST", "/api/threads", `{"title":"` + strings.Repeat("é", 101) + `"}`, bad, inv},
		{"empty title", "POST", "/api/threads", `{"title":""}`, bad, inv},
		{"title as number", "POST", "/api/threads", `{"title":5}`, bad, inv},
		{"title twice", "POST", "/api/threads", `{"title":"a","title":"b"}`, bad, inv},
		{"title with a line break", "POST", "/api/threads", `{"title":"two\nlines"}`, bad, inv},
		{"title with NUL", "POST", "/api/threads", `{"title":"a\u0000b"}`, bad, inv},
		{"title with an escape sequence", "POST", "/api/threads", `{"title":"\u001b[31mred"}`, bad, inv},
		{"title with DEL", "POST", "/api/threads", `{"title":"del\u007f"}`, bad, inv},
		{"title with a bidi override", "POST", "/api/threads", `{"title":"invoice\u202efdp.exe"}`, bad, inv},
		{"title only spaces", "POST", "/api/threads", `{"title":"   "}`, bad, inv},
		{"thread unknown field", "POST", "/api/threads", `{"name":"x"}`, bad, inv},
		{"thread body array", "POST", "/api/threads", `[]`, bad, inv},
		{"thread trailing garbage", "POST", "/api/threads", `{"title":"x"} {`, bad, inv},
		{"unknown thread", "GET", "/api/threads/thr_00000000000000000000000000", nil, nf, notFound},
		{"run id as thread", "GET", "/api/threads/" + runAck.RunID, nil, nf, notFound},
		{"garbage thread id", "GET", "/api/threads/thr_'%20OR%201=1", nil, nf, notFound},
		{"checkpoints of unknown thread", "GET", "/api/threads/thr_00000000000000000000000000/checkpoints", nil, nf, notFound},
		{"operations of unknown thread", "GET", "/api/threads/thr_00000000000000000000000000/operations", nil, nf, notFound},
		{"operations of a message id", "GET", "/api/threads/" + userMsg + "/operations", nil, nf, notFound},

		// runs
		{"unknown run", "GET", "/api/runs/run_00000000000000000000000000", nil, nf, notFound},
		{"thread id as run", "GET", "/api/runs/" + snap.ThreadID, nil, nf, notFound},
		{"cancel unknown run", "POST", "/api/runs/run_00000000000000000000000000/cancel", nil, nf, notFound},
		{"cancel a thread id", "POST", "/api/runs/" + snap.ThreadID + "/cancel", `{}`, nf, notFound},
		{"cancel with empty reason", "POST", "/api/runs/" + runAck.RunID + "/cancel", `{"reason":""}`, bad, inv},
		{"cancel with long reason", "POST", "/api/runs/" + runAck.RunID + "/cancel", `{"reason":"` + strings.Repeat("r", 201) + `"}`, bad, inv},
		{"cancel with version as string", "POST", "/api/runs/" + runAck.RunID + "/cancel", `{"expected_state_version":"3"}`, bad, inv},
		{"cancel with unknown field", "POST", "/api/runs/" + runAck.RunID + "/cancel", `{"why":"x"}`, bad, inv},
		{"cancel with array", "POST", "/api/runs/" + runAck.RunID + "/cancel", `[]`, bad, inv},
		{"cancel malformed", "POST", "/api/runs/" + runAck.RunID + "/cancel", `{`, bad, inv},
		{"cancel a completed run", "POST", "/api/runs/" + runAck.RunID + "/cancel", `{"reason":"late"}`, http.StatusConflict, chat.CodeRunNotActive},

		// fragments, drafts, fork
		{"fragment of a published message", "POST", th + "/fragments", fmt.Sprintf(`{"message_id":%q,"last_seq":2,"expected_state_version":%d}`, userMsg, v), nf, notFound},
		{"fragment with last_seq 0", "POST", th + "/fragments", fmt.Sprintf(`{"message_id":%q,"last_seq":0,"expected_state_version":%d}`, reply.MessageID, v), bad, inv},
		{"fragment beyond the last seq", "POST", th + "/fragments", fmt.Sprintf(`{"message_id":%q,"last_seq":%d,"expected_state_version":%d}`, reply.MessageID, cur.LastSeq+1, v), bad, inv},
		{"fragment with last_seq as string", "POST", th + "/fragments", fmt.Sprintf(`{"message_id":%q,"last_seq":"9","expected_state_version":%d}`, reply.MessageID, v), bad, inv},
		{"delete a published text message", "POST", th + "/drafts/" + reply.MessageID + "/delete", fmt.Sprintf(`{"expected_state_version":%d}`, v), bad, inv},
		{"delete without body", "POST", th + "/drafts/" + reply.MessageID + "/delete", nil, bad, inv},
		{"delete unknown message", "POST", th + "/drafts/msg_00000000000000000000000000/delete", fmt.Sprintf(`{"expected_state_version":%d}`, v), nf, notFound},
		{"delete another thread's message", "POST", "/api/threads/" + other.ThreadID + "/drafts/" + reply.MessageID + "/delete", `{"expected_state_version":1}`, nf, notFound},
		{"fork from another thread's checkpoint", "POST", th + "/fork", fmt.Sprintf(`{"from_checkpoint_id":%q}`, otherCP), nf, chat.CodeCheckpointNotFound},
		{"fork with unknown field", "POST", th + "/fork", `{"checkpoint_id":"x"}`, bad, inv},

		// routing
		{"unknown API path", "GET", "/api/nope", nil, nf, notFound},
		{"unknown nested path", "POST", th + "/archive", `{}`, nf, notFound},
		{"wrong method", "PUT", th, nil, nf, notFound},
		{"list with bad limit", "GET", "/api/threads?limit=0", nil, bad, inv},
	}

	nThreads := h.threadCount("")
	mainBefore, otherBefore := h.snapshotBytes(snap.ThreadID), h.snapshotBytes(other.ThreadID)
	runBefore := string(h.call(http.MethodGet, "/api/runs/"+runAck.RunID, nil, http.StatusOK, nil).body)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := h.with(t)
			r := h.do(c.method, c.path, c.body)
			h.wantError(t, r, c.status, c.code)
			if got := h.snapshotBytes(snap.ThreadID); got != mainBefore {
				t.Errorf("the main thread changed: now %.200s", got)
				mainBefore = got // report each change once
			}
			if got := h.snapshotBytes(other.ThreadID); got != otherBefore {
				t.Errorf("the other thread changed")
			}
			if got := string(h.call(http.MethodGet, "/api/runs/"+runAck.RunID, nil, http.StatusOK, nil).body); got != runBefore {
				t.Errorf("the run changed:\n%s\n%s", runBefore, got)
			}
			if n := h.threadCount(""); n != nThreads {
				t.Errorf("%d threads, want %d", n, nThreads)
			}
		})
	}
	// The conflict names what the refused command was based on.
	body := h.wantError(t, h.do(http.MethodPost, runs, `{"expected_state_version":1,"user_message":"hi"}`), http.StatusConflict, chat.CodeStateVersionConflict)
	if body["current_state_version"] != float64(v) || body["current_checkpoint_id"] != cur.HeadCheckpointID {
		t.Errorf("conflict body %v", body)
	}
	if acts, _ := body["allowed_actions"].([]any); !slices.Equal(acts, []any{"reload", "fork_from_" + h.checkpoints(snap.ThreadID).Checkpoints[0].CheckpointID}) {
		t.Errorf("allowed_actions %v", body["allowed_actions"])
	}
}

// TestLimitsAccepted: the largest accepted user message and title pass.
func TestLimitsAccepted(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	titled := h.createThread(strings.Repeat("t", 200))
	if len(titled.Title) != 200 {
		t.Errorf("title of 200 bytes stored as %d", len(titled.Title))
	}
	msg := strings.Repeat("word ", 32768/5) + strings.Repeat("z", 32768%5)
	if len(msg) != 32768 {
		t.Fatalf("message is %d bytes", len(msg))
	}
	h.runToEnd(titled.ThreadID, 1, msg)
	if got := h.snapshot(titled.ThreadID); len(got.Messages) != 2 || got.Messages[0].Content != msg {
		t.Errorf("32768-byte message not kept intact")
	}
	// Cancelling with an empty body and with {} is fine.
	h.model.setPace(50 * time.Millisecond)
	cur := h.snapshot(titled.ThreadID)
	s := h.openSSE(titled.ThreadID, "after_seq="+strconv.FormatInt(cur.LastSeq, 10), "")
	ack := h.startRun(titled.ThreadID, cur.StateVersion, "again please")
	s.waitDeltas(ack.RunID, 1)
	if a := h.cancel(ack.RunID, `{}`); a.AlreadyRequested || a.Status != chat.RunCancelRequested {
		t.Errorf("cancel with {}: %+v", a)
	}
	if a := h.cancel(ack.RunID, nil); !a.AlreadyRequested {
		t.Errorf("second cancel without body: %+v", a)
	}
	s.waitType(chat.EventRunCancelled, ack.RunID)
}

func filter(evs []*wireEvent, keep func(*wireEvent) bool) []*wireEvent {
	var out []*wireEvent
	for _, e := range evs {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}

// TestCancelQueuedRun: a run no worker holds yet is cancelled by the
// engine itself: cancel_requested, then run.cancelled with nothing
// discarded; the worker never claims it.
func TestCancelQueuedRun(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 50*time.Millisecond, withWorkers(1))
	a, b := h.createThread("busy"), h.createThread("waiting")
	sa := h.openSSE(a.ThreadID, "after_seq=0", "")
	sb := h.openSSE(b.ThreadID, "after_seq=0", "")
	busy := h.startRun(a.ThreadID, 1, "Explain garbage collection in Go")
	sa.waitDeltas(busy.RunID, 1) // the only worker is taken
	queued := h.startRun(b.ThreadID, 1, "short queued question")
	if run := h.run(queued.RunID); run.Status != chat.RunQueued {
		t.Fatalf("second run is %s, want queued", run.Status)
	}
	before := h.snapshot(b.ThreadID)
	if before.ActiveRun == nil || before.ActiveRun.Status != chat.RunQueued || before.ActiveRun.MessageID != nil || before.ActiveRun.PartialText != "" {
		t.Errorf("snapshot of a queued run: %+v", before.ActiveRun)
	}
	ack := h.cancel(queued.RunID, nil)
	if ack.Status != chat.RunCancelRequested || ack.AlreadyRequested || ack.ResumeCheckpointID != before.HeadCheckpointID ||
		ack.PublishedMessageID == nil || *ack.PublishedMessageID != before.Messages[0].MessageID {
		t.Errorf("cancel of a queued run: %+v", ack)
	}
	done := sb.waitType(chat.EventRunCancelled, queued.RunID)
	if done.DiscardedStreamChars != 0 || len(done.Operations) != 0 || done.ResumeCheckpointID != before.HeadCheckpointID {
		t.Errorf("run.cancelled of a queued run: %s", done.Data)
	}
	for _, e := range sb.events {
		if e.RunID == queued.RunID && (e.Type == chat.EventMessageDelta || e.Type == chat.EventMessagePublished) {
			t.Errorf("a cancelled queued run streamed: %v", e)
		}
	}
	if run := h.run(queued.RunID); run.Status != chat.RunCancelled || run.DiscardedStreamChars != 0 {
		t.Errorf("queued run after cancel: %+v", run)
	}
	h.cancel(busy.RunID, nil)
	sa.waitType(chat.EventRunCancelled, busy.RunID)

	// The worker is free again: continuing the cancelled queued run works.
	h.model.setPace(time.Millisecond)
	cur := h.snapshot(b.ThreadID)
	cont := h.startRun(b.ThreadID, cur.StateVersion, "")
	sb.waitType(chat.EventRunCompleted, cont.RunID)
}

// TestResumeFromOlderCheckpoint: run.start from a checkpoint that is not the
// head makes it the head again through a new checkpoint; a stale request
// based on it offers a fork from it.
func TestResumeFromOlderCheckpoint(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("")
	h.runToEnd(snap.ThreadID, 1, "short first question")
	cps := h.checkpoints(snap.ThreadID)
	userCP := cps.Checkpoints[1] // the user message, pending generate
	if userCP.Pending == nil || len(userCP.MessageIDs) != 1 {
		t.Fatalf("checkpoint 1 is %+v", userCP)
	}
	cur := h.snapshot(snap.ThreadID)

	// Stale, based on the older checkpoint: fork from it is offered.
	body := h.wantError(t, h.do(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs",
		map[string]any{"expected_state_version": 2, "resume_from_checkpoint_id": userCP.CheckpointID}), http.StatusConflict, chat.CodeStateVersionConflict)
	if acts, _ := body["allowed_actions"].([]any); !slices.Contains(acts, any("fork_from_"+userCP.CheckpointID)) {
		t.Errorf("allowed_actions %v, want fork_from_%s", body["allowed_actions"], userCP.CheckpointID)
	}
	h.requireUnchanged(cur)

	// Regenerate the answer from the older point.
	s := h.openSSE(snap.ThreadID, "after_seq="+strconv.FormatInt(cur.LastSeq, 10), "")
	var ack chat.RunStartAck
	h.call(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs",
		map[string]any{"expected_state_version": cur.StateVersion, "resume_from_checkpoint_id": userCP.CheckpointID}, http.StatusCreated, &ack)
	cpEv := s.next()
	started := s.next()
	if cpEv.Type != chat.EventCheckpointCreated || cpEv.ParentCheckpointID == nil || *cpEv.ParentCheckpointID != userCP.CheckpointID ||
		started.Type != chat.EventRunStarted || started.BaseCheckpointID != cpEv.CheckpointID || ack.StateVersion != started.StateVersion {
		t.Fatalf("resume from %s: %v then %v", userCP.CheckpointID, cpEv, started)
	}
	s.waitType(chat.EventRunCompleted, ack.RunID)
	after := h.snapshot(snap.ThreadID)
	if len(after.Messages) != 2 || after.Messages[0].MessageID != userCP.MessageIDs[0] || after.Messages[1].RunID == nil || *after.Messages[1].RunID != ack.RunID {
		t.Errorf("history after regenerating: %+v", after.Messages)
	}

	// A new question asked from the older point branches from there.
	h.runToEnd(snap.ThreadID, after.StateVersion, "short edited question")
	var edit chat.RunStartAck
	cur = h.snapshot(snap.ThreadID)
	s2 := h.openSSE(snap.ThreadID, "after_seq="+strconv.FormatInt(cur.LastSeq, 10), "")
	h.call(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs", map[string]any{
		"expected_state_version": cur.StateVersion, "resume_from_checkpoint_id": cps.Checkpoints[0].CheckpointID, "user_message": "short a different start",
	}, http.StatusCreated, &edit)
	s2.waitType(chat.EventRunCompleted, edit.RunID)
	final := h.snapshot(snap.ThreadID)
	if len(final.Messages) != 2 || final.Messages[0].Content != "short a different start" {
		t.Errorf("history after editing from the root: %+v", final.Messages)
	}
}

// TestPurgedStream: once the deltas are gone from the stream buffer a
// fragment cannot be cut (410) and a replay that needs them starts from a
// snapshot; durable-only ranges still replay.
func TestPurgedStream(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("")
	_, msg := h.runToEnd(snap.ThreadID, 1, "short question")
	cur := h.snapshot(snap.ThreadID)
	n, err := h.st.Retention().PurgeStream(context.Background(), time.Now().Add(time.Hour))
	if err != nil || n == 0 {
		t.Fatalf("purge: %d deltas, %v", n, err)
	}

	r := h.do(http.MethodPost, "/api/threads/"+snap.ThreadID+"/fragments",
		map[string]any{"message_id": msg.MessageID, "last_seq": cur.LastSeq - 3, "expected_state_version": cur.StateVersion})
	h.wantError(t, r, http.StatusGone, chat.CodeFragmentUnavailable)
	h.requireUnchanged(cur)

	s := h.openSSE(snap.ThreadID, "after_seq=0", "")
	s.lastSeq = -1 // the gap cannot be filled: a snapshot comes first
	if first := s.next(); first.Type != chat.EventThreadSnapshot || first.Seq != cur.LastSeq || len(first.Messages) != 2 {
		t.Errorf("replay over purged deltas began with %v", first)
	}
	// The last three events are durable: they still replay exactly.
	s = h.openSSE(snap.ThreadID, "after_seq="+strconv.FormatInt(cur.LastSeq-3, 10), "")
	got := s.waitSeq(cur.LastSeq)
	if len(got) != 3 || got[0].Type != chat.EventMessagePublished || got[2].Type != chat.EventRunCompleted {
		t.Errorf("durable replay: %v", got)
	}
}

// TestShutdownHandsRunBack: closing the engine mid-stream publishes nothing
// and leaves the run queued for the next process; the database audit holds.
func TestShutdownHandsRunBack(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 50*time.Millisecond)
	snap, s, ack, _ := h.runUntilDeltas("Explain consistent hashing", 2)
	h.eng.Close() // the harness closes it again, which is harmless
	run := h.run(ack.RunID)
	if run.Status != chat.RunQueued || run.FinishedAt != nil || run.CancelRequestedAt != nil {
		t.Errorf("run after shutdown: %+v", run)
	}
	after := h.snapshot(snap.ThreadID)
	if len(after.Messages) != 1 || after.ActiveRun == nil || after.ActiveRun.RunID != ack.RunID {
		t.Errorf("snapshot after shutdown: %+v", after)
	}
	for _, e := range s.events {
		if e.Type == chat.EventMessagePublished && e.RunID == ack.RunID {
			t.Errorf("shutdown published %v", e)
		}
	}
}
