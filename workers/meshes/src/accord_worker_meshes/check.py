"""Structural checks on an untrusted model file before any parser allocates for it.

Parsers trust the counts a file declares: a binary STL header saying four billion triangles, a
PLY header declaring more vertices than the file has bytes, a 3MF (zip) member declaring a
terabyte, a glTF buffer pointing at ``../../etc/passwd``. Each check here reads only headers
(bounded reads) and compares declared sizes with what is really there, so the parse that follows
can only be as large as the file. Decompression is streamed with a byte cap. Everything raises a
classified :class:`~accord.errors.StageFailed` (``malformed-model``, ``input-too-large``,
``unsupported-format``).
"""

from __future__ import annotations

import gzip
import json
import re
import struct
import zipfile
from pathlib import Path, PurePosixPath
from urllib.parse import unquote

from accord.worker.sandbox import Limits, failure

__all__ = ["FORMATS", "detect_format", "inflate_gzip", "precheck"]

FORMATS = ("stl", "obj", "ply", "off", "glb", "gltf", "3mf")
_CHUNK = 1 << 16
_PLY_SIZES = {
    **dict.fromkeys(("char", "uchar", "int8", "uint8"), 1),
    **dict.fromkeys(("short", "ushort", "int16", "uint16"), 2),
    **dict.fromkeys(("int", "uint", "float", "int32", "uint32", "float32"), 4),
    **dict.fromkeys(("double", "float64"), 8),
}


def detect_format(name: str) -> tuple[str, bool]:
    """``("stl", False)`` for ``a/b.STL``; ``("obj", True)`` for ``m.obj.gz``."""
    parts = PurePosixPath(name.lower()).suffixes
    gz = bool(parts) and parts[-1] == ".gz"
    suffix = (parts[-2] if gz and len(parts) > 1 else parts[-1] if parts else "").lstrip(".")
    if suffix not in FORMATS:
        raise failure("unsupported-format", f"unsupported model format {suffix or 'none'!r}")
    return suffix, gz


def inflate_gzip(src: Path, dst: Path, cap: int) -> None:
    """Stream-decompress ``src`` into ``dst``, refusing more than ``cap`` bytes of output."""
    total = 0
    with gzip.open(src, "rb") as inp, dst.open("wb") as out:
        while chunk := inp.read(_CHUNK):
            total += len(chunk)
            if total > cap:
                raise failure("input-too-large", f"decompresses past the {cap}-byte limit")
            out.write(chunk)


def precheck(path: Path, fmt: str, limits: Limits) -> None:
    """Run the check for ``fmt``; raise on any disagreement between header and file."""
    check = {"stl": _stl, "ply": _ply, "off": _off, "glb": _glb, "gltf": _gltf, "3mf": _3mf}
    if fmt in check:
        check[fmt](path, limits)


def _stl(path: Path, limits: Limits) -> None:
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(1024)
    text = head.lstrip()[:5].lower() == b"solid" and b"facet" in head.lower()
    if text or (size < 84 and head.lstrip()[:5].lower() == b"solid"):
        return
    if size < 84:
        raise failure("malformed-model", f"binary STL is {size} bytes, shorter than its header")
    (count,) = struct.unpack("<I", head[80:84])
    expected = 84 + 50 * count
    if size < expected:
        raise failure(
            "malformed-model",
            f"truncated binary STL: header declares {count} triangles ({expected} bytes), "
            f"file has {size}",
        )
    if size - expected > 4096:
        raise failure("malformed-model", f"binary STL declares {count} triangles, file is larger")


def _ply(path: Path, limits: Limits) -> None:
    with path.open("rb") as f:
        head = f.read(_CHUNK)
    end = head.find(b"end_header")
    if not head.startswith(b"ply") or end < 0:
        raise failure("malformed-model", "PLY header missing or longer than 64 KiB")
    body = path.stat().st_size - head.index(b"\n", end) - 1
    lines = head[:end].decode("ascii", "replace").splitlines()
    binary = any(ln.startswith("format binary") for ln in lines)
    need = 0
    count = 0
    for ln in lines:
        words = ln.split()
        if words[:1] == ["element"] and len(words) == 3:
            if not words[2].isdigit():
                raise failure("malformed-model", f"PLY element count {words[2]!r} is not a count")
            count = int(words[2])
            need += 0 if binary else 2 * count  # a text record is at least 2 bytes
        elif words[:1] == ["property"] and binary and len(words) >= 3:
            kind = words[2] if words[1] == "list" else words[1]
            need += count * _PLY_SIZES.get(kind, 1)
    if need > body:
        raise failure(
            "malformed-model",
            f"PLY header declares elements needing {need} bytes, body has {body}",
        )


