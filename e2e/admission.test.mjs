// Admission: a run that waits for a free slot (docs/protocol.md "Admission").
// With one slot (-workers 1), thread A's endless reply holds it; a request
// on thread B then waits, and every tab on B says so — where it stands,
// not a reply being written — with Cancel at hand. A reload paints the
// same from the server. The place is kept current while the run waits;
// cancelled while waiting, the receipt says it never started; once the
// slot frees, the waiting run streams.
import { test } from "node:test";
import assert from "node:assert/strict";
import { serveForFile, newPage, openTwoTabs, newThread, send, runStatus, eventually, shots } from "./harness.mjs";

let server, browser;
// One slot; the endless reply must outlast the test (4 MiB at a paragraph
// per 100 ms), and a normal reply streams a word per 100 ms.
serveForFile({ pace: "100ms", args: ["-workers", "1", "-max-reply-bytes", "4194304"] }, (s, b) => ([server, browser] = [s, b]));

const threadOf = (url) => new URL(url).pathname.split("/").pop();
const NEXT = "Waiting for a free slot (next to start)";

// chip is the text of the place where a page shows its run's progress.
const chip = (page) => page.getByTestId("run-chip");

// expectWaiting waits until page shows its run waiting with text, with
// Cancel available, and checks it does not look like a reply being written.
async function expectWaiting(page, text) {
  await chip(page).filter({ hasText: text }).waitFor();
  assert.equal(await chip(page).textContent(), text);
  await runStatus(page, "queued");
  assert.ok(await page.getByTestId("cancel").isEnabled(), "Cancel is available while the run waits");
  // Send stays (what is written waits in the queue, after the run), and
  // Send now would stop the waiting run instead.
  assert.ok(await page.getByTestId("send").isVisible());
  assert.equal(await page.getByTestId("send").getAttribute("title"), "Queue this: it is sent when the reply finishes");
  assert.ok(await page.getByTestId("send-now").isVisible());
  assert.equal(await page.locator("[data-testid=run-chip].live").count(), 0, "not the streaming indicator");
  assert.equal(await page.getByTestId("streaming-text").count(), 0, "no reply text while waiting");
  assert.match(await page.getByTestId("waiting-hint").textContent(), /starts by itself when a slot frees up/);
}

// expectStreaming waits until A's reply is still growing on page.
async function expectStreaming(page) {
  const text = page.getByTestId("streaming-text");
  const before = (await text.textContent()).length;
  await eventually(async () => assert.ok((await text.textContent()).length > before, "the reply keeps streaming"), { timeout: 5000 });
  await runStatus(page, "running");
  assert.match(await chip(page).textContent(), /^Streaming/);
}

