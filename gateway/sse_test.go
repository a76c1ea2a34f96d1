package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/honestcancel/gateway/bus"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/gateway"
)

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

// sseStream reads one thread's event stream. A reader goroutine parses the
// frames; the test goroutine consumes them with next/waitFor, which also
// check every protocol invariant a single stream can see: SSE id = seq,
// event name = type, seqs +1 with no gap or duplicate, state_version +1 on
// every durable event, run ids where required, nothing of a run after its
// run.cancelled, and published run messages equal to their deltas.
type sseStream struct {
	t        *testing.T
	threadID string
	cancel   context.CancelFunc
	items    chan sseItem
	done     chan struct{}
	comments atomic.Int64 // keep-alive comments received

	lastSeq     int64 // -1 until known
	lastVersion int64 // -1 until known
	events      []*wireEvent
	deltas      map[string]*strings.Builder // message id -> its delta text seen here
	deltaRun    map[string]string           // message id -> run id of its deltas
	started     map[string]bool             // runs whose run.started this stream saw
	cancelled   map[string]int64            // run id -> seq of its run.cancelled
}

type sseItem struct {
	ev  *wireEvent
	err error
}

// threadWithStream creates a thread titled title and opens its event
// stream from seq 0.
func (h *harness) threadWithStream(title string) (string, *sseStream) {
	h.t.Helper()
	th := h.createThread(title).ThreadID
	return th, h.openSSE(th, "after_seq=0", "")
}

// openSSE opens GET /api/threads/{id}/events with the given query (e.g.
// "after_seq=0", or "" for no position) and optional Last-Event-ID ("" for
// none). The stream is closed at the end of the test.
func (h *harness) openSSE(threadID, query, lastEventID string) *sseStream {
	h.t.Helper()
	ctx, cancel, resp := h.requestSSE(h.srv.Client(), threadID, query, lastEventID)
	return h.readSSE(ctx, cancel, resp, threadID, query, lastEventID)
}

// requestSSE sends the request of openSSE with client and checks the
// answer's status and Content-Type; nothing of the body is read.
func (h *harness) requestSSE(client *http.Client, threadID, query, lastEventID string) (context.Context, context.CancelFunc, *http.Response) {
	h.t.Helper()
	ctx, cancel, resp := h.sendSSE(client, threadID, query, lastEventID)
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		h.t.Fatalf("open event stream: status %d: %s", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		h.t.Errorf("event stream Content-Type = %q, want text/event-stream", ct)
	}
	return ctx, cancel, resp
}

