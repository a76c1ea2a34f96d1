// The message queue in the page (issue #33): while a reply streams, Enter
// and Send queue the message under it and "Send now" (Ctrl+Enter) sends it
// at once, stopping the reply with its receipt. Every tab of the
// conversation shows the queue, drawn from the server's queue.updated
// events and snapshots only; each message can be edited in place and
// removed. A Stop pauses the queue: nothing starts until the user sends it
// on or clears it. A message queued while offline is kept, shown as not
// sent, and queued once when the connection is back.
import { test } from "node:test";
import assert from "node:assert/strict";
import { serveForFile, newPage, interceptSocket, send, runStatus, messageTexts, eventually, apiExchange, shots, audit } from "./harness.mjs";

let server, browser;
// A word per 40 ms: a short reply takes a second or two; long (below)
// streams for minutes.
serveForFile({ pace: "40ms" }, (s, b) => ([server, browser] = [s, b]));

// long is a request whose reply (the same words, about 5,400 of them)
// outlasts every test here; a word at a time, it keeps the page light.
const long = "Repeat after me: " + "the garden rests under straw through the winter, ".repeat(600);

const json = { "content-type": "application/json" };
const threadOf = (url) => new URL(url).pathname.split("/").pop();

// queued is the queue as page shows it: the text of each queued message,
// in order.
const queued = (page) => page.locator("[data-testid=queue-list] > [data-testid=queued-item] [data-testid=queued-text]").allTextContents();
const item = (page, n) => page.locator("[data-testid=queue-list] > [data-testid=queued-item]").nth(n);

// conversation creates a conversation over the API with a history of n
// exchanges (a long conversation to look at), and answers its id and URL.
async function conversation(n) {
  const { thread_id: id } = await server.api("/api/threads", { method: "POST", headers: json, body: "{}" });
  for (let i = 0; i < n; i++) await apiExchange(server, id, `Short: question ${i + 1} about the vegetable garden in winter?`);
  return { id, url: `${server.url}/t/${id}` };
}

// open opens url in a page of context (its WebSocket in the test's hands)
// and waits until it follows the conversation.
async function open(context, errors, url) {
  const page = await newPage(context, errors);
  const socket = await interceptSocket(page);
  await page.goto(url);
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  await page.getByTestId("send").and(page.locator(":enabled")).waitFor();
  return { page, socket };
}

// touchTargets lists the queue's buttons smaller than 24 × 24 px.
async function touchTargets(page) {
  return page.locator("[data-testid=queue] button:visible, [data-testid=send-now]:visible").evaluateAll((bs) =>
    bs.map((b) => [b.textContent, b.getBoundingClientRect()]).filter(([, r]) => r.width < 24 || r.height < 24).map(([t, r]) => `${t}: ${r.width}×${r.height}`),
  );
}

// streamLong starts a reply on page that outlasts the test, and answers
// its run.
async function streamLong(page, threadID) {
  await send(page, long);
  await page.getByTestId("streaming-text").filter({ hasText: /\S/ }).waitFor();
  await runStatus(page, "running");
  return (await server.api(`/api/threads/${threadID}`)).active_run.run_id;
}

// toLatest brings the end of the conversation into view, where the
// reply and the queue are (a picture's prepare: shots in harness.mjs).
// (It waits two frames: the picture is of the page drawn there.)
const toLatest = (page) => () =>
  page.evaluate(() => {
    window.scrollTo({ top: document.documentElement.scrollHeight });
    return new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  });

// still holds back what the server sends a page while fn runs, then lets
// it through in order: the reply stops growing on screen, and with it the
// scrolling that keeps its end in view (a picture taken while the page
// scrolls is cut off at one end).
async function still(socket, fn) {
  socket.mode = "hold";
  try {
    await fn();
  } finally {
    socket.release();
  }
}

// clickStill clicks target (on page, whose socket is socket) with what the
// server sends the page held, at the latest message: while a reply streams,
// the queue under it moves as the reply grows, and Playwright clicks only
// what keeps its place for two frames (a queued item that moved down can
// also be under the composer, which stays at the bottom of the window).
async function clickStill(socket, page, target) {
  await still(socket, async () => {
    await toLatest(page)();
    await target.click();
  });
}

