"""Invalid definitions: each breaks exactly one rule and is refused with that rule's code.

Every case edits a valid definition (the model-ingest example, or its governed variant with a
context contract and a run deadline). The line the error must point at carries a ``#!`` marker;
the test asserts the code, that line, the stage name, and that no *other* code is reported —
so each case really violates one rule only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from accord.contracts.catalog import Catalog
from accord.errors import Diagnostic
from accord.workflow.compiler import compile_workflow

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "workflows"
BASES = {
    "example": (GOLDEN / "model-ingest.yaml").read_text(encoding="utf-8"),
    "governed": (GOLDEN / "model-ingest-governed.yaml").read_text(encoding="utf-8"),
}

CACHE_LOOKUP_ROUTES = "    on_success: cache-route\n    on_failure: failed\n"
RENDER_INPUT = '    worker: thumbnail.render@3\n    input: { modelId: "${context.modelId}" }\n'
RENDER_DEADLINE = "    execution_deadline_ms: 300000\n"
PUBLISH_INPUT = '    action: catalogue.publish@2\n    input: { modelId: "${context.modelId}" }\n'
HIT_BRANCH = "      - when: 'stages[\"cache-lookup\"].result.hit == true'\n"
FALLBACK = '      - when: "true" # required fallback\n        next: render-thumbnail\n'
FORK_BRANCHES = "    branches: [semantic-analysis, technical-metadata]\n"
JOIN_REQUIRED = "    required: [semantic-analysis, technical-metadata]\n"
TECH_ROUTE = '    worker: metadata.extract@2\n    input: { modelId: "${context.modelId}" }\n    on_success: derive-join\n'  # noqa: E501
SEM_ROUTE = '    worker: semantic.analyse@4\n    input: { modelId: "${context.modelId}" }\n    on_success: derive-join\n'  # noqa: E501
JOIN_BLOCK = (
    "  - name: derive-join\n    type: join\n    required: [semantic-analysis, technical-metadata]\n"
    "    acceptable_terminal_states: [completed]\n    on_success: publish\n    on_failure: failed\n"
)
ORPHAN = (
    "  - name: orphan #!\n    type: action\n    action: cache.lookup@1\n"
    '    input: { modelId: "${context.modelId}" }\n    on_success: completed\n'
    "    on_failure: failed\n"
)
G_RENDER = '      modelId: "${context.modelId}"\n      previewType: inspection\n'
G_PUBLISH = '    input: { modelId: "${context.modelId}", visibility: unlisted }\n'


@dataclass(frozen=True)
class Case:
    id: str
    edits: list[tuple[str, str]]
    code: str
    stage: str
    base: str = "example"


def _append_stage(stage_text: str) -> tuple[str, str]:
    return ("terminal_policy:\n", stage_text + "terminal_policy:\n")


CASES = [
    # --- YAML and layer 1: schema and admission bounds -------------------------------------
    Case(
        "yaml-syntax", [("    type: decision\n", "    type: decision: bad #!\n")], "yaml-syntax", ""
    ),
    Case(
        "yaml-duplicate-key",
        [(CACHE_LOOKUP_ROUTES, CACHE_LOOKUP_ROUTES + "    on_failure: completed #!\n")],
        "yaml-duplicate-key",
        "",
    ),
    Case(
        "missing-field",
        [
            ("    on_success: cache-route\n", ""),
            ("  - name: cache-lookup\n", "  - name: cache-lookup #!\n"),
        ],
        "schema-missing-field",
        "cache-lookup",
    ),
    Case(
        "unknown-field",
        [(RENDER_DEADLINE, RENDER_DEADLINE + "    retries: 3 #!\n")],
        "schema-unknown-field",
        "render-thumbnail",
    ),
    Case(
        "unknown-stage-type",
        [("    type: decision\n", "    type: choice #!\n")],
        "schema-enum",
        "cache-route",
    ),
    Case(
        "wrong-type",
        [(RENDER_DEADLINE, '    execution_deadline_ms: "300s" #!\n')],
        "schema-type",
        "render-thumbnail",
    ),
    Case(
        "retry-not-mapping",
        [(RENDER_DEADLINE, RENDER_DEADLINE + "    retry: 3 #!\n")],
        "schema-type",
        "render-thumbnail",
    ),
    Case(
        "retry-bound",
        [(RENDER_DEADLINE, RENDER_DEADLINE + "    retry: { max_attempts: 50 } #!\n")],
        "schema-bound",
        "render-thumbnail",
    ),
    Case(
        "backoff-order",
        [
            (
                RENDER_DEADLINE,
                RENDER_DEADLINE
                + "    retry: { initial_backoff_ms: 5000, max_backoff_ms: 10 } #!\n",
            )
        ],
        "schema-bound",
        "render-thumbnail",
    ),
    Case(
        "heartbeat-bound",
        [
            (
                RENDER_DEADLINE,
                "    timeouts: { execution_deadline_ms: 1000, heartbeat_timeout_ms: 5000 } #!\n",
            )
        ],
        "schema-bound",
        "render-thumbnail",
    ),
    Case(
        "jitter-bound",
        [(RENDER_DEADLINE, RENDER_DEADLINE + "    retry: { jitter: 2 } #!\n")],
        "schema-bound",
        "render-thumbnail",
    ),
    Case(
        "deadline-bound",
        [('version: "2.3.0"\n', 'version: "2.3.0"\ndeadline_ms: 0 #!\n')],
        "schema-bound",
        "",
    ),
    Case(
        "duplicate-deadline",
        [
            (RENDER_DEADLINE, RENDER_DEADLINE + "    timeouts: { execution_deadline_ms: 1000 }\n"),
            ("    execution_deadline_ms: 300000\n", "    execution_deadline_ms: 300000 #!\n"),
        ],
        "schema-duplicate-deadline",
        "render-thumbnail",
    ),
    Case(
        "bad-name",
        [_append_stage(ORPHAN), ("  - name: orphan", "  - name: Bad Name!")],
        "schema-name",
        "Bad Name!",
    ),
    Case(
        "bad-capability-ref",
        [("    worker: thumbnail.render@3\n", "    worker: thumbnail.render #!\n")],
        "schema-capability-ref",
        "render-thumbnail",
    ),
    Case(
        "fork-one-branch",
        [(FORK_BRANCHES, "    branches: [semantic-analysis] #!\n")],
        "schema-fan-out",
        "derive-fork",
    ),
    Case(
        "payload-too-large",
        [
            (
                PUBLISH_INPUT,
                "    action: catalogue.publish@2\n"
                '    input: { modelId: "${context.modelId}", title: "' + "t" * 70_000 + '" } #!\n',
            )
        ],
        "schema-payload-too-large",
        "publish",
    ),
    Case(
        "status-enum",
        [('version: "2.3.0"\n', 'version: "2.3.0"\nstatus: draft #!\n')],
        "schema-enum",
        "",
    ),
    Case(
        "branch-state-enum",
        [
            (
                "    acceptable_terminal_states: [completed]\n",
                "    acceptable_terminal_states: [done] #!\n",
            )
        ],
        "schema-enum",
        "derive-join",
    ),
    Case(
        "terminal-enum",
        [("terminals: [completed, failed]\n", "terminals: [completed, failed, aborted] #!\n")],
        "schema-enum",
        "",
    ),
    Case(
        "binding-interpolation",
        [
            (
                RENDER_INPUT,
                "    worker: thumbnail.render@3\n"
                '    input: { modelId: "m-${context.modelId}" } #!\n',
            )
        ],
        "binding-interpolation",
        "render-thumbnail",
    ),
    Case(
        "binding-syntax",
        [
            (
                RENDER_INPUT,
                "    worker: thumbnail.render@3\n"
                '    input: { modelId: "${stages.x.output.y}" } #!\n',
            )
        ],
        "binding-syntax",
        "render-thumbnail",
    ),
    Case(
        "expression-syntax",
        [(HIT_BRANCH, "      - when: 'stages[\"cache-lookup\"].result.hit ==' #!\n")],
        "expression-syntax",
        "cache-route",
    ),
    Case(
        "expression-type",
        [(HIT_BRANCH, "      - when: '1 + 2' #!\n")],
        "expression-type",
        "cache-route",
    ),
    Case(
        "expression-too-large",
        [(HIT_BRANCH, "      - when: '" + "true && " * 140 + "true' #!\n")],
        "expression-too-large",
        "cache-route",
    ),
    Case(
        "expression-too-costly",
        [(HIT_BRANCH, "      - when: '" + "true&&" * 130 + "true' #!\n")],
        "expression-too-costly",
        "cache-route",
    ),
    Case(
        "expression-comprehension",
        [(HIT_BRANCH, "      - when: '[1].all(x, x > 0)' #!\n")],
        "expression-comprehension",
        "cache-route",
    ),
    # --- layer 2: graph semantics ------------------------------------------------------------
    Case(
        "duplicate-stage",
        [_append_stage(ORPHAN.replace("orphan #!", "publish #!"))],
        "graph-duplicate-stage",
        "publish",
    ),
    Case(
        "terminal-name",
        [_append_stage(ORPHAN.replace("orphan #!", "completed #!"))],
        "graph-terminal-name",
        "completed",
    ),
    Case(
        "unknown-entry",
        [("entry: cache-lookup\n", "entry: cache-lookpu #!\n")],
        "graph-unknown-entry",
        "",
    ),
    Case(
        "unknown-route",
        [("    on_success: cache-route\n", "    on_success: cache-rout #!\n")],
        "graph-unknown-target",
        "cache-lookup",
    ),
    Case(
        "unknown-decision-next",
        [("        next: publish\n", "        next: publsh #!\n")],
        "graph-unknown-target",
        "cache-route",
    ),
    Case(
        "unknown-evaluation-route",
        [("    on_evaluation_error: failed\n", "    on_evaluation_error: fail #!\n")],
        "graph-unknown-target",
        "cache-route",
    ),
    Case(
        "unknown-fork-branch",
        [(FORK_BRANCHES, "    branches: [semantic-analysis, technical-metadat] #!\n")],
        "graph-unknown-target",
        "derive-fork",
    ),
    Case(
        "fork-branch-to-terminal",
        [(FORK_BRANCHES, "    branches: [semantic-analysis, completed] #!\n")],
        "graph-unknown-target",
        "derive-fork",
    ),
    Case(
        "unknown-join-required",
        [(JOIN_REQUIRED, "    required: [semantic-analysis, technical-metadat] #!\n")],
        "graph-unknown-target",
        "derive-join",
    ),
    Case(
        "undeclared-terminal",
        [
            ("terminals: [completed, failed]\n", "terminals: [failed]\n"),
            ("    on_success: completed\n", "    on_success: completed #!\n"),
        ],
        "graph-undeclared-terminal",
        "publish",
    ),
    Case(
        "undeclared-finaliser-terminal",
        [
            ("  finaliser_failure_terminal: failed\n", "  finaliser_failure_terminal: aborted\n"),
            ("terminal_policy:\n", "terminal_policy: #!\n"),
        ],
        "graph-undeclared-terminal",
        "",
    ),
    Case(
        "policy-enum",
        [("  late_callbacks: reject-and-record\n", "  late_callbacks: accept #!\n")],
        "schema-enum",
        "",
    ),
    Case(
        "duplicate-required",
        [
            (
                JOIN_REQUIRED,
                "    required: [semantic-analysis, semantic-analysis, technical-metadata] #!\n",
            )
        ],
        "graph-duplicate-reference",
        "derive-join",
    ),
    Case(
        "duplicate-finaliser",
        [
            (
                "finalisers: [audit.run-terminal@1]\n",
                "finalisers: [audit.run-terminal@1, audit.run-terminal@1] #!\n",
            )
        ],
        "graph-duplicate-reference",
        "",
    ),
    Case(
        "fallback-missing",
        [
            (
                FALLBACK,
                "      - when: 'context.modelId != \"\"' #!\n        next: render-thumbnail\n",
            )
        ],
        "graph-decision-fallback-missing",
        "cache-route",
    ),
    Case(
        "fallback-not-last",
        [(HIT_BRANCH, '      - when: "true" #!\n')],
        "graph-decision-fallback-not-last",
        "cache-route",
    ),
    Case(
        "cycle",
        [
            ("    on_success: completed\n", "    on_success: cache-lookup\n"),
            ("  - name: publish\n", "  - name: publish #!\n"),
        ],
        "graph-cycle",
        "publish",
    ),
    Case("unreachable", [_append_stage(ORPHAN)], "graph-unreachable", "orphan"),
    Case(  # forks nest; a nested fork's join must still require exactly its branches
        "nested-fork-join-mismatch",
        [
            (SEM_ROUTE, SEM_ROUTE.replace("derive-join", "inner-fork")),
            _append_stage(
                "  - name: inner-fork\n    type: fork\n    branches: [inner-a, inner-b]\n"
                + "".join(
                    ORPHAN.replace("orphan #!", n).replace("completed", "inner-join")
                    for n in ("inner-a", "inner-b")
                )
                + "  - name: inner-join\n    type: join\n    required: [inner-a] #!\n"
                "    on_success: derive-join\n    on_failure: failed\n"
            ),
        ],
        "graph-join-required-mismatch",
        "inner-join",
    ),
    Case(
        "branch-escape",
        [
            (TECH_ROUTE, TECH_ROUTE.replace("derive-join", "publish")),
            ("  - name: publish\n", "  - name: publish #!\n"),
        ],
        "graph-branch-escape",
        "publish",
    ),
    Case(
        "fork-without-join",
        [
            (TECH_ROUTE, TECH_ROUTE.replace("derive-join", "completed")),
            (SEM_ROUTE, SEM_ROUTE.replace("derive-join", "completed")),
            (JOIN_BLOCK, ""),
            (FORK_BRANCHES, FORK_BRANCHES.replace("\n", " #!\n")),
        ],
        "graph-fork-without-join",
        "derive-fork",
    ),
    Case(
        "fork-multiple-joins",
        [
            (TECH_ROUTE, TECH_ROUTE.replace("derive-join", "other-join")),
            (FORK_BRANCHES, FORK_BRANCHES.replace("\n", " #!\n")),
            _append_stage(JOIN_BLOCK.replace("derive-join", "other-join")),
        ],
        "graph-fork-multiple-joins",
        "derive-fork",
    ),
    Case(
        "join-without-fork",
        [
            (
                "    execution_deadline_ms: 300000\n    on_success: derive-fork\n"
                "    on_failure: failed\n",
                "    execution_deadline_ms: 300000\n"
                "    on_success: derive-fork\n    on_failure: lonely-join\n",
            ),
            _append_stage(
                "  - name: lonely-join\n    type: join\n    required: [render-thumbnail] #!\n"
                "    on_success: completed\n    on_failure: failed\n"
            ),
        ],
        "graph-join-without-fork",
        "lonely-join",
    ),
    Case(
        "join-required-mismatch",
        [(JOIN_REQUIRED, "    required: [semantic-analysis] #!\n")],
        "graph-join-required-mismatch",
        "derive-join",
    ),
    # --- layer 3: contracts and types --------------------------------------------------------
    Case(
        "unknown-capability",
        [("    worker: thumbnail.render@3\n", "    worker: thumbnail.render@9 #!\n")],
        "type-unknown-capability",
        "render-thumbnail",
    ),
    Case(
        "capability-kind",
        [("    worker: thumbnail.render@3\n", "    worker: cache.lookup@1 #!\n")],
        "type-capability-kind",
        "render-thumbnail",
    ),
    Case(
        "finaliser-kind",
        [("finalisers: [audit.run-terminal@1]\n", "finalisers: [thumbnail.render@3] #!\n")],
        "type-capability-kind",
        "",
    ),
    Case(
        "unknown-context-contract",
        [("context: model-ingest-context@1\n", "context: model-ingest-context@7 #!\n")],
        "type-unknown-contract",
        "",
        "governed",
    ),
    Case(
        "cache-not-cacheable",
        [(PUBLISH_INPUT, PUBLISH_INPUT + "    cache: { enabled: true, ttl_ms: 1000 } #!\n")],
        "type-cache-not-cacheable",
        "publish",
    ),
    Case(
        "retry-unknown-error",
        [(RENDER_DEADLINE, RENDER_DEADLINE + "    retry: { retry_on: [cosmic-rays] } #!\n")],
        "type-retry-unknown-error",
        "render-thumbnail",
    ),
    Case(
        "input-missing-field",
        [(RENDER_INPUT, "    worker: thumbnail.render@3\n    input: {} #!\n")],
        "type-input-missing-field",
        "render-thumbnail",
    ),
    Case(
        "input-unknown-field",
        [
            (
                RENDER_INPUT,
                "    worker: thumbnail.render@3\n"
                '    input: { modelId: "${context.modelId}", colour: red } #!\n',
            )
        ],
        "type-input-unknown-field",
        "render-thumbnail",
    ),
    Case(
        "input-type",
        [
            (
                RENDER_INPUT,
                "    worker: thumbnail.render@3\n"
                '    input: { modelId: "${context.modelId}", maxEdge: big } #!\n',
            )
        ],
        "type-input-type",
        "render-thumbnail",
    ),
    Case(
        "binding-missing",
        [(G_RENDER, '      modelId: "${context.modelID}" #!\n      previewType: inspection\n')],
        "type-binding-missing",
        "render-thumbnail",
        "governed",
    ),
    Case(
        "binding-type",
        [(G_RENDER, G_RENDER + '      generate360Views: "${context.modelId}" #!\n')],
        "type-binding-type",
        "render-thumbnail",
        "governed",
    ),
    Case(
        "binding-null",
        [
            (
                G_PUBLISH,
                '    input: { modelId: "${context.modelId}", title: '
                '"${stages[\\"cache-lookup\\"].result.expiresAt}" } #!\n',
            )
        ],
        "type-binding-null",
        "publish",
        "governed",
    ),
    Case(
        "binding-unknown-stage",
        [(G_PUBLISH, '    input: { modelId: "${stages.nope.result.x}" } #!\n')],
        "type-binding-unknown-stage",
        "publish",
        "governed",
    ),
    Case(
        "binding-no-result",
        [(G_PUBLISH, '    input: { modelId: "${stages[\\"cache-route\\"].result.x}" } #!\n')],
        "type-binding-no-result",
        "publish",
        "governed",
    ),
    Case(
        "binding-not-completed",
        [
            (
                G_PUBLISH,
                '    input: { modelId: "${stages[\\"render-thumbnail\\"].result.modelId}" } #!\n',
            )
        ],
        "type-binding-not-completed",
        "publish",
        "governed",
    ),
    Case(
        "expression-unknown-field",
        [(HIT_BRANCH, "      - when: 'stages[\"cache-lookup\"].result.hits == true' #!\n")],
        "type-expression-unknown-field",
        "cache-route",
    ),
    Case(
        "expression-unknown-context-field",
        [
            (
                '      - when: \'stages["cache-lookup"].result.hit'
                ' && has(stages["cache-lookup"].result.cacheKey)\'\n',
                "      - when: 'context.tenant == \"x\"' #!\n",
            )
        ],
        "type-expression-unknown-field",
        "cache-route",
        "governed",
    ),
    Case(
        "expression-unknown-stage",
        [(HIT_BRANCH, "      - when: 'stages[\"nope\"].result.hit == true' #!\n")],
        "type-expression-unknown-stage",
        "cache-route",
    ),
    Case(
        "expression-not-completed",
        [(HIT_BRANCH, '      - when: \'stages["publish"].result.modelId == "x"\' #!\n')],
        "type-expression-not-completed",
        "cache-route",
    ),
    Case(
        "expression-unguarded-optional",
        [(HIT_BRANCH, '      - when: \'stages["cache-lookup"].result.cacheKey == "k"\' #!\n')],
        "type-expression-unguarded-optional",
        "cache-route",
    ),
    # --- layer 4: deadline budget ------------------------------------------------------------
    Case(
        "budget",
        [
            ("deadline_ms: 7200000\n", "deadline_ms: 1800000\n"),
            ("      max_attempts: 3\n", "      max_attempts: 5\n"),
            ("  - name: render-thumbnail\n", "  - name: render-thumbnail #!\n"),
        ],
        "budget-exceeded",
        "render-thumbnail",
        "governed",
    ),
    # --- layer 5: admission ------------------------------------------------------------------
    Case(
        "planned-incomplete",
        [('version: "2.3.0"\n', 'version: "2.3.0"\nstatus: planned #!\nowner: asset-processing\n')],
        "admission-planned-incomplete",
        "",
    ),
]


def _marker_line(text: str) -> int:
    for number, line in enumerate(text.splitlines(), start=1):
        if line.rstrip().endswith("#!"):
            return number
    raise AssertionError("the case has no #! marker")


def _apply(case: Case) -> str:
    text = BASES[case.base]
    for old, new in case.edits:
        assert text.count(old) >= 1, f"{case.id}: edit target not found: {old!r}"
        text = text.replace(old, new, 1)
    return text


def test_there_are_at_least_forty_cases_covering_every_layer() -> None:
    assert len(CASES) >= 40
    prefixes = {c.code.split("-")[0] for c in CASES}
    assert {"schema", "graph", "type", "budget", "admission", "binding", "expression"} <= prefixes


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused_with_code_line_and_stage(case: Case, catalog: Catalog) -> None:
    text = _apply(case)
    result = compile_workflow(text, f"{case.id}.yaml", catalog)
    assert result.plan is None, f"{case.id} compiled"
    errors: list[Diagnostic] = list(result.errors)
    assert {d.code for d in errors} == {case.code}, [str(d) for d in errors]
    line = _marker_line(text)
    hits = [d for d in errors if d.location is not None and d.location.line == line]
    assert hits, f"no {case.code} at line {line}: {[str(d) for d in errors]}"
    assert any(d.stage == case.stage for d in hits), [str(d) for d in hits]
    rendered = str(hits[0])
    assert f"{case.id}.yaml:{line}" in rendered and case.code in rendered
    if case.stage:
        assert repr(case.stage) in rendered


def test_the_same_finaliser_twice_is_refused_like_a_duplicate_fork_branch(
    catalog: Catalog,
) -> None:
    finalisers = "finalisers: [audit.run-terminal@1]\n"
    twice = "finalisers: [audit.run-terminal@1, audit.run-terminal@1]\n"
    text = BASES["example"].replace(finalisers, twice)
    (found,) = compile_workflow(text, "twice.yaml", catalog).errors
    line = text.splitlines().index(twice.rstrip()) + 1
    assert (found.code, found.path, found.stage) == ("graph-duplicate-reference", "finalisers", "")
    assert found.location is not None and found.location.line == line
    assert "finalisers lists 'audit.run-terminal@1' twice" in str(found)
    assert f"twice.yaml:{line}" in str(found)
    # the same style as a fork listing one branch twice
    branches = "    branches: [semantic-analysis, technical-metadata]\n"
    repeated = "    branches: [semantic-analysis, technical-metadata, semantic-analysis]\n"
    fork_text = BASES["example"].replace(branches, repeated)
    (fork,) = compile_workflow(fork_text, "fork.yaml", catalog).errors
    assert (fork.code, fork.path) == ("graph-duplicate-reference", "branches")
