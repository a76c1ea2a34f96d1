package chat

import (
	"errors"
	"fmt"
	"net/http"
)

// Error codes of the protocol. Each maps to one HTTP status (HTTPStatus).
const (
	CodeStateVersionConflict = "state_version_conflict"
	CodeCheckpointNotFound   = "checkpoint_not_found"
	CodeRunNotActive         = "run_not_active"
	CodeRunAlreadyActive     = "run_already_active"
	CodeOperationNotPending  = "operation_not_pending"
	CodeFragmentUnavailable  = "fragment_unavailable"
	CodeNotFound             = "not_found"
	CodeInvalidRequest       = "invalid_request"
	CodeUnauthorized         = "unauthorized"
	CodeForbidden            = "forbidden"
	CodeRateLimited          = "rate_limited"
	CodeInternal             = "internal"
)

// Causes of fragment_unavailable (its "cause" field): why the server
// does not hold the streamed text a client asked for.
const (
	// CauseServerStopped: the server stopped (a crash, or a stop that could
	// not write) before the deltas were written; they were recorded lost.
	CauseServerStopped = "server_stopped"
	// CauseExpired: the deltas aged out of the stream buffer.
	CauseExpired = "expired"
	// CauseWrittenPast: on PostgreSQL, another instance recorded the seqs
	// lost because the instance streaming them stalled (streambuf.go).
	CauseWrittenPast = "written_past"
)

// Error is the one error type that crosses package boundaries towards
// clients. Code is a protocol code, Message is safe to show to a user and
// says what to do, Fields are the code's extra fields (for example
// current_state_version). Any other error reaching the edge is internal.
type Error struct {
	Code    string
	Message string
	Fields  map[string]any
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Errorf builds an *Error with a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// With returns e with one more extra field.
func (e *Error) With(key string, value any) *Error {
	if e.Fields == nil {
		e.Fields = map[string]any{}
	}
	e.Fields[key] = value
	return e
}

// ErrorCode returns the protocol code of err: its *Error's code, or internal.
func ErrorCode(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// NotFound is the answer for an unknown id or one the caller may not see.
func NotFound(kind, id string) *Error {
	return Errorf(CodeNotFound, "no %s %q: check the id, or reload the thread list", kind, id)
}

// Invalid is the answer for a request that cannot be understood.
func Invalid(format string, args ...any) *Error {
	return Errorf(CodeInvalidRequest, format, args...)
}

// HTTPStatus maps each protocol error code to its HTTP status. It is the
// only place that does (the API and the pages both use it).
func HTTPStatus(code string) int {
	switch code {
	case CodeStateVersionConflict, CodeRunNotActive, CodeRunAlreadyActive, CodeOperationNotPending:
		return http.StatusConflict
	case CodeCheckpointNotFound, CodeNotFound:
		return http.StatusNotFound
	case CodeFragmentUnavailable:
		return http.StatusGone
	case CodeInvalidRequest:
		return http.StatusBadRequest
	case CodeUnauthorized:
		return http.StatusUnauthorized
	case CodeForbidden:
		return http.StatusForbidden
	case CodeRateLimited:
		return http.StatusTooManyRequests
	default:
		return http.StatusInternalServerError
	}
}

// RetryAfter reports when a rate_limited error says to try again
// (retry_after_seconds), for an HTTP Retry-After header.
func RetryAfter(err error) (seconds int, ok bool) {
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeRateLimited {
		return 0, false
	}
	seconds, ok = e.Fields["retry_after_seconds"].(int)
	return seconds, ok
}
