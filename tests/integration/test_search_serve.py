"""`accord serve` and `accord engine run` open the search projection (beside a SQLite store by
default, or as `--projection` names it), and `GET /v1/search` answers from it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
from tests.integration.test_api_serve import CONTRACTS, _accord, _process, _serving_url


async def _search(url: str, key: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        return await client.get("/v1/search", params={"q": "status:failed"},
                                headers={"Authorization": f"Bearer {key}"})  # fmt: skip


async def test_accord_serve_answers_search_from_the_default_projection(tmp_path: Path) -> None:
    code, out, err = await _accord(tmp_path, "keys", "create", "--role", "viewer",
                                   "--tenant", "demo", "--json")  # fmt: skip
    assert code == 0, err
    key = json.loads(out)["key"]
    args = ["serve", "--port", "0", "--contracts", str(CONTRACTS), "--no-platform"]
    async with _process(tmp_path, "serve", *args) as server:
        got = await _search(await _serving_url(server, tmp_path), key)
    assert got.status_code == 200, got.text
    doc = got.json()
    assert doc["total"] == 0 and doc["source"].startswith("derived index")
    assert (tmp_path / ".accord" / "accord.projection.db").is_file()

    async with _process(tmp_path, "serve-off", *args, "--projection", "off") as server:
        got = await _search(await _serving_url(server, tmp_path), key)
    assert got.status_code == 404 and got.json()["code"] == "projection-off"


async def test_accord_engine_run_opens_the_projection_it_is_given(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    named = tmp_path / "search.db"
    args = ["engine", "run", "--store", store, "--transport", store, "--no-platform",
            "--projection", f"sqlite:///{named}"]  # fmt: skip
    async with _process(tmp_path, "engine", *args) as engine:
        assert engine.stdout is not None
        async with asyncio.timeout(60):
            line = (await engine.stdout.readline()).decode()
        assert "running on" in line, line
    assert named.is_file()
    code, out, _ = await _accord(tmp_path, "telemetry", "status", "--store", store,
                                 "--projection", f"sqlite:///{named}", "--json")  # fmt: skip
    assert code == 0 and json.loads(out)["runs"] == 0
    assert not (tmp_path / "runs.projection.db").exists()  # not the default one
