// A 2,000-message conversation, made through the HTTP API as a program
// would (1,000 exchanges with the demo model), as a user sees it: it opens
// at its latest message, scrolling up brings the older messages by cursor
// with the reader's place held (the "Show earlier messages" button is the
// keyboard's way), and typing works. Axe finds nothing of any impact in
// each state, at 1280 and 390 px, light and dark, and each is pictured.
//
// It also measures, and prints (as test diagnostics): the time to build
// the conversation, the page's time to interactive and long tasks, the
// checkpoints' answer, and typing latency at 20 and 2,000 messages, idle
// and while a reply streams. Those timings are figures for docs/page.md
// ("Long conversations") and BENCHMARKS.md, not asserted: on a loaded
// 2-core machine they vary by a factor of two. What is asserted is what
// cannot flake: what the user sees, and the checkpoints' answer growing
// linearly with the conversation.
import { test } from "node:test";
import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { AxeBuilder } from "@axe-core/playwright";
import { serveForFile, startServer, newPage, shots, eventually } from "./harness.mjs";

const exchanges = 1000;
let server, browser, built;
const threads = {};

// build makes n exchanges on thread id over the HTTP API: each request
// (POST /runs) once the reply before it completed, as its run.completed
// on the thread's event stream says (with the next state_version).
async function build(base, id, n) {
  const snap = await (await fetch(`${base}/api/threads/${id}`)).json();
  let version = snap.state_version;
  const stop = new AbortController();
  const res = await fetch(`${base}/api/threads/${id}/events?after_seq=${snap.last_seq}`, { signal: stop.signal });
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  const waiting = new Map(); // run_id → resolve(state_version)
  const ended = new Map(); // run_id → state_version, when it ended before it was waited for
  const reading = (async () => {
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += decoder.decode(value, { stream: true });
      for (let i; (i = buf.indexOf("\n\n")) >= 0; buf = buf.slice(i + 2)) {
        const data = buf.slice(0, i).split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
        if (!data) continue;
        const ev = JSON.parse(data);
        if (!ev.type.startsWith("run.") || !["run.completed", "run.failed", "run.cancelled"].includes(ev.type)) continue;
        if (ev.type !== "run.completed") throw new Error(`run ${ev.run_id}: ${ev.type} ${data}`);
        const w = waiting.get(ev.run_id);
        if (w) w(ev.state_version);
        else ended.set(ev.run_id, ev.state_version);
      }
    }
  })().catch((err) => {
    if (err.name !== "AbortError") throw err;
  });
  for (let i = 0; i < n; i++) {
    const r = await fetch(`${base}/api/threads/${id}/runs`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ expected_state_version: version, user_message: `Question ${i + 1}: how do I look after ${["tomatoes", "basil", "roses", "ferns"][i % 4]} in a small garden through the year?` }),
    });
    const ack = await r.json();
    assert.equal(r.status, 201, JSON.stringify(ack));
    version = ended.get(ack.run_id) ?? (await new Promise((resolve) => waiting.set(ack.run_id, resolve)));
  }
  stop.abort();
  await reading;
}

