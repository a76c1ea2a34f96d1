import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, launch, newPage, shot, eventually } from "./harness.mjs";

// The conversation list past its first page.
let server, browser;
before(async () => {
  server = await startServer({ pace: "1ms" });
  browser = await launch();
});
after(async () => {
  await browser?.close();
  assert.match(server.check(), /^ok/);
  await server?.close();
});

// api calls the HTTP API as a program would (auth none: the local user).
async function api(method, path, body) {
  const r = await fetch(server.url + path, {
    method,
    headers: body ? { "Content-Type": "application/json" } : {},
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await r.text();
  assert.ok(r.ok, `${method} ${path}: ${r.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

// written creates n conversations with one request each ("short: <word> i"),
// oldest first, and waits until every reply ended.
async function written(n, word) {
  const ids = [];
  for (let i = 0; i < n; i++) {
    const snap = await api("POST", "/api/threads", {});
    const run = await api("POST", `/api/threads/${snap.thread_id}/runs`, { expected_state_version: snap.state_version, user_message: `short: ${word} ${i}` });
    ids.push([snap.thread_id, run.run_id]);
  }
  for (const [, run] of ids) {
    await eventually(async () => assert.equal((await api("GET", `/api/runs/${run}`)).status, "completed"), { timeout: 20000 });
  }
  return ids.map(([thread]) => thread);
}

test("the list shows 100 conversations, Older conversations adds the rest in place (and after a search, the rest of its results); without the script a link to the next page", async () => {
  await written(104, "orchard");
  // The list's order: most recently updated first (a reply's end updates).
  const ids = (await api("GET", "/api/threads?limit=200")).threads.map((t) => t.thread_id).reverse();
  assert.equal(ids.length, 104);
  const errors = [];
  const page = await newPage(browser, errors, { viewport: { width: 1280, height: 820 } });
  await page.goto(server.url + "/");
  const links = page.getByTestId("thread-link");
  const more = page.getByTestId("thread-more");
  assert.equal(await links.count(), 100);
  assert.ok(await more.isVisible());
  const hrefs = async () => links.evaluateAll((as) => as.map((a) => a.getAttribute("href")));
  assert.deepEqual(await hrefs(), ids.slice(4).reverse().map((id) => "/t/" + id), "newest first");
  await more.click();
  await eventually(async () => assert.equal(await links.count(), 104));
  assert.deepEqual(await hrefs(), ids.toReversed().map((id) => "/t/" + id), "the older ones follow, none twice");
  assert.ok(await more.isHidden(), "nothing older is left");
  assert.equal(await page.getByTestId("thread-group").count(), 1, "one Today heading, not one per page");
  await more.evaluate((a) => a.hidden = false); // (to look at it)
  await page.getByTestId("sidebar").evaluate((s) => s.scrollTo(0, s.scrollHeight));
  await shot(page, "conversations-older", { fullPage: false });
  await more.evaluate((a) => a.hidden = true);

  // A search whose answer has more than its first page (50).
  const box = page.getByTestId("thread-search-input");
  await box.fill("orchard");
  await page.getByTestId("thread-search-status").filter({ hasText: "found (the latest: more below)" }).waitFor();
  assert.equal(await links.count(), 50);
  await more.click(); // (pages of 100 from here)
  await eventually(async () => assert.equal(await links.count(), 104));
  assert.deepEqual(await hrefs(), ids.toReversed().map((id) => "/t/" + id));
  assert.ok(await more.isHidden());
  await box.press("Escape");
  await eventually(async () => assert.equal(await links.count(), 100));
  assert.ok(await more.isVisible(), "emptied, the list is the first page again, with its link");

  // Without the script: a link to the next page.
  const plain = await browser.newContext({ javaScriptEnabled: false });
  const noJS = await plain.newPage();
  await noJS.goto(server.url + "/");
  await noJS.getByTestId("thread-more").click();
  await noJS.waitForURL(/cursor=/);
  assert.deepEqual(
    await noJS.getByTestId("thread-link").evaluateAll((as) => as.map((a) => a.getAttribute("href"))),
    ids.slice(0, 4).reverse().map((id) => "/t/" + id),
  );
  assert.ok(await noJS.getByTestId("thread-more").isHidden());
  await plain.close();

  // On a phone the drawer scrolls to it.
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto(server.url + "/");
  await page.getByTestId("drawer-toggle").click().catch(() => {}); // (no toggle on the home page: the list is the page)
  await page.getByTestId("thread-more").scrollIntoViewIfNeeded();
  assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth));
  await shot(page, "conversations-older-phone", { fullPage: false });
  assert.deepEqual(errors, []);
});
