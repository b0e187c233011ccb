"""Where the engine seals and opens: a result arriving in clear has the fields its stage's result
contract marks sensitive sealed before the machine sees it (finalisers too), and an action's
sealed inputs are opened just before its handler runs, or fail the attempt when they cannot be."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from accord.contracts.model import FieldSpec, MessageContract
from accord.contracts.sealing import Keyring, is_sealed
from accord.engine.machine.events import Event, StageFailed, StageSucceeded
from accord.engine.runtime.actions import ActionContext, ActionExecutor, ActionRegistry
from accord.engine.runtime.sealed import seal_context, seal_result
from accord.testing.plans import model_ingest_shape

KEYS = Keyring(("k1", bytes(range(32))))
SECRET = FieldSpec("string", sensitive=True)


class Catalog:
    def __init__(self, contracts: Mapping[str, MessageContract]) -> None:
        self._contracts = dict(contracts)

    def message(self, ref: str) -> MessageContract | None:
        return self._contracts.get(ref)

    def messages(self) -> list[MessageContract]:
        return list(self._contracts.values())


def contract(ref: str, fields: Mapping[str, FieldSpec]) -> MessageContract:
    name, _, version = ref.rpartition("@")
    return MessageContract(name=name, wire_version=int(version), owner="t", payload=fields)


PLAN = model_ingest_shape(finaliser=True)
RENDER = PLAN.stage("render").capability.result  # type: ignore[union-attr]
AUDIT = PLAN.finalisers[0].result
CATALOG = Catalog({
    RENDER: contract(RENDER, {"ref": SECRET, "faces": FieldSpec("integer")}),
    AUDIT: contract(AUDIT, {"ref": SECRET}),
})  # fmt: skip


def succeeded(stage: str, result: dict[str, Any]) -> StageSucceeded:
    return StageSucceeded(run_id="r1", stage=stage, attempt=1, fence="f", result=result)


def test_a_clear_result_is_sealed_by_its_stages_result_contract() -> None:
    event = seal_result(CATALOG, PLAN, succeeded("render", {"ref": "clear", "faces": 3}), KEYS)
    assert is_sealed(event.result["ref"]) and KEYS.open(event.result["ref"]) == "clear"
    assert event.result["faces"] == 3
    again = seal_result(CATALOG, PLAN, event, KEYS)
    assert again is event  # a sealed result is left as it is
    final = seal_result(CATALOG, PLAN, succeeded("@finaliser/0", {"ref": "x"}), KEYS)
    assert is_sealed(final.result["ref"])


def test_nothing_is_sealed_without_a_key_a_catalog_or_a_known_stage() -> None:
    clear = succeeded("render", {"ref": "clear"})
    assert seal_result(CATALOG, PLAN, clear, None) is clear
    assert seal_result(None, PLAN, clear, KEYS) is clear
    assert seal_result(CATALOG, PLAN, succeeded("@finaliser/9", {"ref": "x"}), KEYS).result == {
        "ref": "x"
    }
    assert seal_context(CATALOG, PLAN, {"ref": "x"}, KEYS) == {"ref": "x"}  # no context contract


def run_action(payload: dict[str, Any], keyring: Keyring | None) -> tuple[list[Any], Event]:
    got: list[Any] = []
    events: list[Event] = []

    async def handler(inputs: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
        got.append(inputs)
        return {}

    async def deliver(event: Event) -> None:
        events.append(event)

    async def scenario() -> None:
        executor = ActionExecutor(ActionRegistry({"test.a@1": handler}), deliver, lambda _: None)
        executor.keyring = keyring
        envelope = {"runId": "r1", "stage": "a", "attempt": 1, "fence": "f", "payload": payload}
        executor.submit("e1", "r1", {"capability": "test.a@1", "envelope": envelope})
        await executor.wait_idle()

    asyncio.run(scenario())
    return got, events[0]


def test_an_action_gets_its_sealed_inputs_opened() -> None:
    got, event = run_action({"ref": KEYS.seal("clear"), "n": 1}, KEYS)
    assert got == [{"ref": "clear", "n": 1}] and isinstance(event, StageSucceeded)


def test_an_action_whose_inputs_cannot_be_opened_fails_without_retry() -> None:
    got, event = run_action({"ref": KEYS.seal("clear")}, None)
    assert got == [] and isinstance(event, StageFailed)
    assert event.code == "unsealable-input" and not event.retryable
    assert "no sealing key" in event.message
