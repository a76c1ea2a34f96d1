package app_test

// The reply size limit end to end: a gateway with the openai model
// (-model openai) against a fake endpoint whose reply never ends, and a
// long conversation of replies cut at the limit (-max-reply-bytes).

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
	"github.com/honestcancel/gateway/model/openai"
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
	cfg := apptest.CommandConfig(filepath.Join(t.TempDir(), "gw.db"), 0)
	cfg.Model, cfg.OpenAI = "openai", openai.Config{BaseURL: fake.srv.URL + "/v1", Model: "m"}
	cfg.NoModelTitles, cfg.MaxReplyBytes = true, limit
	srv := apptest.Start(t, cfg)
	thread := srv.CreateThread()
	evs := srv.Events(thread.ThreadID, thread.LastSeq)
	run := srv.StartRun(thread.ThreadID, thread.StateVersion, "write forever")
	var published *chat.Message
	end := evs.WaitFor(time.Now().Add(30*time.Second), "the run's end", func(ev client.Event) bool {
		if p := ev.Published(); p != nil && p.Message.Role == chat.RoleAssistant {
			published = &p.Message
		}
		return apptest.IsEnd(run.RunID)(ev)
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
	streamed := evs.Text(published.MessageID)
	if published.Content != streamed || len(streamed) > limit || len(streamed) < limit-utf8.UTFMax || !utf8.ValidString(streamed) {
		t.Fatalf("published %d bytes, streamed %d (equal: %v), want the same text of at most %d bytes ending on a code point",
			len(published.Content), len(streamed), published.Content == streamed, limit)
	}
	if published.Truncated != chat.TruncatedSizeLimit {
		t.Fatalf("the published reply says truncated %q, want %q", published.Truncated, chat.TruncatedSizeLimit)
	}
	if snap := srv.Snapshot(thread.ThreadID); len(snap.Messages) != 2 || snap.Messages[1].Truncated != chat.TruncatedSizeLimit || snap.Messages[1].Content != streamed {
		t.Fatalf("the snapshot's history: %d messages, the reply marked %q", len(snap.Messages), snap.Messages[len(snap.Messages)-1].Truncated)
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if len(fake.tokens) != 1 || fake.tokens[0] != float64(limit/4) {
		t.Fatalf("max_completion_tokens of the requests: %v, want [%d]", fake.tokens, limit/4)
	}
	t.Logf("the endpoint wrote %d bytes of text before it saw the connection close (socket buffers included)", fake.sent)
}

// A conversation of replies cut at the size limit (the demo model's
// endless reply) stays loadable: its page holds the latest messages up to
// 1 MiB of content and says how many earlier ones it left out, while the
// API's snapshot holds the whole history.
func TestLongConversationPageIsBounded(t *testing.T) {
	const limit, replies = 300000, 10
	cfg := apptest.CommandConfig(filepath.Join(t.TempDir(), "gw.db"), 0)
	cfg.MaxReplyBytes = limit
	srv := apptest.Start(t, cfg)
	thread := srv.CreateThread()
	evs := srv.Events(thread.ThreadID, thread.LastSeq)
	for i := range replies {
		run := srv.StartRun(thread.ThreadID, srv.Snapshot(thread.ThreadID).StateVersion, fmt.Sprintf("endless: a story about tomatoes, part %d", i+1))
		if end := evs.WaitFor(time.Now().Add(60*time.Second), "the run's end", apptest.IsEnd(run.RunID)); end.Type != chat.EventRunCompleted {
			t.Fatalf("run %d ended with %s", i+1, end.Raw)
		}
	}
	full := srv.Snapshot(thread.ThreadID)
	var content int
	for _, m := range full.Messages {
		content += len(m.Content)
		if m.Role == chat.RoleAssistant && (m.Truncated != chat.TruncatedSizeLimit || len(m.Content) > limit || len(m.Content) < limit-4) {
			t.Fatalf("a reply of %d bytes marked %q, want one cut at %d", len(m.Content), m.Truncated, limit)
		}
	}
	if len(full.Messages) != 2*replies || full.EarlierMessages != 0 || content < replies*limit {
		t.Fatalf("the API's snapshot: %d messages, %d bytes, earlier %d; want the whole history", len(full.Messages), content, full.EarlierMessages)
	}

	resp, err := http.Get(srv.Base + "/t/" + thread.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// The text shown and the embedded snapshot each hold at most 1 MiB of
	// content and the latest reply.
	if bound := 2*(chat.HistoryPageBytes+limit) + 64<<10; resp.StatusCode != http.StatusOK || len(page) > bound {
		t.Fatalf("the page is %d bytes (status %d) for %d bytes of conversation, want at most %d", len(page), resp.StatusCode, content, bound)
	}
	start := strings.Index(string(page), `<script id="snapshot" type="application/json">`)
	end := strings.Index(string(page[start:]), "</script>")
	if start < 0 || end < 0 {
		t.Fatal("the page embeds no snapshot")
	}
	var embedded chat.Snapshot
	if err := json.Unmarshal(page[start+len(`<script id="snapshot" type="application/json">`):start+end], &embedded); err != nil {
		t.Fatal(err)
	}
	shown := len(embedded.Messages)
	if shown == 0 || shown >= len(full.Messages) || embedded.EarlierMessages != len(full.Messages)-shown {
		t.Fatalf("the page holds %d messages and says %d are earlier, of %d", shown, embedded.EarlierMessages, len(full.Messages))
	}
	for i, m := range embedded.Messages {
		if want := full.Messages[embedded.EarlierMessages+i]; m.MessageID != want.MessageID || m.Content != want.Content || m.Truncated != want.Truncated {
			t.Fatalf("the page's message %d is not the history's %d", i, embedded.EarlierMessages+i)
		}
	}
	if !strings.Contains(string(page), "Show earlier messages ("+fmt.Sprint(embedded.EarlierMessages)+" more)") {
		t.Fatal("the page does not offer the earlier messages")
	}
	t.Logf("%d bytes of conversation; the page is %d bytes and holds the latest %d of %d messages", content, len(page), shown, len(full.Messages))
}
