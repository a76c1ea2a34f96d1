// What became of a tool call, in words, from the operation as it is now:
// its phase and outcome and, while the outcome is unknown, whether the
// gateway still asks the provider by the call's key. The cancel receipt and
// the tool step in the conversation say it from the same facts, and change
// with every tool.updated.

import type { Operation, OperationOutcome } from "./protocol";

// OpNow is what the page knows of an operation: the outcome a run.cancelled
// or a snapshot reported, completed by the whole operation once the log or
// a tool event brought it (key, draft, reconciliation).
export type OpNow = OperationOutcome &
  Partial<Pick<Operation, "contract" | "preview" | "idempotency_key" | "reconcile_next_at" | "reconcile_until">>;

// Line is one operation in words: its state (data-state), a short status
// ("not confirmed yet") and the sentences after it, with the key as code.
export interface Line {
  state: string;
  status: string;
  rest: (Node | string)[];
}

// opState names what a user must know: an unknown outcome still being
// checked, or one the gateway is not asking about (it gave up at the
// horizon, or the provider cannot be asked: an MCP server); otherwise the
// outcome.
export function opState(o: OpNow): string {
  if (o.outcome !== "unknown") return o.outcome;
  return o.reconcile_until && !o.reconcile_next_at ? "unknown_given_up" : "unknown_checking";
}

type Effect = { what: string; done: string; who: string };

// effect names what the call does, for sentences: "the email to ann@…" and
// "sent"; another tool's call is "the refund_order call", "carried out".
// who is the system it goes to: "the provider", or, for an MCP tool (its
// preview names the server), "the memory server".
function effect(o: OpNow): Effect {
  if (o.tool === "send_email") {
    const to = (o.preview as { to?: unknown } | null | undefined)?.to;
    return { what: typeof to === "string" && to ? `the email to ${to}` : "the email", done: "sent", who: "the provider" };
  }
  const server = (o.preview as { server?: unknown } | null | undefined)?.server;
  const who = typeof server === "string" && server ? `the ${server} server` : "the provider";
  return { what: `the ${o.tool} call`, done: "carried out", who };
}

const cap = (s: string): string => s.charAt(0).toUpperCase() + s.slice(1);

// keyed is [before, the key as code, after], or [without] when the page
// does not know the key yet (the operation log has not answered).
function keyed(o: OpNow, before: string, after: string, without: string): (Node | string)[] {
  if (!o.idempotency_key) return [without];
  const c = document.createElement("code");
  c.className = "op-key";
  c.dataset.testid = "operation-key";
  c.textContent = o.idempotency_key;
  return [before, c, after];
}

// unknownRest is what an unknown outcome means now: still being checked
// (the key, and that this will change), or given up on (where to look).
function unknownRest(o: OpNow): (Node | string)[] {
  const e = effect(o);
  if (opState(o) === "unknown_given_up") {
    return [
      `${cap(e.what)} may have been ${e.done}: ${e.who} has not confirmed whether it was, and the gateway is not asking it. `,
      ...keyed(o, "Check its records for key ", ".", "Check its records."),
    ];
  }
  return [
    `${cap(e.what)} may have been ${e.done}. `,
    ...keyed(o, "The gateway keeps asking the provider (key ", ") and will update this.", "The gateway keeps asking the provider and will update this."),
  ];
}

// describe builds o's Line with line (a Line of o's state): while its
// outcome is unknown, with status checking (the gateway still asks) or
// givenUp (it stopped) and what that means; otherwise as known makes it
// from o's effect.
function describe<L extends Line | null>(
  o: OpNow,
  checking: string,
  givenUp: string,
  known: (line: LineOf, e: Effect) => L,
): Line | L {
  const state = opState(o);
  const line: LineOf = (status, ...rest) => ({ state, status, rest });
  if (state === "unknown_checking") return line(checking, ...unknownRest(o));
  if (state === "unknown_given_up") return line(givenUp, ...unknownRest(o));
  return known(line, effect(o));
}

type LineOf = (status: string, ...rest: (Node | string)[]) => Line;

