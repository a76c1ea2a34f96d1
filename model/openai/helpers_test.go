// Shared helpers for the package's tests: a fake chat completions endpoint
// speaking the streaming SSE format, builders of its chunks, and readers of
// the backend's stream.

package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
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

// stall blocks a handler until the client's request ends (closing done) or
// the test ends.
func stall(r *http.Request, release <-chan struct{}, done chan<- struct{}) {
	select {
	case <-r.Context().Done():
		close(done)
	case <-release:
	}
}
