package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// Errors of the client itself (not the server's answers, which are *Error).
var (
	// ErrClosed: the Conn, Subscription or Stream was closed by its owner
	// (or, for a Subscription, unsubscribed).
	ErrClosed = errors.New("client: closed")
	// ErrConnectionLost: the WebSocket connection dropped after a command
	// was sent and before its answer came, so whether the server ran it is
	// not known. Read the thread (its events or snapshot) to find out, or
	// retry a command that is safe to repeat (run.start with a
	// client_request_id is: the Conn resends it by itself).
	ErrConnectionLost = errors.New("client: connection lost before the answer: the command's outcome is unknown")
	// ErrThreadDeleted ends a Subscription or Stream after it delivered the
	// thread's last event, thread.deleted.
	ErrThreadDeleted = errors.New("client: the thread was deleted")
	// errIdle ends a connection that received nothing for the idle
	// timeout (see WithIdleTimeout); it is reconnected.
	errIdle = errors.New("client: the connection was taken for dead")
)

// Error is the server's answer to a request or command that failed: the
// protocol's one error shape ({"error": code, "message": …, extra
// fields}), over HTTP, over WebSocket (an error frame) and in an event
// stream (an `error` event). Use errors.As to get it:
//
//	var e *client.Error
//	if errors.As(err, &e) && e.Code == chat.CodeStateVersionConflict {
//		// reload, or fork from e.CurrentCheckpointID …
//	}
//
// An Error is immutable once returned and safe to share.
type Error struct {
	// Status is the HTTP status of the answer. Over WebSocket, where there
	// is none, it is the status the protocol gives the code
	// (chat.HTTPStatus), so a program can treat both alike.
	Status int
	// Code is the protocol's error code (chat.Code…): state_version_conflict,
	// not_found, rate_limited, … It is "" when the answer was not in the
	// protocol's shape (a proxy's error page, say); Message then holds the
	// start of the body.
	Code string
	// Message is the server's explanation, fit to show to a user.
	Message string
	// Re is the id of the WebSocket command answered ("" over HTTP).
	Re string
	// Fields holds every other field of the error object as sent
	// (current_state_version, allowed_actions, run_id, …), for the ones
	// not decoded below.
	Fields map[string]json.RawMessage

	// Details decoded from Fields, by the code that carries them:
	//
	// state_version_conflict: CurrentStateVersion, CurrentCheckpointID,
	// AllowedActions. run_not_active: RunID, RunStatus. run_already_active:
	// RunID. operation_not_pending: OperationID, Phase. rate_limited:
	// RetryAfter (from retry_after_seconds, or the Retry-After header).
	// fragment_unavailable: Cause (chat.Cause…: why the server does not
	// hold the text) and KnownLastSeq (the last seq it still holds, when
	// part of it is known).
	CurrentStateVersion int64
	CurrentCheckpointID string
	AllowedActions      []string
	RunID               string
	RunStatus           chat.RunStatus
	OperationID         string
	Phase               string
	RetryAfter          time.Duration
	Cause               string
	KnownLastSeq        int64
}

func (e *Error) Error() string {
	code := e.Code
	if code == "" {
		code = "HTTP " + strconv.Itoa(e.Status)
	}
	if e.Message == "" {
		return "gateway: " + code
	}
	return "gateway: " + code + ": " + e.Message
}

// Detail decodes the extra field key of the error object into v; it
// reports false when the error has no such field.
func (e *Error) Detail(key string, v any) bool {
	raw, ok := e.Fields[key]
	return ok && json.Unmarshal(raw, v) == nil
}

// ErrorCode returns the protocol error code of err when it is (or wraps)
// an *Error, and "" otherwise.
func ErrorCode(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// parseError reads an error object (HTTP body, WebSocket frame or the data
// of an SSE error event). status 0 takes the code's status.
func parseError(status int, header http.Header, body []byte) *Error {
	var obj map[string]json.RawMessage
	e := &Error{Status: status}
	if json.Unmarshal(body, &obj) != nil || obj["error"] == nil {
		if e.Status == 0 {
			e.Status = http.StatusInternalServerError
		}
		msg := strings.TrimSpace(string(body))
		if len(msg) > 200 {
			msg = msg[:200] + "…"
		}
		e.Message = msg
		return e
	}
	_ = json.Unmarshal(obj["error"], &e.Code)
	_ = json.Unmarshal(obj["message"], &e.Message)
	_ = json.Unmarshal(obj["re"], &e.Re)
	for _, k := range []string{"type", "error", "message", "re"} {
		delete(obj, k)
	}
	if len(obj) > 0 {
		e.Fields = obj
	}
	if e.Status == 0 {
		e.Status = chat.HTTPStatus(e.Code)
	}
	e.Detail("current_state_version", &e.CurrentStateVersion)
	e.Detail("current_checkpoint_id", &e.CurrentCheckpointID)
	e.Detail("allowed_actions", &e.AllowedActions)
	e.Detail("run_id", &e.RunID)
	e.Detail("operation_id", &e.OperationID)
	e.Detail("phase", &e.Phase)
	e.Detail("cause", &e.Cause)
	e.Detail("known_last_seq", &e.KnownLastSeq)
	if e.Code == chat.CodeRunNotActive {
		e.Detail("status", &e.RunStatus)
	}
	var secs int64
	if e.Detail("retry_after_seconds", &secs) {
		e.RetryAfter = time.Duration(secs) * time.Second
	} else if v := header.Get("Retry-After"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			e.RetryAfter = time.Duration(n) * time.Second
		}
	}
	return e
}

// retryable reports whether err is worth another connection attempt: a
// network failure, a server error, rate_limited (too many connections);
// not an answer that will not change by itself (unauthorized, forbidden,
// not_found, invalid_request).
func retryable(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return true
	}
	return e.Status == http.StatusTooManyRequests || e.Status >= 500
}

// lostError wraps ErrConnectionLost with what was lost.
func lostError(typ string, cause error) error {
	if cause == nil {
		return fmt.Errorf("%s: %w", typ, ErrConnectionLost)
	}
	return fmt.Errorf("%s: %w (%v)", typ, ErrConnectionLost, cause)
}
