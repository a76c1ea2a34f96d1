package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// Event types of the protocol.
const (
	EventRunStarted             = "run.started"
	EventMessageDelta           = "message.delta"
	EventMessagePublished       = "message.published"
	EventCheckpointCreated      = "checkpoint.created"
	EventToolPrepared           = "tool.prepared"
	EventToolUpdated            = "tool.updated"
	EventRunWaitingConfirmation = "run.waiting_confirmation"
	EventRunCancelRequested     = "run.cancel_requested"
	EventRunCancelling          = "run.cancelling"
	EventRunCancelled           = "run.cancelled"
	EventRunCompleted           = "run.completed"
	EventRunFailed              = "run.failed"
	EventMessageDeleted         = "message.deleted"
	EventThreadHeadMoved        = "thread.head_moved"
	EventThreadDeleted          = "thread.deleted"
	EventThreadSnapshot         = "thread.snapshot"
)

// Event is one entry of a thread's ordered stream. Seq is allocated on the
// thread row by the transaction that writes the event; StateVersion is set
// on durable events only (every event but message.delta and
// thread.snapshot). Body holds the type's extra fields and must marshal to a
// JSON object. Raw is the encoded form, filled once by Encode and then shared
// read-only by every subscriber.
type Event struct {
	Type         string
	ThreadID     string
	Seq          int64
	TS           int64
	StateVersion int64
	RunID        string
	// MessageID is the message a message.* event is about; kept for the
	// store's indexes, and part of Body on the wire.
	MessageID string
	Body      any
	Raw       []byte
}

// EventSink receives the events of the threads it is subscribed to, in seq
// order per thread. Deliver must not block: it is called while the store
// publishes a commit. It returns false when the sink cannot take the event;
// the publisher then unsubscribes it from that thread without delivering
// anything later of it, so a sink never sees a gap it does not know about.
type EventSink interface {
	Deliver(ev *Event) bool
}

// Durable reports whether the event bumps state_version and is kept in the
// event log.
func (e *Event) Durable() bool {
	return e.Type != EventMessageDelta && e.Type != EventThreadSnapshot
}

// EventHeader is what every event carries on the wire before its body's
// fields. Decoding an event into it reads those fields and ignores the body.
type EventHeader struct {
	Type         string `json:"type"`
	ThreadID     string `json:"thread_id"`
	Seq          int64  `json:"seq"`
	TS           int64  `json:"ts"`
	StateVersion int64  `json:"state_version,omitempty"`
	RunID        string `json:"run_id,omitempty"`
}

// Event returns the event of header h with body (Raw left empty).
func (h EventHeader) Event(body any) Event {
	return Event{
		Type:         h.Type,
		ThreadID:     h.ThreadID,
		Seq:          h.Seq,
		TS:           h.TS,
		StateVersion: h.StateVersion,
		RunID:        h.RunID,
		Body:         body,
	}
}

// Encode fills Raw with the event's JSON: the common fields followed by the
// body's fields at the top level.
func (e *Event) Encode() error {
	head, err := json.Marshal(EventHeader{e.Type, e.ThreadID, e.Seq, e.TS, e.StateVersion, e.RunID})
	if err != nil {
		return err
	}
	if e.Body == nil {
		e.Raw = head
		return nil
	}
	body, err := json.Marshal(e.Body)
	if err != nil {
		return fmt.Errorf("encode %s body: %w", e.Type, err)
	}
	if len(body) < 2 || body[0] != '{' {
		return fmt.Errorf("encode %s: body is not an object", e.Type)
	}
	if string(body) == "{}" {
		e.Raw = head
		return nil
	}
	var buf bytes.Buffer
	buf.Grow(len(head) + len(body))
	buf.Write(head[:len(head)-1])
	buf.WriteByte(',')
	buf.Write(body[1:])
	e.Raw = buf.Bytes()
	return nil
}

// Now is the event timestamp format: Unix milliseconds.
func Now() int64 { return time.Now().UnixMilli() }

// Bodies of the events. Field names are the protocol's.

type RunStartedBody struct {
	BaseCheckpointID string    `json:"base_checkpoint_id"`
	Status           RunStatus `json:"status"`
	Attempt          int       `json:"attempt"`
	// QueueItemID names the queue item the run was started from (the
	// item left the queue in the same durable step).
	QueueItemID string `json:"queue_item_id,omitempty"`
}

type MessageDeltaBody struct {
	MessageID string `json:"message_id"`
	Text      string `json:"text"`
}

type MessagePublishedBody struct {
	Message      Message `json:"message"`
	CheckpointID string  `json:"checkpoint_id"`
}

type CheckpointCreatedBody struct {
	CheckpointID       string  `json:"checkpoint_id"`
	ParentCheckpointID *string `json:"parent_checkpoint_id"`
}

type RunCancelRequestedBody struct {
	Reason      string `json:"reason"`
	RequestedBy string `json:"requested_by"`
}

// ActiveOperation names the work a cancel is still waiting for.
type ActiveOperation struct {
	Kind        string `json:"kind"`
	OperationID string `json:"operation_id"`
}

type RunCancellingBody struct {
	ActiveOperation ActiveOperation `json:"active_operation"`
}

// OperationOutcome reports what one tool call did, in a cancel receipt.
type OperationOutcome struct {
	OperationID string `json:"operation_id"`
	Tool        string `json:"tool"`
	Phase       string `json:"phase"`
	Outcome     string `json:"outcome"`
}

type RunCancelledBody struct {
	ResumeCheckpointID   string             `json:"resume_checkpoint_id"`
	PublishedMessageID   *string            `json:"published_message_id"`
	DiscardedStreamChars int64              `json:"discarded_stream_chars"`
	ResumePolicy         string             `json:"resume_policy"`
	Operations           []OperationOutcome `json:"operations"`
	// Executed tells whether a worker ever took the run up: false for a
	// run cancelled while it waited for a slot, which never started (no
	// model asked, no tool called; docs/protocol.md "Admission": its receipt
	// says so). nil in events written before the field existed.
	Executed *bool `json:"executed,omitempty"`
	// QueuedMessages is how many messages wait in the thread's queue
	// after the cancel: paused, unless the cancel was an interrupt's
	// (whose item then started).
	QueuedMessages int `json:"queued_messages"`
}

type ToolBody struct {
	Operation Operation `json:"operation"`
}

type RunWaitingConfirmationBody struct {
	OperationID string `json:"operation_id"`
}

type RunFailedBody struct {
	Error string `json:"error"`
}

type MessageDeletedBody struct {
	MessageID    string `json:"message_id"`
	CheckpointID string `json:"checkpoint_id"`
}

// ThreadHeadMovedBody says which checkpoint a thread.checkout made the
// thread's head, and which it was before.
type ThreadHeadMovedBody struct {
	HeadCheckpointID         string `json:"head_checkpoint_id"`
	PreviousHeadCheckpointID string `json:"previous_head_checkpoint_id"`
}

// SnapshotEvent encodes a thread.snapshot event: the snapshot's fields at the
// top level, seq = the last seq it reflects.
func SnapshotEvent(s Snapshot) ([]byte, error) {
	return json.Marshal(struct {
		Type string `json:"type"`
		Seq  int64  `json:"seq"`
		TS   int64  `json:"ts"`
		Snapshot
	}{EventThreadSnapshot, s.LastSeq, Now(), s})
}
