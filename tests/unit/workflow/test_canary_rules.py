"""Canary splits: shares, stable buckets, criteria and verdicts."""

from __future__ import annotations

import pytest

from accord.workflow.canary import (
    CanaryError,
    Criteria,
    Outcomes,
    Split,
    bucket,
    choose,
    parse_criteria,
    parse_share,
    verdict,
)


@pytest.mark.parametrize(("text", "points"), [("10%", 1000), ("2.5%", 250), ("50", 5000)])
def test_shares_are_basis_points(text: str, points: int) -> None:
    assert parse_share(text) == points


@pytest.mark.parametrize("text", ["0%", "100%", "-5%", "ten", ""])
def test_a_share_must_be_above_none_and_below_all(text: str) -> None:
    with pytest.raises(CanaryError) as info:
        parse_share(text)
    assert info.value.code == "canary-bad-share"


def test_the_bucket_of_a_key_never_changes_and_spreads_evenly() -> None:
    assert bucket("run-1") == bucket("run-1")
    assert 0 <= bucket("anything") < 10_000
    below = sum(1 for i in range(20_000) if bucket(f"k{i}") < 1000)
    assert 1_800 <= below <= 2_200  # 10% of 20,000 within 1%


def test_choose_sends_low_buckets_to_the_canary_while_running() -> None:
    split = Split("w", "sha256:old", "sha256:new", 1000)
    keys = [f"k{i}" for i in range(200)]
    for key in keys:
        digest, admission = choose(split, key)
        expected = "sha256:new" if bucket(key) < 1000 else "sha256:old"
        assert digest == expected == admission["digest"]
        assert admission["reason"] == ("canary" if expected == "sha256:new" else "stable")
    aborted = split.decided("aborted", "me", "why", 1)
    assert {choose(aborted, k)[0] for k in keys} == {"sha256:old"}


def test_criteria_are_read_from_the_definition_in_their_written_form() -> None:
    text = "failure rate not above the old version's by more than 5% over at least 20 runs"
    assert parse_criteria(text) == Criteria(0.05, 20)
    assert parse_criteria("two green weeks") is None
    assert str(Criteria(0.05, 20)) == text


def test_the_verdict_waits_then_aborts_or_promotes() -> None:
    c = Criteria(max_increase=0.05, min_runs=20)
    assert verdict(c, Outcomes(100, 2), Outcomes(19, 19)).decision == "wait"
    assert verdict(c, Outcomes(100, 2), Outcomes(20, 2)).decision == "abort"  # 10% vs 2%
    assert verdict(c, Outcomes(100, 2), Outcomes(20, 1)).decision == "promote"  # 5% vs 2%
    assert verdict(c, Outcomes(100, 0), Outcomes(20, 1)).decision == "promote"  # exactly +5%
    assert verdict(c, Outcomes(0, 0), Outcomes(40, 0)).decision == "promote"


def test_a_split_round_trips_as_json() -> None:
    split = Split("w", "a", "b", 1000, Criteria(0.1, 5), "running", "me", "why", 7)
    assert Split.from_json(split.to_json()) == split
