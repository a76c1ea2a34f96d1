// A message's versions: a request before and after it was edited, a reply
// before and after it was regenerated, found in the thread's checkpoints.
// Pure: no DOM, unit-tested (static/test/versions.test.mjs).

import type { Checkpoint, Message } from "./protocol";
import { historyIDs } from "./history";
import { setOf } from "./checkpointset";

// Branch is where a message stands among its versions: index of count,
// and the checkpoints the previous and next ones move to.
export interface Branch {
  index: number;
  count: number;
  prev?: string;
  next?: string;
}

// branches finds, for each message of the history shown (messages, after
// earlier ones left out), the other versions of it. A checkpoint that
// agrees with the history up to position p and holds another message at p
// is a version of the message at p, unless it is an ancestor of the head
// (a point before a fragment was deleted differs from the history the same
// way). Versions are numbered in the order they were first written;
// switching to one moves the head to the newest checkpoint holding it
// there (the latest state of that branch).
export function branches(messages: Message[], earlier: number, head: string, checkpoints: Checkpoint[]): Map<string, Branch> {
  const out = new Map<string, Branch>();
  const set = setOf(checkpoints);
  const hist = historyIDs(messages, earlier, set.get(head));
  if (hist.length === 0 || checkpoints.length === 0) return out;
  const ancestors = set.ancestors(set.get(head) ? head : messages[messages.length - 1].checkpoint_id);
  // versions at p: message id → the newest checkpoint holding it at p (""
  // for the one shown), in the order the ids first appeared; only where
  // some checkpoint holds another message. The history's own id at p
  // appears with the first checkpoint that agrees past p (reached: the
  // furthest any did so far). One pass over the checkpoints' deltas
  // (checkpointset.ts), not over their whole lists.
  const { same, at: other } = set.agreement(hist);
  const versions = new Map<number, Map<string, string>>();
  let reached = 0;
  set.list.forEach((c, i) => {
    for (; reached < same[i]; reached++) {
      const v = versions.get(reached);
      if (v && !v.has(hist[reached])) v.set(hist[reached], "");
    }
    const p = same[i];
    const id = other[i];
    if (id === undefined || p >= hist.length || ancestors.has(c.checkpoint_id)) return;
    let v = versions.get(p);
    if (!v) {
      v = new Map<string, string>(reached > p ? [[hist[p], ""]] : []);
      versions.set(p, v);
    }
    v.set(id, c.checkpoint_id);
  });
  for (const p of [...versions.keys()].sort((a, b) => a - b)) {
    const v = versions.get(p)!;
    if (v.size < 2) continue;
    const order = [...v.keys()];
    const i = order.indexOf(hist[p]);
    out.set(hist[p], { index: i + 1, count: order.length, prev: i > 0 ? v.get(order[i - 1]) : undefined, next: i + 1 < order.length ? v.get(order[i + 1]) : undefined });
  }
  return out;
}

// Versions remembers the versions it last found (branches) and finds them
// again only when what they come from changed: the messages shown (a new
// array whenever they change, state.ts), how many are left out before
// them, the head, or the checkpoints (a new array at each read). The page
// renders every frame while a reply streams, and branches walks every
// checkpoint: 2,000 of them each frame made typing slower in a long
// conversation than in a short one. Owned by the conversation's view.
export class Versions {
  private last?: { messages: Message[]; earlier: number; head: string; checkpoints: Checkpoint[]; found: Map<string, Branch> };

  of(messages: Message[], earlier: number, head: string, checkpoints: Checkpoint[]): Map<string, Branch> {
    const l = this.last;
    if (l && l.messages === messages && l.earlier === earlier && l.head === head && l.checkpoints === checkpoints) return l.found;
    const found = branches(messages, earlier, head, checkpoints);
    this.last = { messages, earlier, head, checkpoints, found };
    return found;
  }
}

