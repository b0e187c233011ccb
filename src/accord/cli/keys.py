"""`accord keys create|list|revoke`: the API keys of the HTTP control plane.

``create --role R --tenant T [--tenant T2 …]`` prints a new key once (``acc_<id>_<secret>``);
only the sha256 of its secret is kept, in the control file beside the store
(:mod:`accord.adapters.ingress.control`; ``--control`` names another). ``list`` shows every key
without its secret, ``revoke KEY_ID`` stops one from authenticating at once. Creating and
revoking are audit records (principal ``cli:$USER``). Every command takes ``--json``.
"""

from __future__ import annotations

import os
import secrets
from typing import Annotated

import typer

from accord.adapters.ingress.control import ROLES, ControlStore, control_path
from accord.cli._common import console, emit_json, refuse, usage
from accord.engine.runtime.orchestrator import TENANT_PATTERN
from accord.errors import AccordError

__all__ = ["app"]

app = typer.Typer(help="Create, list and revoke API keys.", no_args_is_help=True)

DEFAULT_STORE = "sqlite:///.accord/accord.db"
StoreOpt = Annotated[
    str,
    typer.Option(
        "--store", envvar="ACCORD_STORE", help="store URL (the control file is beside it)"
    ),
]
ControlOpt = Annotated[str | None, typer.Option("--control", help="control file path")]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]


def _control(store: str, control: str | None) -> ControlStore:
    try:
        return ControlStore(control_path(store, control))
    except AccordError as exc:
        usage(str(exc))


def _who() -> str:
    return f"cli:{os.environ.get('USER', 'operator')}"


@app.command("create")
def create(  # noqa: PLR0917 - typer maps each option to a parameter
    role: Annotated[str, typer.Option("--role", help="viewer, operator, author or admin")],
    tenant: Annotated[list[str], typer.Option("--tenant", help="a tenant of the key (repeatable)")],
    name: Annotated[str, typer.Option(help="what the key is for")] = "",
    store: StoreOpt = DEFAULT_STORE,
    control: ControlOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Create a key; it is shown once."""
    if role not in ROLES:
        usage(f"--role must be one of {', '.join(ROLES)}, not {role!r}")
    for t in tenant:
        if not TENANT_PATTERN.fullmatch(t):
            usage(f"--tenant {t!r} must match {TENANT_PATTERN.pattern}")
    keys = _control(store, control)
    try:
        secret, key = keys.create_key(role, tenant, name=name, created_by=_who())
        rid = f"cli-{secrets.token_hex(8)}"
        for t in key.tenants:
            keys.audit(
                _who(), t, rid, action="key.create", target=key.key_id, detail={"role": role}
            )
    except AccordError as exc:
        refuse(str(exc))
    finally:
        keys.close()
    if json_out:
        emit_json({"ok": True, "key": secret, **key.to_json()})
        return
    console.print(f"key {key.key_id} ({role}, tenants {', '.join(key.tenants)}):", markup=False)
    console.print(secret, markup=False)
    console.print("it is shown only now: keep it", markup=False)


@app.command("list")
def list_keys(
    store: StoreOpt = DEFAULT_STORE, control: ControlOpt = None, json_out: JsonOpt = False
) -> None:
    """List keys (never their secrets)."""
    keys = _control(store, control)
    try:
        rows = keys.list_keys()
    except AccordError as exc:
        refuse(str(exc))
    finally:
        keys.close()
    if json_out:
        emit_json([k.to_json() for k in rows])
        return
    for k in rows:
        state = "revoked" if k.revoked_at_ms is not None else "live"
        console.print(
            f"{k.key_id}  {k.role:<8} {state:<7} {','.join(k.tenants)}  {k.name}", markup=False
        )


@app.command("revoke")
def revoke(
    key_id: str,
    store: StoreOpt = DEFAULT_STORE,
    control: ControlOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Revoke a key: it stops authenticating at once."""
    keys = _control(store, control)
    try:
        key = keys.get_key(key_id)
        if key is None:
            refuse(f"no key {key_id!r}")
        if not keys.revoke_key(key_id):
            refuse(f"key {key_id} is already revoked")
        rid = f"cli-{secrets.token_hex(8)}"
        for t in key.tenants:
            keys.audit(_who(), t, rid, action="key.revoke", target=key_id)
    except AccordError as exc:
        refuse(str(exc))
    finally:
        keys.close()
    if json_out:
        emit_json({"ok": True, "key_id": key_id, "revoked": True})
    else:
        console.print(f"key {key_id} revoked", markup=False)
