// The Checkpoints panel's "Other branches": each version of the
// conversation that left the one shown (an edited request, a regenerated
// reply, a branch switched away from), named by its first words where it
// leaves, its length, its last words and when it was last written, with
// "Switch to this branch" (the head moves to its newest point) and Fork.

import { button, el, snippet } from "./dom";
import { plain } from "./messages";
import { readMessagesByID } from "./api";
import { setOf } from "./checkpointset";
import { otherBranches, type OtherBranch } from "./versions";
import { timeElement } from "./when";
import type { Checkpoint, Message } from "./protocol";

// words is a message as a reader sees it, in one line, quoted; or, not
// known, who wrote it.
function words(m: Message | undefined, fallback: string): string {
  return m ? `“${snippet(plain(m), 80)}”` : fallback;
}

// branchItem is one row of the list; hist names the message of the
// history shown that switching leaves behind (its side effects are said
// then: branching.ts).
function branchItem(b: OtherBranch, hist: string[], known: (id: string) => Message | undefined, busy: boolean): HTMLLIElement {
  const first = known(b.firstID);
  const last = known(b.lastID);
  const who = first?.role === "user" ? "your message" : first?.role === "tool" ? "a tool result" : "a reply";
  const what = `From message ${b.from + 1}, ${who}: ${words(first, "(its text is not loaded)")}`;
  const more = `${b.count} message${b.count === 1 ? "" : "s"}${b.lastID !== b.firstID ? ` · ends with ${words(last, "a message not loaded")}` : ""}`;
  const go = button("Switch to this branch", "checkout", "branch-switch", "btn small");
  go.dataset.checkpointId = b.tip.checkpoint_id;
  go.disabled = busy;
  if (busy) go.title = "Wait for the reply to finish, or cancel it, to switch branches";
  const fork = button("Fork", "fork-at", "branch-fork", "btn ghost small");
  fork.dataset.checkpointId = b.tip.checkpoint_id;
  fork.setAttribute("aria-label", "Fork this branch into a new conversation");
  const li = el(
    "li",
    { "data-testid": "branch", "data-checkpoint-id": b.tip.checkpoint_id },
    // (To the second: versions made a moment apart are told apart.)
    timeElement(b.tip.created_at, { class: "when" }, { seconds: true }),
    el("span", { class: "node", "data-testid": "branch-what" }, what),
    el("span", { class: "tags", "data-testid": "branch-more" }, more),
    el("span", { class: "branch-actions" }, go, fork),
  );
  if (hist[b.from]) li.dataset.messageId = hist[b.from];
  return li;
}

// OtherBranchesView draws the section into the panel and reads the
// words of the messages the page does not hold (GET …/messages?ids=),
// once each. Owned by the Checkpoints panel (timeline.ts).
export class OtherBranchesView {
  private readonly section: HTMLElement;
  private readonly looked = new Map<string, Message>();
  private readonly answered = new Set<string>(); // asked, and the server answered (a deleted one is left out)
  private asking = false;

  constructor(
    panel: HTMLElement,
    private readonly threadID: string,
  ) {
    this.section = el("section", { class: "other-branches", "data-testid": "other-branches", "aria-labelledby": "other-branches-h", hidden: "" });
    panel.append(this.section);
  }

  // show draws the branches of checkpoints other than the one of head
  // (messages: those the page holds), then fetches the words it lacks and
  // draws again.
  show(checkpoints: Checkpoint[], head: string, messages: Message[], busy: boolean): void {
    const set = setOf(checkpoints);
    const headCp = set.get(head);
    const hist = headCp ? headCp.message_ids : [];
    const list = otherBranches(checkpoints, head, hist);
    const shown = new Map(messages.map((m) => [m.message_id, m]));
    const known = (id: string): Message | undefined => shown.get(id) ?? this.looked.get(id);
    this.section.hidden = list.length === 0;
    this.section.replaceChildren(
      el("h3", { id: "other-branches-h" }, `Other branches (${list.length})`),
      el("p", { class: "hint" }, "Versions of this conversation that left it: an edited message, a regenerated reply. Switching shows one here; this one stays a branch you can switch back to."),
      el("ol", { class: "tree-list" }, ...list.map((b) => branchItem(b, hist, known, busy))),
    );
    const missing = [...new Set(list.flatMap((b) => [b.firstID, b.lastID]))].filter((id) => !known(id) && !this.answered.has(id));
    if (missing.length && !this.asking) void this.lookUp(missing, () => this.show(checkpoints, head, messages, busy));
  }

  // lookUp reads missing, 20 at a time, then redraws (the rows say what is
  // not loaded when the server does not answer; the next opening asks
  // again).
  private async lookUp(missing: string[], redraw: () => void): Promise<void> {
    this.asking = true;
    let got = 0;
    for (let i = 0; i < missing.length; i += 20) {
      const ids = missing.slice(i, i + 20);
      const msgs = await readMessagesByID(this.threadID, ids);
      if (!msgs) break;
      for (const id of ids) this.answered.add(id);
      for (const m of msgs) this.looked.set(m.message_id, m);
      got += msgs.length;
    }
    this.asking = false;
    if (got) redraw();
  }
}
