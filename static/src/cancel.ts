// Cancels keeps every cancel the user pressed until the server has answered
// it. A cancel goes over the WebSocket when the tab is live; when the socket
// is down (or does not answer in time) over HTTP, POST /api/runs/{id}/cancel
// (same origin: the session cookie authenticates it); and when neither
// answers it is kept in sessionStorage, so a reload keeps it too, and sent
// again: right after the next hello (flush, before the tab subscribes),
// after each failed reconnect (retry, over HTTP), or when the server asked
// to wait. Only the server's answer ends an intent: an ack (recorded now or
// already before), or a refusal that sending again cannot change.

import { CommandError, type CancelAck, type ErrorReply } from "./protocol";
import type { Socket } from "./socket";
import { postCancel } from "./api";

export interface CancelIntent {
  run_id: string;
  thread_id: string;
  reason: string;
  pressed_at: number; // Unix ms
}

// CancelAnswer is the server's word on an intent: accepted (the ack, and
// the path that carried it) or refused for good (run_not_active,
// not_found, invalid_request, forbidden…).
export type CancelAnswer = { kind: "accepted"; ack: CancelAck; via: "ws" | "http" } | { kind: "refused"; error: CommandError };

// CancelState of a kept intent: an attempt is in flight, or it waits for a
// path to the server.
export type CancelState = "sending" | "kept";

// Unanswered: no path reached the server, or it answered with something
// sending again can change (unauthorized, rate_limited, internal).
interface Unanswered {
  kind: "unanswered";
  retryAfterMs?: number;
}

const prefix = "gateway.cancel.";
// How long a live socket gets to acknowledge a cancel before HTTP is tried
// as well (a connection can be dead before the browser notices).
const socketPatience = 3000;
// Codes a later attempt can turn into an answer.
const transient = new Set(["unauthorized", "rate_limited", "internal"]);

export class Cancels {
  // The tab's intents by run id, written through to sessionStorage (which
  // only this tab sees, and which outlives a reload).
  private readonly intents = new Map<string, CancelIntent>(loadAll().map((i) => [i.run_id, i]));
  private readonly inFlight = new Map<string, number>();
  private timer: ReturnType<typeof setTimeout> | undefined;

  // answered runs once per intent, with the answer that ended it; changed
  // runs whenever an intent's state changes.
  constructor(
    private readonly socket: Socket,
    private readonly answered: (intent: CancelIntent, answer: CancelAnswer) => void,
    private readonly changed: () => void,
  ) {}

  // request keeps the user's cancel of runID and sends it.
  request(runID: string, threadID: string, reason = "user_requested"): void {
    let intent = this.intents.get(runID);
    if (!intent) {
      intent = { run_id: runID, thread_id: threadID, reason, pressed_at: Date.now() };
      this.intents.set(runID, intent);
      sessionStorage.setItem(prefix + runID, JSON.stringify(intent));
    }
    void this.attempt(intent);
  }

  // state is where the user's cancel of runID stands (null: none pressed,
  // or the server answered it).
  state(runID: string): CancelState | null {
    if (!this.intents.has(runID)) return null;
    return (this.inFlight.get(runID) ?? 0) > 0 ? "sending" : "kept";
  }

  // keptFor lists the intents of one thread not answered yet.
  keptFor(threadID: string): CancelIntent[] {
    return [...this.intents.values()].filter((i) => i.thread_id === threadID);
  }

  // any says whether some intent still waits for an answer.
  any(): boolean {
    return this.intents.size > 0;
  }

  // flush sends every kept intent over the socket. Call it first thing once
  // hello is acknowledged: commands run in order per connection, so the
  // server records these cancels before anything else this tab asks.
  flush(): void {
    for (const i of this.oldestFirst()) void this.attempt(i);
  }

  // retry sends the kept intents that have no attempt in flight (over HTTP
  // while the socket is down).
  retry(): void {
    for (const i of this.oldestFirst()) if (!this.inFlight.get(i.run_id)) void this.attempt(i);
  }

  private oldestFirst(): CancelIntent[] {
    return [...this.intents.values()].sort((a, b) => a.pressed_at - b.pressed_at);
  }

