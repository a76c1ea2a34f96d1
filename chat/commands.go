package chat

import (
	"encoding/json"
	"errors"
)

// Commands and their answers, shared by the store (which performs them in
// one transaction each), the engine and the gateway (which decodes them).

// StartRun are the fields of run.start.
type StartRun struct {
	UserID               string
	ThreadID             string
	ExpectedStateVersion int64
	// ResumeFromCheckpointID is the checkpoint to continue from; "" = head.
	ResumeFromCheckpointID string
	// UserMessage is the new user text; nil re-runs the checkpoint's pending
	// step ("Continue from the saved point").
	UserMessage     *string
	ClientRequestID string
	// Response is what a Responses API request records with the run
	// (docs/openai-api.md); nil for every other start.
	Response *ResponseRequest
}

// RunStartAck is run.start's answer.
type RunStartAck struct {
	RunID        string    `json:"run_id"`
	Status       RunStatus `json:"status"`
	StateVersion int64     `json:"state_version"`
	// QueuePosition is set when the server is at capacity and the run
	// waits for a slot (1 = the next to start; docs/protocol.md "Admission").
	QueuePosition int `json:"queue_position,omitempty"`
}

// Admission is an engine's admission state (docs/protocol.md "Admission"), as
// /readyz shows it: Capacity runs may execute at once, Executing do now,
// and Waiting queued runs are not yet claimed by any instance.
type Admission struct {
	Capacity  int `json:"capacity"`
	Executing int `json:"executing"`
	Waiting   int `json:"waiting"`
}

// CancelRun are the fields of run.cancel.
type CancelRun struct {
	UserID      string
	RunID       string
	Reason      string
	RequestedBy string
	// Resent marks the same request sent again because the outcome of
	// its first delivery is unknown (handed to another instance, which did
	// not answer in time): a cancel already accepted for the same
	// requester is then this request's, not an earlier one.
	Resent bool
}

// CancelAck is run.cancel's answer.
type CancelAck struct {
	RunID                string    `json:"run_id"`
	Status               RunStatus `json:"status"`
	AcceptedStateVersion int64     `json:"accepted_state_version"`
	ResumeCheckpointID   string    `json:"resume_checkpoint_id"`
	PublishedMessageID   *string   `json:"published_message_id"`
	AlreadyRequested     bool      `json:"already_requested"`
}

// DeleteDraft are the fields of draft.delete.
type DeleteDraft struct {
	UserID               string
	ThreadID             string
	MessageID            string
	ExpectedStateVersion int64
}

// Fork are the fields of thread.fork.
type Fork struct {
	UserID           string
	ThreadID         string
	FromCheckpointID string
}

// Checkout are the fields of thread.checkout.
type Checkout struct {
	UserID               string
	ThreadID             string
	CheckpointID         string
	ExpectedStateVersion int64
}

// Decide are the fields of tool.confirm (Confirm) and tool.reject.
type Decide struct {
	UserID               string
	OperationID          string
	ExpectedStateVersion int64
	Confirm              bool
}

// SaveFragment are the fields of fragment.save.
type SaveFragment struct {
	UserID               string
	ThreadID             string
	MessageID            string
	LastSeq              int64
	ExpectedStateVersion int64
}

// FragmentSaved is fragment.save's answer.
type FragmentSaved struct {
	MessageID    string `json:"message_id"`
	CheckpointID string `json:"checkpoint_id"`
	StateVersion int64  `json:"state_version"`
}

// StreamedTextQuery names a streamed message's text up to a seq: what a
// fragment.save with the same fields would keep.
type StreamedTextQuery struct {
	UserID    string
	ThreadID  string
	MessageID string
	LastSeq   int64
}

// StreamedText is what fragment.save would keep of a streamed message up
// to a seq (GET /api/threads/{id}/streamed/{message_id}?last_seq=N): a
// client asks it before it offers to save what it displayed, and compares
// Content with what is on its screen.
type StreamedText struct {
	MessageID string `json:"message_id"`
	RunID     string `json:"run_id"`
	LastSeq   int64  `json:"last_seq"`
	Content   string `json:"content"`
	Chars     int64  `json:"chars"` // Unicode code points of Content
}

// DraftDeleted is draft.delete's answer.
type DraftDeleted struct {
	CheckpointID string `json:"checkpoint_id"`
	StateVersion int64  `json:"state_version"`
}

// CheckoutAck is thread.checkout's answer.
type CheckoutAck struct {
	HeadCheckpointID string `json:"head_checkpoint_id"`
	StateVersion     int64  `json:"state_version"`
}

// DeleteThread are the fields of thread.delete.
type DeleteThread struct {
	UserID   string
	ThreadID string
	// ExpectedStateVersion, when set, is the version the deleting tab saw:
	// a stale one is a state_version_conflict, as for any command.
	ExpectedStateVersion *int64
	// RequestedBy names who deletes it, as a cancel's requested_by: the
	// run in flight, if any, is cancelled first in its name.
	RequestedBy string
}

// ThreadDeletedAck is thread.delete's answer.
type ThreadDeletedAck struct {
	ThreadID string `json:"thread_id"`
}

