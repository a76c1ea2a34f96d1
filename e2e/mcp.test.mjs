import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync, readFileSync, existsSync, openSync, writeSync, closeSync, lstatSync, constants } from "node:fs";
import { execFileSync } from "node:child_process";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { serveForFile, openPage, shot, shots, send, runStatus, messageTexts, eventually } from "./harness.mjs";

// MCP servers from npm (installed by npm ci), started by the gateway over
// stdio: the reference "everything" server (a long operation with progress)
// and the memory server (a tool without hints, so consequential), twice:
// once as it is, once with its graph file a FIFO the test holds; and one
// that cannot start.
const modules = join(dirname(fileURLToPath(import.meta.url)), "..", "node_modules", "@modelcontextprotocol");
const dir = mkdtempSync(join(tmpdir(), "gateway-e2e-mcp-"));
const memory = join(dir, "memory.jsonl");
// The held memory server reads its graph before it applies a write; its
// graph file is a FIFO, so it waits in that read, with the call in hand,
// until the test writes the graph.
const heldGraph = join(dir, "held.jsonl");
execFileSync("mkfifo", [heldGraph]);
const config = join(dir, "tools.json");
writeFileSync(
  config,
  JSON.stringify({
    mcp_servers: [
      { name: "everything", command: "node", args: [join(modules, "server-everything", "dist", "index.js"), "stdio"] },
      { name: "memory", command: "node", args: [join(modules, "server-memory", "dist", "index.js")], env: { MEMORY_FILE_PATH: memory } },
      { name: "held", command: "node", args: [join(modules, "server-memory", "dist", "index.js")], env: { MEMORY_FILE_PATH: heldGraph } },
      // A server that cannot start (its script is missing): the gateway
      // serves without it, keeps trying, and says so.
      { name: "broken", command: "node", args: [join(dir, "missing-server.js")] },
    ],
  }),
);

let server, browser;
serveForFile({ pace: "15ms", args: ["-tools-config", config] }, (s, b) => ([server, browser] = [s, b]), {
  cleanup: () => rmSync(dir, { recursive: true, force: true }),
});

const entities = (name) => (existsSync(memory) ? readFileSync(memory, "utf8").split(`"name":"${name}"`).length - 1 : 0);

test("an MCP tool without hints asks for confirmation, shows its arguments, and acts once", async () => {
  const { page, errors } = await openPage(browser, { thread: server.url });
  await send(page, 'use memory__create_entities with {"entities": [{"name": "Ada Lovelace", "entityType": "person", "observations": ["wrote the first published program", "worked with Charles Babbage"]}]}');
  const card = page.getByTestId("confirm-card");
  await card.waitFor({ timeout: 20000 });
  await runStatus(page, "waiting_confirmation");
  assert.equal(await card.getByTestId("preview-server").textContent(), "memory");
  assert.equal(await card.getByTestId("preview-tool").textContent(), "create_entities");
  const args = JSON.parse(await card.getByTestId("preview-arguments").textContent());
  assert.equal(args.entities[0].name, "Ada Lovelace");
  assert.equal(await card.getByTestId("confirm-op").textContent(), "Confirm and run");
  assert.equal(entities("Ada Lovelace"), 0, "nothing happens before the confirmation");
  await shots(page, "mcp-confirm-card");
  await card.getByTestId("confirm-op").click();
  await runStatus(page, "idle", 20000);
  const history = await messageTexts(page);
  assert.deepEqual(history.map((m) => m.role), ["user", "assistant", "tool", "assistant"]);
  assert.match(history[3].text, /The memory__create_entities tool returned/);
  assert.equal(entities("Ada Lovelace"), 1, "confirmed once, acted once");
  // The step names the system that took the call: the server, not "the provider".
  assert.equal(await page.getByTestId("tool-status").textContent(), "Carried out. The memory server took the memory__create_entities call. It cannot be undone.");
  assert.deepEqual(errors, []);
  await page.close();
});

test("an MCP call whose outcome nobody knows says the server cannot be asked, not that the gateway keeps asking", async () => {
  const { page, errors, url } = await openPage(browser, { thread: server.url });
  // A tool without hints (consequential) that needs an MCP task: the
  // server answers isError, which may mean it acted partway.
  await send(page, 'use everything__simulate-research-query with {"topic": "fencing tokens"}');
  const card = page.getByTestId("confirm-card");
  await card.waitFor({ timeout: 20000 });
  await card.getByTestId("confirm-op").click();
  await runStatus(page, "idle", 20000);
  const step = page.getByTestId("tool-status");
  await step.waitFor();
  assert.equal(await step.getAttribute("data-state"), "unknown_given_up");
  const text = await step.textContent();
  assert.match(text, /^Unknown\. The everything__simulate-research-query call may have been carried out: the everything server has not confirmed whether it was, and the gateway is not asking it\. Check its records for key /);
  assert.doesNotMatch(text, /keeps asking/);
  const threadID = new URL(url).pathname.split("/").pop();
  const ops = (await server.api(`/api/threads/${threadID}/operations`)).operations;
  assert.equal(ops[0].phase, "unknown");
  assert.ok(!ops[0].reconcile_next_at && ops[0].reconcile_until, "no lookup scheduled");
  await shots(page, "mcp-unknown");
  assert.deepEqual(errors, []);
  await page.close();
});

