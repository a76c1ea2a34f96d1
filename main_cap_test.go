package main

// The reply size limit end to end: the serve command with -model openai
// against a fake endpoint whose reply never ends.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
)

// endlessOpenAI is a chat completions endpoint whose streamed reply never
// ends. It records each request's max_completion_tokens and closes closed
// when a client drops the connection.
type endlessOpenAI struct {
	srv    *httptest.Server
	closed chan struct{}
	once   sync.Once

	mu     sync.Mutex
	tokens []any // max_completion_tokens of each request (nil: absent)
	sent   int64 // bytes of text written when the client went away
}

func newEndlessOpenAI(t *testing.T) *endlessOpenAI {
	f := &endlessOpenAI{closed: make(chan struct{})}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *endlessOpenAI) serve(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	raw, _ := io.ReadAll(r.Body)
	json.Unmarshal(raw, &body)
	f.mu.Lock()
	f.tokens = append(f.tokens, body["max_completion_tokens"])
	f.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	data, _ := json.Marshal(map[string]any{"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
		"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": "and on, and on, and on… "}}}})
	var sent int64
	for {
		if _, err := fmt.Fprintf(w, "data: %s\n\n", data); err != nil {
			break
		}
		w.(http.Flusher).Flush()
		sent += int64(len("and on, and on, and on… "))
		if r.Context().Err() != nil {
			break
		}
	}
	f.mu.Lock()
	f.sent = sent
	f.mu.Unlock()
	f.once.Do(func() { close(f.closed) })
}

// A reply that never ends is cut at -max-reply-bytes: the gateway closes
// the upstream connection, the run completes with exactly the streamed
// text published (no more than the limit, ending on a code point) and
// marked truncated: size_limit, and the request asked the endpoint for a
// quarter of the limit in tokens.
func TestEndlessUpstreamReplyIsCutAtTheSizeLimit(t *testing.T) {
	fake := newEndlessOpenAI(t)
	const limit = 20000
	srv := startServerWith(t, filepath.Join(t.TempDir(), "gw.db"), "0s", "-model", "openai", "-openai-base-url", fake.srv.URL+"/v1",
		"-openai-model", "m", "-no-model-titles", "-max-reply-bytes", fmt.Sprint(limit))
	thread := srv.createThread()
	evs := srv.events(thread.ThreadID, thread.LastSeq)
	run := srv.startRun(thread.ThreadID, thread.StateVersion, "write forever")
	var published *chat.Message
	end := evs.waitFor(time.Now().Add(30*time.Second), "the run's end", func(ev client.Event) bool {
		if p := ev.Published(); p != nil && p.Message.Role == chat.RoleAssistant {
			published = &p.Message
		}
		return isEnd(run.RunID)(ev)
	})
	if end.Type != chat.EventRunCompleted {
		t.Fatalf("the run ended with %s, want run.completed", end.Raw)
	}
	select {
	case <-fake.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the endpoint's connection was still open 5s after the run completed")
	}
	if published == nil {
		t.Fatal("nothing was published")
	}
	streamed := evs.text(published.MessageID)
	if published.Content != streamed || len(streamed) > limit || len(streamed) < limit-utf8.UTFMax || !utf8.ValidString(streamed) {
		t.Fatalf("published %d bytes, streamed %d (equal: %v), want the same text of at most %d bytes ending on a code point",
			len(published.Content), len(streamed), published.Content == streamed, limit)
	}
	if published.Truncated != chat.TruncatedSizeLimit {
		t.Fatalf("the published reply says truncated %q, want %q", published.Truncated, chat.TruncatedSizeLimit)
	}
	if snap := srv.snapshot(thread.ThreadID); len(snap.Messages) != 2 || snap.Messages[1].Truncated != chat.TruncatedSizeLimit || snap.Messages[1].Content != streamed {
		t.Fatalf("the snapshot's history: %d messages, the reply marked %q", len(snap.Messages), snap.Messages[len(snap.Messages)-1].Truncated)
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if len(fake.tokens) != 1 || fake.tokens[0] != float64(limit/4) {
		t.Fatalf("max_completion_tokens of the requests: %v, want [%d]", fake.tokens, limit/4)
	}
	t.Logf("the endpoint wrote %d bytes of text before it saw the connection close (socket buffers included)", fake.sent)
}
