// Workflows: the active ones; one workflow's versions, its plan graph, a diff between two
// versions' plans, and the compiler's findings on a pasted definition (authors).

import { get, post } from "../api";
import { errorBox, h, iso, table } from "../dom";
import { edgesOf, renderGraph, type Plan, type PlanStage } from "../graph";
import type { Ctx } from "../main";

interface Version {
  digest: string;
  version: string;
  active: boolean;
  activated_at_ms: number;
}

interface Audit {
  seq: number;
  at_ms: number;
  principal: string;
  action: string;
  target: string;
  detail: Record<string, unknown>;
}

interface Diagnostic {
  code: string;
  message: string;
  severity: string;
  file: string;
  line: number;
  column: number;
  path: string;
  stage: string;
}

interface Checked {
  ok: boolean;
  digest: string | null;
  plan: Plan | null;
  errors: number;
  diagnostics: Diagnostic[];
}

const short = (d: string) => d.slice(0, 19);

export async function workflowsPage(ctx: Ctx): Promise<void> {
  document.title = "Workflows · Accord";
  const doc = await get<{ workflows: { workflow: string; active: string }[] }>("/v1/workflows");
  const rows = doc.workflows.map((w) => [h("a", { href: `#/workflows/${encodeURIComponent(w.workflow)}` }, w.workflow), h("span", { class: "mono" }, short(w.active))]);
  ctx.main.replaceChildren(
    h("h1", {}, "Workflows"),
    rows.length ? table(["Workflow", "Active digest"], rows) : h("p", {}, "No workflow is active."),
    checker(ctx),
  );
}

export async function workflowPage(ctx: Ctx, name: string): Promise<void> {
  document.title = `${name} · Workflows · Accord`;
  const [versions, active] = await Promise.all([
    get<{ versions: Version[] }>(`/v1/workflows/${encodeURIComponent(name)}/versions`),
    get<{ plan: Plan; version: string; digest: string }>(`/v1/workflows/${encodeURIComponent(name)}`),
  ]);
  const list = versions.versions;
  const rows = list.map((v) => [v.version, h("span", { class: "mono", title: v.digest }, short(v.digest)), v.active ? h("strong", {}, "active") : "", h("time", { datetime: iso(v.activated_at_ms) }, iso(v.activated_at_ms))]);
  const diffBox = h("section", { "aria-labelledby": "diff-title" });
  const historyBox = h("section", { "aria-labelledby": "activations-title" }, h("h2", { id: "activations-title" }, "Activations and rollbacks"));
  if (ctx.me.may["audit.read"]) {
    const found = await Promise.all(
      ["workflow.activate", "workflow.rollback"].map((action) => get<{ records: Audit[] }>("/v1/audit", { action, limit: 500 })),
    );
    const records = found.flatMap((f) => f.records).filter((r) => r.target === name).sort((a, b) => a.at_ms - b.at_ms);
    const rows = records.map((r) => [
      h("time", { datetime: iso(r.at_ms) }, iso(r.at_ms)),
      r.action === "workflow.rollback" ? "rollback" : "activation",
      r.principal,
      h("span", { class: "mono" }, typeof r.detail["digest"] === "string" ? short(r.detail["digest"]) : "—"),
      r.detail["changed"] === false ? "already active" : "",
    ]);
    historyBox.append(rows.length ? table(["When (UTC)", "Action", "Who", "Digest", ""], rows) : h("p", {}, "None recorded through the API."));
  } else {
    historyBox.append(h("p", { class: "help" }, "Who activated or rolled back each version is in the audit log, which the admin role reads."));
  }
  ctx.main.replaceChildren(
    h("p", {}, h("a", { href: "#/workflows" }, "← Workflows")),
    h("h1", {}, name),
    h("section", { "aria-labelledby": "versions-title" }, h("h2", { id: "versions-title" }, "Versions (oldest first)"), table(["Version", "Digest", "", "Activated (UTC)"], rows)),
    historyBox,
    h("section", { "aria-labelledby": "active-title" }, h("h2", { id: "active-title" }, `Active plan · ${active.version}`), renderGraph(active.plan, { title: `Plan of ${name} ${active.version}` })),
    diffBox,
    checker(ctx),
  );
  renderDiffPicker(diffBox, list, ctx.params);
}

