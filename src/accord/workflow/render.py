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
safe; labels carry the names. Each kind states its shape, class, label and edges
(:mod:`accord.workflow.kinds`); the drawing conventions are here. Pure: producing an SVG file is
the CLI's job.
"""

from __future__ import annotations

from accord.workflow.kinds import Stage, kind_of
from accord.workflow.plan import Plan

__all__ = ["to_dot", "to_mermaid"]


def _ids(plan: Plan) -> dict[str, str]:
    ids = {s.name: f"s{i}" for i, s in enumerate(plan.stages)}
    ids |= {t: f"t_{t}" for t in plan.terminals}
    return ids


def _label(stage: Stage) -> str:
    label: str = kind_of(stage).label(stage)
    return label


def _quote(text: str) -> str:
    return text.replace('"', "#quot;").replace("|", "#124;")


def _edges(plan: Plan, stage: Stage) -> list[tuple[str, str, str]]:
    """(target, kind, label) with kind success | failure | decision | fork (fork/join edges);
    a success edge into a join is drawn as the branch joining."""
    out: list[tuple[str, str, str]] = []
    for arrow in kind_of(stage).arrows(stage):
        target, kind, _ = arrow
        joining = kind == "success" and _is_join(plan, target)
        out.append((target, "fork", "join") if joining else arrow)
    return out


def _is_join(plan: Plan, target: str) -> bool:
    return plan.has_stage(target) and plan.stage(target).type == "join"


_MERMAID = {"box": '["{}"]', "diamond": '{{"{}"}}', "hexagon": '{{{{"{}"}}}}'}


def to_mermaid(plan: Plan) -> str:
    ids = _ids(plan)
    lines = ["flowchart TD"]
    for s in plan.stages:
        shape = _MERMAID[kind_of(s).shape].format(_quote(_label(s)))
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
    for cls in ("decision", "forkjoin"):
        members = [ids[s.name] for s in plan.stages if kind_of(s).style == cls]
        if members:
            lines.append(f"  class {','.join(members)} {cls}")
    lines.append(f"  class {','.join(ids[t] for t in plan.terminals)} terminal")
    return "\n".join(lines) + "\n"


def _dot_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("<br/>", "\\n")


def to_dot(plan: Plan) -> str:
    ids = _ids(plan)
    lines = [f'digraph "{_dot_text(plan.name)}" {{', "  rankdir=TB;", "  node [fontsize=11];"]
    for s in plan.stages:
        shape = kind_of(s).shape  # DOT spells the three shapes the same way
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