// sendSSE sends the request of openSSE with client and returns the answer,
// whatever its status.
func (h *harness) sendSSE(client *http.Client, threadID, query, lastEventID string) (context.Context, context.CancelFunc, *http.Response) {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	url := h.srv.URL + "/api/threads/" + threadID + "/events"
	if query != "" {
		url += "?" + query
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		cancel()
		h.t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := client.Do(req)
	if err != nil {
		cancel()
		h.t.Fatalf("open event stream: %v", err)
	}
	return ctx, cancel, resp
}

// openSSEAdmitted is openSSE for a user at the connection limit: it polls
// (bounded) while the answer is 429, until a connection slot is given
// back.
func (h *harness) openSSEAdmitted(threadID, query, lastEventID string) *sseStream {
	h.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		ctx, cancel, resp := h.sendSSE(h.srv.Client(), threadID, query, lastEventID)
		if resp.StatusCode == http.StatusOK {
			return h.readSSE(ctx, cancel, resp, threadID, query, lastEventID)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		if resp.StatusCode != http.StatusTooManyRequests || time.Now().After(deadline) {
			h.t.Fatalf("open event stream: status %d: %s", resp.StatusCode, body)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
	}
}

// readSSE starts reading the body of an event stream that requestSSE
// opened with these parameters; cancel ends it.
func (h *harness) readSSE(ctx context.Context, cancel context.CancelFunc, resp *http.Response, threadID, query, lastEventID string) *sseStream {
	s := &sseStream{
		t: h.t, threadID: threadID, cancel: cancel,
		items: make(chan sseItem, 4096), done: make(chan struct{}),
		lastSeq: -1, lastVersion: -1,
		deltas: map[string]*strings.Builder{}, deltaRun: map[string]string{},
		started: map[string]bool{}, cancelled: map[string]int64{},
	}
	if n, ok := positionOf(query, lastEventID); ok {
		s.lastSeq = n
		if n == 0 {
			s.lastVersion = 0
		}
	}
	go s.read(ctx, resp.Body)
	h.t.Cleanup(s.close)
	return s
}

// positionOf says where a stream opened with these parameters must start
// (Last-Event-ID wins over after_seq).
func positionOf(query, lastEventID string) (int64, bool) {
	v := lastEventID
	if v == "" {
		for _, kv := range strings.Split(query, "&") {
			if after, ok := strings.CutPrefix(kv, "after_seq="); ok {
				v = after
			}
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil
}

// close ends the stream (as a client disconnect) and waits for its reader.
func (s *sseStream) close() {
	s.cancel()
	<-s.done
}

func (s *sseStream) read(ctx context.Context, body io.ReadCloser) {
	defer close(s.done)
	defer body.Close()
	send := func(it sseItem) bool {
		select {
		case s.items <- it:
			return true
		case <-ctx.Done():
			return false
		}
	}
	r := bufio.NewReaderSize(body, 64<<10)
	ev := &wireEvent{}
	fields := 0
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			if ctx.Err() == nil {
				if err == io.EOF {
					err = errors.New("event stream ended by the server")
				}
				send(sseItem{err: err})
			}
			return
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if fields == 0 {
				continue
			}
			if err := json.Unmarshal(ev.Data, ev); err != nil {
				send(sseItem{err: fmt.Errorf("event data is not JSON: %v: %s", err, ev.Data)})
				return
			}
			if !send(sseItem{ev: ev}) {
				return
			}
			ev, fields = &wireEvent{}, 0
		case strings.HasPrefix(line, ":"):
			s.comments.Add(1) // keep-alive comment
		case strings.HasPrefix(line, "id: "):
			n, err := strconv.ParseInt(strings.TrimPrefix(line, "id: "), 10, 64)
			if err != nil {
				send(sseItem{err: fmt.Errorf("bad id line %q", line)})
				return
			}
			ev.ID, fields = n, fields+1
		case strings.HasPrefix(line, "event: "):
			ev.Event, fields = strings.TrimPrefix(line, "event: "), fields+1
		case strings.HasPrefix(line, "data: "):
			if ev.Data != nil {
				send(sseItem{err: fmt.Errorf("event split over several data lines: %q", line)})
				return
			}
			ev.Data, fields = json.RawMessage(strings.TrimPrefix(line, "data: ")), fields+1
		default:
			send(sseItem{err: fmt.Errorf("unexpected SSE line %q", line)})
			return
		}
	}
}

// next returns the next event, failing the test after waitTimeout.
func (s *sseStream) next() *wireEvent {
	s.t.Helper()
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	select {
	case it := <-s.items:
		if it.err != nil {
			s.t.Fatalf("event stream of %s: %v", s.threadID, it.err)
		}
		s.observe(it.ev)
		return it.ev
	case <-timer.C:
		s.t.Fatalf("no event on %s within %v (last seq %d)", s.threadID, waitTimeout, s.lastSeq)
		return nil
	}
}

// rest reads, checking each event as next does, until the server ends the
// stream, and returns the events and what ended it; it fails the test if
// the stream is still open after waitTimeout.
func (s *sseStream) rest() ([]*wireEvent, error) {
	s.t.Helper()
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	var got []*wireEvent
	for {
		select {
		case it := <-s.items:
			if it.err != nil {
				return got, it.err
			}
			s.observe(it.ev)
			got = append(got, it.ev)
		case <-timer.C:
			s.t.Fatalf("event stream of %s still open after %v (last seq %d)", s.threadID, waitTimeout, s.lastSeq)
			return nil, nil
		}
	}
}

// waitFor reads events until pred holds and returns every event read,
// the matching one last.
func (s *sseStream) waitFor(what string, pred func(*wireEvent) bool) []*wireEvent {
	s.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	var got []*wireEvent
	for time.Now().Before(deadline) {
		ev := s.next()
		got = append(got, ev)
		if pred(ev) {
			return got
		}
	}
	s.t.Fatalf("waiting for %s on %s: not seen within %v", what, s.threadID, waitTimeout)
	return nil
}

// waitType reads until an event of type typ (of run runID, when given).
func (s *sseStream) waitType(typ, runID string) *wireEvent {
	s.t.Helper()
	got := s.waitFor(typ+" "+runID, func(e *wireEvent) bool {
		return e.Type == typ && (runID == "" || e.RunID == runID)
	})
	return got[len(got)-1]
}

// waitSeq reads until the event with seq n.
func (s *sseStream) waitSeq(n int64) []*wireEvent {
	s.t.Helper()
	return s.waitFor(fmt.Sprintf("seq %d", n), func(e *wireEvent) bool { return e.Seq >= n })
}

// catchUp reads until this stream has seen seq n (nothing if it has).
func (s *sseStream) catchUp(n int64) {
	s.t.Helper()
	if s.lastSeq < n {
		s.waitSeq(n)
	}
}

// waitDeltas reads until n deltas of run runID arrived here and returns them.
func (s *sseStream) waitDeltas(runID string, n int) []*wireEvent {
	s.t.Helper()
	var out []*wireEvent
	s.waitFor(fmt.Sprintf("%d deltas of %s", n, runID), func(e *wireEvent) bool {
		if e.Type == chat.EventMessageDelta && e.RunID == runID {
			out = append(out, e)
		}
		return len(out) >= n
	})
	return out
}

// text is the delta text of a message seen on this stream with seq <= upTo.
func (s *sseStream) text(messageID string, upTo int64) string {
	var b strings.Builder
	for _, e := range s.events {
		if e.Type == chat.EventMessageDelta && e.MessageID == messageID && e.Seq <= upTo {
			b.WriteString(e.Text)
		}
	}
	return b.String()
}

// observe checks one event against everything this stream has seen.
func (s *sseStream) observe(e *wireEvent) {
	t := s.t
	t.Helper()
	s.events = append(s.events, e)
	if e.ID != e.Seq || e.Event != e.Type {
		t.Errorf("SSE framing id=%d event=%q does not match data seq=%d type=%q", e.ID, e.Event, e.Seq, e.Type)
	}
	if e.ThreadID != s.threadID {
		t.Errorf("event %v: thread_id %q, want %q", e, e.ThreadID, s.threadID)
	}
	if e.TS <= 0 {
		t.Errorf("event %v: ts missing", e)
	}
	if !json.Valid(e.Data) {
		t.Errorf("event %v: data is not valid JSON", e)
	}
	if e.Type == chat.EventThreadSnapshot {
		if e.Seq != e.LastSeq {
			t.Errorf("snapshot seq %d != its last_seq %d", e.Seq, e.LastSeq)
		}
		if !strings.HasPrefix(e.HeadCheckpointID, chat.PrefixCheckpoint) || e.Messages == nil {
			t.Errorf("snapshot event lacks head or messages: %s", e.Data)
		}
		s.lastSeq, s.lastVersion = e.Seq, e.StateVersion
		return
	}
	if s.lastSeq < 0 {
		t.Errorf("stream without a position began with %v, want thread.snapshot", e)
	} else if e.Seq != s.lastSeq+1 {
		t.Errorf("event %v follows seq %d: want seq %d (no gap, no duplicate)", e, s.lastSeq, s.lastSeq+1)
	}
	s.lastSeq = e.Seq
	if e.durable() {
		if s.lastVersion >= 0 && e.StateVersion != s.lastVersion+1 {
			t.Errorf("durable event %v has state_version %d, want %d", e, e.StateVersion, s.lastVersion+1)
		}
		if e.StateVersion <= 0 {
			t.Errorf("durable event %v carries no state_version", e)
		}
		s.lastVersion = e.StateVersion
	} else if hasField(e.Data, "state_version") {
		t.Errorf("delta %v carries a state_version", e)
	}
	if strings.HasPrefix(e.Type, "run.") || e.Type == chat.EventMessageDelta || strings.HasPrefix(e.Type, "tool.") {
		if !strings.HasPrefix(e.RunID, chat.PrefixRun) {
			t.Errorf("event %v carries no run_id", e)
		}
	}
	if at, ok := s.cancelled[e.RunID]; ok && e.RunID != "" && e.Type != chat.EventToolUpdated {
		t.Errorf("run %s emitted %v after its run.cancelled (seq %d)", e.RunID, e, at)
	}
	switch e.Type {
	case chat.EventRunStarted:
		s.started[e.RunID] = true
		if !strings.HasPrefix(e.BaseCheckpointID, chat.PrefixCheckpoint) {
			t.Errorf("run.started without base_checkpoint_id: %s", e.Data)
		}
	case chat.EventMessageDelta:
		if !strings.HasPrefix(e.MessageID, chat.PrefixMessage) || e.Text == "" {
			t.Errorf("delta without message_id or text: %s", e.Data)
		}
		b := s.deltas[e.MessageID]
		if b == nil {
			b = &strings.Builder{}
			s.deltas[e.MessageID] = b
		}
		b.WriteString(e.Text)
		s.deltaRun[e.MessageID] = e.RunID
	case chat.EventMessagePublished:
		m := e.Message
		if m == nil || !strings.HasPrefix(m.MessageID, chat.PrefixMessage) || e.CheckpointID != m.CheckpointID || m.StateVersion != e.StateVersion {
			t.Errorf("message.published is inconsistent: %s", e.Data)
			return
		}
		if m.Role == chat.RoleTool {
			// A tool result is recorded whole, never streamed.
			if s.deltas[m.MessageID] != nil {
				t.Errorf("tool message %s had deltas", m.MessageID)
			}
		} else if m.RunID != nil && s.started[*m.RunID] && m.Kind != chat.KindFragment {
			// This stream saw the whole run: the message is exactly its
			// deltas, which carry its id.
			b := s.deltas[m.MessageID]
			if b == nil {
				t.Errorf("published message %s of run %s had no deltas", m.MessageID, *m.RunID)
			} else if b.String() != m.Content {
				t.Errorf("published content %q != concatenated deltas %q", m.Content, b.String())
			}
			if s.deltaRun[m.MessageID] != *m.RunID || e.RunID != *m.RunID {
				t.Errorf("message.published %v: run ids of event, message and deltas differ", e)
			}
		}
	case chat.EventRunCancelled:
		s.cancelled[e.RunID] = e.Seq
		if !hasField(e.Data, "operations") || e.Operations == nil {
			t.Errorf("run.cancelled without operations: %s", e.Data)
		}
	}
}

// hasField reports whether the JSON object raw has the key.
func hasField(raw []byte, key string) bool {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return false
	}
	_, ok := m[key]
	return ok
}

// ---- SSE tests ----

// TestSSEReplayAndReconnect: a replay from 0 is byte-for-byte the live
// stream; Last-Event-ID resumes exactly after N (and wins over after_seq);
// then live events follow with no gap.
func TestSSEReplayAndReconnect(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("")
	live := h.openSSE(snap.ThreadID, "after_seq=0", "")
	ack := h.startRun(snap.ThreadID, snap.StateVersion, "Explain SQLite write ahead logging")
	live.waitType(chat.EventRunCompleted, ack.RunID)
	after := h.snapshot(snap.ThreadID)
	if live.lastSeq != after.LastSeq {
		t.Fatalf("live stream at seq %d, thread at %d", live.lastSeq, after.LastSeq)
	}

	// Replay from the start: every event, in order, identical bytes.
	replay := h.openSSE(snap.ThreadID, "after_seq=0", "")
	got := replay.waitSeq(after.LastSeq)
	if len(got) != len(live.events) {
		t.Fatalf("replay has %d events, live had %d", len(got), len(live.events))
	}
	for i, e := range got {
		if e.Seq != int64(i+1) || string(e.Data) != string(live.events[i].Data) {
			t.Errorf("replay event %d = %s, live was %s", i+1, e.Data, live.events[i].Data)
		}
	}

	// Reconnect in the middle of the deltas: Last-Event-ID wins over
	// after_seq; exactly N+1.. follows.
	var mid int64
	for _, e := range live.events {
		if e.Type == chat.EventMessageDelta {
			mid = e.Seq + 2
			break
		}
	}
	re := h.openSSE(snap.ThreadID, "after_seq=1", strconv.FormatInt(mid, 10))
	got = re.waitSeq(after.LastSeq)
	if got[0].Seq != mid+1 || int64(len(got)) != after.LastSeq-mid {
		t.Fatalf("reconnect after %d: first seq %d, %d events; want %d..%d", mid, got[0].Seq, len(got), mid+1, after.LastSeq)
	}
	for i, e := range got {
		if string(e.Data) != string(live.events[mid+int64(i)].Data) {
			t.Errorf("reconnect event %d differs from live", e.Seq)
		}
	}
	// Last-Event-ID wins even over an after_seq that would be refused.
	re2 := h.openSSE(snap.ThreadID, "after_seq=bogus", strconv.FormatInt(after.LastSeq-1, 10))
	if e := re2.next(); e.Seq != after.LastSeq || e.Type != chat.EventRunCompleted {
		t.Errorf("Last-Event-ID %d with a bad after_seq gave %v", after.LastSeq-1, e)
	}
	re2.close()

	// Then live events: the next run continues at last_seq + 1 on every
	// stream (the observers check the seqs).
	ack2 := h.startRun(snap.ThreadID, after.StateVersion, "short one more")
	for _, s := range []*sseStream{live, replay, re} {
		if first := s.next(); first.Seq != after.LastSeq+1 {
			t.Errorf("live event after replay has seq %d, want %d", first.Seq, after.LastSeq+1)
		}
		s.waitType(chat.EventRunCompleted, ack2.RunID)
	}
	if len(re.events) != len(live.events)-int(mid) {
		t.Errorf("reconnected stream saw %d events, want %d", len(re.events), len(live.events)-int(mid))
	}
}

// TestSSESnapshotStart: without a position, or with one beyond the thread's
// end, the stream starts with a thread.snapshot whose seq is last_seq; a
// snapshot taken mid-run holds the partial text, which the following deltas
// complete into the published message.
func TestSSESnapshotStart(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("snapshots")
	ack := h.startRun(snap.ThreadID, snap.StateVersion, "short hello")
	h.openSSE(snap.ThreadID, "after_seq=0", "").waitType(chat.EventRunCompleted, ack.RunID)
	cur := h.snapshot(snap.ThreadID)

	for _, q := range []string{"", "after_seq=" + strconv.FormatInt(cur.LastSeq+5, 10)} {
		s := h.openSSE(snap.ThreadID, q, "")
		s.lastSeq = -1 // must start with a snapshot whatever was asked
		first := s.next()
		if first.Type != chat.EventThreadSnapshot || first.Seq != cur.LastSeq || first.StateVersion != cur.StateVersion ||
			first.HeadCheckpointID != cur.HeadCheckpointID || len(first.Messages) != 2 || first.ActiveRun != nil || first.Title != "snapshots" {
			t.Errorf("query %q: first event %s, want the snapshot at seq %d", q, first.Data, cur.LastSeq)
		}
	}

	// Mid-run: the snapshot's partial_text plus the later deltas is the
	// published message.
	h.model.setPace(50 * time.Millisecond)
	watch := h.openSSE(snap.ThreadID, "after_seq="+strconv.FormatInt(cur.LastSeq, 10), "")
	ack = h.startRun(snap.ThreadID, cur.StateVersion, "Tell me about event sourcing")
	watch.waitDeltas(ack.RunID, 3)
	h.model.setPace(time.Millisecond) // later runs only
	s := h.openSSE(snap.ThreadID, "", "")
	first := s.next()
	if first.Type != chat.EventThreadSnapshot || first.ActiveRun == nil || first.ActiveRun.RunID != ack.RunID || first.ActiveRun.MessageID == nil {
		t.Fatalf("mid-run snapshot without the active run: %s", first.Data)
	}
	ar := first.ActiveRun
	if ar.LastSeq != first.Seq {
		t.Errorf("active_run.last_seq %d != snapshot seq %d", ar.LastSeq, first.Seq)
	}
	watch.catchUp(first.Seq)
	if want := watch.text(*ar.MessageID, ar.LastSeq); ar.PartialText != want || want == "" {
		t.Errorf("partial_text %q, want the deltas up to seq %d: %q", ar.PartialText, ar.LastSeq, want)
	}
	h.cancel(ack.RunID, nil)
	s.waitType(chat.EventRunCancelled, ack.RunID)
	watch.waitType(chat.EventRunCancelled, ack.RunID)
	all := watch.text(*ar.MessageID, watch.lastSeq)
	if got := ar.PartialText + s.text(*ar.MessageID, s.lastSeq); got != all {
		t.Errorf("partial_text + later deltas = %q, want %q", got, all)
	}
}

// TestSSEErrorsAreJSON: errors before streaming are JSON in the error shape.
func TestSSEErrorsAreJSON(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("")
	base := "/api/threads/" + snap.ThreadID + "/events"
	cases := []struct {
		name, path, lastEventID string
		status                  int
		code                    string
	}{
		{"unknown thread", "/api/threads/thr_00000000000000000000000000/events", "", 404, chat.CodeNotFound},
		{"run id as thread", "/api/threads/run_00000000000000000000000000/events?after_seq=0", "", 404, chat.CodeNotFound},
		{"negative after_seq", base + "?after_seq=-1", "", 400, chat.CodeInvalidRequest},
		{"after_seq not a number", base + "?after_seq=abc", "", 400, chat.CodeInvalidRequest},
		{"bad Last-Event-ID", base, "x1", 400, chat.CodeInvalidRequest},
		{"negative Last-Event-ID", base + "?after_seq=0", "-5", 400, chat.CodeInvalidRequest},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := h.with(t)
			var hdr []string
			if c.lastEventID != "" {
				hdr = []string{"Last-Event-ID", c.lastEventID}
			}
			r := h.do(http.MethodGet, c.path, nil, hdr...)
			h.wantError(t, r, c.status, c.code)
		})
	}
	h.requireUnchanged(snap)
}

