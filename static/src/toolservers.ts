// The tool servers (MCP) the gateway calls, as /readyz lists them: a
// notice names those that are not connected, above the composer (which
// stays in view) or at the top of a page without one, so a user knows why
// their tools fail before asking for one. /readyz answers
// whoever asks and says only names and states (why a server is down is in
// the server's log).

import { readReadiness } from "./api";

interface ToolServer {
  name: string;
  connected: boolean;
  tools: number;
  since: string;
}

// watchToolServers shows the notice in place as the page loads, and again
// each time the tab comes back into view. (Not on a timer: a request that
// fails while the server restarts would be one more console error, and
// the state changes rarely.)
export function watchToolServers(place: HTMLElement): void {
  const notice = document.createElement("p");
  notice.className = "tool-servers-down";
  notice.dataset.testid = "tool-servers-down";
  notice.setAttribute("role", "status");
  notice.hidden = true;
  place.prepend(notice);
  const check = async (): Promise<void> => {
    let servers: ToolServer[] = [];
    try {
      const res = await readReadiness();
      if (!res.ok) return; // starting or stopping: keep what is shown
      servers = ((await res.json()) as { tool_servers?: ToolServer[] }).tool_servers ?? [];
    } catch {
      return; // offline: the connection status says so
    }
    const down = servers.filter((s) => !s.connected).map((s) => s.name);
    notice.hidden = down.length === 0;
    notice.textContent =
      down.length === 1
        ? `Tool server ${down[0]} is not connected: its tools fail until it reconnects (the gateway keeps trying).`
        : `Tool servers ${down.join(", ")} are not connected: their tools fail until they reconnect (the gateway keeps trying).`;
  };
  void check();
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") void check();
  });
}
