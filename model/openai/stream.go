package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/honestcancel/gateway/model"
)

// ErrClosed is returned by Next after (or while blocked when) Close is called.
var ErrClosed = errors.New("openai: stream closed")

// errIdle is the cause the idle watchdog cancels a request with.
var errIdle = errors.New("openai: idle timeout")

// errEventTooLarge is the error a response body gives once one of its
// events passes maxEventBytes.
var errEventTooLarge = errors.New("openai: stream event too large")

// maxEventBytes bounds one server-sent event (one chunk) of a reply of at
// most limit bytes of text (0: no bound): six times the limit (a byte of
// text written as a JSON \u escape) and 64 KiB for the rest of the chunk.
// An event is read whole before it is decoded, so without a bound one
// event could hold any amount of text, none of which the size limit would
// ever see.
func maxEventBytes(limit int) int {
	if limit <= 0 {
		return 0
	}
	return 6*limit + 64<<10
}

// Stream is one streamed reply. Next is called by one goroutine; Close may be
// called from any goroutine at any time. Usage may be called at any time.
type Stream struct {
	b      *Backend
	params sdk.ChatCompletionNewParams
	limit  int             // model.Request.MaxBytes: bounds one event and a tool call's arguments (0: none)
	ctx    context.Context // the request's context: cancelled by Close, a Next ctx, or the watchdog
	cancel context.CancelCauseFunc
	closed atomic.Bool

	prompt, completion atomic.Int64

	mu      sync.Mutex // held by Next while it works; Close takes it to release the response
	sse     *ssestream.Stream[sdk.ChatCompletionChunk]
	spy     *doneSpy
	started bool
	queue   []model.Chunk
	calls   []*callParts
	args    int   // bytes of tool call arguments so far
	tooLong error // the tool call's arguments passed the limit
	finish  string
	ended   bool  // everything was read: queue then EOF
	err     error // sticky
}

var _ model.Stream = (*Stream)(nil)

func newStream(ctx context.Context, b *Backend, params sdk.ChatCompletionNewParams, limit int) *Stream {
	rctx, cancel := context.WithCancelCause(ctx)
	return &Stream{b: b, params: params, ctx: rctx, cancel: cancel, limit: limit}
}

// callParts is one tool call being assembled from deltas.
type callParts struct {
	index int64
	id    string
	name  string
	args  strings.Builder
}

// Usage returns the token counts the endpoint reported for this reply
// (requested with stream_options.include_usage), or zeros when it reported
// none (yet).
func (s *Stream) Usage() (prompt, completion int64) {
	return s.prompt.Load(), s.completion.Load()
}

// Close cancels the request at once (closing the upstream connection) and
// releases the response. A Next blocked meanwhile returns ErrClosed promptly.
func (s *Stream) Close() error {
	s.closed.Store(true)
	s.cancel(ErrClosed)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sse != nil {
		s.sse.Close()
	}
	return nil
}

// Next returns the next chunk: a piece of text, or, last, the tool call the
// model asked for. It returns model.EOF after the last chunk; ErrClosed after
// Close; the context's cause when ctx (or the Stream's context) ends, which
// also cancels the request; and an *Error for an upstream failure. Once it
// returned an error it returns that error again.
func (s *Stream) Next(ctx context.Context) (model.Chunk, error) {
	if s.closed.Load() {
		return model.Chunk{}, ErrClosed
	}
	if ctx.Err() != nil {
		s.cancel(context.Cause(ctx))
		return model.Chunk{}, context.Cause(ctx)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return model.Chunk{}, s.err
	}
	// Ending ctx ends the request, not just this call.
	stop := context.AfterFunc(ctx, func() { s.cancel(context.Cause(ctx)) })
	defer stop()
	c, err := s.next(ctx)
	switch {
	case errors.Is(err, model.EOF):
		s.cancel(nil) // the body was read to its end: release the request
	case err != nil:
		s.fail(err)
	}
	return c, err
}

func (s *Stream) fail(err error) {
	s.err = err
	s.cancel(err)
	if s.sse != nil {
		s.sse.Close()
	}
}

func (s *Stream) next(ctx context.Context) (model.Chunk, error) {
	if !s.started {
		s.started = true
		if err := s.open(ctx); err != nil {
			return model.Chunk{}, err
		}
	}
	for {
		if len(s.queue) > 0 {
			c := s.queue[0]
			s.queue = s.queue[1:]
			return c, nil
		}
		if s.ended {
			return model.Chunk{}, model.EOF
		}
		watchdog := time.AfterFunc(s.b.idle, func() { s.cancel(errIdle) })
		ok := s.sse.Next()
		watchdog.Stop()
		if !ok {
			if s.closed.Load() || ctx.Err() != nil || s.ctx.Err() != nil {
				return model.Chunk{}, s.stopped(ctx, s.sse.Err())
			}
			if err := s.sse.Err(); err != nil {
				return model.Chunk{}, s.streamError(ctx, err)
			}
			if err := s.end(); err != nil {
				return model.Chunk{}, err
			}
			continue
		}
		if s.ctx.Err() != nil { // the watchdog fired just as the chunk came
			return model.Chunk{}, s.stopped(ctx, context.Cause(s.ctx))
		}
		s.take(s.sse.Current())
		if s.tooLong != nil {
			return model.Chunk{}, s.tooLong
		}
	}
}

