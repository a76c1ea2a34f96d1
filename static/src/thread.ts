// ThreadView keeps one conversation page true to the server: it applies the
// thread's events in seq order, shows streamed text as provisional (never
// history), and offers after a cancel only what the server can honour.

import { Socket, type ConnState } from "./socket";
import { Cancels, type CancelAnswer, type CancelIntent } from "./cancel";
import { receiptLine, stepLine, toolName, type OpNow } from "./outcome";
import { LiveMarkdown, copyButton, markdownText, renderMarkdown } from "./markdown";
import { cardText, renderCard } from "./card";
import { askHeld, canSave, notHeld } from "./seen";
import { PlaceWatch, fetchPlace, neverStartedLine, queuePosition, waitingBox, type RunPlace } from "./admission";
import { $, button, el, scrollToLatest, snippet } from "./dom";
import { loadDraft, saveDraft } from "./drafts";
import { callingLabel, cancelWaitsFor, lineParts, opView, operationItem, toolProgress, toolResult, toolText } from "./toolview";
import { groupByDay } from "./sidebar";
import { clipUTF8, clippedNote, cutNote, displayBytes, earlierLabel, fetchEarlier, historyIDs } from "./history";
import {
  CommandError,
  type Checkpoint,
  type Message,
  type Operation,
  type OperationOutcome,
  type ServerEvent,
  type Snapshot,
} from "./protocol";
import {
  applyEvent,
  applySnapshot,
  cancelAccepted,
  emptyState,
  place,
  withCancelAck,
  withExecuted,
  withOperationLog,
  withQueuePosition,
  withRunPlace,
  type Receipt,
  type Streamed,
  type ThreadState,
} from "./state";

