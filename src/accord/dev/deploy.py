"""Deployment texts for a worker (pure): its Kustomize base and the pinned base images.

The base (``workers/<name>/k8s/``) is a Deployment, a ConfigMap and a ``kustomization.yaml``:

- the image is the package's (``accord-worker-<name>:<version>``), retagged by overlays;
- the ConfigMap carries the transport URL and ``contracts.json``: the published digest of each
  capability the worker binds and of its request and result contracts, so a deployed worker and
  the engine it serves can be compared with the registry (``accord contracts``);
- the container's memory limit is the sandbox's (the capability contract's ``memoryBytes``) plus
  :data:`PARENT_MEMORY` for the worker process itself, so a handler over its limit fails as the
  classified ``memory-limit`` before the kernel's OOM killer ends the pod; ephemeral storage
  holds one input and its decompressed copy (``3 × inputBytes``);
- the pod runs as the image's numeric non-root user, read-only root file system, no privilege
  escalation, every capability dropped.

The Worker SDK has no health endpoint yet, so the base declares no HTTP probes (docs/monorepo.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from accord.contracts.model import CapabilityContract
from accord.dev.layout import Package

__all__ = [
    "NODE_BASE",
    "PARENT_MEMORY",
    "PYTHON_BASE",
    "contract_digests",
    "k8s_base",
    "memory_limit",
]

# refresh both as docs/monorepo.md says (`skopeo inspect`); every Containerfile uses these
PYTHON_BASE = (
    "docker.io/library/python:3.11-slim"
    "@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7"
)
NODE_BASE = (
    "docker.io/library/node:20-slim"
    "@sha256:1e85773c98c31d4fe5b545e4cb17379e617b348832fb3738b22a08f68dec30f3"
)
MIB = 1 << 20
PARENT_MEMORY = 512 * MIB
DEFAULT_TRANSPORT = "bullmq://redis:6379/1"
USER_ID = {"python": 10001, "typescript": 1000}


def memory_limit(capabilities: Sequence[CapabilityContract]) -> int:
    """Bytes: the largest sandbox limit of ``capabilities`` plus the worker process's share."""
    sandbox = max((c.limits.memory_bytes or 0 for c in capabilities), default=0)
    return sandbox + PARENT_MEMORY


def storage_limit(capabilities: Sequence[CapabilityContract]) -> int | None:
    largest = max((c.limits.input_bytes or 0 for c in capabilities), default=0)
    return 3 * largest if largest else None


def contract_digests(
    capabilities: Sequence[CapabilityContract], digests: Mapping[str, str]
) -> dict[str, str]:
    """``ref -> digest`` for each capability and its request and result contracts."""
    refs: set[str] = set()
    for capability in capabilities:
        refs |= {str(capability.ref), str(capability.request), str(capability.result)}
    return {ref: digests[ref] for ref in sorted(refs) if ref in digests}


def _mi(value: int) -> str:
    return f"{value // MIB}Mi" if value % MIB == 0 else str(value)


def k8s_base(
    package: Package, capabilities: Sequence[CapabilityContract], digests: Mapping[str, str]
) -> dict[str, str]:
    """The files of ``workers/<name>/k8s/``, by name."""
    name = package.image
    contracts = json.dumps(contract_digests(capabilities, digests), indent=2, sort_keys=True)
    limits = [f"              memory: {_mi(memory_limit(capabilities))}\n"]
    storage = storage_limit(capabilities)
    if storage is not None:
        limits.append(f"              ephemeral-storage: {_mi(storage)}\n")
    queues = ", ".join(sorted({c.queue for c in capabilities if c.queue}))
    configmap = (
        "apiVersion: v1\n"
        "kind: ConfigMap\n"
        "metadata:\n"
        f"  name: {name}\n"
        "data:\n"
        f"  ACCORD_TRANSPORT: {DEFAULT_TRANSPORT}\n"
        f"  capabilities: {' '.join(c.name + '@' + str(c.version) for c in capabilities)}\n"
        f"  queues: {queues}\n"
        "  contracts.json: |\n" + "".join(f"    {line}\n" for line in contracts.splitlines())
    )
    deployment = (
        "apiVersion: apps/v1\n"
        "kind: Deployment\n"
        "metadata:\n"
        f"  name: {name}\n"
        "spec:\n"
        "  replicas: 1\n"
        "  selector:\n"
        "    matchLabels:\n"
        f"      app.kubernetes.io/name: {name}\n"
        "  template:\n"
        "    metadata:\n"
        "      labels:\n"
        f"        app.kubernetes.io/name: {name}\n"
        "    spec:\n"
        "      securityContext:\n"
        "        runAsNonRoot: true\n"
        f"        runAsUser: {USER_ID[package.language]}\n"
        "      containers:\n"
        "        - name: worker\n"
        f"          image: {name}:{package.version}\n"
        '          args: ["--transport", "$(ACCORD_TRANSPORT)"]\n'
        "          env:\n"
        "            - name: ACCORD_TRANSPORT\n"
        "              valueFrom:\n"
        "                configMapKeyRef:\n"
        f"                  name: {name}\n"
        "                  key: ACCORD_TRANSPORT\n"
        "          resources:\n"
        "            requests:\n"
        "              cpu: 100m\n"
        "              memory: 256Mi\n"
        "            limits:\n"
        "              cpu: '1'\n" + "".join(limits) + "          securityContext:\n"
        "            allowPrivilegeEscalation: false\n"
        "            readOnlyRootFilesystem: true\n"
        "            capabilities:\n"
        "              drop: [ALL]\n"
        "          volumeMounts:\n"
        "            - name: contracts\n"
        "              mountPath: /etc/accord\n"
        "              readOnly: true\n"
        "            - name: state\n"
        "              mountPath: /app/.accord\n"
        "            - name: tmp\n"
        "              mountPath: /tmp\n"
        "      volumes:\n"
        "        - name: contracts\n"
        "          configMap:\n"
        f"            name: {name}\n"
        "        - name: state\n"
        "          emptyDir: {}\n"
        "        - name: tmp\n"
        "          emptyDir: {}\n"
    )
    kustomization = (
        "# The worker's Kustomize base (docs/monorepo.md); overlays retag the image and patch.\n"
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        "labels:\n"
        "  - pairs:\n"
        "      app.kubernetes.io/part-of: accord\n"
        f"      app.kubernetes.io/version: {package.version}\n"
        "resources:\n"
        "  - deployment.yaml\n"
        "  - configmap.yaml\n"
    )
    return {
        "kustomization.yaml": kustomization,
        "deployment.yaml": deployment,
        "configmap.yaml": configmap,
    }
