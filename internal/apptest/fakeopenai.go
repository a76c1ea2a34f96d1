package apptest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
)

// FakeOpenAI is a Go fake of an OpenAI-compatible chat completions
// endpoint (URL) for a gateway with model "openai". It answers by the
// last user message: "fail" gets a 401, "stall" streams one chunk and
// waits (closing UpstreamClosed when the gateway drops the request),
// anything else streams a short reply with usage. It keeps each
// request's headers; it is closed when the test ends.
type FakeOpenAI struct {
	URL            string
	UpstreamClosed chan struct{}

	srv     *httptest.Server
	release chan struct{}
	once    sync.Once

	mu      sync.Mutex
	auth    []string
	headers []http.Header // of every request
}

// NewFakeOpenAI starts a FakeOpenAI on a loopback port.
func NewFakeOpenAI(t testing.TB) *FakeOpenAI {
	f := &FakeOpenAI{release: make(chan struct{}), UpstreamClosed: make(chan struct{})}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	f.URL = f.srv.URL
	t.Cleanup(f.srv.Close)
	t.Cleanup(func() { close(f.release) })
	return f
}

// Auth is the Authorization header of every request so far.
func (f *FakeOpenAI) Auth() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.auth)
}

// Headers are the headers of every request so far.
func (f *FakeOpenAI) Headers() []http.Header {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.headers)
}

func (f *FakeOpenAI) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	f.headers = append(f.headers, r.Header.Clone())
	f.mu.Unlock()
	var body struct {
		Messages []struct {
			Role    string `json:"role"`
			Content any    `json:"content"`
		} `json:"messages"`
	}
	raw, _ := io.ReadAll(r.Body)
	json.Unmarshal(raw, &body)
	last := ""
	for _, m := range body.Messages {
		if s, ok := m.Content.(string); ok && m.Role == "user" {
			last = s
		}
	}
	if last == "fail" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"error":{"message":"Incorrect API key provided"}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	send := func(v string) {
		fmt.Fprintf(w, "data: %s\n\n", v)
		w.(http.Flusher).Flush()
	}
	chunk := func(text string) string {
		b, _ := json.Marshal(map[string]any{"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
			"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": text}}}})
		return string(b)
	}
	if last == "stall" {
		send(chunk("Once upon a time"))
		select {
		case <-r.Context().Done():
			f.once.Do(func() { close(f.UpstreamClosed) })
		case <-f.release:
		}
		return
	}
	for _, piece := range []string{"Hello", " from", " the fake."} {
		send(chunk(piece))
	}
	send(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`)
	send(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`)
	send("[DONE]")
}
