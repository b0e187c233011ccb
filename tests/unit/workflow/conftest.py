"""Fixtures for the workflow compiler tests: the real contract catalog and a synthetic one."""

from __future__ import annotations

from pathlib import Path

import pytest

from accord.contracts.catalog import Catalog
from accord.contracts.sources import load_catalog
from accord.testing.strategies import synthetic_catalog

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "tests" / "golden" / "workflows" / "model-ingest.yaml"


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return load_catalog(ROOT / "schemas" / "contracts")


@pytest.fixture(scope="session")
def synthetic() -> Catalog:
    return synthetic_catalog()


@pytest.fixture(scope="session")
def example_text() -> str:
    return EXAMPLE.read_text(encoding="utf-8")
