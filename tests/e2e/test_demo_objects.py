"""``accord demo --objects s3://…`` end to end against real SeaweedFS, twice: the first run
uploads the models and sends them through the reference workers, which read the models and write
the thumbnails through signed URLs; the cache entries land in the bucket; the second run finds
every model in that cache. Nothing of the objects is written to the state directory."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.services import ensure_seaweedfs
from typer.testing import CliRunner

from accord.adapters.objects.s3 import S3ObjectStore
from accord.cli import app

REPO = Path(__file__).resolve().parents[2]
MODELS = ("cube.3mf", "plate-with-hole.stl")


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for part in ("schemas/contracts", "workflows"):
        shutil.copytree(REPO / part, tmp_path / part)
    shutil.copytree(
        REPO / "bindings" / "typescript",
        tmp_path / "bindings" / "typescript",
        ignore=shutil.ignore_patterns("node_modules", "dist"),
    )
    modules = REPO / "bindings" / "typescript" / "node_modules"
    (tmp_path / "bindings" / "typescript" / "node_modules").symlink_to(modules)
    (tmp_path / "models").mkdir()
    for name in MODELS:
        shutil.copy(REPO / "examples" / "models" / name, tmp_path / "models" / name)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def demo(scratch: Path, objects: str, *extra: str) -> tuple[int, str]:
    access, secret = ensure_seaweedfs().credentials()
    env = {"COLUMNS": "200", "AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret}
    args = ["demo", "--models", str(scratch / "models"), "--state", str(scratch / "state"),
            "--objects", objects, "--json", *extra]  # fmt: skip
    result = CliRunner().invoke(app, args, env=env)
    return result.exit_code, result.output


def rows_of(output: str) -> list[dict[str, Any]]:
    rows = json.loads(output[output.index("[") :])
    assert isinstance(rows, list)
    return rows


@pytest.mark.node  # the contract phase generates the TypeScript bindings too
def test_demo_with_objects_in_s3_twice(scratch: Path) -> None:
    server = ensure_seaweedfs()
    bucket = f"accord-demo-{uuid.uuid4().hex[:8]}"
    url = f"s3://{bucket}/demo?endpoint={server.endpoint}"
    code, out = demo(scratch, url)
    assert code == 0, out
    first = rows_of(out)
    assert sorted(r["modelId"] for r in first) == ["cube", "plate-with-hole"]
    for row in first:
        assert row["status"] == "completed" and row["route"] == "workers", row
        assert row["thumbnails"] and all(t.startswith(f"s3://{bucket}/demo/tenants/demo/")
                                         for t in row["thumbnails"])  # fmt: skip
    access, secret = server.credentials()
    store = S3ObjectStore(bucket, endpoint=server.endpoint, prefix="demo", access_key=access,
                          secret_key=secret)  # fmt: skip
    try:
        keys = store.list()
        models = {"tenants/demo/models/cube.3mf", "tenants/demo/models/plate-with-hole.stl"}
        assert models <= set(keys)
        assert any(k.startswith("tenants/demo/thumbnails/cube/") for k in keys)
        assert len([k for k in keys if k.startswith("cache/entries/")]) == 6  # 3 per model
        assert not (scratch / "state" / "objects").exists()
        assert not (scratch / "state" / "cache").exists()
        code, out = demo(scratch, url)
        assert code == 0, out
        second = rows_of(out)
        for row in second:
            assert row["status"] == "completed" and row["route"] == "cache hit", row
            assert row["cacheOutcome"] == "hit" and row["faces"] is not None
    finally:
        store.close()


def test_demo_refuses_a_bad_objects_url(scratch: Path) -> None:
    code, out = demo(scratch, "gs://bucket")
    assert code == 2 and "--objects" in out
    code, out = demo(scratch, "s3://accord-demo-x?endpoint=http://127.0.0.1:9")
    assert code == 1 and "cannot be reached" in out and "Traceback" not in out
