// ThreadView keeps one conversation page true to the server: it applies the
// thread's events in seq order, shows streamed text as provisional (never
// history), and offers after a cancel only what the server can honour.

import { Socket, type ConnState } from "./socket";
import { Cancels, refusalNotice, type CancelAnswer, type CancelIntent } from "./cancel";
import { checkHeld } from "./seen";
import { PlaceWatch, fetchPlace, queuePosition, type RunPlace } from "./admission";
import { $, JumpToLatest, scrollToLatest } from "./dom";
import { saveDraft } from "./drafts";
import { Composer, type SubmitKind } from "./composer";
import { QueueView } from "./queue";
import { showTitle } from "./title";
import { placeInterruptions } from "./receipt";
import { showOperationLog } from "./toolview";
import { groupByDay } from "./sidebar";
import { EarlierBox } from "./history";
import { ScrollBack } from "./scrollback";
import { DrawnItems, idsOf, itemKey, reconcile } from "./msglist";
import { createThread, readOperations, readSnapshot } from "./api";
import { Versions, type Branch } from "./versions";
import { Branching } from "./branching";
import { messageItem, showBusy, showToolSteps, type MessageView } from "./messages";
import { liveParts, StreamedBody, waitsForDecision, type LiveView } from "./live";
import { Timeline } from "./timeline";
import { DeletePanel } from "./deletepanel";
import { ConflictBanner, Notice, goneText, showCancelPending, type Tone } from "./notice";
import { CommandError, type HistoryPage, type ServerEvent, type Snapshot } from "./protocol";
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
  type ThreadState,
} from "./state";

export class ThreadView {
  private readonly threadID: string;
  // s is what this tab knows of the conversation from the server: the
  // reducers of state.ts replace it on every event and snapshot; a few
  // answers of HTTP reads change a field of it (a run's place, the
  // operation log, earlier history), which no event reports.
  private s: ThreadState;
  private readonly expanded = new Set<string>(); // long replies shown whole
  private readonly askingExecuted = new Set<string>();
  // acked: runs this tab started and read the run.start ack of (which said
  // whether they wait: no need to ask).
  private readonly acked = new Set<string>();
  private readonly places: PlaceWatch;
  private readonly liveBody = new StreamedBody();
  // frame is the animation frame renderSoon asked for (0: none pending);
  // ticker the interval that renders a running tool call's time (tick).
  private frame = 0;
  private ticker = 0;
  private deleting: string | null = null; // the fragment whose deletion waits for "Delete for good"
  private shownAsk = ""; // the receipt or confirmation card last brought into view
  private subscribed = false;
  // gone: the conversation was deleted — by this tab (it leaves for the
  // list), or elsewhere (another tab, a program): then nothing more can be
  // sent here, and the page says so and keeps what was typed.
  private gone: "" | "here" | "elsewhere" = "";
  private following = false; // reading snapshots over HTTP while the socket is down
  private readonly socket: Socket;
  private readonly cancels: Cancels;
  private readonly queue: QueueView; // the message queue, and what this tab queued

  private readonly list: HTMLOListElement;
  private readonly live: HTMLElement;
  private readonly composer: Composer;
  private readonly cancel: HTMLButtonElement;
  private readonly conn: HTMLElement;
  private readonly banner: ConflictBanner;
  private readonly notice: Notice;
  private readonly cancelPending: HTMLElement;
  private readonly timeline: Timeline;
  private readonly opsPanel: HTMLElement;
  private readonly jump: JumpToLatest;
  private readonly heading: HTMLElement;
  private readonly earlier: EarlierBox;
  private readonly drawn = new DrawnItems(); // the list's items, drawn again only when changed (msglist.ts)
  private readonly versionsOf = new Versions(); // the messages' versions, found again only when changed
  private listKey = ""; // what the list was last drawn from (renderMessages)
  private readonly deletion: DeletePanel;
  private readonly branching: Branching; // Edit, Regenerate and the moves between versions

