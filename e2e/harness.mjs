// Harness for the browser tests: builds and starts the real gateway binary
// on a fresh SQLite file and an ephemeral loopback port, and launches
// Debian's Chromium through playwright-core (never a downloaded browser).
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, mkdirSync, existsSync, readdirSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { createServer } from "node:net";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";
import { before, after } from "node:test";
import { chromium } from "playwright-core";
import { AxeBuilder } from "@axe-core/playwright";

export const repo = join(dirname(fileURLToPath(import.meta.url)), "..");
export const artifacts = join(repo, "e2e", "artifacts");

let built = null;

// binary builds the gateway once per test process.
export function binary() {
  if (built) return built;
  const dir = mkdtempSync(join(tmpdir(), "gateway-e2e-bin-"));
  built = join(dir, "gateway");
  execFileSync("go", ["build", "-o", built, "."], { cwd: repo, stdio: "inherit" });
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  return built;
}

let lockBuilt = null;

// holdWriteLock takes the write lock of the SQLite database at db from
// another process (internal/sqlitelock), as a backup tool or an sqlite3
// shell would: while it is held the gateway's writes wait, so what it
// streams is in its memory only. It resolves once the lock is held, to
// { release, written }: release lets it go; written maps each thread id to
// the last seq written of it, which cannot move while the lock is held (a
// delta with a larger seq is in the gateway's memory only).
export async function holdWriteLock(db) {
  if (!lockBuilt) {
    const dir = mkdtempSync(join(tmpdir(), "gateway-e2e-lock-"));
    lockBuilt = join(dir, "sqlitelock");
    execFileSync("go", ["build", "-o", lockBuilt, "./internal/sqlitelock"], { cwd: repo, stdio: "inherit" });
    process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  }
  const proc = spawn(lockBuilt, [db], { stdio: ["pipe", "pipe", "inherit"] });
  const exited = new Promise((resolve) => proc.once("exit", resolve));
  const written = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("sqlitelock did not take the lock in 40 s")), 40000);
    let out = "";
    proc.stdout.on("data", (chunk) => {
      out += chunk;
      if (!/^end$/m.test(out)) return;
      clearTimeout(timer);
      const seqs = new Map();
      for (const m of out.matchAll(/^thread (\S+) (\d+)$/gm)) seqs.set(m[1], Number(m[2]));
      resolve(seqs);
    });
    proc.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`sqlitelock exited with ${code} before taking the lock`));
    });
  });
  const release = async () => {
    proc.stdin.end();
    await exited;
  };
  return { release, written };
}

// startServer runs the binary until stop(); start(server.addr) or restart()
// runs it again on the same database and port, so open pages reconnect to
// the new process.
export async function startServer({ pace = "40ms", db, args = [], env = {} } = {}) {
  const dir = mkdtempSync(join(tmpdir(), "gateway-e2e-"));
  const dbPath = db ?? join(dir, "gw.db");
  const server = { dir, db: dbPath, url: "", addr: "", proc: null, log: [] };
  server.start = async (addr = server.addr || "127.0.0.1:0") => {
    const proc = spawn(binary(), ["-addr", addr, "-db", dbPath, "-demo-pace", pace, ...args], {
      stdio: ["ignore", "ignore", "pipe"],
      env: { PATH: process.env.PATH, HOME: process.env.HOME, ...env },
    });
    server.proc = proc;
    server.url = await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("gateway did not start in 30 s:\n" + server.log.join("\n"))), 30000);
      let buf = "";
      proc.stderr.on("data", (chunk) => {
        buf += chunk;
        let i;
        while ((i = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          server.log.push(line);
          const m = line.match(/msg="gateway serving" addr=(http:\/\/\S+)/);
          if (m) {
            clearTimeout(timer);
            resolve(m[1]);
          }
        }
      });
      proc.on("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`gateway exited with ${code}:\n` + server.log.join("\n")));
      });
    });
    // Remember host:port so that a restart listens where the pages reconnect.
    server.addr = new URL(server.url).host;
    return server.url;
  };
  // restart stops the process with signal (SIGTERM: graceful shutdown that
  // hands runs back; SIGKILL: a crash) and starts it again on the same
  // address and database.
  server.restart = async (signal = "SIGTERM") => {
    await server.stop(signal);
    return server.start(server.addr);
  };
  server.stop = async (signal = "SIGTERM") => {
    const proc = server.proc;
    if (!proc || proc.exitCode !== null) return;
    const exited = new Promise((resolve) => proc.once("exit", resolve));
    proc.kill(signal);
    await exited;
  };
  server.close = async () => {
    await server.stop();
    rmSync(dir, { recursive: true, force: true });
  };
  // api calls the HTTP API as a program would (no Origin, no cookie: auth
  // mode none) and answers the decoded JSON body.
  server.api = async (path, init = {}) => {
    const r = await fetch(server.url + path, init);
    const body = await r.json();
    if (!r.ok) throw new Error(`${init.method ?? "GET"} ${path}: ${r.status} ${JSON.stringify(body)}`);
    return body;
  };
  // check runs `gateway check` on the database: every invariant must hold.
  server.check = () => execFileSync(binary(), ["check", "-db", dbPath], { encoding: "utf8" });
  await server.start();
  return server;
}