// TestClientDisconnectNeverCancels: closing the event stream mid-run leaves
// the run running; a new stream from the last seen seq sees it complete.
func TestClientDisconnectNeverCancels(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 10*time.Millisecond, withKeepAlive(20*time.Millisecond))
	snap := h.createThread("")
	first := h.openSSE(snap.ThreadID, "after_seq=0", "")
	ack := h.startRun(snap.ThreadID, snap.StateVersion, "Describe how TCP congestion control works")
	seen := first.waitDeltas(ack.RunID, 3)
	msgID := seen[0].MessageID
	lastSeen := first.lastSeq
	before := first.text(msgID, lastSeen)
	first.close()

	second := h.openSSE(snap.ThreadID, "", strconv.FormatInt(lastSeen, 10))
	done := second.waitType(chat.EventRunCompleted, ack.RunID)
	if done.Seq <= lastSeen {
		t.Fatalf("run.completed at seq %d, not after %d", done.Seq, lastSeen)
	}
	var published *chat.Message
	for _, e := range second.events {
		if e.Type == chat.EventMessagePublished && e.Message.RunID != nil && *e.Message.RunID == ack.RunID {
			published = e.Message
		}
		if e.Type == chat.EventRunCancelRequested || e.Type == chat.EventRunCancelled {
			t.Errorf("the disconnect cancelled the run: %v", e)
		}
	}
	if published == nil || published.MessageID != msgID {
		t.Fatalf("no published message %s after the reconnect", msgID)
	}
	if got := before + second.text(msgID, second.lastSeq); got != published.Content {
		t.Errorf("deltas before and after the disconnect = %q, published %q", got, published.Content)
	}
	run := h.run(ack.RunID)
	if run.Status != chat.RunCompleted || run.CancelRequestedAt != nil || run.FinishedAt == nil {
		t.Errorf("run after disconnect: %+v", run)
	}
	// The run took far longer than the keep-alive interval: comments came
	// and the stream went on around them.
	if second.comments.Load() == 0 {
		t.Errorf("no keep-alive comment during a %d-event stream", len(second.events))
	}
}

