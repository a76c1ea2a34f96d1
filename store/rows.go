package store

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/honestcancel/gateway/chat"
)

// Row types mirror the tables; they convert to the domain types of chat.

const threadCols = `thread_id, user_id, title, state_version, last_seq, head_checkpoint_id,
	forked_from_thread_id, forked_from_checkpoint_id, created_at, updated_at,
	events_purged_through, events_purged_version, events_purged_ts, deltas_purged_through, seq_reserved, seq_holder,
	deleted_at`

type threadRow struct {
	ThreadID               string         `db:"thread_id"`
	UserID                 string         `db:"user_id"`
	Title                  string         `db:"title"`
	StateVersion           int64          `db:"state_version"`
	LastSeq                int64          `db:"last_seq"`
	HeadCheckpointID       string         `db:"head_checkpoint_id"`
	ForkedFromThreadID     sql.NullString `db:"forked_from_thread_id"`
	ForkedFromCheckpointID sql.NullString `db:"forked_from_checkpoint_id"`
	CreatedAt              int64          `db:"created_at"`
	UpdatedAt              int64          `db:"updated_at"`
	// The event log's purge watermark (see PurgeEvents).
	EventsPurgedThrough int64 `db:"events_purged_through"`
	EventsPurgedVersion int64 `db:"events_purged_version"`
	EventsPurgedTS      int64 `db:"events_purged_ts"`
	// The stream buffer's purge mark (see PurgeStream): no delta with a
	// seq at or below it remains.
	DeltasPurgedThrough int64 `db:"deltas_purged_through"`
	// Seqs up to it may be handed out to deltas before they are written
	// (see streambuf.go); a crash loses at most those above last_seq.
	SeqReserved int64 `db:"seq_reserved"`
	// SeqHolder is the run lease owner (a process) that reserved them, ""
	// when nothing is reserved.
	SeqHolder string `db:"seq_holder"`
	// DeletedAt is when thread.delete deleted it (not valid while it is
	// not): from then on it is not_found to everyone, and its log ends with
	// thread.deleted.
	DeletedAt sql.NullInt64 `db:"deleted_at"`
}

// threadColsT is threadCols of the table aliased t.
var threadColsT = threadColsOf("t")

