// Socket is the page's one WebSocket connection: it says hello with the
// tab's id, reconnects with backoff when the connection drops, and turns
// each command into a promise settled by its ack or error. A dropped
// connection cancels nothing on the server; after reconnecting, the owner
// sends what the user asked for while offline (a kept cancel) and then
// resubscribes from the last seq it applied.

import { CommandError, type ErrorReply, type ServerEvent } from "./protocol";
import { listThreads } from "./api";

export type ConnState = "connecting" | "live" | "reconnecting";

interface Pending {
  resolve: (ack: Record<string, unknown>) => void;
  reject: (err: Error) => void;
}

export interface SocketHandlers {
  // open runs after every (re)connect, once hello was acknowledged; what it
  // sends first reaches the server first (commands run in order).
  open: () => void;
  event: (ev: ServerEvent) => void;
  state: (s: ConnState, detail: string) => void;
}

function tabID(): string {
  const key = "gateway.tab_id";
  let id = sessionStorage.getItem(key);
  if (!id) {
    id = "tab-" + Math.random().toString(36).slice(2, 10);
    sessionStorage.setItem(key, id);
  }
  return id;
}

// signIn leaves for the sign-in page, coming back here afterwards.
function signIn(): void {
  location.assign("/login?next=" + encodeURIComponent(location.pathname));
}

export class Socket {
  private ws: WebSocket | null = null;
  private nextID = 0;
  private pending = new Map<string, Pending>();
  private backoff = 250;
  private greeted = false;
  private readonly tab = tabID();
  // urgent: something waits for the server (a kept cancel), so reconnect
  // attempts stay at most half a second apart: the sooner it is sent, the
  // less a run handed back to the queue streams in vain.
  urgent = false;

  constructor(private readonly h: SocketHandlers) {}

  get tabID(): string {
    return this.tab;
  }

  // live: connected and hello acknowledged; a command sent now is answered
  // unless the connection drops.
  get live(): boolean {
    return this.greeted && this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  connect(): void {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(`${proto}//${location.host}/ws`);
    this.ws = ws;
    this.greeted = false;
    let opened = false;
    ws.onopen = () => {
      opened = true;
      this.backoff = 250;
      this.send({ type: "hello", tab_id: this.tab })
        .then(() => {
          if (this.ws !== ws) return;
          this.greeted = true;
          this.h.state("live", "");
          this.h.open();
        })
        .catch(() => ws.close());
    };
    ws.onmessage = (m: MessageEvent) => {
      if (typeof m.data !== "string") return;
      for (const line of m.data.split("\n")) {
        if (line) this.dispatch(JSON.parse(line) as Record<string, unknown>);
      }
    };
    ws.onclose = (e: CloseEvent) => {
      if (this.ws !== ws) return;
      this.ws = null;
      this.greeted = false;
      for (const p of this.pending.values()) p.reject(new Error("connection lost: wait for it to come back, then try again"));
      this.pending.clear();
      // 1008: the session ended (signed out elsewhere, password changed,
      // token revoked). An upgrade refused before opening may be the same
      // (401): ask the API, which says so in JSON.
      if (e.code === 1008) {
        signIn();
        return;
      }
      if (!opened) {
        listThreads(1)
          .then((r) => {
            if (r.status === 401) signIn();
          })
          .catch(() => {});
      }
      const why = e.code === 1001 ? "server restarting" : e.code === 1013 ? "catching up" : e.code === 1000 ? "renewing the connection" : "connection lost";
      this.h.state("reconnecting", why);
      const wait = this.urgent ? Math.min(this.backoff, 500) : this.backoff;
      this.backoff = Math.min(this.backoff * 2, 5000);
      setTimeout(() => this.connect(), wait);
    };
  }

  // send runs one command and settles with its ack (or rejects with a
  // CommandError carrying the protocol error).
  send(cmd: Record<string, unknown>): Promise<Record<string, unknown>> {
    const ws = this.ws;
    if (!ws || ws.readyState !== WebSocket.OPEN) {
      return Promise.reject(new Error("not connected: wait for the connection to come back"));
    }
    const id = `c${++this.nextID}`;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      ws.send(JSON.stringify({ ...cmd, id }));
    });
  }

  private dispatch(obj: Record<string, unknown>): void {
    if (obj.type === "ack" || obj.type === "error") {
      const re = obj.re as string | undefined;
      const p = re ? this.pending.get(re) : undefined;
      if (!p || !re) return;
      this.pending.delete(re);
      if (obj.type === "ack") p.resolve(obj);
      else p.reject(new CommandError(obj as unknown as ErrorReply));
      return;
    }
    this.h.event(obj as unknown as ServerEvent);
  }
}
