// The live region under the messages: what is happening now and what the
// user can do about it. The reply being streamed (provisional, never
// history), a run waiting for a slot or working, a tool call waiting for
// confirmation, the receipt of a cancel, a failure, an unfinished step,
// and the request being edited.

import { button, el } from "./dom";
import { cardStart } from "./card";
import { LiveMarkdown } from "./markdown";
import { canSave } from "./seen";
import { place, cancelAccepted, type Streamed, type ThreadState } from "./state";
import { waitingBox } from "./admission";
import { callingLabel, cancelWaitsFor, toolProgress } from "./toolview";
import { receiptCard, type ReceiptView } from "./receipt";
import type { CancelState } from "./cancel";
import type { Operation } from "./protocol";

// LiveView is what the live region needs besides the state. cancelOf is
// this tab's own cancel of a run (cancel.ts); tick keeps a render every
// second while a tool call runs (its elapsed time); checkHeld asks the
// server, once, whether it holds a stopped reply as shown (seen.ts).
export interface LiveView extends ReceiptView {
  body: StreamedBody;
  editing: boolean;
  cancelOf(runID: string): CancelState | null;
  tick(on: boolean): void;
  checkHeld(s: Streamed): void;
}

// liveParts are the live region's contents for state s.
export function liveParts(s: ThreadState, v: LiveView): Node[] {
  const parts: Node[] = [];
  const streamed = s.streamed;
  if (streamed && !streamed.saved) {
    parts.push(streamedBox(s, streamed, v));
  } else if (s.run && place(s) > 0) {
    // Waiting for a free slot is a state of its own, not a reply being
    // written: no pulse, and what it means in words.
    parts.push(waitingBox(place(s)));
    v.tick(false);
  } else if (s.run) {
    parts.push(runBox(s, v));
  } else {
    v.tick(false);
  }
  for (const op of s.operations.values()) {
    if (op.phase === "prepared" && s.run && s.run.id === op.run_id) parts.push(confirmCard(op));
  }
  if (s.receipt) {
    // (Not for a conversation being deleted: nothing of it can be saved,
    // and the server may no longer know it by the time it is asked.)
    if (streamed && streamed.runID === s.receipt.runID && !s.closing && !v.gone) v.checkHeld(streamed);
    parts.push(receiptCard(s, s.receipt, v));
  }
  if (s.failure) {
    parts.push(
      el(
        "div",
        { class: "card-box error", "data-testid": "failure", role: "alert" },
        el("strong", {}, "The reply failed. "),
        s.failure,
        el("div", { class: "actions" }, button("Continue from the saved point", "continue", "action-continue", "btn primary")),
      ),
    );
  } else if (!s.receipt && !s.run && s.pendingStep) {
    parts.push(
      el(
        "div",
        { class: "card-box", "data-testid": "pending" },
        "The last reply was not finished. ",
        el("div", { class: "actions" }, button("Continue from the saved point", "continue", "action-continue", "btn primary")),
      ),
    );
  }
  if (v.editing) {
    parts.push(el("div", { class: "card-box", "data-testid": "editing" }, "Editing your last request: sending it starts a new branch from before it. ", button("Stop editing", "stop-edit", "action-stop-edit", "btn ghost small")));
  }
  return parts;
}

// streamedBox is the reply being streamed, or stopped and not published:
// its text with a chip that says what it is (never part of the history).
function streamedBox(s: ThreadState, streamed: Streamed, v: LiveView): HTMLElement {
  const streaming = s.run !== null && s.run.id === streamed.runID;
  const mine = v.cancelOf(streamed.runID);
  const chip = streaming
    ? cancelAccepted(s) || mine === "sending"
      ? el("span", { class: "chip warn", "data-testid": "run-chip" }, "Cancelling…")
      : mine === "kept"
        ? el("span", { class: "chip warn", "data-testid": "run-chip" }, "Cancel pending · not saved yet")
        : el("span", { class: "chip live", "data-testid": "run-chip" }, streamed.restarted ? "Interrupted, starting over · not saved yet" : "Streaming · not saved yet")
    : canSave(streamed.held)
      ? el("span", { class: "chip muted", "data-testid": "run-chip" }, "Not saved · stopped here")
      : el("span", { class: "chip warn", "data-testid": "run-chip" }, "Not saved by the server · only on your screen");
  return el(
    "div",
    { class: `msg role-assistant provisional${streaming ? "" : canSave(streamed.held) ? " discarded" : " unsaved"}`, "data-testid": "streaming", "aria-busy": String(streaming) },
    chip,
    v.body.of(streamed, streaming),
  );
}

