// groupByDay puts headings into the conversation list (newest first, each
// item's data-updated-at an RFC 3339 time): Today, Yesterday, Previous 7
// days, Older — by this browser's clock and time zone, which the server
// does not know.
export function groupByDay(list: HTMLElement, now = new Date()): void {
  const startOf = (d: Date) => new Date(d.getFullYear(), d.getMonth(), d.getDate()).getTime();
  const today = startOf(now);
  const day = 24 * 60 * 60 * 1000;
  const label = (t: number): string =>
    t >= today ? "Today" : t >= today - day ? "Yesterday" : t >= today - 7 * day ? "Previous 7 days" : "Older";
  let last = "";
  for (const li of [...list.querySelectorAll<HTMLLIElement>(":scope > li[data-updated-at]")]) {
    const t = Date.parse(li.dataset.updatedAt ?? "");
    if (Number.isNaN(t)) continue;
    const group = label(t);
    if (group === last) continue;
    last = group;
    const head = document.createElement("li");
    head.className = "group-label";
    head.dataset.testid = "thread-group";
    head.textContent = group;
    li.before(head);
  }
}
