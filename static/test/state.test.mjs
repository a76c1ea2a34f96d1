// Unit tests of the page's reducer (static/src/state.ts), run by `make
// test` (npm run unit) with node's test runner on the module esbuild
// bundles into bin/unit/. Every test freezes the state it passes in: a
// reducer that changed its input would throw here.

import { test } from "node:test";
import assert from "node:assert/strict";
import {
  applyEvent,
  applySnapshot,
  emptyState,
  place,
  withCancelAck,
  withExecuted,
  withOperationLog,
  withQueuePosition,
  withRunPlace,
} from "../../bin/unit/state.mjs";

const T = "thr_1";
const none = () => false;

// freeze makes a state and everything it holds immutable (maps: their
// entries are compared instead, see unchanged).
function freeze(v) {
  if (v && typeof v === "object" && !Object.isFrozen(v)) {
    if (v instanceof Map) {
      for (const x of v.values()) freeze(x);
      return v;
    }
    Object.freeze(v);
    for (const x of Object.values(v)) freeze(x);
  }
  return v;
}

function mapsOf(s) {
  return JSON.stringify([[...s.operations], [...s.executed], [...s.cancelledBy]]);
}

// apply applies events in order to a frozen state, checks the maps of
// every input state came out unchanged, and returns the last state with
// every effect named.
function apply(state, events, intended = none) {
  const effects = [];
  for (const ev of events) {
    freeze(state);
    const before = mapsOf(state);
    const r = applyEvent(state, ev, intended);
    assert.equal(mapsOf(state), before, `${ev.type} changed the maps of its input state`);
    effects.push(...r.effects);
    state = r.state;
  }
  return { state, effects };
}

function msg(id, role, content, extra = {}) {
  return {
    message_id: id,
    thread_id: T,
    role,
    kind: "text",
    content,
    state_version: 1,
    checkpoint_id: "cp",
    run_id: null,
    fragment_of: null,
    created_at: "2026-12-05T00:00:00Z",
    ...extra,
  };
}

function snapshot(extra = {}) {
  return {
    thread_id: T,
    title: "t",
    state_version: 3,
    head_checkpoint_id: "cp_1",
    last_seq: 10,
    messages: [msg("msg_u1", "user", "hello")],
    active_run: null,
    last_run: null,
    ...extra,
  };
}

function op(id, phase, extra = {}) {
  return {
    operation_id: id,
    run_id: "run_1",
    tool: "send_email",
    contract: "consequential",
    phase,
    args: {},
    preview: null,
    idempotency_key: "k",
    outcome: null,
    created_at: "2026-12-05T00:00:00Z",
    updated_at: "2026-12-05T00:00:01Z",
    ...extra,
  };
}

// start is a state after a snapshot (last seq 10, head cp_1) and the
// start of run_1.
function started(status = "queued") {
  const s = applySnapshot(emptyState(T), snapshot(), none);
  return apply(s, [{ type: "run.started", thread_id: T, seq: 11, ts: 0, state_version: 4, run_id: "run_1", status }]).state;
}

let seq = 11;
const ev = (type, fields = {}) => ({ type, thread_id: T, seq: ++seq, ts: 0, run_id: "run_1", ...fields });

test("a snapshot sets what the server knows, and keeps nothing of an older conversation", () => {
  const s = freeze(emptyState(T));
  const n = applySnapshot(s, snapshot(), none);
  assert.equal(n.stateVersion, 3);
  assert.equal(n.lastSeq, 10);
  assert.equal(n.head, "cp_1");
  assert.deepEqual(n.messages.map((m) => m.message_id), ["msg_u1"]);
  assert.equal(n.run, null);
  assert.equal(n.streamed, null);
  assert.equal(s.lastSeq, 0, "the input state is unchanged");
});

test("run.started: the run is the active one, queued, and a run nobody acked here is asked for its place", () => {
  seq = 11;
  const s = applySnapshot(emptyState(T), snapshot(), none);
  const { state, effects } = apply(s, [{ type: "run.started", thread_id: T, seq: 11, ts: 0, state_version: 4, run_id: "run_1", status: "queued" }]);
  assert.deepEqual(state.run, { id: "run_1", status: "queued" });
  assert.equal(state.stateVersion, 4);
  assert.equal(state.pendingStep, false);
  assert.deepEqual(effects, [{ kind: "refresh_title" }, { kind: "ask_place", runID: "run_1" }]);
});

