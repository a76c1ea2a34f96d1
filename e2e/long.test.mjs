// A long conversation (40 exchanges, built over the HTTP API as another
// client would) at a desktop and two phone sizes: it opens at its latest
// message (the latest 50, the rest offered above them), a stale tab's
// conflict banner shows where the user looks, and the checkpoints timeline
// opens in view and stays readable. (e2e/longperf.test.mjs: 2,000
// messages, scrolling back, and what it costs.)
import { test } from "node:test";
import assert from "node:assert/strict";
import { serveForFile, newPage, shot, send, runStatus, messageTexts, interceptSocket, eventually, apiExchange } from "./harness.mjs";

let server, browser;
serveForFile({ pace: "2ms", args: ["-search-latency", "50ms"] }, (s, b) => ([server, browser] = [s, b]));

const plants = ["tomatoes", "basil", "roses", "ferns", "tulips", "lavender", "pumpkins", "apple trees"];
const viewports = [
  [1280, 820],
  [390, 844],
  [360, 740],
];

// fits: the page is no wider than the window (nothing scrolls sideways).
const fits = (page) => page.evaluate(() => ({ scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth }));
async function assertFits(page, what) {
  const f = await fits(page);
  assert.ok(f.scrollWidth <= f.innerWidth, `${what}: the page is ${f.scrollWidth} px wide in a ${f.innerWidth} px window`);
}

// inView: the element's box lies inside the viewport.
async function inView(locator) {
  return locator.evaluate((e) => {
    const r = e.getBoundingClientRect();
    return { top: r.top, bottom: r.bottom, height: window.innerHeight, ok: r.height > 0 && r.top >= 0 && r.bottom <= window.innerHeight };
  });
}

async function shots(page, name, scroll) {
  for (const scheme of ["light", "dark"]) {
    await page.emulateMedia({ colorScheme: scheme });
    if (scroll) await scroll();
    await shot(page, `${name}-${scheme}`, { fullPage: false });
  }
  await page.emulateMedia({ colorScheme: "light" });
}

