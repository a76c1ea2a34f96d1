package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	sdk "github.com/openai/openai-go/v3"
)

// Kind classifies an upstream failure.
type Kind int

const (
	KindConnect      Kind = iota + 1 // the endpoint could not be reached
	KindAuth                         // 401 or 403
	KindRateLimit                    // 429
	KindUpstream                     // 5xx, or an error event in the stream
	KindRequest                      // another 4xx: the request was refused
	KindIdle                         // the idle watchdog stopped the request
	KindBrokenStream                 // the stream ended before the reply did
	KindBadReply                     // the reply cannot be used (bad tool call, unreadable chunk)
	KindRefused                      // the endpoint's content filter stopped the reply
)

// Error is an upstream failure, with a message written for the user. It
// never contains the API key.
type Error struct {
	Kind Kind
	// StatusCode is the HTTP status of a refused request (0 otherwise).
	StatusCode int
	msg        string
	err        error
}

func (e *Error) Error() string { return e.msg }

// Unwrap returns the underlying error (an SDK or transport error), if any.
func (e *Error) Unwrap() error { return e.err }

const msgBroken = "the model's stream broke off before the reply was complete"

// requestError explains a request that got no streaming response: status is
// 0 for a transport error. retries is how many retries were made.
func requestError(err error, status int, res *http.Response, retries int, model string) error {
	var detail string
	if res != nil {
		detail = responseMessage(err, res)
	}
	after := ""
	if retries > 0 {
		after = fmt.Sprintf(" (tried %d times)", retries+1)
	}
	with := func(s string) string {
		if detail == "" {
			return s
		}
		return s + ": " + detail
	}
	switch {
	case status == 0:
		return &Error{Kind: KindConnect, msg: "could not reach the model endpoint" + after + ": " + transportMessage(err), err: err}
	case status == http.StatusUnauthorized:
		// The body is left out: some servers echo the key they refused.
		return &Error{Kind: KindAuth, StatusCode: status, msg: "the model endpoint refused the API key (401): check GATEWAY_OPENAI_API_KEY", err: err}
	case status == http.StatusForbidden:
		return &Error{Kind: KindAuth, StatusCode: status, msg: fmt.Sprintf("the model endpoint denied access (403): check that the API key may use the model %q", model), err: err}
	case status == http.StatusTooManyRequests:
		return &Error{Kind: KindRateLimit, StatusCode: status, msg: with("the model endpoint is rate limiting requests (429)" + after + "; try again later"), err: err}
	case status >= 500:
		return &Error{Kind: KindUpstream, StatusCode: status, msg: with(fmt.Sprintf("the model endpoint had an upstream error (HTTP %d)%s; try again later", status, after)), err: err}
	case status == http.StatusNotFound:
		return &Error{Kind: KindRequest, StatusCode: status, msg: with(fmt.Sprintf("the model endpoint answered 404 for model %q: check GATEWAY_OPENAI_MODEL and GATEWAY_OPENAI_BASE_URL (it usually ends in /v1)", model)), err: err}
	case tokensRefused(detail):
		return &Error{Kind: KindRequest, StatusCode: status, msg: with(fmt.Sprintf("the model endpoint rejected the request (HTTP %d)", status)) +
			". The request's max_completion_tokens comes from the reply size limit: set -openai-max-completion-tokens (GATEWAY_OPENAI_MAX_COMPLETION_TOKENS) to what this model allows", err: err}
	default:
		return &Error{Kind: KindRequest, StatusCode: status, msg: with(fmt.Sprintf("the model endpoint rejected the request (HTTP %d)", status)), err: err}
	}
}

// tokensRefused reports whether an endpoint's explanation of a refused
// request is about the completion tokens asked for (OpenAI names the
// field; vLLM and others say how many tokens went "in the completion").
func tokensRefused(detail string) bool {
	d := strings.ToLower(detail)
	return strings.Contains(d, "max_completion_tokens") || strings.Contains(d, "max_tokens") || strings.Contains(d, "in the completion")
}

// responseMessage is the upstream's own explanation of a refused request,
// shortened to one line: the SDK's error message, or the body's
// error.message or text.
func responseMessage(err error, res *http.Response) string {
	var api *sdk.Error
	if errors.As(err, &api) && api.Message != "" {
		return oneLine(api.Message)
	}
	if res.Body == nil {
		return ""
	}
	body, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
	if msg := upstreamMessage(body); msg != "" {
		return msg
	}
	if strings.Contains(res.Header.Get("Content-Type"), "text/plain") {
		return oneLine(string(body))
	}
	return ""
}

// upstreamMessage finds error.message (or a string error, or message) in a
// JSON document.
func upstreamMessage(data []byte) string {
	var doc struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	if json.Unmarshal(data, &doc) != nil {
		return ""
	}
	var inner struct {
		Message string `json:"message"`
	}
	var text string
	switch {
	case json.Unmarshal(doc.Error, &inner) == nil && inner.Message != "":
		return oneLine(inner.Message)
	case json.Unmarshal(doc.Error, &text) == nil && text != "":
		return oneLine(text)
	}
	return oneLine(doc.Message)
}

// transportMessage is a transport error without the SDK's or net/http's
// wrapping ("Post URL: ...").
func transportMessage(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return oneLine(err.Error())
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	const limit = 300
	if len(s) > limit {
		cut := limit
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}
