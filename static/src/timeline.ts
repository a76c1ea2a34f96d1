// The Checkpoints panel: the conversation's saved points as a flat
// timeline, oldest first (nesting by parent made a long conversation a
// staircase wider than the page), with Fork here on each.

import { $, button, el, nextTask, snippet } from "./dom";
import { plain } from "./messages";
import { readCheckpoints, type Checkpoints } from "./api";
import { setOf } from "./checkpointset";
import { OtherBranchesView } from "./otherbranches";
import { timeElement } from "./when";
import type { Checkpoint, Message } from "./protocol";


// pointsStep is how many points of the branch the panel shows at first,
// the latest, and how many more each "Show earlier points" adds: a
// 2,000-message conversation has 2,000, and drawing them all took the
// panel over a second to open.
export const pointsStep = 100;

// timelineItems are the panel's rows, the latest limit points of the
// branch shown (other branches are listed under it, by their first words:
// otherbranches.ts): when each point was saved, the message it ends with
// (when the page has it), and which is the current point; and how many
// points of the branch there are.
export function timelineItems(checkpoints: Checkpoint[], head: string, messages: Message[], limit = Infinity): { items: HTMLLIElement[]; total: number } {
  const byID = new Map(checkpoints.map((c) => [c.checkpoint_id, c]));
  const onBranch = new Set<string>();
  for (let c = byID.get(head); c; c = c.parent_checkpoint_id ? byID.get(c.parent_checkpoint_id) : undefined) {
    onBranch.add(c.checkpoint_id);
  }
  const known = new Map(messages.map((m) => [m.message_id, m]));
  const ordered = checkpoints.filter((c) => onBranch.has(c.checkpoint_id)).sort((a, b) => a.state_version - b.state_version);
  const set = setOf(checkpoints); // (counts and last ids without making whole lists)
  const items = ordered.slice(Math.max(0, ordered.length - limit)).map((c) => {
    const isHead = c.checkpoint_id === head;
    const count = set.count(c);
    const lastID = set.last(c);
    const last = lastID !== undefined ? known.get(lastID) : undefined;
    const what =
      count === 0
        ? "The start: no messages yet"
        : last
          ? `${last.role === "user" ? "You" : last.role === "tool" ? "Tool result" : "Reply"}: ${snippet(plain(last))}`
          : `${count} message${count === 1 ? "" : "s"}`;
    const tags = [
      isHead ? "current" : "",
      isHead && c.pending && c.pending.step === "generate" && count ? "reply not finished" : "",
    ].filter(Boolean);
    const fork = button("Fork here", "fork-at", "tree-fork", "btn ghost small");
    fork.dataset.checkpointId = c.checkpoint_id;
    return el(
      "li",
      {
        "data-testid": "tree-node",
        "data-checkpoint-id": c.checkpoint_id,
        "data-branch": isHead ? "current" : "this",
        class: isHead ? "head" : "",
      },
      timeElement(c.created_at, { class: "when" }, { seconds: true }),
      el("span", { class: "node", "data-testid": "tree-what" }, what),
      ...(tags.length ? [el("span", { class: "tags", "data-testid": "tree-tags" }, tags.join(" · "))] : []),
      fork,
    );
  });
  return { items, total: ordered.length };
}

// timelineStatus says above the timeline (tree, the panel) whether it is
// being brought up to date (loads fetches under way, opening of them for
// the panel being opened) or why the fetch that just ended failed (and
// what to do); a fetch that succeeds clears it.
export function timelineStatus(tree: HTMLElement, loads: number, opening: boolean, failed: string): void {
  const list = $(tree, "[data-testid=tree-list]");
  const status = $(tree, "[data-testid=tree-status]");
  list.setAttribute("aria-busy", String(loads > 0));
  if (opening) status.textContent = "Bringing the timeline up to date…";
  else if (failed) status.textContent = `Could not load the checkpoints (${failed}): what is shown may be out of date. Close and open Checkpoints to try again.`;
  else if (loads > 0 && status.classList.contains("failed")) return; // a failure stays up until a fetch succeeds
  status.hidden = !opening && !failed;
  status.classList.toggle("failed", !opening && failed !== "");
}

