"""Coalescing: deliveries for one run waiting at the same time share one commit, in order, and
each gets its own answer (accord.engine.runtime.coalesce)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.adapters import open_engine
from accord.adapters.clock import SystemClock
from accord.engine.machine.events import StageAccepted, StageSucceeded
from accord.engine.machine.replay import replay
from accord.engine.runtime.coalesce import Mailboxes
from accord.engine.runtime.orchestrator import EngineOptions
from accord.testing.plans import model_ingest_shape


def _locks() -> Any:
    locks: dict[str, asyncio.Lock] = {}

    @contextlib.asynccontextmanager
    async def lock(key: str) -> AsyncIterator[None]:
        async with locks.setdefault(key, asyncio.Lock()):
            yield

    return lock


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=30),
    st.sampled_from([0.0, 0.002]),
)
def test_every_item_is_answered_once_in_submission_order_per_key(
    keys: list[str], linger_s: float
) -> None:
    async def scenario() -> None:
        # with a linger, even-numbered items may wait for an odd one to share their commit
        mail: Mailboxes[tuple[str, int], str] = Mailboxes(
            _locks(), may_wait=lambda item: item[1] % 2 == 0, linger_s=linger_s
        )
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


def _news(item: str) -> bool:
    return item.startswith("news")


async def test_news_waits_for_the_next_decisive_delivery_and_commits_with_it() -> None:
    mail: Mailboxes[str, str] = Mailboxes(_locks(), may_wait=_news, linger_s=5.0)
    batches: list[list[str]] = []

    async def run_batch(items: list[str]) -> list[str]:
        batches.append(items)
        return [i.upper() for i in items]

    async def later(item: str) -> str:
        await asyncio.sleep(0.01)  # well after the leader's own yield: only lingering catches it
        return await mail.submit("r", item, run_batch)

    answers = await asyncio.gather(
        mail.submit("r", "news-accepted", run_batch),
        mail.submit("r", "news-heartbeat", run_batch),
        later("succeeded"),
    )
    assert answers == ["NEWS-ACCEPTED", "NEWS-HEARTBEAT", "SUCCEEDED"]
    assert batches == [["news-accepted", "news-heartbeat", "succeeded"]]
    assert mail.lingered == 1 and mail.coalesced == 2


async def test_lingering_ends_at_its_limit_and_never_when_idle_or_decisive() -> None:
    busy = [True]
    mail: Mailboxes[str, str] = Mailboxes(
        _locks(), may_wait=_news, linger_s=0.02, busy=lambda: busy[0]
    )
    batches: list[list[str]] = []

    async def run_batch(items: list[str]) -> list[str]:
        batches.append(items)
        return items

    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await mail.submit("r", "news-alone", run_batch) == "news-alone"
    assert loop.time() - began >= 0.015 and batches == [["news-alone"]]  # waited, then alone
    assert mail.lingered == 1

    async def later(item: str) -> str:
        await asyncio.sleep(0.01)
        return await mail.submit("r", item, run_batch)

    busy[0] = False  # one delivery at a time: nothing to wait for
    await asyncio.gather(mail.submit("r", "news-idle", run_batch), later("decisive-1"))
    busy[0] = True  # a decisive leader commits at once, news behind it or not
    await asyncio.gather(mail.submit("r", "decisive-2", run_batch), later("news-after"))
    assert batches[1:] == [["news-idle"], ["decisive-1"], ["decisive-2"], ["news-after"]]
    assert mail.lingered == 2  # "news-after" came after that commit: it waited, then went alone


async def test_a_lingering_leader_cancelled_cancels_its_riders() -> None:
    mail: Mailboxes[str, str] = Mailboxes(_locks(), may_wait=_news, linger_s=5.0)

    async def run_batch(items: list[str]) -> list[str]:
        return items

    leader = asyncio.ensure_future(mail.submit("r", "news-1", run_batch))
    await asyncio.sleep(0.01)
    rider = asyncio.ensure_future(mail.submit("r", "news-2", run_batch))
    await asyncio.sleep(0.01)
    leader.cancel()
    results = await asyncio.gather(leader, rider, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    assert await mail.submit("r", "decisive", run_batch) == "decisive"  # the box is gone


async def test_a_busy_engine_lets_accepted_wait_for_succeeded() -> None:
    plan = model_ingest_shape(name="linger")
    engine = open_engine(
        "memory://",
        "memory://",
        SystemClock(),
        options=EngineOptions(dispatch=False, accept_linger_ms=2_000),
    )
    await engine.register_plan(plan)
    try:
        rids = [await engine.start_run(plan.name, {"modelId": f"m{n}"}) for n in range(2)]
        idents = []
        for rid in rids:
            cached = engine.runs.get(rid)
            assert cached is not None
            current = cached[1].stages["render"].current
            assert current is not None
            idents.append({"run_id": rid, "stage": "render", "attempt": current.attempt,
                           "fence": current.fence})  # fmt: skip
        commits = engine.commits

        async def succeed_later(ident: dict[str, Any]) -> Any:
            await asyncio.sleep(0.05)
            return await engine.deliver(StageSucceeded(**ident))

        # two runs in flight: the engine is busy, so each accepted waits for its succeeded
        results = await asyncio.gather(
            *(engine.deliver(StageAccepted(**ident)) for ident in idents),
            *(succeed_later(ident) for ident in idents),
        )
        assert engine.commits == commits + 2  # one per run, not two
        assert results[0].version == results[2].version and results[1].version == results[3].version
        for rid in rids:
            stored = await engine.load(rid)
            assert stored is not None and stored.stages["render"].status == "completed"
            assert replay(plan, await engine.history(rid)) == stored  # I12
        # one delivery at a time: nothing waits, each commits on its own
        rid = await engine.start_run(plan.name, {"modelId": "alone"})
        cached = engine.runs.get(rid)
        assert cached is not None
        current = cached[1].stages["render"].current
        assert current is not None
        ident = {"run_id": rid, "stage": "render", "attempt": current.attempt,
                 "fence": current.fence}  # fmt: skip
        commits = engine.commits
        loop = asyncio.get_running_loop()
        began = loop.time()
        await engine.deliver(StageAccepted(**ident))
        assert loop.time() - began < 1.0 and engine.commits == commits + 1
        await engine.deliver(StageSucceeded(**ident))
        assert engine.commits == commits + 2
    finally:
        await engine.stop()


async def test_an_engine_commits_an_accepted_and_succeeded_arriving_together_once() -> None:
    plan = model_ingest_shape(name="coalesce")
    engine = open_engine(
        "memory://", "memory://", SystemClock(), options=EngineOptions(dispatch=False)
    )
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
