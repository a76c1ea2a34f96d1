// The message queue under the reply (docs/protocol.md "The message
// queue"): the messages the user wrote while a reply streams, shared by
// every tab of the conversation. Drawn only from the thread's state (its
// queue.updated events and snapshots) and from what this tab queued and
// the server has not acknowledged yet (outbox.ts). Each queued message can
// be edited in place (Enter saves, Esc cancels the edit) or removed; a
// paused queue (the reply was stopped, failed, or the conversation moved)
// says why and starts nothing until the user sends it on or clears it.

import { button, el, snippet } from "./dom";
import { CommandError, type PausedReason, type QueueItem } from "./protocol";
import { Outbox, type Entry, type QueueMode } from "./outbox";
import type { Composer } from "./composer";
import type { Socket } from "./socket";
import type { ThreadState } from "./state";

export interface QueueDeps {
  socket: Socket;
  threadID: string;
  composer: Composer;
  state(): ThreadState;
  render(): void; // draw the page again, now
  renderSoon(): void; // in the next frame
  notice(text: string, offline: boolean): void; // "" clears it
  gone(): void; // the server no longer knows the conversation
}

// pausedWords says why a queue is paused, in words.
export function pausedWords(reason: PausedReason | null): string {
  switch (reason) {
    case "run_cancelled":
      return "Paused: the reply was stopped.";
    case "run_failed":
      return "Paused: the reply failed.";
    case "head_moved":
      return "Paused: the conversation moved to another point.";
    default:
      return "Paused.";
  }
}

// Editing is a queued message being edited. gone: it left the queue
// meanwhile (sent, removed elsewhere, or either: unknown); its text stays
// in the box.
interface Editing {
  itemID: string;
  box: HTMLTextAreaElement;
  error: string;
  gone: "" | "sent" | "removed" | "unknown";
  saving: boolean;
}

const goneWords = {
  sent: "Already sent — it is the reply above. Your edit was not applied: your text is still here.",
  removed: "Removed from the queue (in another tab), so your edit was not applied: your text is still here.",
  unknown: "No longer in the queue (sent or removed elsewhere), so your edit was not applied: your text is still here.",
};

const maxBytes = 32768;

// tooLong says why text cannot be queued as it is ("" when it can).
export function tooLong(text: string): string {
  const n = new TextEncoder().encode(text).length;
  return n > maxBytes ? `Too long to send: ${n.toLocaleString("en")} bytes, at most ${maxBytes.toLocaleString("en")}. Shorten it, or split it into two messages.` : "";
}

// QueueView is the queue's section of one conversation's page, owned by
// its ThreadView.
export class QueueView {
  readonly section: HTMLElement;
  private readonly list: HTMLOListElement;
  private readonly head: HTMLElement;
  private readonly announcer: HTMLElement;
  private readonly outbox: Outbox; // messages queued here, until the server has them
  private editing: Editing | null = null;
  private readonly busy = new Set<string>(); // item ids (and "resume", "clear") with a command in flight
  private drawn = "";
  private summary: string | null = null;

  constructor(
    after: HTMLElement,
    private readonly d: QueueDeps,
  ) {
    this.head = el("div", { class: "queue-head" });
    this.list = el("ol", { class: "queue-list", "data-testid": "queue-list" });
    this.section = el("section", { class: "queue", "data-testid": "queue", "aria-labelledby": "queue-title", hidden: "" }, this.head, this.list);
    this.announcer = el("p", { class: "visually-hidden", role: "status", "data-testid": "queue-announce" });
    this.outbox = new Outbox(d.socket, d.threadID, d.state, {
      changed: () => d.renderSoon(),
      refused: (q, err) => this.refused(q.text, err),
      startedRun: () => d.renderSoon(),
    });
    after.after(this.section, this.announcer);
    this.section.addEventListener("click", (e) => {
      const t = (e.target as HTMLElement).closest<HTMLElement>("[data-action]");
      if (t && !(t as HTMLButtonElement).disabled) this.act(t.dataset.action ?? "", t.dataset.itemId ?? "");
    });
  }

