package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/honestcancel/gateway/model"
)

const testKey = "sk-test-secret-key"

// ---------------------------------------------------------------------------
// A fake chat completions endpoint speaking the streaming SSE format.

// upstream is an httptest server on 127.0.0.1 whose handler the test
// scripts. It records each request's headers and body.
type upstream struct {
	t   *testing.T
	srv *httptest.Server
	// release unblocks handlers that wait for the client; closed at cleanup
	// (before the server closes).
	release chan struct{}

	mu       sync.Mutex
	requests []recorded
}

type recorded struct {
	header http.Header
	path   string
	body   []byte
}

func newUpstream(t *testing.T, script func(w http.ResponseWriter, r *http.Request, release <-chan struct{})) *upstream {
	t.Helper()
	u := &upstream{t: t, release: make(chan struct{})}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.requests = append(u.requests, recorded{header: r.Header.Clone(), path: r.URL.Path, body: body})
		u.mu.Unlock()
		script(w, r, u.release)
	}))
	t.Cleanup(u.srv.Close)
	t.Cleanup(func() { close(u.release) }) // runs first
	return u
}

func (u *upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.requests)
}

// wantRequests checks that the upstream was asked exactly n times; why,
// when not empty, says what that count shows.
func (u *upstream) wantRequests(t *testing.T, n int, why string) {
	t.Helper()
	if got := u.count(); got != n {
		msg := fmt.Sprintf("%d requests, want %d", got, n)
		if why != "" {
			msg += ": " + why
		}
		t.Error(msg)
	}
}

func (u *upstream) request(i int) recorded {
	u.mu.Lock()
	defer u.mu.Unlock()
	if i >= len(u.requests) {
		u.t.Fatalf("the server saw %d requests, want at least %d", len(u.requests), i+1)
	}
	return u.requests[i]
}

// backend returns a backend for u with test defaults, changed by edit.
func (u *upstream) backend(edit func(*Config)) *Backend {
	u.t.Helper()
	cfg := Config{BaseURL: u.srv.URL + "/v1", Model: "test-model", APIKey: testKey, IdleTimeout: 10 * time.Second}
	if edit != nil {
		edit(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		u.t.Fatalf("New: %v", err)
	}
	b.backoff = time.Millisecond
	return b
}

func startSSE(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
}

func send(w http.ResponseWriter, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	fmt.Fprintf(w, "data: %s\n\n", data)
	w.(http.Flusher).Flush()
}

func sendDone(w http.ResponseWriter) {
	fmt.Fprint(w, "data: [DONE]\n\n")
	w.(http.Flusher).Flush()
}

func chunk(delta map[string]any, finish any) map[string]any {
	return map[string]any{
		"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "test-model",
		"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}},
	}
}

func text(s string) map[string]any { return chunk(map[string]any{"content": s}, nil) }

func finish(reason string) map[string]any { return chunk(map[string]any{}, reason) }

func usage(prompt, completion int) map[string]any {
	return map[string]any{
		"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "test-model",
		"choices": []any{},
		"usage":   map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
	}
}

func toolDelta(index int, id, name, args string) map[string]any {
	call := map[string]any{"index": index, "function": map[string]any{"arguments": args}}
	if id != "" {
		call["id"] = id
		call["type"] = "function"
	}
	if name != "" {
		call["function"].(map[string]any)["name"] = name
	}
	return chunk(map[string]any{"tool_calls": []any{call}}, nil)
}

// wait waits for ch to close, at most 5s.
func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s did not happen within 5s", what)
	}
}

var hello = model.Request{Messages: []model.Message{{Role: model.RoleUser, Content: "hello"}}}

// drain reads s to its end: the chunks, and the error that ended it (nil
// for EOF).
func drain(t *testing.T, s model.Stream) ([]model.Chunk, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []model.Chunk
	for {
		c, err := s.Next(ctx)
		if errors.Is(err, model.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, c)
	}
}

