"""Catalog lookups and the pure publication and retention decisions."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

import pytest

from accord.contracts.catalog import Catalog
from accord.contracts.compat import check_publish
from accord.contracts.dsl import parse_text
from accord.contracts.model import Contract, MessageContract
from accord.contracts.registry import (
    RetentionPolicy,
    artefact_document,
    contract_from_artefact,
    index_document,
    plan_publication,
    retirement_refusal,
)
from accord.contracts.sources import load_catalog
from accord.errors import ContractError

REPO = Path(__file__).resolve().parents[3]


def _message(version: int, extra: str = "", head: str = "") -> Contract:
    return parse_text(
        f"kind: message\nname: m\nwireVersion: {version}\nowner: a\n{head}payload:\n"
        f"  id: {{type: string, required: true}}\n{extra}",
        f"m{version}.yaml",
    )


@pytest.fixture(scope="module")
def bundled() -> Catalog:
    return load_catalog(REPO / "schemas" / "contracts")


def test_catalog_resolves_every_capability_of_the_example_workflow(bundled: Catalog) -> None:
    for ref in (
        "thumbnail.render@3",
        "metadata.extract@2",
        "semantic.analyse@4",
        "cache.lookup@1",
        "catalogue.publish@2",
        "audit.run-terminal@1",
    ):
        capability = bundled.capability(ref)
        assert capability is not None, ref
        request = bundled.message(capability.request)
        assert request is not None and bundled.message(capability.result) is not None
        model_id = request.payload["modelId"]
        assert model_id.type == "string" and model_id.required
        others = [f for n, f in request.payload.items() if n != "modelId"]
        assert all(not f.required or f.has_default for f in others), ref


def test_catalog_lookups_by_kind_and_version(bundled: Catalog) -> None:
    assert bundled.versions("thumbnail-generation-request") == [1, 2]
    assert bundled.capability("thumbnail.render@3") is bundled.get("worker", "thumbnail.render@3")
    assert bundled.get("action", "thumbnail.render@3") is None  # a worker, not an action
    assert bundled.message("thumbnail.render@3") is None
    assert bundled.policy("marketplace-listing-limits@1") is not None
    assert bundled.message("nope@1") is None
    latest = bundled.latest("message", "thumbnail-generation-request")
    assert latest is not None and latest.version == 2
    context = bundled.message("model-ingest-context@1")
    assert context is not None and context.payload["storageConnectionRef"].sensitive
    assert bundled.digest("thumbnail.render@3") == bundled.digest(
        bundled.get("worker", "thumbnail.render@3")  # type: ignore[arg-type]
    )
    with pytest.raises(KeyError):
        bundled.digest("nope@1")


def test_catalog_refuses_two_different_contracts_under_one_identity() -> None:
    with pytest.raises(ValueError, match="two different contracts"):
        Catalog([_message(1), _message(1, "  x: {type: string}\n")])
    assert len(Catalog([_message(1), _message(1)])) == 1


def test_new_unchanged_conflict_and_planned() -> None:
    published = [_message(1)]
    planned = _message(
        3, head="status: planned\nreviewDate: 2027-01-01\npromotionCriteria: two consumers\n"
    )
    sources = [_message(1), _message(2, "  x: {type: string, default: a}\n"), planned]
    plan = plan_publication(sources, published, check_publish)
    assert [c.version for c in plan.new] == [2]
    assert [c.version for c in plan.unchanged] == [1]
    assert [c.version for c in plan.skipped] == [3]
    assert not plan.refused

    changed = plan_publication([_message(1, "  y: {type: integer}\n")], published, check_publish)
    assert changed.refused and "m@1 is already published" in changed.conflicts[0]
    assert "as version 2" in changed.conflicts[0]


def test_publication_runs_the_compatibility_gate_against_the_previous_version() -> None:
    breaking = _message(1, "  x: {type: string, required: true}\n")
    same_version = plan_publication(
        [_message(2, "  x: {type: string, required: true}\n")], [breaking], check_publish
    )
    assert not same_version.refused  # adding a required field behind a wire-version bump is ok

    old = _message(1, "  size: {type: integer, maximum: 10}\n")
    relaxed = _message(2, "  size: {type: integer, maximum: 20}\n")
    refused = plan_publication([relaxed], [old], check_publish)
    assert refused.refused
    assert {d.code for d in refused.incompatible} == {"compat-unacknowledged-semantic-change"}
    acked = _message(
        2,
        "  size: {type: integer, maximum: 20}\nchanges:\n  - version: 2\n    summary: bigger\n"
        "    acknowledges: [limit-relaxed@payload.size]\n",
    )
    assert not plan_publication([acked], [old], check_publish).refused


def test_transitive_contracts_are_checked_against_every_earlier_version() -> None:
    seen: list[list[int]] = []

    def spy(previous: list[MessageContract], new: MessageContract) -> list:  # type: ignore[type-arg]
        seen.append([c.version for c in previous])
        return check_publish(previous, new)

    sources = [_message(1), _message(2), _message(3, head="transitive: true\n")]
    plan_publication(sources, [], spy)  # type: ignore[arg-type]
    assert seen == [[], [1], [1, 2]]


def test_artefact_document_round_trips_and_detects_tampering() -> None:
    contract = _message(1)
    document = artefact_document(contract, {"type": "object"})
    assert contract_from_artefact(document, "x.json") == contract
    document["contract"]["owner"] = "someone-else"
    with pytest.raises(ContractError, match="does not match"):
        contract_from_artefact(document, "x.json")
    index = index_document([_message(2), _message(1)])
    assert [e["version"] for e in index["contracts"]] == [1, 2]
    assert index["contracts"][0]["path"] == "m/1.json"


POLICY = RetentionPolicy(
    queue_retention=dt.timedelta(days=7), longest_run_lifetime=dt.timedelta(days=30)
)
DEPRECATED = "status: deprecated\nsupportUntil: 2027-01-01\n"


@pytest.mark.parametrize(
    ("head", "now", "allowed"),
    [
        ("", dt.datetime(2030, 1, 1, tzinfo=dt.UTC), False),  # active: never
        (DEPRECATED, dt.datetime(2027, 1, 1, tzinfo=dt.UTC), False),  # support just ended
        (DEPRECATED, dt.datetime(2027, 2, 7, 23, 59, tzinfo=dt.UTC), False),  # window: 37 days
        (DEPRECATED, dt.datetime(2027, 2, 8, tzinfo=dt.UTC), True),
    ],
)
def test_retirement_respects_the_retention_window(
    head: str, now: dt.datetime, allowed: bool
) -> None:
    refusal = retirement_refusal(_message(1, head=head), [], now, POLICY)
    assert (refusal is None) is allowed, refusal


def test_retirement_refuses_a_message_still_named_by_a_capability(bundled: Catalog) -> None:
    request = bundled.message("thumbnail-generation-request@2")
    assert request is not None
    deprecated = replace(request, status="deprecated", support_until="2020-01-01")
    refusal = retirement_refusal(
        deprecated, list(bundled), dt.datetime(2030, 1, 1, tzinfo=dt.UTC), POLICY
    )
    assert refusal is not None and "thumbnail.render@3" in refusal
