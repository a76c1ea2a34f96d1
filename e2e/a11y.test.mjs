import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { AxeBuilder } from "@axe-core/playwright";
import { startServer, launch, newPage, newThread, send, runStatus, eventually } from "./harness.mjs";

// axe-core on every state of the page a user meets, light and dark, wide
// and narrow: no serious or critical violation. (axe finds what rules can
// find — names, roles, contrast, structure — not whether the page makes
// sense read aloud.)
let server, browser;
before(async () => {
  server = await startServer({ pace: "40ms", args: ["-outbox-latency", "1500ms"] });
  browser = await launch();
});
after(async () => {
  await browser?.close();
  assert.match(server.check(), /^ok/);
  await server?.close();
});

async function audit(page, state) {
  const found = [];
  for (const [w, h] of [[1280, 820], [390, 844]]) {
    for (const scheme of ["light", "dark"]) {
      await page.setViewportSize({ width: w, height: h });
      await page.emulateMedia({ colorScheme: scheme });
      const r = await new AxeBuilder({ page }).analyze();
      for (const v of r.violations) {
        if (v.impact === "serious" || v.impact === "critical") {
          found.push(`${state} @${w} ${scheme}: ${v.id} (${v.impact}) on ${v.nodes.map((n) => n.target.join(" ")).slice(0, 3).join(", ")}: ${v.help}`);
        }
      }
    }
  }
  await page.setViewportSize({ width: 1280, height: 820 });
  return found;
}

test("no serious or critical axe violation on any page state", async () => {
  const context = await browser.newContext();
  const errors = [];
  const page = await newPage(context, errors);
  const found = [];

  await page.goto(server.url + "/");
  found.push(...(await audit(page, "home")));
  await newThread(page, server.url);
  found.push(...(await audit(page, "empty conversation")));

  await send(page, "Show me markdown about goroutines");
  await runStatus(page, "idle", 20000);
  found.push(...(await audit(page, "Markdown reply")));

  await send(page, "Repeat after me: " + "a long reply that keeps streaming ".repeat(80));
  await page.getByTestId("streaming-text").filter({ hasText: /\S/ }).waitFor();
  found.push(...(await audit(page, "streaming")));
  await page.getByTestId("cancel").click();
  await page.getByTestId("receipt").waitFor({ timeout: 20000 });
  found.push(...(await audit(page, "receipt")));
  await page.getByTestId("action-save-fragment").click();
  const fragment = page.locator("[data-testid=message][data-kind=fragment]");
  await fragment.waitFor();
  await fragment.getByTestId("delete-draft").click();
  found.push(...(await audit(page, "fragment, delete asked")));
  await fragment.getByTestId("delete-draft-keep").click();

  await page.getByTestId("tree-toggle").click();
  await eventually(async () => assert.ok((await page.getByTestId("tree-node").count()) > 2));
  found.push(...(await audit(page, "checkpoints")));
  await page.getByTestId("tree-toggle").click();

  await send(page, "Please send an email to anna@example.com about the spring order");
  await page.getByTestId("confirm-card").waitFor({ timeout: 20000 });
  found.push(...(await audit(page, "confirmation card")));
  await page.getByTestId("confirm-op").click();
  await runStatus(page, "idle", 20000);
  found.push(...(await audit(page, "tool step done")));

  await page.setViewportSize({ width: 390, height: 844 });
  await page.getByTestId("drawer-toggle").click();
  await page.getByTestId("sidebar").waitFor({ state: "visible" });
  for (const scheme of ["light", "dark"]) {
    await page.emulateMedia({ colorScheme: scheme });
    const r = await new AxeBuilder({ page }).analyze();
    for (const v of r.violations.filter((v) => v.impact === "serious" || v.impact === "critical")) found.push(`drawer @390 ${scheme}: ${v.id}: ${v.help}`);
  }

  assert.deepEqual(found, []);
  assert.deepEqual(errors, []);
  await context.close();
});
