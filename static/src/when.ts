// When something happened, written one way everywhere on the page: the
// time of a message, of a tool call and its last change, of a checkpoint,
// of a lookup the gateway keeps making, and the day groups of the
// conversation list. In this browser's language and time zone (the server
// knows neither: it sends RFC 3339 times, and renders none itself; a time
// it rendered would be a <time datetime> this module writes).
//
//   today:          "3:09 PM"           (seconds: "3:09:26 PM")
//   another day:    "Mar 14, 3:09 PM"   (seconds: "Mar 14, 3:09:26 PM")
//   another year:   "Mar 14, 2025, 3:09 PM"
//   exact (a hover title): "Friday, March 14, 2025 at 3:09:26 PM"
//
// Seconds are for lists whose points can be seconds apart (the
// checkpoints); the rest writes minutes.

import { el } from "./dom";

// format is the formatter of kind (0 today, 1 this year, 2 another
// year; exact), in minutes or seconds, made when first asked for: making
// one costs about 10 ms at the page's start, and a page uses two or three
// of the seven.
type Kind = 0 | 1 | 2 | "exact";
const made = new Map<string, Intl.DateTimeFormat>();
function format(kind: Kind, seconds = false): Intl.DateTimeFormat {
  const key = `${kind}${seconds ? "s" : ""}`;
  let f = made.get(key);
  if (!f) {
    const time: Intl.DateTimeFormatOptions = { hour: "numeric", minute: "2-digit", ...(seconds ? { second: "2-digit" } : {}) };
    const opts: Intl.DateTimeFormatOptions[] = [time, { month: "short", day: "numeric", ...time }, { year: "numeric", month: "short", day: "numeric", ...time }];
    f = new Intl.DateTimeFormat([], kind === "exact" ? { dateStyle: "full", timeStyle: "medium" } : opts[kind]);
    made.set(key, f);
  }
  return f;
}

const day = 24 * 60 * 60 * 1000;
const startOfDay = (d: Date): number => new Date(d.getFullYear(), d.getMonth(), d.getDate()).getTime();

// parse reads an RFC 3339 time (a Date as is); null when it is not one.
function parse(t: string | Date): Date | null {
  const d = typeof t === "string" ? new Date(t) : t;
  return Number.isNaN(d.getTime()) ? null : d;
}

// Options of when: seconds written too; now, the time "today" is of.
export interface WhenOptions {
  seconds?: boolean;
  now?: Date;
}

// when writes t short: the time of day if it is today, with the day
// before it otherwise, and the year if it is not this year ("" for what
// is not a time).
export function when(t: string | Date, { seconds = false, now = new Date() }: WhenOptions = {}): string {
  const d = parse(t);
  if (!d) return "";
  const kind = startOfDay(d) === startOfDay(now) ? 0 : d.getFullYear() === now.getFullYear() ? 1 : 2;
  return format(kind, seconds).format(d);
}

// whenExact writes t whole, to the second.
export function whenExact(t: string | Date): string {
  const d = parse(t);
  return d ? format("exact").format(d) : "";
}

// timeElement is t as the page shows it: a <time> with the machine's
// time, when's words, and the exact time on hover.
export function timeElement(t: string, attrs: Record<string, string> = {}, opts: WhenOptions = {}): HTMLTimeElement {
  return el("time", { ...attrs, datetime: t, title: whenExact(t) }, when(t, opts));
}

// dayGroup is the conversation list's group of a time t (ms since the
// epoch): Today, Yesterday, Previous 7 days or Older, by the days of this
// browser's time zone.
export function dayGroup(t: number, now = new Date()): string {
  const today = startOfDay(now);
  return t >= today ? "Today" : t >= today - day ? "Yesterday" : t >= today - 7 * day ? "Previous 7 days" : "Older";
}
