import { test } from "node:test";
import assert from "node:assert/strict";
import { serveForFile, newPage, shot, newThread, send, runStatus, eventually } from "./harness.mjs";

// Model output is Markdown: rendered safely, the same way in history, the
// live stream, fragments and after a reload. The demo model answers in
// Markdown when asked for "markdown" or "code", and "repeat after me:"
// makes it stream any text, hostile text included.
let server, browser;
serveForFile({ pace: "5ms" }, (s, b) => ([server, browser] = [s, b]));

const lastReply = (page) => page.locator("[data-testid=messages] > [data-testid=message][data-role=assistant]").last();

async function reply(page, text) {
  const before = await page.locator("[data-testid=messages] > [data-testid=message][data-role=assistant]").count();
  await send(page, text);
  await eventually(async () => assert.equal(await page.locator("[data-testid=messages] > [data-testid=message][data-role=assistant]").count(), before + 1), { timeout: 20000 });
  await runStatus(page, "idle", 20000);
  return lastReply(page);
}

test("a Markdown reply renders as Markdown: headings, emphasis, lists, task list, table, code with a copy button, links", async () => {
  const errors = [];
  const page = await newPage(browser, errors);
  await newThread(page, server.url);
  const msg = await reply(page, "Show me markdown about goroutines");
  const body = msg.getByTestId("message-body");
  // Each message says when; a reply also which model it was asked of.
  assert.match(await msg.getByTestId("message-meta").textContent(), /^\d{1,2}:\d{2}.* · demo$/);
  const request = page.locator("[data-testid=messages] > [data-testid=message][data-role=user]").first();
  assert.match(await request.getByTestId("message-meta").textContent(), /^\d{1,2}:\d{2}[^·]*$/);
  assert.equal(await body.locator("h2").textContent(), "Goroutines, in short");
  assert.equal(await body.locator("strong").first().textContent(), "structured");
  assert.equal(await body.locator("ol > li").count(), 3);
  const boxes = body.locator("li.task input[type=checkbox]");
  assert.equal(await boxes.count(), 2);
  assert.deepEqual([await boxes.nth(0).isChecked(), await boxes.nth(1).isChecked()], [true, false]);
  assert.ok(await boxes.nth(0).isDisabled());
  assert.deepEqual(await body.locator("th").allTextContents(), ["Step", "What", "Time"]);
  assert.equal(await body.locator("th.align-right").textContent(), "Time");
  assert.equal(await body.locator(".code-block .code-lang").textContent(), "go");
  assert.match(await body.locator(".code-block pre code").textContent(), /^package main\n\nimport "fmt"/);
  // Highlighted (go is one of the bounded set): keywords and strings marked.
  assert.deepEqual((await body.locator(".code-block code .hljs-keyword").allTextContents()).slice(0, 3), ["package", "import", "func"]);
  assert.match(await body.locator(".code-block code .hljs-string").first().textContent(), /^"fmt"$/);
  assert.equal(await body.locator("del, s").textContent(), "complicated");
  const links = body.locator("a[href]");
  assert.deepEqual(await links.evaluateAll((as) => as.map((a) => [a.getAttribute("href"), a.rel, a.target])), [
    ["https://go.dev/tour/", "noopener noreferrer nofollow", "_blank"],
    ["https://go.dev/doc/", "noopener noreferrer nofollow", "_blank"],
  ]);
  assert.match(await body.locator("p code").last().textContent(), /^go doc fmt$/);

  const live = await body.innerHTML();

  // Copy: the code block's text, and the message's Markdown source.
  await page.context().grantPermissions(["clipboard-read", "clipboard-write"], { origin: server.url });
  await body.locator(".code-block [data-testid=copy]").click();
  await body.locator(".code-block [data-testid=copy][data-copied=true]").waitFor();
  assert.match(await page.evaluate(() => navigator.clipboard.readText()), /^package main\n/);
  await msg.locator(".msg-actions [data-testid=copy]").click();
  assert.match(await page.evaluate(() => navigator.clipboard.readText()), /^## Goroutines, in short\n/);

  // First paint after a reload: the same DOM (one renderer).
  await page.reload();
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  assert.equal(await lastReply(page).getByTestId("message-body").innerHTML(), live);
  for (const [w, h] of [[1280, 900], [390, 844]]) {
    for (const scheme of ["light", "dark"]) {
      await page.setViewportSize({ width: w, height: h });
      await page.emulateMedia({ colorScheme: scheme });
      await lastReply(page).scrollIntoViewIfNeeded();
      assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth), `the page is no wider than ${w} px`);
      await shot(page, `markdown-reply-${w}-${scheme}`, { fullPage: false });
    }
  }
  assert.deepEqual(errors, []);
});