  // add queues text with mode, kept until the server has it however the
  // connection goes (outbox.ts); it says whether it took it (what cannot
  // be sent stays in the box, and the notice says why).
  add(text: string, mode: QueueMode): boolean {
    const why = tooLong(text);
    if (why) {
      this.d.notice(`${why} Your text stays here.`, false);
      return false;
    }
    this.outbox.add(text, mode);
    this.d.composer.sent();
    return true;
  }

  // flush sends what was queued while offline (right after hello).
  flush(): void {
    this.outbox.flush();
  }

  // dropAll gives what never reached the server, and an edit not saved,
  // back to the box (the conversation is gone).
  dropAll(): void {
    for (const text of this.outbox.dropAll()) this.d.composer.restore(text);
    const e = this.editing;
    this.editing = null;
    if (e?.box.value.trim()) this.d.composer.restore(e.box.value.trim());
  }

  // refused puts a message the server would not queue back in the box,
  // and says why.
  private refused(text: string, err: CommandError): void {
    this.d.composer.restore(text);
    if (err.code === "not_found") return this.d.gone();
    this.d.notice(`Not queued: ${err.message.replace(/\.?$/, ".")} Your text is back in the box.`, false);
    this.d.render();
  }

  // shown: something of the queue is on the page.
  get shown(): boolean {
    return !this.section.hidden;
  }

  // render draws the queue from s (and what this tab has not had
  // acknowledged yet); it changes the page only when that changed.
  render(s: ThreadState, gone: boolean): void {
    const pending = gone ? [] : this.outbox.shown(s);
    const items = gone ? [] : s.queue.items;
    const e = this.editing;
    if (e && !e.gone && !items.some((i) => i.item_id === e.itemID)) {
      e.gone = s.sentItems.has(e.itemID) ? "sent" : "unknown";
      e.error = "";
    }
    this.announce(s, gone);
    const live = this.d.socket.live;
    const key = JSON.stringify([items, s.queue.paused, s.queue.paused_reason, !!s.run, live, pending.map((p) => [p.client_request_id, p.text, p.mode, p.inFlight, !!p.itemID]), e && [e.itemID, e.gone, e.error, e.saving], [...this.busy]]);
    if (key === this.drawn) return;
    this.drawn = key;
    const focus = this.focused();
    this.section.hidden = items.length === 0 && pending.length === 0 && !e;
    this.head.replaceChildren(...this.heading(s, items.length));
    const rows: HTMLElement[] = [];
    if (e && e.gone) rows.push(this.orphan(e));
    items.forEach((it, i) => rows.push(e && !e.gone && e.itemID === it.item_id ? this.editor(e, i) : this.item(s, it, i)));
    for (const p of pending) rows.push(this.pending(p, live));
    this.list.replaceChildren(...rows);
    this.refocus(focus);
  }

  // heading names the queue and says how it stands: paused (why, and the
  // two ways on), or what happens next.
  private heading(s: ThreadState, n: number): Node[] {
    const out: Node[] = [el("h2", { class: "queue-title", id: "queue-title" }, "Queued messages")];
    if (s.queue.paused && n > 0) {
      out.push(
        el("p", { class: "queue-state paused", "data-testid": "queue-state" }, el("strong", {}, pausedWords(s.queue.paused_reason)), " Nothing is sent until you choose."),
        el("div", { class: "actions" }, this.cmd("Send the queued messages", "queue-resume", "queue-resume", "resume", "btn primary small"), this.cmd("Clear", "queue-clear", "queue-clear", "clear", "btn small")),
      );
    } else if (n > 0) {
      out.push(el("p", { class: "queue-state", "data-testid": "queue-state" }, s.run ? "Each is sent when the reply before it finishes." : "Sent next."));
    }
    return out;
  }

  private cmd(label: string, action: string, testid: string, busyKey: string, cls: string, itemID = ""): HTMLButtonElement {
    const b = button(label, action, testid, cls);
    if (itemID) b.dataset.itemId = itemID;
    if (this.busy.has(busyKey)) {
      b.disabled = true;
      b.setAttribute("aria-busy", "true");
    }
    return b;
  }