test("a 40-exchange conversation opens at its latest message; a stale tab's banner and the checkpoints timeline are in view and fit at 1280, 390 and 360 px", async () => {
  const created = await server.api("/api/threads", { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
  const threadID = created.thread_id;
  // Mostly plain questions; every few a Markdown reply, an order card or a
  // catalog search (a tool step, and an entry in the operation log); the
  // last reply is Markdown, which the page renders after its first paint.
  for (let i = 0; i < 40; i++) {
    const plant = plants[i % plants.length];
    const text =
      i === 39 || i % 8 === 3
        ? `Question ${i + 1}: show me markdown about ${plant}`
        : i % 8 === 5
          ? `Order ${(i % 3) + 1} packs of ${plant} seeds`
          : i % 8 === 7
            ? `Search the catalog for ${plant} seeds`
            : `Question ${i + 1}: how do I look after ${plant} in a small garden through the year?`;
    await apiExchange(server, threadID, text);
  }
  const history = (await server.api(`/api/threads/${threadID}`)).messages;
  const searches = history.filter((m) => m.role === "tool").length;
  assert.equal(searches, 4);
  const url = `${server.url}/t/${threadID}`;
  let exchanges = 40;
  const firstPaint = 50; // the latest messages a page opens with (web/history.go)

  for (const [w, h] of viewports) {
    const context = await browser.newContext({ viewport: { width: w, height: h } });
    const errors = [];
    const b = await newPage(context, errors, { viewport: { width: w, height: h } });
    const socketB = await interceptSocket(b);
    await b.goto(url);
    await b.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
    assert.equal((await messageTexts(b)).length, firstPaint);
    assert.equal((await b.getByTestId("show-earlier").textContent()).trim(), `Show earlier messages (${2 * exchanges + 2 * searches - firstPaint} more)`);
    assert.ok(await b.evaluate(() => document.documentElement.scrollHeight > 10 * window.innerHeight), "long enough to need a lot of scrolling");

    // The operation log (four searches), read after the first paint, is
    // there, folded under its count.
    await b.getByTestId("operations-count").filter({ hasText: "4 calls" }).waitFor();
    assert.equal(await b.getByTestId("operations").evaluate((d) => d.open), false);
    // It opens at the latest message: the page is scrolled to the end and
    // the last reply ends in view, above the composer.
    const last = b.locator("[data-testid=messages] > [data-testid=message]").last();
    await eventually(async () => {
      const at = await b.evaluate(() => ({ y: window.scrollY, h: window.innerHeight, sh: document.documentElement.scrollHeight }));
      assert.ok(at.y + at.h >= at.sh - 2, `${w}: opens at the end (${JSON.stringify(at)})`);
      const lastBox = await last.boundingBox();
      const composer = await b.getByTestId("composer").boundingBox();
      assert.ok(lastBox.y + lastBox.height > 0 && lastBox.y + lastBox.height <= composer.y + 24, `${w}: the latest message ends above the composer (${lastBox.y + lastBox.height} vs ${composer.y})`);
    });
    assert.ok(await b.getByTestId("jump-latest").isHidden(), "no Jump to latest at the latest message");
    await assertFits(b, `opened at ${w}`);
    await shots(b, `long-open-${w}`);

    // A second tab moves the conversation on while this one sees none of
    // it; this tab's next request is refused and the banner says so, in
    // view, where the user's text is.
    const a = await newPage(context, errors, { viewport: { width: w, height: h } });
    await a.goto(url);
    await a.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
    socketB.mode = "stale";
    await send(a, `Short question from the other tab at ${w} px?`);
    await eventually(async () => assert.equal((await messageTexts(a)).length, firstPaint + 2), { timeout: 20000 });
    await runStatus(a, "idle");
    exchanges++;
    assert.equal((await messageTexts(b)).length, firstPaint, "the stale tab still shows the old history");
    const mine = `My own question at ${w} px?`;
    await send(b, mine);
    const banner = b.getByTestId("conflict-banner");
    await banner.waitFor();
    await eventually(async () => {
      const v = await inView(banner);
      assert.ok(v.ok, `${w}: the banner is in view: top ${v.top}, bottom ${v.bottom}, window ${v.height}`);
    });
    const input = await inView(b.getByTestId("composer-input"));
    assert.ok(input.ok, `${w}: the text it is about is in view too: ${JSON.stringify(input)}`);
    assert.equal(await b.getByTestId("composer-input").inputValue(), mine);
    await assertFits(b, `banner at ${w}`);
    await shots(b, `long-conflict-${w}`);

    socketB.mode = "pass";
    await b.getByTestId("conflict-reload").click();
    await banner.waitFor({ state: "hidden" });
    await eventually(async () => assert.equal((await messageTexts(b)).length, firstPaint + 2));

    // The checkpoints timeline: opened in view with the focus on it, every
    // entry within the panel, the page no wider than the window.
    const { checkpoints } = await server.api(`/api/threads/${threadID}/checkpoints`);
    const toggle = b.getByTestId("tree-toggle");
    await toggle.click();
    await eventually(async () => assert.equal(await b.getByTestId("tree-node").count(), checkpoints.length));
    assert.ok(checkpoints.length >= 2 * exchanges + 2 * searches + 1);
    // Each point reads as text: a reply without its Markdown, a card and a
    // tool step in words, never their source.
    const whats = await b.getByTestId("tree-what").allTextContents();
    assert.deepEqual(whats.filter((t) => /\*\*|##|\{"|```|`/.test(t)), [], "no Markdown or JSON source in the timeline");
    assert.ok(whats.some((t) => /^Reply: Question[^*#]*, in short Here is a structured answer about Question/.test(t)), `a Markdown reply as text: ${whats.filter((t) => /in short/.test(t))}`);
    assert.ok(whats.some((t) => /^Reply: Order: \d × [a-z ]+ seeds; \d+\.\d\d EUR$/.test(t)), "an order card in words");
    assert.ok(whats.some((t) => /^Tool result: Catalog search for “[a-z ]+ seeds”$/.test(t)), "a tool step in words");
    assert.equal(await b.evaluate(() => document.activeElement?.closest("[data-testid=tree]") !== null && document.activeElement?.textContent), "Checkpoints", "the focus is on the timeline's heading");
    const tree = b.getByTestId("tree");
    await eventually(async () => {
      const top = await tree.evaluate((e) => e.getBoundingClientRect().top);
      const headBottom = await b.locator(".thread-head").evaluate((e) => e.getBoundingClientRect().bottom);
      assert.ok(top >= headBottom - 1 && top < h / 2, `${w}: the timeline opens in view, below the header (top ${top}, header ends at ${headBottom})`);
    });
    const wide = await tree.evaluate((panel) => {
      const p = panel.getBoundingClientRect();
      return [...panel.querySelectorAll("[data-testid=tree-node]"), ...panel.querySelectorAll("[data-testid=tree-node] > *")]
        .map((e) => ({ e, r: e.getBoundingClientRect() }))
        .filter(({ e, r }) => r.left < p.left - 0.5 || r.right > p.right + 0.5 || e.scrollWidth > e.clientWidth + 1)
        .map(({ e, r }) => `${e.className || e.tagName}: ${Math.round(r.left)}–${Math.round(r.right)} in ${Math.round(p.left)}–${Math.round(p.right)}`);
    });
    assert.deepEqual(wide, [], `${w}: no entry is wider than the panel`);
    await assertFits(b, `timeline at ${w}`);
    await shots(b, `long-timeline-${w}`);
    // Closing it and opening it again brings it back into view.
    await toggle.click();
    await tree.waitFor({ state: "hidden" });
    await b.evaluate(() => window.scrollTo({ top: document.documentElement.scrollHeight }));
    await toggle.click();
    await eventually(async () => {
      const v = await tree.evaluate((e) => e.getBoundingClientRect().top);
      assert.ok(v >= 0 && v < h / 2, `${w}: opened again, in view (top ${v})`);
    });
    for (const scheme of ["light", "dark"]) {
      await b.emulateMedia({ colorScheme: scheme });
      await assertFits(b, `timeline at ${w}, ${scheme}`);
    }
    assert.deepEqual(errors, [], "no console errors");
    await context.close();
  }
});
