// The conversation's history as the page draws it: each message with who
// said it, its body (a reply as Markdown, a card, a tool step), its time,
// its versions (‹ n/m ›) and its actions.

import { cardText, renderCard } from "./card";
import { copyButton, markdownText, renderMarkdown } from "./markdown";
import { button, el } from "./dom";
import { clipUTF8, clippedNote, cutNote, displayBytes } from "./history";
import { lineParts, opView, toolResult, toolText } from "./toolview";
import { stepLine } from "./outcome";
import type { Message, Operation } from "./protocol";
import type { Branch } from "./versions";
import { timeElement } from "./when";

// MessageView is what drawing a message needs besides the message: which
// saved fragment's deletion is being asked about, and which long replies
// the user chose to see whole. Whether a run is active is not drawn into
// an item (every item would be drawn again at each reply's start and
// end): showBusy sets it on the items in place.
export interface MessageView {
  deleting: string | null;
  expanded: ReadonlySet<string>;
  // editor: the editor of a request being edited in place ([] for the
  // others).
  editor(m: Message): HTMLElement[];
}

// speaker names who a message is from, for screen readers.
export function speaker(role: string): string {
  return role === "user" ? "You said:" : role === "tool" ? "Tool result:" : "Assistant said:";
}

// messageItem is one message of the list.
export function messageItem(m: Message, branch: Branch | undefined, v: MessageView): HTMLLIElement {
  const li = el("li", {
    class: `msg role-${m.role} kind-${m.kind}`,
    "data-testid": "message",
    "data-message-id": m.message_id,
    "data-role": m.role,
    "data-kind": m.kind,
  });
  li.append(el("span", { class: "visually-hidden", "data-testid": "speaker" }, speaker(m.role)));
  if (m.kind === "fragment") li.append(el("div", { class: "label", "data-testid": "fragment-label" }, "Saved fragment"));
  if (m.role === "tool") {
    const { node, operationID } = toolResult(m.content);
    li.append(node);
    if (operationID) {
      li.dataset.operationId = operationID;
      li.append(el("p", { class: "tool-status", "data-testid": "tool-status", "data-operation-id": operationID, role: "status", hidden: "" }));
    }
  } else if (m.kind === "card") {
    li.append(renderCard(m.content));
  } else if (m.role === "assistant") {
    // Replies and fragments are Markdown; the user's own text is shown
    // as typed.
    li.append(...replyBody(m, v.expanded.has(m.message_id)));
  } else {
    const editor = v.editor(m);
    if (editor.length) li.classList.add("editing");
    li.append(...(editor.length ? editor : [el("div", { class: "body", "data-testid": "message-body" }, m.content)]));
  }
  const meta = el(
    "span",
    { class: "meta", "data-testid": "message-meta" },
    timeElement(m.created_at),
    ...(m.model ? [` · ${m.model}`] : []),
  );
  const nav = branch ? [branchNav(branch)] : [];
  // (Where the new version starts is found when it is asked for: the
  // checkpoints are read after the first paint. branching.ts)
  const edit = m.role === "user" && !li.classList.contains("editing") ? [newVersion("Edit", "edit-message", m)] : [];
  const again = m.role === "assistant" && m.kind !== "fragment" ? [newVersion("Regenerate", "regenerate", m)] : [];
  if (m.role !== "assistant" || m.kind === "card") li.append(el("div", { class: "msg-meta" }, ...nav, ...edit, ...again, meta));
  if (m.role === "assistant" && m.kind !== "card") {
    const actions = el("div", { class: "msg-actions" }, ...nav, meta, copyButton("Copy", () => m.content), ...again);
    if (m.kind === "fragment" && v.deleting === m.message_id) {
      const yes = button("Delete for good", "delete-draft-confirm", "delete-draft-confirm", "btn danger small");
      yes.dataset.messageId = m.message_id;
      actions.append(el("span", { class: "hint", role: "status" }, "Delete this saved fragment? It cannot be undone."), yes, button("Keep it", "delete-draft-keep", "delete-draft-keep", "btn ghost small"));
    } else if (m.kind === "fragment") {
      const del = button("Delete fragment", "delete-draft", "delete-draft", "btn ghost small");
      del.dataset.messageId = m.message_id;
      actions.append(del);
    }
    li.append(actions);
  }
  return li;
}