test("one slot: B waits and says where it stands in every tab, a cancel while waiting never started, and B streams once A is cancelled", async () => {
  const errors = [];

  // A takes the only slot with a reply that does not end.
  const contextA = await browser.newContext();
  const a = await newPage(contextA, errors);
  await newThread(a, server.url);
  await send(a, "endless: soil, compost and mulch");
  await chip(a).filter({ hasText: "Streaming" }).waitFor();
  await a.getByTestId("streaming-text").filter({ hasText: /\S/ }).waitFor();

  // Two tabs on B; b1 sends, and both show the run waiting.
  const { context, errors: tabErrors, a: b1, b: b2, url: urlB } = await openTwoTabs(browser, server.url);
  await b2.goto(urlB);
  await b2.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  await b2.getByTestId("send").and(b2.locator(":enabled")).waitFor();
  await send(b1, "How do I prepare a vegetable garden for winter?");
  await expectWaiting(b1, NEXT);
  await expectWaiting(b2, NEXT); // learned from run.started and asking once
  const threadB = threadOf(urlB);
  const queuedB = (await server.api(`/api/threads/${threadB}`)).active_run;
  assert.equal(queuedB.status, "queued");
  assert.equal(queuedB.queue_position, 1);
  await expectStreaming(a);
  await shots(b1, "admission-waiting");

  // A reload paints the waiting state from the server, as the script
  // draws it: the server's page alone (no script) shows the same box.
  await b2.reload();
  await expectWaiting(b2, NEXT);
  const plain = await browser.newContext({ javaScriptEnabled: false });
  const noJS = await plain.newPage();
  await noJS.goto(urlB);
  const box = (page) => page.getByTestId("live").getByTestId("streaming").evaluate((e) => e.outerHTML);
  assert.equal(await noJS.getByTestId("run-chip").textContent(), NEXT);
  assert.ok(await noJS.getByTestId("cancel").isVisible(), "Cancel in place of Send from the first paint");
  assert.ok(await noJS.getByTestId("send").isHidden());
  assert.equal(await box(noJS), await box(b2), "the first paint is what the script draws");
  await plain.close();

  // C, sent by a program, waits behind B: its page says one is ahead,
  // and follows as B leaves the queue.
  const threadC = (await server.api("/api/threads", { method: "POST", headers: { "content-type": "application/json" }, body: "{}" })).thread_id;
  const ackC = await server.api(`/api/threads/${threadC}/runs`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ expected_state_version: 1, user_message: "Short: when do I plant garlic?" }),
  });
  assert.equal(ackC.status, "queued");
  assert.equal(ackC.queue_position, 2, "C waits behind B");
  const c = await newPage(contextA, errors);
  await c.goto(`${server.url}/t/${threadC}`);
  await c.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  await expectWaiting(c, "Waiting for a free slot (1 ahead)");
  await shots(c, "admission-waiting-behind");

  // B is cancelled while it waits: both tabs' receipts say it never
  // started, and A streams on.
  await b1.getByTestId("cancel").click();
  for (const [page, heading] of [
    [b1, "Cancelled while waiting for a free slot"],
    [b2, "Cancelled from another tab while waiting for a free slot"],
  ]) {
    // The ordinary receipt first, until the server said no worker ever
    // took the run up (GET /api/runs/{id}: executed false).
    await page.getByTestId("receipt-never-started").waitFor();
    assert.equal(await page.getByTestId("receipt-heading").textContent(), heading);
    assert.equal(
      await page.getByTestId("receipt-never-started").textContent(),
      "It never started: nothing was generated, so nothing was discarded and no tool was called.",
    );
    assert.match(await page.getByTestId("receipt-kept").textContent(), /vegetable garden for winter/);
    assert.equal(await page.getByTestId("receipt-discarded").count(), 0);
    assert.equal(await page.getByTestId("streaming").count(), 0, "nothing of the run on screen");
    await runStatus(page, "cancelled");
  }
  const runB = await server.api(`/api/runs/${queuedB.run_id}`);
  assert.equal(runB.status, "cancelled");
  assert.equal(runB.discarded_stream_chars, 0);
  assert.equal(runB.executed, false, "the server says no worker ever took it up");
  // A reload knows it too: the receipt is the server's, not the tab's memory.
  await b2.reload();
  await b2.getByTestId("receipt-never-started").waitFor();
  assert.match(await b2.getByTestId("receipt-heading").textContent(), /while waiting for a free slot$/);
  await expectStreaming(a);
  await shots(b1, "admission-receipt");

  // C moved up: its page says so without any event about it.
  await expectWaiting(c, NEXT);
  // Cancelled by a program while it waits: C's page learned it waits from
  // its snapshot, and says it never started.
  await server.api(`/api/runs/${ackC.run_id}/cancel`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
  await c.getByTestId("receipt-heading").filter({ hasText: "Cancelled elsewhere (another tab or client) while waiting for a free slot" }).waitFor();
  await c.close();

  // B again, from the saved point: it waits, next to start.
  await b1.getByTestId("action-continue").click();
  await expectWaiting(b1, NEXT);
  await expectWaiting(b2, NEXT);

  // A is cancelled: the slot frees, and B streams in both tabs.
  await a.getByTestId("cancel").click();
  await a.getByTestId("receipt").waitFor();
  assert.equal(await a.getByTestId("receipt-heading").textContent(), "Cancelled");
  assert.match(await a.getByTestId("receipt-discarded").textContent(), /^[1-9]\d* characters of unpublished text$/);
  for (const page of [b1, b2]) {
    await chip(page).filter({ hasText: "Streaming" }).waitFor();
    await page.getByTestId("streaming-text").filter({ hasText: /\S/ }).waitFor();
    assert.equal(await page.getByTestId("waiting-hint").count(), 0, "the waiting text is gone");
    await runStatus(page, "running");
  }
  const running = await server.api(`/api/threads/${threadB}`);
  assert.equal(running.active_run.status, "running");
  assert.equal(running.active_run.queue_position, undefined);
  // And it ends as any reply: published, in both tabs.
  for (const page of [b1, b2]) {
    await runStatus(page, "idle", 30000);
    assert.equal(await page.locator("[data-testid=messages] > [data-testid=message][data-role=assistant]").count(), 1);
  }

  assert.deepEqual([...errors, ...tabErrors], [], "no console errors");
  await context.close();
  await contextA.close();
});
