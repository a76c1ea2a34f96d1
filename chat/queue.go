package chat

import "time"

// The message queue of a thread: messages a user wrote while a run was
// active, started one after another as runs (docs/protocol.md "The message
// queue"). The queue is thread state: every change is a durable event
// (queue.updated, carrying the whole queue), and the start of an item and
// its leaving the queue are one durable step.

// PrefixQueueItem prefixes a queue item's id.
const PrefixQueueItem = "qi_"

// EventQueueUpdated carries a thread's whole queue after a change.
const EventQueueUpdated = "queue.updated"

// Queue modes: an after item waits for the active run to complete; an
// interrupt item cancels the active run (reason ReasonInterrupted, its
// receipt as usual) and starts from the cancel's resume point.
const (
	QueueAfter     = "after"
	QueueInterrupt = "interrupt"
)

// Why a queue is paused. A paused queue starts nothing until a tab sends
// queue.resume: nothing the user queued starts after they stopped a run.
const (
	PausedRunCancelled = "run_cancelled"
	PausedRunFailed    = "run_failed"
	PausedHeadMoved    = "head_moved"
)

// ReasonInterrupted is the cancel reason of a run an interrupt item
// cancelled.
const ReasonInterrupted = "interrupted"

// MaxQueueItems is how many items a thread's queue holds at most.
const MaxQueueItems = 20

// QueueItem is one message waiting in a thread's queue.
type QueueItem struct {
	ItemID      string    `json:"item_id"`
	UserMessage string    `json:"user_message"`
	Mode        string    `json:"mode"`
	RequestedBy string    `json:"requested_by"`
	CreatedAt   time.Time `json:"created_at"`
}

// Queue is a thread's message queue: the items waiting, oldest first
// (interrupt items ahead of after items), and whether it is paused and
// why (PausedReason nil when it is not).
type Queue struct {
	Items        []QueueItem `json:"items"`
	Paused       bool        `json:"paused"`
	PausedReason *string     `json:"paused_reason"`
}

// QueueUpdatedBody is queue.updated's body.
type QueueUpdatedBody struct {
	Queue Queue `json:"queue"`
}

// QueueAdd are the fields of queue.add.
type QueueAdd struct {
	UserID          string
	ThreadID        string
	UserMessage     string
	Mode            string // QueueAfter when empty
	ClientRequestID string
	RequestedBy     string
	// ExpectedStateVersion, when set, must be the thread's current one.
	ExpectedStateVersion *int64
}

// QueueAddAck is queue.add's answer. Position is the item's place in the
// queue (1 = next to start), 0 when it started at once (no run was active
// and the queue was not paused, or it is an interrupt item of a thread
// with no active run): RunID then names the run it started. Interrupted
// names the run an interrupt item cancelled.
type QueueAddAck struct {
	ItemID       string `json:"item_id"`
	Position     int    `json:"position"`
	StateVersion int64  `json:"state_version"`
	RunID        string `json:"run_id,omitempty"`
	Interrupted  string `json:"interrupted_run_id,omitempty"`
}

// Interruption is the cancel a queue.add with mode interrupt recorded
// (in the transaction that added the item), for the engine to carry to the
// run's execution as after any run.cancel.
type Interruption struct {
	RunID string
	Prev  RunStatus // the run's status before the cancel
}

// QueueUpdate are the fields of queue.update: a new text, a new place
// (1 = first), or both.
type QueueUpdate struct {
	UserID               string
	ThreadID             string
	ItemID               string
	UserMessage          *string
	Position             *int
	ExpectedStateVersion *int64
}

// QueueRemove are the fields of queue.remove.
type QueueRemove struct {
	UserID               string
	ThreadID             string
	ItemID               string
	ExpectedStateVersion *int64
}

// QueueItemAck is queue.update's and queue.remove's answer.
type QueueItemAck struct {
	ItemID       string `json:"item_id"`
	StateVersion int64  `json:"state_version"`
}

// QueueResume are the fields of queue.resume.
type QueueResume struct {
	UserID               string
	ThreadID             string
	ExpectedStateVersion *int64
}

// QueueResumeAck is queue.resume's answer; RunID names the run the first
// item started as, when no run was active.
type QueueResumeAck struct {
	StateVersion int64  `json:"state_version"`
	RunID        string `json:"run_id,omitempty"`
}

// Validate checks queue.add's fields.
func (p QueueAdd) Validate() error {
	if err := CheckID("thread_id", p.ThreadID); err != nil {
		return err
	}
	if err := CheckText("user_message", p.UserMessage, 1, MaxUserMessageBytes); err != nil {
		return err
	}
	switch p.Mode {
	case "", QueueAfter, QueueInterrupt:
	default:
		return Invalid("mode must be %q or %q", QueueAfter, QueueInterrupt)
	}
	if p.ClientRequestID != "" {
		if err := CheckText("client_request_id", p.ClientRequestID, 1, MaxClientRequestIDBytes); err != nil {
			return err
		}
	}
	return checkOptionalVersion(p.ExpectedStateVersion)
}

// Validate checks queue.update's fields.
func (p QueueUpdate) Validate() error {
	if err := firstError(CheckID("thread_id", p.ThreadID), CheckID("item_id", p.ItemID)); err != nil {
		return err
	}
	if p.UserMessage == nil && p.Position == nil {
		return Invalid("queue.update needs user_message, position or both")
	}
	if p.UserMessage != nil {
		if err := CheckText("user_message", *p.UserMessage, 1, MaxUserMessageBytes); err != nil {
			return err
		}
	}
	if p.Position != nil && (*p.Position < 1 || *p.Position > MaxQueueItems) {
		return Invalid("position must be between 1 and %d", MaxQueueItems)
	}
	return checkOptionalVersion(p.ExpectedStateVersion)
}

// Validate checks queue.remove's fields.
func (p QueueRemove) Validate() error {
	if err := firstError(CheckID("thread_id", p.ThreadID), CheckID("item_id", p.ItemID)); err != nil {
		return err
	}
	return checkOptionalVersion(p.ExpectedStateVersion)
}

// Validate checks queue.resume's fields.
func (p QueueResume) Validate() error {
	if err := CheckID("thread_id", p.ThreadID); err != nil {
		return err
	}
	return checkOptionalVersion(p.ExpectedStateVersion)
}
