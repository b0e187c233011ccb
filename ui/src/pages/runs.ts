// Runs: the search projection (GET /v1/search) with filters, facet counts, pages (its keyset
// cursor), saved views (localStorage) and, for operators, bulk cancel / re-drive.

import { ApiError, get, post } from "../api";
import { badge, h, iso, table, toast } from "../dom";
import type { Ctx } from "../main";

interface RunDoc {
  run_id: string;
  workflow: string;
  workflow_version: string;
  version: string;
  status: string;
  tenant: string;
  started_at_ms: number;
  updated_at_ms: number;
  failed_stages: string[];
  failure_classes: string[];
}

interface Search {
  runs: RunDoc[];
  total: number;
  next_cursor: string | null;
  facets: Record<string, Record<string, number>>;
  lag_ms: number | null;
  source: string;
}

export const PAGE = 25;
const LIVE_MS = 3000;
const MAX = 500; // the most one search answers
const BULK_MAX = 5000; // the most runs one bulk action over a query takes
const VIEWS = "accord.views";
const FACETS: [string, string][] = [
  ["status", "Status"],
  ["version", "Workflow version"],
  ["failed_stage", "Failed stage"],
  ["failure_class", "Failure class"],
  ["tenant", "Tenant"],
];
// the cursor of each page already seen, per query: "Previous" goes back without a new offset
const trail = new Map<string, string[]>();

export interface View {
  name: string;
  params: string;
}

/** Saved views: the filters by name, in this browser's localStorage. */
export const views = {
  all(): View[] {
    try {
      const doc = JSON.parse(localStorage.getItem(VIEWS) ?? "[]") as unknown;
      return Array.isArray(doc) ? doc.filter((v): v is View => typeof v?.name === "string" && typeof v?.params === "string") : [];
    } catch {
      return [];
    }
  },
  save(name: string, params: string): void {
    const rest = views.all().filter((v) => v.name !== name);
    localStorage.setItem(VIEWS, JSON.stringify([...rest, { name, params }].sort((a, b) => a.name.localeCompare(b.name))));
  },
  remove(name: string): void {
    localStorage.setItem(VIEWS, JSON.stringify(views.all().filter((v) => v.name !== name)));
  },
};

/** The filters of ``p`` alone (no page, cursor or live flag): what a saved view keeps. */
function filters(p: URLSearchParams): string {
  const out = new URLSearchParams();
  for (const key of FIELDS) {
    const v = p.get(key);
    if (v) out.set(key, v);
  }
  return out.toString();
}
const FIELDS = ["text", "workflow", "status", "stage", "tenant", "since"] as const;
const STATUSES = ["", "running", "completed", "failed", "cancelled"];
const SINCE = ["", "15m", "1h", "1d", "7d", "30d"];

/** The search terms the form's fields come to (those GET /v1/search takes in ``q``). */
export function terms(p: URLSearchParams): string {
  const out: string[] = [];
  for (const key of ["workflow", "status", "stage", "tenant", "since"]) {
    const v = (p.get(key) ?? "").trim();
    if (v) out.push(`${key}:${v.includes(" ") ? `"${v}"` : v}`);
  }
  const text = (p.get("text") ?? "").trim();
  if (text) out.push(text);
  return out.join(" ");
}

function go(p: URLSearchParams): void {
  for (const [k, v] of [...p.entries()]) if (!v) p.delete(k);
  location.hash = `#/runs?${p.toString()}`;
}

/** Each run's own answer to a bulk action, a few at a time; refusals are kept, not thrown. */
async function each(ids: string[], act: (id: string) => Promise<string>, progress: (done: number) => void): Promise<[string, boolean, string][]> {
  const out: [string, boolean, string][] = [];
  let next = 0;
  const one = async () => {
    while (next < ids.length) {
      const id = ids[next++] as string;
      try {
        out.push([id, true, await act(id)]);
      } catch (err) {
        const why = err instanceof ApiError ? `${err.code}: ${err.message}` : err instanceof Error ? err.message : String(err);
        out.push([id, false, why]);
      }
      progress(out.length);
    }
  };
  await Promise.all(Array.from({ length: Math.min(4, ids.length) }, one));
  const order = new Map(ids.map((id, i) => [id, i]));
  return out.sort((a, b) => (order.get(a[0]) ?? 0) - (order.get(b[0]) ?? 0));
}

/** Every run the query matches (paged by the cursor), at most ``BULK_MAX``. */
async function everyRun(q: string): Promise<RunDoc[]> {
  const out: RunDoc[] = [];
  let cursor = "";
  for (;;) {
    const page = await get<Search>("/v1/search", { q, limit: MAX, ...(cursor ? { cursor } : {}) });
    out.push(...page.runs);
    if (!page.next_cursor || out.length >= BULK_MAX) return out.slice(0, BULK_MAX);
    cursor = page.next_cursor;
  }
}

