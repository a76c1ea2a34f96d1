package gateway_test

// The OpenAI Responses API (docs/openai-api.md) on the whole stack: a
// response is a run, its stream is the run's events translated and
// numbered the same way at every reading, a cancel is the protocol's with
// its receipt, previous_response_id continues (or branches) the thread,
// and everything the gateway does not do is refused by name. The real
// OpenAI SDKs drive the binary in main_responses_test.go (Go) and
// e2e/openai-sdk.test.mjs (Node).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/tools/email"
)

// oaEvent is one event of a response stream.
type oaEvent struct {
	Type string
	Seq  int64
	Raw  []byte
	M    map[string]any
}

func (e *oaEvent) str(key string) string { v, _ := e.M[key].(string); return v }

// response is the response object an event carries (response.*).
func (e *oaEvent) response(t *testing.T) oaResponse {
	t.Helper()
	var w struct{ Response oaResponse }
	if err := json.Unmarshal(e.Raw, &w); err != nil {
		t.Fatalf("%s: %v", e.Raw, err)
	}
	return w.Response
}

// oaResponse is what the tests read of a response object.
type oaResponse struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	Status             string            `json:"status"`
	Model              string            `json:"model"`
	Background         bool              `json:"background"`
	Instructions       *string           `json:"instructions"`
	Metadata           map[string]string `json:"metadata"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Output             []struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Status  string `json:"status"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Gateway struct {
		RunID        string                  `json:"run_id"`
		ThreadID     string                  `json:"thread_id"`
		Status       chat.RunStatus          `json:"status"`
		CheckpointID string                  `json:"checkpoint_id"`
		Operations   []chat.OperationOutcome `json:"operations"`
		Receipt      *struct {
			DiscardedStreamChars int64                   `json:"discarded_stream_chars"`
			PublishedMessageID   *string                 `json:"published_message_id"`
			ResumeCheckpointID   *string                 `json:"resume_checkpoint_id"`
			CancelReason         *string                 `json:"cancel_reason"`
			RequestedBy          *string                 `json:"requested_by"`
			Operations           []chat.OperationOutcome `json:"operations"`
		} `json:"receipt"`
	} `json:"gateway"`
}

