"""Run, stage and attempt records: the state the machine folds events into.

A run record is everything docs/architecture.md §4 lists, as frozen dataclasses: identity and pinned
versions, the context, run status and terminal *intent*, one :class:`StageState` per plan stage
(plus pseudo-stages ``@compensate/<stage>`` and ``@finaliser/<i>`` once they start), durable join
arrivals, the ids of released edges, compensation and finaliser progress, and ``seq`` — the number
of history entries, which is also the compare-and-set version the store guards.

Records are values. The machine never mutates one; it builds the next record and shares every
unchanged part (context, results, untouched stages) with the previous one, so a transition costs
a few small dict copies however large the payloads are. Callers must treat the contained dicts as
read-only for the same reason.

``to_json``/``from_json`` are an exact round trip: ``RunState.from_json(r.to_json()) == r``.
Tuples become lists in JSON and lists become tuples again on the way back.

:meth:`RunState.canonical_text` is ``canonical_json(r.to_json())`` as text, built from each
stage's canonical text, which a stage computes once and keeps (records are values, and
:func:`evolve` drops the kept text from the copy it changes): a transition that touches one stage
re-encodes one stage, not the whole record (see :mod:`accord.engine.machine.encoding`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from accord.engine.machine.encoding import EncodedDoc
from accord.engine.machine.encoding import canonical_key as _key
from accord.engine.machine.encoding import canonical_text as _text

__all__ = [
    "ACTIVE_ATTEMPT",
    "ACTIVE_STAGE",
    "RUN_STATUSES",
    "RUN_TERMINAL",
    "WAITING",
    "AttemptState",
    "EncodedDoc",
    "HistoryEntry",
    "RunState",
    "StageState",
    "evolve",
]

JsonDict = dict[str, Any]

ACTIVE_ATTEMPT = frozenset({"queued", "running"})
ACTIVE_STAGE = frozenset({"queued", "running", "retry-scheduled"})
WAITING = "waiting"  # an approval gate waiting for its decisions
RUN_TERMINAL = frozenset({"completed", "failed", "cancelled"})
# every status a run record has; the store also keeps records of other kinds under statuses of
# their own (schedule fires, admission refusals: accord.engine.runtime.schedules, .admission),
# which listings of runs leave out
RUN_STATUSES = frozenset({"running", "finalising", *RUN_TERMINAL})
_R = TypeVar("_R", "AttemptState", "StageState", "RunState")


def evolve(record: _R, **changes: Any) -> _R:
    """``dataclasses.replace`` for records, without re-running ``__init__``: a record is already
    valid, so copying its attribute dict is enough — several times faster on the hot path."""
    assert changes.keys() <= record.__dict__.keys(), f"unknown field in {sorted(changes)}"
    new = object.__new__(type(record))
    state = new.__dict__
    state.update(record.__dict__)
    state.update(changes)
    state.pop(_TEXT, None)  # the kept canonical text describes the record it was made from
    state.pop(_DOC, None)  # and so does the kept JSON document
    return new


_TEXT = "_canonical_text"
_DOC = "_canonical_doc"
# a run's context and contracts with their canonical texts, reused while the record (and every
# record evolved from it) holds the very same objects: they never change during a run
_KEPT = "_canonical_kept"


def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


@dataclass(frozen=True, kw_only=True)
class AttemptState:
    """One attempt: ``queued``/``running`` while live, then ``succeeded``, ``failed``,
    ``timed-out``, ``cancelled`` or ``quarantined`` (the last three are fenced)."""

    attempt: int
    fence: str
    status: str
    job_id: str
    dispatched_at_ms: int
    caused_by: int  # seq of the history entry that dispatched it (the envelope's causationId)
    accepted_at_ms: int | None = None
    deadline_at_ms: int | None = None  # the live clock: queue deadline, then execution deadline
    heartbeat_due_ms: int | None = None
    finished_at_ms: int | None = None

    def to_json(self) -> JsonDict:
        d = self.__dict__
        return {n: d[n] for n in _ATTEMPT_FIELDS}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> AttemptState:
        return cls(**doc)


@dataclass(frozen=True, kw_only=True)
class StageState:
    name: str
    kind: str  # worker | action | decision | fork | join | approval | compensation | finaliser
    status: str = "pending"
    attempt: int = 0
    fence: str = ""
    result: JsonDict | None = None
    error: JsonDict | None = None
    released: bool = False
    progress: float = 0.0
    attempts: tuple[AttemptState, ...] = ()
    quarantine: JsonDict | None = None  # reconcile metadata of a poison report
    first_attempt: int = 1  # where the current retry budget started (moves on re-drive)

    @property
    def current(self) -> AttemptState | None:
        return self.attempts[-1] if self.attempts else None

    def to_json(self) -> JsonDict:
        d = self.__dict__
        doc = {n: d[n] for n in _STAGE_FIELDS}
        doc["attempts"] = [a.to_json() for a in self.attempts]
        return doc

    def canonical_text(self) -> str:
        """``canonical_json(self.to_json())`` as text, computed once per record."""
        text: str | None = self.__dict__.get(_TEXT)
        if text is None:
            text = self.__dict__[_TEXT] = _text(self.to_json())
        return text

    def kept_json(self) -> JsonDict:
        """:meth:`to_json`, computed once per record and shared by every caller: read-only."""
        doc: JsonDict | None = self.__dict__.get(_DOC)
        if doc is None:
            doc = self.__dict__[_DOC] = self.to_json()
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> StageState:
        data = dict(doc)
        data["attempts"] = tuple(AttemptState.from_json(a) for a in data.get("attempts", ()))
        return cls(**data)


_TUPLES = ("released", "completion_order", "compensations", "finalisers")


@dataclass(frozen=True, kw_only=True)
class RunState:
    run_id: str
    tenant: str
    workflow: str
    plan_digest: str
    dsl_version: str
    compiler_version: str
    engine_version: str
    contracts: Mapping[str, str]
    context: Mapping[str, Any]
    stages: Mapping[str, StageState]
    status: str = "running"  # running | finalising | completed | failed | cancelled
    intent: str | None = None  # None | completed | failed
    join_arrivals: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    branch_states: Mapping[str, str] = field(default_factory=dict)  # branch → state on arrival
    released: tuple[str, ...] = ()  # edge ids ``source->target``, in release order
    completion_order: tuple[str, ...] = ()  # task stages, in the order they completed
    compensations: tuple[str, ...] = ()  # stages to compensate, in the order it happens
    finalisers: tuple[str, ...] = ()  # outcome per finished finaliser: completed | failed
    seq: int = 0
    started_at_ms: int = 0
    deadline_at_ms: int | None = None
    result: JsonDict | None = None
    error: JsonDict | None = None
    requested_by: str = ""  # who asked for the run (approval gates may exclude them)
    sampled: bool = True  # the run's trace is kept: its jobs' traceparents say -01, else -00

    @property
    def terminal(self) -> bool:
        return self.status in RUN_TERMINAL

    def to_json(self) -> JsonDict:
        doc = self._top()
        doc["stages"] = {name: s.to_json() for name, s in self.stages.items()}
        return doc

    def _top(self) -> JsonDict:
        """Every field but ``stages``, as JSON."""
        d = self.__dict__
        doc = {n: d[n] for n in _RUN_FIELDS if n != "stages"}
        doc["contracts"] = dict(self.contracts)
        doc["context"] = dict(self.context)
        doc["join_arrivals"] = {j: list(b) for j, b in self.join_arrivals.items()}
        doc["branch_states"] = dict(self.branch_states)
        for name in _TUPLES:
            doc[name] = list(doc[name])
        if not doc["requested_by"]:  # written only when known, so earlier records keep their form
            del doc["requested_by"]
        if doc["sampled"]:  # written only when false, for the same reason
            del doc["sampled"]
        return doc

    def canonical_text(self) -> str:
        """``canonical_json(self.to_json())`` as text, re-encoding only stages not yet encoded."""
        return self._text_of(self._top())

    def _text_of(self, top: JsonDict) -> str:
        context, contracts = self._kept_texts()
        head = _text({k: v for k, v in top.items() if k < "context"})
        middle = _text({k: v for k, v in top.items() if "contracts" < k < "stages"})
        tail = _text({k: v for k, v in top.items() if k > "stages"})
        stages = ",".join(
            f"{_key(name)}:{self.stages[name].canonical_text()}" for name in sorted(self.stages)
        )
        parts = (
            head[1:-1],
            f'"context":{context}',
            f'"contracts":{contracts}',
            middle[1:-1],
            f'"stages":{{{stages}}}',
            tail[1:-1],
        )
        return "{" + ",".join(p for p in parts if p) + "}"

    def _kept_texts(self) -> tuple[str, str]:
        """The canonical texts of ``context`` and ``contracts``, encoded once per run: a record
        evolved from this one shares the objects, and with them these texts."""
        kept = self.__dict__.get(_KEPT)
        if kept is None or kept[0] is not self.context or kept[1] is not self.contracts:
            kept = self.__dict__[_KEPT] = (
                self.context,
                self.contracts,
                _text(dict(self.context)),
                _text(dict(self.contracts)),
            )
        return kept[2], kept[3]

    def encoded(self) -> EncodedDoc:
        """:meth:`to_json` with :meth:`canonical_text` attached (its stage documents are the
        stages' kept ones: read-only, as every record's parts are)."""
        top = self._top()
        text = self._text_of(top)
        top["stages"] = {name: s.kept_json() for name, s in self.stages.items()}
        return EncodedDoc(top, text)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RunState:
        data = dict(doc)
        data["stages"] = {n: StageState.from_json(s) for n, s in data["stages"].items()}
        data["join_arrivals"] = {j: tuple(b) for j, b in data.get("join_arrivals", {}).items()}
        data["branch_states"] = dict(data.get("branch_states", {}))
        for name in _TUPLES:
            data[name] = tuple(data.get(name, ()))
        return cls(**data)


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryEntry:
    """One applied event. Rejections are history too: ``accepted`` false and a ``reason``
    (``stale``, ``duplicate``, ``late``, ``unknown-attempt``, ``invalid``)."""

    seq: int
    at_ms: int
    event: JsonDict  # event_to_json(event)
    accepted: bool
    reason: str | None = None
    note: str = ""

    def to_json(self) -> JsonDict:
        return {
            "seq": self.seq, "at_ms": self.at_ms, "event": self.event,
            "accepted": self.accepted, "reason": self.reason, "note": self.note,
        }  # fmt: skip

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> HistoryEntry:
        return cls(**doc)


_ATTEMPT_FIELDS = _names(AttemptState)
_STAGE_FIELDS = _names(StageState)
_RUN_FIELDS = _names(RunState)
# RunState._text_of puts the kept texts between the fields sorting before "context" and after
# "contracts": no other field may sort between them
assert [n for n in sorted(_RUN_FIELDS) if "context" <= n <= "contracts"] == ["context", "contracts"]
