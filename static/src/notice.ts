// The notes beside the composer and above the conversation: the notice
// (why something did not happen, and what to do), the line that says a
// cancel the user pressed has not reached the server, and the conflict
// banner (this tab is behind: Reload, or Fork from what it showed).

import { $, button, el } from "./dom";

export type Tone = "error" | "info";

// goneText says that the conversation was deleted elsewhere, and what
// became of the typed text.
export const goneText =
  "This conversation was deleted (in another tab or by a program), so nothing more can be sent here. What you typed stays in the box: copy it, or start a new conversation with it.";

// Notice is the notice next to the composer. Owned by the conversation's
// view. offline marks a notice the lost connection caused (cleared once it
// is back); busy one that says why Enter did not send while a reply runs.
export class Notice {
  offline = false;
  busy = false;

  constructor(private readonly box: HTMLElement) {}

  get tone(): string {
    return this.box.dataset.tone ?? "";
  }

  // show puts text in the notice ("" hides it). tone info is an outcome
  // to know, error something that went wrong.
  show(text: string, { tone = "error", offline = false }: { tone?: Tone; offline?: boolean } = {}): void {
    // A sentence, also when it is an error's message ("not connected: …").
    this.box.textContent = text.charAt(0).toUpperCase() + text.slice(1);
    this.box.dataset.tone = tone;
    this.box.hidden = text === "";
    this.offline = offline && text !== "";
  }

  // clearOffline hides a notice the lost connection caused.
  clearOffline(): void {
    if (this.offline) this.show("");
  }

  // offerNewConversation adds, once, the ways out of a conversation that
  // was deleted elsewhere: a new one with the typed text, or the list.
  offerNewConversation(): void {
    if (this.box.querySelector("[data-action=start-with-text]")) return;
    const start = button("New conversation with my text", "start-with-text", "start-with-text");
    const home = el("a", { class: "btn", href: "/", "data-testid": "go-home" }, "Back to the list");
    this.box.append(el("div", { class: "actions" }, start, home));
  }
}

// showCancelPending says in box that a cancel the user pressed has not
// reached the server yet: kept is how many of this conversation's cancels
// wait for an answer, retrying whether one of them waits to be sent again
// while the socket is live. While live, an attempt in flight shows on the
// button ("Cancelling…") only. It changes the box only when the words do.
export function showCancelPending(box: HTMLElement, kept: number, live: boolean, retrying: boolean): void {
  let text = "";
  let hint = "";
  if (kept > 0 && !live) {
    text = "Cancel will be sent when the connection is back.";
    hint = "Keep this tab open; reloading it is fine. If the reply finishes first, the page says so.";
  } else if (retrying) {
    text = "Your cancel is not recorded yet.";
    hint = "It is sent again by itself; keep this tab open.";
  }
  const want = text + hint;
  if (box.dataset.text === want) return;
  box.dataset.text = want;
  box.hidden = text === "";
  box.replaceChildren(el("strong", {}, text), " ", el("span", { class: "hint" }, hint));
}

// ConflictBanner is the banner of a state-version conflict: this tab acted
// on a conversation that changed since it last saw it. from is the
// checkpoint this tab showed, offered as "Fork from what I saw" (null:
// the server offered none).
export class ConflictBanner {
  from: string | null = null;

  constructor(private readonly box: HTMLElement) {}

  show(from: string | null, offerFork = true): void {
    this.from = from;
    this.box.hidden = false;
    $(this.box, "[data-action=fork-seen]").hidden = !offerFork || from === null;
  }

  hide(): void {
    this.from = null;
    this.box.hidden = true;
  }
}
