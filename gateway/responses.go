package gateway

// The OpenAI Responses API (docs/openai-api.md): a thin adapter over the
// runs of the protocol, for programs that already speak OpenAI's API. A
// response is a run on a thread, its id the run's behind "resp_"; creating
// one is a run.start (on a new thread, or continuing the thread of
// previous_response_id from the checkpoint that response ended on),
// retrieving it reads the run, cancelling it is run.cancel, and its stream
// is the thread's event stream from the run's run.started, translated
// (responses_stream.go). Nothing here executes anything: the engine does,
// exactly as for /api. Errors are the protocol's, in OpenAI's shape
// (writeOpenAIError).

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// openAIRoutes registers the /v1 routes. Their refusals (credentials,
// cross-site requests, the command budget) are in OpenAI's error shape.
func (s *Server) openAIRoutes(mux *http.ServeMux) {
	read := func(h http.HandlerFunc) http.Handler { return s.authedAs(writeOpenAIError, h) }
	changing := func(cancel bool, h http.HandlerFunc) http.Handler {
		return s.authedAs(writeOpenAIError, s.guardAs(writeOpenAIError, s.limitedAs(writeOpenAIError, cancel, h)))
	}
	mux.Handle("GET /v1/models", read(s.listModels))
	mux.Handle("GET /v1/models/{model}", read(s.getModel))
	mux.Handle("POST /v1/responses", changing(false, s.createResponse))
	mux.Handle("GET /v1/responses/{id}", read(s.getResponse))
	mux.Handle("POST /v1/responses/{id}/cancel", changing(true, s.cancelResponse))
	mux.Handle("/v1/", read(func(w http.ResponseWriter, r *http.Request) {
		writeOpenAIError(w, s.log, chat.Errorf(chat.CodeNotFound,
			"no endpoint %s %s: this gateway serves POST /v1/responses, GET /v1/responses/{id}, "+
				"POST /v1/responses/{id}/cancel and GET /v1/models of the OpenAI API (docs/openai-api.md)",
			r.Method, quoteShort(r.URL.Path)))
	}))
}

// ---- models ----

type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (s *Server) modelObject() modelObject {
	return modelObject{ID: s.model, Object: "model", Created: s.started.Unix(), OwnedBy: "gateway"}
}