func open(t *testing.T, b *Backend, req model.Request) *Stream {
	t.Helper()
	s, err := b.Stream(context.Background(), req)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s.(*Stream)
}

func texts(chunks []model.Chunk) string {
	var b strings.Builder
	for _, c := range chunks {
		b.WriteString(c.Text)
	}
	return b.String()
}

func wantKind(t *testing.T, err error, kind Kind) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T), want an *openai.Error", err, err)
	}
	if e.Kind != kind {
		t.Fatalf("error %q has kind %d, want %d", e, e.Kind, kind)
	}
	if strings.Contains(e.Error(), testKey) {
		t.Fatalf("error %q contains the API key", e)
	}
	return e
}

// ---------------------------------------------------------------------------
// Streams.

func TestTextStream(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		startSSE(w)
		send(w, chunk(map[string]any{"role": "assistant", "content": ""}, nil))
		send(w, text("Hel"))
		send(w, text("lo, "))
		send(w, text("world."))
		send(w, finish("stop"))
		send(w, usage(12, 3))
		sendDone(w)
	})
	b := up.backend(func(c *Config) { c.Headers = map[string]string{"X-Router-Team": "blue"} })
	s := open(t, b, hello)
	chunks, err := drain(t, s)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	want := []model.Chunk{{Text: "Hel"}, {Text: "lo, "}, {Text: "world."}}
	if !reflect.DeepEqual(chunks, want) {
		t.Errorf("chunks %+v, want %+v", chunks, want)
	}
	if p, c := s.Usage(); p != 12 || c != 3 {
		t.Errorf("Usage() = %d, %d; want 12, 3", p, c)
	}
	if _, err := s.Next(context.Background()); !errors.Is(err, model.EOF) {
		t.Errorf("Next after EOF: %v, want EOF again", err)
	}
	req := up.request(0)
	if req.path != "/v1/chat/completions" {
		t.Errorf("path %q, want /v1/chat/completions", req.path)
	}
	if got := req.header.Get("Authorization"); got != "Bearer "+testKey {
		t.Errorf("Authorization %q, want the configured key", got)
	}
	if got := req.header.Get("X-Router-Team"); got != "blue" {
		t.Errorf("X-Router-Team %q, want blue", got)
	}
	up.wantRequests(t, 1, "")
}

func TestToolCallAssembledFromPieces(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		startSSE(w)
		send(w, text("Let me look."))
		send(w, toolDelta(0, "call_abc", "catalog_search", ""))
		send(w, toolDelta(0, "", "", `{"qu`))
		send(w, toolDelta(0, "", "", `ery": "desk `))
		// A second call in the same reply is ignored: one call per step.
		send(w, toolDelta(1, "call_def", "send_email", `{"to":`))
		send(w, toolDelta(0, "", "", `lamp"}`))
		send(w, toolDelta(1, "", "", `"a@example.com"}`))
		send(w, finish("tool_calls"))
		send(w, usage(40, 9))
		sendDone(w)
	})
	s := open(t, up.backend(nil), hello)
	chunks, err := drain(t, s)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	if len(chunks) != 2 || chunks[0].Text != "Let me look." || chunks[0].Call != nil {
		t.Fatalf("chunks %+v, want the text then one call", chunks)
	}
	call := chunks[1].Call
	if call == nil || chunks[1].Text != "" {
		t.Fatalf("last chunk %+v, want a call only", chunks[1])
	}
	if call.ID != "call_abc" || call.Name != "catalog_search" {
		t.Errorf("call %s %s, want call_abc catalog_search", call.ID, call.Name)
	}
	var args map[string]any
	if err := json.Unmarshal(call.Arguments, &args); err != nil || !reflect.DeepEqual(args, map[string]any{"query": "desk lamp"}) {
		t.Errorf("arguments %s (%v), want {\"query\":\"desk lamp\"}", call.Arguments, err)
	}
	if p, c := s.Usage(); p != 40 || c != 9 {
		t.Errorf("Usage() = %d, %d; want 40, 9", p, c)
	}
}

