// Markdown of assistant messages, rendered in one place (this module) for
// every view: history (the server's first paint is re-rendered here before
// it is shown), the live stream, saved fragments and discarded text.
//
// Safety, in layers: markdown-it with raw HTML off (a tag in the model's
// text is shown as text) and its link check (no javascript:, vbscript:,
// file:, data: links); then DOMPurify with an allowlist of the tags
// Markdown produces; then our own pass: a link keeps its href only for
// http(s) and mailto and opens in a new tab with rel="noopener noreferrer
// nofollow"; an image is never fetched (it becomes a link to its address);
// a class survives only if it is one we render.
import MarkdownIt from "markdown-it";
import DOMPurify from "dompurify";
import hljs from "highlight.js/lib/core";
import bash from "highlight.js/lib/languages/bash";
import css from "highlight.js/lib/languages/css";
import go from "highlight.js/lib/languages/go";
import javascript from "highlight.js/lib/languages/javascript";
import json from "highlight.js/lib/languages/json";
import python from "highlight.js/lib/languages/python";
import sql from "highlight.js/lib/languages/sql";
import typescript from "highlight.js/lib/languages/typescript";
import xml from "highlight.js/lib/languages/xml";
import yaml from "highlight.js/lib/languages/yaml";

// Highlighting for a bounded set of languages (each costs bundle size); a
// fence naming another one, or none, stays plain. Aliases are highlight.js's
// own (js, ts, sh, html, yml …). Registered when the first fence naming
// a language is drawn (registering costs about 20 ms, at the page's start
// otherwise, for conversations that may hold no code).
let registered = false;
function highlighter(): typeof hljs {
  if (!registered) {
    for (const [name, lang] of Object.entries({ bash, css, go, javascript, json, python, sql, typescript, xml, yaml })) {
      hljs.registerLanguage(name, lang);
    }
    registered = true;
  }
  return hljs;
}

const md = new MarkdownIt({ html: false, linkify: true, typographer: false });

// An image is shown as a link to it, never fetched: the page's CSP allows
// images from itself only, and a model's image address is not ours.
md.renderer.rules.image = (tokens, idx) => {
  const t = tokens[idx];
  const src = t.attrGet("src") ?? "";
  const alt = t.children?.map((c) => c.content).join("") || src;
  return `<a href="${md.utils.escapeHtml(src)}" class="md-image">${md.utils.escapeHtml(`Image: ${alt}`)}</a>`;
};

// Table alignment as a class, not a style attribute (styles are dropped).
for (const rule of ["th_open", "td_open"] as const) {
  md.renderer.rules[rule] = (tokens, idx, options, _env, self) => {
    const t = tokens[idx];
    const align = /text-align:(left|right|center)/.exec(t.attrGet("style") ?? "")?.[1];
    t.attrs = (t.attrs ?? []).filter(([k]) => k !== "style");
    if (align) t.attrSet("class", `align-${align}`);
    return self.renderToken(tokens, idx, options);
  };
}

