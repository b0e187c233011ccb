"""Message validation cost per message, for valid and invalid input.

For each measured contract (a small one with defaults, a nested one), median µs per message
over several repeats of a tight loop:

- ``engine_floor``: ``jsonschema_rs`` ``is_valid`` alone on the exported schema (the limit);
- ``accord.valid`` / ``accord.invalid``: :meth:`Validator.validate` on a decoded message
  (defaults applied, every violation collected for invalid input);
- ``accord.valid_bytes``: the same from JSON bytes (size check + strict parse included);
- ``python_jsonschema.valid`` / ``.invalid``: the pure-Python ``jsonschema`` 2020-12 validator
  (``is_valid`` / all errors), for reference;
- ``redact``: :func:`redact` on the valid message.

Run: ``python -m bench.bench_validation [--smoke]``; ``python -m bench`` runs it with the rest.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import jsonschema_rs

from accord.contracts.dsl import load_directory
from accord.contracts.fixtures import derive_fixtures
from accord.contracts.jsonschema import export
from accord.contracts.model import MessageContract
from accord.contracts.redact import redact
from accord.contracts.validate import Validator

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = ("thumbnail-generation-request@2", "technical-metadata@1")


def _per_message_us(fn: Callable[[], Any], loops: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(loops):
            fn()
        samples.append((time.perf_counter_ns() - start) / loops / 1000)
    return round(statistics.median(samples), 3)


def _measure(contract: MessageContract, loops: int, repeats: int) -> dict[str, Any]:
    fixtures = derive_fixtures(contract)
    valid = fixtures["valid/full.json"]["message"]
    invalid = fixtures["invalid/many-errors.json"]["message"]
    raw = json.dumps(valid).encode()
    validator = Validator.for_contract(contract)
    assert validator.validate(valid).ok and not validator.validate(invalid).ok
    floor = jsonschema_rs.validator_for(export(contract))
    reference = jsonschema.Draft202012Validator(export(contract))
    slow_loops = max(loops // 20, 10)
    return {
        "engine_floor_us": _per_message_us(lambda: floor.is_valid(valid), loops, repeats),
        "accord": {
            "valid_us": _per_message_us(lambda: validator.validate(valid), loops, repeats),
            "invalid_us": _per_message_us(lambda: validator.validate(invalid), loops, repeats),
            "valid_bytes_us": _per_message_us(lambda: validator.validate(raw), loops, repeats),
            "violations_per_invalid": len(validator.validate(invalid).violations),
        },
        "python_jsonschema": {
            "valid_us": _per_message_us(lambda: reference.is_valid(valid), slow_loops, repeats),
            "invalid_us": _per_message_us(
                lambda: list(reference.iter_errors(invalid)), slow_loops, repeats
            ),
        },
        "redact_us": _per_message_us(lambda: redact(contract, valid), loops, repeats),
    }


def run(smoke: bool) -> dict[str, Any]:
    """Figures per contract (µs per message); ``smoke`` runs a few hundred loops only."""
    loops, repeats = (300, 1) if smoke else (20_000, 5)
    contracts = {
        str(c.ref): c
        for c in load_directory(ROOT / "schemas" / "contracts")
        if isinstance(c, MessageContract)
    }
    out: dict[str, Any] = {"loops": loops, "repeats": repeats}
    for ref in CONTRACTS:
        out[ref] = _measure(contracts[ref], loops, repeats)
    return out


if __name__ == "__main__":
    print(json.dumps(run(smoke="--smoke" in sys.argv[1:]), indent=2))