func (r oaResponse) text() string {
	var b strings.Builder
	for _, o := range r.Output {
		for _, c := range o.Content {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// oaStream reads a response stream; every read is bounded by the
// request's deadline (waitTimeout).
type oaStream struct {
	t      *testing.T
	cancel context.CancelFunc
	body   io.ReadCloser
	r      *bufio.Reader
}

// openResponseStream sends a request that answers a response stream.
func (h *harness) openResponseStream(method, path string, body any) *oaStream {
	h.t.Helper()
	var rd io.Reader
	if body != nil {
		j, _ := json.Marshal(body)
		rd = bytes.NewReader(j)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	req, err := http.NewRequestWithContext(ctx, method, h.srv.URL+path, rd)
	if err != nil {
		cancel()
		h.t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json") // what the OpenAI SDKs send
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		cancel()
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		h.t.Fatalf("%s %s: %d %s %s, want a 200 event stream", method, path, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	s := &oaStream{t: h.t, cancel: cancel, body: resp.Body, r: bufio.NewReader(resp.Body)}
	h.t.Cleanup(s.close)
	return s
}

// next is the next event, or nil at the end of the stream.
func (s *oaStream) next() *oaEvent {
	s.t.Helper()
	var ev oaEvent
	for {
		line, err := s.r.ReadString('\n')
		if err == io.EOF && line == "" {
			return nil
		}
		if err != nil && err != io.EOF {
			s.t.Fatalf("read response stream: %v", err)
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "" && ev.Raw != nil:
			if err := json.Unmarshal(ev.Raw, &ev.M); err != nil {
				s.t.Fatalf("event data %s: %v", ev.Raw, err)
			}
			if got := ev.str("type"); got != ev.Type {
				s.t.Errorf("event: %s carries type %q", ev.Type, got)
			}
			seq, _ := ev.M["sequence_number"].(float64)
			ev.Seq = int64(seq)
			return &ev
		case strings.HasPrefix(line, "event: "):
			ev.Type = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.Raw = []byte(strings.TrimPrefix(line, "data: "))
		}
	}
}

// until reads up to and including the first event pred accepts.
func (s *oaStream) until(what string, pred func(*oaEvent) bool) []*oaEvent {
	s.t.Helper()
	var out []*oaEvent
	for {
		ev := s.next()
		if ev == nil {
			s.t.Fatalf("the stream ended before %s; it had %d events", what, len(out))
		}
		out = append(out, ev)
		if pred(ev) {
			return out
		}
	}
}

// rest reads to the end of the stream.
func (s *oaStream) rest() []*oaEvent {
	s.t.Helper()
	var out []*oaEvent
	for ev := s.next(); ev != nil; ev = s.next() {
		out = append(out, ev)
	}
	return out
}

func (s *oaStream) close() {
	s.cancel()
	s.body.Close()
}

func terminal(e *oaEvent) bool {
	switch e.Type {
	case "response.completed", "response.incomplete", "response.failed", "response.cancelled":
		return true
	}
	return false
}

// wantNumbered requires the events to be numbered from first on, one by
// one: no duplicate, no gap.
func wantNumbered(t *testing.T, evs []*oaEvent, first int64) {
	t.Helper()
	for i, e := range evs {
		if e.Seq != first+int64(i) {
			t.Fatalf("event %d (%s) has sequence_number %d, want %d", i, e.Type, e.Seq, first+int64(i))
		}
	}
}

func deltaText(evs []*oaEvent) string {
	var b strings.Builder
	for _, e := range evs {
		if e.Type == "response.output_text.delta" {
			b.WriteString(e.str("delta"))
		}
	}
	return b.String()
}

func (h *harness) getResponse(id string) oaResponse {
	h.t.Helper()
	var r oaResponse
	h.call(http.MethodGet, "/v1/responses/"+id, nil, http.StatusOK, &r)
	return r
}

// TestResponsesStreamResumesExactly: a background response streamed,
// dropped after a few deltas and resumed with starting_after gives every
// event once, numbered without a gap; its deltas make exactly the
// published text; and reading the whole stream again after the end gives
// the very same events, byte for byte.
func TestResponsesStreamResumesExactly(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 2*time.Millisecond)
	s := h.openResponseStream(http.MethodPost, "/v1/responses", map[string]any{
		"model": "demo", "input": "Explain how lighthouses were kept lit", "background": true, "stream": true,
		"metadata": map[string]string{"ticket": "42"}})
	deltas := 0
	first := s.until("three deltas", func(e *oaEvent) bool {
		if e.Type == "response.output_text.delta" {
			deltas++
		}
		return deltas == 3
	})
	s.close() // a dropped stream cancels nothing
	if first[0].Type != "response.created" || first[0].Seq != 0 {
		t.Fatalf("the stream starts with %s #%d, want response.created #0", first[0].Type, first[0].Seq)
	}
	created := first[0].response(t)
	if created.Status != "queued" && created.Status != "in_progress" || !created.Background || created.Metadata["ticket"] != "42" ||
		!strings.HasPrefix(created.ID, "resp_run_") || created.Model != "demo" {
		t.Fatalf("response.created carries %+v", created)
	}
	last := first[len(first)-1].Seq
	rest := h.openResponseStream(http.MethodGet, "/v1/responses/"+created.ID+"?stream=true&starting_after="+itoa(last), nil).rest()
	all := append(append([]*oaEvent{}, first...), rest...)
	wantNumbered(t, all, 0)
	if end := all[len(all)-1]; end.Type != "response.completed" {
		t.Fatalf("the stream ends with %s, want response.completed", end.Raw)
	}
	final := h.getResponse(created.ID)
	if final.Status != "completed" || len(final.Output) != 1 || final.text() == "" || deltaText(all) != final.text() {
		t.Fatalf("deltas %q, response %+v: want one output message of exactly the deltas", deltaText(all), final)
	}
	snap := h.snapshot(final.Gateway.ThreadID)
	if n := len(snap.Messages); n != 2 || snap.Messages[1].Content != final.text() || snap.Messages[0].Content != "Explain how lighthouses were kept lit" {
		t.Fatalf("the thread holds %+v", snap.Messages)
	}
	if run := h.run(final.Gateway.RunID); run.Status != chat.RunCompleted || run.CancelRequestedAt != nil {
		t.Fatalf("run %+v: the dropped stream must not have cancelled it", run)
	}

	// Read again from the start, and from the middle: the same events.
	again := h.openResponseStream(http.MethodGet, "/v1/responses/"+created.ID+"?stream=true", nil).rest()
	if len(again) != len(all) {
		t.Fatalf("the whole stream read again has %d events, first %d", len(again), len(all))
	}
	for i := range all {
		if !bytes.Equal(again[i].Raw, all[i].Raw) && all[i].Type != "response.completed" {
			t.Fatalf("event %d read again:\n%s\nfirst:\n%s", i, again[i].Raw, all[i].Raw)
		}
	}
	// The Go SDK sends stream in a JSON body of the GET.
	r := h.do(http.MethodGet, "/v1/responses/"+created.ID+"?starting_after="+itoa(int64(len(all)-2)), nil)
	if r.status != http.StatusBadRequest {
		t.Fatalf("starting_after without stream: %v, want 400", r)
	}
	tail := h.openResponseStream(http.MethodGet, "/v1/responses/"+created.ID+"?starting_after="+itoa(int64(len(all)-2)), map[string]any{"stream": true}).rest()
	if len(tail) != 1 || tail[0].Seq != int64(len(all)-1) || !terminal(tail[0]) {
		t.Fatalf("the stream after %d is %v, want the terminal event alone", len(all)-2, tail)
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

// TestResponsesCancelMidStream: a cancel while the response streams is the
// protocol's cancel: the stream ends with response.cancelled, nothing was
// published (no .done event), and the receipt in the gateway field says
// what GET /api/runs/{id} says.
func TestResponsesCancelMidStream(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	release := h.model.hold() // the reply stops after its first chunk until released
	defer release()
	s := h.openResponseStream(http.MethodPost, "/v1/responses", map[string]any{
		"model": "demo", "input": "Tell me about the history of lighthouses", "stream": true})
	evs := s.until("a delta", func(e *oaEvent) bool { return e.Type == "response.output_text.delta" })
	id := evs[0].response(t).ID

	var cancelled oaResponse
	h.call(http.MethodPost, "/v1/responses/"+id+"/cancel", nil, http.StatusOK, &cancelled)
	evs = append(evs, s.rest()...)
	wantNumbered(t, evs, 0)
	end := evs[len(evs)-1]
	if end.Type != "response.cancelled" {
		t.Fatalf("the stream ends with %s, want response.cancelled", end.Raw)
	}
	for _, e := range evs {
		if strings.HasSuffix(e.Type, ".done") {
			t.Errorf("a cancelled response streamed %s", e.Raw)
		}
	}
	run := h.run(cancelled.Gateway.RunID)
	for what, r := range map[string]oaResponse{"cancel": cancelled, "stream": end.response(t), "retrieve": h.getResponse(id)} {
		rc := r.Gateway.Receipt
		if r.Status != "cancelled" || r.Gateway.Status != chat.RunCancelled || rc == nil || len(r.Output) != 0 {
			t.Fatalf("%s: %+v, want cancelled with a receipt and no output", what, r)
		}
		if rc.DiscardedStreamChars != run.DiscardedStreamChars || rc.DiscardedStreamChars != int64(len([]rune(deltaText(evs)))) ||
			*rc.ResumeCheckpointID != *run.ResumeCheckpointID || *rc.CancelReason != *run.CancelReason || *rc.RequestedBy != "api:http" {
			t.Errorf("%s: receipt %+v, run %+v, streamed %q", what, rc, run, deltaText(evs))
		}
	}
	// Cancelling again answers the same; a completed response cannot be.
	var again oaResponse
	h.call(http.MethodPost, "/v1/responses/"+id+"/cancel", nil, http.StatusOK, &again)
	if again.Status != "cancelled" {
		t.Errorf("a second cancel: %+v", again)
	}
}

// TestResponsesContinueAndBranch: previous_response_id continues the
// thread from where that response ended (its context holds the earlier
// turns), a response continuing one that is no longer the head branches,
// instructions reach the run's input, and a cancelled response continued
// without input re-runs its pending step.
func TestResponsesContinueAndBranch(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	var r1, r2, r3 oaResponse
	h.call(http.MethodPost, "/v1/responses", map[string]any{"model": "demo", "input": "first question about tides"}, http.StatusOK, &r1)
	if r1.Status != "completed" || r1.text() == "" {
		t.Fatalf("a response that neither streams nor runs in the background answers when it ends: %+v", r1)
	}
	h.call(http.MethodPost, "/v1/responses", map[string]any{"model": "demo", "input": "second question about waves",
		"previous_response_id": r1.ID, "instructions": "Answer in one sentence."}, http.StatusOK, &r2)
	if r2.Gateway.ThreadID != r1.Gateway.ThreadID || *r2.PreviousResponseID != r1.ID || *r2.Instructions != "Answer in one sentence." {
		t.Fatalf("the continuation %+v of %+v", r2, r1)
	}
	if in, err := h.st.RunInput(context.Background(), r2.Gateway.RunID); err != nil || in.Instructions != "Answer in one sentence." {
		t.Fatalf("the continuation's input: %+v, %v", in, err)
	}
	if in, err := h.st.RunInput(context.Background(), r1.Gateway.RunID); err != nil || in.Instructions != "" {
		t.Fatalf("instructions are the run's own: r1's input has %q, %v", in.Instructions, err)
	}
	texts := func(ms []chat.Message) []string {
		var out []string
		for _, m := range ms {
			out = append(out, m.Content)
		}
		return out
	}
	want := []string{"first question about tides", r1.text(), "second question about waves", r2.text()}
	if got := texts(h.snapshot(r1.Gateway.ThreadID).Messages); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("the thread after the continuation: %q, want %q", got, want)
	}
	// r1 is no longer the head: continuing it again makes a branch.
	h.call(http.MethodPost, "/v1/responses", map[string]any{"model": "demo", "input": "another take on tides",
		"previous_response_id": r1.ID}, http.StatusOK, &r3)
	want = []string{"first question about tides", r1.text(), "another take on tides", r3.text()}
	if got := texts(h.snapshot(r1.Gateway.ThreadID).Messages); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("the thread after the branch: %q, want %q", got, want)
	}
	var branchBase *chat.Checkpoint
	for _, cp := range h.checkpoints(r1.Gateway.ThreadID).Checkpoints {
		if cp.CheckpointID == h.run(r3.Gateway.RunID).BaseCheckpointID {
			branchBase = &cp
		}
	}
	if branchBase == nil || branchBase.ParentCheckpointID == nil || *branchBase.ParentCheckpointID != r1.Gateway.CheckpointID {
		t.Fatalf("the branch starts at %+v, want a child of r1's checkpoint %s", branchBase, r1.Gateway.CheckpointID)
	}

	// A cancelled response continued without input regenerates its step.
	release := h.model.hold()
	s := h.openResponseStream(http.MethodPost, "/v1/responses", map[string]any{"model": "demo", "input": "a long story about ships",
		"previous_response_id": r3.ID, "stream": true})
	evs := s.until("a delta", func(e *oaEvent) bool { return e.Type == "response.output_text.delta" })
	var stopped, resumed oaResponse
	h.call(http.MethodPost, "/v1/responses/"+evs[0].response(t).ID+"/cancel", nil, http.StatusOK, &stopped)
	release()
	h.model.free()
	h.call(http.MethodPost, "/v1/responses", map[string]any{"model": "demo", "previous_response_id": stopped.ID}, http.StatusOK, &resumed)
	msgs := h.snapshot(r1.Gateway.ThreadID).Messages
	if resumed.Status != "completed" || msgs[len(msgs)-2].Content != "a long story about ships" || msgs[len(msgs)-1].Content != resumed.text() {
		t.Fatalf("continuing the cancelled response: %+v, thread %q", resumed, texts(msgs))
	}
}

// TestResponsesRefusals: what the gateway does not do is refused with a
// 400 naming the parameter (never ignored), an unknown model as OpenAI
// does, ids that are not the caller's as unknown ones; every refusal in
// OpenAI's error shape with the protocol's code, not to be retried.
func TestResponsesRefusals(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	var done oaResponse
	h.call(http.MethodPost, "/v1/responses", map[string]any{"model": "demo", "input": "hello"}, http.StatusOK, &done)
	ok := map[string]any{"model": "demo", "input": "hello"}
	with := func(k string, v any) map[string]any {
		m := map[string]any{}
		for k, v := range ok {
			m[k] = v
		}
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	for _, tc := range []struct {
		name, method, path string
		body               any
		status             int
		code, param        string
	}{
		{"unknown model", "POST", "/v1/responses", with("model", "gpt-5"), 404, "model_not_found", "model"},
		{"no model", "POST", "/v1/responses", with("model", nil), 400, "invalid_request", "model"},
		{"temperature", "POST", "/v1/responses", with("temperature", 0.2), 400, "invalid_request", "temperature"},
		{"tools", "POST", "/v1/responses", with("tools", []any{}), 400, "invalid_request", "tools"},
		{"store false", "POST", "/v1/responses", with("store", false), 400, "invalid_request", "store"},
		{"no input", "POST", "/v1/responses", with("input", nil), 400, "invalid_request", "input"},
		{"two input items", "POST", "/v1/responses", with("input", []any{map[string]any{"role": "user", "content": "a"},
			map[string]any{"role": "user", "content": "b"}}), 400, "invalid_request", "input"},
		{"a system item", "POST", "/v1/responses", with("input", []any{map[string]any{"role": "system", "content": "a"}}), 400, "invalid_request", "input[0].role"},
		{"an image", "POST", "/v1/responses", with("input", []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "input_image", "image_url": "https://example.com/a.png"}}}}), 400, "invalid_request", "input[0].content[0]"},
		{"input too long", "POST", "/v1/responses", with("input", strings.Repeat("a", chat.MaxUserMessageBytes+1)), 400, "invalid_request", "input"},
		{"metadata not strings", "POST", "/v1/responses", with("metadata", map[string]any{"n": 1}), 400, "invalid_request", "metadata"},
		{"background not a flag", "POST", "/v1/responses", with("background", "yes"), 400, "invalid_request", "background"},
		{"a key twice", "POST", "/v1/responses", `{"model":"demo","input":"a","input":"b"}`, 400, "invalid_request", ""},
		{"unknown previous", "POST", "/v1/responses", with("previous_response_id", "resp_run_0000000000000000000000"), 404, "not_found", "previous_response_id"},
		{"not a response id", "POST", "/v1/responses", with("previous_response_id", "msg_1"), 404, "not_found", "previous_response_id"},
		{"unknown response", "GET", "/v1/responses/resp_run_0000000000000000000000", nil, 404, "not_found", ""},
		{"a run id", "GET", "/v1/responses/" + done.Gateway.RunID, nil, 404, "not_found", ""},
		{"include", "GET", "/v1/responses/" + done.ID + "?include[]=reasoning.encrypted_content", nil, 400, "invalid_request", "include[]"},
		{"obfuscation", "GET", "/v1/responses/" + done.ID + "?stream=true&include_obfuscation=true", nil, 400, "invalid_request", "include_obfuscation"},
		{"cancel a completed one", "POST", "/v1/responses/" + done.ID + "/cancel", nil, 409, "run_not_active", ""},
		{"cancel with a body", "POST", "/v1/responses/" + done.ID + "/cancel", map[string]any{"reason": "x"}, 400, "invalid_request", ""},
		{"delete", "DELETE", "/v1/responses/" + done.ID, nil, 404, "not_found", ""},
		{"another model", "GET", "/v1/models/gpt-5", nil, 404, "model_not_found", "model"},
	} {
		r := h.do(tc.method, tc.path, tc.body)
		var body struct {
			Error *struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Param   *string `json:"param"`
				Code    string  `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(r.body, &body); err != nil || r.status != tc.status || body.Error == nil || body.Error.Code != tc.code ||
			body.Error.Message == "" || body.Error.Type != "invalid_request_error" {
			t.Errorf("%s: %v, want %d %s in OpenAI's error shape", tc.name, r, tc.status, tc.code)
			continue
		}
		if param := body.Error.Param; (tc.param == "") != (param == nil) || (param != nil && *param != tc.param) {
			t.Errorf("%s: param %v, want %q", tc.name, param, tc.param)
		}
		if r.header.Get("X-Should-Retry") != "false" {
			t.Errorf("%s: X-Should-Retry %q, want false", tc.name, r.header.Get("X-Should-Retry"))
		}
	}
	var models struct {
		Data []struct{ ID, Object string }
	}
	h.call(http.MethodGet, "/v1/models", nil, http.StatusOK, &models)
	if len(models.Data) != 1 || models.Data[0].ID != "demo" || models.Data[0].Object != "model" {
		t.Errorf("GET /v1/models: %+v", models)
	}
	if snap := h.snapshot(done.Gateway.ThreadID); len(snap.Messages) != 2 {
		t.Errorf("a refused request changed the thread: %+v", snap.Messages)
	}
}

// TestResponsesToolsAndConfirmation: a response whose run calls the
// gateway's tools streams and outputs the assistant's messages only (the
// tool calls are in the gateway field); one that waits for a confirmation
// is answered in_progress, waiting_confirmation, with the prepared call;
// cancelled, its receipt says the intent was voided and nothing was sent.
func TestResponsesToolsAndConfirmation(t *testing.T) {
	t.Parallel()
	h := newToolHarness(t, time.Millisecond, email.OutboxConfig{})
	evs := h.openResponseStream(http.MethodPost, "/v1/responses", map[string]any{
		"model": "demo", "input": "Search the catalog for a coffee grinder", "stream": true}).rest()
	wantNumbered(t, evs, 0)
	search := evs[len(evs)-1].response(t)
	if search.Status != "completed" || len(search.Output) != 2 || deltaText(evs) != search.text() ||
		len(search.Gateway.Operations) != 1 || search.Gateway.Operations[0].Tool != "catalog_search" ||
		search.Gateway.Operations[0].Outcome != chat.OutcomeCompleted {
		t.Fatalf("a response with a tool call: %s", evs[len(evs)-1].Raw)
	}

	var waiting, stopped oaResponse
	h.call(http.MethodPost, "/v1/responses", map[string]any{"model": "demo",
		"input": "Please send an email to ann@example.com about the delivery schedule"}, http.StatusOK, &waiting)
	ops := waiting.Gateway.Operations
	if waiting.Status != "in_progress" || waiting.Gateway.Status != chat.RunWaitingConfirmation || len(ops) != 1 ||
		ops[0].Tool != "send_email" || ops[0].Phase != chat.PhasePrepared {
		t.Fatalf("a response waiting for a confirmation: %+v", waiting)
	}
	h.call(http.MethodPost, "/v1/responses/"+waiting.ID+"/cancel", nil, http.StatusOK, &stopped)
	rc := stopped.Gateway.Receipt
	if stopped.Status != "cancelled" || rc == nil || len(rc.Operations) != 1 || rc.Operations[0].Phase != chat.PhaseVoided ||
		rc.Operations[0].Outcome != chat.OutcomeNotStarted {
		t.Fatalf("the cancelled confirmation: %+v", stopped)
	}
	if n := len(h.attempts("")); n != 0 {
		t.Errorf("the provider saw %d calls", n)
	}
}
