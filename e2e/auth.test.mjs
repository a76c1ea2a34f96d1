// Accounts in the browser (-auth password): a signed-out visitor lands on
// the sign-in form, a wrong password says so, the right one opens the app
// under the user's name, a conversation works as without accounts, and
// signing out ends the session. A browser without the cookie never sees a
// conversation, even with its address.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { serveForFile, binary, startServer, newPage, shot, newThread, send, runStatus, messageTexts } from "./harness.mjs";

const PASSWORD = "correct horse battery";
let dir, server, browser;

serveForFile(
  async () => {
    dir = mkdtempSync(join(tmpdir(), "gateway-e2e-auth-"));
    const db = join(dir, "gw.db");
    // The account is made as an administrator would: the binary, the
    // password on one line of stdin.
    const out = execFileSync(binary(), ["user", "add", "alice", "-db", db], {
      input: PASSWORD + "\n",
      encoding: "utf8",
      env: { PATH: process.env.PATH, HOME: process.env.HOME },
    });
    assert.match(out, /^created user alice /);
    return { pace: "20ms", db, args: ["-auth", "password", "-ws-ping-interval", "300ms"] };
  },
  (s, b) => ([server, browser] = [s, b]),
  { cleanup: () => dir && rmSync(dir, { recursive: true, force: true }) },
);

// A refused sign-in is answered 401 (429 when locked), and Chromium reports
// every 4xx document as a console error. That is the browser logging the
// status the page shows as its error message, not a page error; every other
// console error still fails the test.
const refusedStatus = /^Failed to load resource: the server responded with a status of 401 \(Unauthorized\)$/;

function pageErrors(errors) {
  return errors.filter((e) => !refusedStatus.test(e));
}

async function signIn(page, name, password) {
  await page.getByTestId("login-form").waitFor();
  await page.locator("#login-name").fill(name);
  await page.locator("#login-password").fill(password);
  await page.getByTestId("login-submit").click();
}

