// Tool calls as the page shows them: their progress, the operation log's
// entries, a tool step in the conversation, and the words for what a call
// is doing or what a cancel still waits for.

import { logLine, toolName, type Line, type OpNow } from "./outcome";
import type { Operation } from "./protocol";
import { el, snippet } from "./dom";
import { timeElement, when } from "./when";

// toolProgress is a working call's progress: a bar that fills when the
// tool said how far it got out of how much (tool.updated's progress), and
// is indeterminate otherwise; the tool's own words; how long it has run,
// from the server's time of the phase change, so a reload keeps counting.
export function toolProgress(op: Operation, label: string): HTMLElement {
  const secs = Math.max(0, Math.floor((Date.now() - Date.parse(op.updated_at)) / 1000));
  const elapsed = secs < 1 ? "just started" : `${secs} s so far`;
  const p = op.progress;
  const bar = el("progress", { "aria-label": label });
  const words: string[] = [];
  if (p && p.total && p.total > 0) {
    bar.max = p.total;
    bar.value = Math.min(p.progress, p.total);
    words.push(`${fmtCount(p.progress)} of ${fmtCount(p.total)}`);
  } else if (p) {
    words.push(`${fmtCount(p.progress)} done`);
  }
  if (p?.message) words.push(p.message);
  words.push(elapsed);
  return el(
    "div",
    { class: "tool-progress", "data-testid": "tool-progress" },
    bar,
    el("span", { class: "hint", "data-testid": "tool-elapsed" }, words.join(" · ")),
  );
}

// fmtCount writes a progress count: whole numbers as they are, others
// with at most one decimal.
export function fmtCount(n: number): string {
  return Number.isInteger(n) ? String(n) : n.toFixed(1);
}

// lineParts is a Line as the page shows it: "<status>. <rest>", the status
// marked so that its state can colour it.
export function lineParts(line: Line): (Node | string)[] {
  const status = el("span", { class: "op-state", "data-testid": "operation-status" }, line.status);
  return line.rest.length > 0 ? [status, ". ", ...line.rest] : [status, "."];
}

// opView is an operation as the outcome sentences read it; outcome stands
// in for one the operation does not carry yet.
export function opView(op: Operation, outcome = ""): OpNow {
  return {
    operation_id: op.operation_id,
    tool: op.tool,
    phase: op.phase,
    outcome: op.outcome ?? outcome,
    contract: op.contract,
    preview: op.preview,
    idempotency_key: op.idempotency_key,
    reconcile_next_at: op.reconcile_next_at,
    reconcile_until: op.reconcile_until,
  };
}

// operationItem is one tool call of the operation log, in words: what it
// is and what became of it. The protocol's words (contract, phase,
// outcome), the idempotency key and the operation's id stay under Details,
// for audit.
export function operationItem(op: Operation): HTMLLIElement {
  const line = logLine(op);
  const code = (t: string, testid: string) => el("code", { class: "op-key", "data-testid": testid }, t);
  const facts: [string, Node | string][] = [
    ["Tool", op.tool],
    ["Contract", contractWords(op.contract)],
    ["Phase", op.phase],
    ["Outcome", op.outcome ?? "none yet"],
  ];
  if (op.idempotency_key) facts.push(["Idempotency key", code(op.idempotency_key, "operation-key")]);
  facts.push(["Operation", code(op.operation_id, "operation-id")]);
  return el(
    "li",
    { "data-testid": "operation", "data-operation-id": op.operation_id, "data-phase": op.phase, "data-state": line.state },
    el("strong", { class: "op-what", "data-testid": "operation-what" }, line.what),
    el("div", { class: "op-status", "data-testid": "operation-words" }, line.status),
    op.phase === "unknown" ? el("div", { class: "hint", "data-testid": "operation-reconcile" }, reconcileNote(op)) : "",
    el(
      "div",
      { class: "hint", "data-testid": "operation-when" },
      "Started ",
      timeElement(op.created_at),
      // (A change in the same minute reads the same: not said twice.)
      ...(when(op.updated_at) === when(op.created_at) ? [] : [" · last change ", timeElement(op.updated_at)]),
    ),
    el(
      "details",
      { class: "op-details", "data-testid": "operation-details" },
      el("summary", {}, "Details"),
      el("dl", {}, ...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])),
    ),
  );
}

// contractWords says what a tool's contract promises.
export function contractWords(contract: string): string {
  switch (contract) {
    case "consequential":
      return "consequential: carried out only after you confirm, and at most once";
    case "idempotent":
      return "idempotent: safe to repeat; a cancel keeps its result";
    case "cancellable":
      return "cancellable: stopped by a cancel, run again if you continue";
  }
  return contract;
}

// reconcileNote says, in the operation log, how an unknown outcome is
// being settled.
export function reconcileNote(op: Operation): string {
  const at = (t: string): string => when(t);
  if (op.reconcile_next_at) {
    return `Not confirmed by the provider yet: the gateway keeps looking the key up${op.reconcile_until ? `, until ${at(op.reconcile_until)}` : ""}.`;
  }
  if (op.reconcile_until) return `The gateway is not looking the key up (since ${at(op.updated_at)}): only the provider's records for it can tell.`;
  return "Not confirmed by the provider yet: the key is being looked up.";
}

