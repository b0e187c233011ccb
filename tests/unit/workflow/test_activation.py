"""Activation and rollback over the plan store: immutable versions keyed by digest."""

from __future__ import annotations

from typing import Any

import pytest

from accord.adapters import open_store
from accord.contracts.catalog import Catalog
from accord.errors import ImmutableArtefactError
from accord.workflow.activation import (
    ActivationError,
    activate,
    load_plan,
    rollback,
    stored_document,
    versions,
)
from accord.workflow.compiler import compile_workflow
from accord.workflow.plan import Plan


class DictStore:
    """The four plan methods of the store port and nothing else (no activation history)."""

    def __init__(self) -> None:
        self.plans: dict[str, dict[str, Any]] = {}
        self.active: dict[str, str] = {}

    async def put_plan(self, digest: str, document: dict[str, Any]) -> None:
        if self.plans.setdefault(digest, document) != document:
            raise ImmutableArtefactError(digest)

    async def get_plan(self, digest: str) -> dict[str, Any] | None:
        return self.plans.get(digest)

    async def set_active(self, workflow: str, digest: str) -> None:
        self.active[workflow] = digest

    async def get_active(self, workflow: str) -> str | None:
        return self.active.get(workflow)


def _plans(catalog: Catalog, text: str) -> tuple[Plan, Plan]:
    one = compile_workflow(text, "a.yaml", catalog).unwrap()
    two = compile_workflow(text.replace('"2.3.0"', '"2.4.0"'), "b.yaml", catalog).unwrap()
    return one, two


async def test_activate_versions_and_rollback(catalog: Catalog, example_text: str) -> None:
    one, two = _plans(catalog, example_text)
    store = open_store("memory://")
    assert await activate(store, one) is True
    assert await activate(store, one) is False  # already active: nothing changes
    assert await activate(store, two) is True
    assert [(v.version, v.active) for v in await versions(store, "model-ingest")] == [
        ("2.3.0", False),
        ("2.4.0", True),
    ]
    assert await rollback(store, "model-ingest") == one.digest
    assert await store.get_active("model-ingest") == one.digest
    assert (await load_plan(store, two.digest)).digest == two.digest  # still stored
    await store.close()


async def test_stored_document_is_the_same_wherever_the_file_was(
    catalog: Catalog, example_text: str
) -> None:
    moved = compile_workflow("# a comment\n" + example_text, "moved/x.yaml", catalog).unwrap()
    original = compile_workflow(example_text, "x.yaml", catalog).unwrap()
    assert stored_document(moved) == stored_document(original)
    store = DictStore()
    await activate(store, original)
    await activate(store, moved)  # the same digest and document: accepted, unchanged
    assert len(store.plans) == 1


async def test_an_active_version_is_never_edited_in_place(
    catalog: Catalog, example_text: str
) -> None:
    one, _ = _plans(catalog, example_text)
    store = DictStore()
    await activate(store, one)
    tampered = {**stored_document(one), "owner": "someone-else"}
    with pytest.raises(ImmutableArtefactError):
        await store.put_plan(one.digest, tampered)
    with pytest.raises(ValueError, match="digest mismatch"):
        Plan.from_json(tampered)


async def test_rollback_refusals(catalog: Catalog, example_text: str) -> None:
    one, two = _plans(catalog, example_text)
    store = DictStore()
    with pytest.raises(ActivationError) as err:
        await rollback(store, "model-ingest")
    assert err.value.code == "activation-nothing-to-roll-back"
    await activate(store, one)
    with pytest.raises(ActivationError) as err:
        await rollback(store, "model-ingest", two.digest)
    assert err.value.code == "activation-not-a-version"
    with pytest.raises(ActivationError) as err:
        await load_plan(store, "sha256:" + "0" * 64)
    assert err.value.code == "activation-unknown-plan"
    assert await rollback(store, "model-ingest", one.digest) == one.digest
