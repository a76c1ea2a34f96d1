import { test } from "node:test";
import assert from "node:assert/strict";
import { AxeBuilder } from "@axe-core/playwright";
import { serveForFile, newPage, newThread, openTwoTabs, queueWhileStreaming, send, runStatus, eventually, messageTexts, shot, audit } from "./harness.mjs";

// axe-core on every state of the page a user meets, light and dark, wide
// and narrow: no violation of any impact (audit, in the harness). (axe finds what rules can
// find — names, roles, contrast, structure — not whether the page makes
// sense read aloud.)
let server, browser;
// (The largest reply size, so that an endless reply outlasts the audits of
// its streaming state: at 40 ms a paragraph, minutes.)
serveForFile({ pace: "40ms", args: ["-outbox-latency", "1500ms", "-max-reply-bytes", String(4 << 20)] }, (s, b) => ([server, browser] = [s, b]));

test("no axe violation of any impact on any page state", async () => {
  const context = await browser.newContext();
  const errors = [];
  const page = await newPage(context, errors);
  const found = [];

  await page.goto(server.url + "/");
  found.push(...(await audit(page, "home")));
  await newThread(page, server.url);
  found.push(...(await audit(page, "empty conversation")));

  await send(page, "Show me markdown about goroutines");
  await runStatus(page, "idle", 20000);
  found.push(...(await audit(page, "Markdown reply")));
  await send(page, "Order 2 red mugs and 3 blue plates");
  await page.getByTestId("order").waitFor({ timeout: 20000 });
  await runStatus(page, "idle", 20000);
  found.push(...(await audit(page, "order card")));

  // (A reply that never ends by itself: the state lasts as long as the audit.)
  await send(page, "endless: a long reply that keeps streaming");
  await page.getByTestId("streaming-text").filter({ hasText: /\S/ }).waitFor();
  found.push(...(await audit(page, "streaming")));
  await page.getByTestId("cancel").click();
  await page.getByTestId("receipt").waitFor({ timeout: 20000 });
  found.push(...(await audit(page, "receipt")));
  await page.getByTestId("action-save-fragment").click();
  const fragment = page.locator("[data-testid=message][data-kind=fragment]");
  await fragment.waitFor();
  await fragment.getByTestId("delete-draft").click();
  found.push(...(await audit(page, "fragment, delete asked")));
  await fragment.getByTestId("delete-draft-keep").click();

  await page.getByTestId("tree-toggle").click();
  await eventually(async () => assert.ok((await page.getByTestId("tree-node").count()) > 2));
  found.push(...(await audit(page, "checkpoints")));
  await page.getByTestId("tree-toggle").click();

  await send(page, "Please send an email to anna@example.com about the spring order");
  await page.getByTestId("confirm-card").waitFor({ timeout: 20000 });
  found.push(...(await audit(page, "confirmation card")));
  await page.getByTestId("confirm-op").click();
  await runStatus(page, "idle", 20000);
  found.push(...(await audit(page, "tool step done")));
  await page.getByTestId("operations").locator(":scope > summary").click();
  await page.getByTestId("operations").getByTestId("operation-details").locator("summary").click();
  await page.getByTestId("operation-key").last().waitFor();
  found.push(...(await audit(page, "operation log open")));

  await page.setViewportSize({ width: 390, height: 844 });
  await page.getByTestId("drawer-toggle").click();
  await page.getByTestId("sidebar").waitFor({ state: "visible" });
  for (const scheme of ["light", "dark"]) {
    await page.emulateMedia({ colorScheme: scheme });
    const r = await new AxeBuilder({ page }).analyze();
    for (const v of r.violations) found.push(`drawer @390 ${scheme}: ${v.id} (${v.impact}): ${v.help}`);
  }

  assert.deepEqual(found, []);
  assert.deepEqual(errors, []);
  await context.close();
});

// auditNotice runs axe on a state whose message sits next to the composer
// (at 1280 and 390 px, light and dark, each screenshot into e2e/artifacts)
// and checks that at 360 px the page is no wider than the window. visible
// is the element the state is about: it must still be shown when each
// check runs, or the check would be of another state.
async function auditNotice(page, state, visible) {
  const found = [];
  for (const [w, h] of [[1280, 820], [390, 844], [360, 740]]) {
    for (const scheme of ["light", "dark"]) {
      await page.setViewportSize({ width: w, height: h });
      await page.emulateMedia({ colorScheme: scheme });
      assert.ok(await visible.isVisible(), `${state} @${w} ${scheme}: still shown`);
      // (In view: a resize leaves the page scrolled elsewhere.)
      await visible.scrollIntoViewIfNeeded();
      if (w === 360) {
        const f = await page.evaluate(() => ({ sw: document.documentElement.scrollWidth, iw: window.innerWidth }));
        if (f.sw > f.iw) found.push(`${state} @360 ${scheme}: the page is ${f.sw} px wide in a ${f.iw} px window`);
      } else {
        const r = await new AxeBuilder({ page }).analyze();
        for (const v of r.violations) found.push(`${state} @${w} ${scheme}: ${v.id} (${v.impact}) on ${v.nodes.map((n) => n.target.join(" ")).slice(0, 3).join(", ")}: ${v.help}`);
      }
      await shot(page, `a11y-${state.replace(/\W+/g, "-")}-${w}-${scheme}`, { fullPage: false });
    }
  }
  await page.setViewportSize({ width: 1280, height: 820 });
  await page.emulateMedia({ colorScheme: "light" });
  return found;
}

