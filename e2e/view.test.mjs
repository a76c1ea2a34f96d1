import { test } from "node:test";
import assert from "node:assert/strict";
import { serveForFile, openPage, newPage, shot, newThread, send, runStatus, eventually, queueWhileStreaming, messageTexts } from "./harness.mjs";

// Where the user looks, what the user typed, and who said what.
let server, browser;
serveForFile({ pace: "3ms" }, (s, b) => ([server, browser] = [s, b]));

const atBottom = (page) => page.evaluate(() => window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 40);
const assistants = (page) => page.locator("[data-testid=messages] > [data-testid=message][data-role=assistant]");

async function exchange(page, text) {
  const n = await assistants(page).count();
  await send(page, text);
  await eventually(async () => assert.equal(await assistants(page).count(), n + 1), { timeout: 20000 });
  await runStatus(page, "idle", 20000);
}

test("a long conversation opens at its latest message; scrolled up, Jump to latest brings it back", async () => {
  const { page, errors, url } = await openPage(browser, { thread: server.url });
  for (let i = 0; i < 12; i++) await exchange(page, `Question ${i} about gardening and soil`);
  await page.goto(url);
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  assert.ok(await page.evaluate(() => document.documentElement.scrollHeight > 3 * window.innerHeight), "long enough to need scrolling");
  await eventually(async () => assert.ok(await atBottom(page), "opens at the latest message"));
  assert.ok(await page.getByTestId("jump-latest").isHidden());
  await page.evaluate(() => window.scrollTo({ top: 0 }));
  await page.getByTestId("jump-latest").waitFor();
  for (const [w, h] of [[1280, 820], [390, 844]]) {
    for (const scheme of ["light", "dark"]) {
      await page.setViewportSize({ width: w, height: h });
      await page.emulateMedia({ colorScheme: scheme });
      await page.evaluate(() => window.scrollTo({ top: 0 }));
      await page.getByTestId("jump-latest").waitFor();
      await shot(page, `view-jump-latest-${w}-${scheme}`, { fullPage: false });
    }
  }
  await page.getByTestId("jump-latest").click();
  await eventually(async () => assert.ok(await atBottom(page)));
  await eventually(async () => assert.ok(await page.getByTestId("jump-latest").isHidden()));

  // Sending from higher up brings the view to the request and its reply.
  await page.evaluate(() => window.scrollTo({ top: 0 }));
  await exchange(page, "One more question about compost");
  assert.ok(await atBottom(page), "the reply is in view");

  // Scrolled up while a reply streams, Cancel's receipt is brought into
  // view above the composer (on a phone, where it used to land under it).
  await page.setViewportSize({ width: 390, height: 844 });
  await send(page, "Repeat after me: " + "a reply long enough to cancel ".repeat(300));
  await page.getByTestId("streaming-text").filter({ hasText: /\S/ }).waitFor();
  await page.evaluate(() => window.scrollTo({ top: 0 }));
  // Pressed where it is: the growing reply moves it between Playwright's
  // checks and its click, which then lands elsewhere.
  await page.getByTestId("cancel").dispatchEvent("click");
  await page.getByTestId("receipt").waitFor({ timeout: 15000 });
  await eventually(async () => {
    const receipt = await page.getByTestId("receipt").boundingBox();
    const composer = await page.getByTestId("composer").boundingBox();
    assert.ok(receipt.y >= 0 && receipt.y + receipt.height <= composer.y + 24, `receipt at ${receipt.y}–${receipt.y + receipt.height}, the composer starts at ${composer.y}`);
  });
  await shot(page, "view-receipt-in-view-390", { fullPage: false });
  await page.setViewportSize({ width: 1280, height: 820 });

  // The checkpoints of a long conversation: a flat timeline, opened in
  // view with the focus in it, never wider than the window.
  await page.evaluate(() => window.scrollTo({ top: 0 }));
  await page.getByTestId("tree-toggle").click();
  await eventually(async () => assert.equal(await page.getByTestId("tree-node").count(), 1 + 13 * 2 + 1)); // and the cancelled request
  assert.equal(await page.evaluate(() => document.activeElement?.textContent), "Checkpoints");
  const top = await page.getByTestId("tree").evaluate((e) => e.getBoundingClientRect().top);
  const headBottom = await page.locator(".thread-head").evaluate((e) => e.getBoundingClientRect().bottom);
  assert.ok(top >= headBottom - 1 && top < (await page.evaluate(() => window.innerHeight)), `the panel opens in view, below the header (top ${top}, header ends at ${headBottom})`);
  assert.match(await page.locator("[data-testid=tree-node][data-branch=current] [data-testid=tree-what]").textContent(), /^You: Repeat after me/);
  assert.equal(await page.locator("[data-testid=tree-node][data-branch=current] [data-testid=tree-tags]").textContent(), "current · reply not finished");
  for (const [w, h] of [[1280, 820], [390, 844]]) {
    for (const scheme of ["light", "dark"]) {
      await page.setViewportSize({ width: w, height: h });
      await page.emulateMedia({ colorScheme: scheme });
      assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth), `the timeline fits ${w} px`);
      await page.getByTestId("tree").scrollIntoViewIfNeeded();
      await shot(page, `view-timeline-${w}-${scheme}`, { fullPage: false });
    }
  }
  assert.deepEqual(errors, []);
});

