// The server's first paint and the live client show a conversation the
// same way: every kind of message (a request, a Markdown reply, a card, a
// tool step, a saved fragment) rendered by the tab that watched it arrive
// is, node for node, what a fresh load of the same address renders.
import { test } from "node:test";
import assert from "node:assert/strict";
import { serveForFile, newPage, shot, newThread, send, runStatus, eventually } from "./harness.mjs";

let server, browser;
serveForFile({ pace: "5ms", args: ["-search-latency", "200ms"] }, (s, b) => ([server, browser] = [s, b]));

// listDOM is the rendered message list, normalised: attributes that say
// when the page last drew it (the list's change key, a Copy button's
// moment of feedback) are dropped; everything else — structure, classes,
// text, test ids, ARIA — must match.
const listDOM = (page) =>
  page.getByTestId("messages").evaluate((list) => {
    const copy = list.cloneNode(true);
    const drop = ["data-ids", "data-copied", "data-shown"];
    for (const e of [copy, ...copy.querySelectorAll("*")]) for (const a of drop) e.removeAttribute(a);
    return copy.outerHTML.replace(/></g, ">\n<");
  });

const kinds = (page) =>
  page.locator("[data-testid=messages] > [data-testid=message]").evaluateAll((els) => els.map((e) => `${e.dataset.role}/${e.dataset.kind}`));

async function exchange(page, text, expectRoles) {
  const before = await page.locator("[data-testid=messages] > [data-testid=message]").count();
  await send(page, text);
  await eventually(async () => assert.equal(await page.locator("[data-testid=messages] > [data-testid=message]").count(), before + expectRoles), { timeout: 20000 });
  await runStatus(page, "idle", 20000);
}