function renderDiffPicker(box: HTMLElement, versions: Version[], params: URLSearchParams): void {
  const option = (v: Version) => h("option", { value: v.digest }, `${v.version} · ${short(v.digest)}${v.active ? " (active)" : ""}`);
  const from = h("select", { id: "diff-from" }, versions.map(option));
  const to = h("select", { id: "diff-to" }, versions.map(option));
  const activeAt = Math.max(0, versions.findIndex((v) => v.active));
  from.value = params.get("from") ?? versions[Math.max(0, activeAt - 1)]?.digest ?? "";
  to.value = params.get("to") ?? versions[activeAt]?.digest ?? "";
  const out = h("div", { id: "diff-out", "aria-live": "polite" });
  const form = h(
    "form",
    { class: "filters inline" },
    h("div", { class: "field" }, h("label", { for: "diff-from" }, "From"), from),
    h("div", { class: "field" }, h("label", { for: "diff-to" }, "To"), to),
    h("div", { class: "field actions" }, h("button", { type: "submit" }, "Compare")),
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    out.replaceChildren(h("p", { class: "loading" }, "Comparing…"));
    try {
      const [a, b] = await Promise.all([get<{ plan: Plan }>(`/v1/plans/${from.value}`), get<{ plan: Plan }>(`/v1/plans/${to.value}`)]);
      out.replaceChildren(...renderDiff(a.plan, b.plan));
    } catch (err) {
      out.replaceChildren(errorBox(err));
    }
  });
  box.replaceChildren(h("h2", { id: "diff-title" }, "Compare two versions"), versions.length < 2 ? h("p", { class: "help" }, "Only one version so far.") : form, out);
}

interface Change {
  stage: string;
  change: "added" | "removed" | "changed";
  fields: { field: string; from: string; to: string }[];
}

const IGNORED = new Set(["line"]);

function show(v: unknown): string {
  return v === undefined ? "—" : JSON.stringify(v);
}

export function diffPlans(a: Plan, b: Plan): Change[] {
  const before = new Map(a.stages.map((st) => [st.name, st]));
  const after = new Map(b.stages.map((st) => [st.name, st]));
  const out: Change[] = [];
  for (const st of b.stages) {
    const old = before.get(st.name);
    if (!old) {
      out.push({ stage: st.name, change: "added", fields: [] });
      continue;
    }
    const fields = [...new Set([...Object.keys(old), ...Object.keys(st)])]
      .filter((f) => !IGNORED.has(f) && show((old as PlanStage)[f]) !== show((st as PlanStage)[f]))
      .map((f) => ({ field: f, from: show((old as PlanStage)[f]), to: show((st as PlanStage)[f]) }));
    if (fields.length) out.push({ stage: st.name, change: "changed", fields });
  }
  for (const st of a.stages) if (!after.has(st.name)) out.push({ stage: st.name, change: "removed", fields: [] });
  return out;
}

function renderDiff(a: Plan, b: Plan): Node[] {
  const changes = diffPlans(a, b);
  const byStage = new Map(changes.map((c) => [c.stage, c.change]));
  const edgesA = new Set(edgesOf(a).map((e) => `${e.from}→${e.to} (${e.kind})`));
  const edgesB = new Set(edgesOf(b).map((e) => `${e.from}→${e.to} (${e.kind})`));
  const edgeRows = [...[...edgesB].filter((e) => !edgesA.has(e)).map((e) => ["added", e]), ...[...edgesA].filter((e) => !edgesB.has(e)).map((e) => ["removed", e])];
  const rows = changes.flatMap((c) =>
    c.fields.length
      ? c.fields.map((f) => [h("span", { class: `diff diff-${c.change}` }, c.change), h("span", { class: "mono" }, c.stage), f.field, h("code", { class: "del" }, f.from), h("code", { class: "ins" }, f.to)])
      : [[h("span", { class: `diff diff-${c.change}` }, c.change), h("span", { class: "mono" }, c.stage), "", "", ""]],
  );
  return [
    h("p", { class: "summary", id: "diff-summary" }, `${a.version} → ${b.version}: ${changes.filter((c) => c.change === "added").length} stage(s) added, ${changes.filter((c) => c.change === "removed").length} removed, ${changes.filter((c) => c.change === "changed").length} changed; ${edgeRows.length} edge change(s)`),
    changes.length ? table(["Change", "Stage", "Field", "Before", "After"], rows, "Stage changes") : h("p", {}, "The plans' stages are the same."),
    edgeRows.length ? table(["Change", "Edge"], edgeRows.map(([c, e]) => [h("span", { class: `diff diff-${c}` }, c ?? ""), e ?? ""]), "Edge changes") : null,
    renderGraph(b, { title: `Plan ${b.version}, stages marked by change`, status: (n) => `diff-${byStage.get(n) ?? "same"}`, label: (n) => byStage.get(n) ?? "unchanged" }),
  ].filter((x): x is HTMLElement => x !== null);
}

