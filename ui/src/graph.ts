// The plan's control-flow graph, laid out by dagre and drawn as SVG. Success, failure,
// evaluation-error, decision, fork and join edges are drawn distinctly (colour and dash), and
// each stage carries a class for its live status (or its change in a diff).

import dagre from "@dagrejs/dagre";
import { h, s } from "./dom";

export interface PlanStage {
  name: string;
  type: string;
  on_success?: string;
  on_failure?: string;
  on_evaluation_error?: string;
  branches?: (string | { when?: string; next: string })[];
  join?: string;
  fork?: string | null;
  [field: string]: unknown;
}

export interface Plan {
  name: string;
  version: string;
  entry: string;
  stages: PlanStage[];
  terminals: string[];
}

export type EdgeKind = "success" | "failure" | "error" | "decision" | "fork" | "join" | "other";

export interface PlanEdge {
  from: string;
  to: string;
  kind: EdgeKind;
  label: string;
}

export function edgesOf(plan: Plan): PlanEdge[] {
  const out: PlanEdge[] = [];
  for (const st of plan.stages) {
    if (st.type === "decision" && Array.isArray(st.branches)) {
      st.branches.forEach((b, i) => {
        if (typeof b === "object" && b) out.push({ from: st.name, to: b.next, kind: "decision", label: b.when === "true" ? "else" : `#${i + 1}` });
      });
    } else if (st.type === "fork" && Array.isArray(st.branches)) {
      for (const b of st.branches) if (typeof b === "string") out.push({ from: st.name, to: b, kind: "fork", label: "fork" });
    }
    for (const [field, value] of Object.entries(st)) {
      if (!field.startsWith("on_") || typeof value !== "string" || !value) continue;
      const kind: EdgeKind =
        field === "on_success" ? (st.fork && plan.stages.some((j) => j.name === value && j.type === "join") ? "join" : "success")
        : field === "on_failure" ? "failure"
        : field === "on_evaluation_error" ? "error"
        : "other";
      out.push({ from: st.name, to: value, kind, label: field === "on_success" || field === "on_failure" ? "" : field === "on_evaluation_error" ? "error" : field.slice(3) });
    }
  }
  return out;
}

const NODE_W = 168;
const NODE_H = 46;

export interface GraphOptions {
  status?: (stage: string) => string; // class suffix: status-<x> or diff-<x>
  label?: (stage: string) => string; // second line
  title: string;
}

export function renderGraph(plan: Plan, opts: GraphOptions): HTMLElement {
  const g = new dagre.graphlib.Graph({ multigraph: true });
  g.setGraph({ rankdir: "TB", nodesep: 28, ranksep: 44, marginx: 12, marginy: 12 });
  g.setDefaultEdgeLabel(() => ({}));
  const edges = edgesOf(plan);
  const names = new Set(plan.stages.map((st) => st.name));
  const terminals = new Set<string>();
  g.setNode("@start", { width: 70, height: 28 });
  for (const st of plan.stages) g.setNode(st.name, { width: NODE_W, height: NODE_H });
  for (const e of edges) if (!names.has(e.to)) terminals.add(e.to);
  for (const t of terminals) g.setNode(t, { width: 100, height: 30 });
  g.setEdge("@start", plan.entry, { weight: 2 }, "entry");
  edges.forEach((e, i) => g.setEdge(e.from, e.to, { label: e.label, width: e.label ? 40 : 0, height: e.label ? 14 : 0, labelpos: "c", weight: e.kind === "failure" ? 1 : 2 }, `e${i}`));
  dagre.layout(g);
  const info = g.graph();
  const width = Math.ceil(info.width ?? 200);
  const height = Math.ceil(info.height ?? 100);
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": opts.title, class: "plan-graph" });
  const defs = s("defs");
  for (const kind of ["success", "failure", "error", "decision", "fork", "join", "other"]) {
    defs.append(s("marker", { id: `arrow-${kind}`, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" }, s("path", { d: "M0,0 L10,5 L0,10 z", class: `arrowhead edge-${kind}` })));
  }
  svg.append(defs);
  const draw = (from: string, to: string, name: string, kind: EdgeKind, label: string) => {
    const edge = g.edge({ v: from, w: to, name }) as { points?: { x: number; y: number }[]; x?: number; y?: number } | undefined;
    const pts = edge?.points ?? [];
    if (pts.length === 0) return;
    const d = pts.map((p, i) => `${i ? "L" : "M"}${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(" ");
    const group = s("g", { class: `edge edge-${kind}`, "data-from": from, "data-to": to, "data-kind": kind });
    group.append(s("path", { d, "marker-end": `url(#arrow-${kind})` }));
    if (label && edge?.x !== undefined && edge.y !== undefined) group.append(s("text", { x: edge.x, y: edge.y + 4, "text-anchor": "middle", class: "edge-label" }, label));
    group.append(s("title", {}, `${from} → ${to} (${kind}${label ? `: ${label}` : ""})`));
    svg.append(group);
  };
  draw("@start", plan.entry, "entry", "success", "");
  edges.forEach((e, i) => draw(e.from, e.to, `e${i}`, e.kind, e.label));
  const box = (name: string, cls: string, line1: string, line2: string, status = "") => {
    const n = g.node(name) as { x: number; y: number; width: number; height: number };
    const group = s("g", { class: `node ${cls}`, "data-stage": name, ...(status ? { "data-status": status } : {}), transform: `translate(${n.x - n.width / 2},${n.y - n.height / 2})` });
    group.append(s("rect", { width: n.width, height: n.height, rx: 6, ry: 6 }));
    group.append(s("text", { x: n.width / 2, y: line2 ? 19 : n.height / 2 + 4, "text-anchor": "middle", class: "node-name" }, line1));
    if (line2) group.append(s("text", { x: n.width / 2, y: 35, "text-anchor": "middle", class: "node-sub" }, line2));
    svg.append(group);
  };
  box("@start", "terminal", "start", "");
  for (const t of terminals) box(t, `terminal terminal-${t}`, t, "");
  for (const st of plan.stages) {
    const state = opts.status ? opts.status(st.name) : "";
    const sub = opts.label ? opts.label(st.name) : st.type;
    box(st.name, `stage kind-${st.type} ${state}`, st.name, sub, state.replace(/^(status|diff)-/, ""));
  }
  return h(
    "figure",
    { class: "graph" },
    h("div", { class: "graph-scroll", tabindex: 0, "aria-label": `${opts.title} (scrollable)` }, svg),
    h(
      "figcaption",
      { class: "legend" },
      h("span", { class: "key edge-success" }, "success"),
      h("span", { class: "key edge-failure" }, "failure"),
      h("span", { class: "key edge-decision" }, "decision"),
      h("span", { class: "key edge-fork" }, "fork"),
      h("span", { class: "key edge-join" }, "join"),
      h("span", { class: "key edge-error" }, "evaluation error"),
    ),
  );
}
