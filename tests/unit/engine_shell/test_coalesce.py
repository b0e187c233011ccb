"""Coalescing: deliveries for one run waiting at the same time share one commit, in order, and
each gets its own answer (accord.engine.coalesce)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.adapters.clock import SystemClock
from accord.engine.coalesce import Mailboxes
from accord.engine.events import StageAccepted, StageSucceeded
from accord.engine.orchestrator import Engine
from accord.engine.replay import replay
from accord.testing.plans import model_ingest_shape


def _locks() -> Any:
    locks: dict[str, asyncio.Lock] = {}

    @contextlib.asynccontextmanager
    async def lock(key: str) -> AsyncIterator[None]:
        async with locks.setdefault(key, asyncio.Lock()):
            yield

    return lock


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=30))
def test_every_item_is_answered_once_in_submission_order_per_key(keys: list[str]) -> None:
    async def scenario() -> None:
        mail: Mailboxes[tuple[str, int], str] = Mailboxes(_locks())
        seen: dict[str, list[int]] = {}
        batches: list[list[tuple[str, int]]] = []

        async def run_batch(items: list[tuple[str, int]]) -> list[str]:
            batches.append(items)
            await asyncio.sleep(0)  # a commit: others arrive meanwhile
            for key, n in items:
                seen.setdefault(key, []).append(n)
            return [f"{key}:{n}" for key, n in items]

        answers = await asyncio.gather(
            *(mail.submit(k, (k, n), run_batch) for n, k in enumerate(keys))
        )
        assert answers == [f"{k}:{n}" for n, k in enumerate(keys)]
        for key, order in seen.items():
            assert order == sorted(order) == [n for n, k in enumerate(keys) if k == key]
        assert all(len({k for k, _ in batch}) == 1 for batch in batches)  # one run per commit
        assert sum(len(b) for b in batches) == len(keys)
        assert mail.coalesced == len(keys) - len(batches)

    asyncio.run(scenario())


async def test_waiting_deliveries_share_the_leaders_commit_and_its_failure() -> None:
    mail: Mailboxes[int, int] = Mailboxes(_locks())
    batches: list[list[int]] = []

    async def run_batch(items: list[int]) -> list[int]:
        batches.append(items)
        if 13 in items:
            raise RuntimeError("commit failed")
        return [n * 10 for n in items]

    assert await asyncio.gather(*(mail.submit("r", n, run_batch) for n in (1, 2, 3))) == [
        10,
        20,
        30,
    ]
    assert batches == [[1, 2, 3]]
    failed = await asyncio.gather(
        *(mail.submit("r", n, run_batch) for n in (12, 13)), return_exceptions=True
    )
    assert [str(e) for e in failed] == ["commit failed", "commit failed"]
    alone = await asyncio.gather(
        mail.submit("r", 7, run_batch, alone=True), mail.submit("r", 8, run_batch, alone=True)
    )
    assert alone == [70, 80] and batches[-2:] == [[7], [8]]  # never shared


async def test_an_engine_commits_an_accepted_and_succeeded_arriving_together_once() -> None:
    plan = model_ingest_shape(name="coalesce")
    engine = Engine.from_urls("memory://", "memory://", SystemClock(), dispatch=False)
    await engine.register_plan(plan)
    try:
        rid = await engine.start_run(plan.name, {"modelId": "m1"})
        cached = engine.runs.get(rid)
        assert cached is not None
        current = cached[1].stages["render"].current
        assert current is not None
        ident = {"run_id": rid, "stage": "render", "attempt": current.attempt}
        commits, transitions = engine.commits, engine.transitions
        accepted, succeeded = await asyncio.gather(
            engine.deliver(StageAccepted(**ident, fence=current.fence)),
            engine.deliver(StageSucceeded(**ident, fence=current.fence)),
        )
        assert engine.commits == commits + 1 and engine.transitions == transitions + 2
        assert accepted.version == succeeded.version  # one commit
        assert [h.event["kind"] for h in accepted.history] == ["stage-accepted"]
        assert [h.event["kind"] for h in succeeded.history] == ["stage-succeeded"]
        assert all(h.accepted for h in (*accepted.history, *succeeded.history))
        stored = await engine.load(rid)
        assert stored is not None and stored.stages["render"].status == "completed"
        history = await engine.history(rid)
        kinds = [h.event["kind"] for h in history]
        assert kinds.index("stage-accepted") < kinds.index("stage-succeeded")
        assert replay(plan, history) == stored  # I12: the history explains the record
    finally:
        await engine.stop()


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
