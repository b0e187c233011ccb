"""Standard Webhooks verification, the replay stores and the remote-worker configuration."""

from __future__ import annotations

import base64
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from accord.adapters.ingress.remote import (
    RemoteConfigError,
    load_remote_config,
    parse_remote_config,
    secret_bytes,
)
from accord.adapters.ingress.webhooks import (
    MemoryReplayStore,
    RedisReplayStore,
    Rejected,
    SqliteReplayStore,
    WebhookVerifier,
    sign_headers,
)
from tests.services import REDIS_DB, ensure_redis


def _secret(fill: bytes) -> str:
    return "whsec_" + base64.b64encode(fill * 32).decode()


A, B = _secret(b"a"), _secret(b"b")
BODY = b'{"messageType":"accepted"}'


def _verifier(**kw: Any) -> WebhookVerifier:
    return WebhookVerifier({"ka": A, "kb": B}, tolerance_s=60, **kw)


def _rejected(verifier: WebhookVerifier, body: bytes, headers: dict[str, str]) -> str:
    with pytest.raises(Rejected) as caught:
        verifier.verify(body, headers)
    return caught.value.code


def test_a_signature_from_either_active_key_verifies() -> None:
    v = _verifier()
    for key_id, secret in (("ka", A), ("kb", B)):
        got = v.verify(BODY, sign_headers(key_id, secret, "wh_1", BODY))
        assert (got.webhook_id, got.key_id) == ("wh_1", key_id)


def test_one_matching_signature_among_several_verifies() -> None:
    headers = sign_headers("ka", A, "wh_1", BODY)
    other = sign_headers("ka", B, "wh_1", BODY)["webhook-signature"]
    headers["webhook-signature"] = f"v1,AAAA {other} {headers['webhook-signature']}"
    assert _verifier().verify(BODY, headers).key_id == "ka"


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"webhook-id": ""}, "missing-signature"),
        ({"webhook-timestamp": ""}, "missing-signature"),
        ({"accord-key-id": ""}, "missing-key-id"),
        ({"accord-key-id": "kz"}, "unknown-key"),
        ({"accord-key-id": "kb"}, "bad-signature"),  # signed with A, named as B
        ({"webhook-timestamp": "1e9"}, "malformed-signature"),
        ({"webhook-timestamp": "-5"}, "malformed-signature"),
        ({"webhook-signature": "v1"}, "malformed-signature"),
        ({"webhook-signature": "v1,x,y"}, "malformed-signature"),
        ({"webhook-signature": "v1,abc"}, "malformed-signature"),
        ({"webhook-signature": "v1,ünïcode"}, "malformed-signature"),
        ({"webhook-signature": "v2,AAAA"}, "bad-signature"),
        ({"webhook-id": "x" * 300}, "malformed-signature"),
    ],
)
def test_refusals_have_stable_codes_and_never_escape(change: dict[str, str], code: str) -> None:
    headers = {**sign_headers("ka", A, "wh_1", BODY), **change}
    assert _rejected(_verifier(), BODY, headers) == code


def test_timestamps_outside_the_tolerance_are_refused() -> None:
    v = _verifier()
    now = int(time.time())
    assert _rejected(v, BODY, sign_headers("ka", A, "w", BODY, timestamp=now - 61)) == (
        "timestamp-expired"
    )
    assert _rejected(v, BODY, sign_headers("ka", A, "w", BODY, timestamp=now + 61)) == (
        "timestamp-in-future"
    )
    assert v.verify(BODY, sign_headers("ka", A, "w", BODY, timestamp=now - 55)).key_id == "ka"


def test_a_changed_body_is_refused() -> None:
    headers = sign_headers("ka", A, "wh_1", BODY)
    assert _rejected(_verifier(), BODY + b" ", headers) == "bad-signature"
    assert _rejected(_verifier(), b"\xff", headers) == "malformed-body"


def test_the_tolerance_is_bounded_by_the_library_window() -> None:
    with pytest.raises(ValueError, match=r"1\.\.300"):
        WebhookVerifier({"ka": A}, tolerance_s=600)


async def test_replayed_ids_are_refused_for_longer_than_the_tolerance() -> None:
    now = [100.0]
    v = _verifier(replay=MemoryReplayStore(clock=lambda: now[0]))
    assert v.replay_ttl_ms == 121_000
    verified = v.verify(BODY, sign_headers("ka", A, "wh_1", BODY))
    await v.claim(verified)
    with pytest.raises(Rejected) as caught:
        await v.claim(verified)
    assert (caught.value.status, caught.value.code) == (409, "replayed")
    now[0] += 120.0
    with pytest.raises(Rejected):
        await v.claim(verified)
    now[0] += 2.0
    await v.claim(verified)  # forgotten only once no timestamp with it can pass any more
    await v.release(verified)
    await v.claim(verified)


async def test_sqlite_replay_store_is_shared_through_its_file(tmp_path: Path) -> None:
    now = [1000.0]
    one = SqliteReplayStore(tmp_path / "ids.db", clock=lambda: now[0])
    two = SqliteReplayStore(tmp_path / "ids.db", clock=lambda: now[0])
    assert await one.claim("wh_1", 5_000)
    assert not await two.claim("wh_1", 5_000)
    now[0] += 5.0
    assert await two.claim("wh_1", 5_000)  # expired, then claimed anew
    await two.release("wh_1")
    assert await one.claim("wh_1", 5_000)
    await one.close()
    await two.close()