// Now is what the panel draws from: the head, the messages the page holds
// and whether a run is active (no switching then).
interface Now {
  head: string;
  messages: Message[];
  run: unknown;
}

// Timeline is the Checkpoints panel and the checkpoints last read (which
// the message list also uses, for versions). Owned by the conversation's
// view; one fetch's answer replaces the list whole.
export class Timeline {
  checkpoints: Checkpoint[] = [];
  // loads counts the fetches under way (the list is busy while any is);
  // opening those of the panel being opened, while which it says it is
  // being brought up to date (what it shows may be from before the
  // latest request). A refresh on a new checkpoint, with the panel open,
  // is not announced: it comes with every message.
  private loads = 0;
  private opening = 0;
  // now: the conversation as of the last load (to draw the list from
  // when the panel opens; it is drawn only while open).
  private now: (() => Now) | null = null;
  private readonly others: OtherBranchesView;
  // limit: how many of the branch's latest points are drawn; earlier
  // brings in pointsStep more.
  private limit = pointsStep;
  private readonly earlier: HTMLButtonElement;

  constructor(
    private readonly panel: HTMLElement,
    private readonly threadID: string,
  ) {
    this.others = new OtherBranchesView(panel, threadID);
    this.earlier = button("Show earlier points", "timeline-earlier", "tree-earlier", "btn ghost small");
    this.earlier.hidden = true;
    $(panel, "[data-testid=tree-list]").before(this.earlier);
    this.earlier.addEventListener("click", () => {
      this.limit += pointsStep;
      this.draw();
      // The focus stays on the button while there are more; then it goes
      // to the earliest point's Fork, where the button was.
      const list = $(this.panel, "[data-testid=tree-list]");
      if (this.earlier.hidden) (list.firstElementChild?.querySelector<HTMLElement>("button") ?? list).focus();
    });
  }

  get open(): boolean {
    return !this.panel.hidden;
  }

  // load reads the checkpoints, hands them to loaded and shows them (as of
  // head and messages, once loaded returns); it returns why it could not
  // ("" when it did). opening says the panel is being opened.
  async load(opening: boolean, loaded: (c: Checkpoints) => void, now: () => Now): Promise<string> {
    this.loads++;
    if (opening) this.opening++;
    this.status("");
    // (The timeline is an aid; the conversation works without it.)
    const body = await readCheckpoints(this.threadID);
    await nextTask();
    const failed = "failed" in body ? body.failed : "";
    if (!("failed" in body)) {
      this.checkpoints = body.checkpoints;
      loaded(body);
      this.now = now;
      this.draw();
    }
    this.loads--;
    if (opening) this.opening--;
    this.status(failed);
    return failed;
  }

  // draw shows the checkpoints read in the list, while the panel is open
  // (a long conversation has thousands: not drawn for nothing).
  private draw(): void {
    if (!this.open || !this.now) return;
    const { head, messages, run } = this.now();
    const { items, total } = timelineItems(this.checkpoints, head, messages, this.limit);
    $(this.panel, "[data-testid=tree-list]").replaceChildren(...items);
    const more = total - items.length;
    this.earlier.hidden = more === 0;
    const next = Math.min(more, pointsStep);
    this.earlier.textContent = `Show ${next} earlier point${next === 1 ? "" : "s"} (${more} not shown)`;
    this.others.show(this.checkpoints, head, messages, run !== null);
  }

  private status(failed: string): void {
    timelineStatus(this.panel, this.loads, this.opening > 0, failed);
  }

  // toggle opens or closes the panel (toggle is its button); opened, it
  // comes into view below the header (as tall as its tools make it, which
  // stays at the top) with the focus in it. It answers whether it opened.
  toggle(toggle: HTMLElement, header: HTMLElement | null): boolean {
    this.panel.hidden = !this.panel.hidden;
    toggle.setAttribute("aria-expanded", String(!this.panel.hidden));
    if (this.panel.hidden) return false;
    this.draw(); // what was read, until the fetch that follows brings it up to date
    this.panel.style.scrollMarginTop = `${(header?.offsetHeight ?? 0) + 12}px`;
    this.panel.scrollIntoView({ block: "start" });
    $(this.panel, "h2").focus();
    return true;
  }
}