// stopActive cancels the conversation's active run, if any (a long reply
// left running would hold one of the user's run slots in the next test).
async function stopActive(threadID) {
  const run = (await server.api(`/api/threads/${threadID}`)).active_run;
  if (run) await server.api(`/api/runs/${run.run_id}/cancel`, { method: "POST", headers: json, body: JSON.stringify({ reason: "user_requested" }) });
}

// serverQueue is the queue as the server holds it.
async function serverQueue(threadID) {
  return (await server.api(`/api/threads/${threadID}`)).queue;
}

const first = "Repeat after me: the first queued answer";
const second = "Repeat after me: the second queued answer";
const edited = "Repeat after me: the second queued answer, edited in the other tab";

test("two tabs: messages queued while a reply streams show in both, an edit in one shows in the other, Remove; Stop pauses them and nothing starts until they are sent on, in order", async () => {
  const { id, url } = await conversation(6);
  const context = await browser.newContext();
  const errors = [];
  const { page: a, socket: socketA } = await open(context, errors, url);
  const { page: b, socket: socketB } = await open(context, errors, url);
  const found = [];
  const runID = await streamLong(a, id);

  // Enter queues the first, Send the second; the box empties, the reply
  // keeps streaming, and the keys say what they do now.
  assert.match(await a.getByTestId("composer-hint").textContent(), /^Enter queues it for after the reply · Ctrl\+Enter sends it now, stopping the reply · Esc stops the reply/);
  assert.ok(await a.getByTestId("send").isVisible(), "Send stays while the reply streams");
  assert.equal(await a.getByTestId("send-now").getAttribute("title"), "Send now: stop the reply and send this");
  await a.getByTestId("composer-input").fill(first);
  await a.getByTestId("composer-input").press("Enter");
  await a.getByTestId("composer-input").fill(second);
  await a.getByTestId("send").click();
  for (const page of [a, b]) await eventually(async () => assert.deepEqual(await queued(page), [first, second]));
  assert.equal(await a.getByTestId("composer-input").inputValue(), "", "the box is empty: the queue has the text");
  assert.deepEqual(await item(b, 0).getByTestId("queued-chip").textContent(), "Next · after this reply");
  assert.deepEqual(await item(b, 1).getByTestId("queued-chip").textContent(), "Queued · 2");
  assert.equal(await a.getByTestId("queue-state").textContent(), "Each is sent when the reply before it finishes.");
  await runStatus(a, "running");
  assert.deepEqual((await serverQueue(id)).items.map((i) => i.user_message), [first, second]);
  assert.equal(await a.getByTestId("queued-pending").count(), 0, "acknowledged: nothing shown as not sent");
  // The queue comes after the reply being written.
  // (The reply is drawn anew as it grows: measured once it stands.)
  await eventually(async () => {
    const [streamY, queueY] = await Promise.all([a.getByTestId("streaming").boundingBox(), a.getByTestId("queue").boundingBox()]);
    assert.ok(streamY && queueY && queueY.y > streamY.y, "queued messages are under the streaming reply");
  });
  assert.deepEqual(await touchTargets(a), []);
  found.push(...(await audit(a, "two queued while streaming")));
  await still(socketA, () => shots(a, "queue-two-while-streaming", { prepare: toLatest(a) }));

  // Tab B edits the second in place: Enter saves, and tab A shows it.
  await clickStill(socketB, b, item(b, 1).getByTestId("queued-edit-button"));
  const box = b.getByTestId("queued-edit");
  assert.equal(await box.inputValue(), second);
  assert.equal(await b.evaluate(() => document.activeElement?.dataset.testid), "queued-edit", "the focus is in the edit box");
  await box.fill(edited);
  found.push(...(await audit(b, "editing a queued message")));
  await still(socketB, () => shots(b, "queue-editing-in-one-tab", { prepare: toLatest(b) }));
  await box.press("Enter");
  for (const page of [a, b]) await eventually(async () => assert.deepEqual(await queued(page), [first, edited]));
  assert.equal(await b.getByTestId("queued-edit").count(), 0, "the edit box closed");
  assert.equal(await b.evaluate(() => document.activeElement?.getAttribute("aria-label")), "Edit queued message 2", "the focus is back on Edit");
  await still(socketA, () => shots(a, "queue-edit-seen-in-other-tab", { prepare: toLatest(a) }));

  // Esc cancels an edit, and only the edit: the reply keeps streaming.
  await clickStill(socketB, b, item(b, 0).getByTestId("queued-edit-button"));
  await b.getByTestId("queued-edit").fill("Repeat after me: never saved");
  await b.getByTestId("queued-edit").press("Escape");
  await b.getByTestId("queued-edit").waitFor({ state: "detached" });
  assert.deepEqual(await queued(b), [first, edited]);
  assert.equal(await b.evaluate(() => document.activeElement?.getAttribute("aria-label")), "Edit queued message 1");
  await runStatus(b, "running");
  assert.ok(!socketB.fromClient.some((c) => c.type === "run.cancel"), "Esc in the edit box cancelled nothing");

  // A third, queued in B, removed in A.
  await b.getByTestId("composer-input").fill("Repeat after me: a third one");
  await b.getByTestId("composer-input").press("Enter");
  await eventually(async () => assert.equal((await queued(a)).length, 3));
  await clickStill(socketA, a, item(a, 2).getByTestId("queued-remove"));
  for (const page of [a, b]) await eventually(async () => assert.deepEqual(await queued(page), [first, edited]));
  assert.equal(await a.evaluate(() => document.activeElement?.getAttribute("aria-label")), "Remove queued message 2", "the focus goes to the message before it");

  // Stop: the receipt says two messages wait, and the queue is paused in
  // both tabs, with the two ways on.
  const before = await messageTexts(a);
  await a.getByTestId("cancel").click();
  await a.getByTestId("receipt").waitFor({ timeout: 15000 });
  assert.equal(await a.getByTestId("receipt-queued").textContent(), "2 queued messages wait, paused: none is sent until you choose.");
  for (const page of [a, b]) {
    await page.getByTestId("queue-state").filter({ hasText: "Paused: the reply was stopped." }).waitFor();
    assert.equal(await page.getByTestId("queue-state").textContent(), "Paused: the reply was stopped. Nothing is sent until you choose.");
    assert.ok(await page.getByTestId("queue-resume").isVisible());
    assert.equal(await page.getByTestId("queue-resume").textContent(), "Send the queued messages");
    assert.ok(await page.getByTestId("queue-clear").isVisible());
    assert.deepEqual(await queued(page), [first, edited]);
    assert.equal(await item(page, 0).getByTestId("queued-chip").textContent(), "Queued · 1 · paused");
  }
  // Nothing started: the server paused the queue in the cancel's own
  // step, and no run.started followed the run.cancelled.
  await eventually(() => assert.ok(socketB.frames.some((f) => f.obj.type === "queue.updated" && f.obj.queue?.paused)));
  const cancelledAt = socketB.frames.findIndex((f) => f.obj.type === "run.cancelled" && f.obj.run_id === runID);
  assert.ok(cancelledAt >= 0);
  assert.equal(socketB.frames.find((f) => f.obj.type === "run.cancelled").obj.queued_messages, 2);
  assert.deepEqual(socketB.frames.slice(cancelledAt).filter((f) => f.obj.type === "run.started"), [], "no run started after the cancel");
  const snap = await server.api(`/api/threads/${id}`);
  assert.equal(snap.active_run, null);
  assert.deepEqual([snap.queue.paused, snap.queue.paused_reason, snap.queue.items.length], [true, "run_cancelled", 2]);
  await runStatus(a, "cancelled");
  assert.deepEqual(await messageTexts(a), before, "nothing of the queue became a message");
  assert.equal(await a.getByTestId("streaming").filter({ has: a.locator(".chip.live") }).count(), 0, "no reply streams");
  assert.deepEqual(await touchTargets(a), []);
  found.push(...(await audit(a, "paused after Stop")));
  await shots(a, "queue-paused-after-stop", { prepare: toLatest(a) });

  // Sent on from tab B: the two are sent one after the other, each after
  // the reply before it, in both tabs.
  await b.getByTestId("queue-resume").click();
  const want = [
    { role: "user", text: first },
    { role: "assistant", text: "the first queued answer" },
    { role: "user", text: edited },
    { role: "assistant", text: "the second queued answer, edited in the other tab" },
  ];
  for (const page of [a, b]) {
    await eventually(async () => assert.deepEqual((await messageTexts(page)).slice(-4).map(({ role, text }) => ({ role, text })), want), { timeout: 20000 });
    await runStatus(page, "idle");
    await page.getByTestId("queue").waitFor({ state: "hidden" });
  }
  assert.equal(await b.evaluate(() => document.activeElement?.dataset.testid), "composer-input", "the focus goes to the box");
  assert.deepEqual(await serverQueue(id), { items: [], paused: false, paused_reason: null });
  assert.deepEqual(found, []);
  assert.deepEqual(errors, []);
  await context.close();
});