func TestToolCallCompatibleServers(t *testing.T) {
	t.Parallel()
	// Servers that send each call whole at index 0 and finish with "stop":
	// the first call is still handed over, once.
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		startSSE(w)
		send(w, toolDelta(0, "call_1", "catalog_search", `{"query":"chair"}`))
		send(w, toolDelta(0, "call_2", "catalog_search", `{"query":"table"}`))
		send(w, finish("stop"))
		sendDone(w)
	})
	chunks, err := drain(t, open(t, up.backend(nil), hello))
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	if len(chunks) != 1 || chunks[0].Call == nil || chunks[0].Call.ID != "call_1" || string(chunks[0].Call.Arguments) != `{"query":"chair"}` {
		t.Fatalf("chunks %+v, want one call call_1 with {\"query\":\"chair\"}", chunks)
	}
}

func TestBadToolCall(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		startSSE(w)
		send(w, toolDelta(0, "call_1", "catalog_search", `{"query":`))
		send(w, finish("tool_calls"))
		sendDone(w)
	})
	_, err := drain(t, open(t, up.backend(nil), hello))
	e := wantKind(t, err, KindBadReply)
	if !strings.Contains(e.Error(), "not valid JSON") {
		t.Errorf("error %q, want it to say the arguments are not valid JSON", e)
	}
}

func TestStreamBreaksOff(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		end  func(w http.ResponseWriter)
	}{
		{"connection aborted", func(w http.ResponseWriter) { panic(http.ErrAbortHandler) }},
		{"body ends without a finish", func(w http.ResponseWriter) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
				startSSE(w)
				send(w, text("Half a"))
				tc.end(w)
			})
			chunks, err := drain(t, open(t, up.backend(nil), hello))
			if texts(chunks) != "Half a" {
				t.Errorf("text %q before the break, want %q", texts(chunks), "Half a")
			}
			e := wantKind(t, err, KindBrokenStream)
			if !strings.Contains(e.Error(), "the model's stream broke off") {
				t.Errorf("error %q, want it to say the stream broke off", e)
			}
			up.wantRequests(t, 1, "no retry after the first token")
		})
	}
}

func TestErrorEventMidStream(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		startSSE(w)
		send(w, text("Start"))
		send(w, map[string]any{"error": map[string]any{"message": "the server is overloaded", "type": "server_error"}})
	})
	_, err := drain(t, open(t, up.backend(nil), hello))
	e := wantKind(t, err, KindUpstream)
	if !strings.Contains(e.Error(), "mid-stream") || !strings.Contains(e.Error(), "the server is overloaded") {
		t.Errorf("error %q, want the upstream's message", e)
	}
	up.wantRequests(t, 1, "")
}

// stall blocks a handler until the client's request ends (closing done) or
// the test ends.
func stall(r *http.Request, release <-chan struct{}, done chan<- struct{}) {
	select {
	case <-r.Context().Done():
		close(done)
	case <-release:
	}
}

func TestIdleWatchdog(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		before func(w http.ResponseWriter) // what the server sends before it stalls
		text   string
	}{
		{"before the response", func(w http.ResponseWriter) {}, ""},
		{"after the first chunk", func(w http.ResponseWriter) { startSSE(w); send(w, text("Thinking")) }, "Thinking"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			stopped := make(chan struct{})
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
				tc.before(w)
				stall(r, release, stopped)
			})
			s := open(t, up.backend(func(c *Config) { c.IdleTimeout = 150 * time.Millisecond }), hello)
			chunks, err := drain(t, s)
			if texts(chunks) != tc.text {
				t.Errorf("text %q, want %q", texts(chunks), tc.text)
			}
			e := wantKind(t, err, KindIdle)
			if want := "the model sent nothing for 150ms; the request was stopped"; e.Error() != want {
				t.Errorf("error %q, want %q", e, want)
			}
			wait(t, stopped, "the server seeing the stalled request end")
			up.wantRequests(t, 1, "a stall is not retried")
		})
	}
}