test("message.delta: the reply streams into one provisional message, and the run is no longer queued", () => {
  const { state } = apply(started(), [ev("message.delta", { message_id: "msg_a1", text: "Hel" }), ev("message.delta", { message_id: "msg_a1", text: "lo" })]);
  assert.equal(state.streamed.text, "Hello");
  assert.equal(state.streamed.messageID, "msg_a1");
  assert.equal(state.streamed.lastSeq, seq);
  assert.equal(state.streamed.restarted, false);
  assert.equal(state.run.status, "running");
  assert.equal(state.messages.length, 1, "streamed text is never history");
});

test("message.delta of another message of the same run: the attempt restarted and the reply starts over", () => {
  const { state } = apply(started(), [ev("message.delta", { message_id: "msg_a1", text: "first try" }), ev("message.delta", { message_id: "msg_a2", text: "again" })]);
  assert.equal(state.streamed.text, "again");
  assert.equal(state.streamed.restarted, true);
});

test("a cancel pressed here (even offline) keeps the text shown when the run restarts streaming another message", () => {
  const intended = (id) => id === "run_1";
  const { state } = apply(started(), [ev("message.delta", { message_id: "msg_a1", text: "what I saw" }), ev("message.delta", { message_id: "msg_a2", text: "other" })], intended);
  assert.equal(state.streamed.messageID, "msg_a1");
  assert.equal(state.streamed.text, "what I saw");
});

test("message.published: the message joins history once, and the provisional text of it goes", () => {
  const m = msg("msg_a1", "assistant", "Hello", { run_id: "run_1" });
  const { state } = apply(started(), [
    ev("message.delta", { message_id: "msg_a1", text: "Hello" }),
    ev("message.published", { message: m }),
    ev("message.published", { message: m }), // another seq carrying the same message: no double
  ]);
  assert.deepEqual(state.messages.map((x) => x.message_id), ["msg_u1", "msg_a1"]);
  assert.equal(state.streamed, null);
});

test("checkpoint.created on the head: the timeline is told; on another parent: the page reads a fresh snapshot", () => {
  const same = apply(started(), [ev("checkpoint.created", { checkpoint_id: "cp_2", parent_checkpoint_id: "cp_1" })]);
  assert.equal(same.state.head, "cp_2");
  assert.deepEqual(same.effects, [{ kind: "checkpoint_created" }]);
  const other = apply(started(), [ev("checkpoint.created", { checkpoint_id: "cp_9", parent_checkpoint_id: "cp_0" })]);
  assert.equal(other.state.head, "cp_9");
  assert.deepEqual(other.effects, [{ kind: "resync" }]);
});

test("thread.head_moved and message.deleted", () => {
  const moved = apply(started(), [ev("thread.head_moved", { head_checkpoint_id: "cp_0", previous_head_checkpoint_id: "cp_1" })]);
  assert.equal(moved.state.head, "cp_0");
  assert.deepEqual(moved.effects, [{ kind: "resync" }]);
  const deleted = apply(started(), [ev("message.deleted", { message_id: "msg_u1", checkpoint_id: "cp_2" })]);
  assert.equal(deleted.state.messages.length, 0);
});

