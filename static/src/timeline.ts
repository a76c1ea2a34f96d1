// The Checkpoints panel: the conversation's saved points as a flat
// timeline, oldest first (nesting by parent made a long conversation a
// staircase wider than the page), with Fork here on each.

import { $, button, el, snippet } from "./dom";
import { plain } from "./messages";
import { readCheckpoints, type Checkpoints } from "./api";
import type { Checkpoint, Message } from "./protocol";

// timelineItems are the panel's rows: when each point was saved, the
// message it ends with (when the page has it), and whether it is the
// current point, on the current branch or on another one.
export function timelineItems(checkpoints: Checkpoint[], head: string, messages: Message[]): HTMLLIElement[] {
  const byID = new Map(checkpoints.map((c) => [c.checkpoint_id, c]));
  const onBranch = new Set<string>();
  for (let c = byID.get(head); c; c = c.parent_checkpoint_id ? byID.get(c.parent_checkpoint_id) : undefined) {
    onBranch.add(c.checkpoint_id);
  }
  const known = new Map(messages.map((m) => [m.message_id, m]));
  const ordered = [...checkpoints].sort((a, b) => a.state_version - b.state_version);
  return ordered.map((c) => {
    const isHead = c.checkpoint_id === head;
    const last = c.message_ids.length ? known.get(c.message_ids[c.message_ids.length - 1]) : undefined;
    const what =
      c.message_ids.length === 0
        ? "The start: no messages yet"
        : last
          ? `${last.role === "user" ? "You" : last.role === "tool" ? "Tool result" : "Reply"}: ${snippet(plain(last))}`
          : `${c.message_ids.length} message${c.message_ids.length === 1 ? "" : "s"}`;
    const tags = [
      isHead ? "current" : onBranch.has(c.checkpoint_id) ? "" : "another branch",
      isHead && c.pending && c.pending.step === "generate" && c.message_ids.length ? "reply not finished" : "",
    ].filter(Boolean);
    const fork = button("Fork here", "fork-at", "tree-fork", "btn ghost small");
    fork.dataset.checkpointId = c.checkpoint_id;
    return el(
      "li",
      {
        "data-testid": "tree-node",
        "data-checkpoint-id": c.checkpoint_id,
        "data-branch": isHead ? "current" : onBranch.has(c.checkpoint_id) ? "this" : "other",
        class: isHead ? "head" : onBranch.has(c.checkpoint_id) ? "" : "other",
      },
      el("time", { datetime: c.created_at, class: "when" }, new Date(c.created_at).toLocaleString([], { dateStyle: "short", timeStyle: "short" })),
      el("span", { class: "node", "data-testid": "tree-what" }, what),
      ...(tags.length ? [el("span", { class: "tags", "data-testid": "tree-tags" }, tags.join(" · "))] : []),
      fork,
    );
  });
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

  constructor(
    private readonly panel: HTMLElement,
    private readonly threadID: string,
  ) {}

  get open(): boolean {
    return !this.panel.hidden;
  }

  // load reads the checkpoints, hands them to loaded and shows them (as of
  // head and messages, once loaded returns); it returns why it could not
  // ("" when it did). opening says the panel is being opened.
  async load(opening: boolean, loaded: (c: Checkpoints) => void, now: () => { head: string; messages: Message[] }): Promise<string> {
    this.loads++;
    if (opening) this.opening++;
    this.status("");
    // (The timeline is an aid; the conversation works without it.)
    const body = await readCheckpoints(this.threadID);
    const failed = "failed" in body ? body.failed : "";
    if (!("failed" in body)) {
      this.checkpoints = body.checkpoints;
      loaded(body);
      const { head, messages } = now();
      $(this.panel, "[data-testid=tree-list]").replaceChildren(...timelineItems(this.checkpoints, head, messages));
    }
    this.loads--;
    if (opening) this.opening--;
    this.status(failed);
    return failed;
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
    this.panel.style.scrollMarginTop = `${(header?.offsetHeight ?? 0) + 12}px`;
    this.panel.scrollIntoView({ block: "start" });
    $(this.panel, "h2").focus();
    return true;
  }
}
