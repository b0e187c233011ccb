"""``accord dev new-worker``: the files of a new worker, from its capability's contracts (pure).

A scaffold is a package that passes its own tests from the first minute: the handler binds the
capability, checks nothing the SDK does not already check, and returns the smallest result the
result contract accepts (:func:`accord.contracts.fixture_values.message_of`), echoing the
request's ``modelId`` where both have one; its tests validate a request and the handler's result
against the published contracts. Beside the package: its Containerfile (pinned base, numeric
non-root user, built from the repository root), its Kustomize base and its CI file, which the
caller renders with the rest of the layout (:mod:`accord.dev.ci`).
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Mapping
from typing import Any

from accord.contracts.catalog import Catalog
from accord.contracts.fixture_values import message_of
from accord.contracts.model import CapabilityContract
from accord.dev.deploy import NODE_BASE, PYTHON_BASE, k8s_base
from accord.dev.layout import Language, read_package

__all__ = ["NAME_PATTERN", "ScaffoldError", "scaffold"]

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$")


class ScaffoldError(ValueError):
    """The worker cannot be scaffolded as asked (a bad name, an unknown capability)."""


def _limits(capability: CapabilityContract) -> dict[str, int]:
    limits = capability.limits
    found = {
        "timeMs": limits.time_ms,
        "memoryBytes": limits.memory_bytes,
        "inputBytes": limits.input_bytes,
    }
    return {k: v for k, v in found.items() if v is not None}


def _literal(value: Any, indent: int = 0) -> str:
    """``value`` as Python source in the formatter's style (one item a line, trailing commas)."""
    pad, inner = " " * indent, " " * (indent + 4)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [
            f"{inner}{json.dumps(k)}: {_literal(v, indent + 4)}," for k, v in sorted(value.items())
        ]
        return "{\n" + "\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list):
        if not value:
            return "[]"
        return "[\n" + "\n".join(f"{inner}{_literal(v, indent + 4)}," for v in value) + f"\n{pad}]"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def _wrapped(text: str, prefix: str = "") -> str:
    return textwrap.fill(text, width=100, initial_indent=prefix, subsequent_indent=prefix)


