// Small DOM helpers the page's views share.

export const $ = <T extends HTMLElement>(root: ParentNode, sel: string): T => {
  const el = root.querySelector<T>(sel);
  if (!el) throw new Error(`page is missing ${sel}`);
  return el;
};

export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string> = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else e.setAttribute(k, v);
  }
  e.append(...children);
  return e;
}

export function button(label: string, action: string, testid: string, cls = "btn"): HTMLButtonElement {
  return el("button", { type: "button", class: cls, "data-action": action, "data-testid": testid }, label);
}

// snippet is the start of text on one line, for lists.
export function snippet(text: string, n = 90): string {
  const one = text.replace(/\s+/g, " ").trim();
  return one.length > n ? one.slice(0, n - 1) + "…" : one;
}

// nextTask resolves in a task of its own, after what the page has waiting
// (a key, a frame): work split by it makes several short tasks instead of
// one long one that would hold the page. scheduler.yield where the
// browser has it (it keeps the work's place ahead of other tasks).
export function nextTask(): Promise<void> {
  const s = (globalThis as { scheduler?: { yield?: () => Promise<void> } }).scheduler;
  if (s?.yield) return s.yield();
  return new Promise((resolve) => setTimeout(resolve, 0));
}

// scrollToLatest brings the end of the page (the latest message) into view.
export function scrollToLatest(): void {
  window.scrollTo({ top: document.documentElement.scrollHeight });
}

// JumpToLatest is the "Jump to latest" button: shown while the latest
// message is out of view below (checked once a frame while scrolling, and
// on show).
export class JumpToLatest {
  constructor(private readonly button: HTMLElement) {
    let frame = 0;
    window.addEventListener("scroll", () => {
      if (!frame) frame = window.requestAnimationFrame(() => ((frame = 0), this.show()));
    });
    button.addEventListener("click", () => {
      scrollToLatest();
      this.show();
    });
  }

  show(): void {
    const below = document.documentElement.scrollHeight - (window.innerHeight + window.scrollY);
    this.button.hidden = below < 160;
  }
}
