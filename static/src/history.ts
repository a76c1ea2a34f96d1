// How much of a long conversation the page shows, so that it stays
// loadable whatever the conversation's length: the latest messages (at
// most historyMessages, and historyBytes of content but for the latest
// one: one page, so that the work before the page can be used does not
// grow with the conversation), older pages as the reader scrolls up
// (scrollback.ts) or presses "Show earlier messages" (GET
// /api/threads/{id}/messages), and of a reply longer than displayBytes its
// start, with "Show the whole reply". The server's first paint uses the
// same numbers (web/history.go, chat.DefaultHistoryPage and
// chat.HistoryPageBytes).

import type { HistoryPage, Message } from "./protocol";
import { readEarlier } from "./api";

export const historyMessages = 50;
export const historyBytes = 1 << 20;
export const displayBytes = 256 * 1024;
// earlierPage is how many older messages one "Show earlier messages"
// fetches (the server also stops a page at historyBytes).
const earlierPage = 50;

// utf8Length is the size of s in UTF-8 bytes, as the server counts it.
export function utf8Length(s: string): number {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length) {
      n += 4; // a surrogate pair: one code point of four bytes
      i++;
    } else n += 3;
  }
  return n;
}

// clipUTF8 is the longest start of s of at most n UTF-8 bytes that ends on
// a code point, and whether s was longer.
export function clipUTF8(s: string, n: number): { text: string; clipped: boolean } {
  if (s.length * 3 <= n) return { text: s, clipped: false };
  let bytes = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    const pair = c >= 0xd800 && c <= 0xdbff && i + 1 < s.length;
    const size = c < 0x80 ? 1 : c < 0x800 ? 2 : pair ? 4 : 3;
    if (bytes + size > n) return { text: s.slice(0, i), clipped: true };
    bytes += size;
    if (pair) i++;
  }
  return { text: s, clipped: false };
}

// windowStart is where the shown part of a history starts: at keepFrom
// when that message is in it (the user already brought earlier messages
// in), else at the latest messages within the budget.
export function windowStart(messages: Message[], keepFrom?: string): number {
  if (keepFrom) {
    const i = messages.findIndex((m) => m.message_id === keepFrom);
    if (i >= 0) return i;
  }
  let from = messages.length;
  let total = 0;
  while (from > 0 && messages.length - from < historyMessages) {
    const next = total + utf8Length(messages[from - 1].content);
    if (from < messages.length && next > historyBytes) break;
    from--;
    total = next;
  }
  return from;
}

// fetchEarlier reads the page of the history before message before.
export function fetchEarlier(threadID: string, before: string): Promise<HistoryPage> {
  return readEarlier(threadID, before, earlierPage);
}

// historyIDs is the whole history's message ids when the head checkpoint
// tells them (its list ends with the messages shown), so that positions
// in it are the history's; otherwise the ids shown, which are the whole
// history only when nothing earlier was left out ([] then: unknown).
export function historyIDs(shown: Message[], earlier: number, head: { message_ids: string[] } | undefined): string[] {
  const ids = shown.map((m) => m.message_id);
  if (head && head.message_ids.length === earlier + ids.length && ids.every((id, i) => head.message_ids[earlier + i] === id)) {
    return head.message_ids;
  }
  return earlier === 0 ? ids : [];
}

// earlierLabel is the "Show earlier messages" button's text (as
// web/history.go writes it).
export function earlierLabel(n: number): string {
  return n === 1 ? "Show 1 earlier message" : `Show earlier messages (${n} more)`;
}

// cutNote says a reply was cut at the size limit, and where (as
// web/history.go writes it).
export function cutNote(m: Message): HTMLElement {
  const p = document.createElement("p");
  p.className = "cut-note";
  p.dataset.testid = "cut-note";
  p.textContent = `Cut at the size limit: the model was stopped after ${size(utf8Length(m.content))}, and nothing past that was kept.`;
  return p;
}

// clippedNote offers the whole of a reply shown only in part.
export function clippedNote(m: Message): HTMLElement {
  const p = document.createElement("p");
  p.className = "clipped-note";
  p.dataset.testid = "clipped-note";
  const hint = document.createElement("span");
  hint.className = "hint";
  hint.textContent = `Showing the first ${size(displayBytes)} of ${size(utf8Length(m.content))}.`;
  const b = document.createElement("button");
  b.type = "button";
  b.className = "btn ghost small";
  b.dataset.action = "show-whole";
  b.dataset.messageId = m.message_id;
  b.dataset.testid = "show-whole";
  b.textContent = "Show the whole reply";
  p.append(hint, " ", b);
  return p;
}

// size writes a byte count for people: "256 KiB", "1.5 MiB".
function size(n: number): string {
  if (n >= 1 << 20) return `${(n / (1 << 20)).toFixed(1)} MiB`;
  if (n >= 1 << 10) return `${Math.floor(n / 1024)} KiB`;
  return `${n} bytes`;
}

// EarlierBox is the "Show earlier messages" box above the messages.
// Owned by the conversation's view; one load at a time.
export class EarlierBox {
  private loading = false;

  constructor(
    private readonly box: HTMLElement,
    private readonly threadID: string,
  ) {}

  // show offers the earlier messages left out (none: the box hides).
  show(earlier: number): void {
    this.box.hidden = earlier === 0;
    if (!this.loading) this.button().textContent = earlierLabel(earlier);
  }

  // load reads the page of the history before message before and hands
  // it to apply; the box says it is loading, or why it could not (and to
  // press again). Then it shows earlier() as it is.
  async load(before: string, apply: (page: HistoryPage) => void, earlier: () => number): Promise<void> {
    if (this.loading) return;
    const button = this.button();
    const status = this.box.querySelector<HTMLElement>("[data-testid=earlier-status]")!;
    this.loading = true;
    button.disabled = true;
    status.textContent = "Loading earlier messages…";
    try {
      const page = await fetchEarlier(this.threadID, before);
      status.textContent = "";
      apply(page);
    } catch (err) {
      status.textContent = `Could not load the earlier messages (${(err as Error).message}): press the button to try again.`;
    } finally {
      this.loading = false;
      button.disabled = false;
      this.show(earlier());
    }
  }

  private button(): HTMLButtonElement {
    return this.box.querySelector<HTMLButtonElement>("[data-testid=show-earlier]")!;
  }
}
