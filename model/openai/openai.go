// Package openai is a model.Backend for any OpenAI-compatible chat
// completions endpoint (OpenAI, a router, Ollama, vLLM, llama.cpp…), built on
// the official SDK github.com/openai/openai-go/v3.
//
// Every client setting is passed explicitly and the SDK's environment
// defaults are never loaded: OPENAI_BASE_URL, OPENAI_API_KEY, OPENAI_ORG_ID,
// OPENAI_PROJECT_ID, OPENAI_CUSTOM_HEADERS and the like have no effect. The
// API key goes only to the configured base URL (the SDK refuses requests and
// redirects to other origins) and is never logged or put in an error.
//
// A reply is streamed: text deltas become text chunks as they arrive; tool
// call deltas are assembled across chunks and handed over as one final
// Chunk{Call} when the stream finishes. The model package allows one call per
// step, so when the model asks for several calls at once only the first one
// (lowest index) is kept and the rest are ignored; the model sees the result
// of that call and may ask for the next one in the following step.
//
// Cancel: cancelling the context of Stream or of Next, or calling Close,
// cancels the HTTP request at once, which closes the upstream connection.
// There is no whole-stream timeout; an idle watchdog fails a stream when the
// endpoint sends nothing (no headers, no chunk) for Config.IdleTimeout.
// Retries happen only before the first token: connection errors, 408, 429
// and 5xx answers to the request itself are retried up to Config.MaxRetries
// times with a short backoff; a stream that breaks after it started is never
// retried (its text would be sent twice).
//
// Size: a request carries max_completion_tokens (Config.MaxCompletionTokens,
// or derived from the request's size limit, model.Request.MaxBytes); a
// reply the endpoint stops at a length limit (finish_reason "length") ends
// with a Truncated chunk. Within the size limit one event may hold at most
// maxEventBytes and a tool call's arguments at most the limit: past either
// the stream fails and its connection is closed, so an endpoint cannot
// make the gateway hold more than about a reply's worth of its output.
package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
	"golang.org/x/net/http/httpguts"

	"github.com/honestcancel/gateway/model"
)

// Defaults for the zero values of Config.
const (
	DefaultIdleTimeout = 60 * time.Second
	DefaultMaxRetries  = 2
)

// MaxDerivedCompletionTokens bounds the max_completion_tokens derived from
// a request's size limit: 16384 is the most that common chat models
// (gpt-4o, gpt-4o-mini) accept, and a larger value makes them refuse every
// request. A model that may write more (reasoning models count their
// reasoning in it) needs Config.MaxCompletionTokens.
const MaxDerivedCompletionTokens = 16384

// completionTokens is the max_completion_tokens asked for a reply of at
// most maxBytes bytes of text (0: no limit): explicit when the operator
// set it, otherwise a quarter of maxBytes rounded up (about four bytes of
// English per token), at most MaxDerivedCompletionTokens. 0: none sent.
func completionTokens(explicit int64, maxBytes int) int64 {
	switch {
	case explicit > 0:
		return explicit
	case maxBytes <= 0:
		return 0
	}
	return min(int64(maxBytes+3)/4, MaxDerivedCompletionTokens)
}

// FragmentPrefix starts the text of a user-saved fragment when it is sent
// upstream, so the model reads it as partial output and not a finished answer.
const FragmentPrefix = "[Saved fragment of an interrupted reply, kept by the user] "

// Config configures a Backend. BaseURL and Model are required.
type Config struct {
	// BaseURL of the API, including its version path, for example
	// https://api.openai.com/v1 or http://127.0.0.1:11434/v1.
	BaseURL string
	// Model name sent with every request.
	Model string
	// APIKey is sent as "Authorization: Bearer KEY" (nothing when empty, for
	// local servers that need no key). It is never logged: Config's String,
	// GoString and LogValue print it redacted.
	APIKey string
	// Headers are extra request headers (for example a router's).
	Headers map[string]string
	// Temperature, when set, is sent with every request (0 to 2).
	Temperature *float64
	// IdleTimeout fails a stream when nothing arrives for this long: neither
	// the response headers nor a chunk. 0 means DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxRetries bounds the retries before the first token. 0 means
	// DefaultMaxRetries; a negative value disables retries.
	MaxRetries int
	// HTTPClient sends the requests; nil means a client of its own. Leave its
	// Timeout 0: it would cap the whole stream (use IdleTimeout instead).
	HTTPClient *http.Client
	// MaxCompletionTokens is sent as max_completion_tokens with every
	// reply request. 0 derives it from the request's size limit
	// (model.Request.MaxBytes; see completionTokens).
	MaxCompletionTokens int64
}

