"""The handler-facing surface: capability refs, bindings, the context and the error classes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord.errors import StageFailed
from accord.worker import Cancelled, Context, RetryableError, TerminalError, Worker
from accord.worker.sdk import split_ref


@given(
    st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z][a-z0-9-]{0,10}){0,2}", fullmatch=True),
    st.integers(1, 10_000),
)
def test_capability_refs_split_into_name_and_version(name: str, version: int) -> None:
    assert split_ref(f"{name}@{version}") == (name, version)


@pytest.mark.parametrize("bad", ["thumbnail.render", "thumbnail.render@", "@3", "x@0", "x@v3"])
def test_malformed_capability_refs_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="name@version"):
        split_ref(bad)


def test_handlers_bind_once_per_capability_and_know_if_they_are_async() -> None:
    w = Worker("w")

    @w.handler("a.b@1")
    def sync(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        return {}

    @w.handler("a.c@2", queue="special")
    async def coro(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        return {}

    assert w.capabilities == ["a.b@1", "a.c@2"]
    assert not w.bindings["a.b@1"].is_async and w.bindings["a.c@2"].is_async
    assert w.bindings["a.c@2"].queue == "special"
    with pytest.raises(ValueError, match="already has a handler"):
        w.bind("a.b@1", sync)


def test_error_classes_say_whether_a_retry_can_help() -> None:
    retry, terminal = RetryableError("busy", "storage-unavailable"), TerminalError("bad", "corrupt")
    assert isinstance(retry, StageFailed) and retry.retryable
    assert retry.failure_code == "storage-unavailable"
    assert isinstance(terminal, StageFailed) and not terminal.retryable
    assert RetryableError("x").failure_code == "retryable"
    assert Cancelled("stop").failure_code == "cancelled" and not Cancelled("stop").retryable


def test_context_progress_is_clamped_and_cancellation_is_sticky() -> None:
    seen: list[tuple[float, str]] = []
    ctx = Context(
        "r", "s", 1, "f", "acme", "a.b@1", "k", {}, _emit=lambda p, m: seen.append((p, m))
    )
    ctx.progress(-5, "x" * 600)
    ctx.progress(42.5)
    assert seen == [(0.0, "x" * 500), (42.5, "")]
    ctx.raise_if_cancelled()
    assert not ctx.cancelled
    ctx.cancel()
    assert ctx.cancelled
    with pytest.raises(Cancelled):
        ctx.raise_if_cancelled()
