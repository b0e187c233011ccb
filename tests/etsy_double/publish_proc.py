"""One Etsy connector process for the concurrency tests: ``python -m tests.etsy_double.publish_proc
MODEL RUN`` with the connector's configuration in its environment (``ACCORD_ETSY_*``, read by the
connector itself, as a deployed worker reads it).

It imports everything, prints ``ready``, waits for a line on stdin, then runs the real publish
handler once and prints one JSON document: ``{"ok": true, "result": …}`` or ``{"ok": false,
"code": …, "message": …}``. Several of these, released at once, are connector processes taking
deliveries of the same job at the same instant.
"""

from __future__ import annotations

import json
import sys

from accord_worker_marketplace_etsy.handler import PUBLISH, publish

from accord.errors import StageFailed
from accord.worker.sdk import Context
from tests.etsy_double.support import request


def main(model_id: str, run_id: str) -> int:
    ctx = Context(
        run_id=run_id, stage="publish-listing", attempt=1, fence="f", tenant="demo",
        capability=PUBLISH, idempotency_key=f"{run_id}:publish-listing", envelope={},
        services={},  # the configuration comes from the environment
    )  # fmt: skip
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        doc = {"ok": True, "result": publish(request(model_id), ctx)}
    except StageFailed as exc:
        doc = {"ok": False, "code": exc.failure_code, "message": exc.reason}
    print(json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
