// Harness for the browser tests: builds and starts the real gateway binary
// on a fresh SQLite file and an ephemeral loopback port, and launches
// Debian's Chromium through playwright-core (never a downloaded browser).
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, mkdirSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..");
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

// startServer runs the binary until stop(); restart() runs it again on the
// same database and port.
export async function startServer({ pace = "40ms", db } = {}) {
  const dir = mkdtempSync(join(tmpdir(), "gateway-e2e-"));
  const dbPath = db ?? join(dir, "gw.db");
  const server = { dir, db: dbPath, url: "", proc: null, log: [] };
  server.start = async (addr = "127.0.0.1:0") => {
    const proc = spawn(binary(), ["-addr", addr, "-db", dbPath, "-demo-pace", pace], {
      stdio: ["ignore", "ignore", "pipe"],
      env: { PATH: process.env.PATH, HOME: process.env.HOME },
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
    return server.url;
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
  // check runs `gateway check` on the database: every invariant must hold.
  server.check = () => execFileSync(binary(), ["check", "-db", dbPath], { encoding: "utf8" });
  await server.start();
  return server;
}

export async function launch() {
  const executablePath = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].find((p) => existsSync(p));
  if (!executablePath) throw new Error("Chromium is missing: apt-get install -y chromium (.ci/run does this)");
  return chromium.launch({
    executablePath,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking", "--disable-component-update", "--no-first-run"],
  });
}

// newPage opens a page that fails the test on any console error.
export async function newPage(browser, errors) {
  const page = await browser.newPage({ viewport: { width: 1100, height: 800 } });
  page.on("console", (m) => {
    if (m.type() === "error") errors.push(m.text());
  });
  page.on("pageerror", (e) => errors.push(String(e)));
  return page;
}

export async function shot(page, name) {
  mkdirSync(artifacts, { recursive: true });
  await page.screenshot({ path: join(artifacts, name + ".png"), fullPage: true });
}

// newThread creates a conversation through the page and returns its URL.
export async function newThread(page, base) {
  await page.goto(base + "/");
  await page.getByTestId("new-thread").click();
  await page.waitForURL(/\/t\/thr_/);
  await page.getByTestId("conn-status").filter({ hasText: "Live" }).waitFor();
  return page.url();
}
