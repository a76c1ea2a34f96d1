// Unit tests of a message's versions (static/src/versions.ts): which
// messages of the history shown have other versions, where each stands,
// and which checkpoint the arrows move to.

import { test } from "node:test";
import assert from "node:assert/strict";
import { branches } from "../../bin/unit/versions.mjs";

function msg(id, role, checkpoint) {
  return { message_id: id, role, kind: "message", content: id, checkpoint_id: checkpoint, created_at: "2026-12-05T00:00:00Z" };
}

function cp(id, parent, ids, version) {
  return { checkpoint_id: id, parent_checkpoint_id: parent, state_version: version, message_ids: ids, pending: null, created_at: "2026-12-05T00:00:00Z" };
}

// A request A, its reply B, then B regenerated as B2 from the point after A.
const c0 = cp("c0", null, [], 1);
const c1 = cp("c1", "c0", ["A"], 2);
const c2 = cp("c2", "c1", ["A", "B"], 3);
const c3 = cp("c3", "c1", ["A", "B2"], 4);
const all = [c0, c1, c2, c3];

test("a regenerated reply has two versions, the first shown", () => {
  const got = branches([msg("A", "user", "c1"), msg("B", "assistant", "c2")], 0, "c2", all);
  assert.deepEqual([...got.keys()], ["B"]);
  assert.deepEqual(got.get("B"), { index: 1, count: 2, prev: undefined, next: "c3" });
});

test("on the other branch the same reply is version 2 of 2, back to the first", () => {
  const got = branches([msg("A", "user", "c1"), msg("B2", "assistant", "c3")], 0, "c3", all);
  assert.deepEqual(got.get("B2"), { index: 2, count: 2, prev: "c2", next: undefined });
  assert.equal(got.has("A"), false, "the request itself was not edited");
});

test("an edited request: versions at the request's position, moving to the newest point of each", () => {
  const c4 = cp("c4", "c0", ["A2"], 5);
  const c5 = cp("c5", "c4", ["A2", "C"], 6);
  const got = branches([msg("A", "user", "c1"), msg("B", "assistant", "c2")], 0, "c2", [...all, c4, c5]);
  // c5 is the newest checkpoint holding A2 at position 0: the arrow goes there.
  assert.deepEqual(got.get("A"), { index: 1, count: 2, prev: undefined, next: "c5" });
  assert.deepEqual(got.get("B"), { index: 1, count: 2, prev: undefined, next: "c3" });
});

test("an ancestor of the head that differs (a fragment deleted since) is not a version", () => {
  // c2 held a saved fragment F after A; deleting it made c6 [A, B] from c2.
  const withFragment = cp("c2", "c1", ["A", "F"], 3);
  const c6 = cp("c6", "c2", ["A", "B"], 4);
  const got = branches([msg("A", "user", "c1"), msg("B", "assistant", "c6")], 0, "c6", [c0, c1, withFragment, c6]);
  assert.equal(got.size, 0);
});

test("with earlier messages left out and no head checkpoint known, nothing is claimed", () => {
  const got = branches([msg("B", "assistant", "c2")], 1, "c9", all);
  assert.equal(got.size, 0);
});

test("with earlier messages left out, positions are the whole history's (the head's list)", () => {
  const got = branches([msg("B", "assistant", "c2")], 1, "c2", all);
  assert.deepEqual(got.get("B"), { index: 1, count: 2, prev: undefined, next: "c3" });
});

test("no checkpoints read yet: no versions", () => {
  assert.equal(branches([msg("A", "user", "c1")], 0, "c1", []).size, 0);
});
