package chat

import (
	"errors"
	"fmt"
)

// Error codes of the protocol. Each maps to one HTTP status in the gateway.
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
