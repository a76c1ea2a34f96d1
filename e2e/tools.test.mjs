import { test } from "node:test";
import assert from "node:assert/strict";
import { serveForFile, openPage, shot, send, runStatus, messageTexts } from "./harness.mjs";

// A slow provider and a slow search, so the moments in between can be
// acted on by a person (and by these tests).
let server, browser;
serveForFile({ pace: "15ms", args: ["-outbox-latency", "2500ms", "-search-latency", "1500ms"] }, (s, b) => ([server, browser] = [s, b]));

// The protocol's own words, which the operation log keeps under Details and
// never shows as its text.
// ("rejected" and "confirmed" are English too, and may be said.)
const rawWords = /\b(consequential|idempotent|cancellable|phase|outcome|not_started|prepared|committing|committed|voided|send_email|catalog_search)\b/;

// openLog unfolds the operation log (folded at first, its summary counts
// the calls).
async function openLog(page) {
  const log = page.getByTestId("operations");
  await log.waitFor();
  if (!(await log.evaluate((d) => d.open))) await log.locator(":scope > summary").click();
  await log.getByTestId("operation").first().waitFor();
}

// askForEmail opens a page on a new conversation, asks there for an email
// (text), and waits for the card that asks to confirm it.
async function askForEmail(text) {
  const { page, errors } = await openPage(browser, { thread: server.url });
  await send(page, text);
  const card = page.getByTestId("confirm-card");
  await card.waitFor({ timeout: 20000 });
  return { page, errors, card };
}

// opPhase waits until the operation log holds an operation in phase.
async function opPhase(page, phase, timeout) {
  await page.locator(`[data-testid=operation][data-phase=${phase}]`).waitFor(timeout === undefined ? { state: "attached" } : { state: "attached", timeout });
}

// receiptOperation waits for the cancel receipt, checks the outcome its
// line for the tool call gives, and answers that line.
async function receiptOperation(page, outcome, timeout) {
  await page.getByTestId("receipt").waitFor({ timeout });
  const line = page.getByTestId("receipt-operation");
  assert.equal(await line.getAttribute("data-outcome"), outcome);
  return line;
}

// expectLogAfterReload reloads the page, checks that the operation log says
// what it said before (entry), and shoots it as name.
async function expectLogAfterReload(page, entry, name) {
  await page.reload();
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  await page.getByTestId("operations").getByTestId("operation").waitFor({ state: "attached" });
  assert.deepEqual(await logEntry(page), entry);
  await logShots(page, name);
}

// logEntry is the operation log's one entry as the user reads it (Details
// closed), and what Details holds.
async function logEntry(page) {
  await openLog(page);
  const item = page.getByTestId("operations").getByTestId("operation");
  assert.equal(await item.count(), 1);
  const shown = await item.evaluate((li) => ({
    what: li.querySelector("[data-testid=operation-what]")?.textContent,
    words: li.querySelector("[data-testid=operation-words]")?.textContent,
    text: li.innerText,
    open: li.querySelector("details")?.open,
  }));
  assert.equal(shown.open, false, "Details start closed");
  assert.doesNotMatch(shown.text, rawWords, `the entry reads in words: ${shown.text}`);
  const details = await item.getByTestId("operation-details").evaluate((d) => Object.fromEntries([...d.querySelectorAll("dt")].map((dt) => [dt.textContent, dt.nextElementSibling.textContent])));
  return { ...shown, details };
}

// logShots opens the log's Details and screenshots it at 1280 and 390 px,
// light and dark.
async function logShots(page, name) {
  const details = page.getByTestId("operations").getByTestId("operation-details");
  await details.locator("summary").click();
  await details.getByTestId("operation-id").waitFor();
  for (const [w, h] of [[1280, 820], [390, 844]]) {
    for (const scheme of ["light", "dark"]) {
      await page.setViewportSize({ width: w, height: h });
      await page.emulateMedia({ colorScheme: scheme });
      await page.getByTestId("operations").evaluate((e) => e.scrollIntoView({ block: "center" }));
      assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth), `the log fits ${w} px`);
      await shot(page, `${name}-${w}-${scheme}`, { fullPage: false });
    }
  }
  await details.locator("summary").click();
  await page.setViewportSize({ width: 1100, height: 800 });
  await page.emulateMedia({ colorScheme: "light" });
}

test("an email is sent only after Confirm, once, and the log says so", async () => {
  const { page, errors, card } = await askForEmail("Please send an email to anna@example.com about the spring order");
  await runStatus(page, "waiting_confirmation");
  assert.equal(await card.getByTestId("preview-to").textContent(), "anna@example.com");
  await shot(page, "tools-confirm-card");
  await card.getByTestId("confirm-op").click();
  // Confirmed, the run works on: the chip no longer waits for the user.
  await opPhase(page, "committing", 10000);
  assert.equal(await page.getByTestId("run-chip").textContent(), "Handing the email to anna@example.com to the provider…");
  assert.equal(await page.locator("#thread").getAttribute("data-run-status"), "running");
  await opPhase(page, "committed", 20000);
  await runStatus(page, "idle", 20000);
  const history = await messageTexts(page);
  assert.deepEqual(history.map((m) => m.role), ["user", "assistant", "tool", "assistant"]);
  assert.match(history[3].text, /handed to the provider/);
  assert.equal(await page.getByTestId("confirm-card").count(), 0);
  // The email stays readable in the conversation after the decision.
  const step = page.getByTestId("tool-step");
  assert.equal(await step.getByTestId("tool-arg-to").textContent(), "anna@example.com");
  assert.ok((await step.getByTestId("tool-arg-subject").textContent()).length > 0);
  assert.match(await step.getByTestId("tool-arg-body").textContent(), /spring order/);
  await shot(page, "tools-email-sent");
  // The log is folded under its count; unfolded, it says it in words, the
  // key under Details; a reload says the same.
  assert.equal(await page.getByTestId("operations").evaluate((d) => d.open), false, "the log starts folded");
  assert.equal(await page.getByTestId("operations-count").textContent(), "1 call");
  const [op] = (await server.api(`/api/threads/${new URL(page.url()).pathname.split("/").pop()}/operations`)).operations;
  const entry = await logEntry(page);
  assert.equal(entry.what, "Email to anna@example.com");
  assert.equal(entry.words, "Sent once");
  assert.equal(entry.details["Idempotency key"], op.idempotency_key);
  assert.match(op.idempotency_key, /^email:/);
  assert.equal(entry.details.Operation, op.operation_id);
  assert.deepEqual([entry.details.Tool, entry.details.Phase, entry.details.Outcome], ["send_email", "committed", "committed"]);
  await expectLogAfterReload(page, entry, "tools-log-sent");
  assert.deepEqual(errors, []);
});

