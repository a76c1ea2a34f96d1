// The receipt of a cancelled run: what stayed in the conversation, what
// was discarded (and whether the part the user saw can be saved), what
// each side effect became, and what the user can do next. Everything in
// it is what the server recorded; the page adds only who cancelled, when
// it saw that.

import { button, el, snippet } from "./dom";
import { cardStart } from "./card";
import { copyButton } from "./markdown";
import { neverStartedLine } from "./admission";
import { canSave, notHeld } from "./seen";
import { receiptLine, toolName, type OpNow } from "./outcome";
import { lineParts, opView } from "./toolview";
import { plain } from "./messages";
import type { Message, OperationOutcome } from "./protocol";
import type { Receipt, ThreadState } from "./state";

// ReceiptView is what drawing a receipt needs besides the state: this
// tab's id (a cancel it sent is not "from another tab"), whether the
// conversation is gone, and a way to ask the server once whether a run
// ever ran (the answer lands in the state's executed map).
export interface ReceiptView {
  tabID: string;
  gone: boolean;
  askExecuted(runID: string): void;
}

// opNow is an operation of a receipt as the tab knows it now.
function opNow(s: ThreadState, o: OperationOutcome): OpNow {
  const op = s.operations.get(o.operation_id);
  return op ? opView(op, o.outcome) : o;
}

// keptLine says what of the conversation a cancel kept.
function keptLine(r: Receipt): string {
  const excerpt = (m: Message): string => `“${snippet(plain(m), 140)}”`;
  return r.kept === null
    ? "nothing: the conversation was empty"
    : r.kept.role === "user"
      ? `everything up to your request ${excerpt(r.kept)}`
      : `everything up to the reply ${excerpt(r.kept)}`;
}

// opItems are what became of each of r's side effects, as the tab knows
// them now.
function opItems(s: ThreadState, r: Receipt): HTMLElement[] {
  if (r.operations.length === 0) return [el("li", {}, "No side effects: no tool had started.")];
  return r.operations.map((o) => {
    const now = opNow(s, o);
    const line = receiptLine(now);
    return el(
      "li",
      { "data-testid": "receipt-operation", "data-operation-id": o.operation_id, "data-outcome": now.outcome, "data-state": line.state },
      el("strong", { class: "op-tool" }, toolName(o.tool)),
      ": ",
      ...lineParts(line),
    );
  });
}

// whoCancelled is how a receipt names who cancelled: "" for this tab (or
// when this tab did not see it recorded).
function whoCancelled(r: Receipt, tabID: string): string {
  if (!r.by || r.by === `tab:${tabID}` || r.by === `api:${tabID}`) return "";
  return r.by.startsWith("tab:") ? " from another tab" : " elsewhere (another tab or client)";
}

// interruptionItem is the receipt of a run an interrupt item stopped, in
// the history after the message it followed (thread.ts): what it kept, what
// it discarded, what became of its side effects. The queued message that
// stopped it follows it, and its reply streams under that.
export function interruptionItem(s: ThreadState, r: Receipt, tabID: string): HTMLLIElement {
  const where = whoCancelled(r, tabID);
  const rows: Node[] = [el("dt", {}, "Kept"), el("dd", { "data-testid": "receipt-kept" }, keptLine(r))];
  if (r.discarded > 0) rows.push(el("dt", {}, "Discarded"), el("dd", { "data-testid": "receipt-discarded" }, `${r.discarded} characters of unpublished text`));
  rows.push(el("dt", {}, "Side effects"), el("dd", {}, el("ul", {}, ...opItems(s, r))));
  return el(
    "li",
    { class: "card-box receipt interruption", "data-testid": "interrupt-receipt", "data-run-id": r.runID },
    el("p", { class: "receipt-title", "data-testid": "receipt-heading" }, where ? `Stopped${where} to send a new message` : "Stopped to send your message"),
    el("dl", {}, ...rows),
  );
}

