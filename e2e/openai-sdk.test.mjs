// The OpenAI Responses API (docs/openai-api.md) driven by OpenAI's own
// Node SDK (the `openai` package) against the real binary, with the
// gateway's API tokens as the SDK's API key: a background response
// streamed, dropped and resumed with starting_after; a cancel mid-stream
// and its receipt; previous_response_id continuing and branching the
// thread; the refusals (an unknown model, parameters the gateway does not
// take, another user's ids). The Go SDK does the same in
// main_responses_test.go. No browser: the page is not the subject.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { binary, startServer } from "./harness.mjs";

let server, dir, tokens;

// account creates a user with `gateway user add` and an API token for it
// with `gateway token create`, as an operator does; it returns the token.
function account(db, name) {
  execFileSync(binary(), ["user", "add", name, "-db", db], { input: `${name}'s long password\n`, stdio: ["pipe", "ignore", "ignore"] });
  return execFileSync(binary(), ["token", "create", "-user", name, "-db", db], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).trim();
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "gateway-openai-sdk-"));
  const db = join(dir, "gw.db");
  tokens = { alice: account(db, "alice"), bob: account(db, "bob") };
  server = await startServer({ db, pace: "15ms", args: ["-auth", "password"] });
});

after(async () => {
  try {
    assert.match(server?.check() ?? "ok", /^ok/);
  } finally {
    await server?.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

// client is the SDK pointed at the gateway: every option given (it reads
// OPENAI_* variables otherwise), nothing retried, so that what the test
// sees is what the gateway answered.
const client = (apiKey) =>
  new OpenAI({ baseURL: server.url + "/v1", apiKey, organization: null, project: null, maxRetries: 0, timeout: 60000 });

// api calls the gateway's own API as alice.
async function api(path) {
  const r = await fetch(server.url + path, { headers: { Authorization: `Bearer ${tokens.alice}` } });
  const body = await r.json();
  assert.equal(r.status, 200, `GET ${path}: ${JSON.stringify(body)}`);
  return body;
}
const history = async (threadID) => (await api(`/api/threads/${threadID}`)).messages.map((m) => m.content);

// read collects a stream's events, until stop says so (the stream is then
// dropped: the SDK aborts the request) or its end.
async function read(stream, stop = () => false) {
  const out = [];
  for await (const ev of stream) {
    out.push(ev);
    if (stop(ev)) break;
  }
  return out;
}
const deltas = (evs) => evs.filter((e) => e.type === "response.output_text.delta").map((e) => e.delta).join("");
function numbered(evs, what) {
  evs.forEach((e, i) => assert.equal(e.sequence_number, i, `${what}: event ${i} (${e.type}) is numbered ${e.sequence_number}`));
}

// refused requires the SDK's APIError with status, code and param.
async function refused(promise, status, code, param, what) {
  await assert.rejects(promise, (e) => {
    assert.ok(e instanceof OpenAI.APIError, `${what}: ${e}`);
    assert.equal(e.status, status, `${what}: ${e.message}`);
    assert.equal(e.code, code, `${what}: ${e.message}`);
    assert.equal(e.param ?? null, param, `${what}: ${e.message}`);
    assert.ok(e.error?.message, `${what}: a message`);
    return true;
  });
}

test("the OpenAI Node SDK streams, resumes, cancels and continues responses", { timeout: 120000 }, async () => {
  const alice = client(tokens.alice);
  const models = await alice.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ["demo"]);

  // A background response, streamed; dropped after three deltas, then
  // resumed after the last event received.
  const question = "How were lighthouses kept lit before electricity?";
  let n = 0;
  const first = await read(
    await alice.responses.create({ model: "demo", input: question, background: true, stream: true, metadata: { suite: "node" } }),
    (e) => e.type === "response.output_text.delta" && ++n === 3,
  );
  assert.equal(first[0].type, "response.created");
  const id = first[0].response.id;
  assert.match(id, /^resp_run_/);
  const rest = await read(await alice.responses.retrieve(id, { stream: true, starting_after: first.at(-1).sequence_number }));
  const all = [...first, ...rest];
  numbered(all, "the dropped and resumed stream");
  assert.equal(all.at(-1).type, "response.completed");
  const r1 = await alice.responses.retrieve(id);
  assert.equal(r1.status, "completed");
  assert.equal(r1.metadata.suite, "node");
  assert.ok(r1.output_text.length > 0);
  assert.equal(deltas(all), r1.output_text, "the deltas are exactly the published text");
  const threadID = r1.gateway.thread_id;
  assert.deepEqual(await history(threadID), [question, r1.output_text]);

  // previous_response_id continues the thread: the second reply's context
  // holds the first exchange.
  const r2 = await alice.responses.create({ model: "demo", input: "and what about foghorns?", previous_response_id: id, instructions: "Answer briefly." });
  assert.equal(r2.status, "completed");
  assert.equal(r2.previous_response_id, id);
  assert.equal(r2.instructions, "Answer briefly.");
  assert.deepEqual(await history(threadID), [question, r1.output_text, "and what about foghorns?", r2.output_text]);

  // A cancel mid-stream: the stream ends with the cancel, nothing was
  // published, and the receipt says what the gateway's own API says.
  const endless = "endless: the history of lighthouses";
  const stream = await alice.responses.create({ model: "demo", input: endless, background: true, stream: true, previous_response_id: r2.id });
  const streamed = [];
  let stopped;
  for await (const ev of stream) {
    streamed.push(ev);
    if (ev.type === "response.output_text.delta" && !stopped) stopped = await alice.responses.cancel(streamed[0].response.id);
  }
  numbered(streamed, "the cancelled stream");
  assert.equal(streamed.at(-1).type, "response.cancelled");
  assert.ok(!streamed.some((e) => e.type.endsWith(".done")), "nothing of a cancelled reply is published");
  assert.equal(stopped.status, "cancelled");
  assert.deepEqual(stopped.output, []);
  const receipt = stopped.gateway.receipt;
  const run = await api(`/api/runs/${stopped.gateway.run_id}`);
  assert.equal(run.status, "cancelled");
  assert.equal(receipt.discarded_stream_chars, run.discarded_stream_chars);
  assert.equal(receipt.resume_checkpoint_id, run.resume_checkpoint_id);
  assert.equal(receipt.cancel_reason, run.cancel_reason);
  assert.equal(receipt.requested_by, run.requested_by);
  assert.ok(receipt.discarded_stream_chars >= [...deltas(streamed)].length, "every streamed character is counted as discarded");
  assert.deepEqual(receipt.operations, []);
  assert.deepEqual(streamed.at(-1).response.gateway.receipt.discarded_stream_chars, receipt.discarded_stream_chars);
  assert.deepEqual(await history(threadID), [question, r1.output_text, "and what about foghorns?", r2.output_text, endless]);

  // A response that is no longer the head is continued as a branch.
  const r3 = await alice.responses.create({ model: "demo", input: [{ role: "user", content: "and lightships?" }], previous_response_id: id });
  assert.equal(r3.status, "completed");
  assert.deepEqual(await history(threadID), [question, r1.output_text, "and lightships?", r3.output_text]);
});

test("the OpenAI Node SDK is refused what the gateway does not do, and other users' ids", { timeout: 60000 }, async () => {
  const alice = client(tokens.alice);
  const bob = client(tokens.bob);
  const done = await alice.responses.create({ model: "demo", input: "hello" });
  const before = await history(done.gateway.thread_id);
  await refused(alice.responses.create({ model: "gpt-4o", input: "hello" }), 404, "model_not_found", "model", "an unknown model");
  await refused(alice.responses.create({ model: "demo", input: "hello", temperature: 0.2 }), 400, "invalid_request", "temperature", "temperature");
  await refused(
    alice.responses.create({ model: "demo", input: "hello", tools: [{ type: "function", name: "lookup", parameters: { type: "object" }, strict: false }] }),
    400, "invalid_request", "tools", "tools",
  );
  await refused(alice.responses.create({ model: "demo", input: [{ role: "system", content: "be terse" }] }), 400, "invalid_request", "input[0].role", "a system item");
  const unknown = "resp_run_00000000000000000000000000";
  for (const [who, rid] of [[bob, done.id], [alice, unknown]]) {
    await refused(who.responses.retrieve(rid), 404, "not_found", null, `retrieve ${rid}`);
    await refused(who.responses.cancel(rid), 404, "not_found", null, `cancel ${rid}`);
    await refused(who.responses.retrieve(rid, { stream: true, starting_after: 0 }), 404, "not_found", null, `stream ${rid}`);
    await refused(who.responses.create({ model: "demo", input: "mine now", previous_response_id: rid }), 404, "not_found", "previous_response_id", `continue ${rid}`);
  }
  await refused(client(tokens.alice + "x").responses.retrieve(done.id), 401, "unauthorized", null, "a wrong key");
  assert.deepEqual(await history(done.gateway.thread_id), before, "the refusals changed nothing");
});