test("cancel while the email is being handed to the provider: the receipt says it already left", async () => {
  const { page, errors } = await askForEmail("Send an email to ops@example.com about the delayed shipment");
  await page.getByTestId("confirm-op").click();
  // The provider takes 2.5 s: cancel while the commit is in flight.
  await opPhase(page, "committing", 10000);
  await page.getByTestId("cancel").click();
  await runStatus(page, ["cancel_requested", "cancelling"], 5000);
  await shot(page, "tools-cancel-during-commit");
  const line = await receiptOperation(page, "committed", 20000);
  assert.match(await line.textContent(), /already handed to the external system/);
  await opPhase(page, "committed");
  await shot(page, "tools-cancel-receipt");
  assert.deepEqual(errors, []);
});

test("cancel while the confirmation waits: nothing is sent", async () => {
  const { page, errors } = await askForEmail("Write an email to bob@example.com about the meeting");
  await page.getByTestId("cancel").click();
  const line = await receiptOperation(page, "not_started", 10000);
  assert.equal(await line.textContent(), "Email: not started. Nothing was sent: the cancel came first.");
  assert.equal(await page.getByTestId("confirm-card").count(), 0);
  await opPhase(page, "voided");
  const entry = await logEntry(page);
  assert.equal(entry.what, "Email to bob@example.com");
  assert.equal(entry.words, "Not sent: cancelled before it was sent");
  assert.match(entry.details["Idempotency key"], /^email:/);
  assert.deepEqual([entry.details.Phase, entry.details.Outcome], ["voided", "not_started"]);
  await logShots(page, "tools-log-cancelled");
  assert.deepEqual(errors, []);
});

test("cancel during a search keeps its result, and continuing reuses it", async () => {
  const { page, errors } = await openPage(browser, { thread: server.url });
  await send(page, "Search the catalog for a trekking backpack");
  await opPhase(page, "running", 10000);
  // The page says what the call is doing, not only "Working…", and that
  // it is still going: an indeterminate bar and the time so far.
  assert.match(await page.getByTestId("run-chip").textContent(), /^Searching the catalog for “.*backpack.*”…$/);
  const progress = page.getByTestId("tool-progress");
  await progress.waitFor();
  assert.equal(await progress.locator("progress").getAttribute("value"), null, "indeterminate: the tool reports no fraction");
  assert.match(await progress.locator("progress").getAttribute("aria-label"), /^Searching the catalog for/);
  assert.match(await page.getByTestId("tool-elapsed").textContent(), /^(just started|\d+ s so far)$/);
  await shot(page, "tool-progress", { fullPage: false });
  await page.getByTestId("cancel").click();
  await receiptOperation(page, "completed", 20000);
  assert.equal(await progress.count(), 0, "no progress once the run ended");
  await page.getByTestId("action-continue").click();
  await runStatus(page, "idle", 20000);
  const history = await messageTexts(page);
  assert.deepEqual(history.map((m) => m.role), ["user", "assistant", "tool", "assistant"]);
  // One search in the log: the continue did not search again.
  assert.equal(await page.locator("[data-testid=operation]").count(), 1);
  const entry = await logEntry(page);
  assert.equal(entry.what, "Catalog search for “trekking backpack”");
  assert.equal(entry.words, "Done: its result is in the conversation");
  assert.deepEqual([entry.details.Phase, entry.details.Outcome], ["completed", "completed"]);
  assert.deepEqual(errors, []);
});

test("Reject: nothing is sent, and the log says you rejected it", async () => {
  const { page, errors, card } = await askForEmail("Draft an email to dora@example.com about the autumn catalogue");
  // While it waits, the log says so.
  await opPhase(page, "prepared");
  assert.equal((await logEntry(page)).words, "Waiting for your confirmation: not sent yet");
  await card.getByTestId("reject-op").click();
  await opPhase(page, "rejected", 10000);
  await runStatus(page, "idle", 20000);
  const entry = await logEntry(page);
  assert.equal(entry.what, "Email to dora@example.com");
  assert.equal(entry.words, "Not sent: you rejected it");
  assert.match(entry.details["Idempotency key"], /^email:/);
  assert.deepEqual([entry.details.Phase, entry.details.Outcome], ["rejected", "not_started"]);
  await expectLogAfterReload(page, entry, "tools-log-rejected");
  assert.deepEqual(errors, []);
});
