"""Nested forks in the compiler: a fork on a fork's branch compiles, matched to its own join."""

from __future__ import annotations

from pathlib import Path

from accord.contracts.catalog import Catalog
from accord.workflow.compiler import compile_workflow
from accord.workflow.plan import ForkStage, JoinStage, Plan, TaskStage
from tests.unit.engine.sim import Sim

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "workflows"
TEXT = (GOLDEN / "model-ingest.yaml").read_text(encoding="utf-8")
SEM = "    worker: semantic.analyse@4\n"
SEM_ROUTE = SEM + '    input: { modelId: "${context.modelId}" }\n    on_success: derive-join\n'
FORK = "    branches: [semantic-analysis, technical-metadata]\n"
JOIN = "    required: [semantic-analysis, technical-metadata]\n"


def _inner(route_b: str = "inner-join") -> str:
    task = (
        "  - name: {n}\n    type: worker\n    queue: analysis\n    worker: semantic.analyse@4\n"
        '    input: {{ modelId: "${{context.modelId}}" }}\n    on_success: {to}\n'
        "    on_failure: inner-join\n"
    )
    return (
        "  - name: inner-fork\n    type: fork\n    branches: [view-a, view-b]\n"
        + task.format(n="view-a", to="inner-join")
        + task.format(n="view-b", to=route_b)
        + "  - name: inner-join\n    type: join\n    required: [view-a, view-b]\n"
        "    on_success: semantic-analysis\n    on_failure: failed\n"
    )


def _nested(route_b: str = "inner-join") -> str:
    text = TEXT.replace(FORK, "    branches: [inner-fork, technical-metadata]\n")
    text = text.replace(JOIN, "    required: [inner-fork, technical-metadata]\n")
    return text.replace("terminal_policy:\n", _inner(route_b) + "terminal_policy:\n")


def test_a_fork_inside_a_branch_compiles_with_its_joins_matched(catalog: Catalog) -> None:
    plan = compile_workflow(_nested(), "nested.yaml", catalog).unwrap()
    inner = plan.stage("inner-fork")
    assert isinstance(inner, ForkStage)
    assert (inner.join, inner.fork, inner.branch) == ("inner-join", "derive-fork", "inner-fork")
    join = plan.stage("inner-join")
    assert isinstance(join, JoinStage) and (join.fork, join.branch) == ("inner-fork", "inner-fork")
    view = plan.stage("view-a")
    assert isinstance(view, TaskStage) and (view.fork, view.branch) == ("inner-fork", "view-a")
    sem = plan.stage("semantic-analysis")
    assert isinstance(sem, TaskStage) and (sem.fork, sem.branch) == ("derive-fork", "inner-fork")
    outer = plan.stage("derive-join")
    assert isinstance(outer, JoinStage) and outer.fork == "derive-fork"
    assert Plan.from_json(plan.to_json()) == plan
    sim = Sim(plan)
    sim.start(modelId="m-1")
    assert sim.drain({"cache-lookup": {"hit": False}}).status == "completed"
    inv_arrivals = sim.state.join_arrivals
    assert set(inv_arrivals["derive-join"]) == {"inner-fork", "technical-metadata"}
    assert set(inv_arrivals["inner-join"]) == {"view-a", "view-b"}


def test_an_inner_branch_reaching_the_outer_join_is_refused(catalog: Catalog) -> None:
    text = _nested(route_b="derive-join")
    codes = {d.code for d in compile_workflow(text, "escape.yaml", catalog).errors}
    assert "graph-fork-multiple-joins" in codes, codes


def test_the_fail_run_policy_is_accepted(catalog: Catalog) -> None:
    text = _nested().replace(
        "  fork_branch_failure: request-cancellation-and-fence\n",
        "  fork_branch_failure: fail-run\n",
    )
    plan = compile_workflow(text, "policy.yaml", catalog).unwrap()
    assert plan.terminal_policy.fork_branch_failure == "fail-run"
