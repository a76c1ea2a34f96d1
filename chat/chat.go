// Package chat holds the domain of the gateway: threads, checkpoints,
// messages, runs, operations and events, the run state machine, and the error
// codes of the wire protocol. It does no I/O; every other package speaks in
// these types.
package chat

import (
	"encoding/json"
	"strings"
	"time"
	"unicode/utf8"
)

// LocalUserID is the one user of auth mode none (a loopback-only server
// without accounts): everything there is its.
const LocalUserID = "usr_local"

// LocalUserName is LocalUserID's name. A reverse proxy may not name it
// (auth.Reserved): its user would see every conversation made without
// accounts on the same database.
const LocalUserName = "local"

// DefaultTitle names a thread created without a title; its first user
// message then names it (see TitleFrom).
const DefaultTitle = "New conversation"

// TitleFrom makes a thread title from a user message: its first line, cut
// at a word boundary to at most 60 characters (and MaxTitleBytes), with white space and the
// control characters a title may not hold (IsControl) folded into single
// spaces, so it passes CheckTitle ("" when nothing is left).
func TitleFrom(message string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(message), "\n")
	line = strings.Map(func(r rune) rune {
		if IsControl(r) {
			return ' '
		}
		return r
	}, line)
	line = strings.Join(strings.Fields(line), " ")
	if utf8.RuneCountInString(line) <= 60 && len(line) <= MaxTitleBytes {
		return line
	}
	r := []rune(line)
	r = r[:min(len(r), 60)]
	for len(string(r))+len("…") > MaxTitleBytes { // 60 runes of 4 bytes
		r = r[:len(r)-1]
	}
	cut := string(r)
	if i := strings.LastIndexByte(cut, ' '); i > 20 {
		cut = cut[:i]
	}
	return strings.TrimRight(cut, " ,.;:") + "…"
}

// Thread is one conversation, owned by one user. StateVersion and LastSeq are
// bumped only inside the store transaction that writes the thread's events.
type Thread struct {
	ThreadID         string    `json:"thread_id"`
	Title            string    `json:"title"`
	StateVersion     int64     `json:"state_version"`
	HeadCheckpointID string    `json:"head_checkpoint_id"`
	LastSeq          int64     `json:"last_seq"`
	CreatedAt        time.Time `json:"created_at"`
	UpdatedAt        time.Time `json:"updated_at"`
	// ForkedFrom names the checkpoint of another thread this thread was
	// forked from; nil for an original thread.
	ForkedFrom *ForkSource `json:"forked_from,omitempty"`
}

// ForkSource names where a forked thread came from.
type ForkSource struct {
	ThreadID     string `json:"thread_id"`
	CheckpointID string `json:"checkpoint_id"`
}

// Pending is the step a checkpoint still has to run.
type Pending struct {
	Step      string `json:"step"`
	InputHash string `json:"input_hash"`
}

// Steps of a run. generate produces the assistant's next message (and
// maybe a tool call); tool performs the call recorded as an operation.
const (
	StepGenerate = "generate"
	StepTool     = "tool"
)

// Operation phases and outcomes of the protocol.
const (
	PhasePrepared   = "prepared"
	PhaseConfirmed  = "confirmed"
	PhaseCommitting = "committing"
	PhaseCommitted  = "committed"
	PhaseRejected   = "rejected"
	PhaseVoided     = "voided"
	PhaseRunning    = "running"
	PhaseCompleted  = "completed"
	PhaseAborted    = "aborted"
	PhaseFailed     = "failed"
	PhaseUnknown    = "unknown"
	PhaseReconciled = "reconciled"

	OutcomeNotStarted = "not_started"
	OutcomeAborted    = "aborted"
	OutcomeCompleted  = "completed"
	OutcomeCommitted  = "committed"
	OutcomeFailed     = "failed"
	OutcomeUnknown    = "unknown"
)

// ToolResult records a tool call whose result is part of confirmed state.
type ToolResult struct {
	OperationID string `json:"operation_id"`
	Tool        string `json:"tool"`
	ResultRef   string `json:"result_ref"`
}

// Checkpoint is a durable point after a semantic transition. It is
// immutable once written; the thread's head names the current one.
type Checkpoint struct {
	CheckpointID       string       `json:"checkpoint_id"`
	ThreadID           string       `json:"thread_id"`
	ParentCheckpointID *string      `json:"parent_checkpoint_id"`
	StateVersion       int64        `json:"state_version"`
	MessageIDs         []string     `json:"message_ids"`
	CompletedSteps     []string     `json:"completed_steps"`
	ToolResults        []ToolResult `json:"tool_results"`
	Pending            *Pending     `json:"pending"`
	RunID              *string      `json:"run_id"`
	CreatedAt          time.Time    `json:"created_at"`
}