async def test_redis_replay_store_uses_set_nx_px() -> None:
    ensure_redis()
    client = aioredis.Redis(port=6379, db=REDIS_DB)
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    store = RedisReplayStore(client, prefix, owns_client=True)
    try:
        assert await store.claim("wh_1", 200)
        assert not await store.claim("wh_1", 200)
        ttl = await client.pttl(f"{prefix}:webhook-id:wh_1")
        assert 0 < ttl <= 200
        await store.release("wh_1")
        assert await store.claim("wh_1", 60_000)
    finally:
        await client.delete(f"{prefix}:webhook-id:wh_1")
        await store.close()


# -- the remote-worker configuration ----------------------------------------------------------

GOOD = f"""\
callbacks:
  tolerance_s: 120
remotes:
  metadata:
    capability: metadata.extract@2
    url: https://meta.example.com/v1/jobs
    cancel_url: https://meta.example.com/v1/cancel
    allow: [meta.example.com, 10.20.0.0/16, "*.workers.example.com"]
    connect_timeout_ms: 500
    signing_key: k2
    secrets:
      k1: env:META_OLD
      k2: {B}
"""


def test_a_good_file_reads_with_env_secrets_and_defaults() -> None:
    config = parse_remote_config(GOOD, "remote.yaml", env={"META_OLD": A})
    remote = config.remotes["metadata"]
    assert config.callbacks.tolerance_s == 120 and config.callbacks.max_body_bytes == 1_048_576
    assert remote.secrets == {"k1": A, "k2": B} and remote.signing_key == "k2"
    assert remote.allow_hosts == {"meta.example.com", "*.workers.example.com"}
    assert [str(n) for n in remote.allow_networks] == ["10.20.0.0/16"]
    assert (remote.connect_timeout_ms, remote.timeout_ms, remote.allow_http) == (500, 10_000, False)
    assert config.key("k1") == (remote, A) and config.key("k9") is None


def test_json_is_read_too(tmp_path: Path) -> None:
    doc = {"remotes": {"metadata": {"url": "http://10.0.0.5:8080/jobs", "allow_http": True,
                                    "allow": ["10.0.0.5"], "secrets": {"k1": A}}}}  # fmt: skip
    path = tmp_path / "remote.json"
    path.write_text(json.dumps(doc, indent=2))
    remote = load_remote_config(path, env={}).remotes["metadata"]
    assert remote.signing_key == "k1" and remote.allow_http


@pytest.mark.parametrize(
    ("edit", "env", "line", "path", "code"),
    [
        (("connect_timeout_ms: 500", "connect_timeout: 500"), {"META_OLD": A}, 9,
         "remotes.metadata.connect_timeout", "remote-config-unknown-field"),
        (("", ""), {}, 12, "remotes.metadata.secrets.k1", "remote-config-env"),
        ((B, "whsec_c2hvcnQ="), {"META_OLD": A}, 13, "remotes.metadata.secrets.k2",
         "remote-config-secret"),
        (("https://meta.example.com/v1/jobs", "http://meta.example.com/v1/jobs"),
         {"META_OLD": A}, 6, "remotes.metadata.url", "remote-config-url"),
        (("10.20.0.0/16", "10.20.0.0/99"), {"META_OLD": A}, 8, "remotes.metadata.allow[1]",
         "remote-config-value"),
        (("signing_key: k2", "signing_key: k3"), {"META_OLD": A}, 10,
         "remotes.metadata.signing_key", "remote-config-value"),
        (("tolerance_s: 120", "tolerance_s: 900"), {"META_OLD": A}, 2, "callbacks.tolerance_s",
         "remote-config-value"),
    ],
)  # fmt: skip
def test_bad_files_name_file_line_and_field(
    edit: tuple[str, str], env: dict[str, str], line: int, path: str, code: str
) -> None:
    text = GOOD.replace(*edit) if edit[0] else GOOD
    with pytest.raises(RemoteConfigError) as caught:
        parse_remote_config(text, "remote.yaml", env=env)
    found = [
        (d.code, d.path, d.location.line if d.location else 0) for d in caught.value.diagnostics
    ]
    assert (code, path, line) in found, found
    assert f"remote.yaml:{line}" in str(caught.value)


def test_a_key_id_is_used_by_one_remote_only() -> None:
    text = (
        GOOD
        + f"""\
  rendering:
    url: https://render.example.com/jobs
    allow: [render.example.com]
    secrets:
      k2: {A}
"""
    )
    with pytest.raises(RemoteConfigError, match="already used by remote 'metadata'"):
        parse_remote_config(text, "remote.yaml", env={"META_OLD": A})


def test_syntax_errors_and_missing_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(RemoteConfigError, match=r"remote\.yaml:\d+:\d+: error yaml-syntax"):
        parse_remote_config("remotes: [", "remote.yaml")
    with pytest.raises(RemoteConfigError, match="remote-config-unreadable"):
        load_remote_config(tmp_path / "absent.yaml")


def test_secrets_are_whsec_base64_of_24_to_64_bytes() -> None:
    assert secret_bytes(A) == b"a" * 32
    for bad in ("a" * 40, "whsec_!!!", "whsec_" + base64.b64encode(b"s" * 8).decode()):
        with pytest.raises(ValueError, match="secret"):
            secret_bytes(bad)
