// The conversation as the server's events and snapshots make it, as pure
// functions: applyEvent and applySnapshot take a ThreadState and return
// the next one (never changing the one they were given) with the effects
// the page must carry out (fetch the title, ask a run's place, read a
// fresh snapshot …). ThreadView (thread.ts) holds the current state, does
// the effects and draws the page from it; nothing here touches the page or
// the network, so every rule below is unit-tested (static/test/).

import type { Message, Operation, OperationOutcome, Queue, RunStatus, ServerEvent, Snapshot } from "./protocol";
import type { Held } from "./seen";
import { windowStart } from "./history";
import { queuePosition } from "./admission";

export interface Run {
  id: string;
  status: RunStatus; // the server's word: its events, snapshot or cancel ack
}

// Streamed is the reply in flight (or the one a cancel left behind).
export interface Streamed {
  runID: string;
  messageID: string;
  text: string;
  lastSeq: number; // seq of the last delta this tab displayed
  saved: boolean;
  // restarted: this run streamed another message before, and it was never
  // published: the attempt was interrupted (a server restart) and the reply
  // starts over.
  restarted?: boolean;
  // held: once the run stopped, whether the server holds this text as shown
  // (asked once: seen.ts).
  held?: Held;
}

export interface Receipt {
  runID: string;
  kept: Message | null; // the last published message when the cancel was accepted
  discarded: number;
  // The run's operations as the cancel reported them; each is shown as it
  // is now (the operations map), so a later tool.updated changes the receipt.
  operations: OperationOutcome[];
  by?: string; // requested_by of the cancel, when this tab saw it recorded
  // queued: how many messages waited in the queue after the cancel
  // (run.cancelled's queued_messages; unknown after a reload).
  queued?: number;
  // interrupted: an interrupt item of the queue cancelled the run (reason
  // interrupted, as this tab saw it recorded): the item starts at once,
  // and the receipt stays in the history after the message before it,
  // anchor (interruptions).
  interrupted?: boolean;
  anchor?: string;
}

// ThreadState is what the page knows of one conversation from the server.
export interface ThreadState {
  readonly threadID: string;
  stateVersion: number;
  lastSeq: number; // the last seq applied: an event at or before it is a duplicate
  head: string;
  // The part of the head's history the page shows, and how many messages
  // come before it ("Show earlier messages", history.ts).
  messages: Message[];
  earlier: number;
  run: Run | null;
  // waiting: the run this tab last knew to wait for a free slot, and its
  // place (1 = next to start), from the run.start ack, a snapshot or GET
  // /api/runs/{id} (admission.ts). Dropped once the run shows it started
  // (a delta, a tool call) or the server says it no longer waits.
  waiting: { runID: string; position: number } | null;
  streamed: Streamed | null;
  receipt: Receipt | null;
  failure: string | null;
  // pendingStep: the last run stopped before its step was published, so
  // "Continue" may run it again.
  pendingStep: boolean;
  operations: ReadonlyMap<string, Operation>;
  // executed: what the server said (run.cancelled, or GET /api/runs/{id})
  // of cancelled runs: whether a worker ever took them up. Only a false
  // here lets a receipt say the run never started.
  executed: ReadonlyMap<string, boolean>;
  cancelledBy: ReadonlyMap<string, string>; // run → requested_by of its cancel
  // closing: a run was cancelled because the conversation is being deleted
  // (by any tab): thread.deleted follows.
  closing: boolean;
  // queue: the thread's message queue as its last queue.updated or
  // snapshot said.
  queue: Queue;
  // sentItems: queue items this tab saw start, and the run each started
  // as (run.started's queue_item_id).
  sentItems: ReadonlyMap<string, string>;
  cancelReasons: ReadonlyMap<string, string>; // run → reason of its cancel
  // interruptions: the receipts of runs an interrupt item stopped, as this
  // tab saw them, each shown after its anchor message (not history: a
  // reload does not show them).
  interruptions: readonly Receipt[];
}

// emptyQueue is a queue that holds nothing and is not paused.
export const emptyQueue: Queue = { items: [], paused: false, paused_reason: null };

