package gateway_test

// The harness the package's black-box tests share: the whole stack on
// SQLite with the paced demo model (newHarness and its options), HTTP calls
// and their checks, runs driven to a point, the decoded event (wireEvent)
// and small helpers.

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
	"unicode/utf8"

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
type pacedModel struct {
	pace atomic.Int64
	// gate, when set as a stream starts, holds that stream after its
	// first chunk until the gate is closed (hold).
	gate atomic.Pointer[chan struct{}]
}

func (m *pacedModel) setPace(d time.Duration) { m.pace.Store(int64(d)) }

// hold makes every stream started from now on stop after its first chunk
// until release is called: a run that stays active exactly as long as a
// test needs it to.
func (m *pacedModel) hold() (release func()) {
	gate := make(chan struct{})
	m.gate.Store(&gate)
	var once sync.Once
	return func() { once.Do(func() { close(gate) }) }
}

// free starts later streams unheld.
func (m *pacedModel) free() { m.gate.Store(nil) }

func (m *pacedModel) Stream(ctx context.Context, req model.Request) (model.Stream, error) {
	s, err := demo.New(time.Duration(m.pace.Load())).Stream(ctx, req)
	if err != nil {
		return nil, err
	}
	if gate := m.gate.Load(); gate != nil {
		return &heldStream{Stream: s, gate: *gate}, nil
	}
	return s, nil
}

// heldStream is a stream that waits for its gate before its second chunk.
type heldStream struct {
	model.Stream
	gate <-chan struct{}
	n    int
}

func (s *heldStream) Next(ctx context.Context) (model.Chunk, error) {
	if s.n == 1 {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return model.Chunk{}, context.Cause(ctx)
		}
	}
	s.n++
	return s.Stream.Next(ctx)
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
		Auth: authn, Store: st, Runs: eng, Model: "demo",
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

// requireOnlyDeltas is requireUnchanged for a thread whose run streams
// meanwhile: its version, head and messages are as in snap, and every
// event after snap's last seq is a delta (read on s, the thread's stream,
// up to the thread's last seq now).
func (h *harness) requireOnlyDeltas(snap chat.Snapshot, s *sseStream) {
	h.t.Helper()
	now := h.snapshot(snap.ThreadID)
	if now.StateVersion != snap.StateVersion || now.HeadCheckpointID != snap.HeadCheckpointID ||
		len(now.Messages) != len(snap.Messages) {
		h.t.Errorf("thread %s changed: v%d head %s -> v%d head %s", snap.ThreadID,
			snap.StateVersion, snap.HeadCheckpointID, now.StateVersion, now.HeadCheckpointID)
	}
	s.catchUp(now.LastSeq)
	for _, e := range s.events {
		if e.Seq > snap.LastSeq && e.Seq <= now.LastSeq && e.Type != chat.EventMessageDelta {
			h.t.Errorf("thread %s: %s at seq %d, where only deltas were expected", snap.ThreadID, e.Type, e.Seq)
		}
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
	// A new run: queued, or running when its start claimed it for a free
	// worker (docs/protocol.md, "Run statuses").
	if !strings.HasPrefix(ack.RunID, chat.PrefixRun) || (ack.Status != chat.RunQueued && ack.Status != chat.RunRunning) ||
		ack.StateVersion <= expected {
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

func filter(evs []*wireEvent, keep func(*wireEvent) bool) []*wireEvent {
	var out []*wireEvent
	for _, e := range evs {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}

// waitTimeout bounds every wait for an event, so a bug fails a test rather
// than hanging it.
const waitTimeout = 20 * time.Second

// wireEvent is one Server-Sent Event: the SSE framing (ID, Event, Data) and
// the protocol fields decoded from Data.
type wireEvent struct {
	ID    int64           `json:"-"` // the "id:" line
	Event string          `json:"-"` // the "event:" line
	Data  json.RawMessage `json:"-"` // the "data:" line, verbatim

	chat.EventHeader

	// message.delta, message.deleted
	MessageID string `json:"message_id"`
	Text      string `json:"text"`
	// message.published, checkpoint.created, message.deleted
	Message            *chat.Message `json:"message"`
	CheckpointID       string        `json:"checkpoint_id"`
	ParentCheckpointID *string       `json:"parent_checkpoint_id"`
	// run.*
	BaseCheckpointID     string                  `json:"base_checkpoint_id"`
	Reason               string                  `json:"reason"`
	RequestedBy          string                  `json:"requested_by"`
	ResumeCheckpointID   string                  `json:"resume_checkpoint_id"`
	PublishedMessageID   *string                 `json:"published_message_id"`
	DiscardedStreamChars int64                   `json:"discarded_stream_chars"`
	ResumePolicy         string                  `json:"resume_policy"`
	Operations           []chat.OperationOutcome `json:"operations"`
	Error                string                  `json:"error"`
	// thread.snapshot
	Title            string          `json:"title"`
	HeadCheckpointID string          `json:"head_checkpoint_id"`
	LastSeq          int64           `json:"last_seq"`
	Messages         []chat.Message  `json:"messages"`
	ActiveRun        *chat.ActiveRun `json:"active_run"`
}

func (e *wireEvent) String() string {
	return fmt.Sprintf("#%d %s %s", e.Seq, e.Type, e.Data)
}

func (e *wireEvent) durable() bool {
	return e.Type != chat.EventMessageDelta && e.Type != chat.EventThreadSnapshot
}

// runeCount sums the characters of some deltas.
func runeCount(evs []*wireEvent) int64 {
	var n int64
	for _, e := range evs {
		n += int64(utf8.RuneCountInString(e.Text))
	}
	return n
}