  private item(s: ThreadState, it: QueueItem, i: number): HTMLElement {
    const chip =
      it.mode === "interrupt"
        ? el("span", { class: "chip warn", "data-testid": "queued-chip" }, "Sends now · stops the reply")
        : el("span", { class: "chip wait", "data-testid": "queued-chip" }, s.queue.paused ? `Queued · ${i + 1} · paused` : i === 0 ? "Next · after this reply" : `Queued · ${i + 1}`);
    const edit = this.cmd("Edit", "queue-edit", "queued-edit-button", it.item_id, "btn ghost small", it.item_id);
    const remove = this.cmd("Remove", "queue-remove", "queued-remove", it.item_id, "btn ghost small", it.item_id);
    edit.setAttribute("aria-label", `Edit queued message ${i + 1}`);
    remove.setAttribute("aria-label", `Remove queued message ${i + 1}`);
    return el(
      "li",
      { class: `msg role-user queued mode-${it.mode}`, "data-testid": "queued-item", "data-item-id": it.item_id, "data-mode": it.mode },
      chip,
      el("div", { class: "body", "data-testid": "queued-text" }, it.user_message),
      el("div", { class: "queued-actions" }, edit, remove),
    );
  }

  private pending(p: Entry, live: boolean): HTMLElement {
    const waiting = !live && !p.inFlight && !p.itemID;
    const words = waiting ? "Not sent yet: waiting for the connection" : "Sending…";
    const li = el(
      "li",
      { class: `msg role-user queued pending mode-${p.mode}`, "data-testid": "queued-pending", "data-mode": p.mode, "data-state": waiting ? "kept" : "sending" },
      el("span", { class: "chip warn", "data-testid": "queued-chip" }, p.mode === "interrupt" ? `${words} · then stops the reply` : words),
      el("div", { class: "body", "data-testid": "queued-text" }, p.text),
    );
    if (waiting) {
      const drop = button("Remove", "queue-drop", "queued-remove", "btn ghost small");
      drop.dataset.itemId = p.client_request_id;
      drop.setAttribute("aria-label", `Remove the unsent message “${snippet(p.text, 40)}”`);
      li.append(el("div", { class: "queued-actions" }, drop));
    }
    return li;
  }

  private editor(e: Editing, i: number): HTMLElement {
    const li = el("li", { class: "msg role-user queued editing", "data-testid": "queued-item", "data-item-id": e.itemID, "data-editing": "true" });
    li.append(el("label", { class: "chip wait", for: "queue-edit", "data-testid": "queued-chip" }, `Editing queued message ${i + 1}`), e.box);
    if (e.error) li.append(el("p", { class: "queue-error", "data-testid": "queued-error", role: "alert" }, e.error));
    li.append(
      el("div", { class: "queued-actions" }, this.cmd("Save", "queue-save", "queued-save", e.itemID, "btn primary small", e.itemID), this.cmd("Cancel editing", "queue-cancel-edit", "queued-cancel-edit", e.itemID, "btn ghost small", e.itemID)),
      el("p", { class: "hint", id: "queue-edit-hint" }, "Enter saves · Shift+Enter for a new line · Esc cancels the edit"),
    );
    return li;
  }

  // orphan is the edit box of a message that left the queue meanwhile.
  private orphan(e: Editing): HTMLElement {
    return el(
      "li",
      { class: "msg role-user queued editing gone", "data-testid": "queued-orphan", "data-item-id": e.itemID },
      el("p", { class: "queue-error", "data-testid": "queued-error", role: "alert" }, e.gone ? goneWords[e.gone] : ""),
      el("label", { class: "visually-hidden", for: "queue-edit" }, "Your edited text"),
      e.box,
      ...(e.error ? [el("p", { class: "queue-error", "data-testid": "queued-orphan-error" }, e.error)] : []),
      el("div", { class: "queued-actions" }, button("Queue it as a new message", "queue-readd", "queued-readd", "btn small"), button("Discard", "queue-discard", "queued-discard", "btn ghost small")),
    );
  }

  // ---- what the buttons do ----