export async function runsPage(ctx: Ctx): Promise<void> {
  document.title = "Runs · Accord";
  const p = ctx.params;
  const q = terms(p);
  const seen = trail.get(q) ?? [""];
  trail.set(q, seen);
  let page = Math.max(1, Number.parseInt(p.get("page") ?? "1", 10) || 1);
  let cursor = p.get("cursor") ?? "";
  if (page > 1 && !cursor) page = 1; // a page number without its cursor starts again
  if (page === 1) cursor = "";
  seen[page - 1] = cursor;
  const may = ctx.me.may;
  const bulk = Boolean(may["run.cancel"] || may["run.redrive"]);

  const field = (name: (typeof FIELDS)[number], label: string, control: HTMLInputElement | HTMLSelectElement) => {
    control.id = `f-${name}`;
    control.name = name;
    control.value = p.get(name) ?? "";
    return h("div", { class: "field" }, h("label", { for: control.id }, label), control);
  };
  const select = (options: string[], labels: Record<string, string> = {}) =>
    h("select", {}, options.map((o) => h("option", { value: o }, labels[o] ?? (o || "any"))));
  const tenants = ctx.me.tenants.length > 1 ? field("tenant", "Tenant", select(["", ...ctx.me.tenants])) : null;
  const form = h(
    "form",
    { class: "filters", role: "search", "aria-label": "Filter runs" },
    field("text", "Words", h("input", { type: "search", placeholder: "stage, error class, requester…" })),
    field("workflow", "Workflow (name or name@version)", h("input", { type: "text" })),
    field("status", "Status", select(STATUSES)),
    field("stage", "Stage (name or name=status)", h("input", { type: "text" })),
    tenants,
    field("since", "Updated within", select(SINCE, { "": "any time" })),
    h("div", { class: "field actions" }, h("button", { type: "submit" }, "Search"), h("a", { href: "#/runs", class: "button secondary" }, "Clear")),
  );
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const next = new URLSearchParams();
    for (const el of form.querySelectorAll<HTMLInputElement | HTMLSelectElement>("input, select")) next.set(el.name, el.value);
    if (p.get("live") === "1") next.set("live", "1");
    go(next);
  });

  // saved views: the current filters by name, beside the form
  const viewList = h("ul", { class: "views", id: "views" });
  const drawViews = () => {
    const all = views.all();
    viewList.replaceChildren(
      ...(all.length === 0
        ? [h("li", { class: "help" }, "none saved yet")]
        : all.map((v) => {
            const forget = h("button", { type: "button", class: "secondary small", "aria-label": `Forget view ${v.name}` }, "×");
            forget.addEventListener("click", () => {
              views.remove(v.name);
              drawViews();
            });
            return h("li", {}, h("a", { href: `#/runs?${v.params}`, "data-view": v.name, "aria-current": v.params === filters(p) ? "true" : null }, v.name), forget);
          })),
    );
  };
  drawViews();
  const viewName = h("input", { id: "view-name", type: "text", maxlength: 60 });
  const saveForm = h(
    "form",
    { class: "filters inline", "aria-label": "Save this view" },
    h("div", { class: "field" }, h("label", { for: "view-name" }, "Save filters as"), viewName),
    h("div", { class: "field actions" }, h("button", { type: "submit", class: "secondary" }, "Save view")),
  );
  saveForm.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const name = viewName.value.trim();
    if (!name) return;
    views.save(name, filters(p));
    viewName.value = "";
    drawViews();
    toast(`Saved view “${name}”.`);
  });
  const savedBox = h("section", { class: "saved card", "aria-labelledby": "views-title" }, h("h2", { id: "views-title" }, "Saved views"), viewList, saveForm);

  const selected = new Set<string>();
  let shownRuns: RunDoc[] = [];
  let lastTotal = 0;
  const bulkBox = h("section", { class: "bulk", "aria-label": "Bulk actions", hidden: !bulk });
  const results = h("div", { class: "with-side" });
  const selCount = h("span", { id: "selected-count", "aria-live": "polite" });
  const drawSel = () => {
    selCount.textContent = `${selected.size} selected`;
    for (const b of bulkBox.querySelectorAll<HTMLButtonElement>("[data-needs-selection]")) b.disabled = selected.size === 0;
  };

  // the confirmation names the count; then each run's own answer, refusals named
  const confirmBox = h("div", { class: "confirm", hidden: true, role: "group", "aria-label": "Confirm bulk action" });
  const answers = h("div", { id: "bulk-answers", "aria-live": "polite" });
  const ask = (what: "cancel" | "redrive", scope: "selection" | "query") => {
    const reason = h("input", { id: "bulk-reason", type: "text", placeholder: "reason (recorded)" });
    const no = h("button", { type: "button", class: "secondary" }, "Keep them");
    no.addEventListener("click", () => (confirmBox.hidden = true));
    const pick = async (): Promise<RunDoc[]> => (scope === "selection" ? shownRuns.filter((r) => selected.has(r.run_id)) : await everyRun(q));
    const verb = what === "cancel" ? "Cancel" : "Re-drive the failed stages of";
    const n = scope === "selection" ? selected.size : Math.min(lastTotal, BULK_MAX); // the query's first BULK_MAX
    const yes = h("button", { type: "button", class: "danger", id: "bulk-confirm" }, `${verb} ${n} run${n === 1 ? "" : "s"}`);
    yes.addEventListener("click", async () => {
      yes.disabled = no.disabled = true;
      const runs = await pick();
      const failed = new Map(runs.map((r) => [r.run_id, r.failed_stages]));
      answers.replaceChildren(h("p", { class: "help", id: "bulk-progress" }, `0 of ${runs.length} answered`));
      const act = async (id: string): Promise<string> => {
        const path = `/v1/runs/${encodeURIComponent(id)}`;
        if (what === "cancel") {
          const got = await post<{ status?: string }>(`${path}/cancel`, { reason: reason.value });
          return got.status ?? "asked";
        }
        const stages = failed.get(id) ?? [];
        if (stages.length === 0) throw new Error("no failed stage to re-drive");
        for (const stage of stages) await post(`${path}/stages/${encodeURIComponent(stage)}/redrive`, {});
        return `re-drove ${stages.join(", ")}`;
      };
      const progress = answers.firstElementChild as HTMLElement;
      const out = await each(runs.map((r) => r.run_id), act, (k) => (progress.textContent = `${k} of ${runs.length} answered`));
      const refused = out.filter((o) => !o[1]);
      confirmBox.hidden = true;
      answers.replaceChildren(
        h("p", { class: refused.length ? "error" : "ok", id: "bulk-summary", role: "status" }, `${verb} ${out.length} run${out.length === 1 ? "" : "s"}: ${out.length - refused.length} done, ${refused.length} refused`),
        h(
          "ul",
          { class: "bulk-answers" },
          out.map(([id, ok, text]) => h("li", { "data-run": id, "data-ok": ok ? "true" : "false" }, h("a", { href: `#/runs/${encodeURIComponent(id)}`, class: "mono" }, id), ok ? ` — ${text}` : ` — refused: ${text}`)),
        ),
      );
      selected.clear();
      await draw();
    });
    confirmBox.replaceChildren(
      h("strong", {}, `${verb} ${n} run${n === 1 ? "" : "s"}${scope === "query" ? (q ? ` matching “${q}”` : " (every run you can see)") : ""}${scope === "query" && lastTotal > BULK_MAX ? ` — the newest ${BULK_MAX} of ${lastTotal}` : ""}?`),
      ...(what === "cancel" ? [h("label", { for: "bulk-reason" }, "Reason"), reason] : []),
      yes,
      no,
    );
    confirmBox.hidden = false;
    (what === "cancel" ? reason : yes).focus();
  };
  const bulkButton = (label: string, what: "cancel" | "redrive", scope: "selection" | "query", allowed: boolean) => {
    if (!allowed) return null;
    const b = h("button", { type: "button", class: what === "cancel" ? "danger" : "secondary", "data-needs-selection": scope === "selection" ? "" : null }, label);
    b.addEventListener("click", () => ask(what, scope));
    return b;
  };
  bulkBox.append(
    h(
      "div",
      { class: "actions" },
      selCount,
      bulkButton("Cancel selected…", "cancel", "selection", Boolean(may["run.cancel"])),
      bulkButton("Re-drive selected…", "redrive", "selection", Boolean(may["run.redrive"])),
      bulkButton("Cancel all matching…", "cancel", "query", Boolean(may["run.cancel"])),
      bulkButton("Re-drive all matching…", "redrive", "query", Boolean(may["run.redrive"])),
    ),
    confirmBox,
    answers,
  );

  const draw = async () => {
    const found = await get<Search>("/v1/search", { q, limit: PAGE, ...(cursor ? { cursor } : {}) });
    const shown = found.runs;
    shownRuns = shown;
    lastTotal = found.total;
    for (const id of [...selected]) if (!shown.some((r) => r.run_id === id)) selected.delete(id);
    const facet = (name: string, title: string) => {
      const counts = Object.entries(found.facets[name] ?? {}).sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]));
      if (name === "tenant" && counts.length < 2) return null; // one tenant: nothing to tell apart
      return h(
        "section",
        { class: "facet", "aria-label": `${title} counts` },
        h("h2", {}, title),
        counts.length === 0
          ? h("p", { class: "help" }, "none")
          : h(
              "ul",
              {},
              counts.map(([value, n]) => {
                const next = new URLSearchParams(p);
                if (name === "version") next.set("workflow", value);
                // a failed run: the stage among its failed ones; otherwise: the stage in failed
                else if (name === "failed_stage") next.set("stage", p.get("status") === "failed" ? value : `${value}=failed`);
                else if (name === "failure_class") next.set("text", value);
                else next.set(name, value);
                next.delete("page");
                next.delete("cursor");
                return h("li", {}, h("a", { href: `#/runs?${next.toString()}`, "data-facet": `${name}:${value}` }, value, " ", h("span", { class: "count" }, String(n))));
              }),
            ),
      );
    };

    const check = (r: RunDoc) => {
      const box = h("input", { type: "checkbox", "aria-label": `Select ${r.run_id}`, "data-select": r.run_id, checked: selected.has(r.run_id) });
      box.addEventListener("change", () => {
        if (box.checked) selected.add(r.run_id);
        else selected.delete(r.run_id);
        drawSel();
      });
      return box;
    };
    const rows = shown.map((r) => [
      ...(bulk ? [check(r)] : []),
      h("a", { href: `#/runs/${encodeURIComponent(r.run_id)}`, class: "mono" }, r.run_id),
      r.workflow_version || r.workflow,
      badge(r.status),
      r.tenant,
      r.failed_stages.length ? r.failed_stages.join(", ") : "—",
      h("time", { datetime: iso(r.started_at_ms) }, iso(r.started_at_ms)),
      h("time", { datetime: iso(r.updated_at_ms) }, iso(r.updated_at_ms)),
    ]);
    const first = shown.length === 0 ? 0 : (page - 1) * PAGE + 1;
    const last = (page - 1) * PAGE + shown.length;
    const pageLink = (n: number, to: string | null, text: string) => {
      if (to === null) return h("span", { class: "button disabled", "aria-disabled": "true" }, text);
      const next = new URLSearchParams(p);
      next.set("page", String(n));
      next.set("cursor", to);
      return h("a", { href: `#/runs?${next.toString()}`, class: "button secondary", rel: text === "Next" ? "next" : "prev" }, text);
    };
    const back = page > 1 ? (seen[page - 2] ?? "") : null;
    const head = ["Run", "Workflow", "Status", "Tenant", "Failed stages", "Started", "Updated"];
    const all = h("input", { type: "checkbox", id: "select-page", checked: shown.length > 0 && shown.every((r) => selected.has(r.run_id)) });
    all.addEventListener("change", () => {
      for (const r of shown) {
        if (all.checked) selected.add(r.run_id);
        else selected.delete(r.run_id);
      }
      for (const b of results.querySelectorAll<HTMLInputElement>("[data-select]")) b.checked = all.checked;
      drawSel();
    });
    results.replaceChildren(
      h("aside", { class: "facets", "aria-label": "Facets" }, FACETS.map(([name, title]) => facet(name, title))),
      h(
        "section",
        { "aria-label": "Matching runs" },
        h("p", { class: "summary", id: "run-count", "aria-live": "polite" }, `${first}–${last} of ${found.total} run${found.total === 1 ? "" : "s"}`, q ? ` matching “${q}”` : "", found.lag_ms !== null ? ` · index ${found.lag_ms} ms behind` : ""),
        bulk && rows.length ? h("div", { class: "field check" }, all, h("label", { for: "select-page" }, "Select every run on this page")) : null,
        rows.length ? table(bulk ? ["Select", ...head] : head, rows, "Runs, newest update first") : h("p", {}, "No run matches."),
        h("nav", { class: "pager", "aria-label": "Pages" }, pageLink(page - 1, back, "Previous"), h("span", {}, `page ${page}`), pageLink(page + 1, found.next_cursor, "Next")),
      ),
    );
    drawSel();
  };
  // live: the results (never the form being typed in) are fetched again every few seconds
  const live = h("input", { type: "checkbox", id: "live", checked: p.get("live") === "1" });
  live.addEventListener("change", () => {
    const next = new URLSearchParams(p);
    next.set("live", live.checked ? "1" : "");
    go(next);
  });
  await draw();
  ctx.main.replaceChildren(
    h("h1", {}, "Runs"),
    h("div", { class: "runs-top" }, form, savedBox),
    h("div", { class: "field check live" }, live, h("label", { for: "live" }, `Live (refresh every ${LIVE_MS / 1000} s)`)),
    bulkBox,
    results,
  );
  if (live.checked) {
    const again = () => {
      window.setTimeout(() => {
        if (ctx.signal.aborted) return;
        void draw().catch(() => undefined).finally(again);
      }, LIVE_MS);
    };
    again();
  }
}
