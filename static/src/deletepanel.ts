// The question before a conversation is deleted, under Delete in the
// header: "Delete for good" or "Keep", the state of a delete sent, and,
// once done, the note on the list the tab goes to ("Deleted “title”.").

import { $, el } from "./dom";

// deletedKey holds, in this tab's sessionStorage, the title of the
// conversation it just deleted, for the list to acknowledge.
const deletedKey = "gateway.deleted";

// noteFor is how long the note stays when nothing holds it (ms).
const noteFor = 10000;

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

  // leave goes to the list once the server deleted the conversation
  // titled title; the list says so (showDeleted).
  leave(title: string): void {
    try {
      sessionStorage.setItem(deletedKey, title);
    } catch {
      // No storage: the list just does not say it.
    }
    location.assign("/");
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

// showDeleted says, in the list's status line (polite: read out when the
// reader is free, the focus left where it is), which conversation this
// tab just deleted. It goes by itself after noteFor, unless the pointer
// or the focus is on it (then once they leave), or at once on Dismiss
// (beside the line, not read out with it), which hands the focus to the
// search box above it.
export function showDeleted(status: HTMLElement): void {
  let title: string | null = null;
  try {
    title = sessionStorage.getItem(deletedKey);
    sessionStorage.removeItem(deletedKey);
  } catch {
    return;
  }
  const note = status.parentElement;
  if (title === null || !note) return;
  const dismiss = el("button", { type: "button", class: "btn ghost small", "data-testid": "list-status-dismiss", "aria-label": "Dismiss the note" }, "Dismiss");
  const held = (): boolean => note.matches(":hover") || note.contains(document.activeElement);
  let due = false;
  const clear = (focus: boolean): void => {
    if (focus) document.querySelector<HTMLElement>("[data-testid=thread-search-input]")?.focus();
    status.replaceChildren();
    dismiss.remove();
    note.classList.remove("shown");
    due = false;
  };
  dismiss.addEventListener("click", () => clear(true));
  for (const ev of ["pointerleave", "focusout"]) {
    note.addEventListener(ev, () => {
      if (due) window.setTimeout(() => due && !held() && clear(false), 0);
    });
  }
  // (In the next frame: a live region announces what changes in it, not
  // what it held when the page came.)
  window.requestAnimationFrame(() => {
    note.classList.add("shown");
    status.textContent = `Deleted “${title}”.`;
    note.append(dismiss);
    window.setTimeout(() => {
      due = true;
      if (!held()) clear(false);
    }, noteFor);
  });
}