func TestIdleTimeoutIsNotAStreamTimeout(t *testing.T) {
	t.Parallel()
	// A stream that lasts longer than IdleTimeout in total, but never pauses
	// that long, completes: the server sends a chunk every half idle period.
	idle := 300 * time.Millisecond
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
		startSSE(w)
		for i := range 4 {
			select {
			case <-time.After(idle / 2):
			case <-release:
				return
			}
			send(w, text(fmt.Sprintf("%d ", i)))
		}
		send(w, finish("stop"))
		sendDone(w)
	})
	start := time.Now()
	chunks, err := drain(t, open(t, up.backend(func(c *Config) { c.IdleTimeout = idle }), hello))
	if err != nil || texts(chunks) != "0 1 2 3 " {
		t.Fatalf("stream: %q, %v", texts(chunks), err)
	}
	if elapsed := time.Since(start); elapsed < idle {
		t.Errorf("the stream took %v, want longer than the idle timeout %v for this test to mean anything", elapsed, idle)
	}
}

func TestCancelClosesUpstream(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"stream context", "next context", "close"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			upstreamDone := make(chan struct{})
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
				startSSE(w)
				send(w, text("Once upon"))
				stall(r, release, upstreamDone)
			})
			b := up.backend(nil)
			streamCtx, cancelStream := context.WithCancel(context.Background())
			defer cancelStream()
			nextCtx, cancelNext := context.WithCancel(context.Background())
			defer cancelNext()
			ms, err := b.Stream(streamCtx, hello)
			if err != nil {
				t.Fatal(err)
			}
			s := ms.(*Stream)
			defer s.Close()
			if c, err := s.Next(nextCtx); err != nil || c.Text != "Once upon" {
				t.Fatalf("first Next: %+v, %v", c, err)
			}
			errc := make(chan error, 1)
			go func() {
				_, err := s.Next(nextCtx) // blocks: the server sends nothing more
				errc <- err
			}()
			switch how {
			case "stream context":
				cancelStream()
			case "next context":
				cancelNext()
			case "close":
				s.Close()
			}
			wait(t, upstreamDone, "the server observing the request's context done")
			var err2 error
			select {
			case err2 = <-errc:
			case <-time.After(5 * time.Second):
				t.Fatal("the blocked Next did not return within 5s")
			}
			want := context.Canceled
			if how == "close" {
				want = ErrClosed
			}
			if !errors.Is(err2, want) {
				t.Errorf("blocked Next returned %v, want %v", err2, want)
			}
			if _, err := s.Next(context.Background()); err == nil || errors.Is(err, model.EOF) {
				t.Errorf("Next after the cancel returned %v, want an error", err)
			}
			up.wantRequests(t, 1, "")
		})
	}
}

func TestCancelDuringRetryBackoff(t *testing.T) {
	t.Parallel()
	answered := make(chan struct{})
	var once sync.Once
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		w.Header().Set("Retry-After", "10") // a 10s backoff follows
		http.Error(w, `{"error":{"message":"slow down"}}`, http.StatusTooManyRequests)
		once.Do(func() { close(answered) })
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := up.backend(nil).Stream(ctx, hello)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := s.Next(ctx)
		errc <- err
	}()
	wait(t, answered, "the first answer (429)")
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Next returned %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Next did not return within 5s of a cancel during the 10s backoff")
	}
	up.wantRequests(t, 1, "")
}

// ---------------------------------------------------------------------------
// Errors and retries before the first token.

