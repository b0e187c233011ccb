"""The one-stage workflow the redaction and sealing tests run: its context contract marks
``storageConnectionRef`` sensitive, and an input binding feeds it to the worker's request."""

from __future__ import annotations

from pathlib import Path

from accord.cli.workflow import compile_file
from accord.contracts.catalog import Catalog
from accord.workflow.plan import Plan

WORKFLOW = """\
name: {name}
version: "1.0.0"
entry: extract
context: model-ingest-context@1
stages:
  - name: extract
    type: worker
    queue: metadata
    worker: metadata.extract@2
    input:
      modelId: "${{context.modelId}}"
      storageConnectionRef: "${{context.storageConnectionRef}}"
    retry: {{max_attempts: 3, initial_backoff_ms: 10, max_backoff_ms: 20}}
    on_success: completed
    on_failure: failed
terminals: [completed, failed]
"""


def compiled(tmp_path: Path, catalog: Catalog, name: str) -> Plan:
    """The workflow under ``name``, compiled from a file in ``tmp_path``."""
    source = tmp_path / f"{name}.yaml"
    source.write_text(WORKFLOW.format(name=name))
    return compile_file(source, catalog).unwrap()