// order is the history's items as page shows them: a message as its role
// and the start of its text, a receipt of a run an interrupt stopped as
// its heading.
async function order(page) {
  return page.locator("[data-testid=messages] > li").evaluateAll((els) =>
    els.map((e) =>
      e.dataset.testid === "interrupt-receipt"
        ? `stopped: ${e.querySelector("[data-testid=receipt-heading]").textContent}`
        : `${e.dataset.role}: ${(e.querySelector("[data-testid=message-body]")?.textContent ?? "").slice(0, 40)}`,
    ),
  );
}

test("Send now stops the reply with its receipt, and the new reply streams under the message; Ctrl+Enter does the same; a message queued after them waits its turn", async () => {
  const { id, url } = await conversation(6);
  const context = await browser.newContext();
  const errors = [];
  const { page: a } = await open(context, errors, url);
  const { page: b, socket: socketB } = await open(context, errors, url);
  const runID = await streamLong(a, id);
  const after = "Repeat after me: the answer after the interruptions";
  await a.getByTestId("composer-input").fill(after);
  await a.getByTestId("composer-input").press("Enter");
  await eventually(async () => assert.deepEqual(await queued(b), [after]));

  // Send now: the reply stops (its receipt stays where it was written),
  // and the message is sent in its place; the queued one still waits.
  const now = ("Repeat after me: " + "an answer sent right now, ".repeat(40)).trim();
  await a.getByTestId("composer-input").fill(now);
  // Tab B is shown the moment between the cancel and its end (its events
  // held back from run.cancelled on): the message sent now is first in
  // the queue, marked as what stops the reply.
  const cancelled = socketB.holdFrom((o) => o.type === "run.cancelled");
  await a.getByTestId("send-now").click();
  await cancelled;
  await eventually(async () => assert.deepEqual(await queued(b), [now, after]));
  assert.equal(await item(b, 0).getAttribute("data-mode"), "interrupt");
  assert.equal(await item(b, 0).getByTestId("queued-chip").textContent(), "Sends now · stops the reply");
  await runStatus(b, ["cancel_requested", "cancelling"]);
  socketB.release();
  for (const [page, heading] of [[a, "Stopped to send your message"], [b, "Stopped from another tab to send a new message"]]) {
    await page.getByTestId("interrupt-receipt").waitFor({ timeout: 15000 });
    await eventually(async () => assert.deepEqual((await order(page)).slice(-3), [`user: ${long.slice(0, 40)}`, `stopped: ${heading}`, `user: ${now.slice(0, 40)}`]));
    await page.getByTestId("streaming-text").filter({ hasText: "an answer sent right now" }).waitFor();
    assert.match(await page.getByTestId("interrupt-receipt").getByTestId("receipt-discarded").textContent(), /^[1-9]\d* characters of unpublished text$/);
    assert.match(await page.getByTestId("interrupt-receipt").getByTestId("receipt-kept").textContent(), /^everything up to your request “Repeat after me: the garden rests/);
    assert.deepEqual(await queued(page), [after], "the message queued for after still waits");
    assert.equal(await page.getByTestId("receipt").count(), 0, "no receipt offering to continue: the conversation went on");
  }
  const stopped = await server.api(`/api/runs/${runID}`);
  assert.equal(stopped.status, "cancelled");
  assert.equal(await a.getByTestId("composer-input").inputValue(), "");

  // Ctrl+Enter, while that reply streams: the same, from the keyboard.
  const byKey = "Repeat after me: the answer sent with the keyboard";
  await a.getByTestId("composer-input").fill(byKey);
  await a.getByTestId("composer-input").press("Control+Enter");
  const want = [
    `user: ${long.slice(0, 40)}`,
    "stopped: Stopped to send your message",
    `user: ${now.slice(0, 40)}`,
    "stopped: Stopped to send your message",
    `user: ${byKey.slice(0, 40)}`,
    "assistant: the answer sent with the keyboard",
    `user: ${after.slice(0, 40)}`,
    "assistant: the answer after the interruptions",
  ];
  await eventually(async () => assert.deepEqual((await order(a)).slice(-8), want), { timeout: 20000 });
  await runStatus(a, "idle");
  await a.getByTestId("queue").waitFor({ state: "hidden" });
  await eventually(async () => assert.equal((await order(b)).slice(-8).join("\n"), want.join("\n").replaceAll("Stopped to send your message", "Stopped from another tab to send a new message")));
  const found = await audit(a, "receipts of interruptions, and their replies");
  await shots(a, "queue-interrupt-receipt-then-reply", {
    prepare: () =>
      // The request it stopped (its end), the receipt, and what followed.
      a.getByTestId("interrupt-receipt").last().evaluate((e) => {
        window.scrollTo({ top: e.getBoundingClientRect().top + window.scrollY - document.querySelector(".thread-head").getBoundingClientRect().height - 110 });
        return new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
      }),
  });
  assert.deepEqual(found, []);
  assert.deepEqual(errors, []);
  await context.close();
});

