// A conversation's title as the page shows it — its heading (h1), the
// window's title and the conversation list — and Rename.
//
// Rename opens a field with the saved title in it, selected. Enter or
// Save saves it; Esc, Cancel or leaving the field (a click or Tab
// elsewhere) closes it and shows the saved title again: a title never
// shows as saved before the server said it is. A refusal or a failure says
// what to do, in the field. The field is the page's plain form (POST
// /t/{id}/rename, which works without the script too); the script posts it
// asking for JSON (web/forms.go, wantsJSON) and stays on the page.

import { $ } from "./dom";
import { readTitle } from "./api";

// showTitle picks up the name the server gives a conversation: from its
// first request, then the model's (titles are labels: no event carries
// them). While Rename is open the field keeps what is being typed.
export async function showTitle(threadID: string, root: HTMLElement, heading: HTMLElement): Promise<void> {
  const box = root.querySelector<HTMLDetailsElement>("[data-testid=rename]");
  if (box?.open) return;
  const title = await readTitle(threadID);
  // (A label only: one that could not be read shows on the next load.)
  if (!title || title === heading.textContent || box?.open) return;
  setTitle(threadID, root, heading, title);
}

// setTitle shows title as the conversation's saved title everywhere.
function setTitle(threadID: string, root: HTMLElement, heading: HTMLElement, title: string): void {
  heading.textContent = title;
  heading.title = title;
  const input = root.querySelector<HTMLInputElement>("[data-testid=title-input]");
  if (input) input.value = title;
  document.title = `${title} · gateway`;
  const link = document.querySelector<HTMLAnchorElement>(`[data-testid=thread-link][href="/t/${CSS.escape(threadID)}"]`);
  if (link) {
    link.title = title;
    // (the title's own span: a fork keeps its badge)
    const span = link.querySelector<HTMLElement>("[data-testid=thread-title]");
    if (span) span.lastChild?.replaceWith(title);
    else link.textContent = title;
  }
}

// startRename makes Rename (the thread header's details) edit in place.
export function startRename(root: HTMLElement, threadID: string): void {
  const box = root.querySelector<HTMLDetailsElement>("[data-testid=rename]");
  if (!box) return;
  const heading = $(root, "[data-testid=thread-heading]");
  const toggle = $(box, "[data-testid=rename-toggle]");
  const form = $<HTMLFormElement>(box, "[data-testid=rename-form]");
  const input = $<HTMLInputElement>(box, "[data-testid=title-input]");
  const save = $<HTMLButtonElement>(box, "[data-testid=rename-save]");
  const cancel = $<HTMLButtonElement>(box, "[data-testid=rename-cancel]");
  const error = $(box, "[data-testid=rename-error]");
  cancel.hidden = false;
  let sending = 0; // the save in flight (0: none)
  const saved = (): string => heading.textContent ?? "";
  const say = (text: string): void => {
    error.textContent = text;
    error.hidden = text === "";
    input.setAttribute("aria-invalid", String(text !== ""));
  };
  // close puts the saved title back and the field away; the focus goes
  // back to Rename when it was in the field (not when a click took it
  // elsewhere).
  const close = (refocus: boolean): void => {
    box.open = false;
    input.value = saved();
    say("");
    if (refocus) toggle.focus();
  };
  box.addEventListener("toggle", () => {
    if (!box.open) return;
    input.value = saved();
    say("");
    input.focus();
    input.select();
  });
  form.addEventListener("keydown", (e) => {
    if (e.key !== "Escape") return;
    e.preventDefault();
    e.stopPropagation(); // it closes the field; it cancels no reply
    close(true);
  });
  cancel.addEventListener("click", () => close(true));
  // Leaving the field reverts it: a press anywhere else, or the focus
  // moving out (Tab). (A focus lost to nothing — another window — keeps
  // it open: coming back, the edit is still there.)
  document.addEventListener("pointerdown", (e) => {
    if (box.open && !box.contains(e.target as Node)) close(false);
  });
  box.addEventListener("focusout", (e) => {
    const to = e.relatedTarget as Node | null;
    if (box.open && to && !box.contains(to)) close(false);
  });
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    void send();
  });

  const send = async (): Promise<void> => {
    const title = input.value.trim();
    const keep = `press Esc to keep “${saved()}”`;
    if (!title) {
      say(`A title cannot be empty: type one, or ${keep}.`);
      return;
    }
    if (title === saved()) return close(true);
    if (sending) return;
    const n = (sending = Date.now());
    save.disabled = true;
    save.textContent = "Saving…";
    const answer = await postTitle(form.action, title);
    if (n !== sending) return;
    sending = 0;
    save.disabled = false;
    save.textContent = "Save";
    if ("title" in answer) {
      // Saved: shown as saved (also when the field was left meanwhile).
      const refocus = box.open && box.contains(document.activeElement);
      setTitle(threadID, root, heading, answer.title);
      if (box.open) close(refocus);
      return;
    }
    if (!box.open) return; // left meanwhile: the saved title shows
    const next = { retry: ` Press Save to try again, or ${keep}.`, change: ` Change it and press Save, or ${keep}.`, none: "" }[answer.then];
    say(`Not saved: ${answer.failed}${next}`);
    input.focus();
  };
}

// postTitle posts the rename form asking for JSON: the title saved, or
// why not (a sentence) and what may work then: the same again, another
// title, or neither (signed out).
async function postTitle(action: string, title: string): Promise<{ title: string } | { failed: string; then: "retry" | "change" | "none" }> {
  let r: Response;
  try {
    r = await fetch(action, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/x-www-form-urlencoded", Accept: "application/json" },
      body: new URLSearchParams({ title }),
    });
  } catch {
    return { failed: "the server could not be reached.", then: "retry" };
  }
  // (Signed out meanwhile: the form's answer is the way to sign in.)
  if (r.redirected && new URL(r.url).pathname === "/login") return { failed: "you are signed out. Reload the page to sign in, then rename again.", then: "none" };
  let body: { title?: string; message?: string } = {};
  try {
    body = (await r.json()) as typeof body;
  } catch {
    // not JSON: the status says enough
  }
  if (r.ok && typeof body.title === "string") return { title: body.title };
  const why = body.message ? sentence(body.message) : `the server answered ${r.status}.`;
  return { failed: why, then: r.status >= 500 || r.status === 429 || !body.message ? "retry" : "change" };
}

// sentence ends text with a full stop.
function sentence(text: string): string {
  return /[.!?]$/.test(text) ? text : `${text}.`;
}
