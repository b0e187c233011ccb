"""The one path spelling shared by every binding (the TypeScript twin is tested in Node)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord.contracts.paths import format_path, join, tolerance_segments


def test_members_indexes_and_quoted_names() -> None:
    assert format_path([]) == ""
    assert format_path(["views", 2, "angle"]) == "views[2].angle"
    assert format_path(["a.b", 0, "c d"]) == '["a.b"][0]["c d"]'
    assert join("", "0") == '["0"]'
    assert join("x", "naïve") == 'x["naïve"]'


def test_tolerance_paths() -> None:
    assert tolerance_segments("hint") == ["hint"]
    assert tolerance_segments("views[].angle") == ["views", "[]", "angle"]
    assert tolerance_segments("grid[][].cell") == ["grid", "[]", "[]", "cell"]
    for bad in ("", "a..b", "[]", "a[0].b", "a[]x"):
        with pytest.raises(ValueError, match="bad tolerance path"):
            tolerance_segments(bad)


_parts = st.lists(st.text(alphabet='ab.[]"0 _-é', max_size=4) | st.integers(0, 12), max_size=4)


@given(_parts, _parts)
def test_the_spelling_is_unambiguous(first: list[str | int], second: list[str | int]) -> None:
    if first != second:
        assert format_path(first) != format_path(second)