test("offline: a message queued while the connection is down is kept (a reload too), shown as not sent yet, and queued once when it is back, even when its first answer is lost", async () => {
  const { id, url } = await conversation(3);
  const context = await browser.newContext();
  const errors = [];
  const { page, socket } = await open(context, errors, url);
  await streamLong(page, id);
  await socket.block();
  await page.locator("[data-testid=conn-status][data-state=reconnecting]").waitFor();

  const text = "Repeat after me: written while offline";
  assert.ok(await page.getByTestId("send").isEnabled(), "a message can be queued while offline");
  await page.getByTestId("composer-input").fill(text);
  await page.getByTestId("composer-input").press("Enter");
  const pending = page.getByTestId("queued-pending");
  const notSent = async () => {
    await pending.getByTestId("queued-chip").filter({ hasText: "Not sent yet: waiting for the connection" }).waitFor();
    assert.equal(await pending.getByTestId("queued-text").textContent(), text);
    assert.equal(await pending.count(), 1);
  };
  await notSent();
  assert.equal(await page.getByTestId("composer-input").inputValue(), "", "the text is in the queue now");
  assert.equal((await serverQueue(id)).items.length, 0, "nothing reached the server");
  assert.ok(await page.getByTestId("notice").isHidden(), `kept, not an error: ${await page.getByTestId("notice").textContent()}`);
  const found = await audit(page, "queued while offline");
  await shots(page, "queue-offline-not-sent", { prepare: toLatest(page) }); // (offline: nothing streams in)

  // A reload keeps it (the tab's storage), still not sent.
  await page.reload();
  await page.locator("[data-testid=conn-status][data-state=reconnecting]").waitFor();
  await notSent();

  // Back: the page queues it; its answer is lost with the connection
  // (the server has it, the page does not know), so it sends it again on
  // the next one: the server answers the same item.
  const conn = socket.connections;
  const lost = socket.holdFrom((o) => o.type === "ack" && socket.frames.some((f) => f.from === "client" && f.conn > conn && f.obj.id === o.re && f.obj.type === "queue.add"));
  socket.unblock();
  await lost;
  assert.deepEqual((await serverQueue(id)).items.map((i) => i.user_message), [text]);
  await socket.block();
  socket.queue.length = 0;
  socket.mode = "pass";
  socket.holdPred = null;
  await notSent();
  socket.unblock();
  await page.locator("[data-testid=conn-status][data-state=live]").waitFor({ timeout: 15000 });
  await eventually(async () => assert.deepEqual(await queued(page), [text]));
  assert.equal(await pending.count(), 0);
  const adds = socket.frames.filter((f) => f.from === "client" && f.obj.type === "queue.add").map((f) => f.obj);
  assert.ok(adds.length >= 2, `sent again after the lost answer (${adds.length})`);
  assert.equal(new Set(adds.map((c) => c.client_request_id)).size, 1, "with the same client_request_id");
  assert.deepEqual((await serverQueue(id)).items.map((i) => i.user_message), [text], "queued once");
  assert.deepEqual((await page.evaluate(() => Object.keys(sessionStorage))).filter((k) => k.startsWith("gateway.queued.")), [], "no longer kept once the server has it");
  await stopActive(id);
  assert.deepEqual(found, []);
  assert.deepEqual(errors, []);
  await context.close();
});