test("run.cancel_requested, run.cancelling, run.cancelled: statuses, then the receipt with what was kept and by whom", () => {
  const kept = msg("msg_a0", "assistant", "earlier reply");
  let s = applySnapshot(emptyState(T), snapshot({ messages: [msg("msg_u1", "user", "hello"), kept] }), none);
  s = apply(s, [{ type: "run.started", thread_id: T, seq: 11, ts: 0, run_id: "run_1", status: "queued" }]).state;
  s = withOperationLog(s, [op("op_1", "committing")]);
  let r = apply(s, [ev("message.delta", { message_id: "msg_a1", text: "partial" }), ev("run.cancel_requested", { reason: "user_requested", requested_by: "tab_2" })]);
  assert.equal(r.state.run.status, "cancel_requested");
  r = apply(r.state, [ev("run.cancelling", { active_operation: { kind: "tool_commit", operation_id: "op_1" } })]);
  assert.equal(r.state.run.status, "cancelling");
  r = apply(r.state, [
    ev("run.cancelled", {
      published_message_id: "msg_a0",
      discarded_stream_chars: 7,
      executed: true,
      operations: [{ operation_id: "op_1", tool: "send_email", phase: "committed", outcome: "sent" }],
    }),
  ]);
  const st = r.state;
  assert.equal(st.run, null);
  assert.equal(st.pendingStep, true);
  assert.equal(st.receipt.kept.message_id, "msg_a0");
  assert.equal(st.receipt.discarded, 7);
  assert.equal(st.receipt.by, "tab_2");
  assert.equal(st.operations.get("op_1").phase, "committed", "the receipt's outcome updates the operation known");
  assert.equal(st.executed.get("run_1"), true);
  assert.equal(st.streamed.text, "partial", "what the user saw stays on screen (to save it)");
  assert.deepEqual(r.effects, [{ kind: "refresh_title" }], "the first exchange ended: the title may have come");
});

test("a cancel in the conversation's deletion marks it closing; thread.deleted says gone", () => {
  const r = apply(started(), [ev("run.cancel_requested", { reason: "thread_deleted", requested_by: "tab_1" }), ev("thread.deleted")]);
  assert.equal(r.state.closing, true);
  assert.deepEqual(r.effects.at(-1), { kind: "gone" });
});

test("run.completed and run.failed end the run; a failure is shown and Continue offered", () => {
  const done = apply(started(), [ev("message.delta", { message_id: "msg_a1", text: "x" }), ev("run.completed")]).state;
  assert.equal(done.run, null);
  assert.equal(done.streamed, null);
  assert.equal(done.pendingStep, false);
  const failed = apply(started(), [ev("run.failed", { error: "the model is unreachable" })]).state;
  assert.equal(failed.run, null);
  assert.equal(failed.failure, "the model is unreachable");
  assert.equal(failed.pendingStep, true);
});

test("tool.prepared, run.waiting_confirmation, tool.updated: a decided call resumes the run", () => {
  let s = apply(started("running"), [ev("tool.prepared", { operation: op("op_1", "prepared") }), ev("run.waiting_confirmation", { operation_id: "op_1" })]).state;
  assert.equal(s.run.status, "waiting_confirmation");
  assert.equal(s.operations.get("op_1").phase, "prepared");
  s = apply(s, [ev("tool.updated", { operation: op("op_1", "confirmed") })]).state;
  assert.equal(s.run.status, "running");
  assert.equal(s.operations.get("op_1").phase, "confirmed");
});

test("replays: an event at or before the last seq applied, or of another thread, changes nothing", () => {
  const s = freeze(started());
  const old = { type: "message.delta", thread_id: T, seq: 5, ts: 0, run_id: "run_1", message_id: "m", text: "old" };
  assert.equal(applyEvent(s, old, none).state, s);
  assert.equal(applyEvent(s, { ...old, seq: s.lastSeq }, none).state, s);
  assert.equal(applyEvent(s, { ...old, thread_id: "thr_other", seq: 999 }, none).state, s);
  // The same events twice: the second pass is a no-op.
  const evs = [ev("message.delta", { message_id: "msg_a1", text: "a" }), ev("message.delta", { message_id: "msg_a1", text: "b" })];
  const once = apply(s, evs).state;
  const twice = apply(once, evs).state;
  assert.equal(twice, once);
  assert.equal(twice.streamed.text, "ab");
});

test("stale versions: state_version only moves with newer events, so a command carries the latest", () => {
  const s = apply(started(), [ev("run.cancel_requested", { state_version: 9 }), ev("message.delta", { message_id: "m", text: "x" })]).state;
  assert.equal(s.stateVersion, 9, "a delta (no state_version) keeps it");
  assert.equal(applyEvent(s, { type: "run.cancelled", thread_id: T, seq: 2, ts: 0, state_version: 5, run_id: "run_1" }, none).state.stateVersion, 9);
});

