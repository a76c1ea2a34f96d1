// A conversation of replies cut at the size limit (the demo model's
// endless reply, stopped by -max-reply-bytes): its page loads showing the
// latest messages, a capped reply says it was cut, a reply longer than
// the page shows at first can be shown whole, and "Show earlier messages"
// brings the rest of the history.
import { test } from "node:test";
import assert from "node:assert/strict";
import { serveForFile, newPage, shots, messageTexts, eventually, apiExchange } from "./harness.mjs";

const limit = 320000; // over the 256 KiB a reply shows at first
let server, browser;
serveForFile({ pace: "1ms", args: ["-max-reply-bytes", String(limit)] }, (s, b) => ([server, browser] = [s, b]));

test("a conversation of five replies cut at the size limit opens at its latest, says each was cut, and brings the earlier ones on demand", async () => {
  const created = await server.api("/api/threads", { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
  const threadID = created.thread_id;
  for (let i = 1; i <= 5; i++) await apiExchange(server, threadID, `Endless: a story about tomatoes, part ${i}`);
  const history = (await server.api(`/api/threads/${threadID}`)).messages;
  assert.equal(history.length, 10);
  for (const m of history.filter((m) => m.role === "assistant")) {
    assert.equal(m.truncated, "size_limit");
    assert.ok(m.content.length <= limit && m.content.length > limit - 4, `a reply of ${m.content.length} bytes`);
  }

  const errors = [];
  const page = await newPage(browser, errors, { viewport: { width: 1280, height: 820 } });
  await page.goto(`${server.url}/t/${threadID}`);
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();

  // The latest three exchanges fit in the page's 1 MiB; it opens at the end.
  const shown = await messageTexts(page);
  assert.equal(shown.length, 6, `${shown.length} messages shown`);
  assert.match(shown[0].text, /part 3$/);
  assert.equal(shown[5].role, "assistant");
  assert.ok(await page.evaluate(() => window.scrollY + window.innerHeight >= document.documentElement.scrollHeight - 120), "the page opens at its latest message");
  const latest = page.getByTestId("message").last();
  await latest.getByTestId("cut-note").waitFor();
  assert.match(await latest.getByTestId("cut-note").textContent(), /^Cut at the size limit: the model was stopped after 312 KiB/);
  assert.equal(await page.getByTestId("cut-note").count(), 3, "every reply shown says it was cut");
  await shots(page, "cap-latest");

  // A reply over 256 KiB shows its start; the whole of it on demand.
  const body = latest.getByTestId("message-body");
  assert.equal(await body.getAttribute("data-clipped"), "true");
  const clippedLength = (await body.textContent()).length;
  await latest.getByTestId("show-whole").click();
  const whole = history[9].content;
  const tail = whole.slice(whole.lastIndexOf("**Part ") + 2).replace("**", "");
  await eventually(async () => {
    const text = await page.getByTestId("message").last().getByTestId("message-body").textContent();
    assert.ok(text.length > clippedLength, `${text.length} characters shown after "Show the whole reply", ${clippedLength} before`);
    assert.ok(text.trimEnd().endsWith(tail.trimEnd()), "the whole reply ends where the cut was");
  });
  assert.equal(await page.getByTestId("message").last().getByTestId("show-whole").count(), 0);
  await page.getByTestId("message").last().getByTestId("cut-note").waitFor();

  // The four earlier messages, from the top.
  await page.evaluate(() => window.scrollTo(0, 0));
  const earlier = page.getByTestId("show-earlier");
  assert.equal((await earlier.textContent()).trim(), "Show earlier messages (4 more)");
  await shots(page, "cap-earlier-offered");
  await earlier.click();
  await eventually(async () => assert.equal((await messageTexts(page)).length, 10));
  const all = await messageTexts(page);
  assert.match(all[0].text, /part 1$/);
  assert.deepEqual(
    all.filter((m) => m.role === "user").map((m) => m.text),
    history.filter((m) => m.role === "user").map((m) => m.content),
  );
  assert.equal(await page.getByTestId("earlier").isHidden(), true, "nothing earlier is left to offer");
  // What the user was reading (the first message shown before) stays in view.
  const third = page.getByTestId("message").nth(4);
  assert.match(await third.textContent(), /part 3/);
  assert.ok(await third.evaluate((e) => { const r = e.getBoundingClientRect(); return r.bottom > 0 && r.top < window.innerHeight; }), "the message read before stays in view");
  assert.equal(await page.getByTestId("cut-note").count(), 5);
  await page.evaluate(() => window.scrollTo(0, 0));
  await shots(page, "cap-earlier-shown");
  assert.deepEqual(errors, []);
});