function checker(ctx: Ctx): HTMLElement {
  const box = h("section", { "aria-labelledby": "check-title", class: "checker" }, h("h2", { id: "check-title" }, "Check a definition"));
  if (!ctx.me.may["workflow.check"]) {
    box.append(h("p", { class: "help" }, "Checking definitions needs the author role."));
    return box;
  }
  const source = h("textarea", { id: "check-source", rows: 14, spellcheck: "false", "aria-describedby": "check-help" });
  const filename = h("input", { id: "check-file", type: "text", value: "workflow.yaml" });
  const upload = h("input", { id: "check-upload", type: "file", accept: ".yaml,.yml" });
  const out = h("div", { id: "check-out", "aria-live": "polite" });
  upload.addEventListener("change", async () => {
    const file = upload.files?.[0];
    if (!file) return;
    source.value = await file.text();
    filename.value = file.name;
  });
  const form = h(
    "form",
    { class: "check-form" },
    h("div", { class: "field" }, h("label", { for: "check-source" }, "Workflow definition (YAML)"), source, h("p", { id: "check-help", class: "help" }, "Compiled through the five check layers; nothing is stored or activated.")),
    h("div", { class: "filters inline" }, h("div", { class: "field" }, h("label", { for: "check-file" }, "File name"), filename), h("div", { class: "field" }, h("label", { for: "check-upload" }, "or upload"), upload), h("div", { class: "field actions" }, h("button", { type: "submit" }, "Check"))),
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    out.replaceChildren(h("p", { class: "loading" }, "Compiling…"));
    try {
      const got = await post<Checked>("/v1/workflows/check", { source: source.value, filename: filename.value || "workflow.yaml" });
      out.replaceChildren(...renderFindings(got, source.value));
    } catch (err) {
      out.replaceChildren(errorBox(err));
    }
  });
  box.append(form, out);
  return box;
}

function renderFindings(got: Checked, text: string): Node[] {
  const lines = text.split("\n");
  const marked = new Map<number, Diagnostic[]>();
  for (const d of got.diagnostics) marked.set(d.line, [...(marked.get(d.line) ?? []), d]);
  const listing = h(
    "ol",
    { class: "source", "aria-label": "The definition, findings marked" },
    lines.map((line, i) => {
      const here = marked.get(i + 1);
      return h("li", { id: `src-line-${i + 1}`, class: here ? `marked sev-${here[0]?.severity ?? "error"}` : "", tabindex: here ? -1 : null, value: i + 1 }, h("code", {}, line || " "), here ? h("span", { class: "sr-only" }, ` — ${here.map((d) => d.message).join("; ")}`) : null);
    }),
  );
  const items = got.diagnostics.map((d) => {
    const where = `${d.file}:${d.line}:${d.column}`;
    const link = h("a", { href: `#src-line-${d.line}`, class: "mono" }, where);
    link.addEventListener("click", (ev) => {
      ev.preventDefault();
      const target = document.getElementById(`src-line-${d.line}`);
      target?.focus();
      target?.scrollIntoView({ block: "center" });
    });
    return h("li", { class: `finding sev-${d.severity}`, "data-line": d.line }, link, " ", h("strong", {}, d.severity), ` ${d.code}: ${d.message}`, d.stage ? ` (stage ${d.stage})` : "", d.path ? ` at ${d.path}` : "");
  });
  const head = got.ok
    ? h("p", { class: "ok", role: "status" }, `Compiles: ${got.digest ?? ""}`)
    : h("p", { class: "error", role: "alert", id: "check-summary" }, `Refused: ${got.errors} error(s)`);
  const out: Node[] = [head];
  if (items.length) out.push(h("ul", { class: "findings" }, items));
  out.push(listing);
  if (got.plan) out.push(renderGraph(got.plan, { title: "Plan of the checked definition" }));
  return out;
}