// runeCount sums the characters of some deltas.
func runeCount(evs []*wireEvent) int64 {
	var n int64
	for _, e := range evs {
		n += int64(utf8.RuneCountInString(e.Text))
	}
	return n
}

// stalledSSE is an event stream whose client reads nothing after the
// headers (over stalledClient, so that the kernel holds little) until
// resume.
type stalledSSE struct {
	h               *harness
	ctx             context.Context
	cancel          context.CancelFunc
	resp            *http.Response
	threadID, query string
}

func (h *harness) openStalledSSE(threadID, query string) *stalledSSE {
	h.t.Helper()
	ctx, cancel, resp := h.requestSSE(stalledClient(h.t), threadID, query, "")
	h.t.Cleanup(func() {
		cancel()
		resp.Body.Close()
	})
	return &stalledSSE{h: h, ctx: ctx, cancel: cancel, resp: resp, threadID: threadID, query: query}
}

// resume starts reading: the returned stream has everything from the
// start, checked as openSSE's.
func (s *stalledSSE) resume() *sseStream {
	return s.h.readSSE(s.ctx, s.cancel, s.resp, s.threadID, s.query, "")
}

// streamStatus opens an event stream of the thread and returns the status
// of the answer; an accepted stream is closed at once.
func (h *harness) streamStatus(threadID string) int {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.srv.URL+"/api/threads/"+threadID+"/events?after_seq=0", nil)
	if err != nil {
		h.t.Fatal(err)
	}
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		h.t.Fatalf("open event stream: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// publishWhileStalled runs runs on the thread, watched by live, until more
// than bytes were published (as live counts them) and then for at least
// busy more, and returns the thread's state after them. Every run
// completing on live while another stream of the thread does not read is
// the proof that no stream ever makes the publisher wait.
func (h *harness) publishWhileStalled(live *sseStream, snap chat.Snapshot, bytes int, busy time.Duration) chat.Snapshot {
	h.t.Helper()
	v, total := snap.StateVersion, 0
	var filled time.Time
	for i := 0; filled.IsZero() || time.Since(filled) < busy; i++ {
		if i == 300 {
			h.t.Fatalf("%d runs published only %d bytes", i, total)
		}
		n := len(live.events)
		ack := h.startRun(snap.ThreadID, v, fmt.Sprintf("question %d about readers that stall: %s", i, strings.Repeat("stalls ", 200)))
		live.waitType(chat.EventRunCompleted, ack.RunID)
		for _, e := range live.events[n:] {
			total += len(e.Data)
		}
		v = live.lastVersion
		if filled.IsZero() && total >= bytes {
			filled = time.Now()
		}
	}
	final := h.snapshot(snap.ThreadID)
	if live.lastSeq != final.LastSeq {
		h.t.Fatalf("the reading stream is at seq %d, the thread at %d", live.lastSeq, final.LastSeq)
	}
	h.t.Logf("published %d bytes in %d events", total, final.LastSeq)
	return final
}

// resumeAfter checks the end of a stream the server gave up on: what it
// received (prefix, up to seq last) is a gap-free beginning of the thread,
// cut before its end, and a reconnect with Last-Event-ID, admitted once
// the ended stream's connection slot is free, gets exactly the rest, so
// that together they are what the stream that read everything (live) saw.
func (h *harness) resumeAfter(prefix []*wireEvent, last int64, live *sseStream, final chat.Snapshot) {
	h.t.Helper()
	if last >= final.LastSeq {
		h.t.Fatalf("the stalled stream got all %d events: the test did not stall it", final.LastSeq)
	}
	re := h.openSSEAdmitted(final.ThreadID, "after_seq=0", strconv.FormatInt(last, 10))
	got := append(prefix, re.waitSeq(final.LastSeq)...)
	if len(got) != len(live.events) {
		h.t.Fatalf("prefix (%d events, to seq %d) + reconnect = %d events, the thread has %d", len(prefix), last, len(got), len(live.events))
	}
	for i, e := range got {
		if string(e.Data) != string(live.events[i].Data) {
			h.t.Errorf("event %d after the reconnect is %s, live was %s", i+1, e, live.events[i])
		}
	}
	h.t.Logf("stalled stream cut at seq %d of %d", last, final.LastSeq)
}

// TestSSEStuckWriterIsDropped: a client that stops reading while the
// thread keeps publishing holds its stream only until a write has been
// stuck for StuckWrite. Then the handler returns: the stream ends, its
// connection slot admits a new stream, the slow close is counted. The
// publisher and a reading stream never waited for it; what it received is
// a gap-free prefix, and a reconnect with Last-Event-ID resumes exactly
// after it.
func TestSSEStuckWriterIsDropped(t *testing.T) {
	t.Parallel()
	const stuck = 200 * time.Millisecond
	ml := newMetricsLog()
	h := newHarness(t, 0, withMetrics(ml), withWS(gateway.WSConfig{StuckWrite: stuck, MaxConnsPerUser: 2,
		UserCommandRate: 1000, UserCommandBurst: 1000}))
	snap := h.createThread("")
	stalled := h.openStalledSSE(snap.ThreadID, "after_seq=0")
	live := h.openSSE(snap.ThreadID, "after_seq=0", "")
	if got := h.streamStatus(snap.ThreadID); got != http.StatusTooManyRequests {
		t.Fatalf("a third stream: status %d, want 429 while the stalled one holds its slot", got)
	}

	// More than the stalled client's path holds (a few tens of KiB with
	// its socket options; say at most 256 KiB), then the thread stays busy
	// for several times StuckWrite: by then the handler must be gone.
	final := h.publishWhileStalled(live, snap, 256<<10, 4*stuck)
	// Its write has been stuck for about 4×StuckWrite by now: the handler
	// is gone, give or take scheduling (without a deadline it never is).
	if got := ml.waitCountFor("open:sse", 1, stuck+time.Second); got != 1 {
		t.Fatalf("%d event streams counted open, want the reading one: the stuck stream was not ended", got)
	}
	if q, st, m := ml.count("slow:sse:queue_overflow"), ml.count("slow:sse:stuck_write"), ml.count("slow:sse:missed_events"); q != 0 || st != 1 || m != 0 {
		t.Errorf("slow closes counted: %d queue_overflow, %d stuck_write, %d missed_events; want 0, 1, 0", q, st, m)
	}

	// Its connection slot is free: the reconnect is admitted.
	s := stalled.resume()
	prefix, err := s.rest()
	t.Logf("the stuck stream ended with %v after %d bytes", err, dataBytes(prefix))
	h.resumeAfter(prefix, s.lastSeq, live, final)
}

// TestSSESlowStreamIsEnded: a stream that falls more than QueueBytes behind
// the live feed is ended as too slow. It is counted at once, the publisher
// never waits for it, and it holds no more than the bound meanwhile; as
// soon as its writer gets through it ends with a comment saying why. What
// it received is a gap-free prefix, and a reconnect with Last-Event-ID
// resumes exactly after it.
func TestSSESlowStreamIsEnded(t *testing.T) {
	t.Parallel()
	const queue = 32 << 10
	ml := newMetricsLog()
	h := newHarness(t, 0, withMetrics(ml), withWS(gateway.WSConfig{QueueBytes: queue, StuckWrite: time.Minute,
		MaxConnsPerUser: 2, UserCommandRate: 1000, UserCommandBurst: 1000}))
	snap := h.createThread("")
	th := snap.ThreadID
	stalled := h.openStalledSSE(th, "after_seq=0")

	// More than what the stalled client's path holds, the write its
	// handler is blocked in and the queue bound, with a wide margin, as
	// the store counts it. The runs are not watched live: a stream that
	// reads may fall 32 KiB behind for a moment too.
	ctx, user := context.Background(), chat.LocalPrincipal().UserID
	v, last, total := snap.StateVersion, snap.LastSeq, 0
	for i := 0; total < 2*queue+384<<10; i++ {
		ack := h.startRun(th, v, fmt.Sprintf("question %d about slow readers: %s", i, strings.Repeat("slow ", 1<<10)))
		if run := h.pollRun(ack.RunID); run.Status != chat.RunCompleted {
			t.Fatalf("run %s is %s", ack.RunID, run.Status)
		}
		replay, err := h.st.Events(ctx, user, th, last)
		if err != nil || !replay.Complete {
			t.Fatalf("replay after %d: %v (complete %v)", last, err, replay.Complete)
		}
		for _, ev := range replay.Events {
			total += len(ev.Raw)
		}
		v, last = replay.StateVersion, replay.LastSeq
	}
	if got := ml.waitCount("slow:sse:queue_overflow", 1); got != 1 {
		t.Fatalf("%d queue overflows counted, want 1", got)
	}
	final := h.snapshot(th)
	all := h.openSSE(th, "after_seq=0", "") // a replay: never held to the bound
	all.waitSeq(final.LastSeq)
	s := stalled.resume()
	prefix, err := s.rest()
	if err == nil || !strings.Contains(err.Error(), "ended by the server") {
		t.Errorf("the slow stream ended with %v, want the server ending it", err)
	}
	if s.comments.Load() == 0 {
		t.Errorf("the slow stream ended without a comment saying why")
	}
	if got := ml.waitCount("open:sse", 1); got != 1 {
		t.Errorf("%d event streams counted open, want the reading one", got)
	}
	if st, m := ml.count("slow:sse:stuck_write"), ml.count("slow:sse:missed_events"); st != 0 || m != 0 {
		t.Errorf("slow closes counted: %d stuck_write, %d missed_events; want none", st, m)
	}
	h.resumeAfter(prefix, s.lastSeq, all, final)
}

// TestSSELostEventsEndTheStream: when the bus reports events of the thread
// lost for good, the stream ends like one that missed an event, counted,
// and the reconnect starts over from the store.
func TestSSELostEventsEndTheStream(t *testing.T) {
	t.Parallel()
	spy := &feedSpy{}
	ml := newMetricsLog()
	h := newHarness(t, 0, withFeedSpy(spy), withMetrics(ml))
	snap := h.createThread("")
	s := h.openSSE(snap.ThreadID, "after_seq=0", "")
	s.catchUp(snap.LastSeq)
	sinks := spy.added(snap.ThreadID)
	if len(sinks) != 1 {
		t.Fatalf("%d sinks added for the thread, want the stream's one", len(sinks))
	}
	lossAware, ok := sinks[0].(bus.LossAware)
	if !ok {
		t.Fatal("an event stream is not bus.LossAware: a bus could not tell it about lost events")
	}
	if lossAware.Lost(snap.ThreadID, snap.LastSeq+1) {
		t.Error("the stream stays subscribed after losing events")
	}
	if _, err := s.rest(); err == nil || !strings.Contains(err.Error(), "ended by the server") {
		t.Errorf("the stream ended with %v, want the server ending it", err)
	}
	if got := ml.waitCount("slow:sse:missed_events", 1); got != 1 {
		t.Errorf("%d missed_events counted, want 1", got)
	}
	re := h.openSSE(snap.ThreadID, "", strconv.FormatInt(s.lastSeq, 10))
	ack := h.startRun(snap.ThreadID, snap.StateVersion, "short after the loss")
	re.waitType(chat.EventRunCompleted, ack.RunID)
}

// dataBytes sums the data lines of some events.
func dataBytes(evs []*wireEvent) int {
	n := 0
	for _, e := range evs {
		n += len(e.Data)
	}
	return n
}