// serveForFile starts, before a test file's tests, a gateway (startServer's
// options, or what options() resolves to when it is a function: it may
// prepare a database first) and a browser, and hands both to ready. After
// the file's tests it closes the browser, asserts that every invariant of
// the protocol holds (gateway check), stops the server, then runs cleanup,
// whatever failed before.
export function serveForFile(options, ready, { cleanup } = {}) {
  let server, browser;
  before(async () => {
    server = await startServer(typeof options === "function" ? await options() : options);
    browser = await launch();
    ready(server, browser);
  });
  after(async () => {
    try {
      await browser?.close();
      assert.match(server?.check() ?? "ok", /^ok/);
    } finally {
      await server?.close();
      await cleanup?.();
    }
  });
}

// launch starts Debian's Chromium, headless. Every new context is a new
// browser window, and Chromium loads for each window the page of its
// address bar's drop-down (chrome://omnibox-popup, a WebUI page in a
// renderer process of its own), in a browser with no address bar to show
// it in. On this 2-core machine that load took the CPU from the page
// being tested: a cold open of a 2,000-message conversation was
// interactive at medians of 779 and 812 ms with it, 442–646 ms without
// (runs of 8 opens, 2026-12-06, BENCHMARKS.md). Its two features are
// turned off, so that what the tests time is the page, as in a browser
// whose window is already open.
//
// Chromium honours only the last --disable-features on its command line,
// and playwright-core passes its own list before ours: ours repeats that
// list (playwright-core 1.65.1's) with the two added, and launch checks on
// the running browser's command line that it still does.
const disabledFeatures = [
  // playwright-core's own (chromiumSwitches.ts)
  "AvoidUnnecessaryBeforeUnloadCheckSync",
  "DestroyProfileOnBrowserClose",
  "HttpsUpgrades",
  "HttpsFirstBalancedModeAutoEnable",
  "LensOverlay",
  "MediaRouter",
  "PaintHolding",
  "ThirdPartyStoragePartitioning",
  "AvoidCorsURLLoaderRestartOnRedirect",
  "TcpPortRandomizationWin",
  "OptimizationHints",
  "NetworkTimeServiceQuerying",
  "AimEnabled",
  "PreconnectToSearch",
  "msForceBrowserSignIn",
  "msEdgeUpdateLaunchServicesPreferredVersion",
  // the address bar's drop-down
  "WebUIOmniboxPopup",
  "WebUIOmniboxAimPopup",
];

export async function launch() {
  const executablePath = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].find((p) => existsSync(p));
  if (!executablePath) throw new Error("Chromium is missing: apt-get install -y chromium (.ci/run does this)");
  const browser = await chromium.launch({
    executablePath,
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-dev-shm-usage",
      "--disable-background-networking",
      "--disable-component-update",
      "--no-first-run",
      `--disable-features=${disabledFeatures.join(",")}`,
    ],
  });
  try {
    checkDisabledFeatures();
  } catch (err) {
    await browser.close();
    throw err;
  }
  return browser;
}

// checkDisabledFeatures reads the command line of each browser process
// this process started (Linux's /proc) and fails unless its last
// --disable-features holds every feature of the ones before it (and so
// playwright-core's list, which an upgrade may change, is still applied).
function checkDisabledFeatures() {
  let checked = 0;
  for (const pid of readdirSync("/proc").filter((d) => /^\d+$/.test(d))) {
    let stat, args;
    try {
      stat = readFileSync(`/proc/${pid}/stat`, "utf8");
      args = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
    } catch {
      continue; // (ended meanwhile)
    }
    const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
    if (ppid !== process.pid || !args.includes("--remote-debugging-pipe")) continue;
    const lists = args.filter((a) => a.startsWith("--disable-features=")).map((a) => a.slice("--disable-features=".length).split(","));
    const last = new Set(lists[lists.length - 1] ?? []);
    const dropped = lists.flat().filter((f) => f && !last.has(f));
    assert.deepEqual(dropped, [], `Chromium applies only the last --disable-features: add these (playwright-core's own) to disabledFeatures in e2e/harness.mjs`);
    checked++;
  }
  assert.ok(checked > 0, "launch: no Chromium started by this process was found in /proc");
}