test("gaps: the snapshot that fills one keeps the unpublished text shown of the same run, and says when it restarted", () => {
  const shown = apply(started(), [ev("message.delta", { message_id: "msg_a1", text: "seen" })]).state;
  const sameMsg = applySnapshot(
    freeze(shown),
    snapshot({ last_seq: 40, active_run: { run_id: "run_1", status: "running", message_id: "msg_a1", partial_text: "seen and more", last_seq: 40 } }),
    none,
  );
  assert.equal(sameMsg.streamed.text, "seen and more", "the server's partial text of the same message");
  assert.equal(sameMsg.streamed.restarted, false);
  const other = applySnapshot(shown, snapshot({ last_seq: 40, active_run: { run_id: "run_1", status: "running", message_id: "msg_a2", partial_text: "new", last_seq: 40 } }), none);
  assert.equal(other.streamed.restarted, true, "another message of the same run: the attempt was interrupted");
  const kept = applySnapshot(shown, snapshot({ last_seq: 40, active_run: { run_id: "run_1", status: "running", message_id: "msg_a2", partial_text: "new", last_seq: 40 } }), () => true);
  assert.equal(kept.streamed.text, "seen", "a cancel pressed here keeps what was shown");
});

test("a snapshot after the run stopped (a reconnect after a server stop) keeps the text shown and shows the receipt", () => {
  const shown = apply(started(), [ev("message.delta", { message_id: "msg_a1", text: "seen" })]).state;
  const s = applySnapshot(
    freeze(shown),
    snapshot({
      last_seq: 50,
      head_checkpoint_id: "cp_1",
      last_run: { run_id: "run_1", status: "cancelled", error: null, discarded_stream_chars: 4, published_message_id: null, resume_checkpoint_id: "cp_1", operations: [] },
    }),
    none,
  );
  assert.equal(s.streamed.text, "seen");
  assert.equal(s.receipt.runID, "run_1");
  assert.equal(s.receipt.discarded, 4);
  const moved = applySnapshot(shown, snapshot({ last_seq: 50, head_checkpoint_id: "cp_7", last_run: { run_id: "run_1", status: "failed", error: "x", discarded_stream_chars: 0, published_message_id: null, resume_checkpoint_id: "cp_1", operations: [] } }), none);
  assert.equal(moved.failure, null, "the head moved since: the failure is no longer the last word");
});

test("admission: a queued run's place, dropped once it streams; a cancel ack never takes cancelling back", () => {
  let s = started();
  s = withQueuePosition(freeze(s), "run_1", 3);
  assert.equal(place(s), 3);
  assert.equal(apply(s, [ev("run.cancel_requested")]).state.waiting?.position, 3, "a cancel says nothing of a slot");
  const claimed = withRunPlace(freeze(s), "run_1", { position: 0, status: "running" });
  assert.equal(claimed.run.status, "running");
  assert.equal(place(claimed), 0);
  const streaming = apply(s, [ev("message.delta", { message_id: "m", text: "x" })]).state;
  assert.equal(streaming.waiting, null);
  assert.equal(withQueuePosition(freeze(streaming), "run_1", 2).waiting, null, "an older answer cannot put a streaming run back in the queue");
  const cancelling = apply(started("running"), [ev("run.cancelling")]).state;
  assert.equal(withCancelAck(freeze(cancelling), "run_1", "cancel_requested"), cancelling);
  const running = started("running");
  assert.equal(withCancelAck(freeze(running), "run_1", "cancel_requested").run.status, "cancel_requested");
  assert.equal(withExecuted(freeze(running), "run_1", false).executed.get("run_1"), false);
});

const queueItem = (id, text, mode = "after") => ({ item_id: id, user_message: text, mode, requested_by: "tab:x", created_at: "2026-12-05T00:00:00Z" });

