// Package webhook is the operator's own tools: HTTP endpoints listed in a
// config file (-tools-config, format at Load), each with the contract the
// operator gives it. A cancellable or idempotent one is a Runner (one POST
// per call, the idempotency key in its header); a consequential one a
// Committer (POSTed once after the user confirms, its outcome looked up by
// key at status_url when nobody saw the answer).
package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/net/http/httpguts"

	"github.com/honestcancel/gateway/tools"
	"github.com/honestcancel/gateway/tools/schema"
)

// Webhook limits and defaults.
const (
	// DefaultTimeout bounds one HTTP call when "timeout" is absent.
	DefaultTimeout = 10 * time.Second
	// MaxTimeout is the largest "timeout" accepted.
	MaxTimeout = 10 * time.Minute
	// MaxResponseBytes is the largest answer body accepted (1 MiB).
	MaxResponseBytes = 1 << 20
	// maxExcerptBytes bounds the body excerpt in a StatusError.
	maxExcerptBytes = 200
	// maxDescriptionBytes bounds a webhook tool's description.
	maxDescriptionBytes = 4096
)

// Runner is a cancellable or idempotent webhook tool.
type Runner struct {
	*schema.Tool
	hook *webhook
}

var _ tools.Runner = (*Runner)(nil)

// Run implements tools.Runner: it validates args and POSTs them with key as
// Idempotency-Key. The result is the 2xx answer's JSON body.
func (t *Runner) Run(ctx context.Context, key string, args json.RawMessage) (json.RawMessage, error) {
	if err := checkKey(t.hook.name, key); err != nil {
		return nil, err
	}
	norm, err := t.Validate(args)
	if err != nil {
		return nil, err
	}
	a, err := t.hook.post(ctx, key, norm)
	if err != nil {
		return nil, err
	}
	if a.code/100 != 2 {
		return nil, t.hook.statusError(http.MethodPost, t.hook.shown, a, false)
	}
	return t.hook.result(http.MethodPost, t.hook.shown, a)
}

// Committer is a consequential webhook tool.
type Committer struct {
	*schema.Tool
	hook *webhook
}

var _ tools.Resender = (*Committer)(nil)

// ResendSafe implements tools.Resender: the service must act at most once
// per Idempotency-Key (see Load), so a call whose answer was lost is sent
// again under its key.
func (t *Committer) ResendSafe() bool { return true }

// Key is the idempotency key of the consequential webhook tool name
// called with the normalised arguments norm in scope:
// "<name>:<scope>:<16 hex of sha256(norm)>:commit".
func Key(name, scope string, norm json.RawMessage) string { return tools.ActionKey(name, scope, norm) }

// Prepare implements tools.Committer: the preview is the normalised arguments,
// and the key depends on the tool, scope and those arguments only.
func (t *Committer) Prepare(scope string, args json.RawMessage) (json.RawMessage, string, error) {
	if scope == "" {
		return nil, "", fmt.Errorf("webhook %s: empty scope", t.hook.name)
	}
	if !httpguts.ValidHeaderFieldValue(scope) || !utf8.ValidString(scope) {
		return nil, "", fmt.Errorf("webhook %s: the scope holds a control character or invalid UTF-8", t.hook.name)
	}
	norm, err := t.Validate(args)
	if err != nil {
		return nil, "", err
	}
	return append(json.RawMessage(nil), norm...), Key(t.hook.name, scope, norm), nil
}

// Commit implements tools.Committer: it POSTs the arguments with key as
// Idempotency-Key. An error wrapping tools.ErrRejected means nothing was done (the
// service refused with a 4xx other than 408, 409 and 429, or the arguments
// or key were invalid so nothing was sent); any other error leaves the
// outcome unknown until Status says.
func (t *Committer) Commit(ctx context.Context, key string, args json.RawMessage) (json.RawMessage, error) {
	if err := checkKey(t.hook.name, key); err != nil {
		return nil, fmt.Errorf("%w: %w", tools.ErrRejected, err)
	}
	norm, err := t.Validate(args)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", tools.ErrRejected, err)
	}
	a, err := t.hook.post(ctx, key, norm)
	if err != nil {
		if errors.Is(err, errNotSent) {
			return nil, fmt.Errorf("%w: %w", tools.ErrRejected, err)
		}
		return nil, err // it may have acted: unknown
	}
	switch c := a.code; {
	case c/100 == 2:
		res, err := t.hook.result(http.MethodPost, t.hook.shown, a)
		if err != nil {
			return nil, fmt.Errorf("%w; the outcome is unknown", err)
		}
		return res, nil
	case c/100 == 4 && c != http.StatusRequestTimeout && c != http.StatusConflict && c != http.StatusTooManyRequests:
		return nil, t.hook.statusError(http.MethodPost, t.hook.shown, a, true)
	}
	return nil, t.hook.statusError(http.MethodPost, t.hook.shown, a, false)
}

// Status implements tools.Committer by GETting status_url for key: 200 with a
// JSON body is Known, 404 is not known (yet), anything else is an error.
// Without status_url it always returns an error: the outcome cannot be
// reconciled.
func (t *Committer) Status(ctx context.Context, key string) (tools.Status, error) {
	h := t.hook
	if h.statusURL == "" {
		return tools.Status{}, fmt.Errorf("webhook %s: no status_url is configured, so the outcome of key %q cannot be looked up and stays unknown", h.name, key)
	}
	if err := checkKey(h.name, key); err != nil {
		return tools.Status{}, err
	}
	target := statusTarget(h.statusURL, key)
	shown := target
	if u, err := url.Parse(target); err == nil {
		shown = shownURL(u)
	}
	a, err := h.call(ctx, http.MethodGet, target, shown, "", nil)
	if err != nil {
		return tools.Status{}, err
	}
	switch a.code {
	case http.StatusOK:
		res, err := h.result(http.MethodGet, shown, a)
		if err != nil {
			return tools.Status{}, err
		}
		return tools.Status{Known: true, Result: res}, nil
	case http.StatusNotFound:
		return tools.Status{}, nil
	}
	return tools.Status{}, h.statusError(http.MethodGet, shown, a, false)
}

// statusTarget replaces every {key} in tmpl with key, escaped for the path
// or, after the "?", for the query.
func statusTarget(tmpl, key string) string {
	path, query, hasQuery := strings.Cut(tmpl, "?")
	out := strings.ReplaceAll(path, keyPlaceholder, url.PathEscape(key))
	if hasQuery {
		out += "?" + strings.ReplaceAll(query, keyPlaceholder, url.QueryEscape(key))
	}
	return out
}

// String describes the tool without its headers.
func (t *Runner) String() string { return describeWebhook(t.hook) }

// String describes the tool without its headers.
func (t *Committer) String() string { return describeWebhook(t.hook) }

func describeWebhook(h *webhook) string {
	return "webhook " + h.name + " (" + h.contract + ", POST " + h.shown + ", timeout " + h.timeout.String() + ", " + strconv.Itoa(len(h.headers)) + " configured headers)"
}
