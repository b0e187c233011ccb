"""The public surface is reviewed: a change to any ``__all__`` below must change this test too."""

from __future__ import annotations

import importlib

import pytest

PUBLIC = {
    "accord": ["AccordError", "__version__"],
    "accord.testing": [
        "EngineHarness",
        "FakeClock",
        "RunAuditor",
        "assert_run_invariants",
        "outcome",
        "run_noop_worker",
    ],
    "accord.worker": [
        "AcceptanceLog",
        "Announcer",
        "Cancelled",
        "Context",
        "RetryableError",
        "Runtime",
        "TerminalError",
        "Worker",
        "store_announcer",
    ],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names_are_pinned_and_importable(module: str) -> None:
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(PUBLIC[module])
    for name in mod.__all__:
        assert getattr(mod, name) is not None, f"{module}.{name} does not resolve"
