// The question before a conversation is deleted, under Delete in the
// header: "Delete for good" or "Keep", and the state of a delete sent.

import { $ } from "./dom";

// DeletePanel is that question. Owned by the conversation's view; at
// most one delete is under way.
export class DeletePanel {
  private readonly panel: HTMLElement;
  private readonly toggle: HTMLElement;
  private readonly confirm: HTMLButtonElement;
  private sent = false;

  constructor(root: HTMLElement) {
    this.panel = $(root, "[data-testid=delete-confirm]");
    this.toggle = $(root, "[data-testid=delete-thread]");
    this.confirm = $<HTMLButtonElement>(this.panel, "[data-testid=delete-thread-confirm]");
    this.panel.addEventListener("keydown", (e) => {
      if (e.key === "Escape") {
        e.stopPropagation(); // closes the question; it cancels no reply
        this.ask(false);
      }
    });
  }

  // ask opens (or closes) the question, with the focus on the answer that
  // keeps the conversation (in the header, which stays at the top of the
  // window), or back on Delete.
  ask(open: boolean): void {
    this.panel.hidden = !open;
    this.toggle.setAttribute("aria-expanded", String(open));
    if (open) $(this.panel, "[data-testid=delete-thread-keep]").focus();
    else this.toggle.focus();
  }

  // send marks the delete as sent (stopping: a reply is stopped first,
  // which can take a moment); false when one is under way already.
  send(stopping: boolean): boolean {
    if (this.sent) return false;
    this.sent = true;
    this.confirm.disabled = true;
    this.confirm.textContent = stopping ? "Stopping the reply, then deleting…" : "Deleting…";
    return true;
  }

  // refused: the delete was not done; close also closes the question
  // (the page says why elsewhere).
  refused(close: boolean): void {
    this.sent = false;
    this.confirm.disabled = false;
    this.confirm.textContent = "Delete conversation";
    if (!close) return;
    this.panel.hidden = true;
    this.toggle.setAttribute("aria-expanded", "false");
  }
}
