"""The generated regions of the protocol document: tables from contracts, staleness, prose kept."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from accord.contracts.catalog import Catalog
from accord.contracts.dsl import parse_text as load_text
from accord.contracts.model import CapabilityContract, MessageContract
from accord.contracts.protocol_doc import (
    DocumentError,
    contract_table,
    field_rows,
    find_regions,
    render_document,
)
from accord.contracts.sources import lint_paths

REPO = Path(__file__).resolve().parents[3]

SAMPLE = """
kind: message
name: sample-request
wireVersion: 2
owner: platform
description: A request | with a pipe.
maxBytes: 4096
reserved: [oldField]
payload:
  modelId:
    type: string
    required: true
    pattern: "^[a-z]+|[0-9]+$"
    maxLength: 64
    description: The model.
  secret:  {type: string, sensitive: true, nullable: true, description: "Two
    lines."}
  mode:    {type: string, enum: [fast, slow], default: fast}
  size:    {type: integer, minimum: 1, maximum: 10, unit: px}
  ref:
    type: object
    fields:
      digest: {type: string, required: true, format: date-time}
  views:
    type: array
    minItems: 1
    maxItems: 8
    items:
      type: object
      fields:
        angle: {type: number, exclusiveMinimum: 0}
  tags:
    type: array
    items: {type: string, maxLength: 16}
  extra: {type: object}
"""


def _sample() -> MessageContract:
    contract = load_text(SAMPLE, "sample.yaml")
    assert isinstance(contract, MessageContract)
    return contract


def _doc(*names: str) -> str:
    parts = ["# Title\n\nProse before | with `code`.\n\n"]
    for name in names:
        parts.append(
            f"<!-- generated: {name} -->\nold table\n<!-- end generated -->\n\nMore prose.\n"
        )
    return "".join(parts)


def test_every_field_is_a_row_nested_paths_dotted_and_array_items_bracketed() -> None:
    rows = {r.path: r for r in field_rows(_sample())}
    assert list(rows) == [
        "modelId", "secret", "mode", "size", "ref", "ref.digest",
        "views", "views[].angle", "tags", "tags[]", "extra",
    ]  # fmt: skip
    assert rows["modelId"].required and not rows["secret"].required
    assert rows["modelId"].constraints == "pattern `^[a-z]+|[0-9]+$`; maxLength 64"
    assert rows["secret"].sensitive and rows["secret"].type == "string or null"
    assert rows["mode"].constraints == "one of `fast`, `slow`; default `fast`"
    assert rows["size"].constraints == "minimum 1; maximum 10; unit px"
    assert rows["ref.digest"].required and rows["ref.digest"].constraints == "format date-time"
    assert rows["views"].constraints == "minItems 1; maxItems 8"
    assert rows["views[].angle"].constraints == "exclusiveMinimum 0"
    assert rows["tags[]"].type == "string" and rows["tags[]"].constraints == "maxLength 16"
    assert rows["extra"].type == "object (any members)"


def test_the_table_is_markdown_with_pipes_escaped_and_one_line_cells() -> None:
    table = contract_table(_sample())
    lines = table.splitlines()
    assert lines[0] == (
        "**`sample-request@2`** (owner `platform`, active, at most 4096 bytes): "
        "A request | with a pipe."
    )
    assert lines[2] == "| field | type | required | constraints | sensitive | description |"
    assert (
        "| `modelId` | string | yes | pattern `^[a-z]+\\|[0-9]+$`; maxLength 64 |  | The model. |"
        in lines
    )
    assert "| `secret` | string or null |  |  | yes | Two lines. |" in lines
    assert lines[-1] == "Reserved, never to be reused: `oldField`."
    for line in lines[2:-2]:  # every row has the six cells of the header (escaped pipes aside)
        assert line.replace("\\|", "").count("|") == 7, line


def test_regions_are_rendered_and_the_prose_is_left_byte_for_byte() -> None:
    catalog = Catalog([_sample()])
    text = _doc("sample-request@2")
    rendered = render_document(text, catalog)
    assert rendered.regions == ("sample-request@2",) and rendered.stale == ("sample-request@2",)
    before, _, rest = rendered.text.partition("<!-- generated: sample-request@2 -->\n")
    assert before == "# Title\n\nProse before | with `code`.\n\n"
    body, _, after = rest.partition("<!-- end generated -->")
    assert body == contract_table(_sample())
    assert after == "\n\nMore prose.\n"
    again = render_document(rendered.text, catalog)  # fresh now: nothing to change
    assert again.ok and again.stale == () and again.text == rendered.text


def test_a_changed_contract_makes_exactly_its_region_stale() -> None:
    progress = load_text(
        "kind: message\nname: progress\nwireVersion: 1\nowner: platform\n"
        "payload:\n  percent: {type: number, required: true}\n",
        "progress.yaml",
    )
    catalog = Catalog([_sample(), progress])
    fresh = render_document(_doc("sample-request@2", "progress@1"), catalog).text
    changed = load_text(SAMPLE.replace("maxLength: 64", "maxLength: 65"), "sample.yaml")
    result = render_document(fresh, Catalog([changed, progress]))
    assert result.stale == ("sample-request@2",)
    assert "maxLength 65" in result.text and "maxLength 64" not in result.text


def test_the_capabilities_region_lists_worker_queues_and_contracts() -> None:
    worker = load_text(
        "kind: worker\nname: sample.work\nversion: 3\nowner: platform\nqueue: work-queue\n"
        "request: sample-request@2\nresult: sample-request@2\nerrors: [too-big]\n"
        "limits: {timeMs: 1000}\n",
        "work.yaml",
    )
    action = load_text(
        "kind: action\nname: sample.act\nversion: 1\nowner: platform\n"
        "request: sample-request@2\nresult: sample-request@2\n",
        "act.yaml",
    )
    assert isinstance(worker, CapabilityContract) and isinstance(action, CapabilityContract)
    text = render_document(_doc("capabilities"), Catalog([_sample(), worker, action])).text
    row = (
        "| `sample.work@3` | active | `work-queue` | `sample-request@2` | `sample-request@2` "
        "| `too-big` | 1000 ms |"
    )
    assert row in text.splitlines()
    assert "sample.act" not in text  # the engine runs actions itself: no queue to serve


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("<!-- generated: sample-request@2 -->\nno end\n", "has no <!-- end generated -->"),
        ("text\n<!-- end generated -->\n", "without a region it ends"),
        (
            "<!-- generated: nothing@1 -->\n<!-- end generated -->\n",
            "no message contract nothing@1",
        ),
        ("<!-- generated: Bad Name -->\n<!-- end generated -->\n", "without a region it ends"),
        ("<!-- generated: bad_name -->\n<!-- end generated -->\n", "not a message contract"),
    ],
)
def test_a_document_that_cannot_be_rendered_is_refused_naming_the_region(
    text: str, reason: str
) -> None:
    with pytest.raises(DocumentError, match=re.escape(reason)):
        render_document(text, Catalog([_sample()]))


def test_the_protocol_document_is_fresh_against_the_repository_contracts() -> None:
    contracts, diagnostics = lint_paths([REPO / "schemas" / "contracts"])
    assert not [d for d in diagnostics if d.severity == "error"]
    text = (REPO / "docs" / "protocol.md").read_text(encoding="utf-8")
    regions = [r.name for r in find_regions(text)]
    assert {"envelope@2", "capabilities"} <= set(regions)
    rendered = render_document(text, Catalog(contracts))
    assert rendered.stale == (), "run `accord contracts docs` to regenerate docs/protocol.md"
