"""Hypothesis strategies for workflow definitions, over a small synthetic contract catalog.

:func:`valid_workflows` draws definitions (plain dicts, as parsed from YAML) that the compiler
must accept against :func:`synthetic_catalog`: a main line of segments — tasks (workers and
actions, with random retry, timeouts, cache and compensation), decisions (CEL guards over the
context and over results of stages already completed, ``has()`` for optional fields, a
``"true"`` fallback) and fork/join blocks of two or three branch chains. Bindings read the
context and results of stages that completed on every path, so every draw type-checks.

Used by the compiler's property tests (determinism, mutations are caught) and by the engine's
stateful tests (plans compiled from these definitions).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from accord.contracts.catalog import Catalog
from accord.contracts.model import (
    CapabilityContract,
    ContractRef,
    FieldSpec,
    MessageContract,
)

__all__ = ["synthetic_catalog", "valid_workflows"]

WORKERS = {"work.a@1": "q-a", "work.cached@1": "q-cache"}
ACTIONS = ("act.a@1",)


def _msg(name: str, payload: dict[str, FieldSpec]) -> MessageContract:
    return MessageContract(name=name, wire_version=1, owner="test", payload=payload)


def _cap(kind: str, ref: str, request: str, result: str, **kw: Any) -> CapabilityContract:
    name, version = ref.split("@")
    return CapabilityContract(
        kind="worker" if kind == "worker" else "action",
        name=name,
        version=int(version),
        owner="test",
        request=ContractRef(request, 1),
        result=ContractRef(result, 1),
        **kw,
    )


def synthetic_catalog() -> Catalog:
    """Contracts: context ``ctx@1``; workers ``work.a@1`` (queue ``q-a``), ``work.cached@1``
    (cacheable, ``q-cache``); actions ``act.a@1``, ``comp.undo@1``, ``final.audit@1``; a
    planned worker ``work.planned@1``."""
    s, i = FieldSpec("string", required=True), FieldSpec("integer", required=True)
    work_result = {
        "ok": FieldSpec("boolean", required=True),
        "score": FieldSpec("number", required=True),
        "label": FieldSpec("string"),
        "nested": FieldSpec("object", required=True, fields={"x": i}),
    }
    messages = [
        _msg("ctx", {"id": s, "count": i, "flag": FieldSpec("boolean")}),
        _msg(
            "work-request",
            {
                "id": s,
                "count": FieldSpec("integer", default=1),
                "note": FieldSpec("string", nullable=True),
            },
        ),
        _msg("work-result", work_result),
        _msg("act-request", {"id": s}),
        _msg("act-result", {"hit": FieldSpec("boolean", required=True)}),
    ]
    caps = [
        _cap("worker", "work.a@1", "work-request", "work-result", queue="q-a", errors=("flaky",)),
        _cap(
            "worker",
            "work.cached@1",
            "work-request",
            "work-result",
            queue="q-cache",
            cacheable=True,
        ),
        _cap(
            "worker",
            "work.planned@1",
            "work-request",
            "work-result",
            queue="q-a",
            status="planned",
            review_date="2027-01-01",
            promotion_criteria="two green weeks",
        ),
        _cap("action", "act.a@1", "act-request", "act-result"),
        _cap("action", "comp.undo@1", "act-request", "act-result"),
        _cap("action", "final.audit@1", "act-request", "act-result"),
    ]
    return Catalog([*messages, *caps])


class _Builder:
    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw
        self.stages: list[dict[str, Any]] = []
        self.workers_done: list[str] = []  # worker stages completed on every path so far

    def id_value(self) -> Any:
        return self.draw(st.sampled_from(["${context.id}", "model-1", '${context["id"]}']))

    def task(self, name: str, nxt: str) -> None:
        kind = self.draw(st.sampled_from(["worker", "worker", "action"]))
        stage: dict[str, Any] = {"name": name, "type": kind}
        if kind == "worker":
            cap = self.draw(st.sampled_from(sorted(WORKERS)))
            stage |= {"worker": cap, "queue": WORKERS[cap], "input": {"id": self.id_value()}}
            count = self.draw(st.sampled_from(["none", "literal", "context", "result"]))
            if count == "literal":
                stage["input"]["count"] = self.draw(st.integers(0, 100))
            elif count == "context":
                stage["input"]["count"] = "${context.count}"
            elif count == "result" and self.workers_done:
                src = self.draw(st.sampled_from(self.workers_done))
                stage["input"]["count"] = f'${{stages["{src}"].result.nested.x}}'
            if self.draw(st.booleans()):
                stage["input"]["note"] = self.draw(st.sampled_from([None, "n"]))
            if cap == "work.cached@1" and self.draw(st.booleans()):
                stage["cache"] = {"enabled": True, "ttl_ms": self.draw(st.integers(1, 10**6))}
            if self.draw(st.booleans()):
                stage["compensate"] = "comp.undo@1"
        else:
            stage |= {"action": self.draw(st.sampled_from(ACTIONS)), "input": {"id": "x"}}
        if self.draw(st.booleans()):
            initial = self.draw(st.integers(0, 5_000))
            stage["retry"] = {
                "max_attempts": self.draw(st.integers(1, 4)),
                "initial_backoff_ms": initial,
                "max_backoff_ms": initial + self.draw(st.integers(0, 60_000)),
                "multiplier": self.draw(st.sampled_from([1, 1.5, 2.0, 3])),
                "jitter": self.draw(st.sampled_from([0, 0.1, 0.5])),
            }
        if self.draw(st.booleans()):
            stage["timeouts"] = {
                "queue_deadline_ms": self.draw(st.integers(1, 120_000)),
                "execution_deadline_ms": self.draw(st.integers(1_000, 600_000)),
            }
        stage |= {"on_success": nxt, "on_failure": "failed"}
        self.stages.append(stage)

    def guard(self) -> str:
        options = ["context.count > 3", "context.id == 'x'"]
        for w in self.workers_done[-3:]:
            options += [
                f'stages["{w}"].result.ok == true',
                f'stages["{w}"].result.score >= 0.5',
                f'has(stages["{w}"].result.label) && stages["{w}"].result.label == "a"',
            ]
        return self.draw(st.sampled_from(options))

    def decision(self, name: str, nxt: str) -> None:
        branches = [
            {"when": self.guard(), "next": self.draw(st.sampled_from([nxt, "completed"]))}
            for _ in range(self.draw(st.integers(1, 2)))
        ]
        branches.append({"when": "true", "next": nxt})
        self.stages.append(
            {
                "name": name,
                "type": "decision",
                "branches": branches,
                "on_evaluation_error": "failed",
            }
        )

    def fork(self, name: str, join: str, nxt: str) -> None:
        done, finished = list(self.workers_done), list(self.workers_done)
        entries: list[str] = []
        self.stages.append({"name": name, "type": "fork", "branches": entries})
        for b in range(self.draw(st.integers(2, 3))):
            self.workers_done = list(done)  # a branch may read only what precedes the fork
            chain = [f"{name}-b{b}-s{k}" for k in range(self.draw(st.integers(1, 2)))]
            entries.append(chain[0])
            for k, stage in enumerate(chain):
                self.task(stage, chain[k + 1] if k + 1 < len(chain) else join)
                if self.stages[-1]["type"] == "worker":
                    self.workers_done.append(stage)
                    finished.append(stage)
        self.workers_done = finished
        join_stage = {"name": join, "type": "join", "required": list(entries)}
        join_stage |= {"acceptable_terminal_states": ["completed"], "on_success": nxt}
        self.stages.append(join_stage | {"on_failure": "failed"})


@st.composite
def valid_workflows(draw: st.DrawFn, max_segments: int = 8) -> dict[str, Any]:
    """A valid definition (dict) for :func:`synthetic_catalog`."""
    kinds = draw(
        st.lists(
            st.sampled_from(["task", "task", "decision", "fork"]), min_size=1, max_size=max_segments
        )
    )
    entries = [f"{'t' if k == 'task' else k[0]}{i}" for i, k in enumerate(kinds)]
    b = _Builder(draw)
    for i, kind in enumerate(kinds):
        nxt = entries[i + 1] if i + 1 < len(kinds) else "completed"
        if kind == "task":
            b.task(entries[i], nxt)
            if b.stages[-1]["type"] == "worker":
                b.workers_done.append(entries[i])
        elif kind == "decision":
            b.decision(entries[i], nxt)
        else:
            b.fork(entries[i], f"j{i}", nxt)
    doc: dict[str, Any] = {
        "name": draw(st.sampled_from(["wf", "ingest", "generated"])),
        "version": draw(st.sampled_from(["1", "1.0.0", "2.3.0"])),
        "entry": entries[0],
        "stages": b.stages,
        "terminals": ["completed", "failed"],
    }
    if draw(st.booleans()):
        doc["context"] = "ctx@1"
    if draw(st.booleans()):
        doc["finalisers"] = ["final.audit@1"]
    if draw(st.booleans()):
        doc["deadline_ms"] = 30 * 86_400_000
    return doc
