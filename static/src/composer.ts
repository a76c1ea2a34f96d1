// The composer: the box a request is typed in, Send, and what it keeps.
// What is typed is kept with the conversation in this browser (drafts.ts),
// so a reload, a sign-out elsewhere or a fork does not lose it.

import { $ } from "./dom";
import { loadDraft, saveDraft } from "./drafts";

// Composer is the composer of one conversation. Owned by the
// conversation's view, which decides what a submit does (onSubmit: the
// form's submit, or Enter without Shift outside an IME composition).
export class Composer {
  // editing: the user is editing their last request, to be sent as a new
  // branch from resumeFrom, the checkpoint before it.
  editing: { resumeFrom: string } | null = null;
  private readonly form: HTMLFormElement;
  private readonly input: HTMLTextAreaElement;
  private readonly send: HTMLButtonElement;

  constructor(
    root: HTMLElement,
    private readonly threadID: string,
  ) {
    this.form = $(root, "[data-testid=composer]");
    this.input = $(root, "[data-testid=composer-input]");
    this.send = $(root, "[data-testid=send]");
  }

  // start restores the draft and listens for typing and sending.
  start(onSubmit: () => void): void {
    this.form.addEventListener("submit", (e) => {
      e.preventDefault();
      onSubmit();
    });
    if (!this.input.value) this.input.value = loadDraft(this.threadID);
    // (Not while editing a request: restored later, it would be sent as a
    // new message, not as the edit.)
    this.input.addEventListener("input", () => {
      if (!this.editing) saveDraft(this.threadID, this.input.value);
    });
    this.input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        onSubmit();
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

  // sent empties the box and its draft once the server accepted it.
  sent(): void {
    this.input.value = "";
    saveDraft(this.threadID, "");
    this.editing = null;
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

  // show hides Send while a run is active, and disables it while nothing
  // can be sent (not connected, or the conversation is gone).
  show(busy: boolean, canSend: boolean): void {
    this.send.hidden = busy;
    this.send.disabled = !canSend;
    this.input.placeholder = this.editing ? "Edit your request; sending starts a new branch from before it" : "Ask something…";
  }
}
