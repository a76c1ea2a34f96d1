// An email whose outcome nobody saw: the embedded provider takes the call
// but its answer is lost, and it records the key only seconds later
// (-outbox-fault record-late), as a service that records a key once it
// finished acting does. The gateway's own lookups right after find nothing,
// so the outcome is unknown — and the page must say exactly that: never
// "not started" or "nothing was sent", the key it keeps asking about, and,
// once the provider confirms, that the email was sent — live, in the same
// receipt, and the same after a reload. After the horizon the page says to
// check the provider's records for the key.
import { test } from "node:test";
import assert from "node:assert/strict";
import { serveForFile, startServer, newPage, shot, newThread, send, runStatus, messageTexts } from "./harness.mjs";

// The provider answers nothing and records a key 6 s after taking it: the
// worker's own retries and lookups (about 3 s) and the first background
// lookups find nothing; a later one does.
const lateFlags = ["-outbox-fault", "record-late", "-outbox-latency", "300ms", "-outbox-record-delay", "6s"];

let server, browser;
serveForFile({ pace: "10ms", args: lateFlags }, (s, b) => ([server, browser] = [s, b]));

const threadOf = (url) => new URL(url).pathname.split("/").pop();
const neverDenies = /not started|nothing was sent|was not sent/i;

// askAndConfirm asks for an email, confirms the draft and waits until the
// provider's answer is lost (the operation is unknown); it answers the
// thread id and the operation.
async function askAndConfirm(page, srv, to) {
  const url = await newThread(page, srv.url);
  await send(page, `Please send an email to ${to} about the spring order`);
  await page.getByTestId("confirm-card").waitFor({ timeout: 20000 });
  await page.getByTestId("confirm-op").click();
  await page.locator("[data-testid=operation][data-phase=unknown]").waitFor({ state: "attached", timeout: 10000 });
  const threadID = threadOf(url);
  const { operations } = await srv.api(`/api/threads/${threadID}/operations`);
  assert.equal(operations.length, 1);
  return { threadID, op: operations[0] };
}

async function receiptLine(page) {
  const line = page.getByTestId("receipt").getByTestId("receipt-operation");
  return { line, text: await line.textContent(), outcome: await line.getAttribute("data-outcome"), state: await line.getAttribute("data-state") };
}

