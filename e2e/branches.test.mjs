// Versions of a conversation as a user makes them: Edit on any request (in
// place), Regenerate on any reply, the ‹ n/m › arrows between versions,
// what a branch left behind did outside, and a stopped reply kept in view.
// Each state is checked as the user sees it, with axe (every impact) and
// pictures at 1280 and 390 px, light and dark, on a long conversation.
import { test } from "node:test";
import assert from "node:assert/strict";
import { serveForFile, openPage, newThread, send, runStatus, messageTexts, apiExchange, shots, audit, eventually } from "./harness.mjs";

let server, browser;
serveForFile({ pace: "40ms" }, (s, b) => ([server, browser] = [s, b]));

// longThread opens a new conversation holding n exchanges made through the
// API ("Question 1: …" and their replies), reloaded so the page shows them.
async function longThread(n) {
  const { page, errors, url } = await openPage(await browser.newContext(), { thread: server.url });
  const threadID = new URL(url).pathname.split("/").pop();
  for (let i = 1; i <= n; i++) await apiExchange(server, threadID, `Question ${i}: what is worth knowing about topic ${i}?`);
  await page.reload();
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  await eventually(async () => assert.equal((await messageTexts(page)).length, 2 * n));
  return { page, errors, threadID };
}

// message is the list item of the i-th message shown (0-based).
const message = (page, i) => page.locator("[data-testid=messages] > [data-testid=message]").nth(i);

// versionOf waits until message i shows "‹ index/count ›".
async function versionOf(page, i, want) {
  await message(page, i).getByTestId("branch-pos").filter({ hasText: want }).waitFor();
}

// (Pages open in a context of their own: axe needs one.)
async function done(page, errors) {
  assert.deepEqual(errors, [], "no console errors");
  await page.context().close();
}

test("Edit on an earlier request: edited in place, sent as a new version, the old one a click away", async () => {
  const { page, errors, threadID } = await longThread(8);
  const before = await messageTexts(page);
  const third = message(page, 4); // "Question 3: …"
  const edit = third.getByTestId("edit-message");
  // (The checkpoints are read a moment after the first paint.)
  await edit.waitFor();
  assert.equal(await page.locator("[data-testid=edit-message]").count(), 8, "every request has Edit");
  assert.equal(await page.locator("[data-testid=regenerate]").count(), 8, "every reply has Regenerate");
  const box = await edit.boundingBox();
  assert.ok(box.width >= 24 && box.height >= 24, `Edit is a 24 × 24 target at least: ${box.width}×${box.height}`);

  await edit.click();
  const editor = third.getByTestId("edit-box");
  await editor.waitFor();
  assert.equal(await editor.inputValue(), before[4].text, "the editor holds the request as sent");
  assert.ok(await editor.evaluate((e) => e === document.activeElement), "the focus is in the editor");
  // The editor is whole in view, above the composer.
  const [edBox, composerBox] = [await third.boundingBox(), await page.getByTestId("composer-input").boundingBox()];
  assert.ok(edBox.y >= 0 && edBox.y + edBox.height <= composerBox.y, `editor ${JSON.stringify(edBox)} clear of the composer ${JSON.stringify(composerBox)}`);
  assert.equal(await third.getByTestId("edit-explained").textContent(), "Sending starts a new version from before this message. The conversation as it is stays one click away (‹ ›).");
  assert.deepEqual(await audit(page, "editing a request in place"), []);
  await shots(page, "branches-edit-open", { prepare: () => third.evaluate((li) => li.scrollIntoView({ block: "nearest" })) });

  // Esc leaves the editor, changes nothing, and gives the focus back.
  await editor.fill("something I did not mean");
  await editor.press("Escape");
  assert.equal(await third.getByTestId("edit-box").count(), 0);
  assert.deepEqual(await messageTexts(page), before, "nothing changed");
  assert.ok(await third.getByTestId("edit-message").evaluate((e) => e === document.activeElement), "the focus is back on Edit");
  assert.equal(await page.locator("#thread").getAttribute("data-run-status"), "idle", "Esc in the editor cancels nothing");

  await third.getByTestId("edit-message").click();
  await third.getByTestId("edit-box").fill("Question 3, asked differently: what matters most?");
  await third.getByTestId("edit-box").press("Enter");
  await runStatus(page, ["running", "queued"]);
  await runStatus(page, "idle", 20000);
  const after = await messageTexts(page);
  assert.deepEqual(after.slice(0, 4), before.slice(0, 4), "what came before the edited request stays");
  assert.equal(after.length, 6, JSON.stringify(after.map((m) => m.text.slice(0, 30))));
  assert.equal(after[4].text, "Question 3, asked differently: what matters most?");
  assert.equal(after[5].role, "assistant");
  await versionOf(page, 4, "2/2");
  assert.equal(await message(page, 4).getByTestId("branch-nav").getAttribute("aria-label"), "Version 2 of 2");
  const snap = await server.api(`/api/threads/${threadID}`);
  assert.deepEqual(snap.messages.map((m) => m.content), after.map((m) => m.text), "the server's history is the one shown");
  assert.deepEqual(await audit(page, "an edited request, version 2 of 2"), []);
  await shots(page, "branches-edit-sent");

  // The old version is one click away, whole.
  await message(page, 4).getByTestId("branch-prev").click();
  await eventually(async () => assert.deepEqual(await messageTexts(page), before));
  await versionOf(page, 4, "1/2");

  // Checkpoints: this branch's points, to the second, and the other
  // branch by its first words, its length and its end, with Switch.
  await page.getByTestId("tree-toggle").click();
  const others = page.getByTestId("other-branches");
  const branch = others.getByTestId("branch");
  await branch.getByTestId("branch-what").filter({ hasText: "From message 5, your message: “Question 3, asked differently: what matters most?”" }).waitFor();
  assert.equal(await branch.count(), 1);
  assert.equal(await others.locator("h3").textContent(), "Other branches (1)");
  assert.match(await branch.getByTestId("branch-more").textContent(), /^6 messages · ends with “.+”$/);
  const nodes = page.locator("[data-testid=tree-list] > [data-testid=tree-node]");
  assert.equal(await nodes.locator(":scope[data-branch=current] [data-testid=tree-what]").count(), 1);
  for (const t of await page.locator("[data-testid=tree] time").allTextContents()) assert.match(t, /\d:\d\d:\d\d/, "times to the second");
  assert.deepEqual(await audit(page, "the timeline with another branch"), []);
  await shots(page, "branches-timeline", { prepare: () => others.scrollIntoViewIfNeeded() });
  await branch.getByTestId("branch-switch").click();
  await eventually(async () => assert.deepEqual(await messageTexts(page), after));
  await others.getByTestId("branch-what").filter({ hasText: "From message 5, your message: “Question 3: what is worth knowing about topic 3?”" }).waitFor();
  assert.match(await others.getByTestId("branch-more").textContent(), /^16 messages · ends with “.+”$/);
  await done(page, errors);
});

