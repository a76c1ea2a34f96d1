import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, launch, newPage, shot, newThread } from "./harness.mjs";

let server, browser;
before(async () => {
  server = await startServer({ pace: "40ms" });
  browser = await launch();
});
after(async () => {
  await browser?.close();
  await server?.close();
});

test("send, watch the reply stream, cancel mid-stream and read the receipt", async () => {
  const errors = [];
  const page = await newPage(browser, errors);
  await newThread(page, server.url);
  await page.getByTestId("composer-input").fill("How should I plan a trip to Lisbon in spring?");
  await page.keyboard.press("Enter");
  const streaming = page.getByTestId("streaming-text");
  await streaming.waitFor();
  await page.getByTestId("run-chip").filter({ hasText: "Streaming" }).waitFor();
  await shot(page, "streaming");
  await page.getByTestId("cancel").click();
  const receipt = page.getByTestId("receipt");
  await receipt.waitFor();
  await shot(page, "cancelled");
  assert.match(await page.getByTestId("receipt-discarded").textContent(), /^[1-9]\d* characters of unpublished text$/);
  assert.match(await page.getByTestId("receipt-kept").textContent(), /Lisbon/);
  // Nothing of the cancelled reply became history.
  assert.equal(await page.locator("[data-testid=message][data-role=assistant]").count(), 0);
  for (const action of ["action-continue", "action-edit", "action-fork", "action-save-fragment"]) {
    assert.ok(await page.getByTestId(action).isVisible(), `${action} offered after cancel`);
  }

  // Save exactly the text this tab displayed.
  const shown = await streaming.textContent();
  await page.getByTestId("action-save-fragment").click();
  const fragment = page.locator("[data-testid=message][data-kind=fragment]");
  await fragment.waitFor();
  assert.equal(await fragment.getByTestId("fragment-label").textContent(), "Saved fragment");
  assert.equal(await fragment.getByTestId("message-body").textContent(), shown);

  // Continue from the saved point: a fresh reply is published.
  await page.getByTestId("action-continue").click();
  await page.locator("[data-testid=message][data-role=assistant][data-kind=text]").waitFor({ timeout: 20000 });
  await shot(page, "continued");
  assert.deepEqual(errors, []);
  assert.match(server.check(), /^ok/);
});
