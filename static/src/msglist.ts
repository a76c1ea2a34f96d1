// The message list redrawn item by item. Drawing an item (Markdown,
// sanitising, a card) is the page's costliest work, and the list is
// redrawn whenever its messages, their versions or the view change: a page
// of older messages brought in, a new message, the checkpoints read.
// Drawn whole each time, a conversation scrolled back through N messages
// redrew N items for every page of 50 it brought in. Here an item is drawn
// again only when what it is drawn from changed, and the list's children
// are moved, added or removed only where they differ, so the reader's
// place (and the browser's scroll anchoring) holds.

import type { Message } from "./protocol";
import type { Branch } from "./versions";

// viewKey is what of view an item of message id is drawn from: a Map's
// entry for id, whether a Set holds id, whether a string is id, a
// number's or a boolean's value; objects by their fields; functions not
// at all (what they draw must be named by the caller's extra key).
function viewKey(v: unknown, id: string): string {
  if (v instanceof Map) return String(v.get(id) ?? "");
  if (v instanceof Set) return v.has(id) ? "1" : "";
  if (typeof v === "string") return v === id ? "1" : "";
  if (typeof v === "number" || typeof v === "boolean") return String(v);
  if (v && typeof v === "object") return Object.values(v as Record<string, unknown>).map((x) => viewKey(x, id)).join(",");
  return "";
}

// itemKey is what message m's item is drawn from (messages.ts
// messageItem): the message, its versions, the view as it concerns m, and
// extra (what the view's functions draw for m).
export function itemKey(m: Message, branch: Branch | undefined, view: object, extra = ""): string {
  const b = branch ? `${branch.index}/${branch.count}/${branch.prev ?? ""}/${branch.next ?? ""}` : "";
  return `${m.kind}|${m.content.length}|${m.truncated ?? ""}|${b}|${viewKey(view, m.message_id)}|${extra}`;
}

// idsOf is the ids of messages, joined: what the list shows, compared at
// every render (every frame while a reply streams), so joined once per
// array (a new one whenever the messages change, state.ts).
const joined = new WeakMap<Message[], string>();
export function idsOf(messages: Message[]): string {
  let ids = joined.get(messages);
  if (ids === undefined) {
    ids = messages.map((m) => m.message_id).join(",");
    joined.set(messages, ids);
  }
  return ids;
}

// DrawnItems keeps the item drawn for each message shown and what it was
// drawn from. Owned by the conversation's view.
export class DrawnItems<T extends HTMLElement = HTMLLIElement> {
  private drawn = new Map<string, { key: string; item: T }>();

  // items are the items of messages, in order: the one drawn before for
  // a message whose key is the same, else a new one (draw); messages no
  // longer shown are forgotten.
  items(messages: Message[], key: (m: Message) => string, draw: (m: Message) => T): T[] {
    const next = new Map<string, { key: string; item: T }>();
    const out = messages.map((m) => {
      const k = key(m);
      const had = this.drawn.get(m.message_id);
      const item = had && had.key === k ? had.item : draw(m);
      next.set(m.message_id, { key: k, item });
      return item;
    });
    this.drawn = next;
    return out;
  }
}

// reconcile makes parent's children exactly want, in order, touching only
// the children that differ: those not wanted are removed, the new ones
// inserted where they go; the others stay where they are.
export function reconcile(parent: Element, want: Node[]): void {
  const keep = new Set(want);
  let at = parent.firstChild;
  for (const n of want) {
    while (at && !keep.has(at)) {
      const next: ChildNode | null = at.nextSibling;
      at.remove();
      at = next;
    }
    if (n === at) at = at.nextSibling;
    else parent.insertBefore(n, at);
  }
  while (at) {
    const next: ChildNode | null = at.nextSibling;
    at.remove();
    at = next;
  }
}