def _python(
    name: str, capability: CapabilityContract, example: dict[str, Any], echo: bool
) -> dict[str, str]:
    module = "accord_worker_" + name.replace("-", "_")
    cap = str(capability.ref)
    summary = (capability.description or cap).strip().split("\n")[0]
    result = '{**RESULT, "modelId": payload["modelId"]}' if echo else "dict(RESULT)"
    intro = _wrapped(
        "Scaffolded by ``accord dev new-worker`` from the capability's published contracts: "
        f"requests are ``{capability.request}``, results ``{capability.result}``. The SDK "
        "validates both; replace the body of :func:`handle` with the work (the placeholder "
        "answers with the smallest result the result contract accepts)."
    )
    handler = f'''"""{_wrapped(f"``{cap}``: {summary}")}

{intro}
"""

from __future__ import annotations

from typing import Any

from accord.worker.sandbox import Limits
from accord.worker.sdk import Context, Worker

__all__ = ["CAPABILITY", "LIMITS", "REQUEST_CONTRACT", "RESULT_CONTRACT", "handle", "worker"]

CAPABILITY = "{cap}"
REQUEST_CONTRACT = "{capability.request}"
RESULT_CONTRACT = "{capability.result}"
# the capability contract's limits
LIMITS = Limits.from_contract(
    {_literal(_limits(capability), 4)}
)
RESULT: dict[str, Any] = {_literal(example)}
worker = Worker("{name}")


@worker.handler(CAPABILITY)
def handle(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Answer one request (``REQUEST_CONTRACT``) with a result (``RESULT_CONTRACT``)."""
    ctx.raise_if_cancelled()
    return {result}
'''
    tests = f'''"""The scaffolded handler: a valid request gets a result its contract accepts."""

from __future__ import annotations

from pathlib import Path

from {module}.handler import (
    CAPABILITY,
    LIMITS,
    REQUEST_CONTRACT,
    RESULT_CONTRACT,
    handle,
    worker,
)

from accord.contracts.fixture_values import message_of
from accord.contracts.sources import load_catalog
from accord.contracts.validate import validate
from accord.worker.sdk import Context

ROOT = Path(__file__).resolve().parents[3]
CATALOG = load_catalog(ROOT / "schemas" / "contracts")


def test_the_worker_binds_its_capability_with_the_contracts_limits() -> None:
    assert list(worker.bindings) == [CAPABILITY]
    capability = CATALOG.capability(CAPABILITY)
    assert capability is not None
    assert (str(capability.request), str(capability.result)) == (REQUEST_CONTRACT, RESULT_CONTRACT)
    if capability.limits.memory_bytes is not None:
        assert LIMITS.memory_bytes == capability.limits.memory_bytes


def test_a_valid_request_gets_a_result_the_result_contract_accepts() -> None:
    request_contract = CATALOG.message(REQUEST_CONTRACT)
    result_contract = CATALOG.message(RESULT_CONTRACT)
    assert request_contract is not None and result_contract is not None
    request = message_of(request_contract.payload, full=False)
    assert validate(request_contract, request).ok
    context = Context("run-1", "stage", 1, "f1", "acme", CAPABILITY, "key-1", {{}})
    checked = validate(result_contract, handle(request, context))
    assert checked.ok, checked.violations
'''
    pyproject = f"""[build-system]
requires = ["hatchling>=1.24"]
build-backend = "hatchling.build"

[project]
name = "accord-worker-{name}"
version = "0.1.0"
description = "Accord worker — {cap}: {summary.rstrip(".")}."
requires-python = ">=3.11"
license = "Apache-2.0"
# accord: the worker SDK and the contract validators
dependencies = [
  "accord",
]

[tool.hatch.build.targets.wheel]
packages = ["src/{module}"]
"""
    containerfile = f'''\
# accord-worker-{name}: build from the repository root so the accord package is in the context:
#   podman build -f workers/{name}/Containerfile -t accord-worker-{name} .
# The base image is pinned by digest (docs/monorepo.md says how to refresh it); the user is
# numeric, so a Kubernetes runAsNonRoot check can verify it.
FROM {PYTHON_BASE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml ./README.md ./
COPY src ./src
# the contract sources `accord worker run` validates requests and results against
COPY schemas/contracts ./schemas/contracts
COPY workers/{name} ./workers/{name}
RUN pip install --no-cache-dir . ./workers/{name} && useradd --system --uid 10001 accord
USER 10001
ENTRYPOINT ["accord", "worker", "run", "{module}.handler:worker"]
'''
    readme = f"""# accord-worker-{name} — `{cap}`

{summary}

Requests are `{capability.request}`, results `{capability.result}`; the handler in
`src/{module}/handler.py` is a placeholder that answers with the smallest valid result.

    pip install -e . -e workers/{name}   # from the repository root
    accord worker run {module}.handler:worker --transport bullmq://127.0.0.1:6379/1
    pytest workers/{name}/tests

Container: `podman build -f workers/{name}/Containerfile .` (from the repository root).
"""
    return {
        "pyproject.toml": pyproject,
        "README.md": readme,
        "Containerfile": containerfile,
        f"src/{module}/__init__.py": f'"""The ``{cap}`` worker."""\n\n'
        f"from {module}.handler import CAPABILITY, handle, worker\n\n"
        '__all__ = ["CAPABILITY", "handle", "worker"]\n',
        f"src/{module}/py.typed": "",
        f"src/{module}/handler.py": handler,
        f"tests/test_{module.removeprefix('accord_worker_')}.py": tests,
    }


