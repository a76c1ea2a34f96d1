// Unit tests of a message's versions (static/src/versions.ts): which
// messages of the history shown have other versions, where each stands,
// and which checkpoint the arrows move to.

import { test } from "node:test";
import assert from "node:assert/strict";
import { branches, startPoints, leftBehind, otherBranches, Versions } from "../../bin/unit/versions.mjs";

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

test("Versions finds them again only when the messages, the head or the checkpoints read changed", () => {
  const v = new Versions();
  const shown = [msg("A", "user", "c1"), msg("B", "assistant", "c2")];
  const first = v.of(shown, 0, "c2", all);
  assert.equal(v.of(shown, 0, "c2", all), first, "the same inputs: the same answer, not found again");
  assert.deepEqual(first.get("B"), { index: 1, count: 2, prev: undefined, next: "c3" });
  // A new read with one more version of B: found again.
  const c4 = cp("c4", "c1", ["A", "B3"], 5);
  const again = v.of(shown, 0, "c2", [...all, c4]);
  assert.notEqual(again, first);
  assert.deepEqual(again.get("B"), { index: 1, count: 3, prev: undefined, next: "c3" });
  // The other branch shown (new messages, new head): found for it.
  const other = v.of([msg("A", "user", "c1"), msg("B2", "assistant", "c3")], 0, "c3", [...all, c4]);
  assert.deepEqual(other.get("B2"), { index: 2, count: 3, prev: "c2", next: "c4" });
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

// Where Edit and Regenerate start: the checkpoint before the message, on
// the current branch; Regenerate only where that step was unfinished.
function pending(c) {
  return { ...c, pending: { step: "generate", input_hash: "h" } };
}

test("Edit starts before the request, Regenerate from the unfinished step before the reply", () => {
  const p1 = pending(c1);
  const got = startPoints([msg("A", "user", "c1"), msg("B", "assistant", "c2")], 0, "c2", [c0, p1, c2, c3]);
  assert.deepEqual([...got.edit], [["A", "c0"]]);
  assert.deepEqual([...got.regenerate], [["B", "c1"]]);
});

test("a reply whose step was never pending, and a saved fragment, get no Regenerate", () => {
  const frag = { ...msg("F", "assistant", "c2"), kind: "fragment" };
  const got = startPoints([msg("A", "user", "c1"), frag], 0, "c2", [c0, pending(c1), cp("c2", "c1", ["A", "F"], 3)]);
  assert.equal(got.regenerate.size, 0);
  const plain = startPoints([msg("A", "user", "c1"), msg("B", "assistant", "c2")], 0, "c2", all);
  assert.equal(plain.regenerate.size, 0, "c1 had no unfinished step");
});

test("points lie on the current branch: another branch's checkpoint with the same start is not one", () => {
  // c3 (another branch) also holds [A, …]; on the branch of c3 the point
  // before B2 is c1, an ancestor, and c2's line is not walked.
  const got = startPoints([msg("A", "user", "c1"), msg("B2", "assistant", "c3")], 0, "c3", [c0, pending(c1), c2, c3]);
  assert.deepEqual([...got.regenerate], [["B2", "c1"]]);
  assert.deepEqual([...got.edit], [["A", "c0"]]);
});

test("with earlier messages left out, points use the whole history's positions", () => {
  const got = startPoints([msg("B", "assistant", "c2")], 1, "c2", [c0, pending(c1), c2]);
  assert.deepEqual([...got.regenerate], [["B", "c1"]]);
  assert.equal(startPoints([msg("B", "assistant", "c2")], 1, "c9", [c0, pending(c1), c2]).regenerate.size, 0, "the head unknown: nothing");
});

test("leftBehind is the message and all after it", () => {
  const ms = [msg("A", "user", "c1"), msg("B", "assistant", "c2"), msg("C", "user", "c4")];
  assert.deepEqual(leftBehind(ms, "B").map((m) => m.message_id), ["B", "C"]);
  assert.deepEqual(leftBehind(ms, "Z"), []);
});

// Other branches: the newest point of each line that is not the head's,
// where it leaves the history shown, newest first.
test("other branches are the other lines' newest points, where each leaves the history", () => {
  const c4 = cp("c4", "c0", ["A2"], 5);
  const c5 = cp("c5", "c4", ["A2", "C"], 6);
  const got = otherBranches([...all, c4, c5], "c2", ["A", "B"]);
  assert.deepEqual(
    got.map((b) => [b.tip.checkpoint_id, b.from, b.firstID, b.lastID, b.count]),
    [
      ["c5", 0, "A2", "C", 2],
      ["c3", 1, "B2", "B2", 2],
    ],
  );
});

test("a line that goes on past the head is another branch from the end of the history; a point holding only its start is none", () => {
  // The head was moved back to c1: c2 (its continuation) and c3 are
  // branches; c1's own copy c6 (a continue that was cancelled) holds
  // nothing of its own.
  const c6 = cp("c6", "c1", ["A"], 7);
  const got = otherBranches([...all, c6], "c1", ["A"]);
  assert.deepEqual(got.map((b) => [b.tip.checkpoint_id, b.from, b.firstID]), [
    ["c3", 1, "B2"],
    ["c2", 1, "B"],
  ]);
});

test("a conversation of one line has no other branches", () => {
  assert.deepEqual(otherBranches([c0, c1, c2], "c2", ["A", "B"]), []);
});
