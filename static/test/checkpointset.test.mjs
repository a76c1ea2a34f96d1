// Unit tests of the checkpoints as the page keeps them
// (static/src/checkpointset.ts): read as deltas (GET …/checkpoints?lists=delta)
// they give the same lists, and the same versions and start points
// (versions.ts), as the whole lists, on random trees of branches and
// deleted drafts, checked against the whole-list algorithm they replace.

import { test } from "node:test";
import assert from "node:assert/strict";
import { CheckpointSet, setOf } from "../../bin/unit/checkpointset.mjs";
import { branches, startPoints } from "../../bin/unit/versions.mjs";

// rng is a small deterministic generator (the same trees every run).
function rng(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

// tree makes n checkpoints (oldest first) as a conversation makes them:
// mostly a message appended to the head, sometimes a new branch from an
// older point (an edit, a regenerate), a checkout of another branch, or a
// message removed from the middle (a deleted draft).
function tree(n, seed) {
  const r = rng(seed);
  const cps = [{ checkpoint_id: "c0", parent_checkpoint_id: null, state_version: 1, message_ids: [], pending: null, created_at: "2026-12-05T00:00:00Z" }];
  let head = cps[0];
  let msg = 0;
  for (let i = 1; i < n; i++) {
    const x = r();
    let parent = head;
    let ids;
    if (x < 0.12 && cps.length > 2) {
      parent = cps[Math.floor(r() * cps.length)];
      ids = [...parent.message_ids, `m${msg++}`];
    } else if (x < 0.16 && head.message_ids.length > 2) {
      const at = Math.floor(r() * head.message_ids.length);
      ids = head.message_ids.filter((_, j) => j !== at);
    } else {
      ids = [...head.message_ids, `m${msg++}`];
    }
    const c = { checkpoint_id: `c${i}`, parent_checkpoint_id: parent.checkpoint_id, state_version: i + 1, message_ids: ids, pending: r() < 0.5 ? { step: "generate", input_hash: "h" } : null, created_at: "2026-12-05T00:00:00Z" };
    cps.push(c);
    head = r() < 0.05 ? cps[Math.floor(r() * cps.length)] : c;
  }
  return { cps, head: head.checkpoint_id };
}

// deltas is what the server answers for cps with ?lists=delta.
function deltas(cps) {
  const byID = new Map(cps.map((c) => [c.checkpoint_id, c]));
  return cps.map((c) => {
    const p = c.parent_checkpoint_id ? byID.get(c.parent_checkpoint_id).message_ids : [];
    let keep = 0;
    while (keep < p.length && keep < c.message_ids.length && p[keep] === c.message_ids[keep]) keep++;
    return {
      checkpoint_id: c.checkpoint_id,
      thread_id: "thr_t",
      parent_checkpoint_id: c.parent_checkpoint_id,
      state_version: c.state_version,
      message_ids_kept: keep,
      message_ids_added: c.message_ids.slice(keep),
      completed_steps_kept: 0,
      completed_steps_added: [],
      tool_results_kept: 0,
      tool_results_added: [],
      pending: c.pending,
      run_id: null,
      created_at: c.created_at,
    };
  });
}

// reference is branches as it was written over whole lists (every
// checkpoint compared position by position with the history).
function reference(hist, head, checkpoints) {
  const out = new Map();
  const byID = new Map(checkpoints.map((c) => [c.checkpoint_id, c]));
  const ancestors = new Set();
  for (let at = byID.get(head); at && !ancestors.has(at.checkpoint_id); at = at.parent_checkpoint_id ? byID.get(at.parent_checkpoint_id) : undefined) ancestors.add(at.checkpoint_id);
  const versions = hist.map(() => new Map());
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

const msg = (id, i) => ({ message_id: id, role: i % 2 ? "assistant" : "user", kind: "text", content: id, checkpoint_id: "", created_at: "2026-12-05T00:00:00Z" });

test("read as deltas, every checkpoint's list, count and last id are the whole list's", () => {
  for (let seed = 1; seed <= 20; seed++) {
    const { cps } = tree(120, seed);
    const set = CheckpointSet.fromDeltas(deltas(cps));
    assert.equal(set.list.length, cps.length);
    cps.forEach((c, i) => {
      const got = set.list[i];
      assert.equal(set.count(got), c.message_ids.length);
      assert.equal(set.last(got), c.message_ids[c.message_ids.length - 1]);
      assert.equal(set.idAt(got, Math.floor(c.message_ids.length / 2)), c.message_ids[Math.floor(c.message_ids.length / 2)]);
      assert.deepEqual(got.message_ids, c.message_ids, `seed ${seed}, ${c.checkpoint_id}`);
      assert.equal(got.pending, c.pending);
    });
    assert.equal(setOf(set.list), set, "the list read is known as its set");
  }
});

test("versions and start points from deltas are those of the whole lists, with all or only the latest messages shown", () => {
  for (let seed = 1; seed <= 40; seed++) {
    const { cps, head } = tree(150, seed);
    const hist = cps.find((c) => c.checkpoint_id === head).message_ids;
    const read = CheckpointSet.fromDeltas(deltas(cps)).list;
    for (const earlier of [0, Math.floor(hist.length / 2)]) {
      const shown = hist.slice(earlier).map(msg);
      if (shown.length === 0) continue;
      const want = reference(hist, head, cps);
      assert.deepEqual(branches(shown, earlier, head, read), branches(shown, earlier, head, cps), `seed ${seed}: deltas and whole lists agree`);
      const got = branches(shown, earlier, head, read);
      for (const [id, b] of got) assert.deepEqual(b, want.get(id), `seed ${seed}, ${id}`);
      assert.equal(got.size, [...want.keys()].length, `seed ${seed}: as many versions as the whole-list algorithm finds`);
      assert.deepEqual(startPoints(shown, earlier, head, read), startPoints(shown, earlier, head, cps), `seed ${seed}: start points`);
    }
  }
});

test("a long conversation read as deltas makes no whole list but the head's", () => {
  const { cps, head } = tree(2000, 7);
  const read = CheckpointSet.fromDeltas(deltas(cps)).list;
  const made = new Set();
  for (const c of read) {
    const get = Object.getOwnPropertyDescriptor(c, "message_ids").get;
    Object.defineProperty(c, "message_ids", {
      get() {
        made.add(c.checkpoint_id);
        return get();
      },
    });
  }
  const hist = cps.find((c) => c.checkpoint_id === head).message_ids;
  const shown = hist.slice(-200).map(msg);
  branches(shown, hist.length - shown.length, head, read);
  startPoints(shown, hist.length - shown.length, head, read);
  assert.deepEqual([...made], [head]);
});