def _off(path: Path, limits: Limits) -> None:
    with path.open("rb") as f:
        head = f.read(4096).decode("ascii", "replace")
    tokens = re.sub(r"#[^\n]*", " ", head).split()
    if not tokens or not tokens[0].upper().endswith("OFF"):
        raise failure("malformed-model", "OFF file lacks its OFF header")
    counts = tokens[1:3]
    if len(counts) < 2 or not all(c.isdigit() for c in counts):
        raise failure("malformed-model", "OFF header lacks vertex and face counts")
    declared = int(counts[0]) + int(counts[1])
    if declared * 2 > path.stat().st_size:
        raise failure("malformed-model", f"OFF header declares {declared} records, file is short")


def _glb(path: Path, limits: Limits) -> None:
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(20)
        if len(head) < 20 or head[:4] != b"glTF":
            raise failure("malformed-model", "GLB magic or header missing")
        _, length, json_len, kind = struct.unpack("<4I", head[4:20])
        if length > size or json_len > size - 20 or kind != 0x4E4F534A:
            raise failure("malformed-model", f"GLB declares {length} bytes, file has {size}")
        doc = _json(f.read(json_len))
    _external_refs(doc, path.parent, limits)


def _gltf(path: Path, limits: Limits) -> None:
    _external_refs(_json(path.read_bytes()), path.parent, limits)


def _json(data: bytes) -> dict[str, object]:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise failure("malformed-model", f"glTF JSON does not parse: {exc}"[:300]) from None
    if not isinstance(doc, dict):
        raise failure("malformed-model", "glTF JSON is not an object")
    return doc


def _external_refs(doc: dict[str, object], base: Path, limits: Limits) -> None:
    """Every buffer/image URI is embedded data or a file beside the model, never outside it;
    Draco-compressed geometry is refused (the parser would return placeholder zeros)."""
    used = doc.get("extensionsUsed")
    if isinstance(used, list) and "KHR_draco_mesh_compression" in used:
        raise failure("unsupported-format", "Draco-compressed glTF geometry is not supported")
    total = 0
    top = base.resolve()
    for group in ("buffers", "images"):
        items = doc.get(group) or []
        for item in items if isinstance(items, list) else []:
            uri = item.get("uri") if isinstance(item, dict) else None
            if not isinstance(uri, str) or uri.startswith("data:"):
                continue
            rel = unquote(uri)
            if ":" in rel or rel.startswith(("/", "\\")) or "\\" in rel or "\0" in rel:
                raise failure("malformed-model", f"glTF {group} URI {uri[:100]!r} is not local")
            target = (top / rel).resolve()
            if not target.is_relative_to(top):
                raise failure(
                    "malformed-model", f"glTF {group} URI {uri[:100]!r} leaves its folder"
                )
            if group == "buffers" and not target.is_file():
                raise failure("malformed-model", f"glTF buffer {uri[:100]!r} is missing")
            total += target.stat().st_size if target.is_file() else 0
    if total > limits.input_bytes:
        raise failure("input-too-large", f"glTF references {total} bytes of external files")


def _3mf(path: Path, limits: Limits) -> None:
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            if len(members) > 10_000:
                raise failure("input-too-large", f"3MF archive has {len(members)} members")
            declared = sum(m.file_size for m in members)
            if declared > limits.decompressed_bytes:
                raise failure(
                    "input-too-large",
                    f"3MF members declare {declared} bytes, over {limits.decompressed_bytes}",
                )
            total = 0
            for member in members:  # declared sizes can lie: count what really inflates
                with archive.open(member) as stream:
                    while chunk := stream.read(_CHUNK):
                        total += len(chunk)
                        if total > limits.decompressed_bytes:
                            raise failure("input-too-large", "3MF inflates past its byte limit")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError) as exc:
        raise failure("malformed-model", f"3MF archive is damaged: {exc}"[:300]) from None