test("cancel while the email's outcome is unknown: the receipt says so, then that it was sent, live and after a reload", async () => {
  const errors = [];
  const page = await newPage(browser, errors);
  const { threadID, op } = await askAndConfirm(page, server, "anna@example.com");
  const key = op.idempotency_key;
  assert.match(key, /^email:step-[0-9a-f]+:[0-9a-f]{16}:send$/);

  await page.getByTestId("cancel").click();
  await page.getByTestId("receipt").waitFor({ timeout: 15000 });
  // A page that reloads would lose this: the change below must come live.
  await page.evaluate(() => (window.__sameDocument = true));

  // The provider has not confirmed: the receipt says the email may have
  // been sent, names the key, and never says nothing was sent.
  let r = await receiptLine(page);
  assert.equal(r.outcome, "unknown");
  assert.equal(r.state, "unknown_checking");
  assert.match(r.text, /^Email: not confirmed yet\. The email to anna@example\.com may have been sent\. The gateway keeps asking the provider \(key /);
  assert.ok(r.text.includes(`(key ${key}) and will update this`), r.text);
  assert.doesNotMatch(r.text, neverDenies);
  assert.equal(await page.getByTestId("receipt").getByTestId("operation-key").textContent(), key);
  // The server says the same.
  let ops = (await server.api(`/api/threads/${threadID}/operations`)).operations;
  assert.equal(ops[0].phase, "unknown");
  assert.equal(ops[0].outcome, "unknown");
  assert.ok(ops[0].reconcile_next_at && ops[0].reconcile_until, "still being looked up");
  const snap = await server.api(`/api/threads/${threadID}`);
  assert.equal(snap.last_run.status, "cancelled");
  assert.deepEqual(snap.last_run.operations.map((o) => o.outcome), ["unknown"]);
  // The tool step in the conversation says the same as the receipt.
  const step = page.getByTestId("tool-status");
  assert.equal(await step.getAttribute("data-state"), "unknown_checking");
  assert.match(await step.textContent(), /^Not confirmed yet\. The email to anna@example\.com may have been sent\. The gateway keeps asking/);
  await shot(page, "receipt-unknown-checking");

  // Another tab opened now (a snapshot and the operation log) shows the
  // same receipt, and follows it too.
  const other = await newPage(browser, errors);
  await other.goto(page.url());
  await other.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  await other.getByTestId("receipt").getByTestId("operation-key").waitFor();
  assert.equal(await other.getByTestId("receipt").getByTestId("receipt-operation").textContent(), r.text);

  // The provider records the key; the gateway's next lookup finds it and a
  // tool.updated turns the same receipt, in the same document, to sent.
  await page.locator("[data-testid=receipt-operation][data-outcome=committed]").waitFor({ timeout: 30000 });
  assert.equal(await page.evaluate(() => window.__sameDocument), true, "no reload");
  r = await receiptLine(page);
  assert.equal(r.state, "committed");
  assert.equal(
    r.text,
    `Email: sent. The provider has confirmed (key ${key}) that it took the email to anna@example.com: it was handed over before the cancel took effect and cannot be undone.`,
  );
  assert.match(await step.textContent(), /^Sent\. Its answer was lost, but the provider has since confirmed \(key email:\S+\) that it took the email to anna@example\.com\. It cannot be undone\.$/);
  ops = (await server.api(`/api/threads/${threadID}/operations`)).operations;
  assert.equal(ops[0].phase, "reconciled");
  assert.equal(ops[0].outcome, "committed");
  assert.equal(ops[0].reconcile_next_at, undefined);
  await other.locator("[data-testid=receipt-operation][data-outcome=committed]").waitFor({ timeout: 5000 });
  assert.equal(await other.getByTestId("receipt").getByTestId("receipt-operation").textContent(), r.text);
  await shot(page, "receipt-unknown-then-sent");

  // A reload shows the same receipt.
  await page.reload();
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  await page.getByTestId("receipt").getByTestId("operation-key").waitFor();
  const again = await receiptLine(page);
  assert.equal(again.text, r.text);
  assert.equal(again.outcome, "committed");
  assert.equal(await page.evaluate(() => window.__sameDocument), undefined, "this one did reload");
  assert.deepEqual(
    (await server.api(`/api/threads/${threadID}`)).last_run.operations.map((o) => [o.phase, o.outcome]),
    [["reconciled", "committed"]],
  );
  assert.deepEqual(errors, []);
});

test("a reply that finished with the outcome unknown: its tool step says so, then that the email was sent", async () => {
  const errors = [];
  const page = await newPage(browser, errors);
  const { threadID, op } = await askAndConfirm(page, server, "ben@example.com");
  // No cancel: the worker stops asking after its few tries and the reply
  // goes on with the outcome unknown.
  await runStatus(page, "idle", 20000);
  const history = await messageTexts(page);
  assert.deepEqual(history.map((m) => m.role), ["user", "assistant", "tool", "assistant"]);
  assert.match(history[3].text, /do not know yet whether the email to ben@example\.com went out/);
  const step = page.getByTestId("tool-status");
  if ((await step.getAttribute("data-state")) !== "committed") {
    assert.equal(await step.getAttribute("data-state"), "unknown_checking");
    const text = await step.textContent();
    assert.ok(text.includes(`The gateway keeps asking the provider (key ${op.idempotency_key}) and will update this.`), text);
    assert.doesNotMatch(text, neverDenies);
  }
  await page.locator("[data-testid=tool-status][data-state=committed]").waitFor({ timeout: 30000 });
  assert.match(await step.textContent(), /^Sent\. Its answer was lost, but the provider has since confirmed \(key email:/);
  const { operations } = await server.api(`/api/threads/${threadID}/operations`);
  assert.deepEqual([operations[0].phase, operations[0].outcome], ["reconciled", "committed"]);
  assert.equal(await page.getByTestId("receipt").count(), 0, "no receipt: nothing was cancelled");
  assert.deepEqual(errors, []);
});

test("past the horizon the receipt says the provider never confirmed, and which key to check", async () => {
  // The gateway asks for 1 s only; the provider records the key a minute
  // later, when nobody asks any more.
  const srv = await startServer({ pace: "10ms", args: ["-outbox-fault", "record-late", "-outbox-latency", "300ms", "-outbox-record-delay", "60s", "-reconcile-horizon", "1s"] });
  try {
    const errors = [];
    const page = await newPage(browser, errors);
    const { threadID, op } = await askAndConfirm(page, srv, "carl@example.com");
    await page.getByTestId("cancel").click();
    await page.getByTestId("receipt").waitFor({ timeout: 15000 });
    await page.locator("[data-testid=receipt-operation][data-state=unknown_given_up]").waitFor({ timeout: 20000 });
    const r = await receiptLine(page);
    assert.equal(r.outcome, "unknown");
    assert.equal(
      r.text,
      `Email: unknown. The email to carl@example.com may have been sent: the provider has not confirmed whether it was, and the gateway is not asking it. Check its records for key ${op.idempotency_key}.`,
    );
    assert.doesNotMatch(r.text, neverDenies);
    const { operations } = await srv.api(`/api/threads/${threadID}/operations`);
    assert.equal(operations[0].phase, "unknown");
    assert.equal(operations[0].reconcile_next_at, undefined);
    assert.ok(operations[0].reconcile_until);
    await page.getByTestId("operation-reconcile").filter({ hasText: "is not looking the key up" }).waitFor({ state: "attached" }); // in the folded log
    await shot(page, "receipt-unknown-given-up");
    await page.reload();
    await page.locator("[data-testid=receipt-operation][data-state=unknown_given_up]").waitFor();
    assert.equal(await page.getByTestId("receipt").getByTestId("receipt-operation").textContent(), r.text);
    assert.deepEqual(errors, []);
    assert.match(srv.check(), /^ok/);
  } finally {
    await srv.close();
  }
});