// newPage opens a page that collects every console error and uncaught page
// error into errors (each test asserts it stays empty). target is a Browser
// (a fresh context per page: tests share nothing) or a BrowserContext (pages
// that share cookies and storage, like two tabs of one browser).
export async function newPage(target, errors, { viewport = { width: 1100, height: 800 } } = {}) {
  let page;
  if (typeof target.newContext === "function") {
    page = await target.newPage({ viewport });
  } else {
    page = await target.newPage();
    await page.setViewportSize(viewport);
  }
  page.setDefaultTimeout(10000);
  page.on("console", (m) => {
    if (m.type() === "error") errors.push(m.text());
  });
  page.on("pageerror", (e) => errors.push(String(e)));
  return page;
}

// eventually retries fn (an async assertion) until it passes or timeout ms
// pass, then throws its last error: a wait on page state, never a fixed sleep.
export async function eventually(fn, { timeout = 10000, interval = 50 } = {}) {
  const deadline = Date.now() + timeout;
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      if (Date.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, interval));
    }
  }
}

// runStatus waits until the thread root reports one of the statuses
// (data-run-status: idle, queued, running, cancel_requested, cancelling,
// cancelled, failed).
export async function runStatus(page, statuses, timeout = 15000) {
  const list = Array.isArray(statuses) ? statuses : [statuses];
  await page.locator(list.map((s) => `#thread[data-run-status="${s}"]`).join(", ")).waitFor({ state: "attached", timeout });
}

// messageTexts is the rendered history: [{role, kind, text}] oldest first.
export async function messageTexts(page) {
  return page.locator("[data-testid=messages] > [data-testid=message]").evaluateAll((els) =>
    els.map((e) => ({ role: e.dataset.role, kind: e.dataset.kind, text: e.querySelector("[data-testid=message-body]")?.textContent ?? "" })),
  );
}

// send types text into the composer and presses Enter.
export async function send(page, text) {
  await page.getByTestId("send").and(page.locator(":enabled")).waitFor();
  await page.getByTestId("composer-input").fill(text);
  await page.getByTestId("composer-input").press("Enter");
}

// interceptSocket puts the test between the page and the gateway on /ws
// (Playwright's routeWebSocket): client frames go to the server unchanged;
// server frames are split into their JSON objects and each is, by mode,
//   "pass":  forwarded;
//   "stale": forwarded if it is an ack or error, dropped if it is an event
//            (the tab stops seeing the thread change: it goes stale);
//   "hold":  queued until release() forwards the queue in order.
// holdFrom(pred) switches to "hold" at the first object matching pred (that
// object included). frames records every object both ways with its
// connection's number ({conn, from: "client" | "server", obj}). block()
// takes the WebSocket away while HTTP still answers: the open connection is
// closed and every new one is closed before it reaches the server, until
// unblock(). Call before the page opens its socket.
export async function interceptSocket(page) {
  const ctl = {
    mode: "pass",
    queue: [],
    dropped: [],
    fromClient: [],
    frames: [],
    blocked: false,
    server: null,
    holdPred: null,
    held: null, // resolves when hold mode starts through holdFrom
    connections: 0,
    client: null,
    holdFrom(pred) {
      ctl.holdPred = pred;
      return new Promise((resolve) => (ctl.held = resolve));
    },
    release() {
      ctl.mode = "pass";
      ctl.holdPred = null;
      const q = ctl.queue.splice(0);
      for (const line of q) ctl.client?.send(line);
    },
    async block() {
      ctl.blocked = true;
      const [client, server] = [ctl.client, ctl.server];
      ctl.client = ctl.server = null;
      await Promise.all([client?.close({ code: 4000, reason: "blocked by the test" }), server?.close()]);
    },
    unblock() {
      ctl.blocked = false;
    },
  };
  await page.routeWebSocket(/\/ws$/, (ws) => {
    const conn = ++ctl.connections;
    if (ctl.blocked) {
      void ws.close({ code: 4000, reason: "blocked by the test" });
      return;
    }
    ctl.client = ws;
    const server = ws.connectToServer();
    ctl.server = server;
    ws.onMessage((m) => {
      try {
        const obj = JSON.parse(String(m));
        ctl.fromClient.push(obj);
        ctl.frames.push({ conn, from: "client", obj });
      } catch {
        // not JSON: forward as is
      }
      server.send(m);
    });
    server.onMessage((frame) => {
      for (const line of String(frame).split("\n")) {
        if (!line) continue;
        const obj = JSON.parse(line);
        ctl.frames.push({ conn, from: "server", obj });
        if (ctl.mode === "pass" && ctl.holdPred && ctl.holdPred(obj)) {
          ctl.mode = "hold";
          ctl.held?.(obj);
        }
        if (ctl.mode === "hold") ctl.queue.push(line);
        else if (ctl.mode === "stale" && obj.type !== "ack" && obj.type !== "error") ctl.dropped.push(obj);
        else ws.send(line);
      }
    });
  });
  return ctl;
}