// threadColsOf is threadCols qualified by a table alias.
func threadColsOf(alias string) string {
	cols := strings.Split(threadCols, ",")
	for i, c := range cols {
		cols[i] = alias + "." + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}

// scanTargets are r's fields in threadCols order, for a plain Scan on hot
// paths (no reflection).
func (r *threadRow) scanTargets() []any {
	return []any{&r.ThreadID, &r.UserID, &r.Title, &r.StateVersion, &r.LastSeq, &r.HeadCheckpointID,
		&r.ForkedFromThreadID, &r.ForkedFromCheckpointID, &r.CreatedAt, &r.UpdatedAt,
		&r.EventsPurgedThrough, &r.EventsPurgedVersion, &r.EventsPurgedTS, &r.DeltasPurgedThrough,
		&r.SeqReserved, &r.SeqHolder, &r.DeletedAt}
}

func (r threadRow) thread() chat.Thread {
	t := chat.Thread{
		ThreadID: r.ThreadID, Title: r.Title, StateVersion: r.StateVersion,
		HeadCheckpointID: r.HeadCheckpointID, LastSeq: r.LastSeq,
		CreatedAt: fromMS(r.CreatedAt), UpdatedAt: fromMS(r.UpdatedAt),
	}
	if r.ForkedFromThreadID.Valid {
		t.ForkedFrom = &chat.ForkSource{
			ThreadID:     r.ForkedFromThreadID.String,
			CheckpointID: r.ForkedFromCheckpointID.String,
		}
	}
	return t
}

const checkpointCols = `checkpoint_id, thread_id, parent_checkpoint_id, state_version, message_ids,
	completed_steps, tool_results, pending, run_id, created_at, appended`

type checkpointRow struct {
	CheckpointID       string         `db:"checkpoint_id"`
	ThreadID           string         `db:"thread_id"`
	ParentCheckpointID sql.NullString `db:"parent_checkpoint_id"`
	StateVersion       int64          `db:"state_version"`
	MessageIDs         string         `db:"message_ids"`
	CompletedSteps     string         `db:"completed_steps"`
	ToolResults        string         `db:"tool_results"`
	Pending            sql.NullString `db:"pending"`
	RunID              sql.NullString `db:"run_id"`
	CreatedAt          int64          `db:"created_at"`
	// Appended is 1 when the lists hold only what the checkpoint appended
	// to its parent's (see checkpoints.go): checkpoint() then decodes them
	// as stored, and wholeCheckpoint makes them whole.
	Appended int64 `db:"appended"`
}

// decodeLists decodes a checkpoint's stored lists into c.
func decodeLists(id, msgs, steps, tools string, c *chat.Checkpoint) error {
	if err := json.Unmarshal([]byte(msgs), &c.MessageIDs); err != nil {
		return fmt.Errorf("checkpoint %s message_ids: %w", id, err)
	}
	if err := json.Unmarshal([]byte(steps), &c.CompletedSteps); err != nil {
		return fmt.Errorf("checkpoint %s completed_steps: %w", id, err)
	}
	if err := json.Unmarshal([]byte(tools), &c.ToolResults); err != nil {
		return fmt.Errorf("checkpoint %s tool_results: %w", id, err)
	}
	return nil
}

// checkpoint decodes the row, its lists as stored.
func (r checkpointRow) checkpoint() (chat.Checkpoint, error) {
	c := chat.Checkpoint{
		CheckpointID: r.CheckpointID, ThreadID: r.ThreadID,
		ParentCheckpointID: fromNullString(r.ParentCheckpointID), StateVersion: r.StateVersion,
		RunID: fromNullString(r.RunID), CreatedAt: fromMS(r.CreatedAt),
	}
	if err := decodeLists(r.CheckpointID, r.MessageIDs, r.CompletedSteps, r.ToolResults, &c); err != nil {
		return c, err
	}
	if r.Pending.Valid {
		c.Pending = &chat.Pending{}
		if err := json.Unmarshal([]byte(r.Pending.String), c.Pending); err != nil {
			return c, fmt.Errorf("checkpoint %s pending: %w", r.CheckpointID, err)
		}
	}
	return c, nil
}

const messageCols = `message_id, thread_id, role, kind, content, state_version, checkpoint_id, run_id,
	fragment_of, created_at, deleted_at, redacted_at, model, truncated`

type messageRow struct {
	MessageID    string         `db:"message_id"`
	ThreadID     string         `db:"thread_id"`
	Role         string         `db:"role"`
	Kind         string         `db:"kind"`
	Content      string         `db:"content"`
	StateVersion int64          `db:"state_version"`
	CheckpointID string         `db:"checkpoint_id"`
	RunID        sql.NullString `db:"run_id"`
	FragmentOf   sql.NullString `db:"fragment_of"`
	CreatedAt    int64          `db:"created_at"`
	DeletedAt    sql.NullInt64  `db:"deleted_at"`  // a draft removed from history
	RedactedAt   sql.NullInt64  `db:"redacted_at"` // its text purged (see RedactDeletedDrafts)
	Model        string         `db:"model"`
	Truncated    string         `db:"truncated"`
}

func (r messageRow) message() (chat.Message, error) {
	m := chat.Message{
		MessageID: r.MessageID, ThreadID: r.ThreadID, Role: r.Role, Kind: r.Kind, Content: r.Content,
		StateVersion: r.StateVersion, CheckpointID: r.CheckpointID, RunID: fromNullString(r.RunID),
		CreatedAt: fromMS(r.CreatedAt), Model: r.Model, Truncated: r.Truncated,
	}
	if r.FragmentOf.Valid {
		m.FragmentOf = &chat.FragmentOf{}
		if err := json.Unmarshal([]byte(r.FragmentOf.String), m.FragmentOf); err != nil {
			return m, fmt.Errorf("message %s fragment_of: %w", r.MessageID, err)
		}
	}
	return m, nil
}

const runCols = `run_id, thread_id, status, base_checkpoint_id, resume_checkpoint_id, resume_note,
	cancel_requested_at, cancel_reason, requested_by, cancel_state_version, cancel_published_message_id,
	discarded_stream_chars, error, attempt, client_request_id, start_state_version, lease_owner,
	lease_expires_at, lease_epoch, created_at, updated_at, finished_at, prompt_tokens, completion_tokens,
	queue_item_id`

type runRow struct {
	RunID                    string         `db:"run_id"`
	ThreadID                 string         `db:"thread_id"`
	Status                   string         `db:"status"`
	BaseCheckpointID         string         `db:"base_checkpoint_id"`
	ResumeCheckpointID       sql.NullString `db:"resume_checkpoint_id"`
	ResumeNote               string         `db:"resume_note"`
	CancelRequestedAt        sql.NullInt64  `db:"cancel_requested_at"`
	CancelReason             sql.NullString `db:"cancel_reason"`
	RequestedBy              sql.NullString `db:"requested_by"`
	CancelStateVersion       sql.NullInt64  `db:"cancel_state_version"`
	CancelPublishedMessageID sql.NullString `db:"cancel_published_message_id"`
	DiscardedStreamChars     int64          `db:"discarded_stream_chars"`
	Error                    sql.NullString `db:"error"`
	Attempt                  int            `db:"attempt"`
	ClientRequestID          sql.NullString `db:"client_request_id"`
	StartStateVersion        int64          `db:"start_state_version"`
	LeaseOwner               sql.NullString `db:"lease_owner"`
	LeaseExpiresAt           sql.NullInt64  `db:"lease_expires_at"`
	LeaseEpoch               int64          `db:"lease_epoch"` // the latest claim's (see Claim)
	CreatedAt                int64          `db:"created_at"`
	UpdatedAt                int64          `db:"updated_at"`
	FinishedAt               sql.NullInt64  `db:"finished_at"`
	PromptTokens             int64          `db:"prompt_tokens"`
	CompletionTokens         int64          `db:"completion_tokens"`
	QueueItemID              sql.NullString `db:"queue_item_id"`
}

func (r runRow) status() chat.RunStatus { return chat.RunStatus(r.Status) }

func (r runRow) run() chat.Run {
	return chat.Run{
		RunID: r.RunID, ThreadID: r.ThreadID, Status: r.status(), BaseCheckpointID: r.BaseCheckpointID,
		ResumeCheckpointID: fromNullString(r.ResumeCheckpointID), CancelRequestedAt: fromNullMS(r.CancelRequestedAt),
		CancelReason: fromNullString(r.CancelReason), RequestedBy: fromNullString(r.RequestedBy),
		DiscardedStreamChars: r.DiscardedStreamChars, Error: fromNullString(r.Error), Attempt: r.Attempt,
		CreatedAt: fromMS(r.CreatedAt), FinishedAt: fromNullMS(r.FinishedAt),
		Usage:       chat.Usage{PromptTokens: r.PromptTokens, CompletionTokens: r.CompletionTokens},
		Executed:    r.LeaseEpoch > 0, // every claim, and only a claim, takes a new lease epoch
		QueueItemID: r.QueueItemID.String,
	}
}

const operationCols = `operation_id, run_id, thread_id, tool, contract, phase, args, preview,
	idempotency_key, outcome, result_ref, created_at, updated_at, commit_started_at,
	reconcile_next_at, reconcile_until, reconcile_tries`

type operationRow struct {
	OperationID    string         `db:"operation_id"`
	RunID          string         `db:"run_id"`
	ThreadID       string         `db:"thread_id"`
	Tool           string         `db:"tool"`
	Contract       string         `db:"contract"`
	Phase          string         `db:"phase"`
	Args           string         `db:"args"`
	Preview        sql.NullString `db:"preview"`
	IdempotencyKey sql.NullString `db:"idempotency_key"`
	Outcome        sql.NullString `db:"outcome"`
	ResultRef      sql.NullString `db:"result_ref"`
	CreatedAt      int64          `db:"created_at"`
	UpdatedAt      int64          `db:"updated_at"`
	// When it was first handed to its external system (committing).
	CommitStartedAt sql.NullInt64 `db:"commit_started_at"`
	// Reconciliation of an unknown outcome (see reconcile.go).
	ReconcileNextAt sql.NullInt64 `db:"reconcile_next_at"`
	ReconcileUntil  sql.NullInt64 `db:"reconcile_until"`
	ReconcileTries  int           `db:"reconcile_tries"`
}

func (r operationRow) operation() chat.Operation {
	o := chat.Operation{
		OperationID: r.OperationID, RunID: r.RunID, ThreadID: r.ThreadID, Tool: r.Tool, Contract: r.Contract,
		Phase: r.Phase, Args: json.RawMessage(r.Args), IdempotencyKey: fromNullString(r.IdempotencyKey),
		Outcome: fromNullString(r.Outcome), ResultRef: fromNullString(r.ResultRef),
		CreatedAt: fromMS(r.CreatedAt), UpdatedAt: fromMS(r.UpdatedAt),
		ReconcileNextAt: fromNullMS(r.ReconcileNextAt), ReconcileUntil: fromNullMS(r.ReconcileUntil),
	}
	if r.Preview.Valid {
		o.Preview = json.RawMessage(r.Preview.String)
	} else {
		o.Preview = json.RawMessage("null")
	}
	return o
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic("store: marshal " + err.Error())
	}
	return string(b)
}
