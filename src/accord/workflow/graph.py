"""The stage graph of a definition: every edge namespace as one labelled edge list.

Edges come from ``on_success``, ``on_failure``, ``on_evaluation_error``, decision branch
``next``, fork ``branches`` (fork → branch entry) and implicitly from a fork's branches into
their join; each stage kind lists its own (``StageKind.edges``, :mod:`accord.workflow.kinds`).
A target is a stage name or a terminal. The graph layer (:mod:`accord.workflow.check_graph`)
checks it; the contract and budget layers reuse the topological order and the two analyses here:

- :func:`guaranteed` — for each stage, the set of stages guaranteed to have *completed* (or, with
  ``success_only=False``, to have *run*) on every path that reaches it: the meet-over-all-paths
  of a forward data-flow problem, solved in one pass over the topological order because the
  graph is acyclic. A join is reached only after all of its fork's branches finish, so its set is
  the fork's set united with, per branch, what every way into the join guarantees (only the
  success exits when ``completed`` is the one acceptable branch state; otherwise every exit,
  terminals included). The join's failure edge guarantees only what the fork did.
- sets are Python ints used as bit sets, so 1,000-stage plans take milliseconds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from accord.workflow.kinds import AnyStage, ForkDef, JoinDef, kind_of
from accord.workflow.kinds.base import Edge

__all__ = ["Edge", "Graph", "edges_of", "guaranteed"]


def edges_of(stage: AnyStage) -> list[Edge]:
    """Outgoing edges written on ``stage`` (fork → join edges are added by the graph)."""
    return kind_of(stage).edges(stage)


@dataclass(slots=True)
class Graph:
    stages: dict[str, AnyStage]
    entry: str
    out: dict[str, list[Edge]] = field(default_factory=dict)  # all edges, terminals included
    into: dict[str, list[Edge]] = field(default_factory=dict)  # edges whose target is a stage
    topo: list[str] = field(default_factory=list)
    member: dict[str, tuple[str, str]] = field(default_factory=dict)  # stage → (fork, branch)
    fork_join: dict[str, str] = field(default_factory=dict)
    join_fork: dict[str, str] = field(default_factory=dict)

    @classmethod
    def build(cls, stages: dict[str, AnyStage], entry: str) -> Graph:
        g = cls(stages, entry)
        for s in stages.values():
            g.out[s.name] = edges_of(s)
            g.into.setdefault(s.name, [])
        for edges in g.out.values():
            for e in edges:
                if e.target in stages:
                    g.into[e.target].append(e)
        return g

    def successors(self, name: str) -> list[str]:
        return [e.target for e in self.out.get(name, ()) if e.target in self.stages]

    def reachable(self) -> set[str]:
        seen = {self.entry} if self.entry in self.stages else set()
        todo = deque(seen)
        while todo:
            for nxt in self.successors(todo.popleft()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    def find_cycle(self) -> list[str] | None:
        """One cycle as a list of stage names (first repeated at the end), or ``None``."""
        colour: dict[str, int] = {}
        for root in self.stages:
            if root in colour:
                continue
            stack: list[tuple[str, int]] = [(root, 0)]
            path: list[str] = []
            while stack:
                node, i = stack.pop()
                if i == 0:
                    colour[node] = 1
                    path.append(node)
                succ = self.successors(node)
                if i < len(succ):
                    stack.append((node, i + 1))
                    nxt = succ[i]
                    if colour.get(nxt) == 1:
                        return [*path[path.index(nxt) :], nxt]
                    if nxt not in colour:
                        stack.append((nxt, 0))
                else:
                    colour[node] = 2
                    path.pop()
        return None

    def order(self) -> list[str]:
        """Topological order (definition order among independent stages); graph is acyclic."""
        indegree = {n: len(self.into[n]) for n in self.stages}
        ready = deque(n for n in self.stages if indegree[n] == 0)
        out: list[str] = []
        while ready:
            node = ready.popleft()
            out.append(node)
            for nxt in self.successors(node):
                indegree[nxt] -= 1
                if indegree[nxt] == 0:
                    ready.append(nxt)
        self.topo = out
        return out


_FAILING = ("failure", "evaluation-error")


def guaranteed(graph: Graph, success_only: bool = True) -> dict[str, int]:
    """Stage → bit set (by topological position) of stages completed on every path to it."""
    bit = {name: 1 << i for i, name in enumerate(graph.topo)}
    before: dict[str, int] = {}
    by_branch: dict[tuple[str, str], list[str]] = {}
    for member, where in graph.member.items():
        by_branch.setdefault(where, []).append(member)

    def leaving(e: Edge) -> int:
        src = graph.stages[e.source]
        mask = before[e.source]
        if kind_of(src).has_result and (e.kind == "success" or not success_only):
            mask |= bit[e.source]
        if isinstance(src, JoinDef) and e.kind == "failure":
            mask = before.get(graph.join_fork.get(e.source, ""), 0)
        return mask

    for name in graph.topo:
        stage = graph.stages[name]
        if isinstance(stage, JoinDef) and name in graph.join_fork:
            fork = graph.join_fork[name]
            mask = before.get(fork, 0)
            # The join's success edge is taken only when every branch ended in an acceptable
            # state; with only ``completed`` acceptable, a branch counts only its success exits.
            strict = stage.acceptable_terminal_states == ("completed",)
            for branch in _branches(graph, fork):
                exits = [
                    leaving(e)
                    for m in by_branch.get((fork, branch), ())
                    for e in graph.out[m]
                    if (e.target == name and not (strict and e.kind in _FAILING))
                    or (not strict and e.target not in graph.stages)
                ]
                mask |= _meet(exits)
            before[name] = mask
        else:
            incoming = [leaving(e) for e in graph.into[name] if e.source in before]
            before[name] = _meet(incoming) if name != graph.entry else 0
    return before


def _branches(graph: Graph, fork: str) -> tuple[str, ...]:
    stage = graph.stages[fork]
    return stage.branches if isinstance(stage, ForkDef) else ()


def _meet(masks: list[int]) -> int:
    if not masks:
        return 0
    out = masks[0]
    for m in masks[1:]:
        out &= m
    return out


def bits_to_names(graph: Graph, mask: int) -> set[str]:
    return {n for i, n in enumerate(graph.topo) if mask >> i & 1}
