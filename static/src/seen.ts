// What a tab displayed of a reply that stopped without being published,
// and whether the server holds exactly that text. A server that stopped
// (a crash, or a stop that could not write) may have lost deltas it had
// already shown; the page then must not offer to save "what you saw", and
// says so. The server's answer is compared with the screen to the
// character: only text the server holds as shown is offered.

import type { ErrorReply } from "./protocol";
import { readStreamed } from "./api";
import { cardStart } from "./card";
import type { Streamed } from "./state";

// Held is where the tab's text stands with the server.
export type Held =
  | { state: "checking" }
  | { state: "held" } // the server holds exactly the text on screen
  | { state: "lost"; cause: string; message: string } // fragment_unavailable
  | { state: "differs"; serverChars: number } // held, but not what the screen shows
  | { state: "unknown" }; // the server could not be asked: a save will tell

// askHeld asks the server what a fragment.save of messageID up to lastSeq
// would keep (GET /api/threads/{id}/streamed/{message_id}), and compares it
// with text, the text on screen.
export async function askHeld(threadID: string, messageID: string, lastSeq: number, text: string): Promise<Held> {
  const a = await readStreamed(threadID, messageID, lastSeq);
  // (No answer: not reachable, or not the gateway's, e.g. a proxy's page.)
  if (!a) return { state: "unknown" };
  const body = a.body;
  if (a.ok) {
    const content = typeof body.content === "string" ? body.content : "";
    return content === text ? { state: "held" } : { state: "differs", serverChars: [...content].length };
  }
  const e = body as unknown as ErrorReply;
  if (e.error === "fragment_unavailable") {
    return { state: "lost", cause: typeof body.cause === "string" ? body.cause : "", message: e.message ?? "" };
  }
  return { state: "unknown" };
}

// canSave says whether "Save visible fragment" may be offered.
export function canSave(h: Held | undefined): boolean {
  return !h || h.state === "held" || h.state === "unknown";
}

// notHeld is the receipt's words for text the server does not hold as the
// screen shows it ("" when it does, or when that is not known yet).
export function notHeld(h: Held | undefined, chars: number): string {
  const seen = `The text you saw (${chars} characters)`;
  if (!h) return "";
  switch (h.state) {
    case "lost":
      if (h.cause === "server_stopped") return `${seen} was not all saved before the server stopped, so it cannot be kept as a fragment`;
      if (h.cause === "expired") return `${seen} is no longer kept by the server, so it cannot be kept as a fragment`;
      if (h.cause === "written_past") return `${seen} was cut by another server instance that went on without it, so it cannot be kept as a fragment`;
      return `${seen} is not held by the server, so it cannot be kept as a fragment (${h.message})`;
    case "differs":
      return `The server holds ${h.serverChars} characters of this reply where you saw ${chars}, so what you saw cannot be kept as a fragment`;
    default:
      return "";
  }
}

// checkHeld asks the server, once the run stopped, whether it holds the
// streamed text s as this tab shows it (the receipt offers to save it only
// then), and calls then with the answer in s.held.
export function checkHeld(threadID: string, s: Streamed, then: () => void): void {
  if (s.held || s.saved || !s.text || cardStart.test(s.text)) return;
  s.held = { state: "checking" };
  void askHeld(threadID, s.messageID, s.lastSeq, s.text).then((h) => {
    s.held = h;
    then();
  });
}