// ForkAck is thread.fork's answer.
type ForkAck struct {
	NewThreadID      string `json:"new_thread_id"`
	HeadCheckpointID string `json:"head_checkpoint_id"`
}

// RunInput is what a worker needs to run a run's pending step: the confirmed
// history of its base checkpoint and why the step runs again, if it does.
type RunInput struct {
	Run        Run
	Messages   []Message
	ResumeNote string
	// Instructions is the system message the run's Responses API request
	// gave ("" for none): read by the model before the conversation.
	Instructions string
	// Pending is the head checkpoint's unfinished step, and Operation the
	// tool call it waits on (step tool), if any.
	Pending   *Pending
	Operation *Operation
}

// Recovered says what crash recovery did with one run.
type Recovered struct {
	RunID  string
	Action string // "completed", "requeued", "failed" or "cancelled"
}

// Replay is a thread's events after a seq, encoded for the wire.
type Replay struct {
	// Events holds every event with seq in (after, LastSeq], in order,
	// with Type, Seq and Raw set.
	Events []*Event
	// LastSeq and StateVersion are the thread's at the time of the read.
	LastSeq      int64
	StateVersion int64
	// Complete is false when some event in that range is no longer held
	// (purged deltas): the reader must start from a snapshot instead.
	Complete bool
}

// Lease is one claim of a run: the process that claimed it (Owner,
// "<instance>.<process>") and the claim's epoch. Every claim of a run
// takes a new, higher epoch, so two executions of one run — even in the
// same process, after the first stalled past its lease and the run was
// claimed again — never hold the same lease. Every write an execution
// makes names its lease, and the store refuses it once the lease is not
// the run's current one.
type Lease struct {
	RunID string
	Owner string
	Epoch int64
}

// Claim is a run handed to a worker, with the lease the worker holds it by.
type Claim struct {
	Run   Run
	Lease Lease
}

// ErrNotRunning is returned to a worker whose run no longer runs under its
// lease; Status says what the run is now. Fenced says the lease itself is
// gone (recovery took the run, another claim holds it); otherwise the
// lease is current but the run moved on (a cancel was recorded). Either
// way the worker must stop without publishing; only a worker that is not
// fenced may finish the cancel.
type ErrNotRunning struct {
	Status RunStatus
	Fenced bool
}

func (e *ErrNotRunning) Error() string {
	if e.Fenced {
		return "this execution's lease of the run is no longer current (the run is " + string(e.Status) + ")"
	}
	return "run is no longer running under this lease: " + string(e.Status)
}

// ErrStepNotPending refuses to publish a step the thread no longer waits
// on: it was published already (by another execution of the run), so
// publishing it again would break invariant 9. The worker must stop.
var ErrStepNotPending = errors.New("the step is no longer pending")

// ErrDeltasLost refuses to stream on or publish a message some of whose
// deltas were fanned out and then lost (another instance wrote past the
// seqs they were given, PostgreSQL): its text would have a hole. The step
// starts over under a new message (Store.RestartStep).
var ErrDeltasLost = errors.New("deltas of the message were lost")

// StepOutput is what one generate step produced: a message to publish
// (Content "" = none) and, at most, one tool call to make next.
type StepOutput struct {
	// Step is the pending step this output completes, as the worker read
	// it: the store publishes it only while the thread still waits on
	// exactly that step, so no step is published twice.
	Step      Pending
	MessageID string
	Kind      string // KindText or KindCard
	Content   string
	Call      *ToolCall
	Model     string // the model the step was asked of (chat.Message.Model)
	Truncated string // why Content is not the whole reply (chat.Message.Truncated)
}

// ToolCall is a tool call the engine has validated and is about to record
// as an operation.
type ToolCall struct {
	OperationID string
	Tool        string
	Contract    string
	Args        json.RawMessage
	// Preview and IdempotencyKey come from a consequential tool's prepare
	// step; a runner tool's key is its operation id.
	Preview        json.RawMessage
	IdempotencyKey string
}

// ToolOutcome is how a tool call ended, to record with its result.
type ToolOutcome struct {
	Phase   string
	Outcome string
	Result  json.RawMessage // published as a tool message when not nil
	// NoLookup, with an unknown outcome: its system cannot be asked
	// whether the key acted (tools.ErrNoLookup), so no lookup is
	// scheduled and the operation shows at once that the gateway is not
	// asking: only the system's own records can tell.
	NoLookup bool
}

// Lookup is what asking an external system about a key found.
type Lookup int

const (
	// LookupNotFound: the system does not know the key, or could not be
	// asked this time; it is asked again later, up to the horizon.
	LookupNotFound Lookup = iota
	// LookupFound: the system accepted the key (it acted).
	LookupFound
	// LookupImpossible: the system can never be asked (an MCP server):
	// the gateway stops asking now.
	LookupImpossible
)

// ConfirmAck is tool.confirm's and tool.reject's answer.
type ConfirmAck struct {
	OperationID  string `json:"operation_id"`
	Phase        string `json:"phase"`
	StateVersion int64  `json:"state_version"`
}
