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
"""

from __future__ import annotations

from typing import Any

from accord.canonical import digest_of
from accord.engine.ports import Store
from accord.workflow.activation import load_plan, stored_document
from accord.workflow.canary import (
    CanaryError,
    Criteria,
    Outcomes,
    Split,
    Verdict,
    choose,
    parse_criteria,
    verdict,
)
from accord.workflow.plan import Plan

__all__ = [
    "PREFIX",
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
_ENDED = {"completed": False, "failed": True, "cancelled": True}


async def _save(store: Store, split: Split) -> None:
    doc = split.to_json()
    key = "canary:" + digest_of(doc).removeprefix("sha256:")
    await store.put_plan(key, doc)
    await store.set_active(PREFIX + split.workflow, key)


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


async def outcomes(store: Store, workflow: str, digest: str, limit: int = 10_000) -> Outcomes:
    ended = failed = running = 0
    for row in await store.list_runs(limit=limit, workflow=workflow):
        if row.state.get("plan_digest") != digest:
            continue
        status = row.state.get("status", "")
        if status in _ENDED:
            ended += 1
            failed += _ENDED[status]
        else:
            running += 1
    return Outcomes(ended, failed, running)


async def status(store: Store, workflow: str) -> tuple[Split, Outcomes, Outcomes, Verdict]:
    split = await current(store, workflow)
    if split is None:
        raise CanaryError("canary-none", f"{workflow} has no canary")
    stable = await outcomes(store, workflow, split.stable)
    canary = await outcomes(store, workflow, split.canary)
    return split, stable, canary, verdict(split.criteria, stable, canary)


async def _running(store: Store, workflow: str) -> Split:
    split = await current(store, workflow)
    if split is None or split.state != "running":
        raise CanaryError("canary-none", f"{workflow} has no running canary")
    return split


async def promote(store: Store, workflow: str, *, by: str, why: str, now_ms: int) -> Split:
    """Make the canary the active version for every new run."""
    split = await _running(store, workflow)
    plan = await load_plan(store, split.canary)
    await store.set_active(plan.name, plan.digest)
    decided = split.decided("promoted", by, why, now_ms)
    await _save(store, decided)
    return decided


async def abort(store: Store, workflow: str, *, by: str, why: str, now_ms: int) -> Split:
    """Stop sending new runs to the canary; the stable version stays active."""
    split = await _running(store, workflow)
    if await store.get_active(workflow) != split.stable:
        await store.set_active(workflow, split.stable)
    decided = split.decided("aborted", by, why, now_ms)
    await _save(store, decided)
    return decided


async def settle(store: Store, workflow: str, *, by: str, now_ms: int) -> tuple[Split, Verdict]:
    """Promote or abort when the criteria say so; otherwise leave the split running."""
    split, _, _, found = await status(store, workflow)
    if split.state != "running" or found.decision == "wait":
        return split, found
    act = promote if found.decision == "promote" else abort
    return await act(store, workflow, by=by, why=found.why, now_ms=now_ms), found