test("typed text survives a reload, goes along to a fork, and is gone once sent", async () => {
  const { page, errors, url } = await openPage(browser, { thread: server.url });
  await exchange(page, "Short question about tomatoes");
  await page.getByTestId("composer-input").fill("a thought I have not sent yet");
  await page.reload();
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  assert.equal(await page.getByTestId("composer-input").inputValue(), "a thought I have not sent yet");

  // Fork (from the checkpoints panel): the text is in the fork's composer.
  await page.getByTestId("tree-toggle").click();
  await page.locator("[data-testid=tree-list] [data-action=fork-at]").last().click();
  await page.waitForURL((u) => u.href !== url);
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  assert.equal(await page.getByTestId("composer-input").inputValue(), "a thought I have not sent yet");

  await page.goto(url);
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  await exchange(page, (await page.getByTestId("composer-input").inputValue()) || "sent");
  assert.equal(await page.getByTestId("composer-input").inputValue(), "");
  await page.reload();
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  assert.equal(await page.getByTestId("composer-input").inputValue(), "", "a sent text is not restored");
  assert.deepEqual(errors, []);
});

test("Enter while a reply streams queues the text under the reply, in view; it is sent by itself when the reply ends", async () => {
  const { page, errors, socket } = await openPage(browser, { thread: server.url, intercept: true });
  // Long enough (about 4,800 words at 3 ms, some 15 s) to still be
  // streaming when Enter is pressed on a busy machine.
  const request = "Repeat after me: " + "winter gardens need care ".repeat(1200);
  const queued = await queueWhileStreaming(page, request);
  // Where the user looks: the queued message is in view, above the composer.
  await eventually(async () => {
    const [box, composer] = await Promise.all([queued.boundingBox(), page.getByTestId("composer").boundingBox()]);
    assert.ok(box.y >= 0 && box.y + box.height <= composer.y + 24, `queued at ${box.y}–${box.y + box.height}, the composer starts at ${composer.y}`);
  });
  // (The picture holds the stream back a moment: taken while the page
  // scrolls with the reply, it would be cut off at one end.)
  socket.mode = "hold";
  await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
  await shot(page, "view-enter-while-streaming", { fullPage: false });
  socket.release();
  // The reply ends, and the queued message goes by itself: its reply follows.
  await eventually(async () => assert.deepEqual((await messageTexts(page)).slice(-3).map((m) => [m.role, m.role === "user" ? m.text : ""]), [["assistant", ""], ["user", "my next question"], ["assistant", ""]]), { timeout: 60000 });
  await runStatus(page, "idle", 60000);
  assert.ok(await page.getByTestId("queue").isHidden(), "nothing left in the queue");
  assert.ok(await page.getByTestId("notice").isHidden(), "no note at any point");
  assert.equal(await page.getByTestId("composer-input").inputValue(), "");
  assert.deepEqual(errors, []);
});

test("who said what: a speaker on every message, an h1, a status without decoration, focus on the composer as a conversation opens", async () => {
  const errors = [];
  const page = await newPage(browser, errors);
  await page.goto(server.url + "/");
  await page.getByTestId("new-thread").click();
  await page.waitForURL(/\/t\/thr_/);
  await eventually(async () => assert.equal(await page.evaluate(() => document.activeElement?.getAttribute("data-testid")), "composer-input"));
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  await exchange(page, "Short question about roses");
  const speakers = async () => page.locator("[data-testid=messages] > [data-testid=message] > [data-testid=speaker]").allTextContents();
  assert.deepEqual(await speakers(), ["You said:", "Assistant said:"]);
  await page.reload();
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  assert.deepEqual(await speakers(), ["You said:", "Assistant said:"], "the first paint names them too");
  assert.equal(await page.locator("h1").count(), 1);
  assert.equal(await page.locator("h1").textContent(), await page.getByTestId("title-input").inputValue());
  const dot = await page.getByTestId("conn-status").evaluate((e) => getComputedStyle(e, "::before").content);
  assert.ok(dot === '""' || dot === "none", `the status dot is drawn, not text: ${dot}`);
  assert.equal(await page.getByRole("status").filter({ hasText: "Live" }).textContent(), "Live");
  // A conversation with messages opens with the focus in its box too
  // (e2e/daily.test.mjs: not when the user put it elsewhere first).
  await eventually(async () => assert.equal(await page.evaluate(() => document.activeElement?.getAttribute("data-testid")), "composer-input"));
  assert.deepEqual(errors, []);
});