// Effect is something the page does after a state change; the reducer only
// names it.
export type Effect =
  | { kind: "refresh_title" } // read the conversation's title again (the model names it)
  | { kind: "ask_place"; runID: string } // ask once whether a run another tab started waits for a slot
  | { kind: "resync" } // the history shown is not the head's any more: read a fresh snapshot
  | { kind: "checkpoint_created" } // a new checkpoint: the timeline, if open, reads it
  | { kind: "snapshot" } // a snapshot replaced the state: read checkpoints and operations again
  | { kind: "gone" }; // the conversation was deleted

// Applied is the outcome of applyEvent: state is the one given (the very
// object) when the event changed nothing (another thread's, a duplicate).
export interface Applied {
  state: ThreadState;
  effects: Effect[];
}

// CancelIntents tells the reducer whether this tab asked to cancel a run
// (the user pressed Cancel: the intent is kept or sent, cancel.ts). It is
// an input, like the event: the tab's own knowledge, not the server's.
export type CancelIntents = (runID: string) => boolean;

// emptyState is a conversation of which nothing is known yet.
export function emptyState(threadID: string): ThreadState {
  return {
    threadID,
    stateVersion: 0,
    lastSeq: 0,
    head: "",
    messages: [],
    earlier: 0,
    run: null,
    waiting: null,
    streamed: null,
    receipt: null,
    failure: null,
    pendingStep: false,
    operations: new Map(),
    executed: new Map(),
    cancelledBy: new Map(),
    closing: false,
    queue: emptyQueue,
    sentItems: new Map(),
    cancelReasons: new Map(),
    interruptions: [],
  };
}

// cancelAccepted: the server recorded a cancel of the active run.
export function cancelAccepted(s: ThreadState): boolean {
  return s.run !== null && (s.run.status === "cancel_requested" || s.run.status === "cancelling");
}

// keepsShown: the user asked to cancel runID (the intent is kept or sent,
// or the server recorded it), so the text shown of it stays as it was.
export function keepsShown(s: ThreadState, runID: string, intended: CancelIntents): boolean {
  return intended(runID) || (s.run !== null && s.run.id === runID && cancelAccepted(s));
}

// withOutcomes takes the phases a run.cancelled or a snapshot reported into
// the operations known: they are the server's word as of that seq (events
// after it correct them, and the operation log, when read again, brings
// the rest). It returns ops itself when nothing changes.
export function withOutcomes(ops: ReadonlyMap<string, Operation>, list: OperationOutcome[]): ReadonlyMap<string, Operation> {
  let next: Map<string, Operation> | null = null;
  for (const o of list) {
    const known = ops.get(o.operation_id);
    if (!known || known.phase === o.phase) continue;
    const op: Operation = { ...known, phase: o.phase, outcome: o.outcome };
    if (o.phase !== "unknown") delete op.reconcile_next_at;
    next ??= new Map(ops);
    next.set(o.operation_id, op);
  }
  return next ?? ops;
}

