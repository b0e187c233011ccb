"""Rendering: every stage and edge appears, with one distinct style per edge kind."""

from __future__ import annotations

import re

from hypothesis import given, settings

from accord.contracts.catalog import Catalog
from accord.testing.strategies import synthetic_catalog, valid_workflows
from accord.workflow.compiler import compile_definition, compile_workflow
from accord.workflow.plan import DecisionStage, ForkStage, JoinStage, TaskStage
from accord.workflow.render import to_dot, to_mermaid


def test_example_mermaid_distinguishes_edge_kinds(catalog: Catalog, example_text: str) -> None:
    text = to_mermaid(compile_workflow(example_text, "x.yaml", catalog).unwrap())
    assert text.startswith("flowchart TD\n")
    assert 's1{"cache-route<br/>decision"}' in text
    assert "s0 --> s1" in text  # success
    assert 's0 -.->|"failure"| t_failed' in text  # failure
    assert 's1 ==>|"true"| s2' in text  # decision branch
    assert "#quot;cache-lookup#quot;" in text  # quotes in expressions are escaped
    assert 's3 --o|"fork"| s4' in text and 's4 --o|"join"| s6' in text  # fork / join


@settings(max_examples=25, deadline=None)
@given(valid_workflows(max_segments=5))
def test_every_edge_is_drawn_once(doc: dict[str, object]) -> None:
    plan = compile_definition(doc, synthetic_catalog()).unwrap()
    expected = 0
    for s in plan.stages:
        if isinstance(s, TaskStage | JoinStage):
            expected += 2
        elif isinstance(s, DecisionStage):
            expected += len(s.branches) + 1
        elif isinstance(s, ForkStage):
            expected += len(s.branches)
    mermaid = to_mermaid(plan)
    assert len(re.findall(r"^  \S+ (-->|-\.->|==>|--o)", mermaid, re.M)) == expected
    assert to_dot(plan).count(" -> ") == expected
