// Drawer is the conversation list on a phone: on a conversation's page the
// sidebar is off-screen until "Conversations" opens it over the page
// (app.css, .app.in-thread at 720 px and below). Esc, Close or a tap
// beside it closes it; the focus goes into it and back to the toggle.
export class Drawer {
  private readonly toggle: HTMLButtonElement | null;
  private readonly sidebar: HTMLElement | null;

  constructor(private readonly app: HTMLElement) {
    this.toggle = app.querySelector("[data-testid=drawer-toggle]");
    this.sidebar = app.querySelector("[data-testid=sidebar]");
  }

  start(): void {
    if (!this.toggle || !this.sidebar) return;
    this.toggle.addEventListener("click", () => (this.isOpen() ? this.close() : this.open()));
    this.app.querySelector("[data-testid=drawer-close]")?.addEventListener("click", () => this.close());
    // A tap on the dimmed page beside the drawer lands on .app itself.
    this.app.addEventListener("click", (e) => {
      if (e.target === this.app && this.isOpen()) this.close();
    });
    document.addEventListener("keydown", (e) => {
      if (e.key === "Escape" && this.isOpen()) {
        e.stopImmediatePropagation(); // Esc closes the drawer, it does not cancel a reply
        this.close();
      }
    }, true);
  }

  private isOpen(): boolean {
    return this.app.classList.contains("drawer-open");
  }

  private open(): void {
    this.app.classList.add("drawer-open");
    this.toggle?.setAttribute("aria-expanded", "true");
    // Once it is shown (an element still hidden cannot take the focus).
    window.requestAnimationFrame(() => {
      const s = this.sidebar;
      (s?.querySelector<HTMLElement>("[aria-current=page]") ?? s?.querySelector<HTMLElement>("[data-testid=new-thread]"))?.focus();
    });
  }

  private close(): void {
    this.app.classList.remove("drawer-open");
    this.toggle?.setAttribute("aria-expanded", "false");
    this.toggle?.focus();
  }
}
