package gateway

// The stream of a response (docs/openai-api.md, "Streaming"): the
// thread's event stream (follow, events.go) from the run's run.started,
// translated into the Responses API's events. The translation is a
// function of the run's events alone, in seq order, so every reading of
// the stream — live, or resumed with starting_after long after — numbers
// the same events the same way: sequence_number counts the events this
// translation emits from the run's start (0, 1, 2, …, no gap), and
// starting_after=N writes those after N. Text is never made up: each
// response.output_text.delta is one of the run's deltas, each
// response.output_text.done one of its published messages, and the
// terminal event carries the response as GET /v1/responses/{id} reads it
// from the store at that moment (with the cancel's receipt).

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// streamGone answers a stream whose beginning the gateway no longer holds.
func streamGone(runID string) error {
	return chat.Errorf(chat.CodeFragmentUnavailable, "the stream of response %s is no longer held (streamed text is kept for the "+
		"stream buffer's TTL, -stream-ttl): retrieve the response without stream=true for its output", chat.ResponseID(runID))
}

// streamResponse streams the response of run runID (the caller's) from
// its run.started, writing the events numbered after after (-1: all),
// until its terminal event. Like a thread's event stream it holds one of
// the user's connection slots, re-checks the credential at every
// keep-alive and is ended when it falls behind or reaches MaxConnAge: a
// client then resumes with starting_after. A dropped stream cancels
// nothing.
func (s *Server) streamResponse(w http.ResponseWriter, r *http.Request, runID string, after int64) {
	leave, err := s.openStream(w, r)
	if err != nil {
		writeOpenAIError(w, s.log, err)
		return
	}
	defer leave()
	s.streamOpened(w, r, runID, after)
}

// openStream takes one of the caller's connection slots for a long answer
// (a stream, or a create that waits for its run) and checks that the
// answer's writes can be bounded, before anything is done: a create
// refused here has started nothing. leave gives the slot back.
func (s *Server) openStream(w http.ResponseWriter, r *http.Request) (leave func(), err error) {
	user := userID(r)
	if err := s.limits.join(user); err != nil {
		s.metrics.ConnRefused(transportSSE)
		return nil, err
	}
	// A response whose writes cannot be bounded is not streamed: a client
	// that stopped reading would hold it for ever.
	if err := http.NewResponseController(w).SetWriteDeadline(time.Time{}); err != nil {
		s.limits.leave(user)
		return nil, fmt.Errorf("response stream: the response cannot take a write deadline: %w", err)
	}
	return func() { s.limits.leave(user) }, nil
}

// streamOpened is streamResponse once openStream succeeded.
func (s *Server) streamOpened(w http.ResponseWriter, r *http.Request, runID string, after int64) {
	ctx := r.Context()
	principal, _ := chat.PrincipalFromContext(ctx)
	user := principal.UserID
	rc := http.NewResponseController(w)
	rec, err := s.store.Response(ctx, user, runID)
	if err == nil && rec.StartSeq == 0 {
		err = streamGone(runID)
	}
	if err != nil {
		writeOpenAIError(w, s.log, err)
		return
	}
	// Subscribe before reading the store, as a thread's event stream does.
	thread := rec.Run.ThreadID
	feed := newSSEFeed(s.ws.cfg.QueueBytes, s.metrics)
	s.feed.Add(thread, feed)
	defer s.feed.Remove(thread, feed)
	first, err := s.catchUp(ctx, user, thread, rec.StartSeq-1)
	if err == nil && !first.recovered {
		err = streamGone(runID)
	}
	if err != nil {
		writeOpenAIError(w, s.log, err)
		return
	}

	sseHeaders(w.Header())
	s.metrics.ConnOpened(transportSSE)
	defer s.metrics.ConnClosed(transportSSE)
	w.WriteHeader(http.StatusOK)
	out := &sseWriter{rc: rc, buf: bufio.NewWriter(w), stuck: s.ws.cfg.StuckWrite}
	defer out.finish()
	rs := &responseStream{s: s, ctx: ctx, user: user, runID: runID, head: s.responseHead(rec), after: after, items: map[string]int{}}
	s.follow(ctx, principal, chat.NewID("sse_"), feed, out, first, rs)
}