// While the server is down Chromium logs each refused reconnect of the
// page's WebSocket (and the page's probe of the API) as a console error:
// the outage the page shows, not a page error.
const refused = /^(WebSocket connection to 'ws:\/\/[^']+\/ws' failed: .*(ERR_CONNECTION_REFUSED|ERR_CONNECTION_RESET|ERR_EMPTY_RESPONSE)|Failed to load resource: net::(ERR_CONNECTION_REFUSED|ERR_CONNECTION_RESET|ERR_EMPTY_RESPONSE)$)/;

test("no axe violation of any impact, and nothing wider than 360 px, with the conflict banner, the notes next to the composer and the server away", async () => {
  const { context, errors, a, b, socketB, url } = await openTwoTabs(browser, server.url);
  await send(a, "Short: hello?");
  await eventually(async () => assert.equal((await messageTexts(a)).length, 2), { timeout: 15000 });
  await runStatus(a, "idle");
  await b.goto(url);
  await b.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  const found = [];

  // The conflict banner: tab B missed what tab A did, then sends.
  socketB.mode = "stale";
  await send(a, "Short: and another thing?");
  await eventually(async () => assert.equal((await messageTexts(a)).length, 4), { timeout: 15000 });
  await runStatus(a, "idle");
  await send(b, "Short: my question from tab B?");
  const banner = b.getByTestId("conflict-banner");
  await banner.waitFor();
  found.push(...(await auditNotice(b, "conflict banner", banner)));
  socketB.mode = "pass";
  await b.getByTestId("conflict-reload").click();
  await banner.waitFor({ state: "hidden" });
  await b.close();

  // Enter while a reply streams: the message is queued under the reply.
  // (About 1,400 words at 40 ms: it streams through every check.)
  const queued = await queueWhileStreaming(a, "Repeat after me: " + "a reply that streams for a while ".repeat(200));
  found.push(...(await auditNotice(a, "Enter while streaming", queued)));
  assert.equal(await a.locator("#thread").getAttribute("data-run-status"), "running", "the queue was checked while the reply streamed");
  const notice = a.getByTestId("notice");

  // The server goes away mid-reply and Cancel is pressed: the page says it
  // is reconnecting and that the cancel waits for the connection.
  await server.stop();
  await a.locator("[data-testid=conn-status][data-state=reconnecting]").waitFor();
  await a.getByTestId("cancel").click();
  const pending = a.getByTestId("cancel-pending");
  await pending.filter({ hasText: "Cancel will be sent when the connection is back" }).waitFor();
  // No note: what was queued stays, kept with the conversation.
  await eventually(async () => assert.ok(await notice.isHidden(), `no note after the cancel: ${await notice.textContent()}`));
  assert.ok(await queued.isVisible(), "the queued message stays while the server is away");
  assert.equal(await a.getByTestId("cancel").textContent(), "Cancel pending");
  const cancelBox = await a.getByTestId("cancel").evaluate((e) => ({ h: e.getBoundingClientRect().height, line: parseFloat(getComputedStyle(e).lineHeight) }));
  assert.ok(cancelBox.h < 2 * cancelBox.line, `the button's label is on one line: ${JSON.stringify(cancelBox)}`);
  found.push(...(await auditNotice(a, "reconnecting, cancel kept", pending)));
  await server.start(server.addr);
  await a.getByTestId("receipt").waitFor({ timeout: 20000 });
  await a.locator("[data-testid=conn-status][data-state=live]").waitFor();
  // The cancel paused the queue: the message waits, and the page says so.
  await a.getByTestId("queue-state").filter({ hasText: "Paused: the reply was stopped." }).waitFor();
  found.push(...(await auditNotice(a, "queue paused after the cancel", a.getByTestId("queue-resume"))));

  // Away again with nothing running: Enter says it is not connected and
  // keeps the text; the note goes once the page is live again.
  await server.stop();
  await a.locator("[data-testid=conn-status][data-state=reconnecting]").waitFor();
  await a.getByTestId("composer-input").fill("a question while offline");
  await a.getByTestId("composer-input").press("Enter");
  await notice.filter({ hasText: "Not connected, so nothing was sent" }).waitFor();
  assert.equal(await a.getByTestId("composer-input").inputValue(), "a question while offline");
  found.push(...(await auditNotice(a, "not connected", notice)));
  await server.start(server.addr);
  await a.locator("[data-testid=conn-status][data-state=live]").waitFor({ timeout: 15000 });
  await eventually(async () => assert.ok(await notice.isHidden(), "the note goes once the connection is back"));
  assert.equal(await a.getByTestId("composer-input").inputValue(), "a question while offline");

  assert.deepEqual(found, []);
  assert.deepEqual(errors.filter((e) => !refused.test(e)), []);
  await context.close();
});