async function newThreadID(base) {
  const r = await fetch(`${base}/api/threads`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
  return (await r.json()).thread_id;
}

// The conversations are made on a server whose demo model answers at once
// (-demo-pace 0); the pages then see a server that streams a word every
// 20 ms, so that a reply streams long enough to type while it does.
serveForFile(
  async () => {
    // (1,000 exchanges as fast as the server answers: more commands a
    // second than the per-user budget lets through by default.)
    const maker = await startServer({ pace: "0", args: ["-user-command-rate", "1000"] });
    threads.small = await newThreadID(maker.url);
    await build(maker.url, threads.small, 10);
    threads.big = await newThreadID(maker.url);
    const t0 = performance.now();
    await build(maker.url, threads.big, exchanges);
    built = (performance.now() - t0) / 1000;
    await maker.stop();
    threads.dir = maker.dir;
    return { pace: "20ms", db: maker.db };
  },
  (s, b) => ([server, browser] = [s, b]),
  { cleanup: () => threads.dir && rmSync(threads.dir, { recursive: true, force: true }) },
);

// perfScript runs in the page before its own script: it records long
// tasks (≥ 50 ms), key events slower than a frame (Event Timing), each
// key's latency (keydown → after the next frame: a requestAnimationFrame,
// then a task), and when Send became enabled (the page follows the
// conversation: a request can be sent).
function perfScript() {
  const P = (window.__perf = { longtasks: [], keys: [], events: [] });
  new PerformanceObserver((l) => P.longtasks.push(...l.getEntries().map((e) => ({ start: e.startTime, duration: e.duration })))).observe({ type: "longtask", buffered: true });
  new PerformanceObserver((l) => P.events.push(...l.getEntries().filter((e) => /^key/.test(e.name)).map((e) => e.duration))).observe({ type: "event", durationThreshold: 16, buffered: true });
  document.addEventListener(
    "keydown",
    (e) => {
      const t = e.timeStamp;
      requestAnimationFrame(() => setTimeout(() => P.keys.push(performance.now() - t), 0));
    },
    true,
  );
  new MutationObserver(() => {
    const send = document.querySelector("[data-testid=send]");
    if (send && !send.disabled && !P.sendEnabled) P.sendEnabled = performance.now();
  }).observe(document, { subtree: true, childList: true, attributes: true });
}

// opened measures a page just opened, once its reads after the first
// paint ended and 1.5 s passed. Time to interactive: the end of the last
// long task before the first second after the first contentful paint with
// no long task and no HTTP request of the page in flight (the WebSocket
// aside), and not before Send is enabled.
async function opened(page) {
  await page.waitForFunction(() => performance.getEntriesByType("resource").some((r) => /\/checkpoints/.test(r.name) && r.responseEnd > 0), null, { timeout: 60000 });
  await page.waitForTimeout(1500);
  return page.evaluate(() => {
    const P = window.__perf;
    const nav = performance.getEntriesByType("navigation")[0];
    const res = performance.getEntriesByType("resource");
    const fcp = performance.getEntriesByName("first-contentful-paint")[0]?.startTime ?? 0;
    const busy = [
      ...P.longtasks.map((t) => [t.start, t.start + t.duration, true]),
      [0, nav.responseEnd, false],
      ...res.filter((r) => ["fetch", "xmlhttprequest", "script", "link"].includes(r.initiatorType)).map((r) => [r.startTime, r.responseEnd, false]),
    ].sort((a, b) => a[0] - b[0]);
    let quietFrom = fcp;
    let lastTask = fcp;
    for (const [s, e, task] of busy) {
      if (s >= quietFrom + 1000) break;
      if (e > quietFrom) quietFrom = e;
      if (task) lastTask = Math.max(lastTask, e);
    }
    const cp = res.find((r) => /\/checkpoints/.test(r.name));
    const round = (x) => Math.round(x);
    return {
      tti: round(Math.max(lastTask, nav.domContentLoadedEventEnd, P.sendEnabled ?? 0)),
      fcp: round(fcp),
      longtasks: P.longtasks.map((t) => `${round(t.start)}+${round(t.duration)}`).join(" ") || "none",
      checkpoints: cp ? `${cp.decodedBodySize} bytes (${cp.transferSize} transferred) in ${round(cp.responseEnd - cp.startTime)} ms` : "not read",
      shown: document.querySelectorAll("[data-testid=messages] > [data-testid=message]").length,
      domNodes: document.getElementsByTagName("*").length,
    };
  });
}

// typing types n characters into the composer, one every 40 ms, and
// answers their latencies (median, 95th percentile, max, in ms) and how
// many key events Event Timing found slower than 16 ms.
async function typing(page, n, text = "x") {
  await page.evaluate(() => {
    window.__perf.keys.length = 0;
    window.__perf.events.length = 0;
  });
  for (let i = 0; i < n; i++) {
    await page.keyboard.type(text[i % text.length]);
    await page.waitForTimeout(40);
  }
  await page.waitForTimeout(200);
  const { keys, events } = await page.evaluate(() => ({ keys: [...window.__perf.keys].sort((a, b) => a - b), events: window.__perf.events }));
  const at = (p) => Math.round(keys[Math.min(keys.length - 1, Math.ceil(p * keys.length) - 1)]);
  return `median ${at(0.5)} ms, p95 ${at(0.95)} ms, max ${Math.round(keys[keys.length - 1])} ms (${keys.length} keys; ${events.length} key events over 16 ms)`;
}

// axe runs axe-core at 1280 and 390 px, light and dark (prepare brings
// into view what is checked) and answers every violation, of any impact.
async function axe(page, state, prepare) {
  const found = [];
  for (const [w, h] of [[1280, 820], [390, 844]]) {
    for (const scheme of ["light", "dark"]) {
      await page.setViewportSize({ width: w, height: h });
      await page.emulateMedia({ colorScheme: scheme });
      await prepare?.();
      const r = await new AxeBuilder({ page }).analyze();
      for (const v of r.violations) found.push(`${state} @${w} ${scheme}: ${v.id} (${v.impact}) on ${v.nodes.map((n) => n.target.join(" ")).slice(0, 3).join(", ")}: ${v.help}`);
    }
  }
  await page.setViewportSize({ width: 1280, height: 820 });
  await page.emulateMedia({ colorScheme: "light" });
  return found;
}

const items = (page) => page.locator("[data-testid=messages] > [data-testid=message]");
const toEnd = (page) => page.evaluate(() => window.scrollTo(0, document.documentElement.scrollHeight));

// endsInView: the latest message ends in view, above the composer, and
// the page is scrolled to its end.
async function endsInView(page, what) {
  await eventually(async () => {
    const at = await page.evaluate(() => ({ y: window.scrollY, h: window.innerHeight, sh: document.documentElement.scrollHeight }));
    assert.ok(at.y + at.h >= at.sh - 2, `${what}: at the end (${JSON.stringify(at)})`);
    const last = await items(page).last().boundingBox();
    const composer = await page.getByTestId("composer").boundingBox();
    assert.ok(last.y + last.height > 0 && last.y + last.height <= composer.y + 24, `${what}: the latest message ends above the composer (${last.y + last.height} vs ${composer.y})`);
  });
}

// visibleText: the text of the message items that lie in the view.
const visibleText = (page) =>
  page.evaluate(() =>
    [...document.querySelectorAll("[data-testid=messages] > [data-testid=message]")]
      .filter((e) => {
        const r = e.getBoundingClientRect();
        return r.bottom > 0 && r.top < window.innerHeight;
      })
      .map((e) => e.textContent)
      .join("\n"),
  );

let page, errors;

test("a 2,000-message conversation opens at its latest message, reading checkpoints that grow linearly", async (t) => {
  t.diagnostic(`built ${exchanges} exchanges (${2 * exchanges} messages) over the HTTP API in ${built.toFixed(1)} s (demo model at -demo-pace 0)`);
  const body = await (await fetch(`${server.url}/api/threads/${threads.big}/checkpoints?lists=delta`)).text();
  const { checkpoints } = JSON.parse(body);
  assert.ok(checkpoints.length >= 2 * exchanges, `${checkpoints.length} checkpoints`);
  // What each checkpoint adds to its parent's lists, not its lists whole
  // (those would be about 70 MB here): a few hundred bytes each.
  assert.ok(body.length < 500 * checkpoints.length, `${body.length} bytes for ${checkpoints.length} checkpoints`);
  t.diagnostic(`checkpoints?lists=delta: ${checkpoints.length} checkpoints in ${body.length} bytes (${Math.round(body.length / checkpoints.length)} per checkpoint)`);

  errors = [];
  page = await newPage(await browser.newContext(), errors, { viewport: { width: 1280, height: 820 } });
  await page.addInitScript(perfScript);
  await page.goto(`${server.url}/t/${threads.big}`);
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  const figures = await opened(page);
  t.diagnostic(`2,000 messages, opened (cold): ${JSON.stringify(figures)}`);
  // The latest page of the history: the last reply in view above the box,
  // the rest offered above.
  assert.equal(figures.shown, 50);
  await endsInView(page, "opened");
  assert.match(await visibleText(page), new RegExp(`Question ${exchanges}: how do I look after`), "the latest request is in view");
  assert.equal((await page.getByTestId("show-earlier").textContent()).trim(), `Show earlier messages (${2 * exchanges - 50} more)`);
  await shots(page, "longperf-open", { prepare: () => toEnd(page) });
  assert.deepEqual(await axe(page, "opened", () => toEnd(page)), []);
  // Opened again with the script and styles cached, as a user who comes
  // from the list.
  await page.goto(`${server.url}/t/${threads.big}`);
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  t.diagnostic(`2,000 messages, opened again (cached): ${JSON.stringify(await opened(page))}`);
  await endsInView(page, "opened again");
  assert.deepEqual(errors, []);
});

test("scrolling up brings the older messages by cursor, the reader's place held; the button does it from the keyboard", async (t) => {
  await page.mouse.move(640, 400);
  // Each page's answer waits until the test has looked at the page.
  const held = [];
  const requested = [];
  await page.route(/\/api\/threads\/[^/]+\/messages\?/, async (route) => {
    requested.push(new URL(route.request().url()).searchParams.get("before"));
    await new Promise((r) => held.push(r));
    await route.continue();
  });
  const userTexts = () => items(page).evaluateAll((els) => els.filter((e) => e.dataset.role === "user").map((e) => e.querySelector("[data-testid=message-body]").textContent));
  for (let n = 1; n <= 3; n++) {
    const firstBefore = await items(page).first().getAttribute("data-message-id");
    // The reader scrolls up with the wheel until the next page is asked for.
    await eventually(
      async () => {
        if (held.length === 0) await page.mouse.wheel(0, -1200);
        assert.equal(held.length, 1, "a page of older messages was asked for");
      },
      { timeout: 30000, interval: 100 },
    );
    assert.equal(requested[requested.length - 1], firstBefore, "by cursor: the messages before the first one shown");
    await page.waitForTimeout(300); // the wheel has settled
    const status = page.getByTestId("earlier-status");
    assert.equal(await status.textContent(), "Loading earlier messages…");
    if (n === 1) {
      const inBox = () => page.getByTestId("earlier").evaluate((e) => e.scrollIntoView({ block: "center" }));
      await shots(page, "longperf-loading", { prepare: inBox });
      assert.deepEqual(await axe(page, "loading older messages", inBox), []);
      await page.getByTestId("earlier").evaluate((e) => window.scrollTo(0, e.getBoundingClientRect().bottom + window.scrollY + 200));
    }
    // Where the reader is, just before the page comes in.
    const anchor = await page.evaluate(() => {
      const a = [...document.querySelectorAll("[data-testid=messages] > [data-testid=message]")].find((e) => e.getBoundingClientRect().bottom > 0);
      return { id: a.dataset.messageId, top: a.getBoundingClientRect().top };
    });
    const count = await items(page).count();
    held.shift()();
    await eventually(async () => assert.equal(await items(page).count(), count + 50));
    const top = await page.locator(`[data-testid=message][data-message-id="${anchor.id}"]`).evaluate((e) => e.getBoundingClientRect().top);
    assert.ok(Math.abs(top - anchor.top) <= 2, `page ${n}: the message read stays where it was (top ${anchor.top} → ${top})`);
    // The older messages are above, in order, and come into view.
    const texts = await userTexts();
    const numbers = texts.map((s) => Number(s.match(/^Question (\d+):/)?.[1]));
    assert.deepEqual(numbers, numbers.map((_, i) => numbers[0] + i), "each request once, in order");
    assert.equal(numbers[numbers.length - 1], exchanges);
    const older = numbers[0] + 12;
    await eventually(
      async () => {
        if (!(await visibleText(page)).includes(`Question ${older}:`)) await page.mouse.wheel(0, -400);
        assert.match(await visibleText(page), new RegExp(`Question ${older}: how do I`), `an older request, ${older}, in view`);
      },
      { timeout: 20000, interval: 100 },
    );
    if (n === 1) {
      // (Checked once: later pages make the same state, longer.)
      const at = () => page.locator("[data-testid=messages] > [data-testid=message][data-role=user]").filter({ hasText: `Question ${older}:` }).evaluate((e) => e.scrollIntoView({ block: "center" }));
      await shots(page, "longperf-scrolled", { prepare: at });
      assert.deepEqual(await axe(page, "scrolled back", at), []);
    }
  }
  await page.unroute(/\/api\/threads\/[^/]+\/messages\?/);

  // From the keyboard: the button brings the next page.
  const count = await items(page).count();
  const button = page.getByTestId("show-earlier");
  await button.focus();
  await page.keyboard.press("Enter");
  await eventually(async () => assert.equal(await items(page).count(), count + 50));
  assert.equal((await button.textContent()).trim(), `Show earlier messages (${2 * exchanges - count - 50} more)`);
  t.diagnostic(`scrolled back to ${count + 50} messages shown`);
  assert.deepEqual(errors, []);
});

test("the Checkpoints panel of a 2,000-message conversation draws its latest 100 points, and 100 earlier ones at a time", async (t) => {
  await toEnd(page);
  const toggle = page.getByTestId("tree-toggle");
  const rows = page.getByTestId("tree-node");
  const t0 = Date.now();
  await toggle.click();
  await eventually(async () => assert.equal(await rows.count(), 100));
  await page.getByTestId("tree-status").waitFor({ state: "hidden" });
  t.diagnostic(`Checkpoints opened with 100 of its points drawn in ${Date.now() - t0} ms`);
  // Oldest first, ending at the current point: the latest reply.
  assert.equal(await rows.last().getAttribute("data-branch"), "current");
  assert.match(await rows.last().getByTestId("tree-what").textContent(), new RegExp(`^Reply: `));
  const earlier = page.getByTestId("tree-earlier");
  const m = (await earlier.textContent()).match(/^Show 100 earlier points \((\d+) not shown\)$/);
  assert.ok(m, await earlier.textContent());
  const total = 100 + Number(m[1]);
  assert.ok(total > 2 * exchanges, `${total} points on the branch`);
  const inView = () => earlier.evaluate((e) => e.scrollIntoView({ block: "center" }));
  await shots(page, "longperf-checkpoints", { prepare: inView });
  assert.deepEqual(await axe(page, "checkpoints panel", inView), []);
  // From the keyboard: 100 more, the focus kept on the button.
  await earlier.focus();
  await page.keyboard.press("Enter");
  await eventually(async () => assert.equal(await rows.count(), 200));
  assert.equal(await page.evaluate(() => document.activeElement?.dataset.testid), "tree-earlier");
  assert.equal(await earlier.textContent(), `Show 100 earlier points (${total - 200} not shown)`);
  assert.equal(await rows.last().getAttribute("data-branch"), "current");
  await toggle.click();
  assert.deepEqual(errors, []);
});

test("typing works, and its latency is measured at 20 and 2,000 messages, idle and while a reply streams", async (t) => {
  // The tab of the tests above follows the same conversation: left open,
  // it would draw the reply streamed below too, on the same two cores,
  // and the figure would be of two tabs (it doubled the median).
  await page.context().close();
  const figures = {};
  for (const [name, id] of [
    ["20 messages", threads.small],
    ["2,000 messages", threads.big],
  ]) {
    const context = await browser.newContext();
    const p = await newPage(context, errors, { viewport: { width: 1280, height: 820 } });
    await p.addInitScript(perfScript);
    await p.goto(`${server.url}/t/${id}`);
    await p.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
    const open = await opened(p);
    await endsInView(p, name);
    const box = p.getByTestId("composer-input");
    await box.click();
    const idle = await typing(p, 30, "how do I keep tomatoes from splitting");
    assert.equal(await box.inputValue(), "how do I keep tomatoes from splitting".slice(0, 30));
    // While a reply streams (the box then queues what is sent).
    await box.fill("Question: how do I look after roses in a small garden through the year?");
    await box.press("Enter");
    await p.getByTestId("streaming-text").filter({ hasText: /\S/ }).waitFor();
    await box.click();
    const streaming = await typing(p, 20);
    assert.equal(await box.inputValue(), "x".repeat(20));
    await p.locator("#thread[data-run-status=idle]").waitFor({ timeout: 60000 });
    await endsInView(p, `${name}, after the reply`);
    figures[name] = { tti: open.tti, longtasks: open.longtasks, checkpoints: open.checkpoints, idle, streaming };
    t.diagnostic(`${name}: ${JSON.stringify(figures[name])}`);
    await context.close();
  }
  assert.deepEqual(errors, []);
});
