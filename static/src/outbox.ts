// Outbox keeps every message the user queued (queue.add) until the server
// has acknowledged it, as Cancels (cancel.ts) keeps a cancel: sent at once
// when the tab is live; otherwise kept in sessionStorage (a reload keeps
// it too) and sent right after the next hello. Each carries a
// client_request_id, so a message sent again (its ack was lost with the
// connection) is still queued once: the server answers the same item.
// Until the tab's state shows the item (queue.updated, a snapshot), the
// page draws it from here, marked as not sent yet.

import { CommandError } from "./protocol";
import type { Socket } from "./socket";
import type { ThreadState } from "./state";

export type QueueMode = "after" | "interrupt";

export interface QueuedAdd {
  client_request_id: string;
  thread_id: string;
  text: string;
  mode: QueueMode;
  at: number; // Unix ms, when it was queued
}

// Entry is a queued message this tab has not seen in the thread's state
// yet: kept (waiting for the connection), in flight, or acknowledged
// (itemID and the state version its ack named).
export interface Entry extends QueuedAdd {
  inFlight: boolean;
  itemID?: string;
  version?: number;
  // seen: the items of the queue when it was sent (an item that appears
  // after is this one's, when its text is the same: the event may come
  // before the ack).
  seen?: Set<string>;
}

export interface OutboxHandlers {
  changed(): void;
  // refused: the server refused the message for good (too long, the queue
  // is full, the conversation is gone): it is no longer kept.
  refused(e: QueuedAdd, err: CommandError): void;
  // startedRun: the message started at once as runID (no run was active).
  startedRun(runID: string): void;
}

const prefix = "gateway.queued.";
// Codes a later attempt can turn into an answer.
const transient = new Set(["unauthorized", "rate_limited", "internal"]);

export class Outbox {
  private entries: Entry[];
  private timer: ReturnType<typeof setTimeout> | undefined;

  // state is the thread as the tab shows it now.
  constructor(
    private readonly socket: Socket,
    private readonly threadID: string,
    private readonly state: () => ThreadState,
    private readonly h: OutboxHandlers,
  ) {
    this.entries = loadAll(threadID).map((q) => ({ ...q, inFlight: false }));
  }

  // add keeps text, to be queued with mode, and sends it when it can.
  add(text: string, mode: QueueMode): void {
    const q: QueuedAdd = { client_request_id: newRequestID(), thread_id: this.threadID, text, mode, at: Date.now() };
    try {
      sessionStorage.setItem(prefix + q.client_request_id, JSON.stringify(q));
    } catch {
      // Storage refused: kept in this page only.
    }
    const e: Entry = { ...q, inFlight: false };
    this.entries.push(e);
    void this.attempt(e);
  }

  // flush sends what is kept; call it once hello is acknowledged (after
  // the kept cancels: a message queued after a Stop is queued after it).
  flush(): void {
    for (const e of this.entries) if (!e.itemID && !e.inFlight) void this.attempt(e);
  }

  // drop forgets a kept message that was not sent (the user removed it).
  drop(id: string): void {
    const e = this.entries.find((x) => x.client_request_id === id);
    if (!e || e.inFlight || e.itemID) return;
    this.forget(e);
    this.h.changed();
  }

  // dropAll forgets every kept message (the conversation is gone) and
  // answers their texts, oldest first.
  dropAll(): string[] {
    const texts = this.entries.filter((e) => !e.itemID).map((e) => e.text);
    for (const e of [...this.entries]) this.forget(e);
    return texts;
  }

  // shown are the messages to draw as not in the queue yet: neither
  // acknowledged and in the state's queue, nor seen there by their text.
  shown(s: ThreadState): Entry[] {
    this.settle(s);
    const claimed = new Set(this.entries.map((e) => e.itemID).filter((id): id is string => !!id));
    const out: Entry[] = [];
    for (const e of this.entries) {
      if (e.itemID && s.queue.items.some((i) => i.item_id === e.itemID)) continue;
      if (!e.itemID && e.inFlight && e.seen) {
        const mine = s.queue.items.find((i) => !e.seen?.has(i.item_id) && !claimed.has(i.item_id) && i.user_message === e.text && i.mode === e.mode && i.requested_by === `tab:${this.socket.tabID}`);
        if (mine) {
          claimed.add(mine.item_id);
          continue;
        }
      }
      out.push(e);
    }
    return out;
  }

  // settle forgets the acknowledged messages the state caught up with:
  // they are in its queue, or started, or were removed since.
  private settle(s: ThreadState): void {
    for (const e of [...this.entries]) {
      if (e.itemID && e.version !== undefined && s.stateVersion >= e.version && !s.queue.items.some((i) => i.item_id === e.itemID)) this.forget(e);
    }
  }

  private forget(e: Entry): void {
    this.entries = this.entries.filter((x) => x !== e);
    try {
      sessionStorage.removeItem(prefix + e.client_request_id);
    } catch {
      // (nothing kept)
    }
  }

  private async attempt(e: Entry): Promise<void> {
    if (!this.socket.live || e.inFlight) {
      this.h.changed();
      return;
    }
    e.inFlight = true;
    e.seen = new Set(this.state().queue.items.map((i) => i.item_id));
    this.h.changed();
    try {
      const ack = await this.socket.send({ type: "queue.add", thread_id: e.thread_id, user_message: e.text, mode: e.mode, client_request_id: e.client_request_id });
      e.itemID = String(ack.item_id ?? "");
      e.version = Number(ack.state_version ?? 0);
      try {
        sessionStorage.removeItem(prefix + e.client_request_id);
      } catch {
        // (nothing kept)
      }
      // Started at once (no run was active): it is a run now, not a
      // queued message.
      if (typeof ack.run_id === "string" && ack.run_id) {
        this.forget(e);
        this.h.startedRun(ack.run_id);
      }
    } catch (err) {
      if (err instanceof CommandError && !transient.has(err.code)) {
        this.forget(e);
        this.h.refused(e, err);
      } else if (err instanceof CommandError) {
        this.later();
      }
      // Otherwise lost with the connection: kept, and sent again after
      // the next hello.
    } finally {
      e.inFlight = false;
      this.h.changed();
    }
  }

  private later(): void {
    if (this.timer !== undefined) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.flush();
    }, 2000);
  }
}

function newRequestID(): string {
  const bytes = new Uint8Array(12);
  crypto.getRandomValues(bytes);
  return "q-" + [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
}

// loadAll reads the messages of threadID a reload left in sessionStorage,
// oldest first.
function loadAll(threadID: string): QueuedAdd[] {
  const out: QueuedAdd[] = [];
  try {
    for (let n = 0; n < sessionStorage.length; n++) {
      const key = sessionStorage.key(n);
      if (!key || !key.startsWith(prefix)) continue;
      try {
        const q = JSON.parse(sessionStorage.getItem(key) ?? "") as QueuedAdd;
        if (q.thread_id === threadID && typeof q.text === "string" && typeof q.client_request_id === "string") out.push(q);
      } catch {
        // Not ours to read: left alone.
      }
    }
  } catch {
    // Storage unavailable: nothing was kept.
  }
  return out.sort((a, b) => a.at - b.at);
}