  private act(action: string, id: string): void {
    switch (action) {
      case "queue-edit":
        return this.startEdit(id);
      case "queue-save":
        return void this.save();
      case "queue-cancel-edit":
        return this.stopEdit(id);
      case "queue-remove":
        return void this.remove(id);
      case "queue-drop":
        this.outbox.drop(id);
        return this.d.composer.focus();
      case "queue-resume":
        return void this.resume();
      case "queue-clear":
        return void this.clear();
      case "queue-readd":
        return this.readd();
      case "queue-discard":
        this.editing = null;
        this.d.render();
        return this.d.composer.focus();
    }
  }

  private startEdit(itemID: string): void {
    const it = this.d.state().queue.items.find((i) => i.item_id === itemID);
    if (!it) return;
    const box = el("textarea", { id: "queue-edit", class: "queue-edit", rows: "2", "data-testid": "queued-edit", "aria-describedby": "queue-edit-hint" });
    box.value = it.user_message;
    box.addEventListener("keydown", (ev) => {
      if (ev.key === "Escape") {
        // (Not the page's Esc, which stops the reply.)
        ev.stopPropagation();
        ev.preventDefault();
        if (!this.editing?.gone) this.stopEdit(itemID);
      } else if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing && !this.editing?.gone) {
        ev.preventDefault();
        void this.save();
      }
    });
    this.editing = { itemID, box, error: "", gone: "", saving: false };
    this.d.render();
    box.focus();
    box.setSelectionRange(box.value.length, box.value.length);
  }

  private stopEdit(itemID: string): void {
    this.editing = null;
    this.d.render();
    this.focusItem(itemID, "queued-edit-button");
  }

  private async save(): Promise<void> {
    const e = this.editing;
    if (!e || e.gone || this.busy.has(e.itemID)) return;
    const text = e.box.value.trim();
    const was = this.d.state().queue.items.find((i) => i.item_id === e.itemID)?.user_message;
    if (!text) return this.editError(e, "A queued message cannot be empty: type something, or cancel the edit and remove it.");
    if (tooLong(text)) return this.editError(e, tooLong(text));
    if (text === was) return this.stopEdit(e.itemID);
    this.busy.add(e.itemID);
    e.saving = true;
    this.d.render();
    try {
      await this.d.socket.send({ type: "queue.update", thread_id: this.d.threadID, item_id: e.itemID, user_message: text });
      if (this.editing === e) {
        this.editing = null;
        this.say("Queued message saved.");
      }
      this.d.notice("", false);
    } catch (err) {
      const gone = goneKind(err);
      if (gone) {
        e.gone = gone;
        e.error = "";
      } else {
        e.error = failure(err, "your edit was not saved (it is still here)");
      }
    } finally {
      this.busy.delete(e.itemID);
      e.saving = false;
      this.d.render();
    }
    if (!this.editing) this.focusItem(e.itemID, "queued-edit-button");
    else e.box.focus();
  }

  private editError(e: Editing, text: string): void {
    e.error = text;
    this.d.render();
    e.box.focus();
  }

  private async remove(itemID: string): Promise<void> {
    if (this.busy.has(itemID)) return;
    const items = this.d.state().queue.items;
    const at = items.findIndex((i) => i.item_id === itemID);
    const next = items[at + 1] ?? items[at - 1];
    this.busy.add(itemID);
    this.d.render();
    try {
      await this.d.socket.send({ type: "queue.remove", thread_id: this.d.threadID, item_id: itemID });
      this.d.notice("", false);
      this.say("Removed from the queue.");
    } catch (err) {
      if (goneKind(err) === "sent") this.d.notice("Already sent — it is the reply above, so it could not be removed.", false);
      else if (!goneKind(err)) this.fail(err, "the message was not removed");
    } finally {
      this.busy.delete(itemID);
      this.d.render();
    }
    if (next) this.focusItem(next.item_id, "queued-remove");
    else this.d.composer.focus();
  }

  private async resume(): Promise<void> {
    if (this.busy.has("resume")) return;
    this.busy.add("resume");
    this.d.render();
    try {
      await this.d.socket.send({ type: "queue.resume", thread_id: this.d.threadID });
      this.d.notice("", false);
      this.say("Sending the queued messages.");
    } catch (err) {
      this.fail(err, "the queued messages were not sent (they still wait)");
    } finally {
      this.busy.delete("resume");
      this.d.render();
    }
    this.d.composer.focus();
  }

  // clear removes every queued message, one after the other (a message
  // sent meanwhile is left to its reply).
  private async clear(): Promise<void> {
    if (this.busy.has("clear")) return;
    this.busy.add("clear");
    this.d.render();
    try {
      for (const it of [...this.d.state().queue.items]) {
        try {
          await this.d.socket.send({ type: "queue.remove", thread_id: this.d.threadID, item_id: it.item_id });
        } catch (err) {
          if (goneKind(err)) continue;
          this.fail(err, "the queue was not cleared (what is still shown still waits)");
          return;
        }
      }
      this.d.notice("", false);
      this.say("The queue is cleared.");
    } finally {
      this.busy.delete("clear");
      this.d.render();
      this.d.composer.focus();
    }
  }

  // readd queues the text of a message that left the queue while it was
  // being edited, as a new message.
  private readd(): void {
    const e = this.editing;
    if (!e) return;
    const text = e.box.value.trim();
    const why = !text ? "There is nothing to queue: type something, or discard it." : tooLong(text);
    if (why) return this.editError(e, why);
    this.editing = null;
    this.outbox.add(text, "after");
    this.d.render();
    this.d.composer.focus();
  }

  private fail(err: unknown, what: string): void {
    if (err instanceof CommandError && err.code === "not_found") return this.d.gone();
    this.d.notice(failure(err, what), !(err instanceof CommandError));
  }

  // ---- focus and what a screen reader hears ----

  private focusItem(itemID: string, testid: string): void {
    const b = this.list.querySelector<HTMLElement>(`[data-item-id="${CSS.escape(itemID)}"] [data-testid=${testid}]`);
    if (b) b.focus();
    else this.d.composer.focus();
  }

  // focused remembers the control of the queue that has the focus, to
  // give it back once the list is drawn again.
  private focused(): { item: string; testid: string; start: number; end: number } | null {
    const a = document.activeElement as HTMLElement | null;
    if (!a || !this.section.contains(a)) return null;
    const li = a.closest<HTMLElement>("[data-item-id]");
    const box = a instanceof HTMLTextAreaElement ? a : null;
    return { item: li?.dataset.itemId ?? "", testid: a.dataset.testid ?? "", start: box?.selectionStart ?? 0, end: box?.selectionEnd ?? 0 };
  }

  private refocus(f: ReturnType<QueueView["focused"]>): void {
    if (!f || this.section.contains(document.activeElement)) return;
    const scope = f.item ? this.list.querySelector<HTMLElement>(`[data-item-id="${CSS.escape(f.item)}"]`) : this.section;
    const t = scope?.querySelector<HTMLElement>(`[data-testid=${f.testid}]`) ?? null;
    if (!t) return;
    t.focus({ preventScroll: true });
    if (t instanceof HTMLTextAreaElement) t.setSelectionRange(f.start, f.end);
  }

  // announce tells a screen reader how many messages wait, and when the
  // queue pauses, whichever tab changed it.
  private announce(s: ThreadState, gone: boolean): void {
    const n = gone ? 0 : s.queue.items.length;
    const words = n === 0 ? "" : `${n === 1 ? "1 queued message" : `${n} queued messages`}.${s.queue.paused ? ` ${pausedWords(s.queue.paused_reason)}` : ""}`;
    const was = this.summary;
    this.summary = words;
    if (was !== null && was !== words && words) this.say(words);
  }

  private say(text: string): void {
    this.announcer.textContent = text;
  }
}

// goneKind reads a not_found about a queue item: it was sent, or removed.
function goneKind(err: unknown): "sent" | "removed" | "" {
  if (!(err instanceof CommandError) || err.code !== "not_found" || !/queue item/.test(err.message)) return "";
  return /was sent/.test(err.message) ? "sent" : "removed";
}

// failure says what went wrong with a queue command, and what to do.
function failure(err: unknown, what: string): string {
  if (!(err instanceof CommandError)) return `Not connected, so ${what}. Try again once the page says Live.`;
  return `The server refused it, so ${what}: ${err.message}`;
}