func TestRefusedRequests(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		status   []int // per request; the last repeats
		body     string
		ctype    string
		retries  int
		requests int
		kind     Kind
		contains []string
	}{
		{name: "401 is not retried", status: []int{401}, body: `{"error":{"message":"Incorrect API key provided: ` + testKey + `","type":"invalid_request_error"}}`,
			requests: 1, kind: KindAuth, contains: []string{"the model endpoint refused the API key (401): check GATEWAY_OPENAI_API_KEY"}},
		{name: "429 retried then reported", status: []int{429}, body: `{"error":{"message":"Rate limit reached for requests"}}`,
			requests: 3, kind: KindRateLimit, contains: []string{"rate limit", "429", "tried 3 times", "Rate limit reached"}},
		{name: "500 retried then reported", status: []int{500}, body: "upstream exploded", ctype: "text/plain",
			requests: 3, kind: KindUpstream, contains: []string{"upstream error (HTTP 500)", "upstream exploded"}},
		{name: "502 with retries disabled", status: []int{502}, body: `{"error":{"message":"bad gateway"}}`, retries: -1,
			requests: 1, kind: KindUpstream, contains: []string{"HTTP 502"}},
		{name: "400 is not retried", status: []int{400}, body: `{"error":{"message":"max_tokens is too large"}}`,
			requests: 1, kind: KindRequest, contains: []string{"rejected the request (HTTP 400)", "max_tokens is too large"}},
		{name: "404 names the settings", status: []int{404}, body: `{"error":{"message":"The model does not exist"}}`,
			requests: 1, kind: KindRequest, contains: []string{"GATEWAY_OPENAI_MODEL", "test-model"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var n atomic.Int32
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
				i := int(n.Add(1)) - 1
				status := tc.status[min(i, len(tc.status)-1)]
				ctype := tc.ctype
				if ctype == "" {
					ctype = "application/json"
				}
				w.Header().Set("Content-Type", ctype)
				w.WriteHeader(status)
				io.WriteString(w, tc.body)
			})
			b := up.backend(func(c *Config) { c.MaxRetries = tc.retries })
			_, err := drain(t, open(t, b, hello))
			e := wantKind(t, err, tc.kind)
			for _, want := range tc.contains {
				if !strings.Contains(e.Error(), want) {
					t.Errorf("error %q does not contain %q", e, want)
				}
			}
			if e.StatusCode != tc.status[len(tc.status)-1] {
				t.Errorf("StatusCode %d, want %d", e.StatusCode, tc.status[len(tc.status)-1])
			}
			up.wantRequests(t, tc.requests, "")
		})
	}
}

func TestRetryThenStream(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		switch n.Add(1) {
		case 1:
			http.Error(w, `{"error":{"message":"busy"}}`, http.StatusServiceUnavailable)
		case 2:
			w.Header().Set("Retry-After-Ms", "5")
			http.Error(w, `{"error":{"message":"slow down"}}`, http.StatusTooManyRequests)
		default:
			startSSE(w)
			send(w, text("Third time lucky."))
			send(w, finish("stop"))
			sendDone(w)
		}
	})
	chunks, err := drain(t, open(t, up.backend(nil), hello))
	if err != nil || texts(chunks) != "Third time lucky." {
		t.Fatalf("stream: %q, %v", texts(chunks), err)
	}
	up.wantRequests(t, 3, "")
	// The retried requests carry the same body.
	if a, b := string(up.request(0).body), string(up.request(2).body); a != b {
		t.Errorf("retried body differs:\n%s\n%s", a, b)
	}
}

func TestConnectError(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	b, err := New(Config{BaseURL: "http://" + addr + "/v1", Model: "m", APIKey: testKey, MaxRetries: 1})
	if err != nil {
		t.Fatal(err)
	}
	b.backoff = time.Millisecond
	_, err = drain(t, open(t, b, hello))
	e := wantKind(t, err, KindConnect)
	if !strings.Contains(e.Error(), "could not reach the model endpoint (tried 2 times)") {
		t.Errorf("error %q", e)
	}
}

// ---------------------------------------------------------------------------
// What is sent.

