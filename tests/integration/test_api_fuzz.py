"""Schema-driven fuzzing: schemathesis reads the served ``/openapi.json`` and sends generated
requests, valid and invalid, to every operation of the real server; none may answer 5xx.

The server counts what it answered (an ASGI wrapper in front of the application), so the test
knows how many requests really arrived and with which statuses, whatever the fuzzer reports.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from tests.integration.test_api_support import serving

from accord.adapters.ingress.limits import ApiLimits

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
MIN_REQUESTS = 1_000


class Counting:
    """Counts the response statuses of an ASGI application."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.statuses: Counter[int] = Counter()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def counted(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.statuses[message["status"]] += 1
            await send(message)

        await self.app(scope, receive, counted)


async def test_a_thousand_generated_requests_get_no_5xx(tmp_path: Path) -> None:
    counted: list[Counting] = []

    def wrap(app: Any) -> Any:
        counted.append(Counting(app))
        return counted[0]

    limits = ApiLimits(rate_per_s=100_000, burst=100_000, max_body_bytes=65_536)
    async with serving(tmp_path, limits=limits, wrap=wrap) as api:
        args = [
            "run",
            f"{api.url}/openapi.json",
            "--checks",
            "not_a_server_error",
            "--header",
            f"Authorization: Bearer {api.key('admin')}",
            "--max-examples",
            "60",
            "--phases",
            "examples,coverage,fuzzing",
            # one worker: CPython 3.11's ast.parse is not thread-safe (its recursion-depth check
            # is shared between threads, "AST constructor recursion depth mismatch"), and the
            # fuzzer parses lambdas' sources for their descriptions in every worker thread
            "--workers",
            "1",
            "--request-timeout",
            "10",
            "--max-time",
            "45",
            "--seed",
            "17",
            "--suppress-health-check",
            "all",
        ]
        proc = await asyncio.create_subprocess_exec(
            str(SCHEMATHESIS),
            *args,
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=os.environ | {"NO_COLOR": "1"},
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 110)
        text = out.decode(errors="replace")
    statuses = counted[0].statuses
    total = sum(statuses.values())
    errors = {s: n for s, n in statuses.items() if s >= 500}
    print(f"{total} requests answered: {dict(sorted(statuses.items()))}")
    assert proc.returncode == 0, text[-6_000:]
    assert not errors, (errors, text[-6_000:])
    assert total >= MIN_REQUESTS, (total, dict(statuses), text[-3_000:])
    assert statuses[200] + statuses[201] > 0 and statuses[422] > 0, dict(statuses)