// receiptLine says, in a cancel receipt, what a tool call of the cancelled
// run did: "<tool>: <status>. <rest>".
export function receiptLine(o: OpNow): Line {
  return describe(o, "not confirmed yet", "unknown", (line, e) => {
    if (o.phase === "reconciled") {
      return line(
        e.done,
        ...keyed(o, "The provider has confirmed (key ", ")", "The provider has confirmed"),
        ` that it took ${e.what}: it was handed over before the cancel took effect and cannot be undone.`,
      );
    }
    switch (o.outcome) {
      case "committed":
        return line(e.done, `${cap(e.what)} was already handed to the external system before the cancel took effect. It cannot be undone; see the operation log.`);
      case "not_started":
        return line("not started", `Nothing was sent: ${o.phase === "rejected" ? "you rejected it" : "the cancel came first"}.`);
      case "completed":
        return line("finished before the cancel", "Its result is kept, and continuing reuses it.");
      case "aborted":
        return line("stopped", "It runs again if you continue.");
      case "failed":
        return line("failed", o.contract === "consequential" ? `${cap(e.who)} refused ${e.what}.` : "It did not succeed.");
      default:
        return line(o.outcome.replace(/_/g, " "));
    }
  });
}

// stepLine says, under a consequential call's result in the conversation,
// what became of it now — the recorded result is what was known then —
// as "<Status>. <rest>", or null when there is nothing to add.
export function stepLine(o: OpNow): Line | null {
  return describe(o, "Not confirmed yet", "Unknown", (line, e) => {
    if (o.phase === "reconciled") {
      return line(
        cap(e.done),
        "Its answer was lost, but the provider has since confirmed",
        ...keyed(o, " (key ", ")", ""),
        ` that it took ${e.what}. It cannot be undone.`,
      );
    }
    if (o.outcome === "committed") return line(cap(e.done), `${cap(e.who)} took ${e.what}. It cannot be undone.`);
    if (o.outcome === "failed") return line(`Not ${e.done}`, `${cap(e.who)} refused ${e.what}.`);
    return null;
  });
}

// toolName is a tool as a reader knows it: the built-in ones in words, an
// operator's own (webhook) tools by the name the operator gave them.
export function toolName(tool: string): string {
  if (tool === "send_email") return "Email";
  if (tool === "catalog_search") return "Catalog search";
  return tool;
}

// LogLine is a tool call as the operation log names it: what it is ("Email
// to ann@example.com", "Catalog search for “mugs”") and what became of it
// ("Sent once", "Not sent: you rejected it"); state colours the status.
export interface LogLine {
  what: string;
  status: string;
  state: string;
}

// logLine says an operation of the log in words. The protocol's words
// (contract, phase, outcome, key) stay available under its Details.
export function logLine(op: Operation): LogLine {
  const args = (op.args && typeof op.args === "object" ? op.args : {}) as Record<string, unknown>;
  const preview = (op.preview && typeof op.preview === "object" ? op.preview : {}) as Record<string, unknown>;
  const to = typeof preview.to === "string" && preview.to ? preview.to : typeof args.to === "string" ? args.to : "";
  let what = op.tool;
  if (op.tool === "send_email") what = to ? `Email to ${to}` : "Email";
  else if (op.tool === "catalog_search" && typeof args.query === "string") what = `Catalog search for “${args.query}”`;
  const now: OpNow = { ...op, outcome: op.outcome ?? "" };
  const e = effect(now);
  const l = (state: string, status: string): LogLine => ({ what, status, state });
  if (op.contract === "consequential") {
    switch (op.phase) {
      case "prepared":
        return l("waiting", `Waiting for your confirmation: not ${e.done} yet`);
      case "confirmed":
        return l("working", `Confirmed: about to be ${e.done}`);
      case "committing":
        return l("working", op.tool === "send_email" ? "Being handed to the provider…" : "Being carried out…");
      case "committed":
        return l("committed", `${cap(e.done)} once`);
      case "rejected":
        return l("not_started", `Not ${e.done}: you rejected it`);
      case "voided":
        return l("not_started", `Not ${e.done}: cancelled before it was ${e.done}`);
      case "unknown":
        return opState(now) === "unknown_given_up"
          ? l("unknown_given_up", `Unknown: it may have been ${e.done}`)
          : l("unknown_checking", `Not confirmed yet: it may have been ${e.done}`);
      case "reconciled":
        return op.outcome === "failed"
          ? l("failed", `Not ${e.done}: the provider refused it`)
          : l("committed", `${cap(e.done)} once (the provider confirmed it later)`);
      case "failed":
        return l("failed", `Not ${e.done}: ${e.who} refused it`);
    }
  }
  switch (op.phase) {
    case "running":
      return l("working", op.tool === "catalog_search" ? "Searching…" : "Running…");
    case "completed":
      return l("completed", "Done: its result is in the conversation");
    case "aborted":
      return l("aborted", "Stopped before it finished: it runs again if you continue");
    case "failed":
      return l("failed", "Failed");
  }
  return l(op.phase, cap(op.phase.replace(/_/g, " ")));
}
