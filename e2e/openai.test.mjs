// Black-box test of the openai backend against an OpenAI-compatible server
// nobody here wrote: @dwmkerr/mock-llm (it echoes the last user message,
// streamed in small chunks). The real binary runs with -model openai; the
// browser drives a full reply and a cancel mid-stream.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { serveForFile, openPage, shot, send, runStatus, messageTexts, eventually, freePort } from "./harness.mjs";

const here = dirname(fileURLToPath(import.meta.url));

let mock, mockURL, server, browser;
serveForFile(
  async () => {
    const port = await freePort();
    mock = spawn(process.execPath, [join(here, "..", "node_modules", "@dwmkerr", "mock-llm", "dist", "main.js"), "--config", join(here, "fixtures", "mock-llm.yaml")], {
      env: { PATH: process.env.PATH, HOST: "127.0.0.1", PORT: String(port) },
      stdio: ["ignore", "ignore", "inherit"],
    });
    mockURL = `http://127.0.0.1:${port}`;
    await eventually(async () => {
      const r = await fetch(mockURL + "/health");
      assert.equal(r.status, 200);
    }, { timeout: 20000, interval: 100 });
    return {
      pace: "40ms",
      args: ["-model", "openai", "-openai-base-url", mockURL + "/v1", "-openai-model", "gpt-4"],
      env: { GATEWAY_OPENAI_API_KEY: "sk-test-not-a-secret" },
    };
  },
  (s, b) => ([server, browser] = [s, b]),
  {
    cleanup: async () => {
      if (mock && mock.exitCode === null) {
        const exited = new Promise((r) => mock.once("exit", r));
        mock.kill("SIGTERM");
        await exited;
      }
    },
  },
);

test("a reply streams from an OpenAI-compatible server and is published whole", async () => {
  const { page, errors } = await openPage(browser, { thread: server.url });
  const question = "Echo this back to me please, word for word.";
  await send(page, question);
  // The page is idle before the run starts too: wait for the reply itself.
  await page.locator("[data-testid=message][data-role=assistant]").waitFor({ timeout: 20000 });
  await runStatus(page, "idle", 20000);
  const history = await messageTexts(page);
  assert.deepEqual(history.map((m) => m.role), ["user", "assistant"]);
  assert.equal(history[1].text, question);
  await shot(page, "openai-reply");
  assert.deepEqual(errors, []);
});

test("cancel mid-stream stops the upstream reply and publishes nothing of it", async () => {
  const { page, errors } = await openPage(browser, { thread: server.url });
  const long = "This is a long message that the mock model will echo back slowly, six characters at a time, ".repeat(6);
  await send(page, long);
  await page.getByTestId("streaming-text").waitFor({ timeout: 20000 });
  await eventually(async () => assert.ok((await page.getByTestId("streaming-text").textContent()).length >= 24));
  await page.getByTestId("cancel").click();
  await page.getByTestId("receipt").waitFor({ timeout: 10000 });
  assert.match(await page.getByTestId("receipt-discarded").textContent(), /^[1-9]\d* characters/);
  const history = await messageTexts(page);
  assert.deepEqual(history.map((m) => m.role), ["user"]);
  await shot(page, "openai-cancelled");
  assert.deepEqual(errors, []);
});
