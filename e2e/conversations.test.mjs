import { test } from "node:test";
import assert from "node:assert/strict";
import { AxeBuilder } from "@axe-core/playwright";
import { serveForFile, startServer, newPage, shot, eventually } from "./harness.mjs";

// violations lists axe's violations of any impact on the page as it is.
async function violations(page, state) {
  const r = await new AxeBuilder({ page }).analyze();
  return r.violations.map((v) => `${state}: ${v.id} (${v.impact}) on ${v.nodes.map((n) => n.target.join(" ")).slice(0, 3).join(", ")}: ${v.help}`);
}

// The conversation list past its first page.
let server, browser;
// (104 conversations made over the API in a moment: more than the
// per-user command budget lets through by default.)
serveForFile({ pace: "1ms", args: ["-user-command-rate", "1000"] }, (s, b) => ([server, browser] = [s, b]));

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

// twoTabs opens url in two pages of one browser context (two tabs), both
// live.
async function twoTabs(url, errors, viewport = { width: 1280, height: 820 }) {
  const context = await browser.newContext({ viewport });
  const tabs = [];
  for (let i = 0; i < 2; i++) {
    const p = await newPage(context, errors, { viewport });
    await p.goto(url);
    await p.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
    tabs.push(p);
  }
  return { context, a: tabs[0], b: tabs[1] };
}

test("delete a conversation while its reply streams: it asks first (Esc keeps it), the reply is stopped with its receipt in the other tab, which then says the conversation is gone and keeps what was typed", async () => {
  // A server of its own, whose replies stream slowly: the reply below
  // never ends by itself (endless:, stopped by the delete), yet stays short
  // enough to draw (about 2 KB a second).
  const slow = await startServer({ pace: "200ms" });
  try {
    const errors = [];
    const snap = await slow.api("/api/threads", { method: "POST", body: "{}" });
    const { context, a, b } = await twoTabs(`${slow.url}/t/${snap.thread_id}`, errors);
    const runStatus = (p) => p.locator("#thread").getAttribute("data-run-status");
    await a.getByTestId("composer-input").fill("endless: a long reply that keeps streaming");
    await a.getByTestId("send").click();
    await a.getByTestId("streaming-text").waitFor({ timeout: 15000 });
    await b.getByTestId("streaming-text").waitFor({ timeout: 15000 });
    await a.getByTestId("composer-input").fill("a follow-up I was writing");

    // It asks first; Esc keeps the conversation and the reply.
    await b.getByTestId("delete-thread").click();
    const ask = b.getByTestId("delete-confirm");
    await ask.waitFor();
    assert.equal(await b.evaluate(() => document.activeElement?.getAttribute("data-testid")), "delete-thread-keep", "the focus is on the answer that keeps it");
    for (const [w, h] of [[1280, 820], [390, 844]]) {
      for (const scheme of ["light", "dark"]) {
        await b.setViewportSize({ width: w, height: h });
        await b.emulateMedia({ colorScheme: scheme });
        const box = await ask.boundingBox();
        assert.ok(box && box.y >= 0 && box.y + box.height <= h, `the question is whole in view at ${w} ${scheme}`);
        assert.ok(await b.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth));
        assert.deepEqual(await violations(b, `delete question ${w} ${scheme}`), []);
        await shot(b, `delete-ask-${w}-${scheme}`, { fullPage: false });
      }
    }
    await b.setViewportSize({ width: 1280, height: 820 });
    await b.emulateMedia({ colorScheme: "light" });
    await b.keyboard.press("Escape");
    await ask.waitFor({ state: "hidden" });
    assert.equal(await runStatus(b), "running", "Esc closed the question and cancelled nothing");
    assert.equal(await b.evaluate(() => document.activeElement?.getAttribute("data-testid")), "delete-thread", "the focus is back on Delete");

    await b.getByTestId("delete-thread").click();
    await b.getByTestId("delete-thread-confirm").click();
    await b.waitForURL(slow.url + "/");
    assert.equal(await b.locator(`[data-testid=thread-link][href="/t/${snap.thread_id}"]`).count(), 0, "gone from the list");

    // The other tab: the reply was stopped (its receipt), then the
    // conversation is gone; what was typed stays.
    await a.getByTestId("receipt").waitFor({ timeout: 15000 });
    const notice = a.getByTestId("notice");
    await notice.filter({ hasText: "This conversation was deleted" }).waitFor();
    assert.equal(await a.getByTestId("receipt-heading").textContent(), "Stopped from another tab: the conversation is being deleted");
    assert.equal(await a.getByTestId("receipt").locator("button").count(), 0, "nothing offered that a deleted conversation cannot do");
    assert.equal(await a.getByTestId("thread-group").count(), 0, "no day heading left over the emptied list");
    assert.equal(await a.getByTestId("composer-input").inputValue(), "a follow-up I was writing");
    assert.ok(await a.getByTestId("send").isDisabled());
    assert.ok(await a.getByTestId("delete-thread").isHidden());
    assert.equal(await a.locator(`[data-testid=thread-link][href="/t/${snap.thread_id}"]`).count(), 0);
    await a.getByTestId("composer-input").press("Enter");
    await notice.filter({ hasText: "nothing more can be sent here" }).waitFor();
    for (const [w, h] of [[1280, 820], [390, 844]]) {
      for (const scheme of ["light", "dark"]) {
        await a.setViewportSize({ width: w, height: h });
        await a.emulateMedia({ colorScheme: scheme });
        const box = await notice.boundingBox();
        assert.ok(box && box.y >= 0 && box.y + box.height <= h, `the notice is in view at ${w} ${scheme}`);
        assert.ok(await a.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth));
        assert.deepEqual(await violations(a, `deleted elsewhere ${w} ${scheme}`), []);
        await shot(a, `delete-gone-${w}-${scheme}`, { fullPage: false });
      }
    }
    await a.setViewportSize({ width: 1280, height: 820 });
    await a.emulateMedia({ colorScheme: "light" });
    assert.equal((await slow.api("/api/threads?limit=200")).threads.filter((t) => t.thread_id === snap.thread_id).length, 0);
    const run = (await slow.api(`/api/threads/${snap.thread_id}/operations`).catch((e) => e.message));
    assert.match(String(run), /404/, "the deleted conversation is not_found");

    // What was typed goes to a new conversation.
    await a.getByTestId("start-with-text").click();
    await a.waitForURL((u) => /\/t\/thr_/.test(u.pathname) && !u.pathname.endsWith(snap.thread_id));
    await a.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
    assert.equal(await a.getByTestId("composer-input").inputValue(), "a follow-up I was writing");
    await context.close();
    assert.deepEqual(errors, []);
    assert.match(slow.check(), /^ok/);
  } finally {
    await slow.close();
  }
});