test("what goes wrong says what to do and loses nothing: a full queue, a message too long, an empty edit, an edit of a message already sent or removed", async () => {
  const { id, url } = await conversation(2);
  const context = await browser.newContext();
  const errors = [];
  const { page, socket } = await open(context, errors, url);
  await streamLong(page, id);
  // (The first is long: sent, its reply outlasts the test, and the others
  // keep waiting behind it.)
  for (let i = 1; i <= 20; i++) {
    const text = i === 1 ? long : `Repeat after me: queued message ${i}`;
    await server.api(`/api/threads/${id}/queue`, { method: "POST", headers: json, body: JSON.stringify({ user_message: text }) });
  }
  await eventually(async () => assert.equal((await queued(page)).length, 20));
  const notice = page.getByTestId("notice");
  const box = page.getByTestId("composer-input");

  // A 21st: refused, and back in the box.
  await box.fill("Repeat after me: one too many");
  await box.press("Enter");
  await notice.filter({ hasText: "Not queued" }).waitFor();
  assert.equal(
    await notice.textContent(),
    "Not queued: the queue of this conversation holds 20 messages, the most it may: remove one, or wait for the reply to finish. Your text is back in the box.",
  );
  assert.equal(await box.inputValue(), "Repeat after me: one too many");
  assert.equal(await page.getByTestId("queued-pending").count(), 0);
  assert.equal((await queued(page)).length, 20);

  // Too long (in bytes: the box counts characters): it stays in the box.
  await box.fill("é".repeat(20000));
  await box.press("Enter");
  await notice.filter({ hasText: "Too long to send: 40,000 bytes, at most 32,768." }).waitFor();
  assert.equal((await box.inputValue()).length, 20000);
  await box.fill("");
  // (A queue command that goes through clears the note.)
  await item(page, 19).getByTestId("queued-remove").click();
  await notice.waitFor({ state: "hidden" });
  await eventually(async () => assert.equal((await queued(page)).length, 19));

  // An edit emptied: said, and the box stays open.
  await item(page, 0).getByTestId("queued-edit-button").click();
  await page.getByTestId("queued-edit").fill("  ");
  await page.getByTestId("queued-edit").press("Enter");
  await page.getByTestId("queued-error").filter({ hasText: "A queued message cannot be empty" }).waitFor();
  assert.ok(await page.getByTestId("queued-edit").isVisible());
  assert.equal(await page.evaluate(() => document.activeElement?.dataset.testid), "queued-edit");
  await page.getByTestId("queued-cancel-edit").click();

  // Edited while it was sent: the page did not see it go (its events are
  // held back), so Save reaches the server, which says it was sent; the
  // text stays in the box, and can be queued as a new message.
  await item(page, 0).getByTestId("queued-edit-button").click();
  await page.getByTestId("queued-edit").fill("Repeat after me: edited too late");
  socket.mode = "stale";
  await stopActive(id);
  await eventually(async () => assert.equal((await server.api(`/api/threads/${id}`)).queue.paused, true));
  const resumed = await server.api(`/api/threads/${id}/queue/resume`, { method: "POST", headers: json, body: "{}" });
  assert.ok(resumed.run_id, "the first message was sent");
  await page.getByTestId("queued-edit").press("Enter");
  const orphan = page.getByTestId("queued-orphan");
  await orphan.waitFor();
  assert.equal(await orphan.getByTestId("queued-error").textContent(), "Already sent — it is the reply above. Your edit was not applied: your text is still here.");
  assert.equal(await page.getByTestId("queued-edit").inputValue(), "Repeat after me: edited too late");
  assert.deepEqual(await audit(page, "edit of a message already sent"), []);
  await shots(page, "queue-edit-already-sent", {
    prepare: () =>
      orphan.evaluate((e) => {
        e.scrollIntoView({ block: "center" });
        return new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
      }),
  });
  socket.mode = "pass";
  await page.getByTestId("queued-readd").click();
  await eventually(async () => assert.equal((await serverQueue(id)).items.at(-1)?.user_message, "Repeat after me: edited too late"));
  await page.reload();
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  await eventually(async () => assert.equal((await queued(page)).at(-1), "Repeat after me: edited too late"));

  // Removed in another tab (here: a program) while being edited: said at
  // once, the text kept; Discard lets it go.
  const target = await item(page, 1).getAttribute("data-item-id");
  await item(page, 1).getByTestId("queued-edit-button").click();
  await page.getByTestId("queued-edit").fill("Repeat after me: edited, but removed elsewhere");
  await server.api(`/api/threads/${id}/queue/${target}`, { method: "DELETE" });
  await orphan.getByTestId("queued-error").filter({ hasText: "No longer in the queue (sent or removed elsewhere), so your edit was not applied: your text is still here." }).waitFor();
  assert.equal(await page.getByTestId("queued-edit").inputValue(), "Repeat after me: edited, but removed elsewhere");
  await page.getByTestId("queued-discard").click();
  await orphan.waitFor({ state: "detached" });
  assert.equal(await page.evaluate(() => document.activeElement?.dataset.testid), "composer-input");
  await stopActive(id);
  assert.deepEqual(errors, []);
  await context.close();
});

