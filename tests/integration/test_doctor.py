"""``accord doctor`` against Redis servers of the test's own: one deliberately misconfigured
(evicting, no persistence) must fail with the exact fixes named and exit 1, in text and in one
JSON document; the same server set right must pass those checks and exit 0 (so the test can
fail both ways). The store check reports the Redis store's own refusal of an evicting server as
a failed check, never a traceback."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from accord.cli import app

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests/integration is no package: reach tests.* from the root
    sys.path.insert(0, str(ROOT))
from tests.services import PrivateRedis  # noqa: E402


@pytest.fixture
def bad_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(
        tmp_path, "--maxmemory-policy", "allkeys-lru", "--appendonly", "no", "--save", ""
    ).start()
    yield server
    server.kill()


def _doctor(*args: str) -> tuple[int, str]:
    done = CliRunner().invoke(app, ["doctor", *args])
    assert done.exception is None or isinstance(done.exception, SystemExit), done.exception
    return done.exit_code, done.output


def _by_name(doc: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {c["name"].split(" ")[-1] if c["name"].startswith("redis") else c["name"]: c
            for c in doc["checks"]}  # fmt: skip


def test_doctor_reports_a_misconfigured_redis_and_what_to_fix(bad_redis: PrivateRedis) -> None:
    url = bad_redis.url("doc")
    code, out = _doctor("--store", url, "--transport", f"bullmq://127.0.0.1:{bad_redis.port}/0")
    assert code == 1, out
    assert "fail redis redis://127.0.0.1:" in out
    assert "maxmemory-policy is allkeys-lru" in out
    assert "fix: CONFIG SET maxmemory-policy noeviction" in out
    assert "no persistence (no AOF, no RDB)" in out
    assert "fix: CONFIG SET appendonly yes; CONFIG SET appendfsync always" in out
    assert "Traceback" not in out

    code, out = _doctor("--store", url, "--json")
    assert code == 1
    doc = json.loads(out)
    checks = _by_name(doc)
    assert doc["ok"] is False
    assert checks["eviction"]["status"] == "fail"
    assert checks["persistence"]["status"] == "fail"
    assert checks["store"]["status"] == "fail"  # the store itself refuses an evicting Redis
    assert "maxmemory-policy=allkeys-lru" in checks["store"]["detail"]
    clock = next(c for c in doc["checks"] if c["name"].startswith("clock"))
    assert clock["status"] == "ok", clock


def test_doctor_passes_the_same_server_once_fixed(bad_redis: PrivateRedis) -> None:
    client = bad_redis.client()
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("appendonly", "yes")
    client.config_set("appendfsync", "always")
    code, out = _doctor("--store", bad_redis.url("doc"), "--json")
    doc = json.loads(out)
    checks = _by_name(doc)
    assert checks["eviction"]["status"] == "ok", doc
    assert checks["persistence"]["status"] == "ok", doc
    assert checks["store"]["status"] == "ok", doc
    assert checks["announced capabilities"]["status"] == "warn"  # no worker announced: a warning
    assert (code, doc["ok"]) == (0, True), doc


def test_doctor_names_an_unreachable_redis(tmp_path: Path) -> None:
    server = PrivateRedis(tmp_path)  # a free port, never started
    code, out = _doctor("--store", f"redis://127.0.0.1:{server.port}/0", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False
    first = doc["checks"][0]
    assert first["status"] == "fail" and "not reachable" in first["detail"]
    assert first["fix"] == "start Redis or correct the URL"
