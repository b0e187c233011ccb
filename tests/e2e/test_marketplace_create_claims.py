"""Two Etsy connector processes publishing one listing at the same instant create it once.

Each connector is a real process (:mod:`tests.etsy_double.publish_proc`, the real publish
handler, its configuration from the environment) talking to the Etsy test double over a socket.
Both are released at once and the double answers their reconciliation queries together, from
the same state (``meet_searches``), so both find nothing — the race the per-process lock cannot
see. Without a claim store both create (the control: the race is real). With one — a folder, or a
bucket on a real SeaweedFS — the create claim (a conditional write keyed by the external id)
lets one create; the other waits and finds that listing (``reconciled``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.etsy_double.app import EtsyDouble, serve
from tests.etsy_double.support import CONTRACTS, ROOT, TOKENS, refresh
from tests.services import ensure_seaweedfs

from accord.adapters.objects.s3 import S3ObjectStore

pytestmark = pytest.mark.slow


@pytest.fixture
def double() -> Iterator[tuple[EtsyDouble, str]]:
    d = EtsyDouble()
    with serve(d) as url:
        yield d, url


def _env(tmp: Path, base_url: str, claims: str | None) -> dict[str, str]:
    tokens = tmp / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    refresh(tmp / "policies", tmp)
    env = os.environ | {
        "ACCORD_ETSY_BASE_URL": base_url,
        "ACCORD_ETSY_API_KEY": "double-api-key",
        "ACCORD_ETSY_TOKENS": str(tokens),
        "ACCORD_POLICIES": str(tmp / "policies"),
        "ACCORD_CONTRACTS": str(CONTRACTS),
        "ACCORD_ETSY_READ_TIMEOUT_S": "5",
    }
    env.pop("ACCORD_ETSY_CREATE_CLAIMS", None)
    if claims is not None:
        env["ACCORD_ETSY_CREATE_CLAIMS"] = claims
    return env


def _race(env: dict[str, str], n: int = 2) -> list[dict[str, Any]]:
    """``n`` connector processes publishing model ``cube``, released at the same instant."""
    pipe = subprocess.PIPE
    args = [sys.executable, "-m", "tests.etsy_double.publish_proc", "cube"]
    io = {"stdin": pipe, "stdout": pipe, "stderr": pipe}
    procs = [
        subprocess.Popen([*args, f"run-{i}"], cwd=ROOT, env=env, text=True, **io) for i in range(n)
    ]
    try:
        for p in procs:  # every process has imported everything and built its context
            assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.stderr
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        docs = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            docs.append(json.loads(out.strip().splitlines()[-1]))
        return docs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_without_a_claim_store_two_processes_both_create(
    tmp_path: Path, double: tuple[EtsyDouble, str]
) -> None:
    etsy, url = double
    etsy.meet_searches(2)
    docs = _race(_env(tmp_path, url, None))
    assert all(d["ok"] for d in docs), docs
    assert etsy.received.count("createListing") == 2 and len(etsy.listings) == 2


@pytest.mark.parametrize("kind", ["fs", "s3"])
def test_a_create_claim_lets_one_of_two_processes_create(
    tmp_path: Path, double: tuple[EtsyDouble, str], kind: str
) -> None:
    etsy, url = double
    if kind == "fs":
        claims = f"file://{tmp_path / 'claims'}"
        env = _env(tmp_path, url, claims)
    else:
        server = ensure_seaweedfs()
        access, secret = server.credentials()
        bucket = S3ObjectStore("accord-etsy-claims", endpoint=server.endpoint,
                               access_key=access, secret_key=secret)  # fmt: skip
        bucket.ensure_bucket()
        bucket.close()
        prefix = f"c-{uuid.uuid4().hex[:10]}"
        claims = f"s3://accord-etsy-claims/{prefix}?endpoint={server.endpoint}"
        env = _env(tmp_path, url, claims) | {
            "AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret,
        }  # fmt: skip
    etsy.meet_searches(2)
    docs = _race(env)
    assert all(d["ok"] for d in docs), docs
    assert etsy.received.count("createListing") == 1, etsy.received
    assert len(etsy.listings) == 1
    results = [d["result"] for d in docs]
    assert {r["listingId"] for r in results} == set(etsy.listings)
    assert sorted(r["reconciled"] for r in results) == [False, True]  # one made it, one found it
    # both queried before either created: the loser found it only by waiting on the claim
    assert etsy.received[:2] == ["findAllActiveListingsByShop"] * 2
    if kind == "fs":  # the winner released its claim once the listing existed
        assert not list((tmp_path / "claims").rglob("*.json"))
