// Requests: errors and retries before the first token, what is sent (the
// body, the key, nothing taken from the environment), and the configuration.

package openai

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/honestcancel/gateway/model"
)

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
		{"a URL that does not parse, not quoted (it may hold a key)", Config{BaseURL: "https://user:s3cret%zz@example.com/v1", Model: "m"}, "does not parse as a URL"},
		{"not http, shown without its password", Config{BaseURL: "ftp://user:s3cret@example.com/v1", Model: "m"}, `"ftp://user:xxxxx@example.com/v1" is not an http(s) URL`},
		{"no model", Config{BaseURL: "https://example.com/v1"}, "model name is empty"},
		{"bad header name", Config{BaseURL: "https://example.com/v1", Model: "m", Headers: map[string]string{"Bad Name": "x"}}, "header name"},
		{"header line break", Config{BaseURL: "https://example.com/v1", Model: "m", Headers: map[string]string{"X-A": "a\r\nX-B: b"}}, "line break"},
		{"key and Authorization", Config{BaseURL: "https://example.com/v1", Model: "m", APIKey: "k", Headers: map[string]string{"authorization": "Bearer x"}}, "keep only one"},
		{"temperature", Config{BaseURL: "https://example.com/v1", Model: "m", Temperature: &bad}, "temperature"},
		{"negative idle", Config{BaseURL: "https://example.com/v1", Model: "m", IdleTimeout: -time.Second}, "idle timeout"},
	} {
		if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "s3cret") {
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