// applySnapshot replaces what the state knows of the server with snap,
// keeping what only this tab knows: the reply it showed of a run that is
// still unpublished, what it learnt of runs' cancels, the start of the
// history it brought in.
export function applySnapshot(prev: ThreadState, snap: Snapshot, intended: CancelIntents): ThreadState {
  const all = snap.messages ?? [];
  const from = windowStart(all, prev.messages[0]?.message_id);
  const s: ThreadState = {
    ...prev,
    stateVersion: snap.state_version,
    lastSeq: snap.last_seq,
    head: snap.head_checkpoint_id,
    messages: all.slice(from),
    earlier: (snap.earlier_messages ?? 0) + from,
    receipt: null,
    failure: null,
    queue: snap.queue ?? emptyQueue,
  };
  // How the latest run ended, while it is still the last word on the
  // conversation (nothing moved the head since): a reloaded page shows the
  // same receipt or failure as the tab that watched it happen.
  const last = snap.last_run;
  if (last) s.operations = withOutcomes(s.operations, last.operations);
  // A fragment of the cancelled reply saved since moved the head on by
  // itself: the receipt still stands (and says the fragment was kept).
  const tail = s.messages[s.messages.length - 1];
  const savedSince = !!last && tail?.kind === "fragment" && tail.fragment_of?.run_id === last.run_id;
  if (last && (last.resume_checkpoint_id === snap.head_checkpoint_id || savedSince)) {
    if (last.status === "cancelled") {
      const kept = last.published_message_id ? s.messages.find((m) => m.message_id === last.published_message_id) : undefined;
      s.receipt = { runID: last.run_id, kept: kept ?? null, discarded: last.discarded_stream_chars, operations: last.operations };
    } else if (last.status === "failed") {
      s.failure = last.error ?? "the run failed";
    }
  }
  const ar = snap.active_run;
  s.run = ar ? { id: ar.run_id, status: ar.status } : null;
  // Where the run stands in the admission queue, as of this snapshot
  // (what this tab knew of a run that ended since stays, for its receipt).
  const place = ar ? queuePosition(ar.queue_position) : 0;
  if (ar && place > 0) s.waiting = { runID: ar.run_id, position: place };
  else if (ar || (s.waiting && s.waiting.runID !== last?.run_id)) s.waiting = null;
  // The reply this tab showed was interrupted if the run now streams
  // another message and the one shown was never published (a restart
  // while this tab was away: the snapshot alone does not say so). Until
  // the run streams again, what was shown stays, as after events.
  const shown = prev.streamed;
  const unpublished = !!shown && !s.messages.some((m) => m.message_id === shown.messageID);
  const same = !!ar && !!shown && shown.runID === ar.run_id && unpublished;
  const restarted = same && !!shown && (shown.messageID !== ar?.message_id || shown.restarted === true);
  // What this tab showed of a run that stopped since (the snapshot of a
  // reconnect after a server stop) stays on screen, as after
  // run.cancelled: the user may save it, or learn that the server lost it.
  const stopped = !ar && !!last && !!shown && shown.runID === last.run_id && unpublished && (last.status === "cancelled" || last.status === "failed");
  s.streamed =
    ar && ar.message_id && !(same && keepsShown(s, ar.run_id, intended))
      ? { runID: ar.run_id, messageID: ar.message_id, text: ar.partial_text, lastSeq: ar.last_seq, saved: false, restarted }
      : same || stopped
        ? shown
        : null;
  return s;
}

// stopping are the events of a run that say nothing of whether it has a
// slot: any other event of a waiting run shows it has one.
const stopping = new Set(["run.started", "run.cancel_requested", "run.cancelling", "run.cancelled"]);

