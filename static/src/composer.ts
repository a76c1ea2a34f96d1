// The composer: the box a request is typed in, Send, and what it keeps.
// What is typed is kept with the conversation in this browser (drafts.ts),
// so a reload, a sign-out elsewhere or a fork does not lose it. While a
// reply streams, Send (and Enter) queues the message for after it, and
// "Send now" (Ctrl+Enter, ⌘+Enter on a Mac) sends it at once, stopping
// the reply; the hint under the box says which key does what.

import { $, el } from "./dom";
import { loadDraft, saveDraft } from "./drafts";
import { takeFirst } from "./start";

// How a submit was asked for: Send or Enter ("send"), or Send now or
// Ctrl+Enter ("now").
export type SubmitKind = "send" | "now";

const mac = /Mac|iPhone|iPad/.test(navigator.platform);
const nowKey = mac ? "⌘+Enter" : "Ctrl+Enter";

// Composer is the composer of one conversation. Owned by the
// conversation's view, which decides what a submit does (onSubmit: the
// form's submit, Enter without Shift outside an IME composition, Send now
// or its key).
export class Composer {
  // editing: the user is editing their last request, to be sent as a new
  // branch from resumeFrom, the checkpoint before it.
  editing: { resumeFrom: string } | null = null;
  private readonly form: HTMLFormElement;
  private readonly input: HTMLTextAreaElement;
  private readonly send: HTMLButtonElement;
  private readonly now: HTMLButtonElement;
  private readonly hint: HTMLElement;
  private readonly idleHint: string;
  private first = false; // the home page's first message is in the box, to send

  constructor(
    root: HTMLElement,
    private readonly threadID: string,
  ) {
    this.form = $(root, "[data-testid=composer]");
    this.input = $(root, "[data-testid=composer-input]");
    this.send = $(root, "[data-testid=send]");
    this.hint = $(root, "[data-testid=composer-hint]");
    this.idleHint = this.hint.textContent ?? "";
    this.now = el(
      "button",
      { type: "button", class: "btn send-now", "data-testid": "send-now", title: "Send now: stop the reply and send this", "aria-label": "Send now: stop the reply and send this", hidden: "" },
      "Send now",
    );
    this.send.after(this.now);
  }

  // start restores the draft and listens for typing and sending.
  start(onSubmit: (kind: SubmitKind) => void): void {
    this.form.addEventListener("submit", (e) => {
      e.preventDefault();
      onSubmit("send");
    });
    this.now.addEventListener("click", () => onSubmit("now"));
    if (!this.input.value) this.input.value = loadDraft(this.threadID);
    // The first message typed on the home page (start.ts), sent once live.
    const first = takeFirst(this.threadID);
    if (first && !this.input.value.trim()) this.restore(first);
    this.first = first !== "";
    // (Not while editing a request: restored later, it would be sent as a
    // new message, not as the edit.)
    this.input.addEventListener("input", () => {
      if (!this.editing) saveDraft(this.threadID, this.input.value);
    });
    this.input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        onSubmit(e.ctrlKey || e.metaKey ? "now" : "send");
      }
    });
  }

  // text is what is typed, as typed.
  get text(): string {
    return this.input.value;
  }

  focus(): void {
    this.input.focus();
  }

  // focusOnOpen puts the focus in the box as the conversation opens, the
  // view left at the latest message; not when the user put the focus
  // elsewhere before the script ran, nor, on a touch screen, in a
  // conversation with messages (its keyboard would cover them).
  focusOnOpen(empty: boolean): void {
    const at = document.activeElement;
    if ((at && at !== document.body) || (!empty && matchMedia("(pointer: coarse)").matches)) return;
    this.input.focus({ preventScroll: true });
  }

  // sendFirst reports, once, that the box holds the home page's first
  // message, to be sent now that the page is live.
  sendFirst(): boolean {
    const first = this.first;
    this.first = false;
    return first;
  }

  // sent empties the box and its draft once the server accepted it (or
  // the queue keeps it).
  sent(): void {
    this.input.value = "";
    saveDraft(this.threadID, "");
    this.editing = null;
  }

  // restore puts back text the server refused to queue, before what was
  // typed since.
  restore(text: string): void {
    const now = this.input.value.trim();
    this.input.value = now ? `${text}\n\n${this.input.value}` : text;
    if (!this.editing) saveDraft(this.threadID, this.input.value);
  }

  // edit puts request in the box, to be sent from resumeFrom.
  edit(request: string, resumeFrom: string): void {
    this.editing = { resumeFrom };
    this.input.value = request;
    this.input.focus();
  }

  stopEditing(): void {
    this.editing = null;
    this.input.value = "";
  }

  // show sets the buttons for a conversation with a run active (busy:
  // Send queues, Send now interrupts) or not, and disables what cannot be
  // sent: queueing works offline too (kept until the connection is
  // back), a new request needs the connection (canSend), and nothing can
  // be sent once the conversation is gone.
  show(busy: boolean, canSend: boolean, gone: boolean): void {
    const queues = busy && !this.editing;
    this.send.hidden = false;
    this.send.disabled = gone || !(canSend || queues);
    if (queues) this.send.title = "Queue this: it is sent when the reply finishes";
    else this.send.removeAttribute("title");
    this.now.hidden = !queues;
    this.now.disabled = gone;
    this.input.placeholder = this.editing
      ? "Edit your request; sending starts a new branch from before it"
      : queues
        ? "Write your next message: it is sent when the reply finishes"
        : "Ask something…";
    const hint = queues ? `Enter queues it for after the reply · ${nowKey} sends it now, stopping the reply · Esc stops the reply` : this.idleHint;
    if (this.hint.textContent !== hint) this.hint.textContent = hint;
  }
}
