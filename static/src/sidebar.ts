import { listThreads } from "./api";
import { dayGroup } from "./when";

// groupByDay puts headings into the conversation list (newest first, each
// item's data-updated-at an RFC 3339 time): Today, Yesterday, Previous 7
// days, Older — by this browser's clock and time zone, which the server
// does not know (when.ts). Run again (more items, other items), it puts
// them anew.
export function groupByDay(list: HTMLElement, now = new Date()): void {
  for (const old of list.querySelectorAll(":scope > li.group-label")) old.remove();
  let last = "";
  for (const li of [...list.querySelectorAll<HTMLLIElement>(":scope > li[data-updated-at]")]) {
    const t = Date.parse(li.dataset.updatedAt ?? "");
    if (Number.isNaN(t)) continue;
    const group = dayGroup(t, now);
    if (group === last) continue;
    last = group;
    const head = document.createElement("li");
    head.className = "group-label";
    head.dataset.testid = "thread-group";
    head.textContent = group;
    li.before(head);
  }
}

// ListedThread is what the search reads of GET /api/threads.
interface ListedThread {
  thread_id: string;
  title: string;
  state_version: number;
  updated_at: string;
  forked_from?: unknown;
}

// ThreadSearch is the sidebar's search box and its list: as you type (150
// ms after the last key) the list shows the conversations that have every
// word, in the title or a message (GET /api/threads?q=); emptied, the whole
// list as it is now (or, when the server cannot be asked, as the page came
// with it). Ctrl+K (⌘K) goes to the box (opening the drawer on a phone);
// Esc empties it. "Older conversations" under the list adds the next page
// of what it shows (the cursor of GET /api/threads). Without the script
// the box is a form (GET /?q=) and "Older conversations" a link to the
// next page (GET /?cursor=). An answer that comes after a newer question
// is dropped.
export class ThreadSearch {
  private readonly original: Node[];
  private readonly originalCursor: string;
  private asked = 0;
  private timer = 0;
  private query = "";
  private cursor: string;

  constructor(
    private readonly form: HTMLFormElement,
    private readonly input: HTMLInputElement,
    private readonly list: HTMLElement,
    private readonly status: HTMLElement,
    private readonly more: HTMLAnchorElement | null,
  ) {
    this.original = [...list.childNodes];
    this.originalCursor = more?.dataset.cursor ?? "";
    this.cursor = this.originalCursor;
  }

  start(): void {
    this.more?.addEventListener("click", (e) => {
      e.preventDefault();
      void this.older();
    });
    this.form.addEventListener("submit", (e) => {
      e.preventDefault();
      void this.run();
    });
    this.input.addEventListener("input", () => {
      window.clearTimeout(this.timer);
      this.timer = window.setTimeout(() => void this.run(), 150);
    });
    this.input.addEventListener("keydown", (e) => {
      if (e.key === "Escape" && this.input.value) {
        e.stopPropagation(); // Esc empties the box; it does not cancel a reply
        this.input.value = "";
        void this.run();
      }
    });
    document.addEventListener("keydown", (e) => {
      if ((e.ctrlKey || e.metaKey) && !e.shiftKey && !e.altKey && e.key.toLowerCase() === "k") {
        e.preventDefault();
        // On a phone the box is in the closed drawer (its toggle shows).
        const toggle = document.querySelector<HTMLButtonElement>("[data-testid=drawer-toggle]");
        if (toggle && toggle.offsetParent !== null && toggle.getAttribute("aria-expanded") !== "true") toggle.click();
        window.requestAnimationFrame(() => {
          this.input.focus();
          this.input.select();
        });
      }
    });
  }

  private async run(): Promise<void> {
    const q = this.input.value.trim();
    const n = ++this.asked;
    if (q === "") this.say("");
    else this.say("Searching…");
    let threads: ListedThread[];
    let next = "";
    try {
      // Empty: the whole list again, as it is now (titles given since the
      // page loaded included), 100 like the page's own.
      const r = await listThreads(q === "" ? 100 : 50, q);
      const body = (await r.json()) as { threads?: ListedThread[]; next_cursor?: string; message?: string };
      if (n !== this.asked) return;
      if (!r.ok) {
        if (q === "") this.restore();
        else this.say(`Could not search: ${body.message ?? r.statusText}`);
        return;
      }
      threads = body.threads ?? [];
      next = body.next_cursor ?? "";
    } catch {
      if (n !== this.asked) return;
      if (q === "") this.restore();
      else this.say("Could not search: the server is not reachable. Try again in a moment.");
      return;
    }
    const shown = listed(threads);
    this.list.replaceChildren(...shown);
    groupByDay(this.list);
    this.query = q;
    this.setMore(next);
    if (q === "") return;
    this.say(shown.length === 0 ? "No conversation has all of these words." : `${shown.length === 1 ? "1 conversation" : `${shown.length} conversations`} found${next ? " (the latest: more below)" : ""}.`);
  }

  // older adds the next page of what the list shows.
  private async older(): Promise<void> {
    const more = this.more;
    if (!more || !this.cursor) return;
    const n = this.asked;
    more.setAttribute("aria-disabled", "true");
    more.textContent = "Loading older conversations…";
    try {
      const r = await listThreads(100, this.query, this.cursor);
      const body = (await r.json()) as { threads?: ListedThread[]; next_cursor?: string; message?: string };
      if (n !== this.asked) return; // a search changed the list meanwhile
      if (!r.ok) throw new Error(body.message ?? r.statusText);
      this.list.append(...listed(body.threads ?? []));
      groupByDay(this.list);
      this.setMore(body.next_cursor ?? "");
      more.textContent = "Older conversations";
    } catch {
      more.textContent = "Could not load older conversations: try again";
    } finally {
      more.removeAttribute("aria-disabled");
    }
  }

  private setMore(cursor: string): void {
    this.cursor = cursor;
    if (!this.more) return;
    this.more.hidden = cursor === "";
    this.more.dataset.cursor = cursor;
    this.more.href = "/?" + new URLSearchParams(this.query ? { cursor, q: this.query } : { cursor }).toString();
  }

  // restore shows the list as the page came with it.
  private restore(): void {
    this.list.replaceChildren(...this.original);
    this.query = "";
    this.setMore(this.originalCursor);
  }

  private say(text: string): void {
    this.status.textContent = text;
    this.status.hidden = text === "";
  }
}

// listed is the items of threads as the page lists them: without the
// conversations nothing was ever sent in (but the open one).
function listed(threads: ListedThread[]): HTMLLIElement[] {
  const current = location.pathname.startsWith("/t/") ? location.pathname.slice(3) : "";
  return threads
    .filter((t) => t.forked_from || t.state_version > 1 || t.thread_id === current)
    .map((t) => item(t, t.thread_id === current));
}

function item(t: ListedThread, current: boolean): HTMLLIElement {
  const li = document.createElement("li");
  li.dataset.updatedAt = t.updated_at;
  const a = document.createElement("a");
  a.href = "/t/" + encodeURIComponent(t.thread_id);
  a.dataset.testid = "thread-link";
  a.title = t.title;
  if (current) a.setAttribute("aria-current", "page");
  const title = document.createElement("span");
  title.className = "title";
  title.dataset.testid = "thread-title";
  if (t.forked_from) {
    const badge = document.createElement("span");
    badge.className = "badge";
    badge.dataset.testid = "fork-badge";
    badge.textContent = "fork";
    const sep = document.createElement("span");
    sep.className = "visually-hidden";
    sep.textContent = ": ";
    title.append(badge, sep);
  }
  title.append(t.title);
  a.append(title);
  li.append(a);
  return li;
}
