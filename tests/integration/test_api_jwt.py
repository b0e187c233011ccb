"""OIDC/JWT bearer tokens verified against a JWKS file: the role and tenants come from the
token's claims; a bad signature, an unknown key, an expired token, another audience or issuer,
or claims that name no role are refused with 401."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from tests.integration.test_api_support import serving, wait_status

from accord.adapters.ingress.auth import JwtVerifier

ISSUER, AUDIENCE = "https://issuer.test", "accord-api"


def _keys(tmp: Path) -> tuple[Any, Any, Path]:
    good = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(good.public_key()))
    jwks = tmp / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**public, "kid": "k1", "alg": "RS256", "use": "sig"}]}))
    return good, other, jwks


def _token(key: Any, kid: str = "k1", **claims: Any) -> str:
    now = int(time.time())
    body = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "svc-1",
        "iat": now,
        "exp": now + 300,
        "role": "operator",
        "tenants": ["acme"],
        **claims,
    }
    return jwt.encode(
        {k: v for k, v in body.items() if v is not None},
        key,
        algorithm="RS256",
        headers={"kid": kid},
    )


async def test_jwt_bearer_tokens_carry_role_and_tenants(tmp_path: Path) -> None:
    good, other, jwks = _keys(tmp_path)
    verifier = JwtVerifier(jwks, issuer=ISSUER, audience=AUDIENCE)
    async with serving(tmp_path, jwt=verifier) as api:
        async with api.client(_token(good)) as client:
            got = await client.post(
                "/v1/runs", json={"workflow": "api-flow", "context": {"modelId": "j1"}}
            )
            assert got.status_code == 201, got.text
            assert got.json()["tenant"] == "acme"
            assert (await wait_status(api, got.json()["run_id"]))["status"] == "completed"
            history = (await client.get(f"/v1/runs/{got.json()['run_id']}/history")).json()
            assert history["entries"]
        async with api.client(_token(good, role="viewer", tenants=None, tenant="globex")) as c:
            assert (await c.get("/v1/runs")).status_code == 200
            assert (await c.get(f"/v1/runs/{got.json()['run_id']}")).status_code == 404
            assert (await c.post("/v1/runs", json={"workflow": "api-flow"})).status_code == 403
        refused = {
            "signed by another key": _token(other),
            "unknown kid": _token(good, kid="k9"),
            "expired": _token(good, exp=int(time.time()) - 60),
            "another audience": _token(good, aud="someone-else"),
            "another issuer": _token(good, iss="https://evil.test"),
            "no role": _token(good, role=None),
            "unknown role": _token(good, role="root"),
            "no tenants": _token(good, tenants=None),
            "not a token": "a.b.c",
        }
        for why, token in refused.items():
            async with api.client(token) as client:
                got = await client.get("/v1/runs")
                assert got.status_code == 401, (why, got.text)
                assert got.headers["content-type"].startswith("application/problem+json"), why