// String describes c without its API key.
func (c Config) String() string {
	key := "none"
	if c.APIKey != "" {
		key = "[redacted]"
	}
	return fmt.Sprintf("openai.Config{BaseURL: %q, Model: %q, APIKey: %s, Headers: %v}", c.BaseURL, c.Model, key, slices.Sorted(maps.Keys(c.Headers)))
}

// GoString is String, so %#v does not print the API key either.
func (c Config) GoString() string { return c.String() }

// LogValue keeps the API key out of structured logs.
func (c Config) LogValue() slog.Value { return slog.StringValue(c.String()) }

// Backend streams chat completions from one endpoint. It is safe for
// concurrent use; each Stream it returns is used by one goroutine, except
// that Close may be called concurrently with Next.
type Backend struct {
	svc         sdk.ChatCompletionService
	model       string
	temperature *float64
	maxTokens   int64 // Config.MaxCompletionTokens
	idle        time.Duration
	retries     int
	backoff     time.Duration // first retry delay, doubled per retry
	maxBackoff  time.Duration
	maxWait     time.Duration // longest Retry-After honoured
}

var _ model.Backend = (*Backend)(nil)

// ModelName is the model name every request asks for.
func (b *Backend) ModelName() string { return b.model }

// Validate reports what is wrong with cfg, in words that say what to set;
// New calls it. It makes no request.
func (cfg Config) Validate() error {
	if strings.TrimSpace(cfg.BaseURL) == "" {
		return errors.New("the OpenAI base URL is empty: set it to the API's URL, for example https://api.openai.com/v1")
	}
	u, err := url.Parse(cfg.BaseURL)
	if err != nil {
		// (Not quoted: what does not parse may hold a credential.)
		return errors.New("the OpenAI base URL does not parse as a URL: set it to the API's URL, for example https://api.openai.com/v1")
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("the OpenAI base URL %q is not an http(s) URL: set it to the API's URL, for example https://api.openai.com/v1", u.Redacted())
	}
	if u.User != nil {
		return errors.New("the OpenAI base URL must not contain credentials: pass the API key separately")
	}
	if strings.TrimSpace(cfg.Model) == "" {
		return errors.New("the OpenAI model name is empty: set the model to use, for example gpt-4o-mini")
	}
	for name, value := range cfg.Headers {
		if !httpguts.ValidHeaderFieldName(name) {
			return fmt.Errorf("header name %q is not valid: use the form Name: value", name)
		}
		if strings.ContainsAny(value, "\r\n\x00") {
			return fmt.Errorf("the value of header %s contains a line break", name)
		}
		if strings.EqualFold(name, "Authorization") && cfg.APIKey != "" {
			return errors.New("both an API key and an Authorization header are set: keep only one")
		}
	}
	if t := cfg.Temperature; t != nil && (math.IsNaN(*t) || *t < 0 || *t > 2) {
		return fmt.Errorf("temperature %v is out of range: use a number from 0 to 2", *t)
	}
	if cfg.IdleTimeout < 0 {
		return errors.New("the idle timeout must not be negative")
	}
	if cfg.MaxCompletionTokens < 0 {
		return errors.New("max_completion_tokens must not be negative: use 0 to derive it from the reply size limit")
	}
	return nil
}

// New checks cfg (Validate) and returns a backend. It makes no request.
func New(cfg Config) (*Backend, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	idle := cfg.IdleTimeout
	if idle == 0 {
		idle = DefaultIdleTimeout
	}
	retries := cfg.MaxRetries
	switch {
	case retries == 0:
		retries = DefaultMaxRetries
	case retries < 0:
		retries = 0
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{}
		if t, ok := http.DefaultTransport.(*http.Transport); ok {
			hc.Transport = t.Clone()
		}
	}
	// Every option the SDK would otherwise take from its defaults or the
	// environment is set here. The service is built directly rather than
	// through sdk.NewClient, which reads OPENAI_* variables.
	opts := []option.RequestOption{
		option.WithBaseURL(cfg.BaseURL),
		option.WithAPIKey(cfg.APIKey),
		option.WithHTTPClient(hc),
		option.WithMaxRetries(0), // retried here, and only before the first token
		option.WithRequestTimeout(0),
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.Headers)) {
		opts = append(opts, option.WithHeader(name, cfg.Headers[name]))
	}
	var temp *float64
	if cfg.Temperature != nil {
		t := *cfg.Temperature
		temp = &t
	}
	return &Backend{
		svc:         sdk.NewChatCompletionService(opts...),
		model:       cfg.Model,
		temperature: temp,
		maxTokens:   cfg.MaxCompletionTokens,
		idle:        idle,
		retries:     retries,
		backoff:     250 * time.Millisecond,
		maxBackoff:  4 * time.Second,
		maxWait:     20 * time.Second,
	}, nil
}

