"""The event loop Accord's processes run on: uvloop where it is installed, else asyncio's own.

An engine or a worker spends much of its CPU in the event loop itself: every delivery, confirm,
store reply and timer is a callback scheduled and run by it, about ninety per run of the
model-ingest workflow in the engine alone. uvloop runs the same asyncio API on libuv, with the
loop, its handles and its socket transports in C; measured on the fleet benchmark it takes 8% off
the engine's CPU per run (see ``docs/distributed.md``). Nothing in Accord depends on which loop
runs it: the choice is ``--loop`` on ``accord engine run``, ``accord worker run`` and ``accord
demo``, or ``ACCORD_LOOP`` (``auto``, the default: uvloop when importable; ``uvloop``; or
``asyncio``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["LOOPS", "LoopUnavailable", "chosen", "loop_factory", "run"]

LOOPS = ("auto", "uvloop", "asyncio")
T = TypeVar("T")


class LoopUnavailable(ValueError):
    """The loop asked for cannot be had here."""


def chosen(choice: str | None = None) -> str:
    """The loop ``choice`` (else ``ACCORD_LOOP``, else ``auto``) comes to: ``uvloop`` or
    ``asyncio``; :class:`LoopUnavailable` for an unknown name or a uvloop not installed."""
    name = (choice or os.environ.get("ACCORD_LOOP") or "auto").strip().lower()
    if name not in LOOPS:
        raise LoopUnavailable(f"unknown event loop {name!r}: one of {', '.join(LOOPS)}")
    have_uvloop = importlib.util.find_spec("uvloop") is not None
    if name == "uvloop" and not have_uvloop:
        raise LoopUnavailable("event loop 'uvloop' asked for, but uvloop is not installed")
    if name == "auto":
        return "uvloop" if have_uvloop else "asyncio"
    return name


def loop_factory(choice: str | None = None) -> Callable[[], asyncio.AbstractEventLoop]:
    """A factory of new event loops of the chosen kind (see :func:`chosen`)."""
    if chosen(choice) == "uvloop":
        import uvloop  # noqa: PLC0415 - only when chosen

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def run(main: Coroutine[Any, Any, T], choice: str | None = None) -> T:
    """``asyncio.run(main)`` on the chosen loop."""
    try:
        factory = loop_factory(choice)
    except LoopUnavailable:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
