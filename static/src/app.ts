// Entry point of the page script.
import { ThreadView } from "./thread";
import { Drawer } from "./drawer";

const app = document.querySelector<HTMLElement>("[data-testid=app]");
if (app) new Drawer(app).start();
const root = document.getElementById("thread");
if (root) new ThreadView(root).start();