// responseStream translates one run's events into the Responses API's
// (a streamSink). Owned by the stream's handler goroutine.
type responseStream struct {
	s     *Server
	ctx   context.Context
	user  string
	runID string
	head  responseObject // the response's unchanging part (responseHead)
	after int64          // write the events numbered above it only

	next     int64          // the next event's sequence_number
	started  bool           // response.created was emitted
	running  bool           // response.in_progress was emitted
	items    map[string]int // output_index of every message streamed or published
	finished map[string]bool
	frames   [][]byte // what write writes next
}

// wireEvent is what the translation reads of a protocol event.
type wireEvent struct {
	RunID     string         `json:"run_id"`
	Status    chat.RunStatus `json:"status"`     // run.started
	MessageID string         `json:"message_id"` // message.delta
	Text      string         `json:"text"`       // message.delta
	Message   *chat.Message  `json:"message"`    // message.published
}

func (t *responseStream) write(out *sseWriter, evs []*chat.Event) (bool, error) {
	done := false
	for _, ev := range evs {
		var err error
		if done, err = t.event(ev); err != nil {
			return false, err
		}
		if done {
			break
		}
	}
	err := out.frames(t.frames)
	t.frames = t.frames[:0]
	return done, err
}

func (t *responseStream) resume() string {
	return "resume with starting_after (the last sequence_number received)"
}

// writeError writes err as OpenAI's error event: its fields at the top
// level, and once more as "error", which the OpenAI SDKs raise. It has no
// sequence_number: it is not one of the response's events.
func (t *responseStream) writeError(b *bufio.Writer, err error) {
	_, body := OpenAIErrorBody(err, t.s.log)
	inner := body["error"].(map[string]any)
	data, _ := json.Marshal(map[string]any{"type": "error", "code": inner["code"], "message": inner["message"],
		"param": inner["param"], "error": inner})
	b.WriteString("event: error\ndata: ")
	b.Write(data)
	b.WriteString("\n\n")
}

// event translates one event of the thread; done once the response's
// terminal event was emitted.
func (t *responseStream) event(ev *chat.Event) (bool, error) {
	if ev.Type == chat.EventThreadDeleted {
		return true, nil // its run ended before it; nothing follows
	}
	var w wireEvent
	if err := json.Unmarshal(ev.Raw, &w); err != nil {
		return false, fmt.Errorf("response stream: read event %d of thread %s: %w", ev.Seq, ev.ThreadID, err)
	}
	if w.RunID != t.runID {
		return false, nil
	}
	switch ev.Type {
	case chat.EventRunStarted:
		t.start(w.Status)
	case chat.EventMessageDelta:
		t.inProgress()
		idx := t.item(w.MessageID)
		t.emit("response.output_text.delta", map[string]any{"item_id": w.MessageID, "output_index": idx, "content_index": 0,
			"delta": w.Text, "logprobs": []any{}})
	case chat.EventMessagePublished:
		m := w.Message
		if m == nil || m.Role != chat.RoleAssistant || t.finished[m.MessageID] {
			return false, nil
		}
		t.inProgress()
		idx := t.item(m.MessageID)
		item := messageItem(*m, "completed")
		t.emit("response.output_text.done", map[string]any{"item_id": m.MessageID, "output_index": idx, "content_index": 0,
			"text": m.Content, "logprobs": []any{}})
		t.emit("response.content_part.done", map[string]any{"item_id": m.MessageID, "output_index": idx, "content_index": 0,
			"part": item.Content[0]})
		t.emit("response.output_item.done", map[string]any{"output_index": idx, "item": item})
		if t.finished == nil {
			t.finished = map[string]bool{}
		}
		t.finished[m.MessageID] = true
	case chat.EventToolPrepared, chat.EventToolUpdated, chat.EventRunWaitingConfirmation:
		t.inProgress()
	case chat.EventRunCompleted, chat.EventRunFailed, chat.EventRunCancelled:
		return true, t.end(ev.Type)
	}
	return false, nil
}