test("Regenerate on an earlier reply: a new version from the point before it; Edit and Regenerate wait while a reply streams", async () => {
  const { page, errors } = await longThread(3);
  const before = await messageTexts(page);
  const reply = message(page, 3); // the reply to Question 2
  const oldReply = await reply.getAttribute("data-message-id");
  await reply.getByTestId("regenerate").waitFor();
  // The messages before it are not drawn again when the reply starts or
  // ends, only their buttons change (a conversation scrolled back holds
  // hundreds): each keeps its element.
  const items = page.locator("[data-testid=messages] > [data-testid=message]");
  await items.evaluateAll((els) => els.forEach((e) => (e.dataset.mark = e.dataset.messageId)));
  const kept = () => items.evaluateAll((els) => els.slice(0, 3).map((e) => e.dataset.mark === e.dataset.messageId));
  await reply.getByTestId("regenerate").click();
  await runStatus(page, ["running", "queued"]);
  // While it streams no other version can be started (the server allows
  // one run): the buttons say so, disabled.
  for (const b of await page.locator("[data-testid=edit-message], [data-testid=regenerate]").all()) {
    assert.ok(await b.isDisabled());
    assert.equal(await b.getAttribute("title"), "Wait for the reply to finish, or cancel it, to make a new version");
  }
  assert.deepEqual(await kept(), [true, true, true], "the messages before the reply kept their elements as it started");
  await runStatus(page, "idle", 20000);
  assert.deepEqual(await kept(), [true, true, true], "and as it ended");
  for (const b of await page.locator("[data-testid=edit-message], [data-testid=regenerate]").all()) {
    assert.ok(await b.isEnabled());
    assert.equal(await b.getAttribute("title"), null);
  }
  const after = await messageTexts(page);
  assert.equal(after.length, 4, "the history ends with the regenerated reply");
  assert.deepEqual(after.slice(0, 3), before.slice(0, 3));
  await versionOf(page, 3, "2/2");
  assert.notEqual(await message(page, 3).getAttribute("data-message-id"), oldReply, "a new reply, not the old one");
  assert.deepEqual(await audit(page, "a regenerated reply"), []);
  await shots(page, "branches-regenerated");
  await message(page, 3).getByTestId("branch-prev").click();
  await eventually(async () => assert.deepEqual(await messageTexts(page), before));
  await done(page, errors);
});

