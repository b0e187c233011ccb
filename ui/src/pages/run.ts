// A run: its plan graph coloured by live status (over SSE), a timeline of attempts per stage,
// the history with ISO times and a "refused only" filter, the explanation, the context and
// result (masked by the server), and cancel / re-drive for operators.

import { ApiError, get, getBlob, post, stream } from "../api";
import { badge, duration, errorBox, h, iso, s, table, toast } from "../dom";
import { renderGraph, type Plan } from "../graph";
import type { Ctx } from "../main";

interface Attempt {
  attempt: number;
  status: string;
  dispatched_at_ms: number | null;
  accepted_at_ms: number | null;
  finished_at_ms: number | null;
  heartbeat_due_ms?: number | null;
}

interface StageState {
  name: string;
  kind: string;
  status: string;
  attempt: number;
  error: { code?: string; message?: string } | null;
  attempts: Attempt[];
}

interface RunDoc {
  run_id: string;
  workflow: string;
  tenant: string;
  plan_digest: string;
  status: string;
  intent: string | null;
  started_at_ms: number;
  context: unknown;
  result: unknown;
  error: unknown;
  requested_by: string;
  stages: Record<string, StageState>;
}

interface Entry {
  seq: number;
  at_ms: number;
  accepted: boolean;
  reason: string | null;
  note: string;
  event: { kind: string; stage?: string; attempt?: number; by?: string; code?: string; message?: string };
}

interface Gate {
  run_id: string;
  stage: string;
  role: string;
  options: string[];
  form: string | null;
  needed: number;
  decisions: unknown[];
}

interface Preview {
  stage: string;
  objectKey: string;
  previewType: string | null;
}

const TERMINAL = new Set(["completed", "failed", "cancelled"]);

