"""Containerfiles, compose.yaml and the Kustomize bases agree with the workers' packages.

The bases render with ``kubectl kustomize`` where kubectl is installed; a small renderer with
the same merge rules for the fields used here (resources, namespace, labels, images, strategic
merge patches with containers merged by name, JSON 6902 ``replace`` patches on a target) renders
them everywhere, and is held to kubectl's output where both exist.
"""

from __future__ import annotations

import copy
import importlib
import json
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from accord.dev.deploy import NODE_BASE, PARENT_MEMORY, PYTHON_BASE
from accord.dev.repo import read_catalog, read_layout

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "deploy" / "overlays" / "example"
MIB = 1 << 20


def _yaml() -> YAML:
    return YAML(typ="safe", pure=True)


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in _yaml().load_all(path.read_text(encoding="utf-8")) if d]


def _merge(base: Any, patch: Any, key: str = "") -> Any:
    """Strategic merge for the fields used: maps merge, ``containers`` merge by ``name``."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = _merge(base[k], v, k) if k in base else copy.deepcopy(v)
        return out
    if key in {"containers", "volumes", "env", "volumeMounts"} and isinstance(base, list):
        merged = [dict(item) for item in base]
        for item in patch:
            found = next((m for m in merged if m.get("name") == item.get("name")), None)
            if found is None:
                merged.append(copy.deepcopy(item))
            else:
                merged[merged.index(found)] = _merge(found, item)
        return merged
    return copy.deepcopy(patch)


def _selected(doc: dict[str, Any], target: dict[str, Any]) -> bool:
    if "kind" in target and doc["kind"] != target["kind"]:
        return False
    if "name" in target and doc["metadata"]["name"] != target["name"]:
        return False
    for pair in filter(None, target.get("labelSelector", "").split(",")):
        k, _, v = pair.partition("=")
        if doc["metadata"].get("labels", {}).get(k) != v:
            return False
    return True


def render(folder: Path) -> list[dict[str, Any]]:
    """``kustomize build folder`` for the fields and transformers this repository uses."""
    spec = _yaml().load((folder / "kustomization.yaml").read_text(encoding="utf-8"))
    docs: list[dict[str, Any]] = []
    for resource in spec.get("resources", []):
        path = (folder / resource).resolve()
        docs += render(path) if path.is_dir() else _docs(path)
    for patch in spec.get("patches", []):
        if "path" in patch:
            for piece in _docs(folder / patch["path"]):
                target = {"kind": piece["kind"], "name": piece["metadata"]["name"]}
                docs = [_merge(d, piece) if _selected(d, target) else d for d in docs]
        else:
            for op in _yaml().load(patch["patch"]):
                assert op["op"] == "replace", op
                for d in docs:
                    if _selected(d, patch["target"]):
                        node = d
                        *parents, last = op["path"].strip("/").split("/")
                        for part in parents:
                            node = node[part]
                        node[last] = op["value"]
    for image in spec.get("images", []):
        for d in docs:
            for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                name, _, tag = c["image"].partition(":")
                if name == image["name"]:
                    c["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"
    for label in spec.get("labels", []):
        for d in docs:
            d["metadata"].setdefault("labels", {}).update(label["pairs"])
    if "namespace" in spec:
        for d in docs:
            d["metadata"]["namespace"] = spec["namespace"]
    return docs


@cache
def kubectl_render(folder: Path) -> list[dict[str, Any]] | None:
    if shutil.which("kubectl") is None:
        return None
    done = subprocess.run(
        ["kubectl", "kustomize", str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in _yaml().load_all(done.stdout) if d]


def rendered(folder: Path) -> list[dict[str, Any]]:
    return kubectl_render(folder) or render(folder)


def _by_kind(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def _quantity(text: str | int) -> int:
    text = str(text)
    for suffix, factor in (("Gi", 1 << 30), ("Mi", MIB), ("Ki", 1 << 10)):
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * factor
    return int(text)


@cache
def deployed() -> list[Any]:
    return [p for p in read_layout(ROOT).workers if p.containerfile]


def test_every_containerfile_pins_its_base_by_digest_and_runs_as_a_numeric_non_root_user() -> None:
    files = [ROOT / "Containerfile", *sorted((ROOT / "workers").glob("*/Containerfile"))]
    assert len(files) == 6
    for path in files:
        text = path.read_text(encoding="utf-8")
        bases = re.findall(r"^FROM\s+(\S+)", text, flags=re.MULTILINE)
        assert bases and all(b in {PYTHON_BASE, NODE_BASE} for b in bases), (path, bases)
        assert all(re.search(r"@sha256:[0-9a-f]{64}$", b) for b in bases), path
        users = re.findall(r"^USER\s+(\S+)", text, flags=re.MULTILINE)
        assert users and users[-1].isdigit() and users[-1] != "0", (path, users)
        # built from the repository root: every COPY source exists there
        for source in re.findall(r"^COPY\s+(?!--from)(.+?)\s+\S+$", text, flags=re.MULTILINE):
            for part in source.split():
                assert (ROOT / part).exists(), (path, part)


def test_the_kustomize_bases_agree_with_the_packages_and_the_published_digests() -> None:
    catalog = read_catalog(ROOT)
    index = json.loads((ROOT / "schemas" / "published" / "index.json").read_text())
    published = {f"{c['name']}@{c['version']}": c["digest"] for c in index["contracts"]}
    assert {p.name for p in deployed()} == {
        "marketplace-etsy",
        "metadata-extract",
        "metadata-extract-ts",
        "semantic-analyse",
        "thumbnail-render",
    }
    for package in deployed():
        docs = _by_kind(rendered(ROOT / package.path / "k8s"))
        deployment = docs[("Deployment", package.image)]
        configmap = docs[("ConfigMap", package.image)]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["image"] == f"{package.image}:{package.version}"
        user = re.findall(
            r"^USER\s+(\d+)",
            (ROOT / package.path / "Containerfile").read_text(),
            flags=re.MULTILINE,
        )[-1]
        assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(user)
        capabilities = [catalog.capability(c) for c in package.capabilities]
        assert capabilities and all(c is not None for c in capabilities), package.name
        assert configmap["data"]["capabilities"].split() == list(package.capabilities)
        wanted = set()
        for capability in capabilities:
            assert capability is not None
            wanted |= {str(capability.ref), str(capability.request), str(capability.result)}
        assert json.loads(configmap["data"]["contracts.json"]) == {r: published[r] for r in wanted}
        sandbox = max(c.limits.memory_bytes or 0 for c in capabilities if c is not None)
        limits = container["resources"]["limits"]
        assert _quantity(limits["memory"]) == sandbox + PARENT_MEMORY, package.name
        if package.language == "python":
            handler = importlib.import_module(f"{package.distribution.replace('-', '_')}.handler")
            assert tuple(handler.worker.bindings) == package.capabilities
            if hasattr(handler, "LIMITS"):
                assert handler.LIMITS.memory_bytes == sandbox, package.name


def test_the_example_overlay_retags_patches_and_keeps_the_limits() -> None:
    docs = _by_kind(rendered(OVERLAY))
    for package in deployed():
        deployment = docs[("Deployment", package.image)]
        assert deployment["metadata"]["namespace"] == "accord-example"
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["image"] == f"ghcr.io/example/{package.image}:{package.version}"
        base = _by_kind(rendered(ROOT / package.path / "k8s"))[("Deployment", package.image)]
        assert (
            container["resources"]["limits"]
            == (base["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"])
        )
        transport = docs[("ConfigMap", package.image)]["data"]["ACCORD_TRANSPORT"]
        assert transport == "bullmq://redis.accord-example.svc:6379/1"
    thumbs = docs[("Deployment", "accord-worker-thumbnail-render")]
    assert thumbs["spec"]["replicas"] == 3
    requests = thumbs["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests == {"cpu": "1", "memory": "256Mi"}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_the_small_renderer_agrees_with_kubectl_kustomize() -> None:
    for folder in [OVERLAY, *(ROOT / p.path / "k8s" for p in deployed())]:
        ours = sorted(render(folder), key=lambda d: (d["kind"], d["metadata"]["name"]))
        theirs = sorted(
            kubectl_render(folder) or [], key=lambda d: (d["kind"], d["metadata"]["name"])
        )
        assert ours == theirs, folder


def test_compose_builds_every_worker_from_the_repository_root() -> None:
    compose = _yaml().load((ROOT / "compose.yaml").read_text(encoding="utf-8"))
    services = compose["services"]
    redis = services["redis"]["command"]
    assert redis[redis.index("--maxmemory-policy") + 1] == "noeviction"
    assert redis[redis.index("--appendonly") + 1] == "yes"
    assert {"rabbitmq", "engine", "api"} <= set(services)
    for name in ("engine", "api"):
        assert services[name]["build"] == {"context": ".", "dockerfile": "Containerfile"}
    transports = set()
    for package in deployed():
        service = services[package.name]
        assert service["build"] == {"context": ".", "dockerfile": f"{package.path}/Containerfile"}
        assert service["image"] == f"{package.image}:{package.version}"
        transports.add(service["environment"]["ACCORD_TRANSPORT"])
    transports |= {services[n]["environment"]["ACCORD_TRANSPORT"] for n in ("engine", "api")}
    assert len(transports) == 1  # the engine and every worker on the same transport
    for service in services.values():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), port