test("a long MCP call fills its progress bar from the server's notifications, and Cancel stops it", async () => {
  const { page, errors } = await openPage(browser, { thread: server.url });
  await send(page, 'use everything__trigger-long-running-operation with {"duration": 40, "steps": 40}');
  const progress = page.getByTestId("tool-progress");
  await progress.waitFor({ timeout: 20000 });
  // The bar becomes determinate once a progress report arrived.
  await page.waitForFunction(() => {
    const bar = document.querySelector("[data-testid=tool-progress] progress");
    return bar && bar.max === 40 && bar.value >= 1;
  }, null, { timeout: 20000 });
  assert.match(await page.getByTestId("tool-elapsed").textContent(), /^\d+ of 40 · /);
  await shots(page, "mcp-progress");
  await page.getByTestId("cancel").click();
  await page.getByTestId("receipt").waitFor({ timeout: 15000 });
  const line = page.getByTestId("receipt-operation");
  assert.equal(await line.getAttribute("data-outcome"), "aborted");
  assert.equal(await progress.count(), 0, "no progress bar after the cancel");
  await shots(page, "mcp-cancelled");
  assert.deepEqual(errors, []);
  await page.close();
});

test("Cancel while the server holds a confirmed write: the run waits for the server's word, and the receipt says the write was done", async () => {
  const { page, errors } = await openPage(browser, { thread: server.url });
  await send(page, 'use held__create_entities with {"entities": [{"name": "Grace Hopper", "entityType": "person", "observations": ["found the first bug"]}]}');
  const card = page.getByTestId("confirm-card");
  await card.waitFor({ timeout: 20000 });
  await card.getByTestId("confirm-op").click();
  // The server opened its graph to read it: it has the call. (A writer's
  // non-blocking open succeeds only while a reader has the FIFO open.)
  let fifo;
  await eventually(() => {
    fifo = openSync(heldGraph, constants.O_WRONLY | constants.O_NONBLOCK);
  }, { timeout: 20000 });
  await page.getByTestId("cancel").click();
  await runStatus(page, "cancelling");
  // The call stays in view, with what the run waits for.
  assert.equal(
    await page.getByTestId("cancel-waits").textContent(),
    "held__create_entities was handed over before the cancel and cannot be called back. Waiting for its answer: the receipt will say whether it was carried out.",
  );
  await page.getByTestId("tool-progress").waitFor();
  await shots(page, "mcp-cancelling-held");
  writeSync(fifo, ""); // an empty graph: the server applies the write
  closeSync(fifo);
  await page.getByTestId("receipt").waitFor({ timeout: 20000 });
  const line = page.getByTestId("receipt-operation");
  assert.equal(await line.getAttribute("data-outcome"), "committed");
  await eventually(() => assert.ok(lstatSync(heldGraph).isFile(), "the server saved its graph"), { timeout: 10000 });
  assert.equal(readFileSync(heldGraph, "utf8").split('"name":"Grace Hopper"').length - 1, 1, "acted once");
  await shots(page, "mcp-cancelled-after-write");
  assert.deepEqual(errors, []);
  await page.close();
});

test("a tool server that is not connected is named above the composer, and its tools are not offered", async () => {
  const { page, errors } = await openPage(browser, { thread: server.url });
  const notice = page.getByTestId("tool-servers-down");
  await notice.waitFor();
  assert.equal(await notice.textContent(), "Tool server broken is not connected: its tools fail until it reconnects (the gateway keeps trying).");
  const ready = await (await fetch(server.url + "/readyz")).json();
  assert.deepEqual(
    ready.tool_servers.map((s) => [s.name, s.connected]),
    [["everything", true], ["memory", true], ["held", true], ["broken", false]],
  );
  await send(page, 'use broken__anything with {"x": 1}');
  await eventually(async () => {
    const history = await messageTexts(page);
    assert.equal(history.length, 2);
    assert.match(history[1].text, /No tool named broken__anything is offered\. The tools are: .*everything__echo/);
  }, { timeout: 20000 });
  await runStatus(page, "idle", 20000);
  await shots(page, "mcp-server-down");
  assert.deepEqual(errors, []);
  await page.close();
});
