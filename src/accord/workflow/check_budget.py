"""Layer 4 — the deadline budget: can the slowest path still finish inside ``deadline_ms``?

A task stage's worst case is every attempt waiting its full queue deadline and running its full
execution deadline, plus the longest backoff between attempts::

    cost(stage) = max_attempts × (queue_deadline_ms + execution_deadline_ms)
                  + retry.worst_case_backoff_ms()

Decisions, forks and joins cost nothing (each kind states its cost: ``StageKind.cost_ms``).
Fork branches run in parallel, so the slowest branch counts; that is exactly the longest path
through the acyclic stage graph, found by one pass over the topological order (linear in stages +
edges, not in the number of paths). When the longest entry-to-terminal path exceeds the run
deadline the plan is refused (``budget-exceeded``) naming that path, its total and the stage that
contributes most. Without ``deadline_ms`` there is no budget to check.
"""

from __future__ import annotations

from accord.errors import Diagnostic
from accord.workflow.dsl import Definition
from accord.workflow.graph import Graph
from accord.workflow.kinds import AnyStage, kind_of

__all__ = ["check_budget", "stage_cost_ms"]


def stage_cost_ms(stage: AnyStage) -> int:
    cost: int = kind_of(stage).cost_ms(stage)
    return cost


def check_budget(d: Definition, graph: Graph) -> list[Diagnostic]:
    if d.deadline_ms is None:
        return []
    longest: dict[str, int] = {}
    via: dict[str, str | None] = {}
    for name in graph.topo:
        best, best_from = -1, None
        for e in graph.into[name]:
            if e.source in longest and longest[e.source] > best:
                best, best_from = longest[e.source], e.source
        longest[name] = max(best, 0) + stage_cost_ms(graph.stages[name])
        via[name] = best_from
    ends = [n for n in graph.topo if any(e.target not in graph.stages for e in graph.out[n])]
    if not ends:
        return []
    position = {n: i for i, n in enumerate(graph.topo)}
    last = max(ends, key=lambda n: (longest[n], position[n]))  # ties: the longer path
    if longest[last] <= d.deadline_ms:
        return []
    path: list[str] = []
    node: str | None = last
    while node is not None:
        path.append(node)
        node = via[node]
    path.reverse()
    worst = graph.stages[max(path, key=lambda n: stage_cost_ms(graph.stages[n]))]
    message = (
        f"the path {' → '.join(path)} may take {longest[last]} ms (queue + execution deadlines "
        f"× attempts + worst-case backoff), over the run deadline of {d.deadline_ms} ms; "
        f"{worst.name!r} alone may take {stage_cost_ms(worst)} ms"
    )
    return [worst.diag("budget-exceeded", message, None)]