// shot saves a screenshot into e2e/artifacts (gitignored). fullPage: false
// keeps what the viewport shows, with sticky parts where the user sees them.
export async function shot(page, name, { fullPage = true } = {}) {
  mkdirSync(artifacts, { recursive: true });
  // Made narrow, a conversation's page slides its list away (0.18 s): the
  // picture waits for that, unless the drawer was opened on purpose. (A
  // picture only: it is taken anyway after 2 s.)
  await page
    .waitForFunction(() => {
      const app = document.querySelector(".app.in-thread");
      const list = document.getElementById("sidebar");
      if (!app || !list || window.innerWidth > 720 || app.classList.contains("drawer-open")) return true;
      return getComputedStyle(list).visibility === "hidden";
    }, null, { timeout: 2000 })
    .catch(() => {});
  await page.screenshot({ path: join(artifacts, name + ".png"), fullPage });
}

// openPage opens a page as newPage does, its errors collected in errors (a
// new list unless given); with intercept, the test sits on its WebSocket
// (interceptSocket, answered as socket) from before the page opens it; with
// thread (a server's base URL), the page is on a new conversation there
// (newThread, its URL answered as url).
// shots takes the picture at 1280 and 390 px, light and dark (the page
// must fit each width), then puts the page back at 1100 px, light.
// prepare, when given, runs at each size before the picture (a resize
// leaves the page scrolled elsewhere: it brings back into view what the
// picture is of).
export async function shots(page, name, { prepare } = {}) {
  for (const [w, h] of [[1280, 820], [390, 844]]) {
    for (const scheme of ["light", "dark"]) {
      await page.setViewportSize({ width: w, height: h });
      await page.emulateMedia({ colorScheme: scheme });
      await prepare?.();
      if (!(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth))) throw new Error(`${name} is wider than ${w} px`);
      await shot(page, `${name}-${w}-${scheme}`, { fullPage: false });
    }
  }
  await page.setViewportSize({ width: 1100, height: 800 });
  await page.emulateMedia({ colorScheme: "light" });
}

export async function openPage(target, { errors = [], intercept = false, thread } = {}) {
  const page = await newPage(target, errors);
  const socket = intercept ? await interceptSocket(page) : undefined;
  const url = thread ? await newThread(page, thread) : undefined;
  return { page, errors, socket, url };
}

// openTwoTabs opens two tabs of one new browser context, their errors in
// one list: tab a on a new conversation of base (its URL answered as url),
// tab b not yet navigated, its WebSocket in the test's hands (socketB).
export async function openTwoTabs(browser, base) {
  const context = await browser.newContext();
  const errors = [];
  const a = await newPage(context, errors);
  const b = await newPage(context, errors);
  const socketB = await interceptSocket(b);
  const url = await newThread(a, base);
  return { context, errors, a, b, socketB, url };
}

// newThread creates a conversation through the page and returns its URL.
export async function newThread(page, base) {
  await page.goto(base + "/");
  await page.getByTestId("new-thread").click();
  await page.waitForURL(/\/t\/thr_/);
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  // Send is enabled once the page follows the thread (subscribe acknowledged).
  await page.getByTestId("send").and(page.locator(":enabled")).waitFor();
  return page.url();
}

// queueWhileStreaming sends text (long enough to still be streaming), then
// types "my next question" and presses Enter while the reply streams: the
// page queues it under the reply (the box empties, no note) while the
// reply goes on. It answers the queued message as the page shows it.
export async function queueWhileStreaming(page, text) {
  await send(page, text);
  await runStatus(page, "running");
  await page.getByTestId("composer-input").fill("my next question");
  await page.getByTestId("composer-input").press("Enter");
  const queued = page.getByTestId("queue-list").getByTestId("queued-item").filter({ hasText: "my next question" });
  await queued.waitFor();
  assert.equal(await queued.getByTestId("queued-text").textContent(), "my next question");
  assert.equal(await page.getByTestId("composer-input").inputValue(), "", "the queue has the text now");
  assert.ok(await page.getByTestId("notice").isHidden(), `queued, not refused: ${await page.getByTestId("notice").textContent()}`);
  await runStatus(page, "running");
  return queued;
}

