// New versions of a conversation: Edit on a request (in place: the new
// text is sent from the checkpoint before it), Regenerate on a reply (its
// step runs again from the checkpoint before it), and the moves between
// versions (‹ n/m ›, "Switch to this branch"). Each is a run or a head move
// the server rules as usual (versions, one active run, conflicts); the
// branch left stays reachable. Leaving a branch whose side effects were
// carried out (or may have been) says so: switching does not undo them.

import { button, el } from "./dom";
import { logLine } from "./outcome";
import { leftBehind, startPoints, type Points } from "./versions";
import type { Checkpoint, Message, Operation } from "./protocol";
import type { ThreadState } from "./state";
import type { Tone } from "./notice";

// BranchHost is what the conversation's view lends: its state, the
// checkpoints it last read (and a way to read them again: "" when it
// could), sending a run.start or another command (null / false when the
// server refused, which the host has shown), its notice and a render.
export interface BranchHost {
  state(): ThreadState;
  checkpoints(): Checkpoint[];
  loadCheckpoints(): Promise<string>;
  startRun(cmd: Record<string, unknown>): Promise<boolean>;
  command(cmd: Record<string, unknown>): Promise<Record<string, unknown> | null>;
  show(text: string, opts?: { tone?: Tone }): void;
  render(): void;
}

// Editing is the request being edited in place: which message, and its
// box (the same element across renders, so what is typed and the caret
// survive a redraw of the list).
export interface Editing {
  messageID: string;
  box: HTMLTextAreaElement;
}

// carriedOut says which of ops (a branch's) did something outside that a
// switch does not undo: sent, carried out, or possibly so (unknown), or
// being done now. In words, one per operation.
export function carriedOut(ops: Operation[]): string[] {
  const out: string[] = [];
  for (const op of ops) {
    if (op.contract !== "consequential") continue;
    const line = logLine(op);
    if (["committed", "unknown_checking", "unknown_given_up", "working"].includes(line.state)) out.push(`${line.what}: ${line.status.charAt(0).toLowerCase()}${line.status.slice(1)}`);
  }
  return out;
}

// operationOf is the operation a tool step records ("" when it names none).
function operationOf(content: string): string {
  try {
    const rec = JSON.parse(content) as { operation_id?: unknown };
    return typeof rec.operation_id === "string" ? rec.operation_id : "";
  } catch {
    return "";
  }
}

// Branching owns the editor of a request and the moves to other versions.
// Owned by the conversation's view (thread.ts); not shared.
export class Branching {
  editing: Editing | null = null;

  constructor(
    private readonly threadID: string,
    private readonly host: BranchHost,
  ) {}

  // points are where Edit and Regenerate start for the messages shown.
  points(): Points {
    const s = this.host.state();
    return startPoints(s.messages, s.earlier, s.head, this.host.checkpoints());
  }

  // editorView draws the editor in the item of the message being edited.
  editorView(m: Message): HTMLElement[] {
    const e = this.editing;
    if (!e || e.messageID !== m.message_id) return [];
    // (Disabled while a run is active: messages.ts showBusy.)
    const send = button("Send edit", "edit-send", "edit-send", "btn primary small");
    send.dataset.busyTitle = "Wait for the reply to finish, or cancel it, to send the edited message";
    return [
      el("label", { class: "visually-hidden", for: e.box.id }, "Edit your message"),
      e.box,
      el("p", { class: "hint edit-means", "data-testid": "edit-explained" }, "Sending starts a new version from before this message. The conversation as it is stays one click away (‹ ›)."),
      el("div", { class: "actions" }, send, button("Cancel", "edit-cancel", "edit-cancel", "btn ghost small")),
    ];
  }

