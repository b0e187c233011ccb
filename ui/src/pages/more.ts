// Contracts (the registry, versions, the compatibility report between two versions) and the
// fleet (capabilities announced live by workers, and the engine's in-process actions).

import { get } from "../api";
import { duration, errorBox, h, iso, table } from "../dom";
import type { Ctx } from "../main";

interface ContractSummary {
  kind: string;
  name: string;
  version: number;
  status: string;
  digest: string;
  published: boolean;
}

interface Compat {
  ok: boolean;
  mode: string;
  from: number;
  to: number;
  report: { changes?: Record<string, unknown>[] } & Record<string, unknown>;
  failures: { code: string; message: string; path?: string }[];
}

export async function contractsPage(ctx: Ctx, name?: string): Promise<void> {
  document.title = "Contracts · Accord";
  if (name) return contractPage(ctx, name);
  const doc = await get<{ contracts: ContractSummary[] }>("/v1/contracts");
  const names = new Map<string, ContractSummary[]>();
  for (const c of doc.contracts) names.set(c.name, [...(names.get(c.name) ?? []), c]);
  const rows = [...names.entries()].sort().map(([n, vs]) => [
    h("a", { href: `#/contracts/${encodeURIComponent(n)}` }, n),
    vs[0]?.kind ?? "",
    vs.map((v) => `@${v.version}`).join(" "),
    vs.some((v) => v.published) ? "published" : "source only",
  ]);
  ctx.main.replaceChildren(h("h1", {}, "Contracts"), table(["Contract", "Kind", "Versions", "Published"], rows, `${doc.contracts.length} contract versions`));
}

interface Usage {
  fixtures: { version: number; kind: string; name: string; description: string; expect: unknown; message: unknown }[];
  capabilities: { capability: string; as: string; contract: string }[];
  workflows: { workflow: string; version: string; digest: string; uses: string[] }[];
}

function usageSections(usage: Usage): HTMLElement[] {
  const fixtures = usage.fixtures.map((f) => {
    const body = h("pre", {}, JSON.stringify(f.message, null, 2));
    const more = h("details", {}, h("summary", {}, "message"), body);
    return [`@${f.version}`, h("span", { class: `badge ${f.kind === "valid" ? "status-completed" : "status-failed"}`, "data-fixture": `${f.kind}/${f.name}` }, f.kind), h("span", { class: "mono" }, f.name), f.description, more];
  });
  const caps = usage.capabilities.map((c) => [h("span", { class: "mono" }, c.capability), c.as, h("span", { class: "mono" }, c.contract)]);
  const flows = usage.workflows.map((w) => [h("a", { href: `#/workflows/${encodeURIComponent(w.workflow)}` }, `${w.workflow}@${w.version}`), h("ul", { class: "plain" }, w.uses.map((u) => h("li", {}, u)))]);
  return [
    h("h2", { id: "used-title" }, "Used by"),
    caps.length ? table(["Capability", "As", "Contract"], caps, "Capability contracts naming it") : h("p", { class: "help" }, "No capability contract names it."),
    flows.length ? table(["Active workflow", "Where"], flows, "Active workflow versions naming it") : h("p", { class: "help", id: "no-workflow" }, "No active workflow names it."),
    h("h2", { id: "fixtures-title" }, "Golden fixtures"),
    fixtures.length ? table(["Version", "Kind", "Name", "What it shows", "Message"], fixtures) : h("p", { class: "help" }, "No golden fixture."),
  ];
}