  private async attempt(intent: CancelIntent): Promise<void> {
    const id = intent.run_id;
    this.inFlight.set(id, (this.inFlight.get(id) ?? 0) + 1);
    this.changed();
    let result: CancelAnswer | Unanswered;
    try {
      result = await this.deliver(intent);
    } catch {
      result = { kind: "unanswered" };
    }
    const n = (this.inFlight.get(id) ?? 1) - 1;
    if (n > 0) this.inFlight.set(id, n);
    else this.inFlight.delete(id);
    // Another attempt may have been answered first: one answer per intent.
    if (result.kind !== "unanswered" && this.intents.has(id)) {
      this.intents.delete(id);
      sessionStorage.removeItem(prefix + id);
      this.answered(intent, result);
    } else if (result.kind === "unanswered" && result.retryAfterMs !== undefined) {
      this.later(result.retryAfterMs);
    }
    this.changed();
  }

  private later(ms: number): void {
    if (this.timer !== undefined) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.retry();
    }, ms);
  }

  private async deliver(i: CancelIntent): Promise<CancelAnswer | Unanswered> {
    if (this.socket.live) {
      try {
        const ack = await within(this.socket.send({ type: "run.cancel", run_id: i.run_id, reason: i.reason }), socketPatience);
        return { kind: "accepted", ack: ack as unknown as CancelAck, via: "ws" };
      } catch (err) {
        if (err instanceof CommandError) return classify(err);
        // Lost with the connection, or no answer in time: try HTTP.
      }
    }
    // The audit journal names this tab: requested_by "api:<tab id>".
    const a = await postCancel(i.run_id, i.reason, this.socket.tabID);
    // (No answer: not reachable, or not the gateway's, e.g. a proxy's error page.)
    if (!a) return { kind: "unanswered" };
    const body = a.body;
    if (a.ok) return { kind: "accepted", ack: body as unknown as CancelAck, via: "http" };
    if (typeof body.error === "string") return classify(new CommandError({ ...body, type: "error" } as ErrorReply));
    return { kind: "unanswered" };
  }
}

// refusalNotice is what the page says when the server refused a cancel
// the user pressed (here: in the conversation on screen): why there was
// nothing to cancel, or what to do.
export function refusalNotice(e: CommandError, here: boolean): { text: string; tone: "error" | "info" } {
  const where = here ? "" : " (in another conversation)";
  if (e.code === "run_not_active" && e.reply.status === "failed") {
    return { text: `The reply failed before your cancel reached the server${where}; nothing of it was published. Continue from the saved point when you are ready.`, tone: "info" };
  }
  if (e.code === "run_not_active") {
    return {
      text: `The reply finished before your cancel reached the server${where}, so it stays in the conversation. To go back to before it, open Checkpoints and fork from an earlier point.`,
      tone: "info",
    };
  }
  if (e.code === "not_found") return { text: `That reply is gone${where} (its conversation was deleted), so there was nothing left to cancel.`, tone: "info" };
  return { text: `The server refused the cancel: ${e.message} Reload the page; if the reply is still running, press Cancel again.`, tone: "error" };
}

function classify(err: CommandError): CancelAnswer | Unanswered {
  if (!transient.has(err.code)) return { kind: "refused", error: err };
  const after = Number(err.reply.retry_after_seconds);
  return { kind: "unanswered", retryAfterMs: err.code === "unauthorized" ? undefined : Number.isFinite(after) && after > 0 ? after * 1000 : 2000 };
}

// within settles like p, or rejects once ms passed without an answer.
function within<T>(p: Promise<T>, ms: number): Promise<T> {
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error("no answer in time")), ms);
    p.then(
      (v) => {
        clearTimeout(t);
        resolve(v);
      },
      (e: unknown) => {
        clearTimeout(t);
        reject(e);
      },
    );
  });
}

// loadAll reads the intents a reload left in sessionStorage.
function loadAll(): CancelIntent[] {
  const out: CancelIntent[] = [];
  for (let n = 0; n < sessionStorage.length; n++) {
    const key = sessionStorage.key(n);
    if (!key || !key.startsWith(prefix)) continue;
    try {
      const i = JSON.parse(sessionStorage.getItem(key) ?? "") as CancelIntent;
      if (typeof i.run_id === "string" && typeof i.thread_id === "string") out.push(i);
    } catch {
      // Not ours to read: left alone.
    }
  }
  return out;
}