  // openEdit puts the request's text into an editor in its place.
  async openEdit(messageID: string): Promise<void> {
    const m = this.host.state().messages.find((x) => x.message_id === messageID);
    if (!m) return;
    const box = document.createElement("textarea");
    box.id = `edit-${messageID}`;
    box.className = "edit-box";
    box.dataset.testid = "edit-box";
    box.rows = Math.min(10, Math.max(2, m.content.split("\n").length));
    box.value = m.content;
    box.addEventListener("keydown", (e) => {
      if (e.key === "Escape") {
        // (Not the page's Esc, which cancels a reply.)
        e.preventDefault();
        e.stopPropagation();
        this.closeEdit();
      } else if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        void this.sendEdit();
      }
    });
    this.editing = { messageID, box };
    this.host.render();
    box.focus({ preventScroll: true });
    box.setSelectionRange(box.value.length, box.value.length);
    // Whole in view, clear of the sticky header and the composer
    // (app.css: its scroll margins).
    box.closest("li")?.scrollIntoView({ block: "nearest" });
  }

  // closeEdit leaves the editor; the focus goes back to the message's Edit.
  closeEdit(): void {
    const id = this.editing?.messageID;
    this.editing = null;
    this.host.render();
    if (id) document.querySelector<HTMLElement>(`[data-message-id="${CSS.escape(id)}"] [data-testid=edit-message]`)?.focus();
  }

  // focusEditor gives the focus back to the editor after a redraw took it.
  focusEditor(had: boolean): void {
    if (had && this.editing && document.activeElement !== this.editing.box) this.editing.box.focus({ preventScroll: true });
  }

  // sendEdit sends the edited request from the checkpoint before the
  // original. Refused (a reply runs, the conversation moved on), the editor
  // stays with the text.
  async sendEdit(): Promise<void> {
    const e = this.editing;
    if (!e) return;
    const text = e.box.value.trim();
    if (!text) {
      this.host.show("The edited message is empty: write something, or Cancel to keep the message as it is.", { tone: "info" });
      return;
    }
    const from = await this.pointOf("edit", e.messageID);
    if (!from) return;
    const left = this.leaving(e.messageID);
    const ok = await this.host.startRun({
      type: "run.start",
      thread_id: this.threadID,
      expected_state_version: this.host.state().stateVersion,
      resume_from_checkpoint_id: from,
      user_message: text,
    });
    if (!ok || this.editing !== e) return;
    this.editing = null;
    this.sayLeft(left);
    this.host.render();
  }

  // regenerate runs the reply's step again from the checkpoint before it.
  async regenerate(messageID: string): Promise<void> {
    const from = await this.pointOf("regenerate", messageID);
    if (!from) return;
    const left = this.leaving(messageID);
    const ok = await this.host.startRun({ type: "run.start", thread_id: this.threadID, expected_state_version: this.host.state().stateVersion, resume_from_checkpoint_id: from });
    if (ok) this.sayLeft(left);
  }

  // checkout moves the conversation to another version (the arrows, or
  // "Switch to this branch"); from is the first message of the history
  // shown that the move leaves behind ("" : the timeline does not say).
  async checkout(checkpointID: string, from: string): Promise<void> {
    if (!checkpointID) return;
    const left = from ? this.leaving(from) : [];
    const ack = await this.host.command({ type: "thread.checkout", thread_id: this.threadID, checkpoint_id: checkpointID, expected_state_version: this.host.state().stateVersion });
    if (ack) this.sayLeft(left);
  }

  // pointOf is where an edit or a regenerate of messageID starts, reading
  // the checkpoints again when the ones read do not tell it yet (a request
  // sent since they were read); null, said, when there is none.
  // (button: what to press again.)
  private async pointOf(kind: keyof Points, messageID: string, button = kind === "edit" ? "Edit" : "Regenerate"): Promise<string | null> {
    let from = this.points()[kind].get(messageID);
    if (!from) {
      const failed = await this.host.loadCheckpoints();
      if (failed) {
        this.host.show(
          kind === "edit"
            ? `Could not load where your request was saved (${failed}), so it cannot be edited yet: press “${button}” again in a moment.`
            : `Could not load where this reply started (${failed}), so it cannot be written again yet: press “${button}” again in a moment.`,
        );
        return null;
      }
      from = this.points()[kind].get(messageID);
    }
    if (!from) this.host.show(kind === "edit" ? "There is no request to edit here: write a new message instead." : "This reply cannot be written again from here: send a new message instead.");
    return from ?? null;
  }

  // editLast is the receipt's "Edit the request and continue": the last
  // request goes into the composer (put), to be sent from the checkpoint
  // before it.
  async editLast(put: (text: string, from: string) => void, keepNotice: boolean): Promise<void> {
    const last = [...this.host.state().messages].reverse().find((m) => m.role === "user");
    if (!last) {
      this.host.show("There is no request to edit here: write a new message instead.");
      return;
    }
    const from = await this.pointOf("edit", last.message_id, "Edit the request and continue");
    if (!from) return;
    // What an earlier action went wrong with is past (a lost connection's
    // notice stays until the connection is back).
    if (!keepNotice) this.host.show("");
    put(last.content, from);
    this.host.render();
  }

  // leaving is what a move away from message id leaves behind that a
  // switch does not undo: the side effects of the runs that wrote it and
  // what follows, and of the run a cancel stopped at the end of it.
  private leaving(id: string): string[] {
    const s = this.host.state();
    const runs = new Set<string>();
    const ops = new Set<string>();
    for (const m of leftBehind(s.messages, id)) {
      if (m.run_id) runs.add(m.run_id);
      if (m.role === "tool") {
        const op = operationOf(m.content);
        if (op) ops.add(op);
      }
    }
    if (s.receipt) runs.add(s.receipt.runID);
    return carriedOut([...s.operations.values()].filter((op) => runs.has(op.run_id) || ops.has(op.operation_id)));
  }

  // sayLeft tells, once the move is made, what stays done on the branch
  // left.
  private sayLeft(left: string[]): void {
    if (left.length === 0) return;
    const one = left.length === 1;
    this.host.show(`The version you left ${one ? "had a side effect" : "had side effects"} that switching does not undo: ${left.join("; ")}.`, { tone: "info" });
  }
}