// longReply opens a new conversation and starts a reply long enough (80+
// words) to outlast a restart or an outage; it answers the thread's URL and
// the ids of the thread and of the run.
export async function longReply(page, server) {
  const url = await newThread(page, server.url);
  const threadID = new URL(url).pathname.split("/").pop();
  await send(page, "How do I prepare a vegetable garden for winter?");
  await page.getByTestId("streaming-text").filter({ hasText: /\S/ }).waitFor();
  await runStatus(page, "running");
  const snap = await server.api(`/api/threads/${threadID}`);
  return { url, threadID, runID: snap.active_run.run_id };
}

// expectCancelKept checks the page shows a cancel pressed while nothing
// reaches the server as kept: a calm pending line, no error, no claim that
// anything was cancelled.
export async function expectCancelKept(page) {
  await page.getByTestId("cancel-pending").filter({ hasText: "Cancel will be sent when the connection is back" }).waitFor();
  assert.ok(await page.getByTestId("notice").isHidden(), `a pending state, not an error: ${await page.getByTestId("notice").textContent()}`);
  // The line shows from the press on; the button says "Cancelling…" while
  // an attempt is on its way and "Cancel pending" once it failed to reach
  // the server (the page retries by itself later).
  const cancel = page.getByTestId("cancel");
  await cancel.filter({ hasText: "Cancel pending" }).waitFor({ timeout: 10000 });
  assert.ok(await cancel.isDisabled(), "pressing again changes nothing");
  await runStatus(page, "running");
  assert.equal(await page.getByTestId("receipt").count(), 0, "no receipt before the server's");
  assert.ok(
    (await page.evaluate(() => Object.keys(sessionStorage))).some((k) => k.startsWith("gateway.cancel.")),
    "the intent is kept with the tab",
  );
}

// expectCancelSettled checks what is left once the server answered a kept
// cancel: no pending line, no stale notice (none next to "Live"), nothing
// of the cancelled reply published, and the intent dropped.
export async function expectCancelSettled(page, { live = true } = {}) {
  if (live) assert.equal(await page.getByTestId("conn-status").textContent(), "Live");
  assert.ok(await page.getByTestId("cancel-pending").isHidden(), "the pending notice is gone");
  assert.ok(await page.getByTestId("notice").isHidden(), `no notice left: ${await page.getByTestId("notice").textContent()}`);
  assert.ok(await page.getByTestId("cancel").isHidden());
  assert.equal(await page.locator("[data-testid=messages] > [data-testid=message][data-role=assistant]").count(), 0, "nothing of the reply was published");
  assert.deepEqual(
    (await page.evaluate(() => Object.keys(sessionStorage))).filter((k) => k.startsWith("gateway.cancel.")),
    [],
    "the intent is dropped once the server answered",
  );
}

// apiExchange sends text to the thread over the HTTP API, as a program or
// another tab would, and waits until its reply ended (completed); it
// answers the run. A quick way to build a long history before a page
// opens it.
export async function apiExchange(server, threadID, text) {
  const snap = await server.api(`/api/threads/${threadID}`);
  const run = await server.api(`/api/threads/${threadID}/runs`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ expected_state_version: snap.state_version, user_message: text }),
  });
  return eventually(
    async () => {
      const r = await server.api(`/api/runs/${run.run_id}`);
      assert.equal(r.status, "completed", `run ${run.run_id}`);
      return r;
    },
    { timeout: 30000, interval: 25 },
  );
}

// audit runs axe on page at 1280 and 390 px, light and dark, and answers
// every violation, whatever its impact; then it puts the page back at
// 1100 px, light.
export async function audit(page, state) {
  const found = [];
  for (const [w, h] of [[1280, 820], [390, 844]]) {
    for (const scheme of ["light", "dark"]) {
      await page.setViewportSize({ width: w, height: h });
      await page.emulateMedia({ colorScheme: scheme });
      const r = await new AxeBuilder({ page }).analyze();
      for (const v of r.violations) found.push(`${state} @${w} ${scheme}: ${v.id} (${v.impact}) on ${v.nodes.map((n) => n.target.join(" ")).slice(0, 3).join(", ")}: ${v.help}`);
    }
  }
  await page.setViewportSize({ width: 1100, height: 800 });
  await page.emulateMedia({ colorScheme: "light" });
  return found;
}

// freePort is a TCP port free on 127.0.0.1 a moment ago, for a process
// that must be told its address before it starts.
export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}
