"""The platform's own wire changes go through ``accord contracts diff`` like any other: the
outcome format that predates ``outcome@1`` is kept as a contract source, and the diff from it
names exactly the fields the contract added, each needing a new wire version, which is why the
engine reads the old format for a window (docs/compatibility.md); a cancellation request in the
old spelling is still read by the worker runtime."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from accord.worker.wire import Poison, read_control

ROOT = Path(__file__).resolve().parents[2]
ACCORD = str(Path(sys.executable).parent / "accord")
ADDED = ["causationId", "contractVersion", "correlationId", "occurredAt", "producer"]


def _diff(*args: str) -> tuple[int, dict[str, object]]:
    done = subprocess.run(
        [ACCORD, "contracts", "diff", "schemas/legacy/outcome.unversioned.yaml", "outcome@1",
         "--json", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return done.returncode, json.loads(done.stdout)


@pytest.mark.parametrize("mode", ["backward", "forward"])
def test_the_outcome_contract_is_a_new_wire_version_from_the_old_format(mode: str) -> None:
    code, doc = _diff("--mode", mode)
    assert code == 1 and doc["ok"] is False
    [report] = doc["reports"]  # type: ignore[misc]
    changes = report["changes"]
    assert sorted(c["path"] for c in changes) == [f"payload.{name}" for name in ADDED]
    assert {c["code"] for c in changes} == {"field-added-required"}
    assert report["required_actions"] == ["new-wire-version"]
    assert report["backward_compatible"] is False and report["forward_compatible"] is False


def test_a_cancellation_request_of_either_spelling_is_read() -> None:
    new = {
        "kind": "request-cancellation", "jobId": "job_1", "queue": "metadata", "stage": "s",
        "attempt": 1, "fence": "0123456789abcdef", "reason": "deadline",
    }  # fmt: skip
    old = {("job_id" if k == "jobId" else k): v for k, v in new.items()}
    for doc in (new, old):
        assert read_control(json.dumps(doc).encode()) == ("0123456789abcdef", "s")
    with pytest.raises(Poison, match="cancellation-requested@1 message: attempt"):
        read_control(json.dumps(new | {"attempt": "one"}).encode())
    with pytest.raises(Poison, match="jobId: Field required"):
        read_control(json.dumps({k: v for k, v in new.items() if k != "jobId"}).encode())
