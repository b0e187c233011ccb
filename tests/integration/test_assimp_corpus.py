"""The metadata and thumbnail workers over Debian's assimp-testmodels corpus.

Every STL, OBJ, PLY, OFF, GLB/glTF and 3MF file in the corpus (some deliberately broken) must end
as a result that satisfies the worker's result contract, or as a classified terminal failure —
never an unclassified exception, a hang or a crashed worker. ``make test-deps`` installs the
package; in CI (``CI=true``) a missing corpus fails instead of skipping.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from accord_worker_metadata_extract import handle as extract
from accord_worker_thumbnail_render import handle as render

from accord.contracts.dsl import load_file
from accord.contracts.validate import validate
from accord.errors import StageFailed
from accord.worker.sandbox import Limits
from accord.worker.sdk import Context
from accord.worker.storage import StorageMap

CORPUS = Path("/usr/share/assimp/models")
SUFFIXES = {".stl", ".obj", ".ply", ".off", ".glb", ".gltf", ".3mf"}
CONTRACTS = Path(__file__).resolve().parents[2] / "schemas" / "contracts"
CLASSIFIED = {
    "input-too-large",
    "parse-timeout",
    "memory-limit",
    "unsupported-format",
    "malformed-model",
}
LIMITS = Limits(cpu_seconds=20, wall_seconds=40, memory_bytes=2 << 30, input_bytes=8 << 20)


def _corpus() -> list[Path]:
    if not CORPUS.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail("assimp-testmodels is not installed: run `make test-deps`")
        pytest.skip("assimp-testmodels is not installed (make test-deps installs it)")
    return sorted(p for p in CORPUS.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)


def _run(job: tuple[str, str, Context]) -> tuple[str, str, Any, float]:
    kind, key, ctx = job
    started = time.monotonic()
    payload: dict[str, Any] = {"modelId": "corpus", "objectKey": key}
    try:
        if kind == "metadata":
            outcome: Any = extract(payload, ctx)
        else:
            payload |= {"generate360Views": False, "maxEdge": 96, "modelId": f"m{abs(hash(key))}"}
            outcome = render(payload, ctx)
    except StageFailed as exc:
        outcome = exc
    return kind, key, outcome, time.monotonic() - started


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_every_corpus_model_ends_valid_or_classified(tmp_path: Path) -> None:
    files = _corpus()
    assert len(files) >= 50, "the corpus should hold dozens of models"
    shutil.copytree(CORPUS, tmp_path / "corpus", symlinks=False)
    services = {"storage": StorageMap.local(tmp_path), "limits": LIMITS}
    ctx = Context("run", "stage", 1, "f", "corpus", "cap", "k", {}, services)
    keys = [str(p.relative_to(CORPUS)) for p in files]
    jobs = [(kind, key, ctx) for key in keys for kind in ("metadata", "thumbnail")]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        outcomes = list(pool.map(_run, jobs))
    total = time.monotonic() - started

    metadata = load_file(CONTRACTS / "technical-metadata.v1.yaml")
    thumbnail = load_file(CONTRACTS / "thumbnail-generated.v1.yaml")
    tally: Counter[str] = Counter()
    for kind, key, outcome, took in outcomes:
        assert took < LIMITS.wall_seconds + 10, f"{kind} {key} took {took:.1f}s"
        if isinstance(outcome, StageFailed):
            assert outcome.failure_code in CLASSIFIED, f"{kind} {key}: {outcome}"
            assert outcome.retryable is False
            tally[f"{kind}:{outcome.failure_code}"] += 1
            continue
        checked = validate(metadata if kind == "metadata" else thumbnail, outcome)
        assert checked.ok, f"{kind} {key}: {checked.violations}"
        tally[f"{kind}:ok"] += 1
    print(
        f"\ncorpus: {len(files)} files, {len(jobs)} jobs in {total:.1f}s:",
        dict(sorted(tally.items())),
    )
    # most of the corpus is well-formed: a parser that refuses everything would fail here
    assert tally["metadata:ok"] >= len(files) // 2
    assert tally["thumbnail:ok"] >= len(files) // 2