func (s *Server) listModels(w http.ResponseWriter, r *http.Request) {
	data := []modelObject{}
	if s.model != "" {
		data = append(data, s.modelObject())
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

func (s *Server) getModel(w http.ResponseWriter, r *http.Request) {
	if err := s.checkModel(r.PathValue("model")); err != nil {
		writeOpenAIError(w, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, s.modelObject())
}

// checkModel refuses a model the gateway does not serve, as OpenAI does
// (404 model_not_found, naming the parameter).
func (s *Server) checkModel(name string) error {
	if s.model != "" && name == s.model {
		return nil
	}
	served := "no model"
	if s.model != "" {
		served = strconv.Quote(s.model)
	}
	return chat.Errorf(chat.CodeNotFound, "the model %s does not exist on this gateway: it serves %s (GET /v1/models lists it)",
		quoteShort(name), served).With(fieldParam, "model").With(openAICode, "model_not_found")
}

// ---- create ----

// createRequest is a POST /v1/responses body, checked (parseCreate).
type createRequest struct {
	model        string
	input        *string // nil: continue previous_response_id's pending step
	instructions string
	previous     string
	background   bool
	stream       bool
	metadata     map[string]string
}

// createParams are the parameters of OpenAI's create that the gateway
// takes; any other is refused by name, never ignored.
var createParams = []string{"background", "input", "instructions", "metadata", "model", "previous_response_id", "store", "stream"}

// invalidParam is invalid_request naming the parameter at fault.
func invalidParam(param, format string, args ...any) *chat.Error {
	return chat.Invalid(format, args...).With(fieldParam, param)
}

// parseCreate reads a create's body: one JSON object, no key twice,
// every key one of createParams (null meaning absent), each of its
// documented type.
func parseCreate(body []byte) (createRequest, error) {
	var req createRequest
	fields, err := jsonObject(body)
	if err != nil {
		return req, err
	}
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		if !slices.Contains(createParams, k) {
			return req, invalidParam(k, "unsupported parameter %s: this gateway's Responses API takes %s (docs/openai-api.md says what each does)",
				quoteShort(k), strings.Join(createParams, ", "))
		}
	}
	present := func(k string) bool { v, ok := fields[k]; return ok && string(v) != "null" }
	str := func(k string, dst *string) error {
		if present(k) && json.Unmarshal(fields[k], dst) != nil {
			return invalidParam(k, "%s must be a string", k)
		}
		return nil
	}
	flag := func(k string, dst *bool) error {
		if present(k) && json.Unmarshal(fields[k], dst) != nil {
			return invalidParam(k, "%s must be true or false", k)
		}
		return nil
	}
	if !present("model") {
		return req, invalidParam("model", "model is required: name the model GET /v1/models lists")
	}
	if err := firstOf(str("model", &req.model), str("instructions", &req.instructions),
		str("previous_response_id", &req.previous), flag("background", &req.background), flag("stream", &req.stream)); err != nil {
		return req, err
	}
	if present("store") {
		var store bool
		if err := flag("store", &store); err != nil {
			return req, err
		}
		if !store {
			return req, invalidParam("store", "store false is not supported: every response is a run on a thread, kept like any other (delete its thread to remove it)")
		}
	}
	if present("metadata") && json.Unmarshal(fields["metadata"], &req.metadata) != nil {
		return req, invalidParam("metadata", "metadata must be an object of string values")
	}
	if present("input") {
		text, err := parseInput(fields["input"])
		if err != nil {
			return req, err
		}
		req.input = &text
	} else if req.previous == "" {
		return req, invalidParam("input", "input is required: the user's message, as a string or one message item (without previous_response_id there is nothing to continue)")
	}
	if req.input != nil {
		if err := chat.CheckText("input", *req.input, 1, chat.MaxUserMessageBytes); err != nil {
			return req, err.(*chat.Error).With(fieldParam, "input")
		}
	}
	return req, nil
}

// parseInput reads input: a string, or a list of one message item of role
// user whose content is a string or one input_text part. The gateway
// keeps the conversation itself (previous_response_id), so a response
// adds exactly one user message, as run.start does.
func parseInput(raw json.RawMessage) (string, error) {
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return text, nil
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return "", invalidParam("input", "input must be a string or a list of message items")
	}
	if len(items) != 1 {
		return "", invalidParam("input", "input holds %d items; send exactly one message of role user "+
			"(the earlier turns come from previous_response_id, instructions carry a system message)", len(items))
	}
	item, err := jsonObject(items[0])
	if err != nil {
		return "", invalidParam("input[0]", "input[0] must be a message item: {\"role\": \"user\", \"content\": …}")
	}
	for _, k := range slices.Sorted(maps.Keys(item)) {
		if k != "type" && k != "role" && k != "content" {
			return "", invalidParam("input[0]."+k, "input[0].%s is not supported: a message item has type, role and content", k)
		}
	}
	var typ, role string
	if v, ok := item["type"]; ok && (json.Unmarshal(v, &typ) != nil || typ != "message") {
		return "", invalidParam("input[0].type", "input[0].type must be \"message\": other item types (function calls, references, …) are not supported")
	}
	if json.Unmarshal(item["role"], &role) != nil || role != chat.RoleUser {
		return "", invalidParam("input[0].role", "input[0].role must be \"user\": send a system or developer message as instructions; "+
			"the assistant's turns come from previous_response_id")
	}
	content, ok := item["content"]
	if !ok {
		return "", invalidParam("input[0].content", "input[0].content is required")
	}
	if json.Unmarshal(content, &text) == nil {
		return text, nil
	}
	var parts []json.RawMessage
	if json.Unmarshal(content, &parts) != nil || len(parts) != 1 {
		return "", invalidParam("input[0].content", "input[0].content must be a string or one input_text part")
	}
	part, err := jsonObject(parts[0])
	var ptype string
	if err != nil || json.Unmarshal(part["type"], &ptype) != nil || ptype != "input_text" {
		return "", invalidParam("input[0].content[0]", "input[0].content[0] must be an input_text part: images, files and audio are not supported")
	}
	for k := range part {
		if k != "type" && k != "text" {
			return "", invalidParam("input[0].content[0]."+k, "input[0].content[0].%s is not supported: an input_text part has type and text", k)
		}
	}
	if json.Unmarshal(part["text"], &text) != nil {
		return "", invalidParam("input[0].content[0].text", "input[0].content[0].text must be a string")
	}
	return text, nil
}

// jsonObject reads one JSON object into its fields: anything else, a key
// given twice or trailing data is invalid_request.
func jsonObject(body []byte) (map[string]json.RawMessage, error) {
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if t := bytes.TrimLeft(body, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return nil, chat.Invalid("the request body must be a JSON object")
	}
	if err := dec.Decode(&fields); err != nil {
		return nil, jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, chat.Invalid("request body holds more than one JSON value: send exactly one object")
	}
	if err := duplicateKey(body); err != nil {
		return nil, err
	}
	return fields, nil
}

func firstOf(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// createResponse serves POST /v1/responses: a run.start on a new thread,
// or on previous_response_id's thread from the checkpoint that response
// ended on (a branch when that is no longer the head); then the stream
// (stream), the response as it is now (background), or the response once
// it has ended or waits for a confirmation.
func (s *Server) createResponse(w http.ResponseWriter, r *http.Request) {
	ctx, user := r.Context(), userID(r)
	body, err := readBody(w, r)
	var req createRequest
	if err == nil {
		req, err = parseCreate(body)
	}
	start := chat.StartRun{UserID: user, UserMessage: req.input, Response: &chat.ResponseRequest{Model: req.model,
		Instructions: req.instructions, Metadata: req.metadata, PreviousResponseID: req.previous, Background: req.background}}
	if err == nil {
		err = paramOf(start.Validate())
	}
	if err == nil {
		err = s.checkModel(req.model)
	}
	if err == nil && (req.stream || !req.background) {
		// A long answer: its connection slot is taken before the run
		// starts, so that a refusal leaves nothing behind.
		var leave func()
		if leave, err = s.openStream(w, r); err == nil {
			defer leave()
		}
	}
	if err != nil {
		writeOpenAIError(w, s.log, err)
		return
	}
	ack, err := s.startResponse(ctx, start)
	if err != nil {
		writeOpenAIError(w, s.log, err)
		return
	}
	switch {
	case req.stream:
		s.streamOpened(w, r, ack.RunID, -1)
	case req.background:
		rec, err := s.store.Response(ctx, user, ack.RunID)
		s.replyResponse(w, rec, err)
	default:
		s.waitResponse(w, r, ack.RunID)
	}
}

// paramOf names the parameter a run.start's Validate refused: its
// message starts with the field's name, which is the parameter's (the
// input's own limits were checked before, as input).
func paramOf(err error) error {
	ce, ok := err.(*chat.Error)
	if !ok {
		return err
	}
	for _, p := range []string{"instructions", "metadata", "model"} {
		if strings.HasPrefix(ce.Message, p+" ") {
			return ce.With(fieldParam, p)
		}
	}
	return ce
}

// startAttempts bounds the starts of a response continuing a thread that
// another writer changes at the same moment (each retry re-reads it).
const startAttempts = 3

// startResponse starts start's run: on a new thread (no previous
// response), or on the previous response's thread from the checkpoint it
// ended on, named explicitly, so that a version that moved in between
// (another tab, another response) changes nothing of what is continued:
// the start is retried at the new version.
func (s *Server) startResponse(ctx context.Context, start chat.StartRun) (chat.RunStartAck, error) {
	prev := start.Response.PreviousResponseID
	if prev == "" {
		snap, err := s.store.CreateThread(ctx, start.UserID, chat.DefaultTitle)
		if err != nil {
			return chat.RunStartAck{}, err
		}
		start.ThreadID, start.ExpectedStateVersion = snap.ThreadID, snap.StateVersion
		return s.runs.StartRun(ctx, start)
	}
	for attempt := 1; ; attempt++ {
		rec, err := s.response(ctx, start.UserID, prev)
		if err != nil {
			if ce, ok := err.(*chat.Error); ok && ce.Code == chat.CodeNotFound {
				ce.With(fieldParam, "previous_response_id")
			}
			return chat.RunStartAck{}, err
		}
		start.ThreadID, start.ExpectedStateVersion = rec.Run.ThreadID, rec.Thread.StateVersion
		start.ResumeFromCheckpointID = rec.CheckpointID
		ack, err := s.runs.StartRun(ctx, start)
		if chat.ErrorCode(err) != chat.CodeStateVersionConflict || attempt == startAttempts {
			return ack, err
		}
	}
}

// response reads the response a response id names for the caller; an id
// that names no run of theirs is not_found, in the same words whether the
// run exists or not.
func (s *Server) response(ctx context.Context, user, responseID string) (chat.Response, error) {
	notFound := chat.Errorf(chat.CodeNotFound, "no response %s: check the id (responses of other users are not found either)", quoteShort(responseID))
	runID, ok := chat.RunOfResponse(responseID)
	if !ok {
		return chat.Response{}, notFound
	}
	rec, err := s.store.Response(ctx, user, runID)
	if chat.ErrorCode(err) == chat.CodeNotFound {
		return chat.Response{}, notFound
	}
	return rec, err
}

// ---- retrieve and cancel ----

// getQuery are the query parameters of OpenAI's retrieve the gateway
// takes ("include" and "include[]" are OpenAI's and refused by name).
var getQuery = []string{"include_obfuscation", "starting_after", "stream"}

// getResponse serves GET /v1/responses/{id}: the response, or with
// stream=true its stream, from the start or after starting_after. The
// OpenAI Go SDK sends stream as a JSON body ({"stream": true}) on this
// GET, the others as a query parameter: either is read.
func (s *Server) getResponse(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if !slices.Contains(getQuery, k) {
			writeOpenAIError(w, s.log, invalidParam(k, "unsupported query parameter %s: this gateway takes %s", quoteShort(k), strings.Join(getQuery, ", ")))
			return
		}
	}
	stream, err := queryBool(q, "stream")
	if err == nil {
		var b struct {
			Stream *bool `json:"stream"`
		}
		if err = decode(w, r, &b, mayBeEmpty); err == nil && b.Stream != nil {
			stream = *b.Stream
		}
	}
	var obfuscate bool
	if err == nil {
		obfuscate, err = queryBool(q, "include_obfuscation")
	}
	after := int64(-1)
	if err == nil && q.Has("starting_after") {
		n, perr := strconv.ParseInt(q.Get("starting_after"), 10, 64)
		switch {
		case perr != nil || n < 0:
			err = invalidParam("starting_after", "starting_after must be a whole number, 0 or more: the sequence_number of the last event you received")
		case !stream:
			err = invalidParam("starting_after", "starting_after is for streams: add stream=true")
		}
		after = n
	}
	if err == nil && obfuscate {
		err = invalidParam("include_obfuscation", "include_obfuscation=true is not supported: the gateway adds no obfuscation to its events")
	}
	if err != nil {
		writeOpenAIError(w, s.log, err)
		return
	}
	rec, err := s.response(r.Context(), userID(r), r.PathValue("id"))
	switch {
	case err != nil:
		writeOpenAIError(w, s.log, err)
	case stream:
		s.streamResponse(w, r, rec.Run.RunID, after)
	default:
		s.replyResponse(w, rec, nil)
	}
}

// queryBool reads a true/false query parameter (absent: false).
func queryBool(q map[string][]string, name string) (bool, error) {
	vs, ok := q[name]
	if !ok {
		return false, nil
	}
	v, err := strconv.ParseBool(vs[len(vs)-1])
	if err != nil || len(vs) > 1 {
		return false, invalidParam(name, "%s must be given once, true or false", name)
	}
	return v, nil
}

// cancelWait bounds how long a cancel waits for its run to stop before
// answering: the worker stops at its next safe point (milliseconds); a
// call already handed to an external system keeps it cancelling until
// the call's outcome is known, and the answer then says so (status
// in_progress, gateway.status cancelling).
const cancelWait = 5 * time.Second

// cancelResponse serves POST /v1/responses/{id}/cancel: run.cancel in the
// caller's name, then the response once its run is cancelled (with the
// receipt), or as it is after cancelWait.
func (s *Server) cancelResponse(w http.ResponseWriter, r *http.Request) {
	ctx, user := r.Context(), userID(r)
	if err := decode(w, r, &struct{}{}, mayBeEmpty); err != nil {
		writeOpenAIError(w, s.log, err)
		return
	}
	rec, err := s.response(ctx, user, r.PathValue("id"))
	if err != nil {
		writeOpenAIError(w, s.log, err)
		return
	}
	runID := rec.Run.RunID
	watch := s.watch(rec.Run.ThreadID)
	defer watch.stop()
	if _, err := s.runs.CancelRun(ctx, chat.CancelRun{UserID: user, RunID: runID, Reason: chat.ReasonUserRequested,
		RequestedBy: "api:" + clientName(r)}); err != nil {
		writeOpenAIError(w, s.log, err)
		return
	}
	wctx, cancel := context.WithTimeout(ctx, cancelWait)
	defer cancel()
	rec, err = watch.until(wctx, func() (chat.Response, bool, error) {
		rec, err := s.store.Response(ctx, user, runID)
		return rec, err == nil && rec.Run.Status.Terminal(), err
	})
	s.replyResponse(w, rec, err)
}

// waitResponse answers a create that neither streams nor runs in the
// background: the response once its run has ended or waits for a
// confirmation (which only a person can give), or nothing if the caller
// leaves first (the run goes on: a dropped request cancels nothing). The
// caller holds one of the user's connection slots for it (openStream).
func (s *Server) waitResponse(w http.ResponseWriter, r *http.Request, runID string) {
	ctx, user := r.Context(), userID(r)
	rec, err := s.store.Response(ctx, user, runID)
	if err != nil {
		writeOpenAIError(w, s.log, err)
		return
	}
	watch := s.watch(rec.Run.ThreadID)
	defer watch.stop()
	rec, err = watch.until(ctx, func() (chat.Response, bool, error) {
		rec, err := s.store.Response(ctx, user, runID)
		return rec, err == nil && (rec.Run.Status.Terminal() || rec.Run.Status == chat.RunWaitingConfirmation), err
	})
	if ctx.Err() != nil {
		return // the caller left
	}
	s.replyResponse(w, rec, err)
}

// replyResponse writes rec as a response object, or err.
func (s *Server) replyResponse(w http.ResponseWriter, rec chat.Response, err error) {
	if err != nil {
		writeOpenAIError(w, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, s.responseObject(rec))
}

// ---- waiting for a run ----

// runWatch wakes a waiter at every durable event of a thread (the feed's
// sink; Deliver never blocks), so that it re-reads what it waits for
// from the store instead of polling. Owned by one handler goroutine,
// which stops it.
type runWatch struct {
	s      *Server
	thread string
	wake   chan struct{} // cap 1
}

// watch subscribes a runWatch to the thread's live events: anything
// committed after it returns wakes the waiter.
func (s *Server) watch(threadID string) *runWatch {
	rw := &runWatch{s: s, thread: threadID, wake: make(chan struct{}, 1)}
	s.feed.Add(threadID, rw)
	return rw
}

func (rw *runWatch) stop() { rw.s.feed.Remove(rw.thread, rw) }

// Deliver implements chat.EventSink: durable events (every status change
// is one) wake the waiter.
func (rw *runWatch) Deliver(ev *chat.Event) bool {
	if ev.Durable() {
		rw.signal()
	}
	return true
}

// Lost implements bus.LossAware: events of the thread are gone for good;
// the waiter reads the store again.
func (rw *runWatch) Lost(string, int64) bool {
	rw.signal()
	return true
}

func (rw *runWatch) signal() {
	select {
	case rw.wake <- struct{}{}:
	default:
	}
}

// until reads with read until it reports done or fails, or ctx ends (a
// last read is then answered); between reads it waits for a durable event.
// read must not use ctx.
func (rw *runWatch) until(ctx context.Context, read func() (chat.Response, bool, error)) (chat.Response, error) {
	for {
		rec, done, err := read()
		if err != nil || done {
			return rec, err
		}
		select {
		case <-ctx.Done():
			rec, _, err := read()
			return rec, err
		case <-rw.wake:
		}
	}
}