// take records one streamed chunk: text to hand over, tool call pieces,
// the finish reason and usage.
func (s *Stream) take(ch sdk.ChatCompletionChunk) {
	if u := ch.Usage; u.PromptTokens > 0 || u.CompletionTokens > 0 {
		s.prompt.Store(u.PromptTokens)
		s.completion.Store(u.CompletionTokens)
	}
	for _, choice := range ch.Choices {
		if choice.Index != 0 { // n is 1: other choices are not ours
			continue
		}
		d := choice.Delta
		if text := d.Content + d.Refusal; text != "" {
			s.queue = append(s.queue, model.Chunk{Text: text})
		}
		for _, tc := range d.ToolCalls {
			s.part(tc)
			s.args += len(tc.Function.Arguments)
		}
		if s.limit > 0 && s.args > s.limit && s.tooLong == nil {
			s.tooLong = &Error{Kind: KindBadReply, msg: fmt.Sprintf("the model's tool call arguments passed the reply size limit of %d bytes; the reply was stopped", s.limit)}
		}
		if choice.FinishReason != "" {
			s.finish = choice.FinishReason
		}
	}
}

// part adds a tool call delta to the call it belongs to: by index, or as a
// new call when it carries another id at an index already in use (some
// compatible servers send every call at index 0).
func (s *Stream) part(tc sdk.ChatCompletionChunkChoiceDeltaToolCall) {
	var p *callParts
	for i := len(s.calls) - 1; i >= 0; i-- {
		if s.calls[i].index == tc.Index {
			p = s.calls[i]
			break
		}
	}
	if p == nil || (tc.ID != "" && p.id != "" && tc.ID != p.id) {
		p = &callParts{index: tc.Index}
		s.calls = append(s.calls, p)
	}
	if tc.ID != "" {
		p.id = tc.ID
	}
	if tc.Function.Name != "" {
		p.name += tc.Function.Name
	}
	p.args.WriteString(tc.Function.Arguments)
}

// end handles the end of a stream that was read without a transport error.
func (s *Stream) end() error {
	if s.finish == "" && !s.spy.done {
		// Neither a finish reason nor [DONE]: the body ended early.
		return &Error{Kind: KindBrokenStream, msg: msgBroken}
	}
	s.ended = true
	switch s.finish {
	case "content_filter":
		return &Error{Kind: KindRefused, msg: "the model endpoint's content filter stopped the reply"}
	case "length":
		if len(s.calls) > 0 {
			return &Error{Kind: KindBadReply, msg: "the model's reply hit its length limit in the middle of a tool call"}
		}
		// The endpoint stopped the text at a length limit: it is kept as
		// streamed, and said to be cut.
		s.queue = append(s.queue, model.Chunk{Truncated: true})
	}
	// A call is handed over when the reply finished for it ("tool_calls"),
	// and also when a compatible server streamed one but reported "stop"
	// or no reason at all.
	if len(s.calls) == 0 || s.finish == "length" {
		return nil
	}
	first := s.calls[0]
	for _, c := range s.calls[1:] {
		if c.index < first.index {
			first = c
		}
	}
	if first.name == "" {
		return &Error{Kind: KindBadReply, msg: "the model asked for a tool call without naming the tool"}
	}
	args := strings.TrimSpace(first.args.String())
	if args == "" {
		args = "{}"
	}
	if !json.Valid([]byte(args)) {
		return &Error{Kind: KindBadReply, msg: "the model called " + first.name + " with arguments that are not valid JSON"}
	}
	s.queue = append(s.queue, model.Chunk{Call: &model.ToolCall{ID: first.id, Name: first.name, Arguments: json.RawMessage(args)}})
	return nil
}

// open sends the request, retrying connection errors, 408, 429 and 5xx up
// to the backend's retry count, and keeps the stream whose response started.
func (s *Stream) open(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		var res *http.Response
		spy := &doneSpy{maxEvent: maxEventBytes(s.limit)}
		watchdog := time.AfterFunc(s.b.idle, func() { s.cancel(errIdle) })
		sse := s.b.svc.NewStreaming(s.ctx, s.params,
			option.WithResponseInto(&res),
			option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
				r, err := next(req)
				if err == nil && r != nil && r.StatusCode < 300 && r.Body != nil {
					spy.rc = r.Body
					r.Body = spy
				}
				return r, err
			}))
		watchdog.Stop()
		err := sse.Err()
		if err == nil && s.ctx.Err() != nil {
			err = context.Cause(s.ctx)
		}
		if err == nil {
			s.sse, s.spy = sse, spy
			return nil
		}
		sse.Close()
		if s.closed.Load() || ctx.Err() != nil || s.ctx.Err() != nil {
			return s.stopped(ctx, err)
		}
		status := 0
		if res != nil {
			status = res.StatusCode
		}
		retryable := status == 0 || status == http.StatusRequestTimeout || status == http.StatusTooManyRequests || status >= 500
		if !retryable || attempt >= s.b.retries {
			return requestError(err, status, res, attempt, s.b.model)
		}
		delay := min(s.b.backoff<<attempt, s.b.maxBackoff)
		delay += time.Duration(rand.Int64N(int64(delay/4) + 1))
		if wait, ok := retryAfter(res); ok {
			if wait > s.b.maxWait {
				return requestError(err, status, res, attempt, s.b.model)
			}
			delay = max(delay, wait)
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-s.ctx.Done():
			t.Stop()
			return s.stopped(ctx, context.Cause(s.ctx))
		}
	}
}

