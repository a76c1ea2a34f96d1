package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/honestcancel/gateway/model"
)

// The request asks for max_completion_tokens: a quarter of the reply's
// size limit, rounded up and at most MaxDerivedCompletionTokens; the
// operator's own number whatever the limit; nothing without a limit.
func TestRequestAsksForTokensFromTheSizeLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		explicit int64
		maxBytes int
		want     any // the JSON value; nil: absent
	}{
		{"derived", 0, 20001, float64(5001)},
		{"derived, at most the cap", 0, 256 << 10, float64(MaxDerivedCompletionTokens)},
		{"explicit", 777, 256 << 10, float64(777)},
		{"explicit above the derived cap", 100000, 1 << 10, float64(100000)},
		{"no limit", 0, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
				startSSE(w)
				send(w, text("ok"))
				send(w, finish("stop"))
				sendDone(w)
			})
			b := up.backend(func(c *Config) { c.MaxCompletionTokens = tc.explicit })
			req := hello
			req.MaxBytes = tc.maxBytes
			if _, err := drain(t, open(t, b, req)); err != nil {
				t.Fatal(err)
			}
			var body map[string]any
			if err := json.Unmarshal(up.request(0).body, &body); err != nil {
				t.Fatal(err)
			}
			got, present := body["max_completion_tokens"]
			if tc.want == nil && present || tc.want != nil && got != tc.want {
				t.Fatalf("max_completion_tokens = %v (present: %v), want %v", got, present, tc.want)
			}
			if _, old := body["max_tokens"]; old {
				t.Fatal("the request also sent the deprecated max_tokens")
			}
		})
	}
}

// A reply the endpoint stops at its length limit keeps its text and ends
// with a Truncated chunk; a reply that finished normally has none.
func TestLengthFinishIsSaidToBeTruncated(t *testing.T) {
	t.Parallel()
	for _, reason := range []string{"length", "stop"} {
		t.Run(reason, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
				startSSE(w)
				send(w, text("Once upon a"))
				send(w, finish(reason))
				sendDone(w)
			})
			chunks, err := drain(t, open(t, up.backend(nil), hello))
			if err != nil {
				t.Fatal(err)
			}
			cut := len(chunks) > 0 && chunks[len(chunks)-1].Truncated
			if texts(chunks) != "Once upon a" || cut != (reason == "length") {
				t.Fatalf("chunks %+v: text %q, truncated %v", chunks, texts(chunks), cut)
			}
		})
	}
}

// One event larger than a reply may hold (six times the limit, and 64 KiB)
// is not read whole: the stream fails saying so and the request's
// connection is closed. Tool call arguments past the limit, sent in small
// pieces, stop the stream too.
func TestOversizedEventsAndArgumentsStopTheStream(t *testing.T) {
	t.Parallel()
	const limit = 1024
	for _, tc := range []struct {
		name string
		send func(w http.ResponseWriter)
		want string
	}{
		{"one huge chunk", func(w http.ResponseWriter) {
			fmt.Fprintf(w, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"`)
			piece := strings.Repeat("x", 4096)
			for range 200 { // 800 KiB of one event, never finished
				if _, err := fmt.Fprint(w, piece); err != nil {
					return
				}
			}
			w.(http.Flusher).Flush()
		}, fmt.Sprintf("one chunk of more than %d bytes", maxEventBytes(limit))},
		{"tool call arguments", func(w http.ResponseWriter) {
			send(w, toolDelta(0, "call_1", "catalog_search", `{"query":"`))
			for range 100 {
				send(w, toolDelta(0, "", "", strings.Repeat("y", 100)))
			}
		}, fmt.Sprintf("tool call arguments passed the reply size limit of %d bytes", limit)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			closed := make(chan struct{})
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
				startSSE(w)
				tc.send(w)
				stall(r, release, closed)
			})
			req := hello
			req.MaxBytes = limit
			_, err := drain(t, open(t, up.backend(nil), req))
			var e *Error
			if !errors.As(err, &e) || e.Kind != KindBadReply || !strings.Contains(e.Error(), tc.want) {
				t.Fatalf("the stream ended with %v, want a bad reply saying %q", err, tc.want)
			}
			wait(t, closed, "the server observing the connection closed")
		})
	}
}

// An endpoint that refuses the tokens asked for is answered with the
// setting that changes them.
func TestRefusedTokensNameTheSetting(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"error":{"message":"max_tokens is too large: 65536. This model supports at most 16384 completion tokens, whereas you provided 65536.","type":"invalid_request_error","param":"max_tokens","code":"invalid_value"}}`)
	})
	b := up.backend(func(c *Config) { c.MaxCompletionTokens = 65536 })
	_, err := drain(t, open(t, b, model.Request{Messages: hello.Messages}))
	if err == nil || !strings.Contains(err.Error(), "supports at most 16384") || !strings.Contains(err.Error(), "-openai-max-completion-tokens") {
		t.Fatalf("error %v, want the endpoint's words and the setting to change", err)
	}
}
