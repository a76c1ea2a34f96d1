package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/net/http/httpguts"

	"github.com/honestcancel/gateway/tools"
)

func noRedirectClient(c *http.Client) *http.Client {
	var cp http.Client
	if c != nil {
		cp = *c
	}
	cp.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &cp
}

// webhook is the HTTP side of a webhook tool. Its headers hold secrets:
// they are sent, never printed.
type webhook struct {
	name, contract string
	url            string // as configured
	shown          string // url without query, for messages
	statusURL      string // "" when not configured
	timeout        time.Duration
	headers        http.Header // canonical names, ${NAME} expanded
	client         *http.Client
}

// errNotSent marks a failure before anything reached the network.
var errNotSent = errors.New("the request was not sent")

// answer is an HTTP answer: its status and body. For a 2xx the body is
// whole, unless over (larger than MaxResponseBytes); otherwise it is
// the beginning, enough for an excerpt.
type answer struct {
	code int
	body []byte
	over bool
}

// call makes one request bounded by the configured timeout and ctx.
func (h *webhook) call(ctx context.Context, method, target, shown, key string, body []byte) (answer, error) {
	callCtx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(callCtx, method, target, rd)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return answer{}, fmt.Errorf("webhook %s: %s %s: cannot build the request: %v (%w)", h.name, method, shown, err, errNotSent)
	}
	for k, vs := range h.headers {
		req.Header[k] = append([]string(nil), vs...)
	}
	if req.Header.Get("Accept") == "" {
		req.Header.Set("Accept", "application/json")
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return answer{}, h.transportError(ctx, callCtx, method, shown, "", err)
	}
	defer resp.Body.Close()
	a := answer{code: resp.StatusCode}
	limit := int64(MaxResponseBytes)
	if a.code/100 != 2 {
		limit = 4 << 10 // an excerpt is all that is shown
	}
	if resp.ContentLength > limit && a.code/100 == 2 {
		a.over = true
		return a, nil
	}
	a.body, err = io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return answer{}, h.transportError(ctx, callCtx, method, shown, "reading the answer: ", err)
	}
	if int64(len(a.body)) > limit {
		a.body = a.body[:limit]
		a.over = a.code/100 == 2
	}
	return a, nil
}

// transportError explains a failed exchange: the caller's cancel, the
// configured timeout, or the network.
func (h *webhook) transportError(parent, callCtx context.Context, method, shown, what string, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // its message repeats the url, query included
	}
	switch {
	case parent.Err() != nil:
		return fmt.Errorf("webhook %s: %s %s: %sstopped: %w", h.name, method, shown, what, context.Cause(parent))
	case errors.Is(callCtx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("webhook %s: %s %s: %sno answer within %s: %w", h.name, method, shown, what, h.timeout, context.DeadlineExceeded)
	}
	return fmt.Errorf("webhook %s: %s %s: %s%w", h.name, method, shown, what, err)
}

// result checks a 2xx answer and returns its body, compacted.
func (h *webhook) result(method, shown string, a answer) (json.RawMessage, error) {
	if a.over {
		return nil, fmt.Errorf("webhook %s: %s %s answered %d with a body larger than 1 MiB", h.name, method, shown, a.code)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, a.body); err != nil {
		return nil, fmt.Errorf("webhook %s: %s %s answered something that is not JSON (status %d): %s", h.name, method, shown, a.code, excerpt(a.body))
	}
	return json.RawMessage(buf.Bytes()), nil
}

func (h *webhook) statusError(method, shown string, a answer, rejected bool) *StatusError {
	return &StatusError{Tool: h.name, Method: method, URL: shown, StatusCode: a.code, Excerpt: excerpt(a.body), Rejected: rejected}
}

// post sends {"arguments": norm} with key.
func (h *webhook) post(ctx context.Context, key string, norm json.RawMessage) (answer, error) {
	body := make([]byte, 0, len(norm)+16)
	body = append(body, `{"arguments":`...)
	body = append(body, norm...)
	body = append(body, '}')
	return h.call(ctx, http.MethodPost, h.url, h.shown, key, body)
}

func checkKey(tool, key string) error {
	if key == "" {
		return fmt.Errorf("webhook %s: empty idempotency key (%w)", tool, errNotSent)
	}
	if !httpguts.ValidHeaderFieldValue(key) || !utf8.ValidString(key) {
		return fmt.Errorf("webhook %s: the idempotency key holds a control character or invalid UTF-8 (%w)", tool, errNotSent)
	}
	return nil
}

// excerpt is at most maxExcerptBytes of body, on one line, valid UTF-8.
func excerpt(body []byte) string {
	s := strings.TrimSpace(strings.ToValidUTF8(string(body), "\uFFFD"))
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) <= maxExcerptBytes {
		return s
	}
	cut := maxExcerptBytes - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// StatusError is a webhook's answer with an HTTP status the call
// does not accept.
type StatusError struct {
	Tool       string
	Method     string
	URL        string // without its query
	StatusCode int
	Excerpt    string // the start of the body, at most 200 bytes, one line
	// Rejected: a Commit the service refused for good (a 4xx other than
	// 408 and 429); the error then wraps tools.ErrRejected.
	Rejected bool
}

func (e *StatusError) Error() string {
	s := fmt.Sprintf("webhook %s: %s %s answered %d %s", e.Tool, e.Method, e.URL, e.StatusCode, http.StatusText(e.StatusCode))
	if e.Excerpt != "" {
		s += ": " + e.Excerpt
	}
	if e.Rejected {
		s += " (" + tools.ErrRejected.Error() + ")"
	}
	return s
}

// Unwrap returns tools.ErrRejected for a rejection.
func (e *StatusError) Unwrap() error {
	if e.Rejected {
		return tools.ErrRejected
	}
	return nil
}