test("leaving a version whose email was sent says that switching does not unsend it", async () => {
  const { page, errors } = await openPage(await browser.newContext(), { thread: server.url });
  await send(page, "Please send an email to anna@example.com about the spring order");
  const card = page.getByTestId("confirm-card");
  await card.waitFor({ timeout: 20000 });
  await card.getByTestId("confirm-op").click();
  await runStatus(page, "idle", 20000);
  assert.deepEqual((await messageTexts(page)).map((m) => m.role), ["user", "assistant", "tool", "assistant"]);

  const first = message(page, 0);
  await first.getByTestId("edit-message").waitFor();
  await first.getByTestId("edit-message").click();
  await first.getByTestId("edit-box").fill("Never mind the email: what is the spring order?");
  await first.getByTestId("edit-send").click();
  const notice = page.getByTestId("notice");
  await notice.filter({ hasText: "The version you left had a side effect that switching does not undo: Email to anna@example.com: sent once." }).waitFor();
  await runStatus(page, "idle", 20000);
  await versionOf(page, 0, "2/2");
  assert.deepEqual(await audit(page, "a version left after an email was sent"), []);
  await shots(page, "branches-left-side-effect");
  await done(page, errors);
});

test("Stop keeps the reply in view, not saved: Save visible fragment first, and what Continue does in one line", async () => {
  const { page, errors } = await longThread(4);
  await send(page, "How should I plan a trip to Lisbon in spring?");
  await page.getByTestId("run-chip").filter({ hasText: "Streaming" }).waitFor();
  await eventually(async () => assert.ok((await page.getByTestId("streaming-text").textContent()).split(" ").length > 5));
  await page.getByTestId("cancel").click();
  const receipt = page.getByTestId("receipt");
  await receipt.waitFor();
  await page.getByTestId("run-chip").filter({ hasText: "Not saved · stopped here" }).waitFor();
  // The text reads as text: not struck through, in the ink of a reply.
  const text = page.getByTestId("streaming-text");
  const look = await text.evaluate((e) => ({ decoration: getComputedStyle(e).textDecorationLine, color: getComputedStyle(e).color }));
  const ink = await message(page, 1).getByTestId("message-body").evaluate((e) => getComputedStyle(e).color);
  assert.equal(look.decoration, "none");
  assert.equal(look.color, ink, "the stopped text has the colour of a reply");
  const actions = await receipt.locator(".actions button").evaluateAll((bs) => bs.map((b) => b.dataset.testid));
  assert.deepEqual(actions, ["action-save-fragment", "action-continue", "action-edit", "action-fork"], "saving what was read comes first");
  assert.equal(
    await receipt.getByTestId("continue-explained").textContent(),
    "Continue writes the unfinished reply again from the saved point: it starts over rather than adding to the text above.",
  );
  await page.getByTestId("action-save-fragment").and(page.locator(":enabled")).waitFor();
  assert.deepEqual(await audit(page, "a stopped reply, not saved"), []);
  await shots(page, "branches-stopped-not-saved", { prepare: () => receipt.scrollIntoViewIfNeeded() });
  await done(page, errors);
});

test("Enter while an email waits for confirmation queues the message and points at the card: it is no answer to it", async () => {
  const { page, errors } = await openPage(await browser.newContext(), { thread: server.url });
  await send(page, "Please send an email to ben@example.com about the autumn order");
  const card = page.getByTestId("confirm-card");
  await card.waitFor({ timeout: 20000 });
  await runStatus(page, "waiting_confirmation");
  assert.deepEqual(await audit(page, "a confirmation card"), []);
  await page.getByTestId("composer-input").fill("yes, send it");
  await page.getByTestId("composer-input").press("Enter");
  await page
    .getByTestId("notice")
    .filter({ hasText: "Your message is queued: it does not answer the question above. The reply waits for your decision on the email: Confirm and send, or Reject, on the card above." })
    .waitFor();
  await page.getByTestId("queue-list").getByTestId("queued-item").filter({ hasText: "yes, send it" }).waitFor();
  assert.equal(await page.locator("#thread").getAttribute("data-run-status"), "waiting_confirmation", "nothing was confirmed");
  assert.ok(await card.isVisible(), "the card is in view");
  assert.deepEqual(await audit(page, "a message queued while a card waits"), []);
  await shots(page, "branches-enter-while-confirming");
  // Rejected, the reply ends and the queued message goes on its own.
  await card.getByTestId("reject-op").click();
  await page.locator("[data-testid=messages] > [data-testid=message][data-role=user]", { hasText: "yes, send it" }).waitFor({ timeout: 20000 });
  await runStatus(page, "idle", 20000);
  await done(page, errors);
});
