// Two tabs of one browser on one conversation: live sync, and what a tab
// that fell behind is told when it acts on what it saw. Tab B is made stale
// without any test hook in the product: the test sits on B's WebSocket and
// drops the server's events (acks and errors still pass) while tab A moves
// the thread on, so B's next run.start carries an old expected_state_version.
import { test } from "node:test";
import assert from "node:assert/strict";
import { serveForFile, openTwoTabs, shot, send, runStatus, messageTexts, eventually } from "./harness.mjs";

let server, browser;
serveForFile({ pace: "40ms" }, (s, b) => ([server, browser] = [s, b]));

// twoTabs opens A on a new thread and B (whose socket the test controls) on
// the same thread, in one browser context.
async function twoTabs() {
  const tabs = await openTwoTabs(browser, server.url);
  const { b, url } = tabs;
  await b.goto(url);
  await b.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  await b.getByTestId("send").and(b.locator(":enabled")).waitFor();
  return tabs;
}

// exchange sends text from page and waits for the reply to be published.
async function exchange(page, text, messagesAfter) {
  await send(page, text);
  await eventually(async () => assert.equal((await messageTexts(page)).length, messagesAfter), { timeout: 15000 });
  await runStatus(page, "idle");
}

// makeStale has A move the thread on while B sees none of it, then B sends:
// the server refuses on version and B shows the conflict banner.
async function makeStale({ a, b, socketB }, n) {
  const seen = await messageTexts(b);
  socketB.mode = "stale";
  await exchange(a, `Short: question ${n} from tab A?`, seen.length + 2);
  assert.ok(socketB.dropped.some((e) => e.type === "message.published"), "B missed A's messages");
  assert.deepEqual(await messageTexts(b), seen, "B still shows the old state");
  const staleVersion = Number(await b.locator("#thread").getAttribute("data-state-version"));
  assert.ok(staleVersion < Number(await a.locator("#thread").getAttribute("data-state-version")));

  const mine = `Short: question ${n} from tab B?`;
  await send(b, mine);
  const banner = b.getByTestId("conflict-banner");
  await banner.waitFor();
  const start = socketB.fromClient.findLast((c) => c.type === "run.start");
  assert.equal(start.expected_state_version, staleVersion, "B sent the version it saw");
  assert.match(await banner.textContent(), /changed in another tab/);
  // Nothing B typed is lost, and nothing was applied.
  assert.equal(await b.getByTestId("composer-input").inputValue(), mine);
  assert.deepEqual(await messageTexts(b), seen);
  await runStatus(b, "idle");
  return { seen, mine };
}

test("two tabs: live sync, then a stale tab is told and Reload brings it up to date", async () => {
  const tabs = await twoTabs();
  const { context, errors, a, b, socketB } = tabs;

  // Live sync: what A sends and receives appears in B without a reload.
  await exchange(a, "Short: hello from tab A?", 2);
  await eventually(async () => assert.deepEqual(await messageTexts(b), await messageTexts(a)));
  await runStatus(b, "idle");
  // And the other way round.
  await exchange(b, "Short: hello from tab B?", 4);
  await eventually(async () => assert.deepEqual(await messageTexts(a), await messageTexts(b)));

  const { mine } = await makeStale(tabs, 1);
  // The banner is where the user's text is (in the composer), in view.
  const box = await b.getByTestId("conflict-banner").boundingBox();
  const view = b.viewportSize();
  assert.ok(box && box.y >= 0 && box.y + box.height <= view.height, `the banner is in view: ${JSON.stringify(box)} in ${JSON.stringify(view)}`);
  assert.ok(await b.getByTestId("conflict-reload").isVisible());
  assert.ok(await b.getByTestId("conflict-fork").isVisible());
  await shot(b, "tabs-conflict");

  socketB.mode = "pass";
  await b.getByTestId("conflict-reload").click();
  await b.getByTestId("conflict-banner").waitFor({ state: "hidden" });
  await eventually(async () => assert.deepEqual(await messageTexts(b), await messageTexts(a)));
  assert.equal(await b.locator("#thread").getAttribute("data-state-version"), await a.locator("#thread").getAttribute("data-state-version"));
  await shot(b, "tabs-reloaded");

  // Up to date, B's request now goes through, and A sees it.
  assert.equal(await b.getByTestId("composer-input").inputValue(), mine);
  await b.getByTestId("composer-input").press("Enter");
  await eventually(async () => assert.equal((await messageTexts(b)).length, 8), { timeout: 15000 });
  await eventually(async () => assert.deepEqual(await messageTexts(a), await messageTexts(b)));
  assert.ok(await b.getByTestId("conflict-banner").isHidden());
  assert.deepEqual(errors, [], "no console errors");
  await context.close();
});

test("two tabs: a stale tab forks from what it saw into a new conversation", async () => {
  const tabs = await twoTabs();
  const { context, errors, a, b, socketB, url } = tabs;
  await exchange(a, "Short: bread baking at home?", 2);
  await eventually(async () => assert.deepEqual(await messageTexts(b), await messageTexts(a)));
  await runStatus(b, "idle");

  const { seen, mine } = await makeStale(tabs, 2);
  socketB.mode = "pass";
  await b.getByTestId("conflict-fork").click();
  await b.waitForURL((u) => /^\/t\/thr_/.test(u.pathname) && u.href !== url);
  await b.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  assert.deepEqual(await messageTexts(b), seen, "the fork holds exactly what B saw");
  assert.equal(await b.getByTestId("composer-input").inputValue(), mine, "what B typed went along to the fork");
  assert.ok(await b.getByTestId("conflict-banner").isHidden());
  await shot(b, "tabs-forked");

  // The original conversation is untouched: A still has all four messages.
  assert.equal((await messageTexts(a)).length, 4);
  await a.reload();
  assert.equal((await messageTexts(a)).length, 4);
  assert.deepEqual(errors, [], "no console errors");
  await context.close();
});

