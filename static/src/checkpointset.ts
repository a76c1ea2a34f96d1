// The thread's checkpoints as the page keeps them. Each checkpoint's
// message ids hold the whole conversation up to it, so whole lists grow
// with the number of checkpoints times the conversation's length (a
// 2,000-message conversation: 78 MB of JSON). The page reads them as what
// each adds to its parent's (GET …/checkpoints?lists=delta, docs/http-api.md)
// and keeps them that way: a checkpoint's whole list is made only when
// something asks for its message_ids (and kept), and what the page asks
// of every checkpoint at once — how far each agrees with the history
// shown (versions.ts) — is answered from the deltas in one pass.
// Pure: no DOM, unit-tested (static/test/checkpointset.test.mjs).

import type { Checkpoint, CheckpointDelta } from "./protocol";

// Node is a checkpoint's place in the set: the parent its list continues
// (none: the list is add alone), how much of it the list keeps, what it
// adds, and its whole list once made.
interface Node {
  cp: Checkpoint;
  index: number;
  parent?: Node;
  keep: number;
  add: string[];
  count: number;
  whole?: string[];
}

// Agreement is how far each checkpoint (by its place in the list) agrees
// with a history: same, how many of its first ids are the history's; at,
// its id at position same (undefined: its list ends there).
export interface Agreement {
  same: Int32Array;
  at: (string | undefined)[];
}

// CheckpointSet holds one reading of the checkpoints, oldest first.
// Immutable once made; its list is what the page hands around as
// Checkpoint[] (each message_ids a getter that makes the list on first use).
export class CheckpointSet {
  readonly list: Checkpoint[] = [];
  private readonly nodes = new Map<string, Node>();
  private agreed: { hist: string[]; a: Agreement } | null = null;
  private lineage: { id: string; ids: ReadonlySet<string> } | null = null;

  private constructor() {}

  // fromDeltas keeps the checkpoints of a ?lists=delta answer.
  static fromDeltas(deltas: CheckpointDelta[]): CheckpointSet {
    const set = new CheckpointSet();
    for (const d of deltas) {
      const parent = d.parent_checkpoint_id ? set.nodes.get(d.parent_checkpoint_id) : undefined;
      // (A parent is always listed first; one that is not leaves the kept
      // part unknown: only what the checkpoint added is known.)
      const keep = parent ? Math.min(d.message_ids_kept, parent.count) : 0;
      const cp: Checkpoint = { checkpoint_id: d.checkpoint_id, parent_checkpoint_id: d.parent_checkpoint_id, state_version: d.state_version, pending: d.pending, created_at: d.created_at, message_ids: [] };
      set.add(cp, parent, keep, d.message_ids_added ?? []);
    }
    sets.set(set.list, set);
    return set;
  }

  // fromWhole keeps checkpoints read with their lists whole (each stays as
  // given), finding what each adds to its parent's.
  static fromWhole(checkpoints: Checkpoint[]): CheckpointSet {
    const set = new CheckpointSet();
    for (const c of checkpoints) {
      const parent = c.parent_checkpoint_id ? set.nodes.get(c.parent_checkpoint_id) : undefined;
      const ids = c.message_ids;
      let keep = 0;
      if (parent) {
        const p = set.ids(parent);
        while (keep < p.length && keep < ids.length && p[keep] === ids[keep]) keep++;
      }
      const n = set.add({ ...c }, parent, keep, ids.slice(keep));
      n.whole = ids;
    }
    return set;
  }

  private add(cp: Checkpoint, parent: Node | undefined, keep: number, add: string[]): Node {
    const n: Node = { cp, index: this.list.length, parent, keep, add, count: keep + add.length };
    Object.defineProperty(cp, "message_ids", { get: () => this.ids(n), enumerable: true, configurable: true });
    this.nodes.set(cp.checkpoint_id, n);
    this.list.push(cp);
    return n;
  }

