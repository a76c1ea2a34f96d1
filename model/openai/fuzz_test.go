package openai

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/honestcancel/gateway/model"
)

// fuzzUpstream is one chat completions endpoint on 127.0.0.1 shared by all
// executions of a fuzz worker: each request answers 200 text/event-stream
// with the body registered under its X-Fuzz-Body header.
type fuzzUpstream struct {
	srv    *httptest.Server
	client *http.Client

	mu     sync.Mutex
	next   int
	bodies map[string][]byte
}

func newFuzzUpstream(f *testing.F) *fuzzUpstream {
	u := &fuzzUpstream{bodies: map[string][]byte{}}
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		body := u.bodies[r.Header.Get("X-Fuzz-Body")]
		u.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(body)
	}))
	u.srv.Listener.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	u.srv.Listener = ln
	u.srv.Config.IdleTimeout = time.Second
	u.srv.Start()
	tr := &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: time.Second}
	u.client = &http.Client{Transport: tr}
	f.Cleanup(func() {
		tr.CloseIdleConnections()
		u.srv.Close()
	})
	return u
}

func (u *fuzzUpstream) register(body []byte) (string, func()) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.next++
	id := strconv.Itoa(u.next)
	u.bodies[id] = body
	return id, func() {
		u.mu.Lock()
		delete(u.bodies, id)
		u.mu.Unlock()
	}
}

// sseChunk frames one chunk object as an SSE event.
func sseChunk(content string) string {
	b, _ := json.Marshal(map[string]any{
		"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
		"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": content}, "finish_reason": nil}},
	})
	return "data: " + string(b) + "\n\n"
}

var streamSeeds = []string{
	sseChunk("Hello") + sseChunk(", world") + `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n",
	sseChunk("no end"),
	sseChunk("no finish, but done") + "data: [DONE]\n\n",
	`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"lookup","arguments":"{\"q\":"}}]}}]}` + "\n\n" +
		`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"oslo\"}"}}]},"finish_reason":"tool_calls"}]}` + "\n\ndata: [DONE]\n\n",
	`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"x","arguments":"{"}}]},"finish_reason":"tool_calls"}]}` + "\n\ndata: [DONE]\n\n",
	`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"arguments":"{}"}}]},"finish_reason":"length"}]}` + "\n\ndata: [DONE]\n\n",
	`data: {"choices":[{"index":1,"delta":{"content":"other choice"}},{"index":0,"delta":{"content":"ours","refusal":" no"},"finish_reason":"content_filter"}]}` + "\n\n",
	`data: {"error":{"message":"overloaded","type":"server_error"}}` + "\n\n",
	"event: error\ndata: {\"message\":\"boom\"}\n\n",
	"data: {not json\n\n",
	": keep-alive comment\n\n" + sseChunk("after a comment") + "data: [DONE]\n\n",
	"data: {\"choices\":[{\"index\":0,\n" + "data: \"delta\":{\"content\":\"multi-line\"},\"finish_reason\":\"stop\"}]}\n\n",
	strings.ReplaceAll(sseChunk("crlf"), "\n", "\r\n") + "data:[DONE]\r\n\r\n",
	`data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}` + "\n\ndata: [DONE]\n\n",
	`data: {"choices":[{"index":0,"delta":{"content":"\ud83d\ude00 \ud800"},"finish_reason":"stop"}]}` + "\n\n",
	"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\xff\xfe\"},\"finish_reason\":\"stop\"}]}\n\n",
	"",
	"data: [DONE]\n\n",
	"data: null\n\n",
	"retry: 10\nid: 5\n\n",
}

// FuzzStreamParser serves arbitrary bytes as the body of a 200
// text/event-stream reply and drains the stream. Invariants: no panic; it
// ends within a bounded time (no hang) with EOF or an *openai.Error (never
// a context error); the error repeats and EOF repeats; no empty chunk; at
// most one tool call, last, with a name and JSON arguments; the text is
// valid UTF-8 whenever the body is.
func FuzzStreamParser(f *testing.F) {
	for _, s := range streamSeeds {
		f.Add([]byte(s))
	}
	u := newFuzzUpstream(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		id, done := u.register(body)
		defer done()
		b, err := New(Config{BaseURL: u.srv.URL + "/v1", Model: "m", MaxRetries: -1, IdleTimeout: 2 * time.Second,
			HTTPClient: u.client, Headers: map[string]string{"X-Fuzz-Body": id}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := b.Stream(ctx, model.Request{Messages: []model.Message{{Role: model.RoleUser, Content: "hi"}}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var text strings.Builder
		var calls int
		var cut bool // the endpoint's length limit was reported: nothing may follow
		var end error
		for i := 0; ; i++ {
			if i > len(body)+2 {
				t.Fatalf("%d chunks from a %d-byte body", i, len(body))
			}
			c, err := s.Next(ctx)
			if err != nil {
				end = err
				break
			}
			if calls > 0 || cut {
				t.Fatalf("chunk %+v after the tool call or the length limit", c)
			}
			switch {
			case c.Truncated:
				// The mark of a reply the endpoint cut: on its own, last.
				cut = true
				if c.Text != "" || c.Call != nil {
					t.Fatalf("length-limit chunk %+v carries more than the mark", c)
				}
			case c.Call != nil:
				calls++
				if c.Text != "" || c.Call.Name == "" || !json.Valid(c.Call.Arguments) {
					t.Fatalf("tool call chunk %+v (arguments %q)", c, c.Call.Arguments)
				}
			case c.Text == "":
				t.Fatalf("empty chunk %+v", c)
			}
			text.WriteString(c.Text)
		}
		if ctx.Err() != nil {
			t.Fatalf("draining a %d-byte body took over 5s (ended with %v)", len(body), end)
		}
		if !errors.Is(end, model.EOF) {
			var e *Error
			if !errors.As(end, &e) {
				t.Fatalf("stream ended with %v (%T), want EOF or an *openai.Error", end, end)
			}
		}
		if _, again := s.Next(ctx); !errors.Is(again, end) && again.Error() != end.Error() {
			t.Fatalf("Next after %v returned %v", end, again)
		}
		if utf8.Valid(body) && !utf8.ValidString(text.String()) {
			t.Fatalf("text %q from a valid UTF-8 body is not valid UTF-8", text.String())
		}
	})
}
