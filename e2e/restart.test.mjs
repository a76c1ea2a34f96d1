// The server goes away in the middle of a reply and comes back on the same
// address: a graceful shutdown (SIGTERM, runs handed back) and a crash
// (SIGKILL, runs recovered at start). The page must say it is reconnecting,
// come back live, and then show the true outcome: the run was not cancelled,
// it continues and its reply is published once.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, launch, newPage, shot, newThread, send, runStatus, messageTexts, eventually } from "./harness.mjs";

let server, browser;
before(async () => {
  // Slow enough that a short reply (10 words) is still streaming when the
  // server is stopped, fast enough that the retried reply ends in seconds.
  server = await startServer({ pace: "250ms" });
  browser = await launch();
});
after(async () => {
  await browser?.close();
  try {
    assert.match(server?.check() ?? "ok", /^ok/);
  } finally {
    await server?.close();
  }
});

// While the server is down, Chromium itself logs each refused reconnect
// attempt of the page's WebSocket as a console error. That is the browser
// reporting the outage the page shows as "Reconnecting…", not a page error;
// every other console error still fails the test.
// A reconnect that fails before the socket opens also asks the API whether
// the session ended (a 401 would send the page to sign in); while the server
// is down Chromium reports that request's refusal the same way.
const refusedReconnect = /^(WebSocket connection to 'ws:\/\/[^']+\/ws' failed: .*(ERR_CONNECTION_REFUSED|ERR_CONNECTION_RESET|ERR_EMPTY_RESPONSE)|Failed to load resource: net::(ERR_CONNECTION_REFUSED|ERR_CONNECTION_RESET|ERR_EMPTY_RESPONSE)$)/;

async function restartMidRun(signal, question) {
  const errors = [];
  const page = await newPage(browser, errors);
  await newThread(page, server.url);
  await send(page, question);
  await eventually(async () => assert.ok((await page.getByTestId("streaming-text").textContent()).length > 0));
  await runStatus(page, "running");

  await server.stop(signal);
  const conn = page.getByTestId("conn-status");
  await page.locator("[data-testid=conn-status][data-state=reconnecting]").waitFor();
  assert.match(await conn.textContent(), /^Reconnecting.*…$/);
  assert.ok(await page.getByTestId("send").isDisabled() || (await page.getByTestId("send").isHidden()), "nothing can be sent while offline");
  await shot(page, `restart-${signal}-reconnecting`);

  await server.start(server.addr);
  await page.locator("[data-testid=conn-status][data-state=live]").waitFor({ timeout: 15000 });
  assert.equal(await conn.textContent(), "Live");
  // The interrupted attempt's text is not passed off as the reply: the page
  // says the reply starts over.
  await page.getByTestId("run-chip").filter({ hasText: "Interrupted, starting over" }).waitFor();
  await shot(page, `restart-${signal}-starting-over`);

  // The true outcome: the reply is published, exactly once, and nothing
  // says it was cancelled or failed.
  const reply = page.locator("[data-testid=messages] > [data-testid=message][data-role=assistant][data-kind=text]");
  await reply.waitFor({ timeout: 20000 });
  await runStatus(page, "idle");
  await shot(page, `restart-${signal}-completed`);
  const history = await messageTexts(page);
  assert.equal(history.length, 2, JSON.stringify(history));
  assert.deepEqual(history[0], { role: "user", kind: "text", text: question });
  assert.equal(await page.getByTestId("receipt").count(), 0, "no cancel receipt: nothing was cancelled");
  assert.equal(await page.getByTestId("failure").count(), 0, "no failure");
  assert.equal(await page.getByTestId("pending").count(), 0, "nothing left unfinished");
  assert.equal(await page.getByTestId("streaming").count(), 0, "no provisional text left on screen");
  assert.ok(await page.getByTestId("notice").isHidden(), await page.getByTestId("notice").textContent());

  // What the page shows is what the server holds.
  await page.reload();
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  assert.deepEqual(await messageTexts(page), history);
  await runStatus(page, "idle");
  assert.deepEqual(errors.filter((e) => !refusedReconnect.test(e)), [], "no console errors");
  await page.close();
  return history;
}

test("graceful restart mid-reply (SIGTERM): reconnecting, live again, the run continues and completes", async () => {
  await restartMidRun("SIGTERM", "Short: sailing basics for beginners?");
});

test("crash mid-reply (SIGKILL) and restart: the run is recovered and completes", async () => {
  await restartMidRun("SIGKILL", "Short: knitting patterns for scarves?");
});

test("Cancel while the server is away is not pretended; after reconnecting it works", async () => {
  const errors = [];
  const page = await newPage(browser, errors);
  await newThread(page, server.url);
  // A long reply (80+ words at 250ms): still running long after the restart.
  await send(page, "How do I prepare a vegetable garden for winter?");
  await eventually(async () => assert.ok((await page.getByTestId("streaming-text").textContent()).length > 0));
  await runStatus(page, "running");

  await server.stop("SIGTERM");
  await page.locator("[data-testid=conn-status][data-state=reconnecting]").waitFor();
  const cancel = page.getByTestId("cancel");
  await cancel.click();
  // The cancel could not be sent: the page says so, and does not claim a
  // cancel is under way.
  await page.getByTestId("notice").filter({ hasText: /not connected/ }).waitFor();
  await runStatus(page, "running");
  assert.equal(await cancel.textContent(), "Cancel");
  assert.ok(await cancel.isEnabled(), "the user can cancel again");
  assert.equal(await page.getByTestId("run-chip").filter({ hasText: "Cancelling" }).count(), 0);
  await shot(page, "restart-cancel-offline");

  await server.start(server.addr);
  await page.locator("[data-testid=conn-status][data-state=live]").waitFor({ timeout: 15000 });
  // The run was handed back, not cancelled: it streams again.
  await runStatus(page, "running");
  await page.getByTestId("run-chip").filter({ hasText: "Interrupted, starting over" }).waitFor({ timeout: 15000 });
  await cancel.click();
  await page.getByTestId("receipt").waitFor();
  await runStatus(page, "cancelled");
  assert.ok(await page.getByTestId("notice").isHidden(), "the offline notice is gone once a command succeeds");
  assert.equal(await page.locator("[data-testid=message][data-role=assistant]").count(), 0);
  await shot(page, "restart-cancel-after-reconnect");
  assert.deepEqual(errors.filter((e) => !refusedReconnect.test(e)), [], "no console errors");
  await page.close();
});