// newVersion is Edit on a request or Regenerate on a reply (disabled
// while a run is active: the server allows one at a time; showBusy).
function newVersion(label: string, action: string, m: Message): HTMLButtonElement {
  const b = button(label, action, action === "regenerate" ? "regenerate" : "edit-message", "btn ghost small");
  b.dataset.messageId = m.message_id;
  b.setAttribute("aria-label", action === "regenerate" ? "Regenerate this reply" : "Edit this message");
  b.dataset.busyTitle = "Wait for the reply to finish, or cancel it, to make a new version";
  return b;
}

// showBusy disables, in the items under root, the buttons a run in
// progress forbids (Edit, Regenerate, the version arrows), with a title
// saying why, or enables them again. Cheap: no item is drawn again.
export function showBusy(root: ParentNode, busy: boolean): void {
  for (const b of root.querySelectorAll<HTMLButtonElement>("button[data-busy-title]")) {
    if (b.disabled === busy) continue;
    b.disabled = busy;
    if (busy) b.title = b.dataset.busyTitle!;
    else b.removeAttribute("title");
  }
}

// branchNav is "‹ 2/3 ›" on a message that has other versions (an arrow
// with no version that way stays disabled; showBusy disables the others
// while a run is active).
function branchNav(b: Branch): HTMLElement {
  const prev = button("‹", "checkout", "branch-prev", "btn ghost small");
  const next = button("›", "checkout", "branch-next", "btn ghost small");
  prev.setAttribute("aria-label", "Previous version");
  next.setAttribute("aria-label", "Next version");
  for (const [btn, target] of [[prev, b.prev], [next, b.next]] as const) {
    if (target) {
      btn.dataset.checkpointId = target;
      btn.dataset.busyTitle = "Wait for the reply to finish, or cancel it, to switch versions";
    } else btn.disabled = true;
  }
  return el(
    "span",
    { class: "branch-nav", "data-testid": "branch-nav", role: "group", "aria-label": `Version ${b.index} of ${b.count}` },
    prev,
    el("span", { class: "branch-pos", "data-testid": "branch-pos", "aria-hidden": "true" }, `${b.index}/${b.count}`),
    next,
  );
}

// replyBody is an assistant's reply as Markdown: of a long one only its
// start (unless whole), and a note when it was cut at the size limit.
function replyBody(m: Message, whole: boolean): HTMLElement[] {
  const { text, clipped } = whole ? { text: m.content, clipped: false } : clipUTF8(m.content, displayBytes);
  const body = el("div", { class: "body md", "data-testid": "message-body" });
  body.append(renderMarkdown(text));
  if (clipped) body.dataset.clipped = "true";
  return [body, ...(clipped ? [clippedNote(m)] : []), ...(m.truncated === "size_limit" ? [cutNote(m)] : [])];
}

// showToolSteps says under each consequential call's result in list what
// became of it now: the recorded result is what was known when it was
// recorded (an unknown outcome may since have been confirmed, or given up
// on). It changes only the lines whose state changed, and looks at none
// when neither the operations (a new map whenever one changes, state.ts)
// nor the list (drawn, its key) changed since it last looked: it runs at
// every render, every frame while a reply streams.
const stepsShown = new WeakMap<HTMLElement, { operations: ReadonlyMap<string, Operation>; drawn: string }>();
export function showToolSteps(list: HTMLElement, operations: ReadonlyMap<string, Operation>, drawn: string): void {
  const last = stepsShown.get(list);
  if (last && last.operations === operations && last.drawn === drawn) return;
  stepsShown.set(list, { operations, drawn });
  for (const p of list.querySelectorAll<HTMLElement>("[data-testid=tool-status]")) {
    const op = operations.get(p.dataset.operationId ?? "");
    const line = op && op.contract === "consequential" ? stepLine(opView(op)) : null;
    const want = line ? `${line.state}:${op?.idempotency_key ?? ""}:${JSON.stringify(op?.preview ?? null)}` : "";
    if (p.dataset.shown === want) continue;
    p.dataset.shown = want;
    p.dataset.state = line?.state ?? "";
    p.hidden = line === null;
    p.replaceChildren(...(line ? lineParts(line) : []));
  }
}

// plainText remembers each message as a reader sees it, as text (they do
// not change): owned by the page's one conversation view.
const plainText = new Map<string, string>();

// plain is a message as a reader sees it, as text: a reply without its
// Markdown, a card and a tool step in words.
export function plain(m: Message): string {
  let t = plainText.get(m.message_id);
  if (t === undefined) {
    t = m.role === "tool" ? toolText(m.content) : m.kind === "card" ? cardText(m.content) : m.role === "assistant" ? markdownText(m.content) : m.content;
    plainText.set(m.message_id, t);
  }
  return t;
}
