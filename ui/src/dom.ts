// A few DOM helpers: every value goes in as text (never as markup).

type Attrs = Record<string, string | number | boolean | null | undefined | EventListener>;
type Child = Node | string | number | null | undefined | false;

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Attrs = {},
  ...children: (Child | Child[])[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (typeof value === "function") el.addEventListener(name.replace(/^on/, ""), value);
    else if (value === true) el.setAttribute(name, "");
    else el.setAttribute(name, String(value));
  }
  append(el, children);
  return el;
}

const SVG = "http://www.w3.org/2000/svg";

export function s(tag: string, attrs: Record<string, string | number> = {}, ...children: (Node | string)[]): SVGElement {
  const el = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, String(value));
  for (const child of children) el.append(child);
  return el;
}

function append(el: Element, children: (Child | Child[])[]): void {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
}

export function iso(ms: number | null | undefined): string {
  return typeof ms === "number" && ms > 0 ? new Date(ms).toISOString() : "—";
}

export function duration(ms: number | null | undefined): string {
  if (typeof ms !== "number" || ms < 0) return "—";
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  if (ms < 3_600_000) return `${Math.floor(ms / 60_000)} min ${Math.round((ms % 60_000) / 1000)} s`;
  return `${Math.floor(ms / 3_600_000)} h ${Math.round((ms % 3_600_000) / 60_000)} min`;
}

export function badge(status: string): HTMLElement {
  return h("span", { class: `badge status-${status}`, "data-status": status }, status);
}

let toastTimer = 0;

export function toast(text: string): void {
  const el = document.getElementById("toast");
  if (!el) return;
  el.textContent = text;
  window.clearTimeout(toastTimer);
  toastTimer = window.setTimeout(() => (el.textContent = ""), 4000);
}

export function errorBox(err: unknown): HTMLElement {
  const text = err instanceof Error ? err.message : String(err);
  const code = (err as { code?: string }).code;
  return h("p", { class: "error", role: "alert" }, code ? `${code}: ${text}` : text);
}

export function table(head: string[], rows: (Node | string)[][], caption?: string): HTMLElement {
  return h(
    "div",
    { class: "scroll" },
    h(
      "table",
      { class: "cards" },
      caption ? h("caption", {}, caption) : null,
      h("thead", {}, h("tr", {}, head.map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, rows.map((cells) => h("tr", {}, cells.map((c, i) => h("td", { "data-label": head[i] ?? "" }, c))))),
    ),
  );
}
