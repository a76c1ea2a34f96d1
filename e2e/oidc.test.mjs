// Signing in through an OpenID Connect provider in a real browser
// (-auth password with -oidc-issuer: both ways on one page). The provider
// is a real one in a process of its own (internal/oidcprovider: mockoidc
// on 127.0.0.1), whose authorization endpoint signs in at once as the
// user the test queued: the page shows "Sign in with Example SSO"; a click
// goes to the provider and back, and the user lands in the app signed in,
// under an account the sign-in created; signing out ends it. A refusal
// (an e-mail the provider has not verified, under -oidc-allowed-domains)
// is shown on the sign-in page with what to do. Pictures at 1280 and 390
// px, light and dark; axe finds nothing on either page.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { serveForFile, binary, newPage, shots, audit, newThread, repo, freePort } from "./harness.mjs";

const CLIENT_ID = "gateway-e2e";
const SECRET = "e2e-client-secret-not-a-real-one";
const PROVIDER = "Example SSO";
const PASSWORD = "correct horse battery";

// startProvider builds and runs internal/oidcprovider; it resolves once the
// provider prints its issuer.
async function startProvider(dir) {
  const bin = join(dir, "oidcprovider");
  execFileSync("go", ["build", "-o", bin, "./internal/oidcprovider"], { cwd: repo, stdio: "inherit" });
  const proc = spawn(bin, ["-client-id", CLIENT_ID], {
    stdio: ["pipe", "pipe", "inherit"],
    env: { PATH: process.env.PATH, HOME: process.env.HOME, OIDC_CLIENT_SECRET: SECRET },
  });
  const exited = new Promise((resolve) => proc.once("exit", resolve));
  const issuer = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("the provider did not start in 30 s")), 30000);
    let out = "";
    proc.stdout.on("data", (chunk) => {
      out += chunk;
      const m = out.match(/^issuer (\S+)$/m);
      if (!m) return;
      clearTimeout(timer);
      resolve(m[1]);
    });
    proc.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`the provider exited with ${code}`));
    });
  });
  return {
    issuer,
    // next makes the provider's next authorization sign in as user.
    async next(user) {
      const r = await fetch(new URL("/control/next-user", issuer), { method: "POST", body: JSON.stringify(user) });
      assert.equal(r.status, 204, "the provider took the next user");
    },
    async stop() {
      proc.stdin.end();
      await exited;
    },
  };
}

let dir, provider, server, browser;
serveForFile(
  async () => {
    dir = mkdtempSync(join(tmpdir(), "gateway-e2e-oidc-"));
    provider = await startProvider(dir);
    const db = join(dir, "gw.db");
    execFileSync(binary(), ["user", "add", "alice", "-db", db], { input: PASSWORD + "\n", env: { PATH: process.env.PATH, HOME: process.env.HOME } });
    const addr = `127.0.0.1:${await freePort()}`;
    return {
      pace: "20ms",
      db,
      args: [
        "-addr", addr, "-auth", "password",
        "-oidc-issuer", provider.issuer, "-oidc-client-id", CLIENT_ID,
        "-oidc-redirect-url", `http://${addr}/auth/oidc/callback`,
        "-oidc-provider-name", PROVIDER, "-oidc-allowed-domains", "example.com",
      ],
      env: { GATEWAY_OIDC_CLIENT_SECRET: SECRET },
    };
  },
  (s, b) => ([server, browser] = [s, b]),
  {
    cleanup: async () => {
      await provider?.stop();
      if (dir) rmSync(dir, { recursive: true, force: true });
    },
  },
);

// A refused sign-in is answered 4xx, which Chromium reports as a console
// error: the status the page shows as its message, not a page error.
const refusedStatus = /^Failed to load resource: the server responded with a status of 40[13] \(\w+\)$/;

test("the sign-in page offers the provider beside the password; signing in there lands in the app", async () => {
  const errors = [];
  const page = await newPage(await browser.newContext(), errors); // (axe needs a context of the test's own)
  const visited = [];
  page.on("request", (r) => visited.push(new URL(r.url()).origin + new URL(r.url()).pathname));

  await page.goto(server.url + "/");
  await page.waitForURL((u) => u.pathname === "/login");
  const button = page.getByTestId("login-oidc");
  assert.equal(await button.textContent(), `Sign in with ${PROVIDER}`);
  assert.ok(await page.getByTestId("login-form").isVisible(), "the password form is there too");
  assert.ok(await page.getByTestId("login-or").isVisible());
  await shots(page, "oidc-login");
  assert.deepEqual(await audit(page, "sign-in with a provider"), []);

  await provider.next({ sub: "sub-ana", email: "ana@example.com", email_verified: true, preferred_username: "Ana" });
  await button.click();
  await page.waitForURL(server.url + "/");
  await page.getByTestId("account-name").waitFor();
  assert.equal(await page.getByTestId("account-name").textContent(), "ana", "the account the first sign-in created");
  const authorize = new URL("/oidc/authorize", provider.issuer).href;
  assert.ok(visited.includes(authorize), `the browser went to the provider (${authorize}): ${visited.join(" ")}`);
  assert.ok(visited.includes(server.url + "/auth/oidc/callback"), "and came back to the callback");
  const cookies = await page.context().cookies();
  const session = cookies.find((c) => c.name === "gateway_session");
  assert.ok(session?.httpOnly && session.sameSite === "Lax", "an HttpOnly, SameSite=Lax session cookie");
  assert.equal(cookies.filter((c) => c.name === "gateway_oidc").length, 0, "the sign-in's own cookie is gone");

  // The app works as after a password sign-in.
  await newThread(page, server.url);
  assert.equal(await page.getByTestId("account-name").textContent(), "ana");

  // Sign out: back on the sign-in page, the session ended.
  await page.getByTestId("logout").click();
  await page.waitForURL((u) => u.pathname === "/login");
  assert.equal((await page.context().cookies()).filter((c) => c.name === "gateway_session").length, 0);
  await page.goto(server.url + "/");
  await page.waitForURL((u) => u.pathname === "/login");
  assert.deepEqual(errors, []);
});

test("a refused sign-in says why on the sign-in page, and nobody is signed in", async () => {
  const errors = [];
  const page = await newPage(await browser.newContext(), errors); // (axe needs a context of the test's own)
  await page.goto(server.url + "/login");
  await provider.next({ sub: "sub-bo", email: "bo@example.com", email_verified: false, preferred_username: "bo" });
  await page.getByTestId("login-oidc").click();
  await page.waitForURL((u) => u.pathname === "/auth/oidc/callback");
  const error = page.getByTestId("login-error");
  await error.waitFor();
  assert.equal(await error.textContent(), `Your e-mail address is not verified at ${PROVIDER}: verify it there and sign in again`);
  assert.ok(await page.getByTestId("login-oidc").isVisible(), "a button to start again");
  // The focus is on that button, not in the password form beside it.
  assert.equal(await page.evaluate(() => document.activeElement?.dataset.testid ?? document.activeElement?.id), "login-oidc");
  assert.equal((await page.context().cookies()).filter((c) => c.name === "gateway_session").length, 0, "no session");
  await shots(page, "oidc-refused");
  assert.deepEqual(await audit(page, "refused sign-in"), []);
  assert.deepEqual(errors.filter((e) => !refusedStatus.test(e)), []);
});