test("a paused queue says why: the conversation moved to another point (a fragment saved), or the reply failed; Clear empties it", async () => {
  const { id, url } = await conversation(2);
  const context = await browser.newContext();
  const errors = [];
  const { page, socket } = await open(context, errors, url);
  const first = await streamLong(page, id);
  await page.getByTestId("cancel").click();
  await page.getByTestId("receipt").waitFor({ timeout: 15000 });
  const delta = socket.frames.findLast((f) => f.obj.type === "message.delta" && f.obj.run_id === first).obj;

  // Continue: the reply streams again, and a message waits after it.
  await page.getByTestId("action-continue").click();
  await runStatus(page, "running");
  await page.getByTestId("composer-input").fill("Repeat after me: waiting behind the reply");
  await page.getByTestId("composer-input").press("Enter");
  await eventually(async () => assert.deepEqual(await queued(page), ["Repeat after me: waiting behind the reply"]));
  assert.equal(await page.getByTestId("queue-resume").count(), 0, "not paused");

  // The stopped reply's fragment is saved (here by a program): the
  // conversation moved on, and what was queued waits for the user.
  const v = (await server.api(`/api/threads/${id}`)).state_version;
  await server.api(`/api/threads/${id}/fragments`, { method: "POST", headers: json, body: JSON.stringify({ message_id: delta.message_id, last_seq: delta.seq, expected_state_version: v }) });
  const state = page.getByTestId("queue-state");
  await state.filter({ hasText: "Paused: the conversation moved to another point." }).waitFor();
  assert.equal(await state.textContent(), "Paused: the conversation moved to another point. Nothing is sent until you choose.");
  assert.equal((await serverQueue(id)).paused_reason, "head_moved");
  assert.deepEqual(await audit(page, "paused: the conversation moved"), []);

  // Clear removes each queued message, in every tab.
  await page.getByTestId("queue-clear").click();
  await page.getByTestId("queue").waitFor({ state: "hidden" });
  assert.deepEqual(await serverQueue(id), { items: [], paused: false, paused_reason: null });
  assert.equal(await page.evaluate(() => document.activeElement?.dataset.testid), "composer-input");
  await stopActive(id);
  await runStatus(page, ["cancelled", "idle"]);

  // A reply that failed pauses the queue too (run_failed). The demo model
  // never fails a reply, so the event is the test's, sent to the page as
  // the server would (the page is reloaded after: it knows nothing else).
  const seq = Number(await page.locator("#thread").getAttribute("data-last-seq")) + 1;
  const item0 = { item_id: "qi_test", user_message: "Repeat after me: after a failure", mode: "after", requested_by: "tab:x", created_at: new Date().toISOString() };
  socket.client.send(JSON.stringify({ type: "queue.updated", thread_id: id, seq, ts: Date.now(), queue: { items: [item0], paused: true, paused_reason: "run_failed" } }));
  await state.filter({ hasText: "Paused: the reply failed." }).waitFor();
  assert.deepEqual(await queued(page), ["Repeat after me: after a failure"]);
  assert.ok(await page.getByTestId("queue-resume").isVisible());
  await page.reload();
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  assert.ok(await page.getByTestId("queue").isHidden());
  assert.deepEqual(errors, []);
  await context.close();
});