// Text a model (or anyone who controls its output) may produce to attack
// the page. None of it may run, load, or link anywhere but http(s).
const hostile = [
  "<script>window.__pwned = 'script'</script>",
  "<img src=x onerror=\"window.__pwned = 'img'\">",
  "<a href=\"javascript:window.__pwned='a'\">html link</a>",
  "[md link](javascript:window.__pwned='md')",
  "[data link](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
  "[vb](vbscript:msgbox)",
  "![tracker](https://example.com/pixel.gif)",
  "![inline](data:image/png;base64,iVBORw0KGgo=)",
  "<iframe src=\"https://example.com\"></iframe>",
  "<svg onload=\"window.__pwned='svg'\"></svg>",
  "<details open ontoggle=\"window.__pwned='details'\">x</details>",
  "[relative](/api/threads)",
  "```html\n<script>window.__pwned = 'fence'</script>\n```",
  "````\n```nested fence\n````",
  "| a | b |\n|---|---|\n" + Array.from({ length: 60 }, (_, i) => `| ${"wide-cell-".repeat(12)}${i} | <b onmouseover="window.__pwned='td'">x</b> |`).join("\n"),
  "```\nan unclosed fence that runs to the end",
].join("\n\n");

test("hostile model output renders inert: no script, no handler, no foreign link or image, no page wider than the window", async () => {
  const errors = [];
  const page = await newPage(browser, errors);
  await newThread(page, server.url);
  const msg = await reply(page, "Repeat after me:\n" + hostile);
  const body = msg.getByTestId("message-body");
  const facts = await body.evaluate((b) => ({
    scripts: b.querySelectorAll("script, iframe, svg, img, details, object, embed, style").length,
    handlers: [...b.querySelectorAll("*")].flatMap((e) => [...e.attributes].map((a) => a.name)).filter((n) => n.startsWith("on") || n === "style" || n === "src"),
    hrefs: [...b.querySelectorAll("a[href]")].map((a) => a.getAttribute("href")),
    text: b.textContent,
  }));
  assert.equal(facts.scripts, 0);
  assert.deepEqual(facts.handlers, []);
  assert.ok(facts.hrefs.length > 0 && facts.hrefs.every((h) => /^https:\/\/example\.com(\/pixel\.gif)?$/.test(h)), `only http(s) addresses are links: ${facts.hrefs}`);
  assert.ok(facts.hrefs.includes("https://example.com/pixel.gif"), "an image is a link to its address");
  assert.match(facts.text, /<script>window.__pwned = 'script'<\/script>/, "raw HTML shows as text");
  assert.match(facts.text, /Image: tracker/);
  assert.equal(await body.locator("a.md-image").count(), 2, "images are links, never fetched");
  assert.equal(await body.locator(".code-block").count(), 3, "fences, nested and unclosed ones included, are code blocks");
  assert.match(await body.locator(".code-block code.hljs").first().textContent(), /<script>window.__pwned = 'fence'<\/script>/, "highlighted HTML is text");
  await body.locator("td b").first().hover().catch(() => {});
  await page.mouse.wheel(0, 400);
  assert.equal(await page.evaluate(() => window.__pwned ?? null), null);
  await page.setViewportSize({ width: 390, height: 844 });
  assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth), "a huge table scrolls inside the message");
  await shot(page, "markdown-hostile-390", { fullPage: false });

  // The same text, streamed and cancelled, then saved as a fragment: as inert.
  await send(page, "Repeat after me:\n" + hostile + "\n\n" + "and more words ".repeat(400));
  await page.getByTestId("streaming-text").locator(".code-block").first().waitFor({ timeout: 20000 });
  assert.equal(await page.getByTestId("streaming-text").locator("script, img, iframe, svg").count(), 0);
  // The reply keeps growing and the page keeps following it, so the button
  // is never "stable" for Playwright's click: press it where it is.
  await page.getByTestId("cancel").dispatchEvent("click");
  await page.getByTestId("receipt").waitFor({ timeout: 20000 });
  const shown = await page.getByTestId("streaming-text").innerHTML();
  await page.getByTestId("action-save-fragment").click();
  const fragment = page.locator("[data-testid=message][data-kind=fragment]");
  await fragment.waitFor({ timeout: 10000 });
  assert.equal(await fragment.getByTestId("message-body").innerHTML(), shown, "the fragment renders exactly what was displayed");
  assert.equal(await page.evaluate(() => window.__pwned ?? null), null);
  assert.deepEqual(errors, []);
});