def _typescript(
    name: str,
    capability: CapabilityContract,
    example: dict[str, Any],
    request: dict[str, Any],
    echo: bool,
) -> dict[str, str]:
    cap = str(capability.ref)
    summary = (capability.description or cap).strip().split("\n")[0]
    req, res = capability.request, capability.result
    body = "{ ...RESULT, modelId: checked.modelId }" if echo else "{ ...RESULT }"
    intro = _wrapped(
        "Scaffolded by `accord dev new-worker` from the capability's published contracts: "
        f"requests are `{req}`, results `{res}`, both checked with the generated validators. "
        "Replace the body of `handle` with the work (the placeholder answers with the smallest "
        "result the result contract accepts). The job loop on Node BullMQ is the worker's own: "
        "workers/metadata-extract-ts/src/runtime.ts is one to follow.",
        " * ",
    )
    handler = f'''/**
{_wrapped(f"`{cap}`: {summary}", " * ")}
 *
{intro}
 */

import {{ validate, type PathError }} from "@accord/contracts";

export const CAPABILITY = "{cap}";
export const REQUEST_CONTRACT = {{ name: "{req.name}", version: {req.version} }} as const;
export const RESULT_CONTRACT = {{ name: "{res.name}", version: {res.version} }} as const;
/** The capability contract's limits. */
export const LIMITS = {json.dumps(_limits(capability))} as const;

const RESULT: Record<string, unknown> = {json.dumps(example, indent=2, sort_keys=True)};

/** A request its contract refuses; the worker answers it with a terminal failure. */
export class InvalidRequest extends Error {{
  constructor(readonly errors: PathError[]) {{
    const where = errors.map((e) => `${{e.path || "<root>"}}: ${{e.message}}`).join("; ");
    super(`request breaks ${{REQUEST_CONTRACT.name}}@${{REQUEST_CONTRACT.version}}: ${{where}}`);
    this.name = "InvalidRequest";
  }}
}}

/** Answer one `{req}` request with a `{res}` result. */
export function handle(payload: unknown): Record<string, unknown> {{
  const request = validate(REQUEST_CONTRACT.name, REQUEST_CONTRACT.version, payload);
  if (!request.ok) throw new InvalidRequest(request.errors);
  const checked = request.value as Record<string, unknown>;
  return {body};
}}
'''
    main = f"""/**
 * One request as JSON on stdin, its `{res}` result as JSON on stdout (a refused request: the
 * errors on stderr, exit 1). The queue loop is still to be written (see handler.ts).
 */

import {{ readFileSync }} from "node:fs";

import {{ handle, InvalidRequest }} from "./handler";

try {{
  process.stdout.write(JSON.stringify(handle(JSON.parse(readFileSync(0, "utf8")))) + "\\n");
}} catch (error) {{
  process.stderr.write(`${{error instanceof InvalidRequest ? error.message : String(error)}}\\n`);
  process.exitCode = 1;
}}
"""
    test = f'''import assert from "node:assert/strict";
import {{ test }} from "node:test";

import {{ validate }} from "@accord/contracts";

import {{
  CAPABILITY,
  handle,
  InvalidRequest,
  REQUEST_CONTRACT,
  RESULT_CONTRACT,
}} from "../src/handler";

/** The smallest request `{req}` accepts. */
const REQUEST = {json.dumps(request, sort_keys=True)};

test("the worker serves the capability it was scaffolded for", () => {{
  assert.equal(CAPABILITY, "{cap}");
}});

test("a valid request gets a result the result contract accepts", () => {{
  assert.deepEqual(validate(REQUEST_CONTRACT.name, REQUEST_CONTRACT.version, REQUEST).errors, []);
  const result = validate(RESULT_CONTRACT.name, RESULT_CONTRACT.version, handle(REQUEST));
  assert.deepEqual(result.errors, []);
}});

test("a request that breaks its contract is refused", () => {{
  assert.throws(() => handle({{ notAField: true }}), InvalidRequest);
}});
'''
    package = {
        "name": f"@accord/worker-{name}",
        "version": "0.1.0",
        "description": f"{cap}: {summary}",
        "license": "Apache-2.0",
        "private": True,
        "main": "dist/src/main.js",
        "scripts": {"build": "tsc -p tsconfig.json", "test": "node --test dist/test/"},
        "engines": {"node": ">=20"},
        "dependencies": {"@accord/contracts": "file:../../bindings/typescript"},
        "devDependencies": {"@types/node": "^20.14.0", "typescript": "^5.6.3"},
    }
    tsconfig = {
        "compilerOptions": {
            "target": "ES2022",
            "module": "commonjs",
            "moduleResolution": "node",
            "lib": ["ES2022"],
            "types": ["node"],
            "rootDir": ".",
            "outDir": "dist",
            "strict": True,
            "noUncheckedIndexedAccess": True,
            "esModuleInterop": True,
            "skipLibCheck": True,
            "forceConsistentCasingInFileNames": True,
        },
        "include": ["src", "test"],
    }
    containerfile = f"""\
# accord-worker-{name}: build from the repository root, so the bindings are in the context:
#   podman build -f workers/{name}/Containerfile -t accord-worker-{name} .
# The base image is pinned by digest (docs/monorepo.md says how to refresh it); the user is
# numeric, so a Kubernetes runAsNonRoot check can verify it.
FROM {NODE_BASE} AS build
WORKDIR /app
COPY bindings/typescript ./bindings/typescript
COPY workers/{name} ./workers/{name}
RUN cd bindings/typescript && rm -rf dist && npm ci --no-audit --no-fund && npm run build \\
    && npm prune --omit=dev \\
    && cd ../../workers/{name} && rm -rf dist && npm install --no-audit --no-fund \\
    && npm run build && npm test && npm prune --omit=dev

FROM {NODE_BASE}
ENV NODE_ENV=production
WORKDIR /app
COPY --from=build /app/bindings/typescript/package.json ./bindings/typescript/
COPY --from=build /app/bindings/typescript/dist ./bindings/typescript/dist
COPY --from=build /app/bindings/typescript/node_modules ./bindings/typescript/node_modules
COPY --from=build /app/workers/{name}/package.json ./workers/{name}/
COPY --from=build /app/workers/{name}/dist ./workers/{name}/dist
COPY --from=build /app/workers/{name}/node_modules ./workers/{name}/node_modules
USER 1000
ENTRYPOINT ["node", "/app/workers/{name}/dist/src/main.js"]
"""
    readme = f"""# accord-worker-{name} — `{cap}`

{summary}

Requests are `{req}`, results `{res}`; `src/handler.ts` is a placeholder that answers with the
smallest valid result, and `src/main.ts` serves one request from stdin. Build the bindings first
(`make node` at the repository root), then:

    npm install      # once: writes package-lock.json, which CI's `npm ci` needs
    npm run build && npm test

Container: `podman build -f workers/{name}/Containerfile .` (from the repository root).
"""
    return {
        "package.json": json.dumps(package, indent=2) + "\n",
        "tsconfig.json": json.dumps(tsconfig, indent=2) + "\n",
        "README.md": readme,
        "Containerfile": containerfile,
        "src/handler.ts": handler,
        "src/main.ts": main,
        "test/handler.test.ts": test,
    }