async function contractPage(ctx: Ctx, name: string): Promise<void> {
  const [doc, usage] = await Promise.all([
    get<{ versions: ContractSummary[] }>(`/v1/contracts/${encodeURIComponent(name)}/versions`),
    get<Usage>(`/v1/contracts/${encodeURIComponent(name)}/usage`).catch((err: unknown) => err),
  ]);
  const rows = doc.versions.map((v) => [String(v.version), v.status, v.published ? "yes" : "no", h("span", { class: "mono" }, v.digest.slice(0, 19))]);
  const opt = (v: ContractSummary) => h("option", { value: String(v.version) }, `@${v.version}`);
  const from = h("select", { id: "compat-from" }, doc.versions.map(opt));
  const to = h("select", { id: "compat-to" }, doc.versions.map(opt));
  const mode = h("select", { id: "compat-mode" }, ["backward", "forward", "full"].map((m) => h("option", { value: m }, m)));
  from.selectedIndex = Math.max(0, doc.versions.length - 2);
  to.selectedIndex = doc.versions.length - 1;
  const out = h("div", { "aria-live": "polite" });
  const form = h(
    "form",
    { class: "filters inline" },
    h("div", { class: "field" }, h("label", { for: "compat-from" }, "From"), from),
    h("div", { class: "field" }, h("label", { for: "compat-to" }, "To"), to),
    h("div", { class: "field" }, h("label", { for: "compat-mode" }, "Mode"), mode),
    h("div", { class: "field actions" }, h("button", { type: "submit" }, "Compare")),
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const got = await get<Compat>(`/v1/contracts/${encodeURIComponent(name)}/compatibility`, { from: from.value, to: to.value, mode: mode.value });
      const changes = got.report.changes ?? [];
      out.replaceChildren(
        h("p", { class: got.ok ? "ok" : "error", role: "status" }, `@${got.from} → @${got.to} (${got.mode}): ${got.ok ? "compatible" : `${got.failures.length} failure(s)`}`),
        changes.length ? table(Object.keys(changes[0] ?? {}), changes.map((c) => Object.values(c).map((v) => (typeof v === "string" ? v : JSON.stringify(v))))) : h("p", {}, "No change."),
        h("ul", {}, got.failures.map((f) => h("li", {}, `${f.code}: ${f.message}`))),
      );
    } catch (err) {
      out.replaceChildren(errorBox(err));
    }
  });
  ctx.main.replaceChildren(
    h("p", {}, h("a", { href: "#/contracts" }, "← Contracts")),
    h("h1", {}, name),
    table(["Version", "Status", "Published", "Digest"], rows),
    h("h2", {}, "Compatibility"),
    doc.versions.length > 1 ? form : h("p", { class: "help" }, "Only one version."),
    out,
    ...(usage instanceof Error ? [errorBox(usage)] : usageSections(usage as Usage)),
  );
}

interface FleetQueue {
  queue: string;
  capability: string;
  queued: number;
  age_ms: number | null;
  oldest_queued_at_ms: number | null;
  workers: string[];
  live: boolean | null;
  stages: string[];
}

interface Alert {
  alert_id: string;
  rule: string;
  subject: string;
  detail: string;
  count: number;
  runs: string[];
  since: string;
}

interface Fleet {
  queues: FleetQueue[] | null;
  capabilities: Record<string, string[]>;
  alerts: Alert[];
  source: string;
}

export async function fleetPage(ctx: Ctx): Promise<void> {
  document.title = "Fleet · Accord";
  const [doc, fleet] = await Promise.all([
    get<{ workers: Record<string, string[]>; actions: string[] }>("/v1/capabilities"),
    get<Fleet>("/v1/fleet"),
  ]);
  const rows = Object.entries(doc.workers).sort().map(([cap, workers]) => [h("span", { class: "mono" }, cap), String(workers.length), workers.join(", ")]);
  const queues = fleet.queues ?? [];
  const stranded = queues.filter((q) => q.live === false);
  const queueRows = queues.map((q) => [
    h("span", { class: "mono" }, q.queue),
    h("span", { class: "mono" }, q.capability || "—"),
    String(q.queued),
    h("span", { title: iso(q.oldest_queued_at_ms) }, duration(q.age_ms)),
    q.live === null ? "—" : q.live ? q.workers.join(", ") : h("strong", { class: "status-failed badge" }, "no live worker"),
    q.stages.join(", "),
  ]);
  const alertRows = fleet.alerts.map((a) => [h("span", { class: "mono" }, a.rule), a.subject, a.detail, String(a.count), h("time", { datetime: a.since }, a.since)]);
  ctx.main.replaceChildren(
    h("h1", {}, "Fleet"),
    ...stranded.map((q) =>
      h("p", { class: "banner", role: "alert", "data-stranded": q.queue }, `${q.queued} stage(s) queued on ${q.queue} for ${q.capability}, the oldest ${duration(q.age_ms)} ago: no live worker announces ${q.capability}, so they wait.`),
    ),
    h("h2", { id: "queues-title" }, "Queues"),
    fleet.queues === null
      ? h("p", { class: "help" }, fleet.source)
      : queueRows.length
        ? table(["Queue", "Capability", "Queued", "Oldest waits", "Workers", "Stages"], queueRows, "Queued stages of running runs (from the search projection)")
        : h("p", {}, "No stage is queued."),
    h("h2", { id: "alerts-title" }, "Open alerts"),
    alertRows.length ? table(["Rule", "Subject", "Detail", "Count", "Open since"], alertRows) : h("p", {}, "No open alert."),
    h("h2", {}, "Capabilities announced live"),
    rows.length ? table(["Capability", "Workers", "Who"], rows) : h("p", { class: "banner", role: "alert" }, "No worker is announcing a capability: queued stages will wait."),
    h("h2", {}, "In-process actions"),
    h("ul", {}, doc.actions.map((a) => h("li", { class: "mono" }, a))),
  );
}
