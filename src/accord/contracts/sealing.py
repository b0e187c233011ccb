"""Sealing: the fields a contract marks ``sensitive`` encrypted at rest, field by field.

A sealed value is a *string token* that stands where the clear value stood::

    accord:sealed:v1:<key id>:<base64url(nonce ‖ ciphertext ‖ tag)>

so a run record, its history and every job payload can carry it through the pure machine (a
binding moves it like any other string) and only the parts holding the key ever see the clear
value: the worker runtime, before it validates a request and calls the handler, and the engine,
where it binds the inputs of what it runs itself (actions). This is the shape of Temporal's payload
codecs, applied per field rather than per payload, so that non-sensitive fields stay readable to
decisions, views and queries.

* The plaintext is the canonical JSON of the value, so a sensitive ``integer``, ``object`` or
  ``array`` seals as well as a string, and opens to the same value and type.
* AES-256-GCM with a random 96-bit nonce: each sealing of one value gives a different token, and a
  token altered by one bit fails to open (:class:`SealingError`, never a wrong value).
* The additional data binds the format version and the key id. It does *not* bind the field path:
  a binding carries a token from the context to a request field of another name, and the worker
  must open it there.
* Keys are named by id. A :class:`Keyring` seals with its current key and opens with it or with
  any retired key it still holds, so rotating the key never rewrites history: old tokens keep
  opening as long as their key stays in the ring. A token naming a key the ring does not hold is a
  clear error naming that id.

``null`` is never sealed (it holds nothing), nor is a value that is sealed already. The module is
pure computation (no I/O): where the keys come from is the adapters' and CLI's business.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from accord.contracts.model import MessageContract
from accord.contracts.redact import field_paths
from accord.errors import AccordError

__all__ = [
    "KEY_BYTES",
    "PREFIX",
    "Keyring",
    "SealingError",
    "is_sealed",
    "open_all",
    "open_value",
    "seal_fields",
    "seal_paths",
    "sealed_found",
]

PREFIX = "accord:sealed:v1:"
KEY_BYTES = 32  # AES-256
_NONCE = 12
_TAG = 16
_KID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_ITEM = "[]"


class SealingError(AccordError):
    """A key that cannot be used, or a sealed value that cannot be opened (why, in one line)."""

    code = "sealing-error"


def is_sealed(value: object) -> bool:
    """Whether ``value`` is a sealed token (by its prefix; opening it is what checks it)."""
    return isinstance(value, str) and value.startswith(PREFIX)


def _aad(kid: str) -> bytes:
    return f"{PREFIX}{kid}".encode()


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise SealingError(f"{what}: not base64") from None


class Keyring:
    """The current key (sealing and opening) and the retired ones (opening only), by id."""

    __slots__ = ("_ciphers", "current")

    def __init__(self, current: tuple[str, bytes], retired: Mapping[str, bytes] | None = None):
        keys = {**(retired or {}), current[0]: current[1]}
        for kid, key in keys.items():
            if not _KID.fullmatch(kid):
                raise SealingError(f"sealing key id {kid!r} must match {_KID.pattern}")
            if len(key) != KEY_BYTES:
                why = f"is {len(key)} bytes, not {KEY_BYTES}"
                raise SealingError(f"sealing key {kid!r} {why} (AES-256 needs {KEY_BYTES})")
        self.current = current[0]
        self._ciphers = {kid: AESGCM(key) for kid, key in keys.items()}

    @classmethod
    def parse(cls, current: str, retired: str = "") -> Keyring:
        """A ring from ``<kid>:<base64 key>`` (the current key) and a comma-separated list of
        the same for retired keys; raises :class:`SealingError` naming the bad entry."""
        kid, key = _entry(current, "sealing key")
        old: dict[str, bytes] = {}
        for item in (part.strip() for part in retired.split(",")):
            if item:
                rid, rkey = _entry(item, "retired sealing key")
                old[rid] = rkey
        return cls((kid, key), old)

    @staticmethod
    def generate_key() -> bytes:
        return AESGCM.generate_key(bit_length=KEY_BYTES * 8)

    @property
    def kids(self) -> list[str]:
        return sorted(self._ciphers)

    def seal(self, value: Any) -> str:
        """The token of ``value`` (any JSON value) under the current key."""
        plain = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        nonce = os.urandom(_NONCE)
        sealed = self._ciphers[self.current].encrypt(
            nonce, plain.encode("utf-8"), _aad(self.current)
        )
        body = base64.urlsafe_b64encode(nonce + sealed).rstrip(b"=").decode("ascii")
        return f"{PREFIX}{self.current}:{body}"

    def open(self, token: str) -> Any:
        """The value ``token`` seals; :class:`SealingError` when it cannot be opened."""
        if not is_sealed(token):
            raise SealingError("not a sealed value")
        kid, sep, body = token[len(PREFIX) :].partition(":")
        if not sep:
            raise SealingError("sealed value has no key id")
        cipher = self._ciphers.get(kid)
        if cipher is None:
            held = ", ".join(self.kids)
            raise SealingError(f"sealed with key {kid!r}, which this keyring lacks (it has {held})")
        raw = _b64decode(body, f"sealed value under key {kid!r}")
        if len(raw) < _NONCE + _TAG:
            raise SealingError(f"sealed value under key {kid!r} is truncated")
        try:
            plain = cipher.decrypt(raw[:_NONCE], raw[_NONCE:], _aad(kid))
        except InvalidTag:
            raise SealingError(
                f"sealed value under key {kid!r} does not open (altered, or another key)"
            ) from None
        return json.loads(plain)


def _entry(text: str, what: str) -> tuple[str, bytes]:
    kid, sep, b64 = text.strip().partition(":")
    if not sep or not kid or not b64:
        raise SealingError(f"{what} must be <key id>:<base64 of {KEY_BYTES} bytes>")
    try:
        key = base64.b64decode(b64.strip() + "=" * (-len(b64.strip()) % 4), validate=False)
    except (binascii.Error, ValueError):
        raise SealingError(f"{what} {kid!r}: not base64") from None
    if len(key) != KEY_BYTES:
        raise SealingError(f"{what} {kid!r} is {len(key)} bytes, not {KEY_BYTES}")
    return kid, key


# -- documents ---------------------------------------------------------------------------------

_paths: dict[int, tuple[MessageContract, list[tuple[str, ...]]]] = {}


def _sensitive(contract: MessageContract) -> list[tuple[str, ...]]:
    hit = _paths.get(id(contract))
    if hit is not None and hit[0] is contract:
        return hit[1]
    if len(_paths) > 512:
        _paths.clear()
    found = field_paths(contract.payload)
    _paths[id(contract)] = (contract, found)
    return found


def seal_fields(contract: MessageContract | None, document: Any, keyring: Keyring) -> Any:
    """``document`` with every field ``contract`` marks sensitive sealed (a copy where anything
    changed; the input is never mutated). Values already sealed, and ``null``, are left."""
    if contract is None:
        return document
    return seal_paths(_sensitive(contract), document, keyring)


def seal_paths(paths: Iterable[Sequence[str]], document: Any, keyring: Keyring) -> Any:
    """``document`` with the value at each of ``paths`` (``("a", "[]", "b")``) sealed."""
    out = document
    for path in paths:
        out = _at(tuple(path), out, keyring.seal)
    return out


def _at(path: tuple[str, ...], value: Any, seal: Callable[[Any], str]) -> Any:
    if not path:
        return value if value is None or is_sealed(value) else seal(value)
    head, rest = path[0], path[1:]
    if head == _ITEM:
        if not isinstance(value, list):
            return value
        return [_at(rest, item, seal) for item in value]
    if not isinstance(value, Mapping) or head not in value:
        return value
    member = value[head]
    changed = _at(rest, member, seal)
    if changed is member:
        return value
    out = dict(value)
    out[head] = changed
    return out


def open_value(value: Any, keyring: Keyring | None, found: list[Any] | None = None) -> Any:
    """``value`` with every sealed token in it, at any depth, opened (a copy where anything
    changed). Without a keyring a token is :class:`SealingError` (it cannot be used sealed).
    Each scalar an opened token held is appended to ``found`` (to scrub echoes of it)."""
    if isinstance(value, str):
        if not value.startswith(PREFIX):
            return value
        if keyring is None:
            raise SealingError("a sealed value arrived and no sealing key is configured")
        opened = keyring.open(value)
        if found is not None:
            _scalars(opened, found)
        return opened
    if isinstance(value, Mapping):
        out = None
        for name, member in value.items():
            opened = open_value(member, keyring, found)
            if opened is not member:
                if out is None:
                    out = dict(value)
                out[name] = opened
        return value if out is None else out
    if isinstance(value, list):
        items = [open_value(member, keyring, found) for member in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value


def open_all(document: Any, keyring: Keyring | None, found: list[Any] | None = None) -> Any:
    """:func:`open_value` of a whole document (a payload, a context)."""
    return open_value(document, keyring, found)


def _scalars(value: Any, out: list[Any]) -> None:
    if isinstance(value, Mapping):
        for member in value.values():
            _scalars(member, out)
    elif isinstance(value, list):
        for member in value:
            _scalars(member, out)
    elif value is not None and not isinstance(value, bool):
        out.append(value)


def sealed_found(value: Any, at: str = "") -> list[str]:
    """The paths (``a.b``, ``views[0]``) of the sealed tokens in ``value``, for messages."""
    if is_sealed(value):
        return [at or "$"]
    out: list[str] = []
    if isinstance(value, Mapping):
        for name, member in value.items():
            out += sealed_found(member, f"{at}.{name}" if at else str(name))
    elif isinstance(value, list):
        for i, member in enumerate(value):
            out += sealed_found(member, f"{at}[{i}]")
    return out