func TestEnvironmentIgnored(t *testing.T) {
	// Not parallel: t.Setenv.
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		startSSE(w)
		send(w, text("ok"))
		send(w, finish("stop"))
		sendDone(w)
	})
	t.Setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/bogus")
	t.Setenv("OPENAI_API_KEY", "sk-from-env")
	t.Setenv("OPENAI_ORG_ID", "org-from-env")
	t.Setenv("OPENAI_PROJECT_ID", "proj-from-env")
	t.Setenv("OPENAI_CUSTOM_HEADERS", "X-From-Env: leaked")
	chunks, err := drain(t, open(t, up.backend(nil), hello))
	if err != nil || texts(chunks) != "ok" {
		t.Fatalf("stream: %q, %v (the request must go to the configured base URL)", texts(chunks), err)
	}
	h := up.request(0).header
	if got := h.Get("Authorization"); got != "Bearer "+testKey {
		t.Errorf("Authorization %q, want the configured key", got)
	}
	for _, name := range []string{"OpenAI-Organization", "OpenAI-Project", "X-From-Env"} {
		if v := h.Get(name); v != "" {
			t.Errorf("header %s: %q came from the environment", name, v)
		}
	}
}

func TestNoKeyNoAuthorization(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		startSSE(w)
		send(w, text("local"))
		send(w, finish("stop"))
		sendDone(w)
	})
	if _, err := drain(t, open(t, up.backend(func(c *Config) { c.APIKey = "" }), hello)); err != nil {
		t.Fatal(err)
	}
	if got := up.request(0).header.Get("Authorization"); got != "" {
		t.Errorf("Authorization %q sent without a key", got)
	}
}

func TestRequestBody(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		startSSE(w)
		send(w, text("ok"))
		send(w, finish("stop"))
		sendDone(w)
	})
	temp := 0.25
	b := up.backend(func(c *Config) { c.Temperature = &temp })
	note := "The previous output was stopped by the user; answer afresh from the confirmed conversation."
	schema := `{"type":"object","properties":{"query":{"type":"string"}},"required":["query"]}`
	req := model.Request{
		ResumeNote: note,
		Messages: []model.Message{
			{Role: model.RoleUser, Content: "Find me a desk lamp"},
			{Role: model.RoleAssistant, Content: "Sure, here are some lamps th", Fragment: true},
			{Role: model.RoleTool, Content: `{"items":["brass lamp"]}`, Call: &model.ToolCall{ID: "op_123", Name: "catalog_search", Arguments: json.RawMessage(`{"query":"desk lamp"}`)}},
			{Role: model.RoleAssistant, Content: `{"order":42}`, Card: true},
			{Role: model.RoleUser, Content: "Thanks, go on"},
		},
		Tools: []model.ToolSpec{{Name: "catalog_search", Description: "Search the catalog", Parameters: json.RawMessage(schema)}},
	}
	if _, err := drain(t, open(t, b, req)); err != nil {
		t.Fatal(err)
	}
	var body struct {
		Model         string  `json:"model"`
		Stream        bool    `json:"stream"`
		Temperature   float64 `json:"temperature"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		Messages []struct {
			Role       string `json:"role"`
			Content    any    `json:"content"`
			ToolCallID string `json:"tool_call_id"`
			ToolCalls  []struct {
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"messages"`
		Tools []struct {
			Type     string `json:"type"`
			Function struct {
				Name        string          `json:"name"`
				Description string          `json:"description"`
				Parameters  json.RawMessage `json:"parameters"`
			} `json:"function"`
		} `json:"tools"`
	}
	raw := up.request(0).body
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatalf("body %s: %v", raw, err)
	}
	if body.Model != "test-model" || !body.Stream || !body.StreamOptions.IncludeUsage || body.Temperature != 0.25 {
		t.Errorf("model %q stream %v include_usage %v temperature %v", body.Model, body.Stream, body.StreamOptions.IncludeUsage, body.Temperature)
	}
	type msg struct{ role, content string }
	var got []msg
	for _, m := range body.Messages {
		c, _ := m.Content.(string)
		got = append(got, msg{m.Role, c})
	}
	want := []msg{
		{"system", note},
		{"user", "Find me a desk lamp"},
		{"assistant", FragmentPrefix + "Sure, here are some lamps th"},
		{"assistant", ""}, // the tool call
		{"tool", `{"items":["brass lamp"]}`},
		{"assistant", `{"order":42}`},
		{"user", "Thanks, go on"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("messages\n%+v\nwant\n%+v\nbody: %s", got, want, raw)
	}
	if !strings.HasPrefix(FragmentPrefix, "[Saved fragment of an interrupted reply, kept by the user]") {
		t.Errorf("FragmentPrefix %q", FragmentPrefix)
	}
	call := body.Messages[3]
	if len(call.ToolCalls) != 1 || call.ToolCalls[0].ID != "op_123" || call.ToolCalls[0].Type != "function" ||
		call.ToolCalls[0].Function.Name != "catalog_search" || call.ToolCalls[0].Function.Arguments != `{"query":"desk lamp"}` {
		t.Errorf("assistant tool call %+v", call.ToolCalls)
	}
	if body.Messages[4].ToolCallID != "op_123" {
		t.Errorf("tool message tool_call_id %q, want op_123", body.Messages[4].ToolCallID)
	}
	if len(body.Tools) != 1 || body.Tools[0].Type != "function" || body.Tools[0].Function.Name != "catalog_search" || body.Tools[0].Function.Description != "Search the catalog" {
		t.Fatalf("tools %+v", body.Tools)
	}
	var gotSchema, wantSchema any
	json.Unmarshal(body.Tools[0].Function.Parameters, &gotSchema)
	json.Unmarshal([]byte(schema), &wantSchema)
	if !reflect.DeepEqual(gotSchema, wantSchema) {
		t.Errorf("parameters %s, want %s", body.Tools[0].Function.Parameters, schema)
	}
	if strings.Contains(string(raw), testKey) {
		t.Error("the request body contains the API key")
	}
}