// Stream starts a reply for req. It makes no request yet: the first Next
// sends it (with its retries), so every upstream error is returned by Next.
func (b *Backend) Stream(ctx context.Context, req model.Request) (model.Stream, error) {
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	params, err := b.params(req)
	if err != nil {
		return nil, err
	}
	return newStream(ctx, b, params, req.MaxBytes), nil
}

// params builds the streaming chat completion request for req.
func (b *Backend) params(req model.Request) (sdk.ChatCompletionNewParams, error) {
	p := sdk.ChatCompletionNewParams{
		Model:         shared.ChatModel(b.model),
		Messages:      messages(req),
		StreamOptions: sdk.ChatCompletionStreamOptionsParam{IncludeUsage: sdk.Bool(true)},
	}
	if b.temperature != nil {
		p.Temperature = sdk.Float(*b.temperature)
	}
	if n := completionTokens(b.maxTokens, req.MaxBytes); n > 0 {
		p.MaxCompletionTokens = sdk.Int(n)
	}
	for _, t := range req.Tools {
		def := shared.FunctionDefinitionParam{Name: t.Name}
		if t.Description != "" {
			def.Description = sdk.String(t.Description)
		}
		params := shared.FunctionParameters{"type": "object", "properties": map[string]any{}}
		if len(t.Parameters) > 0 {
			params = nil
			if err := json.Unmarshal(t.Parameters, &params); err != nil || params == nil {
				return p, fmt.Errorf("tool %s: its parameters are not a JSON Schema object", t.Name)
			}
		}
		def.Parameters = params
		p.Tools = append(p.Tools, sdk.ChatCompletionFunctionTool(def))
	}
	return p, nil
}

// messages maps the confirmed conversation to chat messages: the resume note
// first as a system message, fragments as assistant text marked with
// FragmentPrefix, cards as assistant text, and each tool message as the
// assistant's tool call followed by the tool's result.
func messages(req model.Request) []sdk.ChatCompletionMessageParamUnion {
	out := make([]sdk.ChatCompletionMessageParamUnion, 0, len(req.Messages)+1)
	if req.ResumeNote != "" {
		out = append(out, sdk.SystemMessage(req.ResumeNote))
	}
	for i, m := range req.Messages {
		switch {
		case m.Fragment:
			out = append(out, sdk.AssistantMessage(FragmentPrefix+m.Content))
		case m.Role == model.RoleSystem:
			out = append(out, sdk.SystemMessage(m.Content))
		case m.Role == model.RoleAssistant:
			out = append(out, sdk.AssistantMessage(m.Content))
		case m.Role == model.RoleTool && m.Call != nil:
			id := m.Call.ID
			if id == "" {
				id = fmt.Sprintf("call_%d", i)
			}
			args := strings.TrimSpace(string(m.Call.Arguments))
			if args == "" {
				args = "{}"
			}
			out = append(out, sdk.ChatCompletionMessageParamUnion{OfAssistant: &sdk.ChatCompletionAssistantMessageParam{
				ToolCalls: []sdk.ChatCompletionMessageToolCallUnionParam{{OfFunction: &sdk.ChatCompletionMessageFunctionToolCallParam{
					ID:       id,
					Function: sdk.ChatCompletionMessageFunctionToolCallFunctionParam{Name: m.Call.Name, Arguments: args},
				}}},
			}})
			content := m.Content
			if content == "" {
				content = "null"
			}
			out = append(out, sdk.ToolMessage(content, id))
		case m.Role == model.RoleTool:
			// A tool result whose call is unknown cannot be a tool message
			// (it needs a call id): keep it as text.
			out = append(out, sdk.AssistantMessage("[Tool result] "+m.Content))
		default:
			out = append(out, sdk.UserMessage(m.Content))
		}
	}
	return out
}