def scaffold(
    name: str,
    capability_ref: str,
    language: Language,
    catalog: Catalog,
    digests: Mapping[str, str],
) -> dict[str, str]:
    """Every file of ``workers/<name>/`` (paths relative to it), its ``k8s/`` base included."""
    if not NAME_PATTERN.match(name):
        raise ScaffoldError(
            f"worker name {name!r}: lower-case letters and digits in dash-separated words "
            "(e.g. mesh-repair)"
        )
    capability = catalog.capability(capability_ref)
    if capability is None:
        known = sorted(str(c.ref) for c in catalog.capabilities() if c.kind == "worker")
        raise ScaffoldError(
            f"--capability {capability_ref}: no such capability in schemas/contracts "
            f"(worker capabilities: {', '.join(known)})"
        )
    if capability.kind != "worker":
        raise ScaffoldError(
            f"--capability {capability_ref} is an action: the engine runs it, no worker serves it"
        )
    if str(capability.ref) not in digests:
        raise ScaffoldError(f"--capability {capability_ref} is not published (schemas/published)")
    request = catalog.message(capability.request)
    result = catalog.message(capability.result)
    if request is None or result is None:
        raise ScaffoldError(f"--capability {capability_ref}: its request or result is unknown")
    example = message_of(result.payload, full=False)
    minimal_request = message_of(request.payload, full=False)
    echo = (
        "modelId" in result.payload
        and result.payload["modelId"].required
        and ("modelId" in request.payload and request.payload["modelId"].required)
    )
    files = (
        _python(name, capability, example, echo)
        if language == "python"
        else _typescript(name, capability, example, minimal_request, echo)
    )
    package = read_package(name, files)
    for file, text in k8s_base(package, [capability], digests).items():
        files[f"k8s/{file}"] = text
    return files
