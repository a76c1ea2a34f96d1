// One conversation in one tab: stream, cancel (button and Esc), the receipt,
// fragments and drafts, editing the request, the checkpoint tree, renaming,
// and the phone layout. Every test opens its own page on a fresh thread.
import { test } from "node:test";
import assert from "node:assert/strict";
import { serveForFile, openPage, newPage, shot, shots, newThread, send, runStatus, messageTexts, eventually } from "./harness.mjs";

let server, browser;
serveForFile({ pace: "40ms" }, (s, b) => ([server, browser] = [s, b]));

// A question whose demo reply is long (80+ words, several seconds at 40ms a
// word), so there is time to cancel it mid-stream.
const LONG = "How should I plan a trip to Lisbon in spring?";

// startAndStream sends text and waits until some of the reply is on screen.
async function startAndStream(page, text = LONG) {
  await send(page, text);
  await page.getByTestId("run-chip").filter({ hasText: "Streaming" }).waitFor();
  await eventually(async () => assert.ok((await page.getByTestId("streaming-text").textContent()).length > 0));
  await runStatus(page, "running");
}

async function done(page, errors) {
  assert.deepEqual(errors, [], "no console errors");
  await page.close();
}

test("send, watch the reply stream, cancel mid-stream and read the receipt", async () => {
  // Hold the server's run.cancelled (and what follows) back for a moment, as
  // a slow network would, so the in-between state is reliably observable.
  const { page, errors, socket } = await openPage(browser, { intercept: true, thread: server.url });
  await startAndStream(page);
  await shot(page, "streaming");
  assert.equal(await page.getByTestId("cancel").textContent(), "Cancel");

  const cancelled = socket.holdFrom((o) => o.type === "run.cancelled");
  await page.getByTestId("cancel").click();
  await cancelled;
  // The cancel is accepted but not finished: the page says so and offers
  // nothing that would contradict it.
  await runStatus(page, "cancel_requested");
  await page.getByTestId("cancel").filter({ hasText: "Cancelling…" }).waitFor();
  assert.ok(await page.getByTestId("cancel").isDisabled(), "no second cancel while the first is in flight");
  await page.getByTestId("run-chip").filter({ hasText: "Cancelling…" }).waitFor();
  assert.equal(await page.getByTestId("receipt").count(), 0, "no receipt before run.cancelled");
  await shot(page, "cancelling");
  socket.release();

  const receipt = page.getByTestId("receipt");
  await receipt.waitFor();
  await runStatus(page, "cancelled");
  assert.ok(await page.getByTestId("cancel").isHidden());
  assert.ok(await page.getByTestId("send").isVisible());
  await page.getByTestId("run-chip").filter({ hasText: "Not saved · stopped here" }).waitFor();
  await shot(page, "cancelled");
  assert.equal(await receipt.locator("h2").textContent(), "Cancelled");
  assert.match(await page.getByTestId("receipt-discarded").textContent(), /^[1-9]\d* characters of unpublished text$/);
  assert.match(await page.getByTestId("receipt-kept").textContent(), /Lisbon/);
  // The untitled conversation took its name from the request, on this
  // page too (title field and sidebar).
  await eventually(async () => assert.match(await page.getByTestId("title-input").inputValue(), /Lisbon/));
  await page.locator("[data-testid=thread-link][aria-current=page]", { hasText: "Lisbon" }).waitFor();
  // Nothing of the cancelled reply became history.
  assert.equal(await page.locator("[data-testid=message][data-role=assistant]").count(), 0);
  for (const action of ["action-continue", "action-edit", "action-fork", "action-save-fragment"]) {
    assert.ok(await page.getByTestId(action).isVisible(), `${action} offered after cancel`);
  }

  // Continue from the saved point: a fresh reply is published.
  await page.getByTestId("action-continue").click();
  await page.locator("[data-testid=message][data-role=assistant][data-kind=text]").waitFor({ timeout: 20000 });
  await runStatus(page, "idle");
  assert.equal(await page.getByTestId("receipt").count(), 0, "the receipt goes once a new run starts");
  await shot(page, "continued");
  await done(page, errors);
});