// CheckpointDelta is a checkpoint with its three lists told as what they
// change from its parent's (GET /api/threads/{id}/checkpoints?lists=delta):
// each list is the first *Kept entries of the parent's list followed by
// *Added. A checkpoint without a parent keeps nothing (its lists are
// whole). Every parent comes before its children in a list oldest first
// (a parent has a lower state_version), so a reader rebuilds any list in
// one pass; the answer grows with the number of checkpoints, not with
// their number times the conversation's length.
type CheckpointDelta struct {
	CheckpointID        string       `json:"checkpoint_id"`
	ThreadID            string       `json:"thread_id"`
	ParentCheckpointID  *string      `json:"parent_checkpoint_id"`
	StateVersion        int64        `json:"state_version"`
	MessageIDsKept      int          `json:"message_ids_kept"`
	MessageIDsAdded     []string     `json:"message_ids_added"`
	CompletedStepsKept  int          `json:"completed_steps_kept"`
	CompletedStepsAdded []string     `json:"completed_steps_added"`
	ToolResultsKept     int          `json:"tool_results_kept"`
	ToolResultsAdded    []ToolResult `json:"tool_results_added"`
	Pending             *Pending     `json:"pending"`
	RunID               *string      `json:"run_id"`
	CreatedAt           time.Time    `json:"created_at"`
}

// Message roles and kinds.
const (
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"

	KindText     = "text"
	KindCard     = "card"
	KindFragment = "fragment"
)

// FragmentOf says which streamed message a saved fragment was cut from.
type FragmentOf struct {
	RunID     string `json:"run_id"`
	MessageID string `json:"message_id"`
	LastSeq   int64  `json:"last_seq"`
}

// Message is a published block. Deltas are not messages.
type Message struct {
	MessageID    string      `json:"message_id"`
	ThreadID     string      `json:"thread_id"`
	Role         string      `json:"role"`
	Kind         string      `json:"kind"`
	Content      string      `json:"content"`
	StateVersion int64       `json:"state_version"`
	CheckpointID string      `json:"checkpoint_id"`
	RunID        *string     `json:"run_id"`
	FragmentOf   *FragmentOf `json:"fragment_of"`
	CreatedAt    time.Time   `json:"created_at"`
	// Model is the model a reply was asked of ("demo", or the model name
	// sent to an OpenAI-compatible server: what the server routed it to is
	// not known); absent on every other message.
	Model string `json:"model,omitempty"`
	// Truncated says why a reply is not the whole of what the model would
	// have written: TruncatedSizeLimit when it was cut at the size limit
	// (the engine's -max-reply-bytes, or the model endpoint's own length
	// limit). Content is still exactly the concatenated text of the
	// message's deltas: nothing past the cut was streamed. Absent on every
	// other message.
	Truncated string `json:"truncated,omitempty"`
}

// TruncatedSizeLimit is Message.Truncated of a reply cut at the size
// limit.
const TruncatedSizeLimit = "size_limit"

// Run is one execution attempt on a thread.
type Run struct {
	RunID                string     `json:"run_id"`
	ThreadID             string     `json:"thread_id"`
	Status               RunStatus  `json:"status"`
	BaseCheckpointID     string     `json:"base_checkpoint_id"`
	ResumeCheckpointID   *string    `json:"resume_checkpoint_id"`
	CancelRequestedAt    *time.Time `json:"cancel_requested_at"`
	CancelReason         *string    `json:"cancel_reason"`
	RequestedBy          *string    `json:"requested_by"`
	DiscardedStreamChars int64      `json:"discarded_stream_chars"`
	Error                *string    `json:"error"`
	Attempt              int        `json:"attempt"`
	CreatedAt            time.Time  `json:"created_at"`
	FinishedAt           *time.Time `json:"finished_at"`
	// Usage adds up the tokens the model endpoint reported for the run's
	// steps (zero when it reports none, as the demo model).
	Usage Usage `json:"usage"`
	// QueuePosition is set while the run waits for capacity (docs/protocol.md
	// "Admission"): 1 = the next to start. Zero (omitted) when it does not
	// wait: it runs, has ended, or a slot is free for it.
	QueuePosition int `json:"queue_position,omitempty"`
	// QueueItemID names the queue item the run was started from (absent
	// for a run.start).
	QueueItemID string `json:"queue_item_id,omitempty"`
	// Executed tells whether a worker ever took the run up (claimed it):
	// false for a run that has only waited, e.g. one cancelled while it
	// waited for a slot, which never started: no model was asked, no tool
	// called.
	Executed bool `json:"executed"`
}

