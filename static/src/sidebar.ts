// groupByDay puts headings into the conversation list (newest first, each
// item's data-updated-at an RFC 3339 time): Today, Yesterday, Previous 7
// days, Older — by this browser's clock and time zone, which the server
// does not know.
export function groupByDay(list: HTMLElement, now = new Date()): void {
  const startOf = (d: Date) => new Date(d.getFullYear(), d.getMonth(), d.getDate()).getTime();
  const today = startOf(now);
  const day = 24 * 60 * 60 * 1000;
  const label = (t: number): string =>
    t >= today ? "Today" : t >= today - day ? "Yesterday" : t >= today - 7 * day ? "Previous 7 days" : "Older";
  let last = "";
  for (const li of [...list.querySelectorAll<HTMLLIElement>(":scope > li[data-updated-at]")]) {
    const t = Date.parse(li.dataset.updatedAt ?? "");
    if (Number.isNaN(t)) continue;
    const group = label(t);
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

// ThreadSearch is the sidebar's search box: as you type (150 ms after the
// last key) the list shows the conversations that have every word, in the
// title or a message (GET /api/threads?q=); emptied, the whole list as it
// is now (or, when the server cannot be asked, as the page came with it). Ctrl+K (⌘K) goes to the box (opening the drawer on a
// phone); Esc empties it. Without the script the box is a form: GET /?q=.
// An answer that comes after a newer question is dropped.
export class ThreadSearch {
  private readonly original: Node[];
  private asked = 0;
  private timer = 0;

  constructor(
    private readonly form: HTMLFormElement,
    private readonly input: HTMLInputElement,
    private readonly list: HTMLElement,
    private readonly status: HTMLElement,
  ) {
    this.original = [...list.childNodes];
  }

  start(): void {
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
    try {
      // Empty: the whole list again, as it is now (titles given since the
      // page loaded included), 100 like the page's own.
      const r = await fetch(q === "" ? "/api/threads?limit=100" : `/api/threads?limit=50&q=${encodeURIComponent(q)}`, { credentials: "same-origin" });
      const body = (await r.json()) as { threads?: ListedThread[]; message?: string };
      if (n !== this.asked) return;
      if (!r.ok) {
        if (q === "") this.list.replaceChildren(...this.original);
        else this.say(`Could not search: ${body.message ?? r.statusText}`);
        return;
      }
      threads = body.threads ?? [];
    } catch {
      if (n !== this.asked) return;
      if (q === "") this.list.replaceChildren(...this.original);
      else this.say("Could not search: the server is not reachable. Try again in a moment.");
      return;
    }
    const current = location.pathname.startsWith("/t/") ? location.pathname.slice(3) : "";
    // As the page's own list: no conversation nothing was ever sent in.
    const shown = threads.filter((t) => t.forked_from || t.state_version > 1 || t.thread_id === current);
    this.list.replaceChildren(...shown.map((t) => item(t, t.thread_id === current)));
    groupByDay(this.list);
    if (q === "") return;
    this.say(shown.length === 0 ? "No conversation has all of these words." : `${shown.length === 1 ? "1 conversation" : `${shown.length} conversations`} found${shown.length === 50 ? " (the 50 latest)" : ""}.`);
  }

  private say(text: string): void {
    this.status.textContent = text;
    this.status.hidden = text === "";
  }
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