// applyEvent applies one event of the thread, in seq order: an event of
// another thread, or at or before the last seq applied, changes nothing.
export function applyEvent(prev: ThreadState, ev: ServerEvent, intended: CancelIntents): Applied {
  if (ev.thread_id !== prev.threadID) return { state: prev, effects: [] };
  if (ev.type === "thread.snapshot") return { state: applySnapshot(prev, ev, intended), effects: [{ kind: "snapshot" }] };
  if (ev.seq <= prev.lastSeq) return { state: prev, effects: [] };
  const s: ThreadState = { ...prev, lastSeq: ev.seq };
  const effects: Effect[] = [];
  if (ev.state_version) s.stateVersion = ev.state_version;
  if (s.waiting && ev.run_id === s.waiting.runID && !stopping.has(ev.type)) s.waiting = null;
  let branched = false;
  switch (ev.type) {
    case "run.started": {
      effects.push({ kind: "refresh_title" });
      const runID = ev.run_id ?? "";
      s.run = { id: runID, status: ev.status ?? "queued" };
      if (s.waiting && s.waiting.runID !== runID) s.waiting = null;
      // A run this tab did not start (another tab, a program) may wait for
      // a slot: no event would say so, so the page asks once (and skips
      // the runs whose run.start ack it read).
      if (s.run.status === "queued") effects.push({ kind: "ask_place", runID });
      if (ev.queue_item_id) s.sentItems = new Map(s.sentItems).set(ev.queue_item_id, runID);
      // The receipt of a run an interrupt stopped stays, in the history,
      // above the message that interrupted it.
      if (s.receipt?.interrupted) s.interruptions = [...s.interruptions, s.receipt];
      s.streamed = null;
      s.receipt = null;
      s.failure = null;
      s.pendingStep = false;
      break;
    }
    case "message.delta": {
      const shown = s.streamed;
      // After the user pressed Cancel on the text shown, a new attempt of
      // the same run (the server restarted meanwhile) is not shown in its
      // place: what they saw, and may save, stays.
      if (shown && shown.runID === ev.run_id && shown.messageID !== ev.message_id && keepsShown(s, ev.run_id ?? "", intended)) break;
      if (!shown || shown.messageID !== ev.message_id) {
        const restarted = shown !== null && shown.runID === ev.run_id;
        s.streamed = { runID: ev.run_id ?? "", messageID: ev.message_id ?? "", text: ev.text ?? "", lastSeq: ev.seq, saved: false, restarted };
      } else {
        s.streamed = { ...shown, text: shown.text + (ev.text ?? ""), lastSeq: ev.seq };
      }
      if (s.run && s.run.status === "queued") s.run = { ...s.run, status: "running" };
      break;
    }
    case "message.published": {
      const m = ev.message;
      if (m && !s.messages.some((x) => x.message_id === m.message_id)) s.messages = [...s.messages, m];
      if (m && s.streamed && s.streamed.messageID === m.message_id) s.streamed = null;
      break;
    }
    case "checkpoint.created":
      // A new head whose parent is not the head this page shows means the
      // conversation moved to another branch (an edited request, a
      // continue from an older point): the history on screen is no longer
      // the head's, and events do not say which messages it holds.
      branched = !!ev.parent_checkpoint_id && ev.parent_checkpoint_id !== s.head;
      s.head = ev.checkpoint_id ?? s.head;
      break;
    case "message.deleted":
      s.messages = s.messages.filter((m) => m.message_id !== ev.message_id);
      break;
    case "thread.head_moved":
      // Another branch is shown now (this tab's switch or another's): its
      // messages come with a fresh snapshot.
      s.head = ev.head_checkpoint_id ?? s.head;
      branched = true;
      break;
    case "run.cancel_requested":
      if (ev.run_id && ev.requested_by) s.cancelledBy = new Map(s.cancelledBy).set(ev.run_id, ev.requested_by);
      if (ev.run_id && ev.reason) s.cancelReasons = new Map(s.cancelReasons).set(ev.run_id, ev.reason);
      if (ev.reason === "thread_deleted") s.closing = true;
      if (s.run && s.run.id === ev.run_id) s.run = { ...s.run, status: "cancel_requested" };
      break;
    case "run.cancelling":
      if (s.run && s.run.id === ev.run_id) s.run = { ...s.run, status: "cancelling" };
      break;
    case "run.cancelled": {
      const ops = ev.operations ?? [];
      s.operations = withOutcomes(s.operations, ops);
      if (ev.run_id && typeof ev.executed === "boolean") s.executed = new Map(s.executed).set(ev.run_id, ev.executed);
      const kept = ev.published_message_id ? s.messages.find((m) => m.message_id === ev.published_message_id) : undefined;
      const runID = ev.run_id ?? "";
      s.receipt = { runID, kept: kept ?? null, discarded: ev.discarded_stream_chars ?? 0, operations: ops, by: s.cancelledBy.get(runID) };
      if (typeof ev.queued_messages === "number") s.receipt.queued = ev.queued_messages;
      if (s.cancelReasons.get(runID) === "interrupted") {
        s.receipt.interrupted = true;
        s.receipt.anchor = s.messages[s.messages.length - 1]?.message_id ?? "";
      }
      s.run = null;
      s.pendingStep = true;
      break;
    }
    case "run.completed":
      s.run = null;
      s.streamed = null;
      s.pendingStep = false;
      break;
    case "thread.deleted":
      return { state: s, effects: [{ kind: "gone" }] };
    case "queue.updated":
      if (ev.queue) s.queue = { items: ev.queue.items ?? [], paused: ev.queue.paused === true, paused_reason: ev.queue.paused_reason ?? null };
      break;
    case "run.failed":
      s.run = null;
      s.failure = ev.error ?? "the run failed";
      s.pendingStep = true;
      break;
    case "tool.prepared":
    case "tool.updated": {
      const op = ev.operation;
      if (!op) break;
      s.operations = new Map(s.operations).set(op.operation_id, op);
      // A decision on the call the run waited for resumes the run (the
      // server's status is running from that commit on).
      if (op.phase !== "prepared" && s.run && s.run.id === op.run_id && s.run.status === "waiting_confirmation") s.run = { ...s.run, status: "running" };
      break;
    }
    case "run.waiting_confirmation":
      if (s.run && s.run.id === ev.run_id) s.run = { ...s.run, status: "waiting_confirmation" };
      s.streamed = null;
      break;
  }
  // The model names a conversation from its first request while the first
  // reply streams (titles are labels: no event carries them).
  if ((ev.type === "run.completed" || ev.type === "run.cancelled" || ev.type === "run.failed") && s.messages.filter((m) => m.role === "user").length <= 1) {
    effects.push({ kind: "refresh_title" });
  }
  if (branched) effects.push({ kind: "resync" });
  else if (ev.type === "checkpoint.created") effects.push({ kind: "checkpoint_created" });
  return { state: s, effects };
}