test("phone: the conversation list is a drawer; the conversation starts at the top of the screen", async () => {
  const errors = [];
  const page = await newPage(browser, errors, { viewport: { width: 390, height: 844 } });
  const url = await newThread(page, server.url); // from the home page, where the list is the page
  await exchange(page, "Short question about ferns");
  const sidebar = page.getByTestId("sidebar");
  assert.ok(!(await sidebar.isVisible()), "no list above the conversation");
  const head = await page.locator(".thread-head").boundingBox();
  assert.ok(head && head.y < 20, `the conversation starts at the top (${head?.y})`);
  await page.getByTestId("drawer-toggle").click();
  await sidebar.waitFor({ state: "visible" });
  assert.equal(await page.getByTestId("drawer-toggle").getAttribute("aria-expanded"), "true");
  await eventually(async () => assert.equal(await page.evaluate(() => document.activeElement?.getAttribute("aria-current")), "page", "the focus is on the current conversation in the list"));
  for (const scheme of ["light", "dark"]) {
    await page.emulateMedia({ colorScheme: scheme });
    await page.waitForTimeout(250); // the drawer slides in over 180 ms: let the screenshot see it open
    await shot(page, `view-drawer-390-${scheme}`, { fullPage: false });
  }
  await page.keyboard.press("Escape");
  await sidebar.waitFor({ state: "hidden" });
  assert.equal(await page.evaluate(() => document.activeElement?.getAttribute("data-testid")), "drawer-toggle");
  await page.getByTestId("drawer-toggle").click();
  await sidebar.waitFor({ state: "visible" });
  await page.getByTestId("drawer-close").click();
  await sidebar.waitFor({ state: "hidden" });
  await page.getByTestId("drawer-toggle").click();
  await page.getByTestId("new-thread").click();
  await page.waitForURL((u) => u.href !== url && /\/t\/thr_/.test(u.pathname));
  // The keyboard way: Ctrl+Shift+O, from the composer, opens another.
  const before = page.url();
  await page.getByTestId("composer-input").press("Control+Shift+O");
  await page.waitForURL((u) => u.href !== before && /\/t\/thr_/.test(u.pathname));
  await eventually(async () => assert.equal(await page.evaluate(() => document.activeElement?.getAttribute("data-testid")), "composer-input"));
  // At 1280 px the list is beside the conversation, no drawer.
  await page.setViewportSize({ width: 1280, height: 820 });
  assert.ok(await sidebar.isVisible());
  assert.ok(!(await page.getByTestId("drawer-toggle").isVisible()));
  assert.deepEqual(errors, []);
});

test("the conversation list: no entry for a conversation never written to, grouped by day, forks marked", async () => {
  const { page, errors, url } = await openPage(browser, { thread: server.url });
  await exchange(page, "Short question about tulips");
  await page.goto(server.url + "/");
  const links = page.getByTestId("thread-link");
  const listed = await links.count();
  await page.getByTestId("new-thread").click();
  await page.waitForURL(/\/t\/thr_/);
  const empty = page.url();
  assert.equal(await links.count(), listed + 1, "the open one is listed");
  assert.equal(await page.locator("[data-testid=thread-link][aria-current=page]").count(), 1);
  await page.goto(server.url + "/");
  assert.equal(await links.count(), listed, "left as it was, it is not listed");
  assert.ok(!(await links.evaluateAll((as) => as.map((a) => a.getAttribute("href")))).includes(new URL(empty).pathname));
  assert.equal(await page.getByTestId("thread-group").first().textContent(), "Today");

  await page.goto(url);
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  await page.getByTestId("tree-toggle").click();
  await page.locator("[data-testid=tree-list] [data-action=fork-at]").last().click();
  await page.waitForURL((u) => u.href !== url);
  const current = page.locator("[data-testid=thread-link][aria-current=page]");
  assert.equal(await current.getByTestId("fork-badge").textContent(), "fork");
  await shot(page, "view-sidebar-fork", { fullPage: false });
  assert.deepEqual(errors, []);
});

