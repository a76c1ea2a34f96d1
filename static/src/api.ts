// The page's HTTP calls to the gateway (docs/http-api.md), in one place.
// Commands go over the WebSocket (socket.ts); what no event reports is
// read here: a thread's snapshot, checkpoints, title and operation log,
// earlier history, a run's place, what the server holds of a stopped
// reply, the list of conversations, and a cancel when the socket is down.
// Each call says how it fails: most answer null (or throw) and leave it
// to the caller to keep what it shows.

import type { Checkpoint, CheckpointDelta, HistoryPage, Message, Operation, RunStatus, Snapshot } from "./protocol";
import { CheckpointSet } from "./checkpointset";
import { nextTask } from "./dom";

const same: RequestInit = { credentials: "same-origin" };

function threadPath(threadID: string, rest = ""): string {
  return `/api/threads/${encodeURIComponent(threadID)}${rest}`;
}

// readSnapshot is the thread's snapshot; null when the server could not
// be reached or did not answer with it.
export async function readSnapshot(threadID: string): Promise<Snapshot | null> {
  try {
    const r = await fetch(threadPath(threadID), same);
    return r.ok ? ((await r.json()) as Snapshot) : null;
  } catch {
    return null;
  }
}

// Checkpoints is what GET /api/threads/{id}/checkpoints answers.
export interface Checkpoints {
  head_checkpoint_id: string;
  checkpoints: Checkpoint[];
}

// readCheckpoints answers the thread's checkpoints, or why it could not
// (a sentence's end: "the server answered 503"). It reads them as deltas
// (?lists=delta: what each adds to its parent's lists), an answer that
// grows with the number of checkpoints, and keeps them so
// (checkpointset.ts): each message_ids is made when first asked for.
export async function readCheckpoints(threadID: string): Promise<Checkpoints | { failed: string }> {
  try {
    const r = await fetch(threadPath(threadID, "/checkpoints?lists=delta"), same);
    if (!r.ok) return { failed: `the server answered ${r.status}` };
    const body = (await r.json()) as { head_checkpoint_id: string; checkpoints: CheckpointDelta[] };
    // (Reading a long conversation's answer, making its set and drawing
    // with it are three tasks, each short: a page just opened stays
    // responsive while they run.)
    await nextTask();
    return { head_checkpoint_id: body.head_checkpoint_id, checkpoints: CheckpointSet.fromDeltas(body.checkpoints).list };
  } catch {
    return { failed: "the server could not be reached" };
  }
}

// readTitle is the thread's title, from its snapshot ("" when it could
// not be read).
export async function readTitle(threadID: string): Promise<string> {
  return (await readSnapshot(threadID))?.title ?? "";
}

// readOperations is the thread's operation log; null when it could not be
// read.
export async function readOperations(threadID: string): Promise<Operation[] | null> {
  try {
    const r = await fetch(threadPath(threadID, "/operations"), same);
    if (!r.ok) return null;
    return ((await r.json()) as { operations: Operation[] }).operations;
  } catch {
    return null;
  }
}

// createThread creates an empty conversation and answers its id; null
// when the server refused or could not be reached.
export async function createThread(): Promise<string | null> {
  try {
    const r = await fetch("/api/threads", { ...same, method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" });
    if (!r.ok) return null;
    return ((await r.json()) as { thread_id: string }).thread_id;
  } catch {
    return null;
  }
}

// readEarlier reads up to limit messages of the history before message
// before; it throws with the server's reason when it cannot.
export async function readEarlier(threadID: string, before: string, limit: number): Promise<HistoryPage> {
  const q = new URLSearchParams({ before, limit: String(limit) });
  const r = await fetch(threadPath(threadID, `/messages?${q}`), same);
  if (!r.ok) {
    let why = `the server answered ${r.status}`;
    try {
      const body = (await r.json()) as { message?: string };
      if (body.message) why = body.message;
    } catch {
      // not JSON: the status says enough
    }
    throw new Error(why);
  }
  return (await r.json()) as HistoryPage;
}

// RunAnswer is what GET /api/runs/{id} says of a run, as read (the caller
// checks the fields).
export interface RunAnswer {
  status?: RunStatus;
  queue_position?: unknown;
  executed?: unknown;
}

// readRun answers GET /api/runs/{id}; null when the server could not be
// reached or did not answer with the run.
export async function readRun(runID: string): Promise<RunAnswer | null> {
  try {
    const r = await fetch(`/api/runs/${encodeURIComponent(runID)}`, { ...same, cache: "no-store" });
    return r.ok ? ((await r.json()) as RunAnswer) : null;
  } catch {
    return null;
  }
}

// Answer is a JSON answer of the server with its status; null stands for
// no answer of the gateway (not reachable, or a page that is not JSON,
// e.g. a proxy's error page).
export interface Answer {
  ok: boolean;
  body: Record<string, unknown>;
}

async function answer(req: Promise<Response>): Promise<Answer | null> {
  let r: Response;
  try {
    r = await req;
  } catch {
    return null;
  }
  try {
    return { ok: r.ok, body: (await r.json()) as Record<string, unknown> };
  } catch {
    return null;
  }
}

// readStreamed asks what a fragment.save of messageID up to lastSeq would
// keep (GET /api/threads/{id}/streamed/{message_id}).
export function readStreamed(threadID: string, messageID: string, lastSeq: number): Promise<Answer | null> {
  return answer(fetch(threadPath(threadID, `/streamed/${encodeURIComponent(messageID)}?last_seq=${lastSeq}`), same));
}

// postCancel is POST /api/runs/{id}/cancel, the way a cancel goes when the
// socket is down; client names this tab in the audit journal
// (requested_by "api:<tab id>").
export function postCancel(runID: string, reason: string, client: string): Promise<Answer | null> {
  return answer(
    fetch(`/api/runs/${encodeURIComponent(runID)}/cancel`, {
      ...same,
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Client-Name": client },
      body: JSON.stringify({ reason }),
    }),
  );
}

// listThreads reads a page of the conversation list (query: the search's
// words, "" for all; cursor: after the page that answered it).
export function listThreads(limit: number, query = "", cursor = ""): Promise<Response> {
  const q = new URLSearchParams({ limit: String(limit) });
  if (cursor) q.set("cursor", cursor);
  if (query) q.set("q", query);
  return fetch(`/api/threads?${q}`, same);
}

// readReadiness is GET /readyz (whether the server is ready, and its tool
// servers' state).
export function readReadiness(): Promise<Response> {
  return fetch("/readyz", { cache: "no-store" });
}

// readMessagesByID reads messages of the thread by id, on any branch (GET
// …/messages?ids=, at most 20): those of the thread, in the order asked;
// null when the server could not be reached or refused.
export async function readMessagesByID(threadID: string, ids: string[]): Promise<Message[] | null> {
  try {
    const r = await fetch(threadPath(threadID, `/messages?ids=${ids.map(encodeURIComponent).join(",")}`), same);
    return r.ok ? ((await r.json()) as { messages: Message[] }).messages : null;
  } catch {
    return null;
  }
}
