// Entry point of the page script.
import { ThreadView } from "./thread";

const root = document.getElementById("thread");
if (root) new ThreadView(root).start();
