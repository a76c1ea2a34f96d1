// The examples of an empty conversation's hint (web/pages.templ,
// starterHint): pressed, one goes into the box — after what is typed
// there, if anything — with the focus, to be changed or sent. Nothing is
// sent by itself.

export function startExamples(root: HTMLElement): void {
  const input = root.querySelector<HTMLTextAreaElement>("[data-testid=composer-input]");
  root.querySelector("[data-testid=starter]")?.addEventListener("click", (e) => {
    const example = (e.target as HTMLElement).closest<HTMLElement>("[data-example]")?.dataset.example;
    if (!example || !input) return;
    const typed = input.value.trim();
    input.value = typed ? `${input.value.trimEnd()}\n\n${example}` : example;
    // (As typing does: the draft keeps it.)
    input.dispatchEvent(new Event("input", { bubbles: true }));
    input.focus();
    input.setSelectionRange(input.value.length, input.value.length);
  });
}
