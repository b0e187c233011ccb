"""`accord demo`: the main job on the embedded default."""

from __future__ import annotations


def demo() -> None:
    """Run the demo."""
