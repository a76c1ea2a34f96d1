// The composer's text of each conversation, in this browser's
// localStorage (it may be unavailable: then nothing is kept).
const draftKey = (threadID: string) => `gateway.draft.${threadID}`;

export function loadDraft(threadID: string): string {
  try {
    return localStorage.getItem(draftKey(threadID)) ?? "";
  } catch {
    return "";
  }
}

export function saveDraft(threadID: string, text: string): void {
  try {
    if (text.trim()) localStorage.setItem(draftKey(threadID), text);
    else localStorage.removeItem(draftKey(threadID));
  } catch {
    // Storage full or refused: the text stays in the box, not kept beyond it.
  }
}