  constructor(private readonly root: HTMLElement) {
    const snap = JSON.parse($(root, "#snapshot").textContent ?? "{}") as Snapshot;
    this.threadID = snap.thread_id;
    this.s = emptyState(snap.thread_id);
    this.list = $(root, "[data-testid=messages]");
    this.live = $(root, "[data-testid=live]");
    this.composer = new Composer(root, snap.thread_id);
    this.cancel = $(root, "[data-testid=cancel]");
    this.conn = $(root, "[data-testid=conn-status]");
    this.banner = new ConflictBanner($(root, "[data-testid=conflict-banner]"));
    this.notice = new Notice($(root, "[data-testid=notice]"));
    this.cancelPending = $(root, "[data-testid=cancel-pending]");
    this.timeline = new Timeline($(root, "[data-testid=tree]"), snap.thread_id);
    this.opsPanel = $(root, "[data-testid=operations]");
    this.jump = new JumpToLatest($(root, "[data-testid=jump-latest]"));
    this.heading = $(root, "[data-testid=thread-heading]");
    this.earlier = new EarlierBox($(root, "[data-testid=earlier]"), snap.thread_id);
    this.deletion = new DeletePanel(root);
    this.socket = new Socket({
      // A cancel the user pressed while offline goes first, before this tab
      // follows the thread again (the run may be streaming once more).
      open: () => {
        this.cancels.flush();
        this.queue.flush();
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
    this.queue = new QueueView(this.live, {
      socket: this.socket,
      threadID: this.threadID,
      composer: this.composer,
      state: () => this.s,
      render: () => this.render(),
      renderSoon: () => this.renderSoon(),
      notice: (text, offline) => this.show(text, { offline }),
      gone: () => this.markGone(),
    });
    this.places = new PlaceWatch((runID, place) => this.onPlace(runID, place));
    this.branching = new Branching(this.threadID, {
      state: () => this.s,
      checkpoints: () => this.timeline.checkpoints,
      loadCheckpoints: () => this.loadCheckpoints(),
      startRun: (cmd) => this.startRun(cmd),
      command: (cmd) => this.command(cmd),
      show: (text, opts) => this.show(text, opts),
      render: () => this.render(),
    });
    this.applySnapshot(snap);
  }

  start(): void {
    this.composer.start((kind) => void this.submit(kind));
    // The conversation opens where it is: at its latest message.
    scrollToLatest();
    this.composer.focusOnOpen(this.s.messages.length === 0);
    document.addEventListener("keydown", (e) => {
      if (e.key === "Escape" && this.canCancel()) {
        e.preventDefault();
        this.requestCancel();
      }
    });
    this.root.addEventListener("click", (e) => {
      const target = (e.target as HTMLElement).closest<HTMLElement>("[data-action]");
      const name = target?.dataset.action ?? "";
      if (target && Object.hasOwn(this.actions, name)) void this.actions[name](target);
    });
    void this.loadCheckpoints();
    void this.loadOperations();
    new ScrollBack($(this.root, "[data-testid=earlier]"), () => this.showEarlier(), () => this.s.earlier).start();
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
        if (this.composer.sendFirst()) void this.submit("send"); // (typed on the home page)
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
    this.queue.dropAll(); // (what never reached the server: back to the box)
    this.showGone();
    this.render();
    this.composer.focus();
  }

  private showGone(): void {
    this.show(goneText, { tone: "info" });
  }

  private onEvent(ev: ServerEvent): void {
    const { state, effects } = applyEvent(this.s, ev, this.intended);
    if (state === this.s) return; // another thread's, or already applied
    // A run that ended wrote checkpoints: the versions (‹ n/m ›) read them.
    if (this.s.run && !state.run && !effects.some((e) => e.kind === "snapshot")) void this.loadCheckpoints();
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
          if (this.timeline.open) void this.loadCheckpoints();
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

  private onConn(s: ConnState, detail: string): void {
    this.conn.dataset.state = s;
    this.conn.textContent = s === "live" ? "Live" : s === "connecting" ? "Connecting…" : `Reconnecting (${detail})…`;
    if (s === "live") {
      // What the outage caused is over: no "not connected" next to "Live".
      this.notice.clearOffline();
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
      this.notice.clearOffline();
    } else {
      const { text, tone } = refusalNotice(a.error, here);
      this.show(text, { tone });
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

  private fetchSnapshot(): Promise<Snapshot | null> {
    return readSnapshot(this.threadID);
  }

  // loadCheckpoints reads the checkpoints (timeline.ts) and whether the
  // head's step is unfinished; it returns why it could not ("" when it
  // did, or when the page is going away).
  private async loadCheckpoints(opening = false): Promise<string> {
    if (this.gone || this.s.closing) return "";
    return this.timeline.load(
      opening,
      (body) => {
        const head = body.checkpoints.find((c) => c.checkpoint_id === body.head_checkpoint_id);
        if (head && body.head_checkpoint_id === this.s.head) this.s.pendingStep = head.pending !== null && this.s.run === null;
        this.render();
      },
      () => this.s,
    );
  }

  // refreshTitle picks up the name the server gives a conversation
  // (title.ts), unless the conversation is going away.
  private async refreshTitle(): Promise<void> {
    if (!this.gone && !this.s.closing) await showTitle(this.threadID, this.root, this.heading);
  }

  private async loadOperations(): Promise<void> {
    if (this.gone || this.s.closing) return;
    const operations = await readOperations(this.threadID);
    // (The log is an aid; events keep it current once connected.)
    if (!operations) return;
    this.s = withOperationLog(this.s, operations);
    this.render();
  }

  // ---- commands ----

  // submit sends what is typed: queued while a run is active (after it,
  // or at once, stopping it), otherwise as a new request.
  private async submit(kind: SubmitKind): Promise<void> {
    if (this.gone) {
      this.showGone();
      this.render();
      return;
    }
    const text = this.composer.text.trim();
    if (!text) return;
    if (this.s.run && this.composer.editing) {
      this.show("Wait for the reply to finish, or cancel it (Cancel or Esc), to send your edited request: it starts a new branch, so it cannot wait in the queue. Your text stays here.", { tone: "info" });
      this.notice.busy = true;
    } else if (this.s.run && this.queue.add(text, kind === "now" ? "interrupt" : "after")) {
      const decide = kind === "now" ? "" : waitsForDecision(this.s); // (a message queued is no answer to a confirmation card)
      if (decide || !this.notice.offline) this.show(decide, { tone: "info" });
      this.render();
      scrollToLatest();
    }
    if (this.s.run) return;
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
    if (this.composer.editing) cmd.resume_from_checkpoint_id = this.composer.editing.resumeFrom;
    if (await this.startRun(cmd)) {
      this.composer.sent();
      scrollToLatest(); // to the request just sent, and the reply under it
    }
  }

  // requestCancel is the Cancel button and Esc: the cancel is kept until
  // the server answers it, whatever the connection does meanwhile.
  private requestCancel(): void {
    if (!this.s.run || !this.canCancel()) return;
    this.cancels.request(this.s.run.id, this.threadID);
  }

  // actions: what each data-action of the page does (the click handler in
  // start looks the name up here; an unknown name does nothing).
  private readonly actions: Record<string, (target: HTMLElement) => void | Promise<unknown>> = {
    cancel: () => this.requestCancel(),
    continue: () => this.startRun({ type: "run.start", thread_id: this.threadID, expected_state_version: this.s.stateVersion }),
    edit: () => this.branching.editLast((text, from) => this.composer.edit(text, from), this.notice.offline),
    "stop-edit": () => {
      this.composer.stopEditing();
      this.render();
    },
    fork: () => this.fork(this.s.head),
    "fork-at": (t) => this.fork(t.dataset.checkpointId ?? ""),
    "fork-seen": () => this.fork(this.banner.from ?? this.s.head),
    checkout: (t) => this.branching.checkout(t.dataset.checkpointId ?? "", t.closest<HTMLElement>("[data-message-id]")?.dataset.messageId ?? ""),
    "edit-message": (t) => this.branching.openEdit(t.dataset.messageId ?? ""),
    "edit-send": () => this.branching.sendEdit(),
    "edit-cancel": () => this.branching.closeEdit(),
    regenerate: (t) => this.branching.regenerate(t.dataset.messageId ?? ""),
    "delete-thread": () => this.deletion.ask(true),
    "delete-thread-keep": () => this.deletion.ask(false),
    "delete-thread-confirm": () => this.deleteThread(),
    "start-with-text": () => this.startWithText(),
    "save-fragment": () => this.saveFragment(),
    "confirm-op": (t) => this.command({ type: "tool.confirm", operation_id: t.dataset.operationId, expected_state_version: this.s.stateVersion }),
    "reject-op": (t) => this.command({ type: "tool.reject", operation_id: t.dataset.operationId, expected_state_version: this.s.stateVersion }),
    "delete-draft": (t) => {
      // Asks first: a deleted fragment is gone for good.
      this.deleting = t.dataset.messageId ?? null;
      this.render();
      this.list.querySelector<HTMLElement>("[data-testid=delete-draft-confirm]")?.focus();
    },
    "delete-draft-keep": () => {
      this.deleting = null;
      this.render();
    },
    "delete-draft-confirm": async (t) => {
      this.deleting = null;
      await this.command({ type: "draft.delete", thread_id: this.threadID, message_id: t.dataset.messageId, expected_state_version: this.s.stateVersion });
      this.render();
    },
    "show-earlier": () => this.showEarlier(),
    "show-whole": (t) => this.showWhole(t.dataset.messageId ?? ""),
    reload: () => {
      this.banner.hide();
      this.resync();
    },
    "toggle-tree": (t) => this.toggleTree(t),
  };

  // startWithText opens a new conversation with what was typed here (its
  // box gets it).
  private async startWithText(): Promise<void> {
    const text = this.composer.text;
    const id = await createThread();
    if (!id) {
      this.show("Could not start a new conversation: reload the page and try again (your text is still in the box).");
      return;
    }
    if (text.trim()) saveDraft(id, text);
    saveDraft(this.threadID, "");
    location.assign(`/t/${encodeURIComponent(id)}`);
  }

  // saveFragment keeps the stopped reply's text as this tab showed it.
  private async saveFragment(): Promise<void> {
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
  }

  // toggleTree opens or closes the Checkpoints panel; opened, it comes
  // into view with the focus in it and is brought up to date.
  private async toggleTree(toggle: HTMLElement): Promise<void> {
    if (this.timeline.toggle(toggle, this.root.querySelector<HTMLElement>(".thread-head"))) await this.loadCheckpoints(true);
  }

  // deleteThread sends thread.delete and, once the server confirms it,
  // leaves for the list. A reply in flight is stopped first by the server
  // (its receipt reaches the tabs still on it), which can take a moment.
  private async deleteThread(): Promise<void> {
    if (!this.deletion.send(this.s.run !== null)) return;
    try {
      await this.socket.send({ type: "thread.delete", thread_id: this.threadID, expected_state_version: this.s.stateVersion });
      this.gone = "here";
      saveDraft(this.threadID, "");
      this.deletion.leave(this.heading.textContent ?? ""); // (to the list, which says so)
    } catch (err) {
      const code = err instanceof CommandError ? err.code : "";
      this.deletion.refused(code === "state_version_conflict" || code === "not_found");
      if (code === "state_version_conflict") {
        // The conversation changed since this tab saw it: look first.
        this.banner.show(null, false);
        this.render();
      } else if (code === "not_found") {
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
      if (this.composer.text.trim()) saveDraft(String(ack.new_thread_id), this.composer.text);
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
        this.banner.show(fork ? fork.slice("fork_from_".length) : null);
      } else {
        this.show((err as Error).message, { offline: !(err instanceof CommandError) });
      }
      this.render();
      return null;
    }
  }

  private show(text: string, opts: { tone?: Tone; offline?: boolean } = {}): void {
    this.notice.show(text, opts);
  }

  // ---- rendering ----

  private render(): void {
    if (this.frame) window.cancelAnimationFrame(this.frame);
    this.frame = 0;
    const atBottom = window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 80;
    this.renderMessages();
    this.renderEarlier();
    this.renderToolSteps();
    this.queue.render(this.s, this.gone !== "");
    this.renderLive();
    this.renderOperations();
    if (atBottom) scrollToLatest();
    // "Wait … or cancel it" holds while the reply streams and
    // this tab has not asked to cancel it.
    if (this.notice.busy && (!this.s.run || !this.canCancel())) {
      this.notice.busy = false;
      if (this.notice.tone === "info") this.show("");
    }
    this.jump.show();
    this.renderCancelPending();
    const busy = this.s.run !== null;
    const mine = this.s.run ? this.cancels.state(this.s.run.id) : null;
    this.composer.show(busy, this.subscribed && this.gone === "", this.gone !== "");
    this.renderGone();
    this.cancel.hidden = !busy;
    this.cancel.disabled = !this.canCancel();
    this.cancel.textContent = cancelAccepted(this.s) || mine === "sending" ? "Cancelling…" : mine === "kept" ? "Cancel pending" : "Cancel";
    this.socket.urgent = this.cancels.any();
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
    if (gone) this.notice.offerNewConversation();
  }

  // renderCancelPending says, next to the composer, that a cancel the user
  // pressed has not reached the server yet. While live, an attempt in flight
  // shows on the button ("Cancelling…") only.
  private renderCancelPending(): void {
    const kept = this.cancels.keptFor(this.threadID);
    showCancelPending(this.cancelPending, kept.length, this.socket.live, kept.some((i) => this.cancels.state(i.run_id) === "kept"));
  }

  private renderMessages(): void {
    // The list is rebuilt when its messages change, which fragment's
    // deletion is being asked about (its buttons change), or the versions
    // a message can be switched to.
    const versions = this.versions();
    const nav = [...versions].map(([id, b]) => `${id}:${b.index}/${b.count}`).join(",") + `|${this.branching.editing?.messageID ?? ""}`;
    const stops = this.s.interruptions.map((r) => r.runID + r.operations.map((o) => this.s.operations.get(o.operation_id)?.phase).join()).join();
    const busy = this.s.run !== null;
    const want = idsOf(this.s.messages) + `|${this.deleting ?? ""}|${nav}|${busy ? "busy" : ""}|${stops}`;
    if (this.listKey === want) return;
    this.listKey = want;
    const view = this.messageView();
    const editingID = this.branching.editing?.messageID;
    const items = this.drawn.items(this.s.messages, (m) => itemKey(m, versions.get(m.message_id), view, String(m.message_id === editingID)), (m) => messageItem(m, versions.get(m.message_id), view));
    const editing = document.activeElement === this.branching.editing?.box;
    reconcile(this.list, placeInterruptions(items, this.s, this.socket.tabID));
    showBusy(this.list, busy);
    this.branching.focusEditor(editing);
  }

  // versions are the other versions of the messages shown (versions.ts).
  private versions(): Map<string, Branch> {
    return this.versionsOf.of(this.s.messages, this.s.earlier, this.s.head, this.timeline.checkpoints);
  }

  private messageView(): MessageView {
    return { deleting: this.deleting, expanded: this.expanded, editor: (m) => this.branching.editorView(m) };
  }

  // ---- a long conversation, shown in part (history.ts) ----

  private renderEarlier(): void {
    this.earlier.show(this.s.earlier);
  }

  // showEarlier brings in the page of the history before the messages
  // shown (history.ts), and keeps in view the message the user was reading.
  private async showEarlier(): Promise<void> {
    const first = this.s.messages[0];
    if (!first || this.s.earlier === 0) return;
    const top = () => this.list.querySelector(`[data-message-id="${CSS.escape(first.message_id)}"]`)?.getBoundingClientRect().top ?? 0;
    const apply = (page: HistoryPage): void => {
      if (page.head_checkpoint_id !== this.s.head || this.s.messages[0] !== first) {
        this.resync(); // the history changed meanwhile: read it again
        return;
      }
      const was = top();
      this.s.messages = [...page.messages, ...this.s.messages];
      this.s.earlier = page.next_before === null ? 0 : Math.max(this.s.earlier - page.messages.length, 1);
      this.render();
      window.scrollBy(0, top() - was);
    };
    await this.earlier.load(first.message_id, apply, () => this.s.earlier);
  }

  // showWhole shows the whole of a reply shown in part.
  private showWhole(id: string): void {
    const m = this.s.messages.find((x) => x.message_id === id);
    const li = this.list.querySelector<HTMLElement>(`[data-message-id="${CSS.escape(id)}"]`);
    if (!m || !li) return;
    this.expanded.add(id);
    const item = messageItem(m, this.versions().get(id), this.messageView());
    showBusy(item, this.s.run !== null);
    li.replaceWith(item);
    item.tabIndex = -1;
    item.focus({ preventScroll: true });
  }

  private renderToolSteps(): void {
    showToolSteps(this.list, this.s.operations, this.listKey);
  }

  private renderLive(): void {
    const view: LiveView = {
      body: this.liveBody,
      editing: this.composer.editing !== null,
      tabID: this.socket.tabID,
      gone: this.gone !== "",
      cancelOf: (runID) => this.cancels.state(runID),
      tick: (on) => this.tick(on),
      checkHeld: (s) => checkHeld(this.threadID, s, () => this.render()),
      askExecuted: (runID) => this.askExecuted(runID),
    };
    this.live.replaceChildren(...liveParts(this.s, view));
    // A receipt or a card that asks for a decision is brought into view
    // once, above the composer (app.css: scroll-margin-bottom), however far
    // up the reader was: it is what the user has to read or answer now.
    const ask = this.live.querySelector<HTMLElement>("[data-testid=receipt], [data-testid=confirm-card]");
    const key = ask ? `${ask.dataset.testid}:${this.s.receipt?.runID ?? ask.dataset.operationId ?? ""}` : "";
    // (With messages queued under it, they come into view with it.)
    if (ask && key !== this.shownAsk) (this.queue.shown && ask.dataset.testid === "receipt" ? this.queue.section : ask).scrollIntoView({ block: "end" });
    this.shownAsk = key;
  }

  private renderOperations(): void {
    showOperationLog(this.opsPanel, this.s.operations);
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
}
