// A message's versions: a request before and after it was edited, a reply
// before and after it was regenerated, found in the thread's checkpoints.
// Pure: no DOM, unit-tested (static/test/versions.test.mjs).

import type { Checkpoint, Message } from "./protocol";
import { historyIDs } from "./history";

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
  const hist = historyIDs(messages, earlier, checkpoints.find((c) => c.checkpoint_id === head));
  if (hist.length === 0 || checkpoints.length === 0) return out;
  const byID = new Map(checkpoints.map((c) => [c.checkpoint_id, c]));
  const ancestors = new Set<string>();
  let at = byID.get(head) ?? byID.get(messages[messages.length - 1].checkpoint_id);
  while (at && !ancestors.has(at.checkpoint_id)) {
    ancestors.add(at.checkpoint_id);
    at = at.parent_checkpoint_id ? byID.get(at.parent_checkpoint_id) : undefined;
  }
  // versions[p]: message id → the newest checkpoint holding it at p ("" for
  // the one shown), in the order the ids first appeared.
  const versions = hist.map(() => new Map<string, string>());
  for (const c of checkpoints) {
    const ids = c.message_ids;
    let same = 0;
    while (same < ids.length && same < hist.length && ids[same] === hist[same]) {
      if (!versions[same].has(hist[same])) versions[same].set(hist[same], "");
      same++;
    }
    if (same < ids.length && same < hist.length && !ancestors.has(c.checkpoint_id)) versions[same].set(ids[same], c.checkpoint_id);
  }
  versions.forEach((v, p) => {
    if (v.size < 2) return;
    const order = [...v.keys()];
    const i = order.indexOf(hist[p]);
    out.set(hist[p], { index: i + 1, count: order.length, prev: i > 0 ? v.get(order[i - 1]) : undefined, next: i + 1 < order.length ? v.get(order[i + 1]) : undefined });
  });
  return out;
}