export async function runPage(ctx: Ctx, runId: string): Promise<void> {
  document.title = `Run ${runId} · Accord`;
  let run: RunDoc;
  try {
    run = await get<RunDoc>(`/v1/runs/${encodeURIComponent(runId)}`);
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) {
      ctx.main.replaceChildren(h("h1", {}, "Run not found"), h("p", { role: "alert" }, `No run ${runId} among your tenants' runs.`), h("a", { href: "#/runs" }, "Back to runs"));
      return;
    }
    throw err;
  }
  const planDoc = await get<{ plan: Plan; version: string }>(`/v1/plans/${run.plan_digest}`);
  const plan = planDoc.plan;
  const history: Entry[] = [];
  const may = ctx.me.may;

  const head = h("div", { class: "run-head" });
  const graphBox = h("section", { "aria-labelledby": "graph-title" });
  const stagesBox = h("section", { "aria-labelledby": "stages-title" });
  const timelineBox = h("section", { "aria-labelledby": "timeline-title" });
  const historyBox = h("section", { "aria-labelledby": "history-title" });
  const explainBox = h("section", { "aria-labelledby": "explain-title" });
  const dataBox = h("section", { "aria-labelledby": "data-title" });
  const refusedOnly = h("input", { type: "checkbox", id: "refused-only" });
  const kindFilter = h("select", { id: "kind-filter" }, h("option", { value: "" }, "every kind"));
  let streamState = "connecting";

  // the actions are built once (a refresh over SSE must not close an open confirmation)
  const actions = h("div", { class: "actions" });
  if (may["run.cancel"]) {
    const reason = h("input", { id: "cancel-reason", type: "text", placeholder: "reason (recorded)" });
    const confirmBox = h("div", { class: "confirm", hidden: true, role: "group", "aria-label": "Confirm cancellation" });
    const yes = h("button", { type: "button", class: "danger", id: "cancel-confirm" }, `Cancel run ${run.run_id}`);
    const no = h("button", { type: "button", class: "secondary" }, "Keep it running");
    confirmBox.append(h("label", { for: "cancel-reason" }, "Reason"), reason, yes, no);
    const ask = h("button", { type: "button", class: "danger", id: "cancel" }, "Cancel run…");
    ask.addEventListener("click", () => {
      confirmBox.hidden = false;
      reason.focus();
    });
    no.addEventListener("click", () => {
      confirmBox.hidden = true;
      ask.focus();
    });
    yes.addEventListener("click", async () => {
      yes.disabled = true;
      try {
        await post(`/v1/runs/${encodeURIComponent(run.run_id)}/cancel`, { reason: reason.value });
        toast("Cancellation requested.");
        confirmBox.hidden = true;
        await refresh();
      } catch (err) {
        confirmBox.append(errorBox(err));
        yes.disabled = false;
      }
    });
    actions.append(ask, confirmBox);
  }
  const facts = h("dl", { class: "facts" });
  head.append(h("h1", {}, "Run ", h("span", { class: "mono" }, run.run_id)), facts, actions);

  const renderHead = () => {
    actions.hidden = TERMINAL.has(run.status);
    facts.replaceChildren(
      h("dt", {}, "Status"), h("dd", { id: "run-status" }, badge(run.status), run.intent && run.intent !== run.status ? ` (intent ${run.intent})` : ""),
      h("dt", {}, "Workflow"), h("dd", {}, h("a", { href: `#/workflows/${encodeURIComponent(run.workflow)}` }, run.workflow), ` ${planDoc.version}`),
      h("dt", {}, "Plan"), h("dd", { class: "mono" }, run.plan_digest.slice(0, 19) + "…"),
      h("dt", {}, "Tenant"), h("dd", {}, run.tenant),
      h("dt", {}, "Started"), h("dd", {}, h("time", { datetime: iso(run.started_at_ms) }, iso(run.started_at_ms)), run.requested_by ? ` by ${run.requested_by}` : ""),
      h("dt", {}, "Live"), h("dd", { id: "stream-state" }, streamState),
    );
  };

  const renderGraphBox = () => {
    graphBox.replaceChildren(
      h("h2", { id: "graph-title" }, "Plan"),
      renderGraph(plan, {
        title: `Plan of ${run.workflow}: stages coloured by status`,
        status: (name) => `status-${run.stages[name]?.status ?? "pending"}`,
        label: (name) => {
          const st = run.stages[name];
          return st ? `${st.status}${st.attempt > 1 ? ` · attempt ${st.attempt}` : ""}` : "pending";
        },
      }),
    );
  };

  // approval gates waiting for a decision: a panel per gate, kept while it waits (a refresh
  // must not wipe a comment being typed); offered only when GET /v1/approvals says this
  // principal may decide it (role, not the requester, not decided already)
  const gatesBox = h("section", { "aria-labelledby": "gates-title", hidden: true }, h("h2", { id: "gates-title" }, "Waiting for a decision"));
  const panels = new Map<string, HTMLElement>();
  const renderGates = async () => {
    const waiting = plan.stages.filter((ps) => ps.type === "approval" && run.stages[ps.name]?.status === "waiting").map((ps) => ps.name);
    for (const [name, panel] of panels) {
      if (!waiting.includes(name)) {
        panel.remove();
        panels.delete(name);
      }
    }
    gatesBox.hidden = waiting.length === 0;
    const fresh = waiting.filter((name) => !panels.has(name));
    if (fresh.length === 0) return;
    const mine = await get<{ approvals: Gate[] }>("/v1/approvals", { tenant: run.tenant });
    for (const name of fresh) {
      const gate = mine.approvals.find((g) => g.run_id === run.run_id && g.stage === name);
      const ps = plan.stages.find((x) => x.name === name);
      const role = typeof ps?.["approvers"] === "object" && ps["approvers"] ? String((ps["approvers"] as { role?: string }).role ?? "") : "";
      const panel = h("div", { class: "gate card", "data-gate": name });
      panel.append(h("h3", {}, `Gate ${name}`));
      if (!gate) {
        panel.append(h("p", { class: "help" }, `Waiting for ${role || "an approver"}; you may not decide this gate.`));
      } else {
        const id = `gate-${name}`;
        const comment = h("textarea", { id: `${id}-comment`, rows: 2 });
        const formData = gate.form ? h("textarea", { id: `${id}-form`, rows: 3, spellcheck: "false" }, "{}") : null;
        const out = h("div", { "aria-live": "polite" });
        const decide = (decision: "approve" | "reject") => async (ev: Event) => {
          const button = ev.currentTarget as HTMLButtonElement;
          button.disabled = true;
          try {
            const form = formData ? (JSON.parse(formData.value || "{}") as Record<string, unknown>) : {};
            await post(`/v1/runs/${encodeURIComponent(run.run_id)}/stages/${encodeURIComponent(name)}/${decision}`, { comment: comment.value, form });
            toast(`${decision === "approve" ? "Approved" : "Rejected"}: ${name}.`);
            await refresh();
          } catch (err) {
            out.replaceChildren(errorBox(err));
            button.disabled = false;
          }
        };
        panel.append(
          h("p", { class: "help" }, `Needs ${gate.needed} decision(s) by ${gate.role} or above; ${gate.decisions.length} so far.`),
          h("div", { class: "field" }, h("label", { for: comment.id }, "Comment (recorded)"), comment),
          ...(formData ? [h("div", { class: "field" }, h("label", { for: formData.id }, `Form (${gate.form ?? ""}, JSON)`), formData)] : []),
          h(
            "div",
            { class: "actions" },
            gate.options.includes("approve") ? h("button", { type: "button", onclick: decide("approve") }, `Approve ${name}`) : null,
            gate.options.includes("reject") ? h("button", { type: "button", class: "danger", onclick: decide("reject") }, `Reject ${name}`) : null,
          ),
          out,
        );
      }
      panels.set(name, panel);
      gatesBox.append(panel);
    }
  };

  const renderStages = () => {
    const rows = plan.stages.map((ps) => {
      const st = run.stages[ps.name];
      const status = st?.status ?? "pending";
      let action: Node | string = "";
      if (may["run.redrive"] && status === "failed" && !TERMINAL.has(run.status)) {
        const btn = h("button", { type: "button", class: "secondary", "data-redrive": ps.name }, `Re-drive ${ps.name}`);
        btn.addEventListener("click", async () => {
          btn.disabled = true;
          try {
            await post(`/v1/runs/${encodeURIComponent(run.run_id)}/stages/${encodeURIComponent(ps.name)}/redrive`, {});
            toast(`Re-drive of ${ps.name} requested.`);
            await refresh();
          } catch (err) {
            btn.replaceWith(errorBox(err));
          }
        });
        action = btn;
      }
      return [h("span", { class: "mono" }, ps.name), ps.type, badge(status), String(st?.attempts.length ?? 0), st?.error?.code ? `${st.error.code}: ${st.error.message ?? ""}` : "—", action];
    });
    stagesBox.replaceChildren(h("h2", { id: "stages-title" }, "Stages"), table(["Stage", "Kind", "Status", "Attempts", "Last error", ""], rows));
  };

  const renderTimeline = () => {
    const now = Date.now();
    const all = Object.values(run.stages).flatMap((st) => st.attempts);
    const t0 = Math.min(run.started_at_ms, ...all.map((a) => a.dispatched_at_ms ?? now));
    const t1 = Math.max(t0 + 1, ...all.map((a) => a.finished_at_ms ?? now));
    const span = t1 - t0;
    const order = plan.stages.map((ps) => ps.name).filter((n) => run.stages[n]?.attempts.length);
    const LABEL = 150;
    const W = 860;
    const ROW = 26;
    const x = (ms: number) => LABEL + ((ms - t0) / span) * (W - LABEL - 10);
    const rows = order.flatMap((name) => (run.stages[name]?.attempts ?? []).map((a) => ({ name, a })));
    const svg = s("svg", { viewBox: `0 0 ${W} ${rows.length * ROW + 24}`, class: "timeline", role: "img", "aria-label": `Attempts of each stage over ${duration(span)}` });
    rows.forEach(({ name, a }, i) => {
      const y = i * ROW + 4;
      const start = a.dispatched_at_ms ?? t0;
      const accepted = a.accepted_at_ms ?? null;
      const end = a.finished_at_ms ?? now;
      const g = s("g", { class: `attempt status-${a.status}`, "data-stage": name, "data-attempt": a.attempt, "data-status": a.status });
      g.append(s("text", { x: 4, y: y + 15, class: "tl-label" }, `${name} #${a.attempt}`));
      const queuedEnd = accepted ?? end;
      g.append(s("rect", { x: x(start), y: y + 3, width: Math.max(2, x(queuedEnd) - x(start)), height: 16, class: "tl-queued" }));
      if (accepted !== null) g.append(s("rect", { x: x(accepted), y: y + 3, width: Math.max(3, x(end) - x(accepted)), height: 16, class: "tl-running" }));
      g.append(s("text", { x: Math.min(W - 90, x(end) + 4), y: y + 15, class: "tl-status" }, a.status));
      g.append(s("title", {}, `${name} attempt ${a.attempt}: ${a.status}; queued ${iso(a.dispatched_at_ms)}, accepted ${iso(a.accepted_at_ms)}, finished ${iso(a.finished_at_ms)} (${duration(end - start)})`));
      svg.append(g);
    });
    svg.append(s("text", { x: LABEL, y: rows.length * ROW + 18, class: "tl-axis" }, iso(t0)), s("text", { x: W - 10, y: rows.length * ROW + 18, class: "tl-axis", "text-anchor": "end" }, `+${duration(span)}`));
    const list = h(
      "ul",
      { class: "sr-only" },
      rows.map(({ name, a }) => h("li", {}, `${name} attempt ${a.attempt}: ${a.status}, ${duration((a.finished_at_ms ?? now) - (a.dispatched_at_ms ?? t0))}`)),
    );
    timelineBox.replaceChildren(
      h("h2", { id: "timeline-title" }, "Timeline of attempts"),
      h("p", { class: "legend" }, h("span", { class: "key tl-queued" }, "queued"), h("span", { class: "key tl-running" }, "accepted → outcome")),
      rows.length ? h("div", { class: "graph-scroll", tabindex: 0, "aria-label": "Timeline (scrollable)" }, svg) : h("p", {}, "No attempt yet."),
      list,
    );
  };

  const renderHistory = () => {
    const kinds = [...new Set(history.map((e) => e.event.kind))].sort();
    if (kindFilter.options.length - 1 !== kinds.length) {
      const chosen = kindFilter.value;
      kindFilter.replaceChildren(h("option", { value: "" }, "every kind"), ...kinds.map((k) => h("option", { value: k }, k)));
      kindFilter.value = chosen;
    }
    const shown = history.filter((e) => (!refusedOnly.checked || !e.accepted) && (!kindFilter.value || e.event.kind === kindFilter.value));
    const rows = shown.map((e) => [
      String(e.seq),
      h("time", { datetime: iso(e.at_ms) }, iso(e.at_ms)),
      `+${duration(e.at_ms - run.started_at_ms)}`,
      e.event.kind,
      e.event.stage ?? "—",
      e.event.attempt !== undefined ? String(e.event.attempt) : "—",
      e.accepted ? "applied" : h("strong", { class: "refused" }, `refused: ${e.reason ?? "?"}`),
      e.note || e.event.message || "",
    ]);
    historyBox.replaceChildren(
      h("h2", { id: "history-title" }, "History"),
      h("div", { class: "filters inline" }, h("div", { class: "field check" }, refusedOnly, h("label", { for: "refused-only" }, "Refused only (stale, duplicate, late)")), h("div", { class: "field" }, h("label", { for: "kind-filter" }, "Kind"), kindFilter)),
      h("p", { class: "summary", id: "history-count" }, `${shown.length} of ${history.length} entries`),
      table(["#", "At (UTC)", "Since start", "Event", "Stage", "Attempt", "Applied", "Note"], rows),
    );
  };
  refusedOnly.addEventListener("change", renderHistory);
  kindFilter.addEventListener("change", renderHistory);

  const renderExplain = async () => {
    const doc = await get<{ explanation: string[] }>(`/v1/runs/${encodeURIComponent(run.run_id)}/explanation`);
    explainBox.replaceChildren(h("h2", { id: "explain-title" }, "Explanation"), h("ol", { class: "explain" }, doc.explanation.map((line) => h("li", {}, line.replace(/^#\d+ /, "")))));
  };

  // the previews the stage results name, read with the bearer header into blob: URLs
  const thumbsBox = h("div", { class: "thumbs", id: "thumbnails" });
  const blobs: string[] = [];
  let thumbsShown = "";
  ctx.signal.addEventListener("abort", () => blobs.forEach((u) => URL.revokeObjectURL(u)));
  const renderThumbs = async () => {
    let doc: { previews: Preview[] };
    try {
      doc = await get<{ previews: Preview[] }>(`/v1/runs/${encodeURIComponent(run.run_id)}/previews`);
    } catch {
      return; // the run page works without its thumbnails
    }
    const names = doc.previews.map((p) => `${p.stage}:${p.objectKey}`).join("|");
    if (names === thumbsShown) return;
    thumbsShown = names;
    const figures = await Promise.all(doc.previews.map(async (p) => {
      const alt = `${p.previewType ?? "preview"} thumbnail from stage ${p.stage} (${p.objectKey})`;
      try {
        const url = URL.createObjectURL(await getBlob(`/v1/runs/${encodeURIComponent(run.run_id)}/objects`, { key: p.objectKey }));
        blobs.push(url);
        return h("figure", {}, h("img", { src: url, alt }), h("figcaption", {}, `${p.stage}: ${p.objectKey}`));
      } catch (err) {
        return h("figure", {}, h("p", { class: "help" }, `${p.objectKey}: ${err instanceof Error ? err.message : String(err)}`));
      }
    }));
    thumbsBox.replaceChildren(...(figures.length ? [h("h3", {}, "Thumbnails"), ...figures] : []));
  };

  const renderData = () => {
    const pre = (v: unknown) => h("pre", { tabindex: 0 }, JSON.stringify(v, null, 2));
    dataBox.replaceChildren(
      h("h2", { id: "data-title" }, "Inputs and results"),
      h("p", { class: "help" }, "Sensitive values are masked by the server."),
      h("div", { class: "cols" }, h("div", {}, h("h3", {}, "Context"), pre(run.context)), h("div", {}, h("h3", {}, run.error ? "Error" : "Result"), pre(run.error ?? run.result))),
      thumbsBox,
    );
  };

  let pending: number | null = null;
  const refresh = async () => {
    run = await get<RunDoc>(`/v1/runs/${encodeURIComponent(run.run_id)}`);
    renderHead();
    renderGraphBox();
    renderStages();
    renderTimeline();
    renderData();
    await Promise.all([renderExplain(), renderGates(), renderThumbs()]);
  };
  const soon = () => {
    if (pending !== null) return;
    pending = window.setTimeout(() => {
      pending = null;
      if (!ctx.signal.aborted) void refresh().catch(() => undefined);
    }, 120);
  };

  renderHead();
  renderGraphBox();
  renderStages();
  renderTimeline();
  renderData();
  renderHistory();
  ctx.main.replaceChildren(head, gatesBox, h("div", { class: "cols wide" }, graphBox, stagesBox), timelineBox, explainBox, historyBox, dataBox);
  await Promise.all([renderExplain(), renderGates(), renderThumbs()]);

  const setState = (text: string) => {
    streamState = text;
    const el = document.getElementById("stream-state");
    if (el) el.textContent = text;
  };
  const follow = async () => {
    let after = -1;
    for (let tries = 0; !ctx.signal.aborted && tries < 20; tries++) {
      try {
        setState("following");
        await stream(`/v1/runs/${encodeURIComponent(run.run_id)}/events?after=${after}`, (ev) => {
          if (ev.event === "history") {
            const entry = JSON.parse(ev.data) as Entry;
            after = Math.max(after, entry.seq);
            history.push(entry);
            renderHistory();
            soon();
          } else if (ev.event === "end") {
            setState("ended");
            soon();
          }
        }, ctx.signal);
        if (streamState === "ended") return;
      } catch {
        if (ctx.signal.aborted) return;
        setState("reconnecting");
        await new Promise((r) => setTimeout(r, 1000));
      }
    }
  };
  void follow();
}
