// Entry point of the page script.
import { ThreadView } from "./thread";
import { Drawer } from "./drawer";
import { ThreadSearch, groupByDay } from "./sidebar";
import { watchToolServers } from "./toolservers";
import { startRename } from "./title";
import { HomeComposer } from "./start";
import { startExamples } from "./starter";
import { showDeleted } from "./deletepanel";

const app = document.querySelector<HTMLElement>("[data-testid=app]");
if (app) new Drawer(app).start();
// Ctrl+Shift+O (⌘⇧O on a Mac) starts a new conversation, as in other chat
// apps; the composer hint says so.
document.addEventListener("keydown", (e) => {
  if ((e.ctrlKey || e.metaKey) && e.shiftKey && !e.altKey && e.key.toLowerCase() === "o") {
    const form = document.querySelector<HTMLFormElement>("form.new-thread");
    if (!form) return;
    e.preventDefault();
    form.requestSubmit();
  }
});
const list = document.querySelector<HTMLElement>("[data-testid=thread-list]");
if (list) groupByDay(list);
const searchForm = document.querySelector<HTMLFormElement>("[data-testid=thread-search]");
const searchInput = document.querySelector<HTMLInputElement>("[data-testid=thread-search-input]");
const searchStatus = document.querySelector<HTMLElement>("[data-testid=thread-search-status]");
const more = document.querySelector<HTMLAnchorElement>("[data-testid=thread-more]");
if (list && searchForm && searchInput && searchStatus) new ThreadSearch(searchForm, searchInput, list, searchStatus, more).start();
const root = document.getElementById("thread");
if (root) {
  new ThreadView(root).start();
  startRename(root, root.dataset.threadId ?? "");
  startExamples(root);
}
const home = document.querySelector<HTMLFormElement>("[data-testid=home-composer]");
if (home) new HomeComposer(home).start();
const listStatus = document.querySelector<HTMLElement>("[data-testid=list-status]");
if (listStatus) showDeleted(listStatus);
const noticePlace = document.querySelector<HTMLElement>("form.composer") ?? document.getElementById("main");
if (noticePlace) watchToolServers(noticePlace);