// Usage is a token count.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

// Operation is one tool call.
type Operation struct {
	OperationID    string          `json:"operation_id"`
	RunID          string          `json:"run_id"`
	ThreadID       string          `json:"thread_id"`
	Tool           string          `json:"tool"`
	Contract       string          `json:"contract"`
	Phase          string          `json:"phase"`
	Args           json.RawMessage `json:"args"`
	Preview        json.RawMessage `json:"preview"`
	IdempotencyKey *string         `json:"idempotency_key"`
	Outcome        *string         `json:"outcome"`
	ResultRef      *string         `json:"result_ref"`
	CreatedAt      time.Time       `json:"created_at"`
	UpdatedAt      time.Time       `json:"updated_at"`
	// An outcome left unknown is looked up by its key at the provider
	// until it answers or ReconcileUntil passes, also after the run
	// ended; each change is reported with tool.updated. ReconcileNextAt is
	// the next lookup: nil with ReconcileUntil set means the gateway gave
	// up asking, and only the provider's own records (for the key) can
	// tell what happened.
	ReconcileNextAt *time.Time `json:"reconcile_next_at,omitempty"`
	ReconcileUntil  *time.Time `json:"reconcile_until,omitempty"`
	// Progress is what the tool last said of its progress while it
	// worked: only on the tool.updated events that report it, never
	// stored with the operation.
	Progress *ToolProgress `json:"progress,omitempty"`
}

// ToolProgress is a working tool's own report of how far it got: Progress
// out of Total (0: the tool did not say), and its message, if any.
type ToolProgress struct {
	Progress float64 `json:"progress"`
	Total    float64 `json:"total,omitempty"`
	Message  string  `json:"message,omitempty"`
}

// ActiveRun describes the run in flight in a snapshot.
type ActiveRun struct {
	RunID       string    `json:"run_id"`
	Status      RunStatus `json:"status"`
	MessageID   *string   `json:"message_id"`
	PartialText string    `json:"partial_text"`
	LastSeq     int64     `json:"last_seq"`
	// QueuePosition: as Run.QueuePosition (status queued, waiting for
	// capacity; omitted otherwise).
	QueuePosition int `json:"queue_position,omitempty"`
}

// Snapshot is the state of a thread as one consistent read: its head's
// history and the run in flight. Seq-wise it reflects every event up to
// LastSeq.
type Snapshot struct {
	ThreadID         string     `json:"thread_id"`
	Title            string     `json:"title"`
	StateVersion     int64      `json:"state_version"`
	HeadCheckpointID string     `json:"head_checkpoint_id"`
	LastSeq          int64      `json:"last_seq"`
	Messages         []Message  `json:"messages"`
	ActiveRun        *ActiveRun `json:"active_run"`
	// LastRun is how the thread's latest run ended, when no run is active:
	// a page opened after a cancel can still show the receipt.
	LastRun *LastRun `json:"last_run"`
	// EarlierMessages counts the messages at the start of the head's
	// history that Messages leaves out. Only the conversation page's own
	// snapshot leaves any out (it holds the latest messages up to a size,
	// and fetches the rest with GET /api/threads/{id}/messages); the API's
	// and the WebSocket's snapshots always hold the whole history, so
	// there it is absent.
	EarlierMessages int `json:"earlier_messages,omitempty"`
	// Queue is the thread's message queue (queue.go): never nil in a
	// snapshot read from the store.
	Queue *Queue `json:"queue"`
}

// HistoryPage is a page of a thread's history (the head checkpoint's
// messages), oldest first: GET /api/threads/{id}/messages. NextBefore is
// the before to ask for the page of older messages, nil when this page
// starts the history.
type HistoryPage struct {
	ThreadID         string    `json:"thread_id"`
	HeadCheckpointID string    `json:"head_checkpoint_id"`
	StateVersion     int64     `json:"state_version"`
	Messages         []Message `json:"messages"`
	NextBefore       *string   `json:"next_before"`
}

// LastRun is the outcome of a thread's latest finished run.
type LastRun struct {
	RunID                string             `json:"run_id"`
	Status               RunStatus          `json:"status"`
	Error                *string            `json:"error"`
	DiscardedStreamChars int64              `json:"discarded_stream_chars"`
	PublishedMessageID   *string            `json:"published_message_id"`
	ResumeCheckpointID   *string            `json:"resume_checkpoint_id"`
	Operations           []OperationOutcome `json:"operations"`
}