// ---------------------------------------------------------------------------
// Configuration.

func TestConfig(t *testing.T) {
	t.Parallel()
	bad := 2.5
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no base URL", Config{Model: "m"}, "base URL is empty"},
		{"relative base URL", Config{BaseURL: "api.openai.com/v1", Model: "m"}, "not an http(s) URL"},
		{"credentials in URL", Config{BaseURL: "https://user:pw@example.com/v1", Model: "m"}, "must not contain credentials"},
		{"no model", Config{BaseURL: "https://example.com/v1"}, "model name is empty"},
		{"bad header name", Config{BaseURL: "https://example.com/v1", Model: "m", Headers: map[string]string{"Bad Name": "x"}}, "header name"},
		{"header line break", Config{BaseURL: "https://example.com/v1", Model: "m", Headers: map[string]string{"X-A": "a\r\nX-B: b"}}, "line break"},
		{"key and Authorization", Config{BaseURL: "https://example.com/v1", Model: "m", APIKey: "k", Headers: map[string]string{"authorization": "Bearer x"}}, "keep only one"},
		{"temperature", Config{BaseURL: "https://example.com/v1", Model: "m", Temperature: &bad}, "temperature"},
		{"negative idle", Config{BaseURL: "https://example.com/v1", Model: "m", IdleTimeout: -time.Second}, "idle timeout"},
	} {
		if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New returned %v, want an error about %q", tc.name, err, tc.want)
		}
	}
	b, err := New(Config{BaseURL: "https://example.com/v1", Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	if b.idle != DefaultIdleTimeout || b.retries != DefaultMaxRetries {
		t.Errorf("defaults: idle %v retries %d", b.idle, b.retries)
	}
	cfg := Config{BaseURL: "https://example.com/v1", Model: "m", APIKey: testKey}
	for _, s := range []string{cfg.String(), fmt.Sprintf("%v %+v %#v %s", cfg, cfg, cfg, cfg), cfg.LogValue().String()} {
		if strings.Contains(s, testKey) {
			t.Errorf("%q shows the API key", s)
		}
	}
	if _, err := b.Stream(context.Background(), model.Request{Tools: []model.ToolSpec{{Name: "t", Parameters: json.RawMessage(`[1]`)}}}); err == nil {
		t.Error("a tool whose parameters are not a JSON object was accepted")
	}
}
