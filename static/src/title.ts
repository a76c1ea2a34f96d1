// A conversation's title as the page shows it: in the title box, the
// (visually hidden) heading, the window's title and the conversation list.

import { readTitle } from "./api";

// showTitle picks up the name the server gives a conversation: from its
// first request, then the model's (titles are labels: no event carries
// them). A title being edited in the box is left alone.
export async function showTitle(threadID: string, root: HTMLElement, heading: HTMLElement): Promise<void> {
  const input = root.querySelector<HTMLInputElement>("[data-testid=title-input]");
  if (!input || document.activeElement === input) return;
  const title = await readTitle(threadID);
  // (A label only: one that could not be read shows on the next load.)
  if (!title || title === input.value) return;
  input.value = title;
  heading.textContent = title;
  document.title = `${title} · gateway`;
  const link = document.querySelector<HTMLAnchorElement>(`[data-testid=thread-link][href="/t/${CSS.escape(threadID)}"]`);
  if (link) {
    link.title = title;
    // (the title's own span: a fork keeps its badge)
    const span = link.querySelector<HTMLElement>("[data-testid=thread-title]");
    if (span) span.lastChild?.replaceWith(title);
    else link.textContent = title;
  }
}