test("first paint and live client agree on every kind of message", async () => {
  const errors = [];
  const context = await browser.newContext();
  const page = await newPage(context, errors);
  const url = await newThread(page, server.url);
  const fresh = await newPage(context, errors);
  // agree loads the address afresh in the other tab and compares its
  // rendered list with the live tab's, after each kind of message.
  const agree = async (what) => {
    const live = await listDOM(page);
    await fresh.goto(url);
    await fresh.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
    await eventually(async () => assert.equal(await listDOM(fresh), live, `${what}: the fresh load renders what the live tab shows`));
    return live;
  };
  await exchange(page, "How do I mulch a vegetable bed?", 2);
  await agree("a request and a text reply");
  await exchange(page, "Show me markdown about soil", 2);
  await agree("a Markdown reply");
  await exchange(page, "Order 2 red mugs and 3 blue plates", 2);
  await agree("a card");
  // The card reads as an order: its items with quantity, unit price and
  // amount, and the total; the JSON as written under Details.
  const card = page.locator("[data-testid=messages] > [data-testid=message][data-kind=card]");
  const doc = JSON.parse((await server.api(`/api/threads/${new URL(url).pathname.split("/").pop()}`)).messages.find((m) => m.kind === "card").content);
  assert.equal(doc.type, "order");
  assert.deepEqual(
    await card.getByTestId("order-item").evaluateAll((trs) => trs.map((tr) => [...tr.cells].map((c) => c.textContent))),
    doc.items.map((i) => [i.name, String(i.quantity), i.price.toFixed(2), ((Math.round(i.price * 100) * i.quantity) / 100).toFixed(2)]),
  );
  assert.deepEqual(doc.items.map((i) => [i.name, i.quantity]), [["red mugs", 2], ["blue plates", 3]]);
  assert.equal(await card.getByTestId("order-total").textContent(), `Total${doc.total.toFixed(2)} EUR`);
  assert.equal(await card.getByTestId("order").locator("thead th").allTextContents().then((t) => t.join("|")), "Item|Quantity|Unit price (EUR)|Amount (EUR)");
  assert.ok(!(await card.locator("details.card-json").evaluate((d) => d.open)), "the JSON is folded away");
  assert.deepEqual(JSON.parse(await card.locator("details.card-json pre").textContent()), doc);
  await exchange(page, "Search the catalog for a trekking backpack", 4); // request, call text, tool result, answer
  await agree("a search's tool step");
  const search = page.locator("[data-testid=messages] > [data-testid=message][data-role=tool]").getByTestId("tool-step");
  assert.equal(await search.locator(".tool-title").textContent(), "Catalog search", "the step says what it did in words");
  assert.deepEqual(await search.locator(".tool-args dt").allTextContents(), ["Query"]);
  assert.equal(await search.getByTestId("tool-arg-query").textContent(), "trekking backpack");
  await send(page, "Please send an email to anna@example.com about the spring order");
  await page.getByTestId("confirm-card").waitFor({ timeout: 20000 });
  await page.getByTestId("confirm-op").click();
  await eventually(async () => assert.equal(await page.locator("[data-testid=messages] > [data-testid=message]").count(), 14), { timeout: 20000 });
  await runStatus(page, "idle", 20000);
  await page.locator("[data-testid=tool-status][data-state=committed]").waitFor();
  await agree("an email's tool step, sent");
  // A fragment: cancel a reply mid-stream and save what was shown.
  await send(page, "Repeat after me: " + "a fragment worth keeping, with **bold** words and `code` ".repeat(200));
  await page.getByTestId("streaming-text").filter({ hasText: /\S/ }).waitFor();
  await page.getByTestId("cancel").dispatchEvent("click");
  await page.getByTestId("receipt").waitFor({ timeout: 20000 });
  await page.getByTestId("action-save-fragment").click();
  await page.locator("[data-testid=messages] > [data-testid=message][data-kind=fragment]").waitFor();
  assert.deepEqual(await kinds(page), [
    "user/text",
    "assistant/text",
    "user/text",
    "assistant/text",
    "user/text",
    "assistant/card",
    "user/text",
    "assistant/text",
    "tool/text",
    "assistant/text",
    "user/text",
    "assistant/text",
    "tool/text",
    "assistant/text",
    "user/text",
    "assistant/fragment",
  ]);
  const live = await agree("a saved fragment");
  // And the live tab after the fresh one loaded: still the same.
  assert.equal(await listDOM(page), live);

  // The server's own render (no script): the same messages in the same
  // order, each with its speaker, and every body holding the message's text
  // as the server keeps it.
  const snap = await server.api(`/api/threads/${new URL(url).pathname.split("/").pop()}`);
  const plain = await browser.newContext({ javaScriptEnabled: false });
  const noJS = await plain.newPage();
  await noJS.goto(url);
  const painted = await noJS.locator("[data-testid=messages] > [data-testid=message]").evaluateAll((els) =>
    els.map((e) => ({
      id: e.dataset.messageId,
      role: e.dataset.role,
      kind: e.dataset.kind,
      speaker: e.querySelector("[data-testid=speaker]")?.textContent,
      body: e.querySelector("[data-testid=message-body]")?.textContent,
    })),
  );
  const speakers = { user: "You said:", assistant: "Assistant said:", tool: "Tool result:" };
  assert.deepEqual(
    painted,
    snap.messages.map((m) => ({ id: m.message_id, role: m.role, kind: m.kind, speaker: speakers[m.role], body: m.content })),
  );
  assert.deepEqual(
    await fresh.locator("[data-testid=messages] > [data-testid=message]").evaluateAll((els) => els.map((e) => e.dataset.messageId)),
    snap.messages.map((m) => m.message_id),
  );
  await plain.close();

  const at = {
    card: ["[data-kind=card]", 0],
    search: ["[data-role=tool]", 0],
    email: ["[data-role=tool]", 1],
    fragment: ["[data-kind=fragment]", 0],
  };
  // Every kind fits a phone: nothing makes the page wider than the window.
  for (const [w, h] of [[1280, 820], [390, 844], [360, 740]]) {
    for (const scheme of ["light", "dark"]) {
      for (const [p, name] of [[page, "live"], [fresh, "fresh"]]) {
        await p.setViewportSize({ width: w, height: h });
        await p.emulateMedia({ colorScheme: scheme });
        const f = await p.evaluate(() => ({ sw: document.documentElement.scrollWidth, iw: window.innerWidth }));
        assert.ok(f.sw <= f.iw, `${name} at ${w} px: the page is ${f.sw} px wide`);
        const order = await p.locator("[data-kind=card] .table-scroll").evaluate((e) => [e.scrollWidth, e.clientWidth]);
        assert.ok(order[0] <= order[1], `${name} at ${w} px: the order is read without scrolling it sideways (${order})`);
        for (const [kind, [sel, n]] of Object.entries(at)) {
          const target = p.locator(`[data-testid=messages] > [data-testid=message]${sel}`).nth(n);
          await target.evaluate((e) => {
            e.scrollIntoView({ block: "start" });
            window.scrollBy(0, -140); // below the sticky header
          });
          await shot(p, `paint-${kind}-${name}-${w}-${scheme}`, { fullPage: false });
        }
      }
    }
  }
  assert.deepEqual(errors, []);
  await context.close();
});
