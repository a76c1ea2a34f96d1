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

// receiptCard is the receipt of r, the run the state's receipt is about.
export function receiptCard(s: ThreadState, r: Receipt, v: ReceiptView): HTMLElement {
  const excerpt = (m: Message): string => `“${snippet(plain(m), 140)}”`;
  const kept =
    r.kept === null
      ? "nothing: the conversation was empty"
      : r.kept.role === "user"
        ? `everything up to your request ${excerpt(r.kept)}`
        : `everything up to the reply ${excerpt(r.kept)}`;
  const ops =
    r.operations.length === 0
      ? [el("li", {}, "No side effects: no tool had started.")]
      : r.operations.map((o) => {
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
  const actions = el("div", { class: "actions" }, button("Continue from the saved point", "continue", "action-continue", "btn primary"));
  if (s.messages.some((m) => m.role === "user")) actions.append(button("Edit the request and continue", "edit", "action-edit"));
  actions.append(button("Start a new branch", "fork", "action-fork"));
  // (An unfinished card was never shown as text: there is no visible
  // fragment to save.)
  const shown = s.streamed && s.streamed.runID === r.runID && s.streamed.text && !s.streamed.saved && !cardStart.test(s.streamed.text) ? s.streamed : null;
  if (shown && canSave(shown.held)) {
    const save = button("Save visible fragment", "save-fragment", "action-save-fragment");
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
    actions.append(copy);
  }
  // Who cancelled, when this tab saw the cancel recorded (a reload does
  // not know, and then says nothing about it).
  const mine = r.by === `tab:${v.tabID}` || r.by === `api:${v.tabID}`;
  const where = !r.by || mine ? "" : r.by.startsWith("tab:") ? " from another tab" : " elsewhere (another tab or client)";
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
  return el(
    "div",
    { class: `card-box receipt${neverStarted ? " never-started" : ""}`, "data-testid": "receipt", role: "status" },
    el("h3", { "data-testid": "receipt-heading" }, heading),
    ...(neverStarted ? [el("p", { class: "receipt-lead", "data-testid": "receipt-never-started" }, neverStartedLine)] : []),
    el("dl", {}, ...rows),
    actions,
  );
}