test("a long Markdown conversation: screenshots at 1280 and 390 px, light and dark", async () => {
  const errors = [];
  const page = await newPage(browser, errors);
  await newThread(page, server.url);
  for (const topic of ["channels", "select statements", "context cancellation"]) {
    await reply(page, `Explain ${topic} with code`);
    await reply(page, `Short answer about ${topic}?`);
  }
  for (const [w, h] of [[1280, 820], [390, 844]]) {
    for (const scheme of ["light", "dark"]) {
      await page.setViewportSize({ width: w, height: h });
      await page.emulateMedia({ colorScheme: scheme });
      assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth), `no wider than ${w} px`);
      await shot(page, `markdown-long-${w}-${scheme}`);
    }
  }
  assert.deepEqual(errors, []);
});

test("Copy puts exactly the right text on the clipboard: a reply's Markdown source, each code block's code", async () => {
  const context = await browser.newContext();
  await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: server.url });
  const errors = [];
  const page = await newPage(context, errors);
  const url = await newThread(page, server.url);
  const bash = 'rm -rf ./build && go build -o bin/gateway . # <not> "html" & \'quotes\'\necho "done"';
  const python = 'def f(x):\n\tif x < 1 and x > -1:\n\t\treturn "ünïcødé ✓"\n\treturn  x  # two spaces kept';
  const plain = "   indented first line\nlast line";
  const source = [
    "Two blocks *and* a plain one:",
    "```bash\n" + bash + "\n```",
    "Then some `inline code` and a [link](https://example.com/).",
    "```python\n" + python + "\n```",
    "```\n" + plain + "\n```",
    "The end.",
  ].join("\n\n");
  await reply(page, "Repeat after me:\n" + source);
  const threadID = new URL(url).pathname.split("/").pop();
  const stored = (await server.api(`/api/threads/${threadID}`)).messages.at(-1);
  assert.equal(stored.content, source, "the demo repeated the text as given");

  const clipboard = () => page.evaluate(() => navigator.clipboard.readText());
  // Each press overwrites what is there: clear it first, so a press that
  // copied nothing cannot pass on what the one before it copied.
  const press = async (button) => {
    await page.evaluate(() => navigator.clipboard.writeText("(nothing copied)"));
    await button.click();
    await eventually(async () => assert.equal(await button.getAttribute("data-copied"), "true"));
    return clipboard();
  };
  const check = async (where) => {
    const m = lastReply(page);
    const blocks = m.locator(".code-block [data-testid=copy]");
    assert.equal(await blocks.count(), 3);
    assert.equal(await press(blocks.nth(0)), bash, `${where}: the bash block, no trailing newline (pasted in a terminal, it would run)`);
    assert.equal(await press(blocks.nth(1)), python, `${where}: the python block, tabs and spaces as written`);
    assert.equal(await press(blocks.nth(2)), plain, `${where}: the plain block`);
    assert.equal(await press(m.locator(".msg-actions [data-testid=copy]")), source, `${where}: the reply's Markdown source`);
  };
  await check("live");
  await page.reload();
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  await check("after a reload");
  for (const [w, h] of [[1280, 820], [390, 844]]) {
    for (const scheme of ["light", "dark"]) {
      await page.setViewportSize({ width: w, height: h });
      await page.emulateMedia({ colorScheme: scheme });
      await lastReply(page).locator(".code-block").first().scrollIntoViewIfNeeded();
      await shot(page, `markdown-copy-${w}-${scheme}`, { fullPage: false });
    }
  }
  assert.deepEqual(errors, []);
  await context.close();
});
