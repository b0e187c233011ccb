"""The worker SDK needs no 3D stack: the model handling lives in the reference workers
(``workers/meshes``), so ``accord.worker`` imports where numpy and trimesh are not installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

HEAVY = ("numpy", "trimesh", "scipy", "matplotlib")

PROBE = textwrap.dedent(
    """
    import importlib, importlib.abc, pkgutil, sys

    HEAVY = {heavy!r}

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in HEAVY:
                raise ImportError(f"{{name}} is blocked (not installed)")
            return None

    sys.meta_path.insert(0, Refuse())
    import accord.worker

    for module in pkgutil.iter_modules(accord.worker.__path__, "accord.worker."):
        importlib.import_module(module.name)
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)
    assert not loaded, loaded
    print("ok", accord.worker.Worker.__name__)
    """
)


def test_the_worker_sdk_imports_without_numpy_or_trimesh() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok Worker"


def test_the_probe_does_refuse_the_3d_stack() -> None:
    """The blocker itself works: importing numpy under it fails."""
    probe = PROBE.format(heavy=HEAVY).replace("import accord.worker\n", "import numpy\n", 1)
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode != 0 and "numpy is blocked" in done.stderr
