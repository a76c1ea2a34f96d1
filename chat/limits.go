package chat

import "unicode/utf8"

// Limits on what a client may send, the same whichever way it comes (the
// API, the WebSocket, the page's forms, a program driving the engine).
// Over one, the answer is invalid_request naming the field and the limit,
// and nothing is executed. (MaxTitleBytes and CheckTitle are in title.go.)
const (
	MaxUserMessageBytes     = 32768 // run.start's user_message
	MaxReasonBytes          = 200   // run.cancel's reason
	MaxClientRequestIDBytes = 128   // run.start's client_request_id
	MaxTabIDBytes           = 64    // hello's tab_id
	MaxIDBytes              = 64    // any id of an object a client names
	MaxCursorBytes          = 128   // the thread list's cursor
	MaxSearchBytes          = 200   // the thread list's q
)

// Limits on what a model may write and what a page of history holds. A
// reply is cut at the reply limit (the engine stops the model there and
// publishes what was streamed, marked TruncatedSizeLimit); the operator
// sets it (-max-reply-bytes) between MinReplyBytes and MaxReplyBytes,
// a bound that keeps the conversation page loadable with the longest reply
// allowed. A page of history (GET /api/threads/{id}/messages, and the
// conversation page's first paint) holds at most MaxHistoryPage messages
// and, but for its latest message, HistoryPageBytes of their content.
const (
	DefaultReplyBytes  = 256 << 10
	MinReplyBytes      = 1 << 10
	MaxReplyBytes      = 4 << 20
	DefaultHistoryPage = 50
	MaxHistoryPage     = 200
	HistoryPageBytes   = 1 << 20
)

// CheckText validates a text field's length in bytes and its encoding.
func CheckText(field, v string, minBytes, maxBytes int) error {
	if len(v) < minBytes {
		return Invalid("%s must not be empty", field)
	}
	if len(v) > maxBytes {
		return Invalid("%s is %d bytes; the maximum is %d", field, len(v), maxBytes)
	}
	if !utf8.ValidString(v) {
		return Invalid("%s is not valid UTF-8", field)
	}
	return nil
}

// CheckID validates an object id a client names (thread_id, run_id, …):
// required, and at most MaxIDBytes (the server's ids are about 30).
func CheckID(field, v string) error {
	if v == "" {
		return Invalid("%s is required", field)
	}
	if len(v) > MaxIDBytes {
		return Invalid("%s is %d bytes; ids are at most %d bytes", field, len(v), MaxIDBytes)
	}
	return nil
}

// Validate checks run.start's fields against the protocol's limits: the
// user message (when there is one), the checkpoint to resume from and the
// client's request id (when given). The caller and the thread are the
// transport's to establish.
func (p StartRun) Validate() error {
	if err := CheckVersion(p.ExpectedStateVersion); err != nil {
		return err
	}
	if p.UserMessage != nil {
		if err := CheckText("user_message", *p.UserMessage, 1, MaxUserMessageBytes); err != nil {
			return err
		}
	}
	if p.ResumeFromCheckpointID != "" {
		if err := CheckID("resume_from_checkpoint_id", p.ResumeFromCheckpointID); err != nil {
			return err
		}
	}
	if p.ClientRequestID != "" {
		if err := CheckText("client_request_id", p.ClientRequestID, 1, MaxClientRequestIDBytes); err != nil {
			return err
		}
	}
	if p.Response != nil {
		return p.Response.Validate()
	}
	return nil
}

// Validate checks run.cancel's fields: the run's id and the reason.
func (p CancelRun) Validate() error {
	return firstError(CheckID("run_id", p.RunID), CheckText("reason", p.Reason, 1, MaxReasonBytes))
}

// firstError is the first of errs that is not nil: a command's checks, in
// the order its fields are reported.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// CheckVersion refuses a negative expected_state_version (a tab that has
// applied nothing sends 0).
func CheckVersion(v int64) error {
	if v < 0 {
		return Invalid(
			"expected_state_version must not be negative: send the state_version of the last event you applied",
		)
	}
	return nil
}

// checkOptionalVersion checks an expected_state_version a command may
// leave out.
func checkOptionalVersion(v *int64) error {
	if v == nil {
		return nil
	}
	return CheckVersion(*v)
}

// Validate checks fragment.save's fields: the streamed message, the last
// delta the tab displayed (a seq, so at least 1) and the version.
func (p SaveFragment) Validate() error {
	if err := CheckID("message_id", p.MessageID); err != nil {
		return err
	}
	if err := p.Text().Validate(); err != nil {
		return err
	}
	return CheckVersion(p.ExpectedStateVersion)
}

// Text is the streamed text p would keep.
func (p SaveFragment) Text() StreamedTextQuery {
	return StreamedTextQuery{UserID: p.UserID, ThreadID: p.ThreadID, MessageID: p.MessageID, LastSeq: p.LastSeq}
}

// Validate checks a streamed-text query: the message and the last delta
// displayed (a seq, so at least 1).
func (q StreamedTextQuery) Validate() error {
	if err := CheckID("message_id", q.MessageID); err != nil {
		return err
	}
	if q.LastSeq < 1 {
		return Invalid("last_seq must be at least 1: the seq of the last delta you displayed")
	}
	return nil
}

// Validate checks draft.delete's fields.
func (p DeleteDraft) Validate() error {
	return firstError(
		CheckID("thread_id", p.ThreadID),
		CheckID("message_id", p.MessageID),
		CheckVersion(p.ExpectedStateVersion),
	)
}

// Validate checks thread.fork's fields.
func (p Fork) Validate() error {
	return firstError(CheckID("thread_id", p.ThreadID), CheckID("from_checkpoint_id", p.FromCheckpointID))
}

// Validate checks thread.checkout's fields.
func (p Checkout) Validate() error {
	return firstError(
		CheckID("thread_id", p.ThreadID),
		CheckID("checkpoint_id", p.CheckpointID),
		CheckVersion(p.ExpectedStateVersion),
	)
}

// Validate checks thread.delete's fields: the version is optional
// (deleting without having seen the thread's state is allowed).
func (p DeleteThread) Validate() error {
	if err := CheckID("thread_id", p.ThreadID); err != nil {
		return err
	}
	return checkOptionalVersion(p.ExpectedStateVersion)
}

// Validate checks tool.confirm's and tool.reject's fields.
func (p Decide) Validate() error {
	return firstError(CheckID("operation_id", p.OperationID), CheckVersion(p.ExpectedStateVersion))
}
