"""Canary activation in the store: the split beside the active digest, the choice at each start,
and promotion or abort from the recorded outcomes.

A split (:class:`accord.workflow.canary.Split`) is stored with the store's own plan methods, so
every adapter keeps it without a new table: the document is put under ``canary:<sha256>`` (an
immutable artefact, like a plan) and the pseudo-workflow ``@canary/<workflow>`` is activated to
it. A promotion or abort stores the decided split the same way, so the activation history of
``@canary/<workflow>`` is the canary's audit trail (who began it, with what share and criteria,
who decided and why).

:func:`admit` is what the engine asks at every start by workflow name: with no running split the
active digest (admission reason ``active``); with one, :func:`accord.workflow.canary.choose` by
the run id. :func:`outcomes` counts the ended runs of a digest from the store's run records (the
run's ``plan_digest``, among the newest ``limit`` runs of the workflow); :func:`settle` applies
the criteria's verdict: a promotion activates the canary digest for every new run, an abort
leaves the stable one active. Either ends the split; runs already started stay on their digest.

**Exactly one decision.** A split is decided by a compare-and-set on its own record: the decided
split is put as the immutable artefact ``canaryclaim:<hex of the running split's key>``,
which every store writes only when absent (an artefact with other content is refused). Whoever
puts it first — an author by hand, or one of several engines settling on their own — decided;
everyone else is refused with ``canary-decided`` naming who decided what and why. A decider that
stops between the claim and the switch of the active version is finished by the next settle,
from the claim as recorded.

**The engine settles on its own.** :class:`Keeper` is the engine's periodic pass
(:mod:`accord.engine.runtime.lifecycle`): every ``canary_every_ms`` it looks at the workflows
with a running split — those the engine admitted a run of under a split, and those among the
newest updated runs in the store, so an engine that started none of them finds them too — and
applies :func:`settle` by the engine's owner id, as ``accord workflow promote --auto`` would.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from accord.canonical import digest_of
from accord.engine.ports import Clock, Store
from accord.errors import ImmutableArtefactError
from accord.workflow.activation import load_plan, stored_document
from accord.workflow.canary import (
    CanaryError,
    Criteria,
    Outcomes,
    Split,
    SplitState,
    Verdict,
    choose,
    parse_criteria,
    verdict,
)
from accord.workflow.plan import Plan

__all__ = [
    "PREFIX",
    "Keeper",
    "abort",
    "admit",
    "begin",
    "current",
    "outcomes",
    "promote",
    "settle",
    "status",
]

PREFIX = "@canary/"
CLAIM = "canaryclaim:"
_ENDED = {"completed": False, "failed": True, "cancelled": True}

log = logging.getLogger("accord.engine.canary")


def _key(split: Split) -> str:
    return "canary:" + digest_of(split.to_json()).removeprefix("sha256:")


async def _save(store: Store, split: Split) -> None:
    key = _key(split)
    await store.put_plan(key, split.to_json())
    if await store.get_active(PREFIX + split.workflow) != key:
        await store.set_active(PREFIX + split.workflow, key)


async def _apply(store: Store, decided: Split) -> Split:
    """Switch the active version as ``decided`` says, then record the decided split (each step
    is skipped when already done, so finishing another decider's claim is harmless)."""
    if decided.state == "promoted":
        plan = await load_plan(store, decided.canary)
        target = plan.digest
    else:
        target = decided.stable
    if await store.get_active(decided.workflow) != target:
        await store.set_active(decided.workflow, target)
    await _save(store, decided)
    return decided


async def _claimed(store: Store, split: Split) -> Split | None:
    doc = await store.get_plan(CLAIM + _key(split).removeprefix("canary:"))
    return Split.from_json(doc) if doc is not None else None


async def _decide(store: Store, split: Split, decided: Split) -> Split:
    """Compare-and-set: record ``decided`` as the one decision of the running ``split``."""
    claim = CLAIM + _key(split).removeprefix("canary:")
    try:
        await store.put_plan(claim, decided.to_json())
    except ImmutableArtefactError:
        won = await _claimed(store, split)
        raise CanaryError(
            "canary-decided",
            f"{split.workflow}'s canary of {split.canary} was already "
            + (f"{won.state} by {won.decided_by}: {won.decision}" if won else "decided"),
        ) from None
    return await _apply(store, decided)


async def current(store: Store, workflow: str) -> Split | None:
    """The workflow's latest split (running or decided), if it ever had one."""
    key = await store.get_active(PREFIX + workflow)
    if key is None:
        return None
    doc = await store.get_plan(key)
    return Split.from_json(doc) if doc is not None else None


async def begin(
    store: Store,
    plan: Plan,
    share: int,
    *,
    criteria: Criteria | None = None,
    by: str,
    reason: str = "",
    now_ms: int,
) -> Split:
    """Store ``plan`` and send ``share`` basis points of new runs of its workflow to it."""
    stable = await store.get_active(plan.name)
    if stable is None:
        raise CanaryError(
            "canary-no-active-version", f"{plan.name} has no active version to compare against"
        )
    if stable == plan.digest:
        raise CanaryError("canary-already-active", f"{plan.digest} is already the active version")
    running = await current(store, plan.name)
    if running is not None and running.state == "running":
        raise CanaryError(
            "canary-running",
            f"{plan.name} already has a canary of {running.canary}: promote or abort it first",
        )
    await store.put_plan(plan.digest, stored_document(plan))
    chosen = criteria or parse_criteria(plan.promotion_criteria) or Criteria()
    split = Split(plan.name, stable, plan.digest, share, chosen, "running", by, reason, now_ms)
    await _save(store, split)
    return split


async def admit(store: Store, workflow: str, key: str) -> tuple[str | None, dict[str, Any]]:
    """The digest a new run of ``workflow`` (a name or a digest) with run id ``key`` starts
    on, and why; ``None`` when the workflow has no active version."""
    if workflow.startswith("sha256:"):
        return workflow, {"digest": workflow, "reason": "pinned"}
    split = await current(store, workflow)
    if split is not None and split.state == "running":
        return choose(split, key)
    digest = await store.get_active(workflow)
    return digest, {"digest": digest, "reason": "active"}


async def _counted(
    store: Store, workflow: str, digests: tuple[str, ...], limit: int = 10_000
) -> list[Outcomes]:
    """The outcomes of each of ``digests``, from one read of the workflow's newest runs."""
    counts = {d: [0, 0, 0] for d in digests}  # ended, failed, running
    for row in await store.list_runs(limit=limit, workflow=workflow):
        count = counts.get(str(row.state.get("plan_digest", "")))
        if count is None:
            continue
        status = row.state.get("status", "")
        if status in _ENDED:
            count[0] += 1
            count[1] += _ENDED[status]
        else:
            count[2] += 1
    return [Outcomes(*counts[d]) for d in digests]


async def outcomes(store: Store, workflow: str, digest: str, limit: int = 10_000) -> Outcomes:
    return (await _counted(store, workflow, (digest,), limit))[0]


async def status(store: Store, workflow: str) -> tuple[Split, Outcomes, Outcomes, Verdict]:
    split = await current(store, workflow)
    if split is None:
        raise CanaryError("canary-none", f"{workflow} has no canary")
    stable, canary = await _counted(store, workflow, (split.stable, split.canary))
    return split, stable, canary, verdict(split.criteria, stable, canary)


async def _running(store: Store, workflow: str) -> Split:
    split = await current(store, workflow)
    if split is None or split.state != "running":
        raise CanaryError("canary-none", f"{workflow} has no running canary")
    won = await _claimed(store, split)
    if won is not None:  # decided, and its decider stopped before switching: finish it
        await _apply(store, won)
        raise CanaryError(
            "canary-decided",
            f"{workflow}'s canary of {split.canary} was already {won.state} by "
            f"{won.decided_by}: {won.decision}",
        )
    return split


async def promote(store: Store, workflow: str, *, by: str, why: str, now_ms: int) -> Split:
    """Make the canary the active version for every new run (refused with ``canary-decided``
    when someone else decided the split first)."""
    split = await _running(store, workflow)
    await load_plan(store, split.canary)  # the canary's plan is readable before anyone decides
    return await _decide(store, split, split.decided("promoted", by, why, now_ms))


async def abort(store: Store, workflow: str, *, by: str, why: str, now_ms: int) -> Split:
    """Stop sending new runs to the canary; the stable version stays active."""
    split = await _running(store, workflow)
    return await _decide(store, split, split.decided("aborted", by, why, now_ms))


async def settle(store: Store, workflow: str, *, by: str, now_ms: int) -> tuple[Split, Verdict]:
    """Promote or abort when the criteria say so; otherwise leave the split running. When
    another decider got there first, its decision is answered (and finished if need be)."""
    split, _, _, found = await status(store, workflow)
    if split.state != "running":
        return split, found
    won = await _claimed(store, split)
    if won is not None:
        return await _apply(store, won), Verdict(_VERB[won.state], won.decision)
    if found.decision == "wait":
        return split, found
    state: SplitState = "promoted" if found.decision == "promote" else "aborted"
    try:
        return await _decide(store, split, split.decided(state, by, found.why, now_ms)), found
    except CanaryError as exc:
        if exc.code != "canary-decided":
            raise
        won = await _claimed(store, split)
        assert won is not None  # the claim that refused ours
        return won, Verdict(_VERB[won.state], won.decision)


_VERB: Mapping[str, Any] = {"promoted": "promote", "aborted": "abort", "running": "wait"}


class Keeper:
    """The engine's canary pass: settle every running split it can find, by ``owner``."""

    def __init__(self, store: Store, clock: Clock, *, owner: str, scan: int = 200) -> None:
        self.store, self.clock, self.owner, self.scan = store, clock, owner, scan
        self._noted: set[str] = set()
        self.decisions: list[Split] = []  # the splits this engine decided, oldest first

    def note(self, workflow: str, admission: Mapping[str, Any]) -> None:
        """A run of ``workflow`` was admitted under a split: look at it at the next pass."""
        if admission.get("reason") in ("canary", "stable"):
            self._noted.add(workflow)

    async def _candidates(self) -> set[str]:
        names = set(self._noted)
        for row in await self.store.list_runs(limit=self.scan):
            name = row.state.get("workflow")
            if isinstance(name, str) and not name.startswith("@"):
                names.add(name)
        return names

    async def run_once(self) -> list[Split]:
        """One pass: the splits decided in it (by this engine or, finished here, another)."""
        decided: list[Split] = []
        for name in sorted(await self._candidates()):
            split = await current(self.store, name)
            if split is None or split.state != "running":
                self._noted.discard(name)
                continue
            now = self.clock.now_ms()
            done, found = await settle(self.store, name, by=self.owner, now_ms=now)
            if done.state == "running":
                continue
            self._noted.discard(name)
            decided.append(done)
            if done.decided_by == self.owner and done.decided_at_ms == now:
                self.decisions.append(done)
                log.info("canary of %s %s by %s: %s", name, done.state, self.owner, found.why)
        return decided
