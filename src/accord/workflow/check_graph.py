"""Layer 2 — graph semantics over every edge namespace.

Checks, in order (later checks need earlier ones to hold, so the layer stops at the first group
that fails): names unique and not terminal names; every reference resolvable (entry, routes,
decision branches, fork branches, join ``required``, ``finaliser_failure_terminal``) and every
terminal used is declared; no list of references (fork ``branches``, join ``required``,
``finalisers``) names one entry twice; each decision ends with its ``"true"`` fallback and has no
other; no cycle; every stage reachable from the entry; forks and joins well formed. What a stage
refers to is checked by its kind (``StageKind.references``, :mod:`accord.workflow.kinds`); the
whole-graph checks, the fork/join topology among them, are here.

Forks: each branch is the set of stages reachable from its entry without passing a join. A
branch may hold tasks and decisions; it must reach only its fork's join or a terminal, and no
stage of it may be entered from outside it. Every branch of a fork must end in the same join, and
that join's ``required`` must be exactly the fork's branch set. **Forks nest**: a fork on a
branch is matched to its own join first (innermost first), and then counts, with its join, as one
step of the enclosing branch; its branches belong to it (their stages' ``fork`` is the inner
fork, the inner fork's and join's ``fork`` and ``branch`` are the enclosing ones).

Codes: ``graph-duplicate-stage``, ``graph-terminal-name``, ``graph-unknown-entry``,
``graph-unknown-target``, ``graph-undeclared-terminal``, ``graph-duplicate-reference``,
``graph-decision-fallback-missing``, ``graph-decision-fallback-not-last``, ``graph-cycle``,
``graph-unreachable``, ``graph-branch-escape``, ``graph-fork-without-join``,
``graph-fork-multiple-joins``, ``graph-join-without-fork``, ``graph-join-required-mismatch``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from accord.errors import Diagnostic, Location
from accord.workflow.dsl import Definition
from accord.workflow.graph import Graph
from accord.workflow.kinds import AnyStage, ForkDef, JoinDef, kind_of
from accord.workflow.kinds.base import StageDef
from accord.workflow.plan import TERMINALS

__all__ = ["check_graph"]


def check_graph(d: Definition) -> tuple[Graph | None, list[Diagnostic]]:
    """Check the graph; return it (with topological order and fork membership) when sound."""
    diags: list[Diagnostic] = []
    stages: dict[str, AnyStage] = {}
    for s in d.stages:
        if s.name in stages:
            diags.append(
                s.diag("graph-duplicate-stage", f"stage {s.name!r} is defined twice", "name")
            )
        elif s.name in TERMINALS or s.name in d.terminals:
            diags.append(s.diag("graph-terminal-name", f"{s.name!r} is a terminal name", "name"))
        stages.setdefault(s.name, s)
    if d.entry not in stages:
        diags.append(d.diag("graph-unknown-entry", f"entry {d.entry!r} is not a stage", "entry"))
    if d.terminal_policy.finaliser_failure_terminal not in d.terminals:
        diags.append(
            d.diag(
                "graph-undeclared-terminal",
                "finaliser_failure_terminal "
                f"{d.terminal_policy.finaliser_failure_terminal!r} is not declared",
                "terminal_policy",
            )
        )
    diags += _duplicates(d, d.finalisers, "finalisers")
    graph = Graph.build(stages, d.entry)
    for s in stages.values():
        diags += _references(d, s, stages)
    if diags:
        return None, diags
    cycle = graph.find_cycle()
    if cycle:
        where = stages[cycle[-2]]
        return None, [where.diag("graph-cycle", "cycle: " + " → ".join(cycle), None)]
    reached = graph.reachable()
    diags += [
        s.diag(
            "graph-unreachable",
            f"stage {s.name!r} is unreachable from the entry {d.entry!r}",
            "name",
        )
        for s in stages.values()
        if s.name not in reached
    ]
    if diags:
        return None, diags
    graph.order()
    diags += _forks(graph)
    return (None if diags else graph), diags


def _references(d: Definition, s: AnyStage, stages: dict[str, AnyStage]) -> list[Diagnostic]:
    refs = _References(d, s, stages)
    kind_of(s).references(s, refs)
    return refs.out


class _References:
    """What a kind's ``references`` hook reports through (``StageKind.references``)."""

    def __init__(self, d: Definition, s: AnyStage, stages: dict[str, AnyStage]) -> None:
        self.d, self.s, self.stages = d, s, stages
        self.out: list[Diagnostic] = []

    def report(self, code: str, message: str, key: str, where: Location | None = None) -> None:
        diag = self.s.diag(code, message, key)
        self.out.append(replace(diag, location=where) if where is not None else diag)

    def target(
        self, name: str, key: str, *, stage_only: bool = False, where: Location | None = None
    ) -> None:
        if name in self.stages:
            return
        if name in TERMINALS and not stage_only:
            if name not in self.d.terminals:
                message = f"terminal {name!r} is used but not declared in `terminals`"
                self.report("graph-undeclared-terminal", message, key, where)
            return
        what = "a stage" if stage_only else "a stage or a declared terminal"
        self.report("graph-unknown-target", f"{key} → {name!r} is not {what}", key, where)

    def duplicates(self, names: tuple[str, ...], key: str) -> None:
        self.out += _duplicates(self.s, names, key)