const allowedTags = [
  "p", "br", "hr", "strong", "em", "s", "del", "code", "pre", "blockquote",
  "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6",
  "table", "thead", "tbody", "tr", "th", "td", "a",
];
const allowedClass = /^(language-[\w+#.-]{1,40}|align-(left|right|center)|md-image)$/;
const allowedHref = new Set(["http:", "https:", "mailto:"]);

// renderMarkdown turns text into a sanitized fragment: see the module
// comment. The same text always gives the same DOM.
export function renderMarkdown(text: string): DocumentFragment {
  const frag = DOMPurify.sanitize(md.render(text), {
    ALLOWED_TAGS: allowedTags,
    ALLOWED_ATTR: ["href", "title", "class", "start"],
    ALLOW_DATA_ATTR: false,
    RETURN_DOM_FRAGMENT: true,
  });
  // markdown-it puts a newline between blocks; as text nodes they would
  // only add to the message's text, so they go.
  for (const parent of [frag, ...frag.querySelectorAll("ul, ol, blockquote, table, thead, tbody, tr")]) {
    for (const n of [...parent.childNodes]) {
      if (n.nodeType === Node.TEXT_NODE && !/\S/.test(n.textContent ?? "")) n.remove();
    }
  }
  for (const e of frag.querySelectorAll<HTMLElement>("[class]")) {
    const keep = e.className.split(/\s+/).filter((c) => allowedClass.test(c));
    if (keep.length) e.className = keep.join(" ");
    else e.removeAttribute("class");
  }
  for (const a of frag.querySelectorAll("a")) {
    let ok = false;
    try {
      ok = allowedHref.has(new URL(a.getAttribute("href") ?? "").protocol); // absolute only
    } catch {
      ok = false;
    }
    if (!ok) {
      a.removeAttribute("href");
      continue;
    }
    a.target = "_blank";
    a.rel = "noopener noreferrer nofollow";
  }
  for (const table of frag.querySelectorAll("table")) {
    // A wide table scrolls inside the message, never widens the page.
    const wrap = document.createElement("div");
    wrap.className = "table-scroll";
    table.replaceWith(wrap);
    wrap.append(table);
  }
  for (const li of frag.querySelectorAll("li")) taskItem(li);
  for (const pre of frag.querySelectorAll("pre")) codeBlock(pre);
  return frag;
}

// markdownText is the text a reader sees of Markdown, on one line (for
// lists and excerpts): no markup characters, no code block's header, a
// space between blocks.
export function markdownText(text: string): string {
  const box = document.createElement("div");
  box.append(renderMarkdown(text));
  for (const head of box.querySelectorAll(".code-head")) head.remove();
  for (const b of box.querySelectorAll("p, h1, h2, h3, h4, h5, h6, li, pre, th, td, blockquote")) b.append(" ");
  return (box.textContent ?? "").replace(/\s+/g, " ").trim();
}

// taskItem turns a list item that starts with "[ ] " or "[x] " into a
// disabled checkbox and the rest (GitHub task lists).
function taskItem(li: HTMLLIElement): void {
  const host = li.firstElementChild?.tagName === "P" ? li.firstElementChild : li;
  const first = host.firstChild;
  if (!first || first.nodeType !== Node.TEXT_NODE) return;
  const m = /^\[([ xX])\][ \t]/.exec(first.textContent ?? "");
  if (!m) return;
  first.textContent = (first.textContent ?? "").slice(m[0].length);
  const box = document.createElement("input");
  box.type = "checkbox";
  box.disabled = true;
  box.checked = m[1] !== " ";
  box.setAttribute("aria-label", box.checked ? "done" : "not done");
  host.insertBefore(box, first);
  li.classList.add("task");
}

// codeBlock gives a code block a header: its language (when the fence
// names one) and a copy button.
function codeBlock(pre: HTMLPreElement): void {
  const code = pre.querySelector("code");
  const lang = /(?:^|\s)language-([\w+#.-]+)/.exec(code?.className ?? "")?.[1] ?? "";
  const head = document.createElement("div");
  head.className = "code-head";
  const label = document.createElement("span");
  label.className = "code-lang";
  label.textContent = lang || "text";
  // The code as written, without the line end that closes the fence: pasted
  // into a terminal, a trailing newline would run the last command.
  head.append(label, copyButton("Copy code", () => (code?.textContent ?? "").replace(/\n$/, "")));
  if (code && lang && highlighter().getLanguage(lang)) {
    // highlight.js escapes the code and adds spans; only those spans pass.
    const html = hljs.highlight(code.textContent ?? "", { language: lang, ignoreIllegals: true }).value;
    code.replaceChildren(DOMPurify.sanitize(html, { ALLOWED_TAGS: ["span"], ALLOWED_ATTR: ["class"], RETURN_DOM_FRAGMENT: true }));
    for (const span of code.querySelectorAll("span[class]")) {
      if (!/^(hljs-[\w-]+\s*)+$/.test(span.className)) span.removeAttribute("class");
    }
    code.classList.add("hljs");
  }
  const box = document.createElement("div");
  box.className = "code-block";
  pre.replaceWith(box);
  box.append(head, pre);
}

// copyButton copies what text() returns when pressed, and says so (or
// says that the browser refused).
export function copyButton(label: string, text: () => string): HTMLButtonElement {
  const b = document.createElement("button");
  b.type = "button";
  b.className = "btn ghost small copy";
  b.dataset.testid = "copy";
  b.textContent = label;
  b.addEventListener("click", () => {
    const done = (what: string) => {
      b.textContent = what;
      b.dataset.copied = what === "Copied" ? "true" : "false";
      window.setTimeout(() => {
        b.textContent = label;
        delete b.dataset.copied;
      }, 1500);
    };
    if (!navigator.clipboard) {
      done("Copy not allowed here");
      return;
    }
    navigator.clipboard.writeText(text()).then(
      () => done("Copied"),
      () => done("Copy not allowed here"),
    );
  });
  return b;
}

// LiveMarkdown is the body of a reply that is still streaming: set may be
// called for every delta, the text is rendered at most once per animation
// frame, and a reader at the bottom of the page stays there.
export class LiveMarkdown {
  readonly el: HTMLElement;
  private text = "";
  private shown = "";
  private frame = 0;

  constructor(attrs: Record<string, string>) {
    this.el = document.createElement("div");
    for (const [k, v] of Object.entries(attrs)) this.el.setAttribute(k, v);
  }

  set(text: string): void {
    this.text = text;
    if (this.frame || text === this.shown) return;
    this.frame = window.requestAnimationFrame(() => {
      this.frame = 0;
      this.show();
    });
  }

  // flush renders what was set now, without waiting for a frame.
  flush(): void {
    if (this.frame) {
      window.cancelAnimationFrame(this.frame);
      this.frame = 0;
    }
    if (this.text !== this.shown) this.show();
  }

  private show(): void {
    const atBottom = window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 80;
    this.shown = this.text;
    this.el.replaceChildren(renderMarkdown(this.shown));
    if (atBottom) window.scrollTo({ top: document.documentElement.scrollHeight });
  }
}
