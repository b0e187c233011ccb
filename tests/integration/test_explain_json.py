"""A run's migrations as data: ``accord runs explain RUN --json`` and ``GET
/v1/runs/{id}/explanation`` carry a ``migrations`` array beside the told lines — each move from
which digest to which, the new version, when, by whom and why, the stage map, and for a refused
one the refusal and what the proof found. The run waits at its approval gate under a real
uvicorn; ``accord runs migrate`` (its own process, on the same SQLite store) first tries a
version without the gate (refused), then moves it to one with a longer deadline."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.integration.test_api_support import Api, serving
from tests.integration.test_approvals_api import _start, gated_plan
from tests.integration.test_migration_api import _later, _store

from accord.workflow.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
ACCORD = str(Path(sys.executable).with_name("accord"))


async def _cli(*args: str) -> tuple[int, Any]:
    """Exit code and the one JSON document ``--json`` printed (the whole of stdout)."""
    proc = await asyncio.create_subprocess_exec(
        ACCORD, *args, "--json", cwd=ROOT, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "USER": "ann"},
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode is not None
    try:
        return proc.returncode, json.loads(out)
    except ValueError:
        raise AssertionError(f"not one JSON document: {out!r} (stderr {err!r})") from None


async def _versions(api: Api, old: Plan) -> tuple[Plan, Plan]:
    longer = _later(old, "1.1.0", deadline_ms=86_400_000)
    without_gate = Plan.create(
        name=old.name,
        version="2.0.0",
        entry="work",
        stages=(dataclasses.replace(old.stages[0], on_success="completed"),),
    )
    await _store(api, longer)
    await _store(api, without_gate)
    return longer, without_gate


async def test_explain_json_carries_each_migration_on_the_cli_and_over_http(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as api:
        url = f"sqlite:///{tmp_path / 'accord.db'}"
        old = gated_plan(name="explained")
        await _start(api, old, "run-explained")
        longer, without_gate = await _versions(api, old)

        code, doc = await _cli("runs", "migrate", "run-explained", "--to", without_gate.digest,
                               "--reason", "drop review", "--store", url)  # fmt: skip
        assert code == 1 and doc["ok"] is False, doc
        code, doc = await _cli("runs", "migrate", "run-explained", "--to", longer.digest,
                               "--reason", "longer deadline", "--store", url)  # fmt: skip
        assert code == 0 and doc["ok"] is True, doc

        async with api.as_("viewer") as client:
            got = await client.get("/v1/runs/run-explained/explanation")
        assert got.status_code == 200, got.text
        told = got.json()
        assert told["status"] == "running"
        refused, moved = told["migrations"]
        assert refused["accepted"] is False and refused["refused"] == "invalid"
        assert (refused["from"], refused["to"]) == (old.digest, without_gate.digest)
        assert refused["version"] == "2.0.0" and refused["reason"] == "drop review"
        assert [p.split(":")[0] for p in refused["problems"]] == ["migration-strands-attempt"]
        assert "kept" not in refused and refused["by"] == "cli:ann"
        assert moved["accepted"] is True and "refused" not in moved
        assert (moved["from"], moved["to"], moved["version"]) == (old.digest, longer.digest,
                                                                  "1.1.0")  # fmt: skip
        assert (moved["by"], moved["reason"]) == ("cli:ann", "longer deadline")
        assert moved["kept"] == ["review", "work"]
        assert (moved["renamed"], moved["added"], moved["removed"]) == ({}, {}, [])
        assert moved["seq"] > refused["seq"] and moved["at"].endswith("Z")
        assert isinstance(moved["at_ms"], int) and moved["at_ms"] >= refused["at_ms"]
        heads = [line for line in told["explanation"] if " migration from " in line]
        assert [h.split()[0] for h in heads] == [f"#{refused['seq']}", f"#{moved['seq']}"]

        code, doc = await _cli("runs", "explain", "run-explained", "--store", url)
        assert code == 0
        assert doc == told  # the same document the API answers (nothing in it is sensitive)

        code, doc = await _cli("runs", "explain", "no-such-run", "--store", url)
        assert code != 0 and "no-such-run" in json.dumps(doc)  # one document when refused too