// receiptCard is the receipt of r, the run the state's receipt is about.
export function receiptCard(s: ThreadState, r: Receipt, v: ReceiptView): HTMLElement {
  const kept = keptLine(r);
  const ops = opItems(s, r);
  // The text the user saw comes first: it is what they were reading, and
  // the only thing here that is lost if nothing is done (Continue writes
  // the step again; it does not append to it).
  const actions = el("div", { class: "actions" });
  // (An unfinished card was never shown as text: there is no visible
  // fragment to save.)
  const shown = s.streamed && s.streamed.runID === r.runID && s.streamed.text && !s.streamed.saved && !cardStart.test(s.streamed.text) ? s.streamed : null;
  if (shown && canSave(shown.held)) {
    const save = button("Save visible fragment", "save-fragment", "action-save-fragment", "btn primary");
    // (Enabled once the server said it holds the text as shown.)
    if (shown.held?.state === "checking") {
      save.disabled = true;
      save.setAttribute("aria-busy", "true");
    }
    actions.append(save);
  } else if (shown) {
    // The server does not hold it: the screen is the only copy.
    const copy = copyButton("Copy the text on screen", () => shown.text);
    copy.dataset.testid = "action-copy-unsaved";
    copy.classList.remove("ghost", "small");
    copy.classList.add("primary");
    actions.append(copy);
  }
  actions.append(button("Continue from the saved point", "continue", "action-continue", shown ? "btn" : "btn primary"));
  if (s.messages.some((m) => m.role === "user")) actions.append(button("Edit the request and continue", "edit", "action-edit"));
  actions.append(button("Start a new branch", "fork", "action-fork"));
  // Who cancelled, when this tab saw the cancel recorded (a reload does
  // not know, and then says nothing about it).
  const where = whoCancelled(r, v.tabID);
  // A run cancelled before it ever ran: nothing streamed, discarded or
  // called, and the server says no worker ever took it up (in the
  // run.cancelled event, or, after a reload, asked once; until it
  // answers, the ordinary receipt).
  // A cancel that deletes the conversation: nothing can continue here (and
  // the server is not asked about it: it may no longer know it).
  const closing = s.closing || v.gone;
  const quiet = r.discarded === 0 && r.operations.length === 0 && s.streamed?.runID !== r.runID;
  if (quiet && !closing && !s.executed.has(r.runID)) v.askExecuted(r.runID);
  const neverStarted = quiet && s.executed.get(r.runID) === false;
  const heading = closing ? `Stopped${where}: the conversation is being deleted` : neverStarted ? `Cancelled${where} while waiting for a free slot` : `Cancelled${where}`;
  if (closing) actions.replaceChildren();
  const saved = s.messages.find((m) => m.kind === "fragment" && m.fragment_of?.run_id === r.runID);
  const rows: Node[] = [el("dt", {}, "Kept"), el("dd", { "data-testid": "receipt-kept" }, kept)];
  const lost = shown ? notHeld(shown.held, [...shown.text].length) : "";
  if (r.discarded > 0 || saved || lost) {
    const what = r.discarded > 0 ? `${r.discarded} characters of unpublished text${lost ? " that the server kept" : ""}` : "the unpublished text";
    const more = saved
      ? `; the part you saw (${[...saved.content].length} characters) is kept in the conversation as a saved fragment`
      : lost
        ? `. ${lost}: copy it from your screen if you need it (this page holds the only copy)`
        : "";
    rows.push(el("dt", {}, "Discarded"), el("dd", { "data-testid": "receipt-discarded" }, what + more));
  }
  if (!neverStarted) rows.push(el("dt", {}, "Side effects"), el("dd", {}, el("ul", {}, ...ops)));
  // What waits in the queue (paused: queue.ts shows it under the receipt).
  // (Said while they still wait: sent or cleared since, they are not.)
  if (r.queued && !r.interrupted && !closing && s.queue.items.length > 0) {
    const n = r.queued === 1 ? "1 queued message waits" : `${r.queued} queued messages wait`;
    rows.push(el("dt", {}, "Queued"), el("dd", { "data-testid": "receipt-queued" }, `${n}, paused: none is sent until you choose.`));
  }
  return el(
    "div",
    { class: `card-box receipt${neverStarted ? " never-started" : ""}`, "data-testid": "receipt", role: "status" },
    el("h2", { "data-testid": "receipt-heading" }, heading),
    ...(neverStarted ? [el("p", { class: "receipt-lead", "data-testid": "receipt-never-started" }, neverStartedLine)] : []),
    el("dl", {}, ...rows),
    actions,
    ...(closing ? [] : [el("p", { class: "hint continue-means", "data-testid": "continue-explained" }, continueMeans)]),
  );
}

// continueMeans says what Continue does, which is not what other products'
// Continue does: it writes the unfinished step again, whole.
export const continueMeans = "Continue writes the unfinished reply again from the saved point: it starts over rather than adding to the text above.";

// placeInterruptions puts the receipt of each run an interrupt stopped
// after the message it followed (items are the history's, in order).
export function placeInterruptions(items: HTMLLIElement[], s: ThreadState, tabID: string): HTMLLIElement[] {
  if (s.interruptions.length === 0) return items;
  const out: HTMLLIElement[] = [];
  for (const li of items) {
    out.push(li);
    for (const r of s.interruptions) if (r.anchor === li.dataset.messageId) out.push(interruptionItem(s, r, tabID));
  }
  return out;
}