  get(id: string): Checkpoint | undefined {
    return this.nodes.get(id)?.cp;
  }

  // count is how many messages checkpoint c's history holds.
  count(c: Checkpoint): number {
    return this.nodes.get(c.checkpoint_id)?.count ?? c.message_ids.length;
  }

  // idAt is the id at position i of checkpoint c's history.
  idAt(c: Checkpoint, i: number): string | undefined {
    for (let n = this.nodes.get(c.checkpoint_id); n && i < n.count; n = n.parent) {
      if (n.whole) return n.whole[i];
      if (i >= n.keep) return n.add[i - n.keep];
    }
    return undefined;
  }

  // last is the id of the last message of checkpoint c's history.
  last(c: Checkpoint): string | undefined {
    const n = this.count(c);
    return n ? this.idAt(c, n - 1) : undefined;
  }

  // ids makes n's whole list (and keeps it).
  private ids(n: Node): string[] {
    if (n.whole) return n.whole;
    const out = new Array<string>(n.count);
    let end = n.count; // positions [0, end) are still to fill
    for (let at: Node | undefined = n; at && end > 0; at = at.parent) {
      if (at.whole) {
        for (let i = 0; i < end; i++) out[i] = at.whole[i];
        end = 0;
        break;
      }
      for (let i = Math.min(end, at.count) - 1; i >= at.keep; i--) out[i] = at.add[i - at.keep];
      end = Math.min(end, at.keep);
    }
    n.whole = out;
    return out;
  }

  // agreement tells, for every checkpoint, how far it agrees with hist,
  // in one pass over the deltas: a checkpoint that keeps no more of its
  // parent's list than agrees with hist agrees that far and on through
  // what it adds; one that keeps more differs where its parent does. The
  // last answer is kept for the same hist (the head's list, one array).
  agreement(hist: string[]): Agreement {
    if (this.agreed && this.agreed.hist === hist) return this.agreed.a;
    const a: Agreement = { same: new Int32Array(this.list.length), at: new Array(this.list.length) };
    for (const c of this.list) {
      const n = this.nodes.get(c.checkpoint_id)!;
      const p = n.parent;
      let same: number;
      let at: string | undefined;
      if (p && n.keep > a.same[p.index]) {
        same = a.same[p.index];
        at = a.at[p.index];
      } else {
        same = n.keep; // (0 without a parent)
        let j = 0;
        while (j < n.add.length && same < hist.length && n.add[j] === hist[same]) {
          j++;
          same++;
        }
        at = n.add[j];
      }
      a.same[n.index] = same;
      a.at[n.index] = at;
    }
    this.agreed = { hist, a };
    return a;
  }

  // ancestors are the ids of checkpoint id and of the checkpoints before
  // it (its parent, theirs …); the last answer is kept for the same id.
  ancestors(id: string): ReadonlySet<string> {
    if (this.lineage && this.lineage.id === id) return this.lineage.ids;
    const ids = new Set<string>();
    for (let at = this.nodes.get(id)?.cp; at && !ids.has(at.checkpoint_id); at = at.parent_checkpoint_id ? this.get(at.parent_checkpoint_id) : undefined) {
      ids.add(at.checkpoint_id);
    }
    this.lineage = { id, ids };
    return ids;
  }

  // place is checkpoint c's place in the list (-1: not in it).
  place(c: Checkpoint): number {
    return this.nodes.get(c.checkpoint_id)?.index ?? -1;
  }
}

// sets maps the lists of the sets read (fromDeltas) to their set.
const sets = new WeakMap<Checkpoint[], CheckpointSet>();

// setOf is the set checkpoints is the list of, or one made from them
// (whole lists, e.g. in tests), kept for the next call with the same list.
export function setOf(checkpoints: Checkpoint[]): CheckpointSet {
  let set = sets.get(checkpoints);
  if (!set) {
    set = CheckpointSet.fromWhole(checkpoints);
    sets.set(checkpoints, set);
  }
  return set;
}