test("Esc cancels a streaming reply", async () => {
  const { page, errors } = await openPage(browser, { thread: server.url });
  await startAndStream(page);
  // Focus is still in the composer, where the user just pressed Enter.
  await page.keyboard.press("Escape");
  await page.getByTestId("receipt").waitFor();
  await runStatus(page, "cancelled");
  assert.match(await page.getByTestId("receipt-discarded").textContent(), /^[1-9]\d* characters/);
  assert.equal(await page.locator("[data-testid=message][data-role=assistant]").count(), 0);
  // Esc with nothing running changes nothing.
  await page.keyboard.press("Escape");
  await runStatus(page, "cancelled");
  assert.equal(await page.getByTestId("notice").isHidden(), true);
  // A page opened later tells the same truth: the receipt comes from the
  // server, not from this tab's memory.
  const discarded = await page.getByTestId("receipt-discarded").textContent();
  await page.reload();
  await page.getByTestId("receipt").waitFor();
  assert.equal(await page.getByTestId("receipt-discarded").textContent(), discarded);
  assert.ok(await page.getByTestId("action-continue").isVisible());
  await done(page, errors);
});

test("an order card streams as what it will be, never as raw JSON; cancelled half-way it offers no fragment to save", async () => {
  const { page, errors } = await openPage(browser, { thread: server.url });
  await send(page, "Order 2 red mugs and 3 blue plates");
  const live = page.locator("[data-testid=streaming-text][data-card=pending]");
  await live.waitFor();
  assert.match(await live.textContent(), /^Preparing a card… \d+ characters so far$/);
  assert.doesNotMatch(await page.getByTestId("streaming").textContent(), /[{}"]/, "no JSON on screen while the card streams");
  // Cancelled at once: a picture taken first could outlast the card on a
  // loaded machine (it is pictured streaming below).
  await page.keyboard.press("Escape");
  await page.getByTestId("receipt").waitFor();
  await runStatus(page, "cancelled");
  const shown = Number((await live.textContent()).match(/^An unfinished card: (\d+) characters, never complete, so not shown$/)?.[1]);
  assert.ok(shown > 0, "the unfinished card says how much of it came");
  assert.match(await page.getByTestId("receipt-discarded").textContent(), /^[1-9]\d* characters of unpublished text$/);
  assert.equal(await page.getByTestId("action-save-fragment").count(), 0, "nothing was shown as text, so nothing to save");
  assert.equal(await page.locator("[data-testid=message][data-kind=card]").count(), 0);
  await shot(page, "card-cancelled");
  // The picture of a card streaming: the same order again, left to end.
  await send(page, "Order 2 red mugs and 3 blue plates");
  await live.waitFor();
  await shot(page, "card-streaming");
  await runStatus(page, "idle", 20000);
  await done(page, errors);
});

test("save the visible fragment exactly as shown, the receipt says so, then delete it for good after a confirmation", async () => {
  const { page, errors, url } = await openPage(browser, { thread: server.url });
  await startAndStream(page);
  await page.getByTestId("cancel").click();
  await page.getByTestId("receipt").waitFor();

  const shown = await page.getByTestId("streaming-text").textContent();
  assert.ok(shown.length > 0);
  await page.getByTestId("action-save-fragment").click();
  const fragment = page.locator("[data-testid=message][data-kind=fragment]");
  await fragment.waitFor();
  assert.equal(await fragment.getByTestId("fragment-label").textContent(), "Saved fragment");
  assert.equal(await fragment.getByTestId("message-body").textContent(), shown, "the fragment is exactly the displayed text");
  // The saved text is now history; the provisional copy and the offer go,
  // and the receipt says where the text went.
  assert.equal(await page.getByTestId("streaming").count(), 0);
  assert.equal(await page.getByTestId("action-save-fragment").count(), 0);
  const savedNote = new RegExp(`; the part you saw \\(${[...shown].length} characters\\) is kept in the conversation as a saved fragment$`);
  assert.match(await page.getByTestId("receipt-discarded").textContent(), savedNote);
  assert.equal(await page.getByTestId("receipt-heading").textContent(), "Cancelled");
  await shot(page, "fragment-saved");

  // It survives a reload: it is part of the conversation now, and the
  // receipt stays (saving moved the head, nothing else did).
  await page.reload();
  await fragment.waitFor();
  assert.equal(await fragment.getByTestId("message-body").textContent(), shown);
  await page.getByTestId("send").and(page.locator(":enabled")).waitFor();
  assert.match(await page.getByTestId("receipt-discarded").textContent(), savedNote);

  // Deleting asks first; Keep it keeps it.
  await fragment.getByTestId("delete-draft").click();
  await fragment.getByTestId("delete-draft-keep").click();
  await fragment.getByTestId("delete-draft").waitFor();
  await fragment.getByTestId("delete-draft").click();
  await shot(page, "fragment-delete-confirm", { fullPage: false });
  await fragment.getByTestId("delete-draft-confirm").click();
  await fragment.waitFor({ state: "detached" });
  assert.deepEqual(await messageTexts(page), [{ role: "user", kind: "text", text: LONG }]);
  await page.goto(url);
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  assert.equal(await fragment.count(), 0, "the deleted draft stays deleted after a reload");
  assert.deepEqual(await messageTexts(page), [{ role: "user", kind: "text", text: LONG }]);
  await done(page, errors);
});

test("edit the request after a cancel: the edited request replaces the old one on a new branch", async () => {
  const { page, errors } = await openPage(browser, { thread: server.url });
  // The checkpoints cannot be read from here on (the page read them when
  // it opened, before the request): where the request was saved is not
  // known when Edit is pressed, and Edit fetches it.
  const checkpoints = (u) => u.pathname.endsWith("/checkpoints");
  await page.route(checkpoints, (r) => r.fulfill({ status: 503, contentType: "text/plain", body: "unavailable" }));
  await startAndStream(page);
  await page.getByTestId("cancel").click();
  await page.getByTestId("receipt").waitFor();

  // Refused, Edit says so and what to do, and edits nothing.
  await page.getByTestId("action-edit").click();
  await page.getByTestId("notice").filter({ hasText: "Could not load where your request was saved (the server answered 503), so it cannot be edited yet: press “Edit the request and continue” again in a moment." }).waitFor();
  assert.equal(await page.getByTestId("editing").count(), 0);
  assert.equal(await page.getByTestId("composer-input").inputValue(), "");
  await shots(page, "edit-unavailable");
  assert.ok(errors.length >= 1 && errors.every((e) => /503/.test(e)), JSON.stringify(errors)); // Chromium logs each 503
  errors.length = 0;
  await page.unroute(checkpoints);

  await page.getByTestId("action-edit").click();
  await page.getByTestId("editing").waitFor();
  const input = page.getByTestId("composer-input");
  assert.equal(await input.inputValue(), LONG, "the composer holds the last request");
  assert.equal(await page.getByTestId("notice").isHidden(), true, await page.getByTestId("notice").textContent());
  await shot(page, "editing");

  const edited = "Short: Porto in autumn?";
  await input.fill(edited);
  await input.press("Enter");
  await page.locator("[data-testid=message][data-role=assistant][data-kind=text]").waitFor({ timeout: 20000 });
  await runStatus(page, "idle");
  assert.equal(await input.inputValue(), "");
  assert.equal(await page.getByTestId("editing").count(), 0);
  const history = await messageTexts(page);
  assert.equal(history.length, 2, JSON.stringify(history));
  assert.deepEqual(history[0], { role: "user", kind: "text", text: edited });
  assert.match(history[1].text, /Porto/);
  assert.ok(!history.some((m) => m.text === LONG), "the old request is not in the new branch");

  // The timeline shows both branches: the points of the old request are
  // on another branch, the edited request and its reply on this one.
  await page.getByTestId("tree-toggle").click();
  // (The panel first shows the timeline it loaded before the edit, where
  // the old request is already on another branch, until its fetch returns:
  // wait for the edited request's point, not for any other-branch point.)
  const nodes = page.locator("[data-testid=tree-list] > [data-testid=tree-node]");
  await eventually(async () => assert.equal(await nodes.locator(":scope[data-branch=this] [data-testid=tree-what]", { hasText: `You: ${edited}` }).count(), 1));
  // The old request leads another branch, named by its first words.
  await page.getByTestId("other-branches").getByTestId("branch-what").filter({ hasText: `From message 1, your message: “${LONG}”` }).waitFor();
  assert.match(await nodes.locator(":scope[data-branch=current] [data-testid=tree-what]").textContent(), /^Reply: /);
  await shot(page, "edited-branch");
  await done(page, errors);
});

test("checkpoint tree: show the nodes and fork from one into a new conversation", async () => {
  const { page, errors, url } = await openPage(browser, { thread: server.url });
  const question = "Short: what is a sourdough starter?";
  await send(page, question);
  await page.locator("[data-testid=message][data-role=assistant]").waitFor({ timeout: 20000 });
  await runStatus(page, "idle");
  const original = await messageTexts(page);
  assert.equal(original.length, 2);

  const toggle = page.getByTestId("tree-toggle");
  assert.equal(await toggle.getAttribute("aria-expanded"), "false");
  assert.ok(await page.getByTestId("tree").isHidden());
  await toggle.click();
  assert.equal(await toggle.getAttribute("aria-expanded"), "true");
  await page.getByTestId("tree").waitFor();
  const nodes = page.getByTestId("tree-node");
  // Empty start, request accepted, reply published: a flat timeline, in
  // view, the focus on its heading.
  await eventually(async () => assert.equal(await nodes.count(), 3));
  assert.equal(await page.evaluate(() => document.activeElement?.textContent), "Checkpoints");
  const what = await nodes.locator("[data-testid=tree-what]").allTextContents();
  assert.deepEqual(what.slice(0, 2), ["The start: no messages yet", `You: ${question}`]);
  assert.match(what[2], /^Reply: /);
  assert.equal(await nodes.nth(2).getAttribute("data-branch"), "current");
  assert.equal(await nodes.nth(2).getByTestId("tree-tags").textContent(), "current");
  await shot(page, "tree");

  const afterRequest = nodes.filter({ has: page.locator("[data-testid=tree-what]", { hasText: `You: ${question}` }) });
  assert.equal(await afterRequest.count(), 1);
  await afterRequest.locator(":scope > [data-testid=tree-fork]").click();
  await page.waitForURL((u) => /\/t\/thr_/.test(u.pathname) && u.href !== url);
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  assert.deepEqual(await messageTexts(page), [{ role: "user", kind: "text", text: question }], "the fork holds the history up to the node");
  // The original is untouched.
  await page.goto(url);
  assert.deepEqual(await messageTexts(page), original);
  await done(page, errors);
});

test("checkpoints: while they load the panel says so; when they cannot be loaded it says what to do, and opened again they load", async () => {
  const { page, errors } = await openPage(browser, { thread: server.url });
  // From here on the server's answer is held, then refused: the panel
  // shows the timeline it has (loaded with the page, before the request;
  // the page's own reading when the reply ends is held too) and says it
  // is being brought up to date, then that it could not be.
  let release;
  const held = new Promise((ok) => (release = ok));
  const checkpoints = (u) => u.pathname.endsWith("/checkpoints");
  await page.route(checkpoints, async (r) => {
    await held;
    await r.fulfill({ status: 503, contentType: "text/plain", body: "unavailable" });
  });
  await send(page, "Short: what is rye?");
  await page.locator("[data-testid=message][data-role=assistant]").waitFor({ timeout: 20000 });
  await runStatus(page, "idle");
  const list = page.getByTestId("tree-list");
  const status = page.getByTestId("tree-status");
  await page.getByTestId("tree-toggle").click();
  await status.filter({ hasText: "Bringing the timeline up to date…" }).waitFor();
  assert.equal(await list.getAttribute("aria-busy"), "true");
  await shots(page, "tree-loading");
  release();
  await status.filter({ hasText: "Could not load the checkpoints (the server answered 503)" }).waitFor();
  assert.equal(await status.textContent(), "Could not load the checkpoints (the server answered 503): what is shown may be out of date. Close and open Checkpoints to try again.");
  assert.equal(await list.getAttribute("aria-busy"), "false");
  assert.ok((await page.getByTestId("tree-node").count()) < 3, "the list is the one from before the request");
  await shots(page, "tree-failed");

  // Closed and opened again with the server answering: the whole timeline,
  // and no status line.
  await page.unroute(checkpoints);
  await page.getByTestId("tree-toggle").click();
  await page.getByTestId("tree-toggle").click();
  await eventually(async () => assert.equal(await page.getByTestId("tree-node").count(), 3));
  await status.waitFor({ state: "hidden" });
  assert.equal(await list.getAttribute("aria-busy"), "false");

  // With the panel open, the new points of a request are fetched as they
  // are saved, without a status line each time.
  await page.evaluate(() => {
    const el = document.querySelector("[data-testid=tree-status]");
    window.treeStatusShown = 0;
    new MutationObserver(() => (window.treeStatusShown += el.hidden ? 0 : 1)).observe(el, { attributes: true, attributeFilter: ["hidden"] });
  });
  await send(page, "Short: and barley?");
  await runStatus(page, "idle");
  await eventually(async () => assert.equal(await page.getByTestId("tree-node").count(), 5));
  assert.equal(await page.evaluate(() => window.treeStatusShown), 0, "a refresh showed the status line");
  assert.equal(await list.getAttribute("aria-busy"), "false");
  // The refused fetches (the page's at the reply's end, the panel's) are
  // the only console errors (Chromium logs every 5xx).
  assert.ok(errors.length === 2 && errors.every((e) => /503/.test(e)), JSON.stringify(errors));
  assert.match(errors[0], /status of 503/);
  errors.length = 0;
  await done(page, errors);
});

test("rename a conversation: the heading and the sidebar show the new title", async () => {
  const { page, errors, url } = await openPage(browser, { thread: server.url });
  const current = page.locator("[data-testid=thread-link][aria-current=page]");
  assert.equal(await current.textContent(), "New conversation");
  const title = `Lisbon plans ${Date.now()}`;
  // Rename opens the field; Save saves in place (e2e/daily.test.mjs: Esc,
  // a click elsewhere, refusals).
  await page.getByTestId("rename-toggle").click();
  await page.getByTestId("title-input").fill(title);
  await page.getByRole("button", { name: "Save" }).click();
  await current.filter({ hasText: title }).waitFor();
  assert.equal(page.url(), url);
  assert.equal(await page.getByTestId("thread-heading").textContent(), title);
  assert.equal(await page.getByTestId("title-input").inputValue(), title);
  assert.equal(await page.title(), `${title} · gateway`);
  // Enter in the title field saves too, and the page stays live.
  const again = title + " (renamed)";
  await page.getByTestId("rename-toggle").click();
  await page.getByTestId("title-input").fill(again);
  await page.getByTestId("title-input").press("Enter");
  await current.filter({ hasText: again }).waitFor();
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  assert.equal(await page.locator("[data-testid=thread-link]", { hasText: title }).count(), 1, "one sidebar entry per conversation");
  await shot(page, "renamed");
  await done(page, errors);
});

test("phone width: the cancelled state fits without horizontal scrolling", async () => {
  const errors = [];
  const page = await newPage(browser, errors, { viewport: { width: 390, height: 844 } });
  await newThread(page, server.url);
  await startAndStream(page);
  assert.ok(await page.evaluate(() => document.documentElement.scrollWidth) <= 390, "no horizontal scroll while streaming");
  await page.getByTestId("cancel").click();
  await page.getByTestId("receipt").waitFor();
  await runStatus(page, "cancelled");
  // The receipt is brought into view above the composer, not under it.
  await eventually(async () => {
    const receipt = await page.getByTestId("receipt").boundingBox();
    const composer = await page.getByTestId("composer").boundingBox();
    assert.ok(receipt.y + receipt.height <= composer.y + 24 && receipt.y + receipt.height > 0, `receipt ends at ${receipt.y + receipt.height}, the composer starts at ${composer.y}`);
  });
  await shot(page, "phone-cancelled");
  await shot(page, "phone-cancelled-viewport", { fullPage: false });
  const widths = await page.evaluate(() => ({ doc: document.documentElement.scrollWidth, body: document.body.scrollWidth }));
  assert.ok(widths.doc <= 390 && widths.body <= 390, `no horizontal scroll: ${JSON.stringify(widths)}`);
  // Every action of the receipt is inside the screen.
  for (const b of await page.getByTestId("receipt").locator("button").all()) {
    const box = await b.boundingBox();
    assert.ok(box && box.x >= 0 && box.x + box.width <= 390, `${await b.textContent()} fits: ${JSON.stringify(box)}`);
  }
  await done(page, errors);
});
