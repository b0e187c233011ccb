"""Who is asking: bearer API keys and, optionally, OIDC/JWT bearer tokens; roles and tenants.

A request names its principal with ``Authorization: Bearer <token>``. A token starting
``acc_`` is an API key, checked against the control file
(:meth:`~accord.adapters.ingress.control.ControlStore.verify_key`); any other token is a JWT,
accepted only when the server was given a JWKS file (``--jwks``): its signature is verified with
the key its header names (``kid``), and its ``exp``, ``nbf``, ``iss`` (``--issuer``) and ``aud``
(``--audience``) are checked by PyJWT. A token's ``role`` claim names one role; ``tenants`` (a
list) or ``tenant`` (a string) its tenants.

Roles are ordered, each allowed what the ones before it are: ``viewer`` reads, ``operator``
starts, cancels and re-drives runs, ``author`` activates and rolls back workflows, ``admin``
manages keys and reads the audit log. :func:`authorizer` makes the FastAPI dependency a route
declares; it also spends one token of the principal's rate-limit bucket.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import jwt
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from accord.adapters.ingress.control import KEY_PREFIX, ROLES, ControlStore, role_at_least
from accord.adapters.ingress.limits import RateLimiter
from accord.adapters.ingress.problems import Problem

__all__ = ["JwtVerifier", "Principal", "authorizer", "bearer"]

_ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA"]


@dataclass(frozen=True, slots=True)
class Principal:
    id: str  # ``key:<key id>`` or ``jwt:<issuer>#<subject>``
    role: str
    tenants: tuple[str, ...]

    def may(self, needed: str) -> bool:
        return role_at_least(self.role, needed)

    def can_see(self, tenant: str) -> bool:
        return tenant in self.tenants


class JwtVerifier:
    """Verifies JWT bearer tokens against the keys of a JWKS file."""

    def __init__(self, jwks_file: Path, *, issuer: str | None, audience: str | None) -> None:
        try:
            text = jwks_file.read_text(encoding="utf-8")
            self._keys = jwt.PyJWKSet.from_json(text)
        except (OSError, UnicodeDecodeError, jwt.PyJWTError, ValueError) as exc:
            raise ValueError(f"--jwks {jwks_file}: not a readable JWKS file: {exc}") from exc
        self.issuer, self.audience = issuer, audience

    def verify(self, token: str) -> Principal:
        try:
            kid = jwt.get_unverified_header(token).get("kid")
            key = next((k for k in self._keys.keys if k.key_id == kid), None)
            if key is None:
                raise Problem(401, "token-invalid", f"no key {kid!r} in the JWKS file")
            options: jwt.types.Options = {"require": ["exp", "sub"]}
            if self.audience is None:
                options["verify_aud"] = False
            claims = jwt.decode(
                token,
                key=key,
                algorithms=_ALGORITHMS,
                issuer=self.issuer,
                audience=self.audience,
                options=options,
            )
        except jwt.PyJWTError as exc:
            raise Problem(401, "token-invalid", f"bearer token refused: {exc}") from None
        role = claims.get("role")
        tenants = claims.get("tenants", claims.get("tenant"))
        if isinstance(tenants, str):
            tenants = [tenants]
        if role not in ROLES or not isinstance(tenants, list) or not tenants:
            raise Problem(
                401, "token-claims", "the token needs a role claim (one of "
                f"{', '.join(ROLES)}) and a tenants (list) or tenant claim",
            )  # fmt: skip
        if not all(isinstance(t, str) for t in tenants):
            raise Problem(401, "token-claims", "every tenant in the token must be a string")
        return Principal(f"jwt:{claims.get('iss', '')}#{claims['sub']}", role, tuple(tenants))


bearer = HTTPBearer(auto_error=False, description="An API key (acc_…) or a JWT.")
_credentials = Depends(bearer)


def _authenticate(token: str, control: ControlStore, verifier: JwtVerifier | None) -> Principal:
    if token.startswith(KEY_PREFIX):
        key = control.verify_key(token)
        if key is None:
            raise Problem(401, "key-invalid", "the API key is unknown, wrong or revoked")
        return Principal(f"key:{key.key_id}", key.role, key.tenants)
    if verifier is None:
        raise Problem(401, "key-invalid", "not an API key, and this server accepts no JWTs")
    return verifier.verify(token)


def authorizer(needed: str) -> Callable[..., Awaitable[Principal]]:
    """The dependency of a route that needs role ``needed`` (or a higher one)."""

    async def dependency(
        request: Request, credentials: HTTPAuthorizationCredentials | None = _credentials
    ) -> Principal:
        state = request.app.state
        if credentials is None or not credentials.credentials:
            raise Problem(
                401, "unauthenticated", "send Authorization: Bearer <API key or token>",
                headers={"WWW-Authenticate": 'Bearer realm="accord"'},
            )  # fmt: skip
        principal = _authenticate(credentials.credentials, state.control, state.jwt)
        limiter: RateLimiter = state.limiter
        wait_s = limiter.take(principal.id)
        if wait_s is not None:
            seconds = max(1, int(wait_s + 0.999))
            raise Problem(
                429, "rate-limited", f"too many requests from {principal.id}; retry in "
                f"{seconds} s", headers={"Retry-After": str(seconds)}, retry_after=seconds,
            )  # fmt: skip
        if not principal.may(needed):
            raise Problem(
                403, "forbidden", f"role {principal.role} may not do this; it needs {needed}",
                needed_role=needed,
            )  # fmt: skip
        request.state.principal = principal
        return principal

    return dependency


def chosen_tenant(principal: Principal, asked: str | None) -> str:
    """The tenant an action of ``principal`` is for: the one it names (one of its own), or its
    only tenant."""
    if asked is not None:
        if not principal.can_see(asked):
            raise Problem(403, "tenant-forbidden", f"{principal.id} may not act for {asked!r}")
        return asked
    if len(principal.tenants) == 1:
        return principal.tenants[0]
    raise Problem(
        422, "tenant-required", "this principal has several tenants: name one "
        f"({', '.join(principal.tenants)})", tenants=list(principal.tenants),
    )  # fmt: skip


def tenants_of(principal: Principal, asked: Sequence[str] | None) -> list[str]:
    """The tenants a read covers: the ones asked for (each the principal's), else all its own."""
    if not asked:
        return list(principal.tenants)
    for tenant in asked:
        if not principal.can_see(tenant):
            raise Problem(403, "tenant-forbidden", f"{principal.id} may not read {tenant!r}")
    return list(dict.fromkeys(asked))


def claims_json(principal: Principal) -> str:
    return json.dumps({"id": principal.id, "role": principal.role, "tenants": principal.tenants})