// start emits response.created and the status the run started in.
func (t *responseStream) start(status chat.RunStatus) {
	if t.started {
		return // a run re-queued after a crash starts again: one response
	}
	t.started = true
	if status == chat.RunQueued {
		t.emit("response.created", map[string]any{"response": t.snapshot(chat.RunQueued)})
		t.emit("response.queued", map[string]any{"response": t.snapshot(chat.RunQueued)})
		return
	}
	t.running = true
	t.emit("response.created", map[string]any{"response": t.snapshot(chat.RunRunning)})
	t.emit("response.in_progress", map[string]any{"response": t.snapshot(chat.RunRunning)})
}

// inProgress emits response.in_progress before the first sign that a
// worker executes the run (a claim itself is no event).
func (t *responseStream) inProgress() {
	t.start(chat.RunRunning)
	if !t.running {
		t.running = true
		t.emit("response.in_progress", map[string]any{"response": t.snapshot(chat.RunRunning)})
	}
}

// item is the output_index of a message, announced (output_item.added,
// content_part.added) the first time the message is seen.
func (t *responseStream) item(messageID string) int {
	if idx, ok := t.items[messageID]; ok {
		return idx
	}
	idx := len(t.items)
	t.items[messageID] = idx
	t.emit("response.output_item.added", map[string]any{"output_index": idx, "item": outputItem{ID: messageID, Type: "message",
		Status: "in_progress", Role: chat.RoleAssistant, Content: []outputText{}}})
	t.emit("response.content_part.added", map[string]any{"item_id": messageID, "output_index": idx, "content_index": 0,
		"part": outputText{Type: "output_text", Text: "", Annotations: []any{}}})
	return idx
}

// end emits the terminal event: the response as the store has it now,
// named by its status. A message streamed but never published gets no
// .done events: the response's output holds only what was published, and
// the receipt counts the rest (discarded_stream_chars).
func (t *responseStream) end(evType string) error {
	rec, err := t.s.store.Response(t.ctx, t.user, t.runID)
	if err != nil {
		if t.ctx.Err() == nil {
			t.s.log.Warn("response stream: read the ended response", "run_id", t.runID, "err", err)
		}
		return err // the stream ends without it: the client resumes
	}
	o := t.s.responseObject(rec)
	typ := map[string]string{chat.EventRunCompleted: "response.completed", chat.EventRunFailed: "response.failed",
		chat.EventRunCancelled: "response.cancelled"}[evType]
	if o.Status == "incomplete" {
		typ = "response.incomplete"
	}
	t.emit(typ, map[string]any{"response": o})
	return nil
}

// snapshot is the response as it stands early in its stream: nothing
// output yet, the run queued or running.
func (t *responseStream) snapshot(status chat.RunStatus) responseObject {
	o := t.head
	o.Status, o.Gateway.Status = "queued", status
	if status != chat.RunQueued {
		o.Status = "in_progress"
	}
	return o
}

// emit numbers one event and keeps its frame when it comes after
// starting_after.
func (t *responseStream) emit(typ string, fields map[string]any) {
	seq := t.next
	t.next++
	if seq <= t.after {
		return
	}
	fields["type"], fields["sequence_number"] = typ, seq
	data, err := json.Marshal(fields)
	if err != nil { // the fields are the gateway's own types
		t.s.log.Error("encode a response event", "type", typ, "err", err)
		return
	}
	frame := make([]byte, 0, len(typ)+len(data)+16)
	frame = append(frame, "event: "...)
	frame = append(frame, typ...)
	frame = append(frame, "\ndata: "...)
	frame = append(frame, data...)
	frame = append(frame, "\n\n"...)
	t.frames = append(t.frames, frame)
}

var _ streamSink = (*responseStream)(nil)
