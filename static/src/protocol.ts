// Types of the wire protocol the page speaks (docs/protocol.md).

export type RunStatus =
  | "queued"
  | "running"
  | "waiting_confirmation"
  | "cancel_requested"
  | "cancelling"
  | "completed"
  | "failed"
  | "cancelled";

export interface Message {
  message_id: string;
  thread_id: string;
  role: "user" | "assistant" | "tool";
  kind: "text" | "card" | "fragment";
  content: string;
  state_version: number;
  checkpoint_id: string;
  run_id: string | null;
  fragment_of: { run_id: string; message_id: string; last_seq: number } | null;
  created_at: string;
  model?: string; // the model a reply was asked of
  // truncated: the reply was cut at the size limit (the model was stopped
  // there); content is still exactly what was streamed.
  truncated?: "size_limit";
}

export interface ActiveRun {
  run_id: string;
  status: RunStatus;
  message_id: string | null;
  partial_text: string;
  last_seq: number;
  // queue_position: the run waits for a free slot, 1 = next to start
  // (docs/protocol.md "Admission"); absent when it does not wait.
  queue_position?: number;
}

export interface LastRun {
  run_id: string;
  status: RunStatus;
  error: string | null;
  discarded_stream_chars: number;
  published_message_id: string | null;
  resume_checkpoint_id: string | null;
  operations: OperationOutcome[];
}

export interface Snapshot {
  thread_id: string;
  title: string;
  state_version: number;
  head_checkpoint_id: string;
  last_seq: number;
  messages: Message[];
  active_run: ActiveRun | null;
  last_run: LastRun | null;
  // earlier_messages: how many messages at the start of the history the
  // page's own snapshot left out (never in the API's snapshots).
  earlier_messages?: number;
  // queue: the thread's message queue (absent from an older server's).
  queue?: Queue;
}

// QueueItem is a message waiting in a thread's message queue (docs/protocol.md
// "The message queue"): an after item starts once the active run completes;
// an interrupt item cancelled the active run and starts from its resume
// point.
export interface QueueItem {
  item_id: string;
  user_message: string;
  mode: "after" | "interrupt";
  requested_by: string;
  created_at: string;
}

// PausedReason says why a queue waits for queue.resume.
export type PausedReason = "run_cancelled" | "run_failed" | "head_moved";

// Queue is a thread's whole queue, in order (interrupt items first); a
// paused one starts nothing until a tab sends queue.resume.
export interface Queue {
  items: QueueItem[];
  paused: boolean;
  paused_reason: PausedReason | null;
}

// HistoryPage is GET /api/threads/{id}/messages: a page of the head's
// history, oldest first; next_before continues with older ones.
export interface HistoryPage {
  thread_id: string;
  head_checkpoint_id: string;
  state_version: number;
  messages: Message[];
  next_before: string | null;
}

export interface Checkpoint {
  checkpoint_id: string;
  parent_checkpoint_id: string | null;
  state_version: number;
  message_ids: string[];
  pending: { step: string; input_hash: string } | null;
  created_at: string;
}

// CheckpointDelta is one checkpoint of GET …/checkpoints?lists=delta: its
// message ids are the first message_ids_kept of its parent's, then
// message_ids_added (the steps and tool results likewise; the page does
// not use them).
export interface CheckpointDelta {
  checkpoint_id: string;
  parent_checkpoint_id: string | null;
  state_version: number;
  message_ids_kept: number;
  message_ids_added: string[];
  pending: { step: string; input_hash: string } | null;
  created_at: string;
}

export interface Operation {
  operation_id: string;
  run_id: string;
  tool: string;
  contract: string;
  phase: string;
  args: unknown;
  preview: unknown;
  idempotency_key: string | null;
  outcome: string | null;
  created_at: string;
  updated_at: string;
  // An unknown outcome is looked up by its key at the provider:
  // reconcile_next_at is the next lookup, reconcile_until the horizon. With
  // reconcile_until but no reconcile_next_at the gateway is not asking
  // (past the horizon, or the provider cannot be asked: an MCP server),
  // and only the provider's records for the key can tell.
  reconcile_next_at?: string;
  reconcile_until?: string;
  // What the tool last said of its progress while it worked (only on the
  // tool.updated events that report it): progress out of total (absent:
  // the tool did not say), and its message.
  progress?: ToolProgress;
}

export interface ToolProgress {
  progress: number;
  total?: number;
  message?: string;
}

export interface OperationOutcome {
  operation_id: string;
  tool: string;
  phase: string;
  outcome: string;
}

// ServerEvent is an event of a thread (docs/protocol.md, "Events"): a
// union keyed by type. The fields a type carries are typed as optional
// where the page must not trust a frame to hold them. A frame of a type
// not listed here (a newer server's) is read as none of them and ignored.
export type ServerEvent =
  | (EventBase & { type: "run.started"; status?: RunStatus; base_checkpoint_id?: string; queue_item_id?: string })
  | (EventBase & { type: "message.delta"; message_id?: string; text?: string })
  | (EventBase & { type: "message.published"; message?: Message; checkpoint_id?: string })
  | (EventBase & { type: "checkpoint.created"; checkpoint_id?: string; parent_checkpoint_id?: string | null })
  | (EventBase & { type: "tool.prepared" | "tool.updated"; operation?: Operation })
  | (EventBase & { type: "run.waiting_confirmation"; operation_id?: string })
  | (EventBase & { type: "run.cancel_requested"; reason?: string; requested_by?: string })
  | (EventBase & { type: "run.cancelling"; active_operation?: { kind: string; operation_id: string } })
  | (EventBase & {
      type: "run.cancelled";
      resume_checkpoint_id?: string;
      published_message_id?: string | null;
      discarded_stream_chars?: number;
      // whether a worker ever took the run up (absent in events written
      // before the server said so)
      executed?: boolean;
      operations?: OperationOutcome[];
      // how many messages wait in the queue after the cancel
      queued_messages?: number;
    })
  | (EventBase & { type: "run.completed" })
  | (EventBase & { type: "run.failed"; error?: string })
  | (EventBase & { type: "message.deleted"; message_id?: string; checkpoint_id?: string })
  | (EventBase & { type: "thread.head_moved"; head_checkpoint_id?: string; previous_head_checkpoint_id?: string })
  | (EventBase & { type: "thread.deleted" })
  | (EventBase & { type: "queue.updated"; queue?: Queue })
  | SnapshotEvent;

// EventBase holds what every event carries.
export interface EventBase {
  thread_id: string;
  seq: number;
  ts: number;
  state_version?: number;
  run_id?: string;
}

// SnapshotEvent is thread.snapshot: the snapshot's fields; its seq is the
// last seq it reflects (last_seq).
export type SnapshotEvent = Snapshot & { type: "thread.snapshot"; seq: number; ts?: number; state_version: number; run_id?: undefined };

// CancelAck answers run.cancel (and POST /api/runs/{id}/cancel).
export interface CancelAck {
  run_id: string;
  status: RunStatus;
  accepted_state_version: number;
  resume_checkpoint_id: string;
  published_message_id: string | null;
  already_requested: boolean;
}

export interface ErrorReply {
  type: "error";
  re?: string;
  error: string;
  message: string;
  allowed_actions?: string[];
  current_state_version?: number;
  [key: string]: unknown;
}

export class CommandError extends Error {
  constructor(readonly reply: ErrorReply) {
    super(reply.message);
  }
  get code(): string {
    return this.reply.error;
  }
}
