package gateway_test

// A reader of a thread's Server-Sent Events stream for the tests (sseStream)
// and the harness methods that open one, with observe, which checks every
// event against the protocol.

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

	"github.com/honestcancel/gateway/chat"
)

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