// named waits until a conversation's first reply has ended (a reply is
// published and no run is active: right after Send the run may not have
// reached the server yet) and the model has named it, and returns the
// title. (The name is asked for beside the reply; it is not an event.)
async function named(id) {
  let title = "";
  await eventually(async () => {
    const snap = await api("GET", `/api/threads/${id}`);
    assert.equal(snap.active_run, null);
    assert.ok(snap.messages.some((m) => m.role === "assistant"), "a reply is published");
    assert.notEqual(snap.title, "New conversation");
    title = snap.title;
  }, { timeout: 20000 });
  return title;
}

test("a new conversation is named by the model once its first reply ends (heading, title box, list, window title); a hostile request stays text everywhere", async () => {
  const errors = [];
  const page = await newPage(browser, errors, { viewport: { width: 1280, height: 820 } });
  await page.goto(server.url + "/");
  await page.getByTestId("new-thread").click();
  await page.waitForURL(/\/t\/thr_/);
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  const request = "Could you please help me think through, step by step, how to repaint a small wooden boat before summer?";
  await page.getByTestId("composer-input").fill(request);
  await page.getByTestId("send").click();
  const id = new URL(page.url()).pathname.slice(3);
  const title = await named(id);
  assert.ok(title && !request.startsWith(title.replace(/…$/, "")), `the model's title ${JSON.stringify(title)}, not the request's start`);
  await eventually(async () => {
    assert.equal(await page.getByTestId("title-input").inputValue(), title);
    assert.equal(await page.getByTestId("thread-heading").textContent(), title);
    assert.equal(await page.title(), `${title} · gateway`);
    assert.equal(await page.locator(`[data-testid=thread-link][href="/t/${id}"]`).getAttribute("title"), title);
  });

  // Hostile text as a request (and so as both titles): shown as typed.
  const hostile = `Repeat after me: <img src=x onerror="window.__pwned=1"> <script>window.__pwned=2</script> "quotes" & **stars**`;
  await page.getByTestId("new-thread").click();
  await page.waitForURL((u) => !u.pathname.endsWith(id));
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  const hid = new URL(page.url()).pathname.slice(3);
  await page.getByTestId("composer-input").fill(hostile);
  await page.getByTestId("send").click();
  const htitle = await named(hid);
  await eventually(async () => assert.equal(await page.getByTestId("thread-heading").textContent(), htitle));
  const user = page.locator("[data-testid=message][data-role=user] [data-testid=message-body]").first();
  assert.equal(await user.textContent(), hostile, "the request shows as typed");
  assert.equal(await user.locator("img, script").count(), 0);
  await page.reload();
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  assert.equal(await page.getByTestId("thread-heading").textContent(), htitle);
  assert.equal(await page.locator(`[data-testid=thread-link][href="/t/${hid}"]`).getAttribute("title"), htitle);
  assert.equal(await page.locator("[data-testid=sidebar] img, [data-testid=thread] img").count(), 0);
  assert.equal(await page.evaluate(() => window.__pwned ?? null), null);
  await shot(page, "title-hostile", { fullPage: false });
  assert.deepEqual(errors, []);
});