// Points are where a new version of a message starts: for a request, the
// checkpoint before it (Edit sends the new text from there); for a reply,
// the checkpoint before it whose step is unfinished (Regenerate runs that
// step again from there). Both are on the current branch (ancestors of the
// head) and hold exactly the history before the message.
export interface Points {
  edit: Map<string, string>;
  regenerate: Map<string, string>;
}

// startPoints finds the points of the messages shown (see branches for
// messages and earlier). A message without one (a saved fragment, a reply
// whose step was never pending, a history the checkpoints do not tell) is
// left out: the page offers no Edit or Regenerate on it.
export function startPoints(messages: Message[], earlier: number, head: string, checkpoints: Checkpoint[]): Points {
  const out: Points = { edit: new Map(), regenerate: new Map() };
  const set = setOf(checkpoints);
  const hist = historyIDs(messages, earlier, set.get(head));
  if (hist.length === 0) return out;
  // The newest ancestor of the head with each length of history (and, for
  // regenerate, an unfinished step) whose ids are the history's start
  // (agreement: without making each ancestor's whole list).
  const { same } = set.agreement(hist);
  const before = new Map<number, string>();
  const pending = new Map<number, string>();
  const seen = new Set<string>();
  for (let at = set.get(head); at && !seen.has(at.checkpoint_id); at = at.parent_checkpoint_id ? set.get(at.parent_checkpoint_id) : undefined) {
    seen.add(at.checkpoint_id);
    const n = set.count(at);
    if (n >= hist.length || same[set.place(at)] !== n) continue;
    if (!before.has(n)) before.set(n, at.checkpoint_id);
    if (at.pending && !pending.has(n)) pending.set(n, at.checkpoint_id);
  }
  const offset = hist.length - messages.length;
  messages.forEach((m, i) => {
    const p = offset + i;
    if (m.role === "user" && before.has(p)) out.edit.set(m.message_id, before.get(p)!);
    if (m.role === "assistant" && m.kind !== "fragment" && pending.has(p)) out.regenerate.set(m.message_id, pending.get(p)!);
  });
  return out;
}

// leftBehind are the messages a move away from position p of the history
// shown leaves on the other branch: those at p and after.
export function leftBehind(messages: Message[], id: string): Message[] {
  const i = messages.findIndex((m) => m.message_id === id);
  return i < 0 ? [] : messages.slice(i);
}

// OtherBranch is one branch: its newest checkpoint (tip), where it leaves
// the history shown (from: a position in it), its message there and its
// last one, and how many messages it holds.
export interface OtherBranch {
  tip: Checkpoint;
  from: number;
  firstID: string;
  lastID: string;
  count: number;
}

// otherBranches finds the branches that are not the one shown (hist, the
// head's whole history), newest first: the checkpoints no other continues
// (a branch's newest point), but for the head's own line, each with what
// it holds of its own (a point that holds only the start of the history
// shown is no branch to switch to). Pure; unit-tested
// (static/test/versions.test.mjs).
export function otherBranches(checkpoints: Checkpoint[], head: string, hist: string[]): OtherBranch[] {
  const set = setOf(checkpoints);
  const parents = new Set<string>();
  for (const c of checkpoints) if (c.parent_checkpoint_id) parents.add(c.parent_checkpoint_id);
  const line = new Set<string>();
  for (let at = set.get(head); at && !line.has(at.checkpoint_id); at = at.parent_checkpoint_id ? set.get(at.parent_checkpoint_id) : undefined) {
    line.add(at.checkpoint_id);
  }
  const { same, at } = set.agreement(hist);
  const out: OtherBranch[] = [];
  for (const c of checkpoints) {
    if (parents.has(c.checkpoint_id) || line.has(c.checkpoint_id)) continue;
    const i = set.place(c);
    const firstID = at[i];
    if (firstID === undefined) continue;
    out.push({ tip: c, from: same[i], firstID, lastID: set.last(c) ?? firstID, count: set.count(c) });
  }
  return out.sort((a, b) => b.tip.state_version - a.tip.state_version);
}