test("search: as you type the list shows the conversations with every word, in a title or a message; Esc and Ctrl+K; without the script a form", async () => {
  const { page, errors, url } = await openPage(browser, { thread: server.url });
  await exchange(page, "Short question about pumpkins and frost");
  const url2 = await newThread(page, server.url);
  await exchange(page, "Short question about pumpkin soup");
  const links = page.getByTestId("thread-link");
  const all = await links.count();
  assert.ok(all >= 2);
  const box = page.getByTestId("thread-search-input");
  const status = page.getByTestId("thread-search-status");

  // Ctrl+K goes to the box from the composer.
  await page.getByTestId("composer-input").focus();
  await page.keyboard.press("Control+k");
  await eventually(async () => assert.equal(await page.evaluate(() => document.activeElement?.getAttribute("data-testid")), "thread-search-input"));
  await page.keyboard.type("PUMPKIN frost");
  await status.filter({ hasText: "1 conversation found." }).waitFor();
  assert.equal(await links.count(), 1);
  assert.equal(await links.first().getAttribute("href"), new URL(url).pathname, "the one with both words (one of them only in its message)");
  await shot(page, "view-search-one", { fullPage: false });

  await box.fill("pumpkin");
  await status.filter({ hasText: "2 conversations found." }).waitFor();
  await box.fill("pumpkin cucumber");
  await status.filter({ hasText: "No conversation has all of these words." }).waitFor();
  assert.equal(await links.count(), 0);
  await shot(page, "view-search-none", { fullPage: false });

  // Esc empties the box and brings the whole list back (and cancels nothing).
  await box.press("Escape");
  await eventually(async () => assert.equal(await links.count(), all));
  assert.ok(await status.isHidden());
  assert.equal(await box.inputValue(), "");
  // Titles that share their first words still differ on screen: a title
  // of up to two lines is shown whole (and in full on hover).
  const cut = await page.getByTestId("thread-title").evaluateAll((ts) =>
    ts.filter((t) => t.textContent.length <= 40 && (t.scrollHeight > t.clientHeight + 1 || t.scrollWidth > t.clientWidth + 1)).map((t) => t.textContent),
  );
  assert.deepEqual(cut, [], "short titles are not cut");
  // (Named by the model from each request: two names, each listed whole.)
  const names = await Promise.all([url, url2].map(async (u) => (await server.api(`/api/threads/${new URL(u).pathname.slice(3)}`)).title));
  assert.notEqual(names[0], names[1]);
  const listed = await links.evaluateAll((as) => as.map((a) => [a.getAttribute("href"), a.title, a.textContent.trim()]));
  for (const [i, u] of [url, url2].entries()) {
    const entry = listed.find(([href]) => href === new URL(u).pathname);
    assert.ok(entry && entry[1] === names[i] && entry[2] === names[i], `the list shows ${JSON.stringify(names[i])}: ${JSON.stringify(entry)}`);
  }

  // Without the script: the box is a form, the home page lists the results.
  const plain = await browser.newContext({ javaScriptEnabled: false });
  const noJS = await plain.newPage();
  await noJS.goto(server.url + "/?q=" + encodeURIComponent("pumpkin frost"));
  assert.equal(await noJS.getByTestId("thread-link").count(), 1);
  assert.equal(await noJS.getByTestId("thread-search-input").inputValue(), "pumpkin frost");
  await noJS.goto(server.url + "/?q=cucumber");
  assert.equal(await noJS.getByTestId("thread-link").count(), 0);
  assert.match(await noJS.getByTestId("thread-search-status").textContent(), /No conversation has all of these words/);
  await plain.close();

  // On a phone, Ctrl+K opens the drawer at the box.
  for (const scheme of ["light", "dark"]) {
    const phone = await newPage(browser, errors, { viewport: { width: 390, height: 844 } });
    await phone.emulateMedia({ colorScheme: scheme });
    await phone.goto(url);
    await phone.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
    await phone.keyboard.press("Control+k");
    await phone.getByTestId("sidebar").waitFor({ state: "visible" });
    await eventually(async () => assert.equal(await phone.evaluate(() => document.activeElement?.getAttribute("data-testid")), "thread-search-input"));
    await phone.keyboard.type("soup");
    await phone.getByTestId("thread-search-status").filter({ hasText: "1 conversation found." }).waitFor();
    await shot(phone, `view-search-phone-${scheme}`, { fullPage: false });
    await phone.close();
  }
  await page.emulateMedia({ colorScheme: "dark" });
  await box.fill("pumpkin");
  await status.filter({ hasText: "2 conversations found." }).waitFor();
  await shot(page, "view-search-dark", { fullPage: false });
  assert.deepEqual(errors, []);
});
