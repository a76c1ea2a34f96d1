// The server is up but a path to it is not: the page's WebSocket is taken
// away (the test closes it and refuses new ones) while HTTP still answers,
// or the cancel's HTTP request fails too. A Cancel the user pressed is never
// lost: it goes over whatever path answers, or waits for one, and the page
// shows only what the server answered.
import { test } from "node:test";
import assert from "node:assert/strict";
import { serveForFile, openPage, shot, send, runStatus, messageTexts, eventually, longReply, expectCancelKept, expectCancelSettled } from "./harness.mjs";

let server, browser;
serveForFile({ pace: "250ms" }, (s, b) => ([server, browser] = [s, b]));

// The cancel request the test makes fail is reported by Chromium as a
// failed resource load; every other console error fails the test.
const refusedCancel = /^Failed to load resource: net::ERR_CONNECTION_REFUSED$/;

test("WebSocket down, HTTP up: Cancel goes over HTTP and the server's receipt is shown", async () => {
  const { page, errors, socket } = await openPage(browser, { intercept: true });
  const { runID } = await longReply(page, server);
  const tab = await page.evaluate(() => sessionStorage.getItem("gateway.tab_id"));

  await socket.block();
  await page.locator("[data-testid=conn-status][data-state=reconnecting]").waitFor();
  const seen = socket.frames.length;
  const posted = page.waitForRequest((r) => r.method() === "POST" && new URL(r.url()).pathname === `/api/runs/${runID}/cancel`);
  await page.getByTestId("cancel").click();
  const req = await posted;
  assert.deepEqual(req.postDataJSON(), { reason: "user_requested" });
  assert.equal((await req.response()).status(), 202);

  // The server's receipt, read over HTTP while the socket stays down.
  await page.getByTestId("receipt").waitFor({ timeout: 15000 });
  await runStatus(page, "cancelled");
  const run = await server.api(`/api/runs/${runID}`);
  assert.equal(run.status, "cancelled");
  assert.equal(run.requested_by, `api:${tab}`, "the journal names the tab that cancelled over HTTP");
  assert.equal(await page.getByTestId("receipt-discarded").textContent(), `${run.discarded_stream_chars} characters of unpublished text`);
  assert.ok(!socket.frames.slice(seen).some((f) => f.obj.type === "run.cancel"), "nothing went over a WebSocket");
  // What the tab showed of the reply stays, marked not saved, and can be saved.
  await page.getByTestId("run-chip").filter({ hasText: "Not saved · stopped here" }).waitFor();
  assert.ok(await page.getByTestId("action-save-fragment").isVisible());
  assert.equal(await page.locator("[data-testid=conn-status]").getAttribute("data-state"), "reconnecting");
  await expectCancelSettled(page, { live: false });
  await shot(page, "offline-cancel-over-http");

  // The socket comes back: live, the same receipt, nothing stale.
  socket.unblock();
  await page.locator("[data-testid=conn-status][data-state=live]").waitFor({ timeout: 15000 });
  await page.getByTestId("send").and(page.locator(":enabled")).waitFor();
  await runStatus(page, "cancelled");
  await expectCancelSettled(page);
  assert.deepEqual(errors, [], "no console errors");
  await page.close();
});

test("the reply finishes before a kept cancel reaches the server: the page says so, no receipt", async () => {
  const { page, errors, socket, url } = await openPage(browser, { intercept: true, thread: server.url });
  const threadID = new URL(url).pathname.split("/").pop();
  await send(page, "Short: tea brewing temperatures?");
  await page.getByTestId("streaming-text").filter({ hasText: /\S/ }).waitFor();
  const runID = (await server.api(`/api/threads/${threadID}`)).active_run.run_id;

  // No path reaches the server: the socket is gone and the cancel's HTTP
  // request is refused.
  await page.route("**/api/runs/*/cancel", (r) => r.abort("connectionrefused"));
  await socket.block();
  await page.locator("[data-testid=conn-status][data-state=reconnecting]").waitFor();
  await page.getByTestId("cancel").click();
  await expectCancelKept(page);
  await eventually(async () => assert.equal((await server.api(`/api/runs/${runID}`)).status, "completed"), { timeout: 20000 });

  // The paths come back; the kept cancel is answered run_not_active.
  socket.unblock();
  await page.unroute("**/api/runs/*/cancel");
  await page.locator("[data-testid=conn-status][data-state=live]").waitFor({ timeout: 15000 });
  const notice = page.getByTestId("notice");
  await notice.filter({ hasText: "The reply finished before your cancel reached the server" }).waitFor();
  assert.equal(await notice.getAttribute("data-tone"), "info", "an outcome, not an error");
  await runStatus(page, "idle");
  const history = await messageTexts(page);
  assert.equal(history.length, 2);
  assert.equal(history[1].role, "assistant");
  assert.equal(await page.getByTestId("receipt").count(), 0, "no receipt: nothing was cancelled");
  assert.ok(await page.getByTestId("cancel-pending").isHidden());
  assert.equal((await server.api(`/api/runs/${runID}`)).status, "completed");
  assert.deepEqual((await page.evaluate(() => Object.keys(sessionStorage))).filter((k) => k.startsWith("gateway.cancel.")), []);
  await shot(page, "offline-cancel-too-late");
  // The kept cancel may reach the server over HTTP too (the page retries it
  // after a failed reconnect), whose run_not_active answer Chromium reports
  // as a failed resource load.
  const answered409 = /^Failed to load resource: the server responded with a status of 409/;
  assert.deepEqual(errors.filter((e) => !refusedCancel.test(e) && !answered409.test(e)), [], "no console errors");
  await page.close();
});
