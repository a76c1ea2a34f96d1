package openai

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/honestcancel/gateway/model"
)

// Title sends one non-streamed request (the instruction as a system
// message, then the request), with the key, and returns the model's answer
// without quotes or a final period; a refusal is an error that names the
// status and never holds the key.
func TestTitle(t *testing.T) {
	calls := 0
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		calls++ // (one request at a time)
		if calls == 2 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"error":{"message":"slow down"}}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"id": "c", "object": "chat.completion", "created": 1, "model": "test-model",
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop",
				"message": map[string]any{"role": "assistant", "content": "  \"Spring trip to Lisbon.\"\n"}}}})
	})
	b := u.backend(nil)
	got, err := b.Title(context.Background(), []model.Message{{Role: model.RoleUser, Content: "Can you help me plan a spring trip to Lisbon?"}})
	if err != nil || got != "Spring trip to Lisbon" {
		t.Fatalf("Title = %q, %v", got, err)
	}
	req := u.request(0)
	var sent struct {
		Stream   *bool `json:"stream"`
		Messages []struct {
			Role, Content string
		} `json:"messages"`
		MaxCompletionTokens int `json:"max_completion_tokens"`
	}
	if err := json.Unmarshal(req.body, &sent); err != nil {
		t.Fatal(err)
	}
	if sent.Stream != nil && *sent.Stream || len(sent.Messages) != 2 || sent.Messages[0].Role != "system" ||
		sent.Messages[1].Role != "user" || sent.Messages[1].Content != "Can you help me plan a spring trip to Lisbon?" ||
		sent.MaxCompletionTokens != 24 || req.header.Get("Authorization") != "Bearer "+testKey {
		t.Fatalf("title request %s (auth %q)", req.body, req.header.Get("Authorization"))
	}
	_, err = b.Title(context.Background(), []model.Message{{Role: model.RoleUser, Content: "refuse me"}})
	if err == nil || !strings.Contains(err.Error(), "429") && !strings.Contains(strings.ToLower(err.Error()), "rate") || strings.Contains(err.Error(), testKey) {
		t.Fatalf("a refused title = %v, want an error about the rate limit without the key", err)
	}
	if n := u.count(); n != 2 {
		t.Fatalf("%d requests, want 2 (no retry of a title)", n)
	}
}
