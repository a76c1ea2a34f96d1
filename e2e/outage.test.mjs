// What the user saw of a reply when the server went away, and what the page
// says of it once it is back. A Cancel is pressed while the server is
// down (kept, sent on reconnect); the restarted server has meanwhile begun
// the reply again (a new attempt, a new message).
//
// - After a graceful stop (SIGTERM) every delta the server showed was
//   written: the page keeps the text it showed (not the new attempt's),
//   and "Save visible fragment" stores exactly it.
// - After a crash (SIGKILL) while another process held the database's
//   write lock, the deltas shown last were in memory only and are lost:
//   the page keeps the text on screen, says the server did not save it and
//   cannot keep it as a fragment, offers to copy it, and offers no save.
import { test } from "node:test";
import assert from "node:assert/strict";
import { serveForFile, openPage, shots, runStatus, longReply, expectCancelKept, eventually, holdWriteLock } from "./harness.mjs";

let server, browser;
serveForFile({ pace: "120ms" }, (s, b) => ([server, browser] = [s, b]));

// While the server is down, Chromium logs each refused reconnect of the
// page's WebSocket (and its HTTP retries) as console errors: the outage the
// page shows as "Reconnecting…", not page errors.
const refusedReconnect = /^(WebSocket connection to 'ws:\/\/[^']+\/ws' failed: .*(ERR_CONNECTION_REFUSED|ERR_CONNECTION_RESET|ERR_EMPTY_RESPONSE)|Failed to load resource: net::(ERR_CONNECTION_REFUSED|ERR_CONNECTION_RESET|ERR_EMPTY_RESPONSE)$)/;

// shownDeltas is what the page was given of runID, over every connection
// so far (each seq once: a replay may repeat one), up to seq uptoSeq: the
// message it was given last (or messageID), its text (the deltas,
// concatenated) and the seq of its last delta.
function shownDeltas(socket, runID, messageID, uptoSeq = Infinity) {
  const deltas = socket.frames.filter((f) => f.from === "server" && f.obj.type === "message.delta" && f.obj.run_id === runID).map((f) => f.obj);
  const id = messageID ?? deltas.at(-1).message_id;
  const seen = new Set();
  const mine = deltas.filter((d) => d.message_id === id && d.seq <= uptoSeq && !seen.has(d.seq) && seen.add(d.seq));
  return { messageID: id, text: mine.map((d) => d.text).join(""), lastSeq: mine.at(-1).seq };
}

// plain is text as a page shows it, white space folded (the reply is
// rendered as Markdown; the demo's is plain sentences).
const plain = (text) => text.replace(/\s+/g, " ").trim();

// stopMidReply streams a long reply, lets fn stop the server, presses
// Cancel while it is down and starts it again once the new attempt of the
// run has begun streaming (so the page is offered the new attempt's text
// too). It answers what the page had on screen and was given.
async function stopMidReply(page, socket, stop) {
  const { threadID, runID } = await longReply(page, server);
  await eventually(async () => assert.ok((await page.getByTestId("streaming-text").textContent()).length > 120, "a few lines on screen"));
  await stop(threadID);
  await page.locator("[data-testid=conn-status][data-state=reconnecting]").waitFor();
  const before = await page.getByTestId("streaming-text").textContent();
  const { messageID } = shownDeltas(socket, runID);
  // The page cannot reach the server until the retried attempt streams:
  // neither its WebSocket nor the HTTP path a kept cancel also tries.
  await socket.block();
  const cancelURL = "**/api/runs/*/cancel";
  await page.route(cancelURL, (route) => route.abort("connectionrefused"));
  await page.getByTestId("cancel").click();
  await expectCancelKept(page);
  await server.start(server.addr);
  await eventually(
    async () => {
      const ar = (await server.api(`/api/threads/${threadID}`)).active_run;
      assert.ok(ar && ar.message_id && ar.message_id !== messageID && ar.partial_text, "the retried attempt streams another message");
    },
    { timeout: 20000 },
  );
  // Once the run stopped, the page asks the server whether it holds the
  // text shown, naming the message and the last seq it applied: the test's
  // own record of frames cannot say which of the last ones reached the
  // page (the proxy records a frame before it hands it on, and one the
  // server sent as it stopped may never reach the closing socket).
  const held = page.waitForRequest((r) => r.url().includes(`/streamed/`), { timeout: 30000 });
  await page.unroute(cancelURL);
  socket.unblock();
  await page.locator("[data-testid=conn-status][data-state=live]").waitFor({ timeout: 15000 });
  await page.getByTestId("receipt").waitFor({ timeout: 15000 });
  await runStatus(page, "cancelled");
  const asked = new URL((await held).url());
  assert.ok(asked.pathname.endsWith(`/streamed/${messageID}`), `the page asks about the message it showed (${asked.pathname}), not the new attempt's`);
  const appliedSeq = Number(asked.searchParams.get("last_seq"));
  // What the page was given of the message it showed, up to what it
  // applied: before the stop, and (a graceful stop wrote them) deltas of it
  // sent just before the stop and lost in flight, replayed after the
  // reconnect. Never the new attempt's.
  const given = shownDeltas(socket, runID, messageID, appliedSeq);
  assert.ok(given.text.length >= before.length, "the page applied at least what it showed before the stop");
  const screen = await page.getByTestId("streaming-text").textContent();
  assert.ok(plain(screen).startsWith(plain(before)), `the text shown before the stop stays: ${before}`);
  assert.equal(plain(screen), plain(given.text), "the text on screen is the message the page showed, not the new attempt's");
  return { threadID, runID, screen, given };
}