test("two tabs: the tab that did not cancel says the cancel came from another tab", async () => {
  const tabs = await twoTabs();
  const { context, errors, a, b } = tabs;
  await send(a, "How do I keep basil alive through the winter indoors?");
  await b.getByTestId("streaming-text").filter({ hasText: /\S/ }).waitFor({ timeout: 15000 });
  await b.getByTestId("cancel").click();
  await a.getByTestId("receipt").waitFor({ timeout: 15000 });
  await b.getByTestId("receipt").waitFor({ timeout: 15000 });
  assert.equal(await a.getByTestId("receipt-heading").textContent(), "Cancelled from another tab");
  assert.equal(await b.getByTestId("receipt-heading").textContent(), "Cancelled");
  await shot(a, "tabs-cancelled-elsewhere", { fullPage: false });
  assert.deepEqual(errors, [], "no console errors");
  await context.close();
});

test("two tabs: a request edited after a cancel shows ‹ 2/2 ›; switching back moves both tabs, and waits while a reply streams", async () => {
  const tabs = await twoTabs();
  const { context, errors, a, b, socketB } = tabs;
  const original = "How do I keep basil alive through the winter indoors?";
  await send(a, original);
  await a.getByTestId("streaming-text").filter({ hasText: /\S/ }).waitFor({ timeout: 15000 });
  await a.getByTestId("cancel").click();
  await a.getByTestId("receipt").waitFor({ timeout: 15000 });
  await a.getByTestId("action-edit").click();
  await a.getByTestId("editing").waitFor();
  const edited = "Short: basil in winter?";
  await a.getByTestId("composer-input").fill(edited);
  await a.getByTestId("composer-input").press("Enter");
  for (const page of [a, b]) {
    await eventually(async () => assert.deepEqual((await messageTexts(page)).map((m) => m.text)[0], edited), { timeout: 15000 });
  }
  await runStatus(a, "idle");

  // The edited request is version 2 of 2, on both tabs; only it has versions.
  const firstUser = (page) => page.locator("[data-testid=messages] > [data-testid=message][data-role=user]").first();
  for (const page of [a, b]) {
    await eventually(async () => assert.equal(await firstUser(page).getByTestId("branch-pos").textContent(), "2/2"));
    assert.equal(await page.getByTestId("branch-nav").count(), 1);
    assert.equal(await firstUser(page).getByTestId("branch-nav").getAttribute("aria-label"), "Version 2 of 2");
    assert.ok(await firstUser(page).getByTestId("branch-next").isDisabled(), "no version after the last");
  }
  for (const [w, h] of [[1280, 820], [390, 844]]) {
    for (const scheme of ["light", "dark"]) {
      await a.setViewportSize({ width: w, height: h });
      await a.emulateMedia({ colorScheme: scheme });
      // On a phone the list slides away as a drawer (0.18 s) once narrow.
      if (w < 720) await eventually(async () => assert.ok(await a.getByTestId("sidebar").isHidden()));
      await shot(a, `branch-nav-${w}-${scheme}`, { fullPage: false });
    }
  }
  await a.setViewportSize({ width: 1100, height: 800 });

  // Back to the original request: both tabs show it, as version 1 of 2,
  // with what the cancel left of it (the request, no reply).
  await firstUser(a).getByTestId("branch-prev").click();
  for (const page of [a, b]) {
    await eventually(async () => assert.equal((await messageTexts(page))[0]?.text, original), { timeout: 10000 });
    await eventually(async () => assert.equal(await firstUser(page).getByTestId("branch-pos").textContent(), "1/2"));
    assert.ok(!(await messageTexts(page)).some((m) => m.text === edited), "the edited branch is not shown");
  }
  assert.ok(!socketB.frames.some((f) => f.from === "server" && f.obj.type === "error"), "tab B got no error");
  await shot(b, "branch-switched-other-tab", { fullPage: false });

  // A reply streaming: the versions cannot be switched, and the page says why.
  await send(a, "How do I keep rosemary alive through the winter indoors?");
  await runStatus(a, "running");
  const prevOrNext = firstUser(a).getByTestId("branch-next");
  await eventually(async () => assert.ok(await prevOrNext.isDisabled(), "switching waits for the reply"));
  assert.match(await prevOrNext.getAttribute("title"), /Wait for the reply to finish/);
  await a.getByTestId("cancel").click();
  await a.getByTestId("receipt").waitFor({ timeout: 15000 });
  await eventually(async () => assert.ok(await firstUser(a).getByTestId("branch-next").isEnabled(), "enabled again once the run ended"));

  // And forward again, to the edited branch with its reply.
  await firstUser(a).getByTestId("branch-next").click();
  for (const page of [a, b]) {
    await eventually(async () => assert.equal((await messageTexts(page))[0]?.text, edited), { timeout: 10000 });
    await eventually(async () => assert.equal((await messageTexts(page)).length, 2));
  }
  assert.deepEqual(errors, [], "no console errors");
  await context.close();
});