test("sign in, chat, sign out; a browser without the cookie sees only the sign-in form", async () => {
  const errors = [];
  const page = await newPage(browser, errors);

  // Signed out, the app sends the visitor to the sign-in form.
  await page.goto(server.url + "/");
  await page.waitForURL((u) => u.pathname === "/login" && u.searchParams.get("next") === "/");
  await page.getByTestId("login-form").waitFor();
  assert.equal(await page.title(), "Sign in · gateway");
  assert.equal(await page.getByTestId("login-error").count(), 0, "no error before an attempt");
  assert.equal(await page.getByTestId("account").count(), 0, "no account shown before signing in");
  await shot(page, "auth-login");

  // A wrong password: the form again, with the error and the typed name.
  await signIn(page, "alice", "not the password");
  await page.getByTestId("login-error").waitFor();
  assert.match(await page.getByTestId("login-error").textContent(), /wrong user name or password/);
  assert.equal(await page.locator("#login-name").inputValue(), "alice");
  assert.equal(await page.locator("#login-password").inputValue(), "", "the password is never echoed back");
  assert.equal((await page.context().cookies()).filter((c) => c.name === "gateway_session").length, 0, "no session after a wrong password");
  await shot(page, "auth-login-error");

  // The right password: the app, under alice's name.
  await page.locator("#login-password").fill(PASSWORD);
  await page.getByTestId("login-submit").click();
  await page.waitForURL(server.url + "/");
  await page.getByTestId("account-name").waitFor();
  assert.equal(await page.getByTestId("account-name").textContent(), "alice");
  assert.ok(await page.getByTestId("logout").isVisible());
  const [session] = (await page.context().cookies()).filter((c) => c.name === "gateway_session");
  assert.ok(session, "a session cookie was set");
  assert.equal(session.httpOnly, true);
  assert.equal(session.sameSite, "Lax");
  assert.equal(await page.evaluate(() => document.cookie.includes("gateway_session")), false, "scripts cannot read the session");

  // A conversation works as it does without accounts.
  const url = await newThread(page, server.url);
  const question = "Short: what is a sourdough starter?";
  await send(page, question);
  await page.locator("[data-testid=message][data-role=assistant][data-kind=text]").waitFor({ timeout: 20000 });
  await runStatus(page, "idle");
  const history = await messageTexts(page);
  assert.equal(history.length, 2, JSON.stringify(history));
  assert.deepEqual(history[0], { role: "user", kind: "text", text: question });
  assert.match(history[1].text, /sourdough/i);
  assert.equal(await page.getByTestId("account-name").textContent(), "alice");
  await shot(page, "auth-signed-in-reply");

  // Another browser, without the cookie, on the conversation's address:
  // the sign-in form, never the conversation.
  const stranger = await browser.newContext();
  const otherErrors = [];
  const other = await newPage(stranger, otherErrors);
  const path = new URL(url).pathname;
  const answer = await other.goto(url);
  assert.equal(answer.status(), 200, "the sign-in page after the redirect");
  await other.waitForURL((u) => u.pathname === "/login" && u.searchParams.get("next") === path);
  await other.getByTestId("login-form").waitFor();
  assert.equal(await other.getByTestId("messages").count(), 0);
  const html = await other.content();
  assert.ok(!html.includes(question) && !html.includes("sourdough"), "nothing of the conversation on the sign-in page");
  await shot(other, "auth-stranger");
  // Signing in there leads back to the conversation it asked for.
  await signIn(other, "alice", PASSWORD);
  await other.waitForURL(url);
  await other.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  assert.deepEqual(await messageTexts(other), history);

  // Sign out: back on the sign-in form, and the session is gone on the
  // server (the conversation's address asks to sign in again).
  await page.getByTestId("logout").click();
  await page.waitForURL((u) => u.pathname === "/login");
  await page.getByTestId("login-form").waitFor();
  assert.equal((await page.context().cookies()).filter((c) => c.name === "gateway_session").length, 0, "the cookie is cleared");
  await shot(page, "auth-signed-out");
  await page.goto(url);
  await page.waitForURL((u) => u.pathname === "/login" && u.searchParams.get("next") === path);
  assert.equal(await page.getByTestId("messages").count(), 0);
  // Signing out one browser leaves the other signed in.
  await other.reload();
  await other.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  assert.equal(await other.getByTestId("account-name").textContent(), "alice");

  // An administrator changes alice's password while her page is open: the
  // server ends her session and the open page goes to the sign-in form by
  // itself (its WebSocket is closed with 1008 within the ping interval),
  // coming back to the conversation afterwards.
  execFileSync(binary(), ["user", "passwd", "alice", "-db", server.db], {
    input: PASSWORD + " 2\n",
    encoding: "utf8",
    env: { PATH: process.env.PATH, HOME: process.env.HOME },
  });
  await other.waitForURL((u) => u.pathname === "/login" && u.searchParams.get("next") === path, { timeout: 10000 });
  await signIn(other, "alice", PASSWORD + " 2");
  await other.waitForURL(url);
  await other.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();

  assert.deepEqual(pageErrors(errors), [], "no console errors");
  assert.deepEqual(pageErrors(otherErrors), [], "no console errors in the other browser");
  await page.close();
  await stranger.close();
});

// With Secure cookies (here -secure-cookies; in production TLS or a proxy's
// X-Forwarded-Proto: https) the session cookie carries the __Host- prefix.
// Chromium treats http://127.0.0.1 as a secure context, so it stores and
// sends the Secure cookie here as it would over https.
test("a Secure session cookie is __Host-gateway_session; sign-in and sign-out work with it", async () => {
  const db = join(dir, "secure.db");
  execFileSync(binary(), ["user", "add", "alice", "-db", db], {
    input: PASSWORD + "\n",
    encoding: "utf8",
    env: { PATH: process.env.PATH, HOME: process.env.HOME },
  });
  const secure = await startServer({ pace: "20ms", db, args: ["-auth", "password", "-secure-cookies"] });
  try {
    const context = await browser.newContext();
    const errors = [];
    const page = await newPage(context, errors);
    await page.goto(secure.url + "/");
    await signIn(page, "alice", PASSWORD);
    await page.waitForURL(secure.url + "/");
    await page.getByTestId("account-name").waitFor();
    const cookies = await context.cookies();
    const session = cookies.find((c) => c.name === "__Host-gateway_session");
    assert.ok(session, "a __Host- session cookie: " + JSON.stringify(cookies.map((c) => c.name)));
    assert.equal(session.secure, true);
    assert.equal(session.httpOnly, true);
    assert.equal(session.path, "/");
    assert.equal(cookies.filter((c) => c.name === "gateway_session").length, 0, "no cookie under the plain name");
    await page.getByTestId("logout").click();
    await page.waitForURL((u) => u.pathname === "/login");
    assert.equal((await context.cookies()).filter((c) => c.name === "__Host-gateway_session").length, 0, "the cookie is cleared");
    assert.deepEqual(pageErrors(errors), [], "no console errors");
    await context.close();
  } finally {
    await secure.close();
  }
});