// The answers of the page's own reads and commands that no event reports.

// place is where the active run waits for a slot: its queue position, 0
// when it does not wait (as far as this tab knows).
export function place(s: ThreadState): number {
  const w = s.waiting;
  return w && s.run && s.run.id === w.runID && s.run.status === "queued" ? w.position : 0;
}

// withQueuePosition takes what the server said of runID's place (a
// run.start ack, GET /api/runs/{id}): position > 0, it waits there; 0, it
// does not (or no longer) wait. A run seen streaming already does not
// wait, whatever an older answer says.
export function withQueuePosition(s: ThreadState, runID: string, position: number): ThreadState {
  if (s.run && s.run.id === runID && s.run.status !== "queued") position = 0;
  if (position > 0) return { ...s, waiting: { runID, position } };
  if (s.waiting && s.waiting.runID === runID) return { ...s, waiting: null };
  return s;
}

// withRunPlace applies GET /api/runs/{id}'s answer about the active run,
// unless events moved on since it was asked (the run streams, or is being
// cancelled: events tell the rest). A run that no longer waits and runs
// has been claimed: its first delta is on its way.
export function withRunPlace(s: ThreadState, runID: string, p: { position: number; status: string }): ThreadState {
  if (!s.run || s.run.id !== runID || s.run.status !== "queued") return s;
  const next = withQueuePosition(s, runID, p.position);
  if (p.position === 0 && p.status === "running") return { ...next, run: { ...s.run, status: "running" } };
  return next;
}

// withCancelAck applies the ack of this tab's cancel of runID: the status
// when the cancel was recorded. run.cancelling (the engine's next write)
// may come before the ack, and an ack never takes the status back from
// cancelling to cancel_requested.
export function withCancelAck(s: ThreadState, runID: string, status: RunStatus): ThreadState {
  const r = s.run;
  if (!r || r.id !== runID || (status !== "cancel_requested" && status !== "cancelling") || r.status === "cancelling") return s;
  return { ...s, run: { ...r, status } };
}

// withOperationLog takes the thread's operation log as read over HTTP: an
// operation replaces what is known of it unless events brought a newer
// state meanwhile.
export function withOperationLog(s: ThreadState, log: Operation[]): ThreadState {
  const ops = new Map(s.operations);
  for (const op of log) {
    const known = ops.get(op.operation_id);
    if (!known || known.updated_at <= op.updated_at) ops.set(op.operation_id, op);
  }
  return { ...s, operations: ops };
}

// withExecuted records what GET /api/runs/{id} said of a cancelled run:
// whether a worker ever took it up.
export function withExecuted(s: ThreadState, runID: string, executed: boolean): ThreadState {
  return { ...s, executed: new Map(s.executed).set(runID, executed) };
}