// toolResult is a tool step as the conversation shows it: what was asked
// of the tool, in words (an email stays readable after any decision: to,
// subject, body), and its raw result behind Details, for audit.
export function toolResult(content: string): { node: HTMLElement; operationID: string } {
  let tool = "tool";
  let pretty = content;
  let operationID = "";
  let args: Record<string, unknown> = {};
  try {
    const rec = JSON.parse(content) as { tool?: string; operation_id?: string; arguments?: unknown; result?: unknown };
    tool = rec.tool ?? tool;
    operationID = typeof rec.operation_id === "string" ? rec.operation_id : "";
    if (rec.arguments && typeof rec.arguments === "object" && !Array.isArray(rec.arguments)) args = rec.arguments as Record<string, unknown>;
    pretty = JSON.stringify(rec.result ?? rec, null, 2);
  } catch {
    // not JSON: show it as it is
  }
  const text = (v: unknown) => (typeof v === "string" ? v : JSON.stringify(v));
  const parts: Node[] = [];
  if (tool === "send_email") {
    parts.push(el("strong", { class: "tool-title" }, "Email"));
    const rows: Node[] = [];
    for (const k of ["to", "subject"]) if (k in args) rows.push(el("dt", {}, k === "to" ? "To" : "Subject"), el("dd", { "data-testid": `tool-arg-${k}` }, text(args[k])));
    parts.push(el("dl", { class: "tool-args" }, ...rows));
    if ("body" in args) parts.push(el("div", { class: "email-body", "data-testid": "tool-arg-body" }, text(args.body)));
  } else {
    parts.push(el("strong", { class: "tool-title" }, toolName(tool)));
    const rows: Node[] = [];
    for (const [k, v] of Object.entries(args)) rows.push(el("dt", {}, k.charAt(0).toUpperCase() + k.slice(1).replace(/_/g, " ")), el("dd", { "data-testid": `tool-arg-${k}` }, text(v)));
    if (rows.length) parts.push(el("dl", { class: "tool-args" }, ...rows));
  }
  const node = el(
    "div",
    { class: "tool-step", "data-testid": "tool-step" },
    ...parts,
    el("details", { class: "tool-result" }, el("summary", {}, "Details"), el("pre", { class: "body card", "data-testid": "message-body" }, pretty)),
  );
  return { node, operationID };
}

// toolText is a tool step on one line: what was asked of which tool.
export function toolText(content: string): string {
  try {
    const rec = JSON.parse(content) as { tool?: string; arguments?: Record<string, unknown> };
    const args = rec.arguments && typeof rec.arguments === "object" ? rec.arguments : {};
    if (rec.tool === "send_email") return typeof args.to === "string" ? `Email to ${args.to}` : "Email";
    if (rec.tool === "catalog_search" && typeof args.query === "string") return `Catalog search for “${args.query}”`;
    if (rec.tool) return rec.tool;
  } catch {
    // not JSON: as it is
  }
  return content;
}

// callingLabel says what a tool call in progress is doing, in words.
export function callingLabel(op: Operation): string {
  const args = (op.args && typeof op.args === "object" ? op.args : {}) as Record<string, unknown>;
  if (op.tool === "catalog_search" && typeof args.query === "string") return `Searching the catalog for “${snippet(args.query, 60)}”…`;
  if (op.tool === "send_email" && typeof args.to === "string") return `Handing the email to ${args.to} to the provider…`;
  return `Running ${op.tool}…`;
}

// cancelWaitsFor says what a cancelled run still waits for: a call handed
// to its system before the cancel cannot be recalled, and the receipt
// will say what it did; an idempotent call is let finish, its result
// kept; a cancellable one is being stopped.
export function cancelWaitsFor(op: Operation): string {
  const args = (op.args && typeof op.args === "object" ? op.args : {}) as Record<string, unknown>;
  const name = op.tool === "send_email" && typeof args.to === "string" ? `The email to ${args.to}` : op.tool === "catalog_search" ? "The catalog search" : op.tool;
  if (op.contract === "consequential") {
    return `${name} was handed over before the cancel and cannot be called back. Waiting for its answer: the receipt will say whether it was carried out.`;
  }
  if (op.contract === "idempotent") return `Waiting for ${name} to finish: it is safe to repeat, and its result is kept for the next run.`;
  return `Stopping ${name}…`;
}

// showOperationLog draws the thread's operation log in panel: folded, its
// summary says how many calls (open, a long one would stand between the
// latest message and the composer, where a conversation opens). The page
// draws after every event, deltas included: the list is rebuilt only when
// an operation changed.
export function showOperationLog(panel: HTMLElement, operations: ReadonlyMap<string, Operation>): void {
  const want = [...operations.values()].map((op) => `${op.operation_id}:${op.phase}:${op.outcome ?? ""}:${op.updated_at}`).join(",");
  const list = panel.querySelector<HTMLElement>(".ops-list")!;
  if (list.dataset.ops === want) return;
  list.dataset.ops = want;
  const ops = [...operations.values()].sort((a, b) => a.created_at.localeCompare(b.created_at));
  panel.hidden = ops.length === 0;
  panel.querySelector<HTMLElement>("[data-testid=operations-count]")!.textContent = ops.length === 1 ? "1 call" : `${ops.length} calls`;
  list.replaceChildren(...ops.map((op) => operationItem(op)));
}
