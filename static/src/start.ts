// The home page's box: typing there starts a new conversation with that
// text as its first request, as in other chat apps.
//
// Send (or Enter) creates the conversation over the API (POST
// /api/threads), hands the text to it in this tab's sessionStorage and
// opens it; the conversation's page puts the text in its box and sends it
// once it is live, the way its own Send does (composer.ts, takeFirst), so
// a refusal there keeps the text in the box and says why. If the
// conversation cannot be created the text stays here, with what to do.
// What is typed here is kept in this browser until it is sent (drafts.ts),
// like a conversation's draft. Without sessionStorage the box is posted
// as the plain form it is, and the server creates and sends (web/home.go).

import { $ } from "./dom";
import { createThread } from "./api";
import { loadDraft, saveDraft } from "./drafts";

const homeDraft = "home"; // (drafts.ts's key for this box: thread ids start with thr_)
const firstKey = (threadID: string) => `gateway.first.${threadID}`;

// takeFirst answers, once, the first message the home page handed to
// threadID ("" when none).
export function takeFirst(threadID: string): string {
  try {
    const text = sessionStorage.getItem(firstKey(threadID)) ?? "";
    sessionStorage.removeItem(firstKey(threadID));
    return text;
  } catch {
    return "";
  }
}

// handOver keeps text for threadID's page; false when this tab keeps
// nothing (storage refused or full).
function handOver(threadID: string, text: string): boolean {
  try {
    sessionStorage.setItem(firstKey(threadID), text);
    return sessionStorage.getItem(firstKey(threadID)) === text;
  } catch {
    return false;
  }
}

// canHandOver: this tab has a sessionStorage to hand the text over in.
function canHandOver(): boolean {
  const ok = handOver("probe", "probe");
  takeFirst("probe");
  return ok;
}

// HomeComposer is the home page's box.
export class HomeComposer {
  private readonly input: HTMLTextAreaElement;
  private readonly send: HTMLButtonElement;
  private readonly notice: HTMLElement;
  private busy = false;

  constructor(private readonly form: HTMLFormElement) {
    this.input = $(form, "[data-testid=home-input]");
    this.send = $(form, "[data-testid=home-send]");
    this.notice = $(form, "[data-testid=home-notice]");
  }

  start(): void {
    if (!this.input.value) this.input.value = loadDraft(homeDraft);
    this.input.addEventListener("input", () => saveDraft(homeDraft, this.input.value));
    this.input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        this.form.requestSubmit();
      }
    });
    this.form.addEventListener("submit", (e) => {
      if (!canHandOver()) return; // the plain form post
      e.preventDefault();
      void this.create();
    });
  }

  private async create(): Promise<void> {
    const text = this.input.value;
    if (this.busy) return;
    if (!text.trim()) {
      this.say("Type a message first: sending it starts the conversation.", "info");
      this.input.focus();
      return;
    }
    this.busy = true;
    this.send.disabled = true;
    this.say("Starting a new conversation…", "info");
    const id = await createThread();
    if (!id || !handOver(id, text)) {
      this.busy = false;
      this.send.disabled = false;
      this.say("Could not start a conversation: the server refused or could not be reached. Your text is still here: press Send to try again.", "error");
      this.input.focus();
      return;
    }
    saveDraft(homeDraft, "");
    location.assign(`/t/${encodeURIComponent(id)}`);
  }

  private say(text: string, tone: "info" | "error"): void {
    this.notice.textContent = text;
    this.notice.dataset.tone = tone;
    this.notice.hidden = text === "";
  }
}
