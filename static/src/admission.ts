// A run that waits for a free slot (docs/protocol.md "Admission: a run that
// waits for capacity"). A server at capacity keeps a new run queued and
// says where it stands: queue_position (1 = next to start) on the
// run.start ack, on the snapshot's active_run and on GET /api/runs/{id}.
// No event says that the place changed or that the run was claimed (the
// first thing tabs see of a started run is its first delta), so while a
// run waits the page asks GET /api/runs/{id} every few seconds.
//
// The server's first paint writes the same words (web/admission.go).

import type { RunStatus } from "./protocol";
import { el } from "./dom";
import { readRun } from "./api";

// pollEvery is how often a waiting run's place is asked for while it is
// near the front; a run far back (more than farBack ahead of it) is asked
// for every pollFar: each ask is a count of the runs ahead on the server,
// and a deep queue with pages open on every waiting run would otherwise
// cost the server more than the runs it is waiting for.
const pollEvery = 2000;
const pollFar = 10000;
const farBack = 10;

// waitingLabel says where a waiting run stands: position 1 is next to
// start, 3 has two runs ahead of it.
export function waitingLabel(position: number): string {
  const ahead = position - 1;
  return `Waiting for a free slot (${ahead <= 0 ? "next to start" : `${ahead} ahead`})`;
}

// waitingHint says what waiting means, under the label.
export const waitingHint = "The server is busy with other replies. Yours starts by itself when a slot frees up; nothing has been generated yet. Cancel withdraws it.";

// neverStartedLine is what a receipt says of a cancelled run the server
// says no worker ever took up (GET /api/runs/{id}: executed false; its
// heading: "Cancelled while waiting for a free slot").
export const neverStartedLine = "It never started: nothing was generated, so nothing was discarded and no tool was called.";

// queuePosition reads a queue_position field: 0 when absent (the run does
// not wait) or not a position.
export function queuePosition(v: unknown): number {
  return typeof v === "number" && Number.isInteger(v) && v > 0 ? v : 0;
}

// RunPlace is what GET /api/runs/{id} says of a run: its status, and its
// place while it waits (0: it does not).
export interface RunPlace {
  status: RunStatus;
  position: number;
  // executed: whether a worker ever took the run up (undefined: the server
  // did not say). A cancelled run that was never executed never started.
  executed?: boolean;
}

// fetchPlace asks the server where runID stands; null when it could not
// be asked or did not answer with the run (the page keeps what it shows,
// and events or the next ask tell).
export async function fetchPlace(runID: string): Promise<RunPlace | null> {
  const body = await readRun(runID);
  if (!body || typeof body.status !== "string") return null;
  return { status: body.status, position: queuePosition(body.queue_position), executed: typeof body.executed === "boolean" ? body.executed : undefined };
}

// PlaceWatch asks for one waiting run's place every pollEvery while it is
// watched, one ask at a time, and hands each answer to its owner. It does
// not ask while the tab is hidden, and asks at once when the tab is shown
// again.
export class PlaceWatch {
  private runID = "";
  private timer = 0;
  private asking = false;

  constructor(private readonly answer: (runID: string, place: RunPlace | null) => void) {
    document.addEventListener("visibilitychange", () => {
      if (!this.runID || document.hidden || this.asking) return;
      window.clearTimeout(this.timer);
      this.timer = 0;
      this.schedule(0);
    });
  }

  // watch starts asking for runID's place (the first ask after pollEvery:
  // what the page shows was just learned); watching another run stops the
  // previous one.
  watch(runID: string): void {
    if (this.runID === runID) return;
    this.stop();
    this.runID = runID;
    this.schedule(pollEvery);
  }

  // stop stops asking (an answer under way is dropped).
  stop(): void {
    this.runID = "";
    window.clearTimeout(this.timer);
    this.timer = 0;
  }

  private schedule(ms: number): void {
    if (this.timer || document.hidden) return;
    this.timer = window.setTimeout(() => void this.ask(), ms);
  }

  private async ask(): Promise<void> {
    this.timer = 0;
    const id = this.runID;
    if (!id) return;
    this.asking = true;
    const place = await fetchPlace(id);
    this.asking = false;
    if (this.runID !== id) return;
    this.answer(id, place);
    if (this.runID === id) this.schedule(place && place.position > farBack ? pollFar : pollEvery);
  }
}

// waitingBox is the place of a run that waits for a free slot: where it
// stands, and what that means. The server's first paint draws the same
// (web/pages.templ, waiting).
export function waitingBox(position: number): HTMLElement {
  return el(
    "div",
    { class: "msg role-assistant provisional waiting", "data-testid": "streaming", "data-queue-position": String(position), "aria-busy": "true" },
    el("span", { class: "chip wait", "data-testid": "run-chip" }, waitingLabel(position)),
    el("p", { class: "hint", "data-testid": "waiting-hint" }, waitingHint),
  );
}
