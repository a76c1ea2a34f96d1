// A card message (kind "card": one JSON document, e.g. the demo model's
// order) as the page shows it: an order as a table of its items with their
// amounts and the total; any other document pretty-printed. The JSON as
// the model wrote it stays one click away (Details), and text that does
// not parse is shown as it is. Everything goes in as text: nothing a model
// writes in a card becomes markup.

// cardStart: a reply that begins as a JSON object is a card in the
// making (only a card message is one JSON document; a Markdown reply does
// not start with "{").
export const cardStart = /^\s*\{/;

interface OrderItem {
  name: string;
  quantity: number;
  price: number;
}

// renderCard is the body of a card message (data-testid message-body).
export function renderCard(content: string): HTMLElement {
  let doc: unknown;
  try {
    doc = JSON.parse(content);
  } catch {
    return raw("pre", "body card", content);
  }
  const body = document.createElement("div");
  body.className = "body card-view";
  body.dataset.testid = "message-body";
  const items = orderItems(doc);
  if (items && doc && typeof doc === "object") {
    const d = doc as { currency?: unknown; total?: unknown };
    const currency = typeof d.currency === "string" ? d.currency : "";
    // The currency is said once, in the headings and the total; the cells
    // hold numbers, which line up.
    const money = (n: number) => (currency ? `${n.toFixed(2)} ${currency}` : n.toFixed(2));
    const per = currency ? ` (${currency})` : "";
    const title = raw("div", "card-title", items.length === 1 ? "Order: 1 item" : `Order: ${items.length} items`);
    const table = document.createElement("table");
    table.className = "order";
    table.dataset.testid = "order";
    const row = (cells: [string, string][], tag: "td" | "th" = "td") => {
      const tr = document.createElement("tr");
      for (const [text, cls] of cells) {
        const c = document.createElement(tag);
        if (cls) c.className = cls;
        c.textContent = text;
        tr.append(c);
      }
      return tr;
    };
    const head = document.createElement("thead");
    head.append(row([["Item", ""], ["Quantity", "align-right"], [`Unit price${per}`, "align-right"], [`Amount${per}`, "align-right"]], "th"));
    const rows = document.createElement("tbody");
    for (const it of items) {
      // In cents, so that 3 × 39.99 is 119.97 and not 119.97000000000001.
      const amount = (Math.round(it.price * 100) * it.quantity) / 100;
      const tr = row([[it.name, ""], [String(it.quantity), "align-right"], [it.price.toFixed(2), "align-right"], [amount.toFixed(2), "align-right"]]);
      tr.dataset.testid = "order-item";
      rows.append(tr);
    }
    table.append(head, rows);
    if (typeof d.total === "number") {
      const foot = document.createElement("tfoot");
      const tr = row([["Total", ""]], "th");
      tr.cells[0].colSpan = 3;
      tr.cells[0].scope = "row";
      const total = document.createElement("td");
      total.className = "align-right";
      total.textContent = money(d.total);
      tr.append(total);
      tr.dataset.testid = "order-total";
      foot.append(tr);
      table.append(foot);
    }
    const scroll = document.createElement("div");
    scroll.className = "table-scroll";
    scroll.append(table);
    body.append(title, scroll, json(doc));
    return body;
  }
  body.append(raw("pre", "card", JSON.stringify(doc, null, 2)));
  return body;
}

// cardText is a card on one line, for lists and excerpts: an order's items
// and total ("Order: 2 × red mugs, 3 × blue plates; 211.95 EUR"), another
// document as compact JSON.
export function cardText(content: string): string {
  let doc: unknown;
  try {
    doc = JSON.parse(content);
  } catch {
    return content;
  }
  const items = orderItems(doc);
  if (!items) return JSON.stringify(doc);
  const d = doc as { currency?: unknown; total?: unknown };
  const total = typeof d.total === "number" ? `; ${d.total.toFixed(2)}${typeof d.currency === "string" ? ` ${d.currency}` : ""}` : "";
  return `Order: ${items.map((i) => `${i.quantity} × ${i.name}`).join(", ")}${total}`;
}

// orderItems is the items of an order card, or null when doc is not one.
function orderItems(doc: unknown): OrderItem[] | null {
  if (!doc || typeof doc !== "object" || Array.isArray(doc)) return null;
  const d = doc as { type?: unknown; items?: unknown };
  if (d.type !== "order" || !Array.isArray(d.items) || d.items.length === 0) return null;
  const out: OrderItem[] = [];
  for (const it of d.items as unknown[]) {
    const i = (it && typeof it === "object" ? it : {}) as Record<string, unknown>;
    if (typeof i.name !== "string" || typeof i.quantity !== "number" || typeof i.price !== "number") return null;
    out.push({ name: i.name, quantity: i.quantity, price: i.price });
  }
  return out;
}

// json is the document itself, folded away.
function json(doc: unknown): HTMLElement {
  const d = document.createElement("details");
  d.className = "card-json";
  const s = document.createElement("summary");
  s.textContent = "JSON";
  d.append(s, raw("pre", "card", JSON.stringify(doc, null, 2)));
  return d;
}

function raw(tag: "pre" | "div", cls: string, text: string): HTMLElement {
  const e = document.createElement(tag);
  e.className = cls;
  if (cls.startsWith("body")) e.dataset.testid = "message-body";
  e.textContent = text;
  return e;
}
