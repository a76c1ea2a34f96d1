// Entry point of the page script.
import { ThreadView } from "./thread";
import { Drawer } from "./drawer";
import { groupByDay } from "./sidebar";

const app = document.querySelector<HTMLElement>("[data-testid=app]");
if (app) new Drawer(app).start();
const list = document.querySelector<HTMLElement>("[data-testid=thread-list]");
if (list) groupByDay(list);
const root = document.getElementById("thread");
if (root) new ThreadView(root).start();
