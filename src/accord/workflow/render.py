"""Render a plan as a graph: Mermaid text always, Graphviz DOT for an SVG when ``dot`` exists.

Edge styles say what an edge *is*, so a reviewer sees the failure handling at a glance:

=========================  ==================  ===================
edge                       Mermaid             DOT
=========================  ==================  ===================
success (``on_success``)   ``-->`` solid       solid
failure, evaluation error  ``-.->`` dotted     dashed, red
decision branch            ``==>`` thick       bold, labelled
fork → branch, → join      ``--o`` circle end  bold, blue
=========================  ==================  ===================

Shapes: tasks are rectangles (worker/action and capability in the label), decisions rhombi,
forks and joins hexagons, terminals stadiums. Node ids are ``s0``, ``s1``… so any stage name is
safe; labels carry the names. Pure: producing an SVG file is the CLI's job.
"""

from __future__ import annotations

from accord.workflow.plan import DecisionStage, ForkStage, JoinStage, Plan, Stage, TaskStage

__all__ = ["to_dot", "to_mermaid"]


def _ids(plan: Plan) -> dict[str, str]:
    ids = {s.name: f"s{i}" for i, s in enumerate(plan.stages)}
    ids |= {t: f"t_{t}" for t in plan.terminals}
    return ids


def _label(stage: Stage) -> str:
    if isinstance(stage, TaskStage):
        queue = f" · {stage.queue}" if stage.queue else ""
        return f"{stage.name}<br/>{stage.type} {stage.capability.ref}{queue}"
    return f"{stage.name}<br/>{stage.type}"


def _quote(text: str) -> str:
    return text.replace('"', "#quot;").replace("|", "#124;")


def _edges(plan: Plan, stage: Stage) -> list[tuple[str, str, str]]:
    """(target, kind, label) with kind success | failure | decision | fork (fork/join edges)."""
    if isinstance(stage, TaskStage | JoinStage):
        joining = plan.has_stage(stage.on_success) and plan.stage(stage.on_success).type == "join"
        success = ("fork", "join") if joining else ("success", "")
        return [(stage.on_success, *success), (stage.on_failure, "failure", "failure")]
    if isinstance(stage, DecisionStage):
        out = [(b.next, "decision", b.when) for b in stage.branches]
        return [*out, (stage.on_evaluation_error, "failure", "evaluation error")]
    assert isinstance(stage, ForkStage)
    return [(b, "fork", "fork") for b in stage.branches]


def to_mermaid(plan: Plan) -> str:
    ids = _ids(plan)
    lines = ["flowchart TD"]
    for s in plan.stages:
        text = _quote(_label(s))
        shape = {
            "decision": f'{{"{text}"}}',
            "fork": f'{{{{"{text}"}}}}',
            "join": f'{{{{"{text}"}}}}',
        }.get(s.type, f'["{text}"]')
        lines.append(f"  {ids[s.name]}{shape}")
    lines += [f'  {ids[t]}(["{t}"])' for t in plan.terminals]
    arrows = {"success": "-->", "failure": "-.->", "decision": "==>", "fork": "--o"}
    for s in plan.stages:
        for target, kind, label in _edges(plan, s):
            tag = f'|"{_quote(label)}"|' if label else ""
            lines.append(f"  {ids[s.name]} {arrows[kind]}{tag} {ids[target]}")
    lines += [
        "  classDef decision fill:#fff4d6,stroke:#b8860b",
        "  classDef forkjoin fill:#e3f0ff,stroke:#1f5fbf",
        "  classDef terminal fill:#eeeeee,stroke:#555555",
    ]
    for cls, kinds in (("decision", ("decision",)), ("forkjoin", ("fork", "join"))):
        members = [ids[s.name] for s in plan.stages if s.type in kinds]
        if members:
            lines.append(f"  class {','.join(members)} {cls}")
    lines.append(f"  class {','.join(ids[t] for t in plan.terminals)} terminal")
    return "\n".join(lines) + "\n"


def _dot_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("<br/>", "\\n")


def to_dot(plan: Plan) -> str:
    ids = _ids(plan)
    lines = [f'digraph "{_dot_text(plan.name)}" {{', "  rankdir=TB;", "  node [fontsize=11];"]
    shapes = {"decision": "diamond", "fork": "hexagon", "join": "hexagon"}
    for s in plan.stages:
        shape = shapes.get(s.type, "box")
        lines.append(f'  {ids[s.name]} [label="{_dot_text(_label(s))}", shape={shape}];')
    lines += [f'  {ids[t]} [label="{t}", shape=oval, style=filled];' for t in plan.terminals]
    styles = {
        "success": "style=solid",
        "failure": "style=dashed, color=red",
        "decision": "style=bold",
        "fork": "style=bold, color=blue",
    }
    for s in plan.stages:
        for target, kind, label in _edges(plan, s):
            text = f', label="{_dot_text(label)}"' if label else ""
            lines.append(f"  {ids[s.name]} -> {ids[target]} [{styles[kind]}{text}];")
    lines.append("}")
    return "\n".join(lines) + "\n"