test("the message queue: a snapshot's queue, then each queue.updated replaces it whole; a run started from it says which item", () => {
  const empty = applySnapshot(emptyState(T), snapshot(), none);
  assert.deepEqual(empty.queue, { items: [], paused: false, paused_reason: null }, "an older server's snapshot: nothing queued");
  const q = { items: [queueItem("qi_1", "first")], paused: false, paused_reason: null };
  let s = applySnapshot(emptyState(T), snapshot({ queue: q }), none);
  assert.deepEqual(s.queue, q);
  s = started("running");
  const two = { items: [queueItem("qi_1", "first"), queueItem("qi_2", "second")], paused: false, paused_reason: null };
  let r = apply(s, [ev("queue.updated", { run_id: undefined, state_version: 9, queue: two })]);
  assert.deepEqual(r.state.queue, two);
  assert.equal(r.state.stateVersion, 9);
  assert.deepEqual(r.effects, []);
  // The run completes; the first item starts as the next run and leaves
  // the queue in the same step.
  r = apply(r.state, [
    ev("run.completed"),
    ev("message.published", { run_id: undefined, message: msg("msg_u2", "user", "first") }),
    ev("run.started", { run_id: "run_2", status: "queued", queue_item_id: "qi_1" }),
    ev("queue.updated", { run_id: undefined, queue: { items: [queueItem("qi_2", "second")], paused: false, paused_reason: null } }),
  ]);
  assert.equal(r.state.run.id, "run_2");
  assert.equal(r.state.sentItems.get("qi_1"), "run_2");
  assert.deepEqual(r.state.queue.items.map((i) => i.item_id), ["qi_2"]);
  assert.equal(r.state.interruptions.length, 0);
});

test("the message queue: a Stop's receipt counts what waits, and the queue pauses", () => {
  const r = apply(started("running"), [
    ev("queue.updated", { run_id: undefined, queue: { items: [queueItem("qi_1", "first")], paused: false, paused_reason: null } }),
    ev("run.cancel_requested", { reason: "user_requested", requested_by: "tab:x" }),
    ev("run.cancelled", { published_message_id: "msg_u1", discarded_stream_chars: 3, queued_messages: 1 }),
    ev("queue.updated", { run_id: undefined, queue: { items: [queueItem("qi_1", "first")], paused: true, paused_reason: "run_cancelled" } }),
  ]);
  assert.equal(r.state.receipt.queued, 1);
  assert.equal(r.state.receipt.interrupted, undefined);
  assert.deepEqual([r.state.queue.paused, r.state.queue.paused_reason], [true, "run_cancelled"]);
  assert.equal(r.state.run, null);
});

test("the message queue: a run an interrupt stopped keeps its receipt in the history, after the message it followed", () => {
  const r = apply(started("running"), [
    ev("message.delta", { message_id: "msg_a1", text: "partial" }),
    ev("run.cancel_requested", { reason: "interrupted", requested_by: "tab:x" }),
    ev("queue.updated", { run_id: undefined, queue: { items: [queueItem("qi_9", "now", "interrupt")], paused: false, paused_reason: null } }),
    ev("run.cancelled", { published_message_id: "msg_u1", discarded_stream_chars: 7, queued_messages: 0 }),
  ]);
  assert.equal(r.state.receipt.interrupted, true);
  assert.equal(r.state.receipt.anchor, "msg_u1", "after the last message shown when it stopped");
  const next = apply(r.state, [
    ev("message.published", { run_id: undefined, message: msg("msg_u2", "user", "now") }),
    ev("run.started", { run_id: "run_2", status: "queued", queue_item_id: "qi_9" }),
    ev("queue.updated", { run_id: undefined, queue: { items: [], paused: false, paused_reason: null } }),
  ]).state;
  assert.equal(next.receipt, null, "no receipt offering to continue: the conversation went on");
  assert.deepEqual(next.interruptions.map((x) => [x.runID, x.anchor, x.discarded, x.by]), [["run_1", "msg_u1", 7, "tab:x"]]);
  assert.equal(next.streamed, null);
  // It stays through a snapshot (the tab's own knowledge: no event says it again).
  const snap = applySnapshot(next, snapshot({ last_seq: 99, messages: [msg("msg_u1", "user", "hello"), msg("msg_u2", "user", "now")] }), none);
  assert.equal(snap.interruptions.length, 1);
});