// stopped explains a request that ended because its context did: Close, a
// cancelled context, or the idle watchdog.
func (s *Stream) stopped(ctx context.Context, err error) error {
	cause := context.Cause(s.ctx)
	switch {
	case s.closed.Load():
		return ErrClosed
	case ctx.Err() != nil:
		return context.Cause(ctx)
	case errors.Is(cause, errIdle):
		return &Error{Kind: KindIdle, msg: "the model sent nothing for " + seconds(s.b.idle) + "; the request was stopped", err: errIdle}
	case s.ctx.Err() != nil:
		return cause
	}
	return err
}

// streamError explains a stream that failed after it started.
func (s *Stream) streamError(ctx context.Context, err error) error {
	if s.closed.Load() || ctx.Err() != nil || s.ctx.Err() != nil {
		return s.stopped(ctx, err)
	}
	var se *ssestream.StreamError
	if errors.As(err, &se) {
		msg := upstreamMessage(se.Event.Data)
		if msg == "" {
			msg = "no details"
		}
		return &Error{Kind: KindUpstream, msg: "the model endpoint reported an error mid-stream: " + msg, err: err}
	}
	if errors.Is(err, errEventTooLarge) {
		return &Error{Kind: KindBadReply, msg: fmt.Sprintf("the model endpoint sent one chunk of more than %d bytes, more than a reply may hold; the reply was stopped", maxEventBytes(s.limit)), err: err}
	}
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return &Error{Kind: KindBadReply, msg: "the model's stream could not be read (a chunk is not valid JSON)", err: err}
	}
	return &Error{Kind: KindBrokenStream, msg: msgBroken, err: err}
}

// retryAfter reads a Retry-After (seconds) or retry-after-ms header.
func retryAfter(res *http.Response) (time.Duration, bool) {
	if res == nil {
		return 0, false
	}
	if v := res.Header.Get("Retry-After-Ms"); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 {
			return time.Duration(ms * float64(time.Millisecond)), true
		}
	}
	if v := res.Header.Get("Retry-After"); v != "" {
		if sec, err := strconv.ParseFloat(v, 64); err == nil && sec >= 0 {
			return time.Duration(sec * float64(time.Second)), true
		}
		if t, err := http.ParseTime(v); err == nil {
			return max(time.Until(t), 0), true
		}
	}
	return 0, false
}

// seconds prints d as "60s" rather than "1m0s".
func seconds(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return d.String()
}

// doneSpy passes a streaming response body through and notes whether the
// "data: [DONE]" terminator went by, which tells a finished stream from one
// whose body merely ended. With maxEvent set, it fails the body
// (errEventTooLarge) once one event (the lines up to a blank one) passes
// that many bytes.
type doneSpy struct {
	rc   io.ReadCloser
	tail []byte
	done bool

	maxEvent          int
	lineLen, eventLen int
	afterCR           bool
}

var (
	doneMarks = [][]byte{[]byte("data: [DONE]"), []byte("data:[DONE]")}
	spyTail   = len("data: [DONE]") - 1
)

func (d *doneSpy) Read(p []byte) (int, error) {
	n, err := d.rc.Read(p)
	if d.maxEvent > 0 && n > 0 && !d.measure(p[:n]) {
		return n, errEventTooLarge
	}
	if n > 0 && !d.done {
		edge := append(d.tail, p[:min(n, spyTail)]...)
		for _, m := range doneMarks {
			if bytes.Contains(edge, m) || bytes.Contains(p[:n], m) {
				d.done = true
			}
		}
		if n >= spyTail {
			d.tail = append(d.tail[:0], p[n-spyTail:n]...)
		} else {
			d.tail = append(d.tail, p[:n]...)
			d.tail = d.tail[max(len(d.tail)-spyTail, 0):]
		}
	}
	return n, err
}

func (d *doneSpy) Close() error { return d.rc.Close() }

// measure counts the bytes of the event being read (line ends are \n, \r\n
// or \r; an empty line ends an event) and reports whether it is still
// within maxEvent.
func (d *doneSpy) measure(p []byte) bool {
	for _, c := range p {
		if c == '\n' && d.afterCR {
			d.afterCR = false
			continue
		}
		d.afterCR = c == '\r'
		if c == '\n' || c == '\r' {
			if d.lineLen == 0 {
				d.eventLen = 0
			}
			d.lineLen = 0
			continue
		}
		d.lineLen++
		if d.eventLen++; d.eventLen > d.maxEvent {
			return false
		}
	}
	return true
}