// cardStart: a reply that begins as a JSON object is a card in the
// making (only a card message is one JSON document; a Markdown reply does
// not start with "{").
const cardStart = /^\s*\{/;

// Branch is where a message stands among its versions (ThreadView.branches):
// index of count, and the checkpoints the previous and next ones move to.
interface Branch {
  index: number;
  count: number;
  prev?: string;
  next?: string;
}

export class ThreadView {
  private readonly threadID: string;
  // s is what this tab knows of the conversation from the server: the
  // reducers of state.ts replace it on every event and snapshot; a few
  // answers of HTTP reads change a field of it (a run's place, the
  // operation log, earlier history), which no event reports.
  private s: ThreadState;
  private loadingEarlier = false;
  private readonly expanded = new Set<string>(); // long replies shown whole
  private readonly askingExecuted = new Set<string>();
  // acked: runs this tab started and read the run.start ack of (which said
  // whether they wait: no need to ask).
  private readonly acked = new Set<string>();
  private readonly places: PlaceWatch;
  private liveBody: { messageID: string; view: LiveMarkdown } | null = null;
  // frame is the animation frame renderSoon asked for (0: none pending);
  // ticker the interval that renders a running tool call's time (tick).
  private frame = 0;
  private ticker = 0;
  private noticeBusy = false; // the notice explains why Enter did not send
  private deleting: string | null = null; // the fragment whose deletion waits for "Delete for good"
  private shownAsk = ""; // the receipt or confirmation card last brought into view
  private conflictFrom: string | null = null;
  private editing: { resumeFrom: string } | null = null;
  private checkpoints: Checkpoint[] = [];
  // treeLoads counts the checkpoint fetches under way (the list is busy
  // while any is); treeOpening those of the panel being opened, while
  // which it says it is being brought up to date (what it shows may be
  // from before the latest request). A refresh on a new checkpoint, with
  // the panel open, is not announced: it comes with every message.
  private treeLoads = 0;
  private treeOpening = 0;
  private readonly plainText = new Map<string, string>(); // message → plain(message)
  private subscribed = false;
  // gone: the conversation was deleted — by this tab (it leaves for the
  // list), or elsewhere (another tab, a program): then nothing more can be
  // sent here, and the page says so and keeps what was typed.
  private gone: "" | "here" | "elsewhere" = "";
  private deletingThread = false; // thread.delete sent, not answered yet
  private following = false; // reading snapshots over HTTP while the socket is down
  private noticeOffline = false; // the notice is about the lost connection
  private readonly socket: Socket;
  private readonly cancels: Cancels;

  private readonly list: HTMLOListElement;
  private readonly live: HTMLElement;
  private readonly composer: HTMLFormElement;
  private readonly input: HTMLTextAreaElement;
  private readonly send: HTMLButtonElement;
  private readonly cancel: HTMLButtonElement;
  private readonly conn: HTMLElement;
  private readonly banner: HTMLElement;
  private readonly notice: HTMLElement;
  private readonly cancelPending: HTMLElement;
  private readonly tree: HTMLElement;
  private readonly opsPanel: HTMLElement;
  private readonly jump: HTMLButtonElement;
  private readonly heading: HTMLElement;
  private readonly earlierBox: HTMLElement;

  constructor(private readonly root: HTMLElement) {
    const snap = JSON.parse($(root, "#snapshot").textContent ?? "{}") as Snapshot;
    this.threadID = snap.thread_id;
    this.s = emptyState(snap.thread_id);
    this.list = $(root, "[data-testid=messages]");
    this.live = $(root, "[data-testid=live]");
    this.composer = $(root, "[data-testid=composer]");
    this.input = $(root, "[data-testid=composer-input]");
    this.send = $(root, "[data-testid=send]");
    this.cancel = $(root, "[data-testid=cancel]");
    this.conn = $(root, "[data-testid=conn-status]");
    this.banner = $(root, "[data-testid=conflict-banner]");
    this.notice = $(root, "[data-testid=notice]");
    this.cancelPending = $(root, "[data-testid=cancel-pending]");
    this.tree = $(root, "[data-testid=tree]");
    this.opsPanel = $(root, "[data-testid=operations]");
    this.jump = $(root, "[data-testid=jump-latest]");
    this.heading = $(root, "[data-testid=thread-heading]");
    this.earlierBox = $(root, "[data-testid=earlier]");
    this.socket = new Socket({
      // A cancel the user pressed while offline goes first, before this tab
      // follows the thread again (the run may be streaming once more).
      open: () => {
        this.cancels.flush();
        this.resubscribe();
      },
      event: (ev) => this.onEvent(ev),
      state: (s, detail) => this.onConn(s, detail),
    });
    this.cancels = new Cancels(
      this.socket,
      (intent, answer) => this.onCancelAnswer(intent, answer),
      () => this.render(),
    );
    this.places = new PlaceWatch((runID, place) => this.onPlace(runID, place));
    this.applySnapshot(snap);
  }

  start(): void {
    this.composer.addEventListener("submit", (e) => {
      e.preventDefault();
      void this.submit();
    });
    // What is typed is kept with the conversation (this browser), so a
    // reload, a sign-out elsewhere or a fork does not lose it.
    if (!this.input.value) this.input.value = loadDraft(this.threadID);
    // (Not while editing a request: restored later, it would be sent as a
    // new message, not as the edit.)
    this.input.addEventListener("input", () => {
      if (!this.editing) saveDraft(this.threadID, this.input.value);
    });
    // The conversation opens where it is: at its latest message.
    scrollToLatest();
    if (this.s.messages.length === 0) this.input.focus();
    let frame = 0;
    window.addEventListener("scroll", () => {
      if (!frame) frame = window.requestAnimationFrame(() => ((frame = 0), this.renderJump()));
    });
    this.jump.addEventListener("click", () => {
      scrollToLatest();
      this.renderJump();
    });
    this.input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        void this.submit();
      }
    });
    const ask = $(this.root, "[data-testid=delete-confirm]");
    ask.addEventListener("keydown", (e) => {
      if (e.key === "Escape") {
        e.stopPropagation(); // closes the question; it cancels no reply
        this.askDelete(false);
      }
    });
    document.addEventListener("keydown", (e) => {
      if (e.key === "Escape" && this.canCancel()) {
        e.preventDefault();
        this.requestCancel();
      }
    });
    this.root.addEventListener("click", (e) => {
      const target = (e.target as HTMLElement).closest<HTMLElement>("[data-action]");
      if (target) void this.action(target.dataset.action ?? "", target);
    });
    void this.loadCheckpoints();
    void this.loadOperations();
    this.socket.connect();
  }

  // ---- server state ----

  private applySnapshot(snap: Snapshot): void {
    this.s = applySnapshot(this.s, snap, this.intended);
    this.watchPlace();
    this.render();
  }

  // intended: the user pressed Cancel on runID in this tab (cancel.ts).
  private readonly intended = (runID: string): boolean => this.cancels.state(runID) !== null;

  private resubscribe(): void {
    if (this.gone) return;
    this.socket
      .send({ type: "subscribe", thread_id: this.threadID, after_seq: this.s.lastSeq })
      .then(() => {
        this.subscribed = true;
        this.render();
      })
      .catch((err: unknown) => {
        // Deleted while this tab was away: the server no longer knows it.
        if (err instanceof CommandError && err.code === "not_found") return this.markGone();
        this.show(`Could not follow this conversation: ${(err as Error).message}`, { offline: !(err instanceof CommandError) });
      });
  }

  // markGone shows that the conversation no longer exists: nothing can be
  // sent, what was typed stays (with a way to take it to a new one), and
  // the list forgets it.
  private markGone(): void {
    if (this.gone) return;
    this.gone = "elsewhere";
    this.subscribed = false;
    this.s.run = null;
    this.s.streamed = null;
    this.watchPlace();
    document.querySelector(`[data-testid=thread-link][href="/t/${CSS.escape(this.threadID)}"]`)?.closest("li")?.remove();
    groupByDay(document.querySelector<HTMLElement>("[data-testid=thread-list]") ?? document.createElement("ul"));
    this.socket.send({ type: "unsubscribe", thread_id: this.threadID }).catch(() => {});
    this.showGone();
    this.render();
    this.input.focus();
  }

  private showGone(): void {
    this.show("This conversation was deleted (in another tab or by a program), so nothing more can be sent here. What you typed stays in the box: copy it, or start a new conversation with it.", { tone: "info" });
  }

  private onEvent(ev: ServerEvent): void {
    const { state, effects } = applyEvent(this.s, ev, this.intended);
    if (state === this.s) return; // another thread's, or already applied
    this.s = state;
    let drawn = false;
    for (const e of effects) {
      switch (e.kind) {
        case "snapshot":
          this.watchPlace();
          this.render();
          drawn = true;
          void this.loadCheckpoints();
          void this.loadOperations();
          break;
        case "gone":
          if (this.gone !== "here") this.markGone();
          return;
        case "refresh_title":
          void this.refreshTitle();
          break;
        case "ask_place": {
          // (The ack of this tab's own run.start came before this event,
          // and is read by now.)
          const runID = e.runID;
          window.setTimeout(() => void this.askPlace(runID), 0);
          break;
        }
        case "resync":
          this.resync();
          break;
        case "checkpoint_created":
          if (!this.tree.hidden) void this.loadCheckpoints();
          break;
      }
    }
    if (drawn) return;
    this.watchPlace();
    this.renderSoon();
  }

  // tick keeps a render every second while a tool call runs (its elapsed
  // time), and stops it when none does.
  private tick(on: boolean): void {
    if (on && !this.ticker) this.ticker = window.setInterval(() => this.renderSoon(), 1000);
    if (!on && this.ticker) {
      window.clearInterval(this.ticker);
      this.ticker = 0;
    }
  }

  // renderSoon renders once in the next animation frame, however many
  // events arrive before it. Events change the state at once; the page is
  // drawn from it at most once a frame, because a render measures the page
  // (a layout) and a reply streamed at hundreds of deltas a second would
  // otherwise keep the browser laying out the page for every one of them
  // and fall seconds behind the stream.
  private renderSoon(): void {
    if (!this.frame) this.frame = window.requestAnimationFrame(() => this.render());
  }

  // resync asks for a fresh snapshot of the thread (a subscribe without
  // after_seq); events after it follow without gap or duplicate.
  private resync(): void {
    this.socket
      .send({ type: "subscribe", thread_id: this.threadID })
      .catch((err: unknown) => this.show(`Could not reload this conversation: ${(err as Error).message}`, { offline: !(err instanceof CommandError) }));
  }

  // opNow is an operation of a receipt as this tab knows it now.
  private opNow(o: OperationOutcome): OpNow {
    const op = this.s.operations.get(o.operation_id);
    return op ? opView(op, o.outcome) : o;
  }

  private onConn(s: ConnState, detail: string): void {
    this.conn.dataset.state = s;
    this.conn.textContent = s === "live" ? "Live" : s === "connecting" ? "Connecting…" : `Reconnecting (${detail})…`;
    if (s === "live") {
      // What the outage caused is over: no "not connected" next to "Live".
      if (this.noticeOffline) this.show("");
    } else {
      this.subscribed = false;
      // The socket is down: a kept cancel tries HTTP, which may still answer.
      if (s === "reconnecting") this.cancels.retry();
    }
    this.render();
  }

  // ---- admission: a run that waits for a free slot (admission.ts) ----

  // noteQueue takes what the server said of runID's place (state.ts).
  private noteQueue(runID: string, position: number): void {
    this.s = withQueuePosition(this.s, runID, position);
    this.watchPlace();
  }

  // watchPlace asks for the place of the run while it waits, and stops
  // asking once it does not (it started, it is being cancelled, it ended,
  // or the conversation is gone).
  private watchPlace(): void {
    if (place(this.s) > 0 && !this.gone) this.places.watch(this.s.waiting?.runID ?? "");
    else this.places.stop();
  }

  // askPlace asks once whether runID, started by another tab or a program,
  // waits for a slot.
  private async askPlace(runID: string): Promise<void> {
    if (this.acked.has(runID) || !this.s.run || this.s.run.id !== runID || this.s.run.status !== "queued" || this.s.waiting?.runID === runID) return;
    this.onPlace(runID, await fetchPlace(runID));
  }

  // onPlace applies an answer of GET /api/runs/{id} about the active run,
  // unless events moved on since it was asked (the run streams, or is
  // being cancelled: events tell the rest).
  private onPlace(runID: string, answer: RunPlace | null): void {
    if (!answer) return;
    const before = this.s;
    this.s = withRunPlace(this.s, runID, answer);
    if (this.s === before) return;
    this.watchPlace();
    // (Drawn again only when it changed: the live region is read out.)
    if (place(this.s) !== place(before) || this.s.run?.status !== "queued") this.renderSoon();
  }

  // checkHeld asks the server, once the run stopped, whether it holds the
  // streamed text as this tab shows it (seen.ts); the receipt offers to save
  // it only then.
  private checkHeld(s: Streamed): void {
    if (s.held || s.saved || !s.text || cardStart.test(s.text)) return;
    s.held = { state: "checking" };
    void askHeld(this.threadID, s.messageID, s.lastSeq, s.text).then((h) => {
      s.held = h;
      this.render();
    });
  }

  // canCancel: a run is active and this tab has not asked to cancel it yet
  // (or the server already recorded a cancel).
  private canCancel(): boolean {
    return this.s.run !== null && !cancelAccepted(this.s) && this.cancels.state(this.s.run.id) === null;
  }

  // onCancelAnswer shows the server's answer to a cancel the user pressed:
  // accepted (the receipt follows with run.cancelled), or why there was
  // nothing to cancel.
  private onCancelAnswer(intent: CancelIntent, a: CancelAnswer): void {
    const here = intent.thread_id === this.threadID;
    if (a.kind === "accepted") {
      if (here) this.s = withCancelAck(this.s, a.ack.run_id, a.ack.status);
      if (this.noticeOffline) this.show("");
    } else {
      const e = a.error;
      const where = here ? "" : " (in another conversation)";
      if (e.code === "run_not_active" && e.reply.status === "failed") {
        this.show(`The reply failed before your cancel reached the server${where}; nothing of it was published. Continue from the saved point when you are ready.`, { tone: "info" });
      } else if (e.code === "run_not_active") {
        this.show(
          `The reply finished before your cancel reached the server${where}, so it stays in the conversation. To go back to before it, open Checkpoints and fork from an earlier point.`,
          { tone: "info" },
        );
      } else if (e.code === "not_found") {
        this.show(`That reply is gone${where} (its conversation was deleted), so there was nothing left to cancel.`, { tone: "info" });
      } else {
        this.show(`The server refused the cancel: ${e.message} Reload the page; if the reply is still running, press Cancel again.`);
      }
    }
    // Without the socket no event brings the outcome: read it over HTTP.
    if (here && !this.subscribed) void this.followOverHTTP(intent.run_id);
    this.render();
  }

  // followOverHTTP shows the server's outcome of a cancel answered while the
  // socket is down: it reads the thread's snapshot until runID is no longer
  // its active run, then applies it (its last_run is the server's receipt).
  // Once the tab follows the thread again, events take over.
  private async followOverHTTP(runID: string): Promise<void> {
    if (this.following) return;
    this.following = true;
    try {
      for (let wait = 250; !this.subscribed; wait = Math.min(wait * 2, 2000)) {
        const snap = await this.fetchSnapshot();
        if (this.subscribed) return;
        if (snap && snap.last_seq >= this.s.lastSeq && snap.active_run?.run_id !== runID) {
          const shown = this.s.streamed && this.s.streamed.runID === runID ? this.s.streamed : null;
          this.applySnapshot(snap);
          // What this tab showed of the cancelled reply stays on screen as
          // discarded text (and can be saved), as after a run.cancelled.
          if (shown && !this.s.streamed && this.s.receipt?.runID === runID) {
            this.s.streamed = shown;
            this.render();
          }
          void this.loadCheckpoints();
          void this.loadOperations();
          return;
        }
        await new Promise((resolve) => setTimeout(resolve, wait));
      }
    } finally {
      this.following = false;
    }
  }

  private async fetchSnapshot(): Promise<Snapshot | null> {
    try {
      const r = await fetch(`/api/threads/${encodeURIComponent(this.threadID)}`, { credentials: "same-origin" });
      return r.ok ? ((await r.json()) as Snapshot) : null;
    } catch {
      return null; // not reachable either: the next try, or the socket, tells
    }
  }

  // loadCheckpoints fetches the checkpoints and shows them; it returns why
  // it could not ("" when it did, or when the page is going away). opening
  // says the panel is being opened (see treeOpening).
  private async loadCheckpoints(opening = false): Promise<string> {
    if (this.gone || this.s.closing) return "";
    this.treeLoads++;
    if (opening) this.treeOpening++;
    this.treeStatus("");
    let failed = "";
    try {
      const r = await fetch(`/api/threads/${encodeURIComponent(this.threadID)}/checkpoints`);
      if (!r.ok) {
        failed = `the server answered ${r.status}`;
        return failed;
      }
      const body = (await r.json()) as { head_checkpoint_id: string; checkpoints: Checkpoint[] };
      this.checkpoints = body.checkpoints;
      const head = body.checkpoints.find((c) => c.checkpoint_id === body.head_checkpoint_id);
      if (head && body.head_checkpoint_id === this.s.head) this.s.pendingStep = head.pending !== null && this.s.run === null;
      this.render();
      this.renderTree();
    } catch {
      // The tree is an aid; the conversation works without it.
      failed = "the server could not be reached";
    } finally {
      this.treeLoads--;
      if (opening) this.treeOpening--;
      this.treeStatus(failed);
    }
    return failed;
  }

  // treeStatus says above the timeline whether it is being brought up to
  // date (the panel being opened) or why the fetch that just ended failed
  // (and what to do); a fetch that succeeds clears it.
  private treeStatus(failed: string): void {
    const list = $(this.tree, "[data-testid=tree-list]");
    const status = $(this.tree, "[data-testid=tree-status]");
    list.setAttribute("aria-busy", String(this.treeLoads > 0));
    const opening = this.treeOpening > 0;
    if (opening) status.textContent = "Bringing the timeline up to date…";
    else if (failed) status.textContent = `Could not load the checkpoints (${failed}): what is shown may be out of date. Close and open Checkpoints to try again.`;
    else if (this.treeLoads > 0 && status.classList.contains("failed")) return; // a failure stays up until a fetch succeeds
    status.hidden = !opening && !failed;
    status.classList.toggle("failed", !opening && failed !== "");
  }

  // refreshTitle picks up the name the server gives a conversation: from
  // its first request, then the model's (titles are labels: no event
  // carries them). A title being edited in the box is left alone.
  private async refreshTitle(): Promise<void> {
    const input = this.root.querySelector<HTMLInputElement>("[data-testid=title-input]");
    if (!input || document.activeElement === input || this.gone || this.s.closing) return;
    try {
      const r = await fetch(`/api/threads/${encodeURIComponent(this.threadID)}`);
      if (!r.ok) return;
      const { title } = (await r.json()) as { title: string };
      if (!title || title === input.value) return;
      input.value = title;
      this.heading.textContent = title;
      document.title = `${title} · gateway`;
      const link = document.querySelector<HTMLAnchorElement>(`[data-testid=thread-link][href="/t/${CSS.escape(this.threadID)}"]`);
      if (link) {
        link.title = title;
        // (the title's own span: a fork keeps its badge)
        const span = link.querySelector<HTMLElement>("[data-testid=thread-title]");
        if (span) span.lastChild?.replaceWith(title);
        else link.textContent = title;
      }
    } catch {
      // A label only; the next page load shows it.
    }
  }

  private async loadOperations(): Promise<void> {
    if (this.gone || this.s.closing) return;
    try {
      const r = await fetch(`/api/threads/${encodeURIComponent(this.threadID)}/operations`);
      if (!r.ok) return;
      const body = (await r.json()) as { operations: Operation[] };
      this.s = withOperationLog(this.s, body.operations);
      this.render();
    } catch {
      // The log is an aid; events keep it current once connected.
    }
  }

  // ---- commands ----

  private async submit(): Promise<void> {
    if (this.gone) {
      this.showGone();
      this.render();
      return;
    }
    const text = this.input.value.trim();
    if (text && this.s.run) {
      this.show("Wait for the reply to finish, or cancel it (Cancel or Esc): your text stays here.", { tone: "info" });
      this.noticeBusy = true;
      return;
    }
    if (!text) return;
    if (!this.subscribed) {
      // Not silently nothing: the text stays, and the page says why.
      this.show("Not connected, so nothing was sent: your text stays here. Send it once the page says Live again.", { tone: "info", offline: true });
      return;
    }
    const cmd: Record<string, unknown> = {
      type: "run.start",
      thread_id: this.threadID,
      expected_state_version: this.s.stateVersion,
      user_message: text,
    };
    if (this.editing) cmd.resume_from_checkpoint_id = this.editing.resumeFrom;
    if (await this.startRun(cmd)) {
      this.input.value = "";
      saveDraft(this.threadID, "");
      this.editing = null;
      scrollToLatest(); // to the request just sent, and the reply under it
    }
  }

  // requestCancel is the Cancel button and Esc: the cancel is kept until
  // the server answers it, whatever the connection does meanwhile.
  private requestCancel(): void {
    if (!this.s.run || !this.canCancel()) return;
    this.cancels.request(this.s.run.id, this.threadID);
  }

  private async action(name: string, target: HTMLElement): Promise<void> {
    switch (name) {
      case "cancel":
        return this.requestCancel();
      case "continue":
        await this.startRun({ type: "run.start", thread_id: this.threadID, expected_state_version: this.s.stateVersion });
        return;
      case "edit": {
        const lastUser = [...this.s.messages].reverse().find((m) => m.role === "user");
        // The tree is only refreshed while it is open, so the checkpoint of
        // a request sent since the page loaded may not be known yet.
        if (lastUser && !this.checkpoints.some((c) => c.checkpoint_id === lastUser.checkpoint_id)) {
          const failed = await this.loadCheckpoints();
          if (failed) {
            this.show(`Could not load where your request was saved (${failed}), so it cannot be edited yet: press “Edit the request and continue” again in a moment.`);
            return;
          }
        }
        const cp = lastUser && this.checkpoints.find((c) => c.checkpoint_id === lastUser.checkpoint_id);
        if (!lastUser || !cp || !cp.parent_checkpoint_id) {
          this.show("There is no request to edit here: write a new message instead.");
          return;
        }
        // What an earlier action went wrong with is past (a lost connection's
        // notice stays until the connection is back).
        if (!this.noticeOffline) this.show("");
        this.editing = { resumeFrom: cp.parent_checkpoint_id };
        this.input.value = lastUser.content;
        this.input.focus();
        this.render();
        return;
      }
      case "stop-edit":
        this.editing = null;
        this.input.value = "";
        this.render();
        return;
      case "fork":
        return this.fork(this.s.head);
      case "fork-at":
        return this.fork(target.dataset.checkpointId ?? "");
      case "checkout":
        if (!target.dataset.checkpointId) return;
        await this.command({ type: "thread.checkout", thread_id: this.threadID, checkpoint_id: target.dataset.checkpointId, expected_state_version: this.s.stateVersion });
        return;
      case "fork-seen":
        return this.fork(this.conflictFrom ?? this.s.head);
      case "delete-thread":
        this.askDelete(true);
        return;
      case "delete-thread-keep":
        this.askDelete(false);
        return;
      case "delete-thread-confirm":
        return this.deleteThread();
      case "start-with-text": {
        // A new conversation with what was typed here (its box gets it).
        const text = this.input.value;
        const r = await fetch("/api/threads", { method: "POST", headers: { "Content-Type": "application/json" }, body: "{}", credentials: "same-origin" });
        if (!r.ok) {
          this.show("Could not start a new conversation: reload the page and try again (your text is still in the box).");
          return;
        }
        const snap = (await r.json()) as { thread_id: string };
        if (text.trim()) saveDraft(snap.thread_id, text);
        saveDraft(this.threadID, "");
        location.assign(`/t/${encodeURIComponent(snap.thread_id)}`);
        return;
      }
      case "save-fragment": {
        const s = this.s.streamed;
        if (!s) return;
        const ok = await this.command({
          type: "fragment.save",
          thread_id: this.threadID,
          message_id: s.messageID,
          last_seq: s.lastSeq,
          expected_state_version: this.s.stateVersion,
        });
        if (ok) s.saved = true;
        this.render();
        return;
      }
      case "confirm-op":
      case "reject-op":
        await this.command({
          type: name === "confirm-op" ? "tool.confirm" : "tool.reject",
          operation_id: target.dataset.operationId,
          expected_state_version: this.s.stateVersion,
        });
        return;
      case "delete-draft":
        // Asks first: a deleted fragment is gone for good.
        this.deleting = target.dataset.messageId ?? null;
        this.render();
        this.list.querySelector<HTMLElement>("[data-testid=delete-draft-confirm]")?.focus();
        return;
      case "delete-draft-keep":
        this.deleting = null;
        this.render();
        return;
      case "delete-draft-confirm":
        this.deleting = null;
        await this.command({
          type: "draft.delete",
          thread_id: this.threadID,
          message_id: target.dataset.messageId,
          expected_state_version: this.s.stateVersion,
        });
        this.render();
        return;
      case "show-earlier":
        return this.showEarlier();
      case "show-whole":
        return this.showWhole(target.dataset.messageId ?? "");
      case "reload":
        this.conflictFrom = null;
        this.banner.hidden = true;
        this.resync();
        return;
      case "toggle-tree": {
        this.tree.hidden = !this.tree.hidden;
        target.setAttribute("aria-expanded", String(!this.tree.hidden));
        if (!this.tree.hidden) {
          // Opened in view, with the focus in it, below the header (which
          // stays at the top, as tall as its tools make it).
          const head = this.root.querySelector<HTMLElement>(".thread-head");
          this.tree.style.scrollMarginTop = `${(head?.offsetHeight ?? 0) + 12}px`;
          this.tree.scrollIntoView({ block: "start" });
          $(this.tree, "h2").focus();
          await this.loadCheckpoints(true);
        }
        return;
      }
    }
  }

  // askDelete opens (or closes) the question before a delete, with the
  // focus on the answer that keeps the conversation.
  private askDelete(open: boolean): void {
    const panel = $(this.root, "[data-testid=delete-confirm]");
    const toggle = $(this.root, "[data-testid=delete-thread]");
    panel.hidden = !open;
    toggle.setAttribute("aria-expanded", String(open));
    if (open) {
      // (in the header, which stays at the top of the window)
      $(panel, "[data-testid=delete-thread-keep]").focus();
    } else {
      toggle.focus();
    }
  }

  // deleteThread sends thread.delete and, once the server confirms it,
  // leaves for the list. A reply in flight is stopped first by the server
  // (its receipt reaches the tabs still on it), which can take a moment.
  private async deleteThread(): Promise<void> {
    if (this.deletingThread) return;
    const panel = $(this.root, "[data-testid=delete-confirm]");
    const confirm = $<HTMLButtonElement>(panel, "[data-testid=delete-thread-confirm]");
    this.deletingThread = true;
    confirm.disabled = true;
    confirm.textContent = this.s.run ? "Stopping the reply, then deleting…" : "Deleting…";
    try {
      await this.socket.send({ type: "thread.delete", thread_id: this.threadID, expected_state_version: this.s.stateVersion });
      this.gone = "here";
      saveDraft(this.threadID, "");
      location.assign("/");
    } catch (err) {
      this.deletingThread = false;
      confirm.disabled = false;
      confirm.textContent = "Delete conversation";
      if (err instanceof CommandError && err.code === "state_version_conflict") {
        // The conversation changed since this tab saw it: look first.
        panel.hidden = true;
        $(this.root, "[data-testid=delete-thread]").setAttribute("aria-expanded", "false");
        this.conflictFrom = null;
        this.banner.hidden = false;
        $(this.banner, "[data-action=fork-seen]").hidden = true;
        this.render();
      } else if (err instanceof CommandError && err.code === "not_found") {
        panel.hidden = true;
        this.markGone();
      } else {
        this.show(`Could not delete the conversation: ${(err as Error).message}`, { offline: !(err instanceof CommandError) });
      }
    }
  }

  private async fork(from: string): Promise<void> {
    try {
      const ack = await this.socket.send({ type: "thread.fork", thread_id: this.threadID, from_checkpoint_id: from });
      // What was typed here goes along to the fork.
      if (this.input.value.trim()) saveDraft(String(ack.new_thread_id), this.input.value);
      location.assign(`/t/${encodeURIComponent(String(ack.new_thread_id))}`);
    } catch (err) {
      this.show(`Could not fork: ${(err as Error).message}`, { offline: !(err instanceof CommandError) });
    }
  }

  // startRun sends run.start and reads from its ack whether the run waits
  // for a free slot; it reports success.
  private async startRun(cmd: Record<string, unknown>): Promise<boolean> {
    const ack = await this.command(cmd);
    if (!ack) return false;
    if (typeof ack.run_id === "string") {
      this.acked.add(ack.run_id);
      this.noteQueue(ack.run_id, queuePosition(ack.queue_position));
      this.renderSoon();
    }
    return true;
  }

  // command sends one command and shows its error; it answers the ack, or
  // null when the command failed.
  private async command(cmd: Record<string, unknown>): Promise<Record<string, unknown> | null> {
    try {
      const ack = await this.socket.send(cmd);
      this.show("");
      return ack;
    } catch (err) {
      if (err instanceof CommandError && err.code === "state_version_conflict") {
        const fork = (err.reply.allowed_actions ?? []).find((a) => a.startsWith("fork_from_"));
        this.conflictFrom = fork ? fork.slice("fork_from_".length) : null;
        this.banner.hidden = false;
        $(this.banner, "[data-action=fork-seen]").hidden = this.conflictFrom === null;
      } else {
        this.show((err as Error).message, { offline: !(err instanceof CommandError) });
      }
      this.render();
      return null;
    }
  }

  // show puts text in the notice next to the composer ("" hides it). tone
  // info is an outcome to know, error something that went wrong; offline
  // marks what the lost connection caused, cleared once it is back.
  private show(text: string, { tone = "error", offline = false }: { tone?: "error" | "info"; offline?: boolean } = {}): void {
    // A sentence, also when it is an error's message ("not connected: …").
    this.notice.textContent = text.charAt(0).toUpperCase() + text.slice(1);
    this.notice.dataset.tone = tone;
    this.notice.hidden = text === "";
    this.noticeOffline = offline && text !== "";
  }

  // ---- rendering ----

  private render(): void {
    if (this.frame) window.cancelAnimationFrame(this.frame);
    this.frame = 0;
    const atBottom = window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 80;
    this.renderMessages();
    this.renderEarlier();
    this.renderToolSteps();
    this.renderLive();
    this.renderOperations();
    if (atBottom) scrollToLatest();
    // "Wait … or cancel it" holds while the reply streams and
    // this tab has not asked to cancel it.
    if (this.noticeBusy && (!this.s.run || !this.canCancel())) {
      this.noticeBusy = false;
      if (this.notice.dataset.tone === "info") this.show("");
    }
    this.renderJump();
    this.renderCancelPending();
    const busy = this.s.run !== null;
    const mine = this.s.run ? this.cancels.state(this.s.run.id) : null;
    this.send.hidden = busy;
    this.send.disabled = !this.subscribed || this.gone !== "";
    this.renderGone();
    this.cancel.hidden = !busy;
    this.cancel.disabled = !this.canCancel();
    this.cancel.textContent = cancelAccepted(this.s) || mine === "sending" ? "Cancelling…" : mine === "kept" ? "Cancel pending" : "Cancel";
    this.socket.urgent = this.cancels.any();
    this.input.placeholder = this.editing ? "Edit your request; sending starts a new branch from before it" : "Ask something…";
    this.root.dataset.stateVersion = String(this.s.stateVersion);
    this.root.dataset.lastSeq = String(this.s.lastSeq);
    this.root.dataset.runStatus = this.s.run ? this.s.run.status : this.s.receipt ? "cancelled" : this.s.failure ? "failed" : "idle";
    this.root.dataset.cancel = mine ?? "";
  }

  // renderGone takes away what a deleted conversation can no longer do, and
  // offers to take the typed text to a new one.
  private renderGone(): void {
    const gone = this.gone === "elsewhere";
    this.root.dataset.gone = this.gone;
    for (const sel of ["[data-testid=delete-thread]", "[data-testid=tree-toggle]"]) {
      const b = this.root.querySelector<HTMLElement>(sel);
      if (b) b.hidden = gone;
    }
    let start = this.notice.querySelector<HTMLButtonElement>("[data-action=start-with-text]");
    if (gone && !start) {
      const actions = el("div", { class: "actions" });
      start = button("New conversation with my text", "start-with-text", "start-with-text");
      const home = el("a", { class: "btn", href: "/", "data-testid": "go-home" }, "Back to the list");
      actions.append(start, home);
      this.notice.append(actions);
    }
  }

  // renderCancelPending says, next to the composer, that a cancel the user
  // pressed has not reached the server yet. While live, an attempt in flight
  // shows on the button ("Cancelling…") only.
  private renderCancelPending(): void {
    const kept = this.cancels.keptFor(this.threadID);
    const live = this.socket.live;
    let text = "";
    let hint = "";
    if (kept.length > 0 && !live) {
      text = "Cancel will be sent when the connection is back.";
      hint = "Keep this tab open; reloading it is fine. If the reply finishes first, the page says so.";
    } else if (kept.some((i) => this.cancels.state(i.run_id) === "kept")) {
      text = "Your cancel is not recorded yet.";
      hint = "It is sent again by itself; keep this tab open.";
    }
    const want = text + hint;
    if (this.cancelPending.dataset.text === want) return;
    this.cancelPending.dataset.text = want;
    this.cancelPending.hidden = text === "";
    this.cancelPending.replaceChildren(el("strong", {}, text), " ", el("span", { class: "hint" }, hint));
  }

  // renderJump shows "Jump to latest" while the latest message is out of
  // view below.
  private renderJump(): void {
    const below = document.documentElement.scrollHeight - (window.innerHeight + window.scrollY);
    this.jump.hidden = below < 160;
  }

  private renderMessages(): void {
    // The list is rebuilt when its messages change, which fragment's
    // deletion is being asked about (its buttons change), or the versions
    // a message can be switched to.
    const branches = this.branches();
    const nav = [...branches].map(([id, b]) => `${id}:${b.index}/${b.count}`).join(",");
    const want = this.s.messages.map((m) => m.message_id).join(",") + `|${this.deleting ?? ""}|${nav}|${this.s.run ? "busy" : ""}`;
    if (this.list.dataset.ids === want) return;
    this.list.dataset.ids = want;
    this.list.replaceChildren(...this.s.messages.map((m) => this.messageItem(m, branches.get(m.message_id))));
  }

  // branches finds, for each message of the history shown, the other
  // versions of it: a request before or after it was edited, a reply
  // before or after it was regenerated. A checkpoint that agrees with the
  // history up to position p and holds another message at p is a version
  // of the message at p, unless it is an ancestor of the head (a point
  // before a fragment was deleted differs from the history the same way).
  // Versions are numbered in the order they were first written; switching
  // to one moves the head to the newest checkpoint holding it there (the
  // latest state of that branch).
  private branches(): Map<string, Branch> {
    const out = new Map<string, Branch>();
    const hist = historyIDs(this.s.messages, this.s.earlier, this.checkpoints.find((c) => c.checkpoint_id === this.s.head));
    if (hist.length === 0 || this.checkpoints.length === 0) return out;
    const byID = new Map(this.checkpoints.map((c) => [c.checkpoint_id, c]));
    const ancestors = new Set<string>();
    let at = byID.get(this.s.head) ?? byID.get(this.s.messages[this.s.messages.length - 1].checkpoint_id);
    while (at && !ancestors.has(at.checkpoint_id)) {
      ancestors.add(at.checkpoint_id);
      at = at.parent_checkpoint_id ? byID.get(at.parent_checkpoint_id) : undefined;
    }
    // versions[p]: message id → the newest checkpoint holding it at p ("" for
    // the one shown), in the order the ids first appeared.
    const versions = hist.map(() => new Map<string, string>());
    for (const c of this.checkpoints) {
      const ids = c.message_ids;
      let same = 0;
      while (same < ids.length && same < hist.length && ids[same] === hist[same]) {
        if (!versions[same].has(hist[same])) versions[same].set(hist[same], "");
        same++;
      }
      if (same < ids.length && same < hist.length && !ancestors.has(c.checkpoint_id)) versions[same].set(ids[same], c.checkpoint_id);
    }
    versions.forEach((v, p) => {
      if (v.size < 2) return;
      const order = [...v.keys()];
      const i = order.indexOf(hist[p]);
      out.set(hist[p], { index: i + 1, count: order.length, prev: i > 0 ? v.get(order[i - 1]) : undefined, next: i + 1 < order.length ? v.get(order[i + 1]) : undefined });
    });
    return out;
  }

  // branchNav is "‹ 2/3 ›" on a message that has other versions.
  private branchNav(b: Branch): HTMLElement {
    const prev = button("‹", "checkout", "branch-prev", "btn ghost small");
    const next = button("›", "checkout", "branch-next", "btn ghost small");
    prev.setAttribute("aria-label", "Previous version");
    next.setAttribute("aria-label", "Next version");
    for (const [btn, target] of [[prev, b.prev], [next, b.next]] as const) {
      if (target) btn.dataset.checkpointId = target;
      btn.disabled = !target || this.s.run !== null;
      if (target && this.s.run !== null) btn.title = "Wait for the reply to finish, or cancel it, to switch versions";
    }
    return el(
      "span",
      { class: "branch-nav", "data-testid": "branch-nav", role: "group", "aria-label": `Version ${b.index} of ${b.count}` },
      prev,
      el("span", { class: "branch-pos", "data-testid": "branch-pos", "aria-hidden": "true" }, `${b.index}/${b.count}`),
      next,
    );
  }

  private messageItem(m: Message, branch?: Branch): HTMLLIElement {
    const li = el("li", {
      class: `msg role-${m.role} kind-${m.kind}`,
      "data-testid": "message",
      "data-message-id": m.message_id,
      "data-role": m.role,
      "data-kind": m.kind,
    });
    li.append(el("span", { class: "visually-hidden", "data-testid": "speaker" }, speaker(m.role)));
    if (m.kind === "fragment") li.append(el("div", { class: "label", "data-testid": "fragment-label" }, "Saved fragment"));
    if (m.role === "tool") {
      const { node, operationID } = toolResult(m.content);
      li.append(node);
      if (operationID) {
        li.dataset.operationId = operationID;
        li.append(el("p", { class: "tool-status", "data-testid": "tool-status", "data-operation-id": operationID, role: "status", hidden: "" }));
      }
    } else if (m.kind === "card") {
      li.append(renderCard(m.content));
    } else if (m.role === "assistant") {
      // Replies and fragments are Markdown; the user's own text is shown
      // as typed.
      li.append(...this.replyBody(m));
    } else {
      li.append(el("div", { class: "body", "data-testid": "message-body" }, m.content));
    }
    const when = new Date(m.created_at);
    const meta = el(
      "span",
      { class: "meta", "data-testid": "message-meta" },
      el("time", { datetime: m.created_at, title: when.toLocaleString() }, when.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })),
      ...(m.model ? [` · ${m.model}`] : []),
    );
    const nav = branch ? [this.branchNav(branch)] : [];
    if (m.role !== "assistant" || m.kind === "card") li.append(el("div", { class: "msg-meta" }, ...nav, meta));
    if (m.role === "assistant" && m.kind !== "card") {
      const actions = el("div", { class: "msg-actions" }, ...nav, meta, copyButton("Copy", () => m.content));
      if (m.kind === "fragment" && this.deleting === m.message_id) {
        const yes = button("Delete for good", "delete-draft-confirm", "delete-draft-confirm", "btn danger small");
        yes.dataset.messageId = m.message_id;
        actions.append(el("span", { class: "hint", role: "status" }, "Delete this saved fragment? It cannot be undone."), yes, button("Keep it", "delete-draft-keep", "delete-draft-keep", "btn ghost small"));
      } else if (m.kind === "fragment") {
        const del = button("Delete fragment", "delete-draft", "delete-draft", "btn ghost small");
        del.dataset.messageId = m.message_id;
        actions.append(del);
      }
      li.append(actions);
    }
    return li;
  }

  // ---- a long conversation, shown in part (history.ts) ----

  // renderEarlier offers the messages before those shown.
  private renderEarlier(): void {
    this.earlierBox.hidden = this.s.earlier === 0;
    if (!this.loadingEarlier) $(this.earlierBox, "[data-testid=show-earlier]").textContent = earlierLabel(this.s.earlier);
  }

  // showEarlier brings in the page of the history before the messages
  // shown, and keeps in view the message the user was reading.
  private async showEarlier(): Promise<void> {
    const first = this.s.messages[0];
    if (!first || this.s.earlier === 0 || this.loadingEarlier) return;
    const button = $<HTMLButtonElement>(this.earlierBox, "[data-testid=show-earlier]");
    const status = $(this.earlierBox, "[data-testid=earlier-status]");
    this.loadingEarlier = true;
    button.disabled = true;
    status.textContent = "Loading earlier messages…";
    try {
      const page = await fetchEarlier(this.threadID, first.message_id);
      status.textContent = "";
      if (page.head_checkpoint_id !== this.s.head || this.s.messages[0] !== first) {
        this.resync(); // the history changed meanwhile: read it again
        return;
      }
      const was = this.list.querySelector(`[data-message-id="${CSS.escape(first.message_id)}"]`)?.getBoundingClientRect().top ?? 0;
      this.s.messages = [...page.messages, ...this.s.messages];
      this.s.earlier = page.next_before === null ? 0 : Math.max(this.s.earlier - page.messages.length, 1);
      this.render();
      const now = this.list.querySelector(`[data-message-id="${CSS.escape(first.message_id)}"]`)?.getBoundingClientRect().top ?? 0;
      window.scrollBy(0, now - was);
    } catch (err) {
      status.textContent = `Could not load the earlier messages (${(err as Error).message}): press the button to try again.`;
    } finally {
      this.loadingEarlier = false;
      button.disabled = false;
      this.renderEarlier();
    }
  }

  // showWhole shows the whole of a reply shown in part.
  private showWhole(id: string): void {
    const m = this.s.messages.find((x) => x.message_id === id);
    const li = this.list.querySelector<HTMLElement>(`[data-message-id="${CSS.escape(id)}"]`);
    if (!m || !li) return;
    this.expanded.add(id);
    const item = this.messageItem(m, this.branches().get(id));
    li.replaceWith(item);
    item.tabIndex = -1;
    item.focus({ preventScroll: true });
  }

  // replyBody is an assistant's reply as Markdown: of a long one only its
  // start (until shown whole), and a note when it was cut at the size limit.
  private replyBody(m: Message): HTMLElement[] {
    const { text, clipped } = this.expanded.has(m.message_id) ? { text: m.content, clipped: false } : clipUTF8(m.content, displayBytes);
    const body = el("div", { class: "body md", "data-testid": "message-body" });
    body.append(renderMarkdown(text));
    if (clipped) body.dataset.clipped = "true";
    return [body, ...(clipped ? [clippedNote(m)] : []), ...(m.truncated === "size_limit" ? [cutNote(m)] : [])];
  }

  // renderToolSteps says under each consequential call's result what became
  // of it now: the recorded result is what was known when it was recorded
  // (an unknown outcome may since have been confirmed, or given up on).
  private renderToolSteps(): void {
    for (const p of this.list.querySelectorAll<HTMLElement>("[data-testid=tool-status]")) {
      const op = this.s.operations.get(p.dataset.operationId ?? "");
      const line = op && op.contract === "consequential" ? stepLine(opView(op)) : null;
      const want = line ? `${line.state}:${op?.idempotency_key ?? ""}:${JSON.stringify(op?.preview ?? null)}` : "";
      if (p.dataset.shown === want) continue;
      p.dataset.shown = want;
      p.dataset.state = line?.state ?? "";
      p.hidden = line === null;
      p.replaceChildren(...(line ? lineParts(line) : []));
    }
  }

  private renderLive(): void {
    const parts: Node[] = [];
    const s = this.s.streamed;
    if (s && !s.saved) {
      const streaming = this.s.run !== null && this.s.run.id === s.runID;
      const mine = this.cancels.state(s.runID);
      const chip = streaming
        ? cancelAccepted(this.s) || mine === "sending"
          ? el("span", { class: "chip warn", "data-testid": "run-chip" }, "Cancelling…")
          : mine === "kept"
          ? el("span", { class: "chip warn", "data-testid": "run-chip" }, "Cancel pending · not saved yet")
          : el("span", { class: "chip live", "data-testid": "run-chip" }, s.restarted ? "Interrupted, starting over · not saved yet" : "Streaming · not saved yet")
        : canSave(s.held)
          ? el("span", { class: "chip muted", "data-testid": "run-chip" }, "Discarded · not part of the conversation")
          : el("span", { class: "chip warn", "data-testid": "run-chip" }, "Not saved by the server · only on your screen");
      parts.push(
        el(
          "div",
          { class: `msg role-assistant provisional${streaming ? "" : canSave(s.held) ? " discarded" : " unsaved"}`, "data-testid": "streaming", "aria-busy": String(streaming) },
          chip,
          this.liveMarkdown(s, streaming),
        ),
      );
    } else if (this.s.run && place(this.s) > 0) {
      // Waiting for a free slot is a state of its own, not a reply being
      // written: no pulse, and what it means in words.
      parts.push(waitingBox(place(this.s)));
      this.tick(false);
    } else if (this.s.run) {
      const runID = this.s.run.id;
      const calling = [...this.s.operations.values()].find((op) => op.run_id === runID && (op.phase === "running" || op.phase === "committing"));
      // After a cancel the call in flight stays in view with what the run
      // waits for: a call that cannot be recalled is not hidden.
      const cancelling = cancelAccepted(this.s);
      const showCall = calling && (cancelling || this.s.run.status === "running");
      const label = cancelling
        ? "Cancelling…"
        : this.s.run.status === "queued"
          ? "Starting…"
          : this.s.run.status === "waiting_confirmation"
            ? "Waiting for your confirmation"
            : calling
              ? callingLabel(calling)
              : "Working…";
      const box = el("div", { class: "msg role-assistant provisional", "data-testid": "streaming", "aria-busy": "true" }, el("span", { class: "chip live", "data-testid": "run-chip" }, label));
      if (showCall && calling) box.append(toolProgress(calling, label));
      if (cancelling && calling) box.append(el("p", { class: "hint", "data-testid": "cancel-waits" }, cancelWaitsFor(calling)));
      this.tick(showCall === true);
      parts.push(box);
    } else {
      this.tick(false);
    }
    for (const op of this.s.operations.values()) {
      if (op.phase === "prepared" && this.s.run && this.s.run.id === op.run_id) parts.push(this.confirmCard(op));
    }
    if (this.s.receipt) {
      if (s && s.runID === this.s.receipt.runID) this.checkHeld(s);
      parts.push(this.receiptCard(this.s.receipt));
    }
    if (this.s.failure) {
      parts.push(
        el(
          "div",
          { class: "card-box error", "data-testid": "failure", role: "alert" },
          el("strong", {}, "The reply failed. "),
          this.s.failure,
          el("div", { class: "actions" }, button("Continue from the saved point", "continue", "action-continue", "btn primary")),
        ),
      );
    } else if (!this.s.receipt && !this.s.run && this.s.pendingStep) {
      parts.push(
        el(
          "div",
          { class: "card-box", "data-testid": "pending" },
          "The last reply was not finished. ",
          el("div", { class: "actions" }, button("Continue from the saved point", "continue", "action-continue", "btn primary")),
        ),
      );
    }
    if (this.editing) {
      parts.push(el("div", { class: "card-box", "data-testid": "editing" }, "Editing your last request: sending it starts a new branch from before it. ", button("Stop editing", "stop-edit", "action-stop-edit", "btn ghost small")));
    }
    this.live.replaceChildren(...parts);
    // A receipt or a card that asks for a decision is brought into view
    // once, above the composer (app.css: scroll-margin-bottom), however far
    // up the reader was: it is what the user has to read or answer now.
    const ask = this.live.querySelector<HTMLElement>("[data-testid=receipt], [data-testid=confirm-card]");
    const key = ask ? `${ask.dataset.testid}:${this.s.receipt?.runID ?? ask.dataset.operationId ?? ""}` : "";
    if (ask && key !== this.shownAsk) ask.scrollIntoView({ block: "end" });
    this.shownAsk = key;
  }

  // liveMarkdown is the streamed message's body, kept across renders (it
  // renders at most once per frame while streaming; at once when the
  // stream has stopped, so a save takes what is on screen).
  private liveMarkdown(s: Streamed, streaming: boolean): HTMLElement {
    if (cardStart.test(s.text)) {
      // A card is one JSON document, readable only once whole (then it is
      // shown as what it is, an order and its items): while it streams,
      // say what is coming and how far it got instead of raw JSON.
      const n = [...s.text].length;
      return el(
        "div",
        { class: "body card-pending", "data-testid": "streaming-text", "data-card": "pending" },
        el("span", { class: "card-pending-what" }, streaming ? "Preparing a card…" : "An unfinished card:"),
        " ",
        el("span", { class: "hint" }, streaming ? `${n} characters so far` : `${n} characters, never complete, so not shown`),
      );
    }
    if (!this.liveBody || this.liveBody.messageID !== s.messageID) {
      this.liveBody = { messageID: s.messageID, view: new LiveMarkdown({ class: "body md", "data-testid": "streaming-text" }) };
    }
    const v = this.liveBody.view;
    v.set(s.text);
    if (!streaming) v.flush();
    return v.el;
  }

  private confirmCard(op: Operation): HTMLElement {
    const p = (op.preview ?? {}) as Record<string, unknown>;
    const rows: Node[] = [];
    for (const [k, v] of Object.entries(p)) {
      // Structured values (an MCP call's arguments) are shown as indented
      // JSON, so a user can read what exactly will be sent.
      const shown = typeof v === "string" ? v : v !== null && typeof v === "object" ? el("pre", { class: "preview-json" }, JSON.stringify(v, null, 2)) : JSON.stringify(v);
      rows.push(el("dt", {}, k), el("dd", { "data-testid": `preview-${k}` }, shown));
    }
    const confirm = button(op.tool === "send_email" ? "Confirm and send" : "Confirm and run", "confirm-op", "confirm-op", "btn primary");
    const reject = button("Reject", "reject-op", "reject-op");
    confirm.dataset.operationId = op.operation_id;
    reject.dataset.operationId = op.operation_id;
    return el(
      "div",
      { class: "card-box confirm", "data-testid": "confirm-card", "data-operation-id": op.operation_id, role: "group", "aria-label": `Confirm ${op.tool}` },
      el("h3", {}, `${op.tool}: waiting for your confirmation`),
      el("p", { class: "hint" }, "Nothing has been sent. It happens only if you confirm, once."),
      el("dl", {}, ...rows),
      el("div", { class: "actions" }, confirm, reject),
    );
  }

  private renderOperations(): void {
    // render runs after every event, deltas included: rebuild the list
    // only when an operation changed.
    const want = [...this.s.operations.values()].map((op) => `${op.operation_id}:${op.phase}:${op.outcome ?? ""}:${op.updated_at}`).join(",");
    const list = $(this.opsPanel, ".ops-list");
    if (list.dataset.ops === want) return;
    list.dataset.ops = want;
    const ops = [...this.s.operations.values()].sort((a, b) => a.created_at.localeCompare(b.created_at));
    // The log is folded (its summary says how many calls): open, a long
    // one would stand between the latest message and the composer, where
    // a conversation opens.
    this.opsPanel.hidden = ops.length === 0;
    $(this.opsPanel, "[data-testid=operations-count]").textContent = ops.length === 1 ? "1 call" : `${ops.length} calls`;
    list.replaceChildren(...ops.map((op) => operationItem(op)));
  }

  // askExecuted asks the server, once, whether a worker ever took runID
  // up, and draws the receipt again with the answer (none: it stays the
  // ordinary receipt).
  private askExecuted(runID: string): void {
    if (this.askingExecuted.has(runID)) return;
    this.askingExecuted.add(runID);
    void fetchPlace(runID).then((place) => {
      if (place?.executed === undefined) return;
      this.s = withExecuted(this.s, runID, place.executed);
      if (!place.executed) this.renderSoon();
    });
  }

  private receiptCard(r: Receipt): HTMLElement {
    const excerpt = (m: Message): string => `“${snippet(this.plain(m), 140)}”`;
    const kept =
      r.kept === null
        ? "nothing: the conversation was empty"
        : r.kept.role === "user"
          ? `everything up to your request ${excerpt(r.kept)}`
          : `everything up to the reply ${excerpt(r.kept)}`;
    const ops =
      r.operations.length === 0
        ? el("li", {}, "No side effects: no tool had started.")
        : r.operations.map((o) => {
            const now = this.opNow(o);
            const line = receiptLine(now);
            return el(
              "li",
              { "data-testid": "receipt-operation", "data-operation-id": o.operation_id, "data-outcome": now.outcome, "data-state": line.state },
              el("strong", { class: "op-tool" }, toolName(o.tool)),
              ": ",
              ...lineParts(line),
            );
          });
    const actions = el("div", { class: "actions" }, button("Continue from the saved point", "continue", "action-continue", "btn primary"));
    if (this.s.messages.some((m) => m.role === "user")) actions.append(button("Edit the request and continue", "edit", "action-edit"));
    actions.append(button("Start a new branch", "fork", "action-fork"));
    // (An unfinished card was never shown as text: there is no visible
    // fragment to save.)
    const shown = this.s.streamed && this.s.streamed.runID === r.runID && this.s.streamed.text && !this.s.streamed.saved && !cardStart.test(this.s.streamed.text) ? this.s.streamed : null;
    if (shown && canSave(shown.held)) {
      const save = button("Save visible fragment", "save-fragment", "action-save-fragment");
      // (Enabled once the server said it holds the text as shown.)
      if (shown.held?.state === "checking") {
        save.disabled = true;
        save.setAttribute("aria-busy", "true");
      }
      actions.append(save);
    } else if (shown) {
      // The server does not hold it: the screen is the only copy.
      const copy = copyButton("Copy the text on screen", () => shown.text);
      copy.dataset.testid = "action-copy-unsaved";
      copy.classList.remove("ghost", "small");
      actions.append(copy);
    }
    // Who cancelled, when this tab saw the cancel recorded (a reload does
    // not know, and then says nothing about it).
    const mine = r.by === `tab:${this.socket.tabID}` || r.by === `api:${this.socket.tabID}`;
    const where = !r.by || mine ? "" : r.by.startsWith("tab:") ? " from another tab" : " elsewhere (another tab or client)";
    // A run cancelled before it ever ran: nothing streamed, discarded or
    // called, and the server says no worker ever took it up (in the
    // run.cancelled event, or, after a reload, asked once; until it
    // answers, the ordinary receipt).
    const quiet = r.discarded === 0 && r.operations.length === 0 && this.s.streamed?.runID !== r.runID;
    if (quiet && !this.s.executed.has(r.runID)) this.askExecuted(r.runID);
    const neverStarted = quiet && this.s.executed.get(r.runID) === false;
    // A cancel that deletes the conversation: nothing can continue here.
    const heading =
      this.s.closing || this.gone ? `Stopped${where}: the conversation is being deleted` : neverStarted ? `Cancelled${where} while waiting for a free slot` : `Cancelled${where}`;
    if (this.s.closing || this.gone) actions.replaceChildren();
    const saved = this.s.messages.find((m) => m.kind === "fragment" && m.fragment_of?.run_id === r.runID);
    const rows: Node[] = [el("dt", {}, "Kept"), el("dd", { "data-testid": "receipt-kept" }, kept)];
    const lost = shown ? notHeld(shown.held, [...shown.text].length) : "";
    if (r.discarded > 0 || saved || lost) {
      const what = r.discarded > 0 ? `${r.discarded} characters of unpublished text${lost ? " that the server kept" : ""}` : "the unpublished text";
      const more = saved
        ? `; the part you saw (${[...saved.content].length} characters) is kept in the conversation as a saved fragment`
        : lost
          ? `. ${lost}: copy it from your screen if you need it (this page holds the only copy)`
          : "";
      rows.push(el("dt", {}, "Discarded"), el("dd", { "data-testid": "receipt-discarded" }, what + more));
    }
    if (!neverStarted) rows.push(el("dt", {}, "Side effects"), el("dd", {}, el("ul", {}, ...(Array.isArray(ops) ? ops : [ops]))));
    return el(
      "div",
      { class: `card-box receipt${neverStarted ? " never-started" : ""}`, "data-testid": "receipt", role: "status" },
      el("h3", { "data-testid": "receipt-heading" }, heading),
      ...(neverStarted ? [el("p", { class: "receipt-lead", "data-testid": "receipt-never-started" }, neverStartedLine)] : []),
      el("dl", {}, ...rows),
      actions,
    );
  }

  // plain is a message as a reader sees it, as text: a reply without its
  // Markdown, a card and a tool step in words (kept per message: they do
  // not change).
  private plain(m: Message): string {
    let t = this.plainText.get(m.message_id);
    if (t === undefined) {
      t = m.role === "tool" ? toolText(m.content) : m.kind === "card" ? cardText(m.content) : m.role === "assistant" ? markdownText(m.content) : m.content;
      this.plainText.set(m.message_id, t);
    }
    return t;
  }

  // renderTree shows the checkpoints as a flat timeline, oldest first: when
  // each point was saved, the message it ends with, and whether it is the
  // current point, on the current branch or on another one. (Nesting by
  // parent made a long conversation a staircase wider than the page.)
  private renderTree(): void {
    const list = $(this.tree, "[data-testid=tree-list]");
    const byID = new Map(this.checkpoints.map((c) => [c.checkpoint_id, c]));
    const onBranch = new Set<string>();
    for (let c = byID.get(this.s.head); c; c = c.parent_checkpoint_id ? byID.get(c.parent_checkpoint_id) : undefined) {
      onBranch.add(c.checkpoint_id);
    }
    const known = new Map(this.s.messages.map((m) => [m.message_id, m]));
    const ordered = [...this.checkpoints].sort((a, b) => a.state_version - b.state_version);
    list.replaceChildren(
      ...ordered.map((c) => {
        const head = c.checkpoint_id === this.s.head;
        const last = c.message_ids.length ? known.get(c.message_ids[c.message_ids.length - 1]) : undefined;
        const what =
          c.message_ids.length === 0
            ? "The start: no messages yet"
            : last
              ? `${last.role === "user" ? "You" : last.role === "tool" ? "Tool result" : "Reply"}: ${snippet(this.plain(last))}`
              : `${c.message_ids.length} message${c.message_ids.length === 1 ? "" : "s"}`;
        const tags = [head ? "current" : onBranch.has(c.checkpoint_id) ? "" : "another branch", head && c.pending && c.pending.step === "generate" && c.message_ids.length ? "reply not finished" : ""].filter(Boolean);
        const fork = button("Fork here", "fork-at", "tree-fork", "btn ghost small");
        fork.dataset.checkpointId = c.checkpoint_id;
        return el(
          "li",
          {
            "data-testid": "tree-node",
            "data-checkpoint-id": c.checkpoint_id,
            "data-branch": head ? "current" : onBranch.has(c.checkpoint_id) ? "this" : "other",
            class: head ? "head" : onBranch.has(c.checkpoint_id) ? "" : "other",
          },
          el("time", { datetime: c.created_at, class: "when" }, new Date(c.created_at).toLocaleString([], { dateStyle: "short", timeStyle: "short" })),
          el("span", { class: "node", "data-testid": "tree-what" }, what),
          ...(tags.length ? [el("span", { class: "tags", "data-testid": "tree-tags" }, tags.join(" · "))] : []),
          fork,
        );
      }),
    );
  }
}

// speaker names who a message is from, for screen readers.
export function speaker(role: string): string {
  return role === "user" ? "You said:" : role === "tool" ? "Tool result:" : "Assistant said:";
}