def _duplicates(owner: StageDef | Definition, names: tuple[str, ...], key: str) -> list[Diagnostic]:
    dupes = sorted({n for n in names if names.count(n) > 1})
    return [owner.diag("graph-duplicate-reference", f"{key} lists {n!r} twice", key) for n in dupes]


def _forks(g: Graph) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    fed: set[str] = set()  # joins some fork's branches reach
    pending = [s for s in g.stages.values() if isinstance(s, ForkDef)]
    while pending:  # innermost first: a fork waits until every fork inside its branches is matched
        ready = [f for f in pending if not _holds_unmatched(g, f, pending)]
        if not ready:  # only a cycle could do this, and layer 2 refused cycles already
            break
        for fork in ready:
            pending.remove(fork)
            fed |= _match(g, fork, out)
    out += _escapes(g)
    for join in (s for s in g.stages.values() if isinstance(s, JoinDef)):
        if join.name not in fed:
            message = "no fork's branches reach this join"
            out.append(join.diag("graph-join-without-fork", message, "required"))
    return out


def _holds_unmatched(g: Graph, fork: ForkDef, pending: list[ForkDef]) -> bool:
    names = {f.name for f in pending} - {fork.name}
    return any(node in names for entry in fork.branches for node in _walk(g, entry))


def _match(g: Graph, fork: ForkDef, out: list[Diagnostic]) -> set[str]:
    """Match ``fork`` to the one join its branches reach; return the joins they reach."""
    joins = _branches(g, fork, out)
    if not joins:
        out.append(fork.diag("graph-fork-without-join", "no branch reaches a join", "branches"))
        return set()
    if len(joins) > 1:
        message = f"branches end in different joins {joins}; all must reach one join"
        out.append(fork.diag("graph-fork-multiple-joins", message, "branches"))
        return set(joins)
    join = g.stages[joins[0]]
    assert isinstance(join, JoinDef)
    if join.name in g.join_fork:
        message = f"join {join.name!r} is fed by forks {g.join_fork[join.name]!r} and {fork.name!r}"
        out.append(join.diag("graph-branch-escape", message, None))
        return set(joins)
    g.fork_join[fork.name], g.join_fork[join.name] = join.name, fork.name
    if set(join.required) != set(fork.branches):
        message = (
            f"required {list(join.required)} must equal the branches of fork "
            f"{fork.name!r} {list(fork.branches)}"
        )
        out.append(join.diag("graph-join-required-mismatch", message, "required"))
    return set(joins)


def _walk(g: Graph, entry: str) -> list[str]:
    """Stages reachable from ``entry`` without passing an unmatched join (the branch), in BFS
    order. A fork already matched to its join (a nested fork) counts as one step to that join:
    its own branches belong to it, not to this branch."""
    seen, order, todo = {entry}, [], deque([entry])
    while todo:
        node = todo.popleft()
        order.append(node)
        stage = g.stages[node]
        if isinstance(stage, ForkDef):
            if node not in g.fork_join:
                continue  # not matched yet: the caller waits for it
            successors = [g.fork_join[node]]
        else:
            successors = list(g.successors(node))
        for nxt in successors:
            unmatched_join = isinstance(g.stages[nxt], JoinDef) and nxt not in g.join_fork
            if nxt not in seen and not unmatched_join:
                seen.add(nxt)
                todo.append(nxt)
    return order


def _branches(g: Graph, fork: ForkDef, out: list[Diagnostic]) -> list[str]:
    """Assign branch membership; return the joins the branches reach (in first-seen order)."""
    joins: dict[str, None] = {}
    for entry in fork.branches:
        for node in _walk(g, entry):
            stage = g.stages[node]
            if node in g.member:
                other = g.member[node]
                message = f"stage {node!r} is reached by branch {other[1]!r} and branch {entry!r}"
                out.append(stage.diag("graph-branch-escape", message, None))
                continue
            g.member[node] = (fork.name, entry)
            if isinstance(stage, ForkDef):
                continue  # a nested fork's branches end in its own join
            joins |= {
                n: None
                for n in g.successors(node)
                if isinstance(g.stages[n], JoinDef) and n not in g.join_fork
            }
    return list(joins)


def _escapes(g: Graph) -> list[Diagnostic]:
    """Every stage of a branch is entered only from its branch (or, for the entry, its fork);
    a join only from its fork's branches."""
    out: list[Diagnostic] = []
    for name, stage in g.stages.items():
        allowed: set[tuple[str, str]] = set()
        entered_by = ""  # the fork that may enter the stage directly (a branch entry)
        if name in g.join_fork:  # a join, entered from its fork's branches
            fork = g.join_fork[name]
            fork_stage = g.stages[fork]
            assert isinstance(fork_stage, ForkDef)
            allowed = {(fork, b) for b in fork_stage.branches}
            where = f"the branches of fork {fork!r}"
        elif name in g.member:
            fork, entry = g.member[name]
            allowed = {(fork, entry)}
            where = f"branch {entry!r} of fork {fork!r}"
            entered_by = fork if name == entry else ""
        else:
            continue
        for e in g.into[name]:
            if g.member.get(e.source) in allowed or e.source == entered_by:
                continue
            message = (
                f"stage {name!r} belongs to {where} but is also entered from {e.source!r}; "
                "a branch may reach only its join or a terminal"
            )
            out.append(stage.diag("graph-branch-escape", message, None))
    return out
