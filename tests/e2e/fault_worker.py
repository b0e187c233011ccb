"""The worker the fault test serves with ``accord worker run fault_worker:worker``: one handler
for every worker stage of :func:`accord.testing.plans.model_ingest_shape`, on its queue, as the
test's plan names them (capability ``soak-<stage>@1``).

A handler takes a few milliseconds (so kills land while jobs are in flight) and returns the
model id it was given; the capabilities have no contracts in ``schemas/contracts``, so only the
job envelope is validated, not requests and results.
"""

from __future__ import annotations

import asyncio
from typing import Any

from accord.testing.plans import QUEUES
from accord.worker import Context, Worker

HANDLER_S = 0.1

worker = Worker("fault-soak")


async def _work(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    await asyncio.sleep(HANDLER_S)
    return {"modelId": payload.get("modelId"), "stage": ctx.stage}


for _queue in QUEUES:
    worker.bind(f"soak-{_queue}@1", _work, queue=_queue)
