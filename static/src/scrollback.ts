// Older messages come in as the reader scrolls up to the start of what
// the page shows (history.ts: a long conversation opens at its latest
// messages). An IntersectionObserver watches the "Show earlier messages"
// box above the first message; when it comes within a screen of the view
// while the reader is scrolling up by hand (the wheel, a touch, the
// keys), the next page is fetched by cursor, as the button does — the
// button stays, for the keyboard, a screen reader, a scrollbar dragged to
// the top, or a page without the observer. A jump made by the page itself
// (opening the Checkpoints, a test scrolling to the top) fetches nothing.
// The page keeps the reader's place when the older messages come in
// (thread.ts showEarlier).

// recent is how long after the reader's last scroll up by hand the box
// coming near still fetches (one page arriving can leave it near).
const recent = 1500;

// margin is how far above the view the box starts fetching: the next page
// is on its way before the reader reaches the top.
const reach = 1000;
const margin = `${reach}px 0px 0px 0px`;

// keys that scroll the page up when the focus is not in a field.
const upKeys = new Set(["PageUp", "ArrowUp", "Home"]);

function editable(t: EventTarget | null): boolean {
  return t instanceof HTMLElement && (t.isContentEditable || t.closest("input, textarea, select") !== null);
}

// ScrollBack fetches older messages as the reader scrolls up. Owned by the
// conversation's view; fetches one page at a time (more's promise).
export class ScrollBack {
  private near = false;
  private upAt = -Infinity; // when the reader last scrolled up by hand
  private loading = false;

  constructor(
    private readonly box: HTMLElement,
    // more fetches the next older page and shows it; left is how many
    // older messages are still left out.
    private readonly more: () => Promise<void>,
    private readonly left: () => number,
  ) {}

  start(): void {
    if (typeof IntersectionObserver === "undefined") return; // the button does it
    const up = (): void => {
      this.upAt = performance.now();
      this.check();
    };
    window.addEventListener("wheel", (e) => e.deltaY < 0 && up(), { passive: true });
    window.addEventListener("touchmove", up, { passive: true });
    window.addEventListener("keydown", (e) => {
      if ((upKeys.has(e.key) || (e.key === " " && e.shiftKey)) && !editable(e.target)) up();
    });
    new IntersectionObserver(
      (entries) => {
        this.near = entries[entries.length - 1].isIntersecting;
        this.check();
      },
      { rootMargin: margin },
    ).observe(this.box);
  }

  // check fetches the next page when the box is near, the reader scrolled
  // up lately, and older messages are left; once shown, it looks again
  // (the page may leave the box near). The observer's word is checked
  // against where the box is now (it reports a frame late).
  private check(): void {
    if (this.loading || !this.near || this.left() === 0 || performance.now() - this.upAt > recent) return;
    if (this.box.hidden || this.box.getBoundingClientRect().bottom < -reach) return;
    this.loading = true;
    void this.more().finally(() => {
      this.loading = false;
      // (After the layout the new messages caused.)
      requestAnimationFrame(() => this.check());
    });
  }
}