test("graceful stop mid-reply, Cancel while down: the page keeps what it showed and saves exactly that", async () => {
  const { page, errors, socket } = await openPage(browser, { intercept: true });
  const { threadID, runID, screen, given } = await stopMidReply(page, socket, () => server.stop("SIGTERM"));

  assert.equal(await page.getByTestId("run-chip").textContent(), "Not saved · stopped here");
  const save = page.getByTestId("action-save-fragment");
  await save.and(page.locator(":enabled")).waitFor();
  await shots(page, "outage-sigterm-receipt");

  await save.click();
  const fragment = page.locator("[data-testid=message][data-kind=fragment]");
  await fragment.waitFor();
  assert.equal(await fragment.getByTestId("message-body").textContent(), screen, "the fragment is the text shown before the stop");
  const stored = (await server.api(`/api/threads/${threadID}`)).messages.at(-1);
  assert.equal(stored.kind, "fragment");
  assert.equal(stored.content, given.text, "the server kept every delta it had shown");
  assert.deepEqual(stored.fragment_of, { run_id: runID, message_id: given.messageID, last_seq: given.lastSeq });
  const chars = [...stored.content].length;
  assert.match(await page.getByTestId("receipt-discarded").textContent(), new RegExp(`; the part you saw \\(${chars} characters\\) is kept in the conversation as a saved fragment$`));
  await shots(page, "outage-sigterm-saved");
  assert.deepEqual(errors.filter((e) => !refusedReconnect.test(e)), [], "no console errors");
  await page.close();
});

test("crash mid-reply with the last deltas unwritten, Cancel while down: the page says the text it showed is lost and offers a copy, not a save", async () => {
  const { page, errors, socket } = await openPage(browser, { intercept: true });
  await page.context().grantPermissions(["clipboard-read", "clipboard-write"]);
  const { threadID, screen, given } = await stopMidReply(page, socket, async (threadID) => {
    // Another process holds the database's write lock: the next deltas
    // reach the page but are only in the server's memory when it dies.
    // (Counted by seq, past the last one written: frames reach the test
    // late on a loaded machine.)
    const lock = await holdWriteLock(server.db);
    const written = lock.written.get(threadID);
    assert.ok(written > 0, "the thread's deltas were being written");
    await eventually(() => assert.ok(socket.frames.some((f) => f.obj.type === "message.delta" && f.obj.thread_id === threadID && f.obj.seq > written + 3), "deltas shown that were not written"));
    await server.stop("SIGKILL");
    await lock.release();
  });

  await page.getByTestId("run-chip").filter({ hasText: "Not saved by the server · only on your screen" }).waitFor();
  assert.equal(await page.getByTestId("action-save-fragment").count(), 0, "nothing is offered to save that the server does not hold");
  const chars = [...given.text].length;
  assert.match(
    await page.getByTestId("receipt-discarded").textContent(),
    new RegExp(`^\\d+ characters of unpublished text that the server kept\\. The text you saw \\(${chars} characters\\) was not all saved before the server stopped, so it cannot be kept as a fragment: copy it from your screen if you need it \\(this page holds the only copy\\)$`),
  );
  // The server agrees: what the page showed cannot be saved.
  const r = await fetch(`${server.url}/api/threads/${threadID}/streamed/${given.messageID}?last_seq=${given.lastSeq}`);
  assert.equal(r.status, 410);
  assert.equal((await r.json()).cause, "server_stopped");
  await shots(page, "outage-sigkill-receipt");

  const copy = page.getByTestId("action-copy-unsaved");
  await page.evaluate(() => navigator.clipboard.writeText("(nothing copied)"));
  await copy.click();
  await eventually(async () => assert.equal(await copy.getAttribute("data-copied"), "true"));
  assert.equal(await page.evaluate(() => navigator.clipboard.readText()), given.text, "the copy is the text the page was given");
  assert.equal((await server.api(`/api/threads/${threadID}`)).messages.length, 1, "nothing was saved: only the request");
  // The page's question (GET …/streamed/…) is answered 410, which Chromium
  // logs like any failed request: the answer the page shows, not an error.
  const asked = /^Failed to load resource: the server responded with a status of 410 \(Gone\)$/;
  assert.deepEqual(errors.filter((e) => !refusedReconnect.test(e) && !asked.test(e)), [], "no console errors");
  await page.close();
});