// runBox is an active run that shows no text: starting, working, waiting
// for a confirmation, or calling a tool (with its progress, and after a
// cancel what the run waits for: a call that cannot be recalled is not
// hidden).
function runBox(s: ThreadState, v: LiveView): HTMLElement {
  const run = s.run!;
  const calling = [...s.operations.values()].find((op) => op.run_id === run.id && (op.phase === "running" || op.phase === "committing"));
  const cancelling = cancelAccepted(s);
  const showCall = calling !== undefined && (cancelling || run.status === "running");
  const label = cancelling
    ? "Cancelling…"
    : run.status === "queued"
      ? "Starting…"
      : run.status === "waiting_confirmation"
        ? "Waiting for your confirmation"
        : calling
          ? callingLabel(calling)
          : "Working…";
  const box = el("div", { class: "msg role-assistant provisional", "data-testid": "streaming", "aria-busy": "true" }, el("span", { class: "chip live", "data-testid": "run-chip" }, label));
  if (showCall && calling) box.append(toolProgress(calling, label));
  if (cancelling && calling) box.append(el("p", { class: "hint", "data-testid": "cancel-waits" }, cancelWaitsFor(calling)));
  v.tick(showCall);
  return box;
}

// waitsForDecision says, when the active run waits for the user's decision
// on a call, that a message queued meanwhile does not answer it, and where
// the decision is made ("" when the run waits for nothing of the user's).
export function waitsForDecision(s: ThreadState): string {
  if (!s.run || s.run.status !== "waiting_confirmation") return "";
  const op = [...s.operations.values()].find((o) => o.phase === "prepared" && o.run_id === s.run?.id);
  const what = op?.tool === "send_email" ? "the email" : op ? `the ${op.tool} call` : "a tool call";
  const yes = op?.tool === "send_email" ? "Confirm and send" : "Confirm and run";
  return `Your message is queued: it does not answer the question above. The reply waits for your decision on ${what}: ${yes}, or Reject, on the card above.`;
}

// confirmCard asks the user to confirm or reject a prepared call, showing
// exactly what it will send.
function confirmCard(op: Operation): HTMLElement {
  const p = (op.preview ?? {}) as Record<string, unknown>;
  const rows: Node[] = [];
  for (const [k, v] of Object.entries(p)) {
    // Structured values (an MCP call's arguments) are shown as indented
    // JSON, so a user can read what exactly will be sent.
    const shown = typeof v === "string" ? v : v !== null && typeof v === "object" ? el("pre", { class: "preview-json" }, JSON.stringify(v, null, 2)) : JSON.stringify(v);
    rows.push(el("dt", {}, k), el("dd", { "data-testid": `preview-${k}` }, shown));
  }
  const confirm = button(op.tool === "send_email" ? "Confirm and send" : "Confirm and run", "confirm-op", "confirm-op", "btn primary");
  const reject = button("Reject", "reject-op", "reject-op");
  confirm.dataset.operationId = op.operation_id;
  reject.dataset.operationId = op.operation_id;
  return el(
    "div",
    { class: "card-box confirm", "data-testid": "confirm-card", "data-operation-id": op.operation_id, role: "group", "aria-label": `Confirm ${op.tool}` },
    el("h2", {}, `${op.tool}: waiting for your confirmation`),
    el("p", { class: "hint" }, "Nothing has been sent. It happens only if you confirm, once."),
    el("dl", {}, ...rows),
    el("div", { class: "actions" }, confirm, reject),
  );
}

// StreamedBody is the streamed message's body, kept across renders (it
// renders at most once per frame while streaming; at once when the
// stream has stopped, so a save takes what is on screen). Owned by the
// conversation's view; not safe to share between views.
export class StreamedBody {
  private kept: { messageID: string; view: LiveMarkdown } | null = null;

  of(s: Streamed, streaming: boolean): HTMLElement {
    if (cardStart.test(s.text)) {
      // A card is one JSON document, readable only once whole (then it is
      // shown as what it is, an order and its items): while it streams,
      // say what is coming and how far it got instead of raw JSON.
      const n = [...s.text].length;
      return el(
        "div",
        { class: "body card-pending", "data-testid": "streaming-text", "data-card": "pending" },
        el("span", { class: "card-pending-what" }, streaming ? "Preparing a card…" : "An unfinished card:"),
        " ",
        el("span", { class: "hint" }, streaming ? `${n} characters so far` : `${n} characters, never complete, so not shown`),
      );
    }
    if (!this.kept || this.kept.messageID !== s.messageID) {
      this.kept = { messageID: s.messageID, view: new LiveMarkdown({ class: "body md", "data-testid": "streaming-text" }) };
    }
    const v = this.kept.view;
    v.set(s.text);
    if (!streaming) v.flush();
    return v.el;
  }
}
