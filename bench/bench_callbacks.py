"""What a signed callback costs: verification per request, and ``POST /v1/callbacks`` end to end.

- ``verify_us.<size>``: :meth:`WebhookVerifier.verify` alone (headers, key, timestamp, the
  ``standardwebhooks`` HMAC-SHA256) on one core, for an ``accepted`` outcome (~450 B), a typical
  ``succeeded`` with a ``technical-metadata@1`` result (~760 B), and a 64 KiB body;
- ``rejected_us``: the same for a bad signature (the work an unauthenticated flood costs);
- ``intake_us``: what :class:`CallbackIntake` does per callback besides the HTTP server: verify,
  parse through the engine's outcome reader and ``outcome@1``, claim the id in the in-process
  replay store, publish on the in-memory transport;
- ``http``: sequential POSTs of signed ``succeeded`` callbacks over loopback to the router on
  uvicorn (one client, keep-alive): latency p50/p99 and callbacks/s, so the verification figure
  can be set against the cost of the request around it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import statistics
import sys
import time
from typing import Any

from accord.adapters.clock import SystemClock
from accord.adapters.ingress.webhooks import MemoryReplayStore, WebhookVerifier, sign_headers
from accord.adapters.transports.memory import MemoryTransport
from accord.engine.runtime.wire import encode_outcome

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
RESULT = {
    "modelId": "m1", "format": "stl", "units": "unknown", "vertexCount": 8, "faceCount": 12,
    "components": 1,
    "bounds": {"min": {"x": 0.0, "y": 0.0, "z": 0.0}, "max": {"x": 1.0, "y": 1.0, "z": 1.0}},
    "extents": {"x": 1.0, "y": 1.0, "z": 1.0}, "surfaceArea": 6.0, "volume": 1.0,
    "volumeUnavailableReason": None, "watertight": True, "windingConsistent": True,
}  # fmt: skip


def _outcome(kind: str, payload: dict[str, Any], n: int = 0) -> bytes:
    return encode_outcome(
        f"msg_{n:032x}:{kind}", kind, run_id=f"run_{n:024x}", stage="technical-metadata",
        attempt=1, fence="f" * 32, tenant="acme", payload=payload, worker_id="bench-remote",
    )  # fmt: skip


def _per_call_us(fn: Any, repeat: int) -> float:
    fn()
    began = time.process_time()
    for _ in range(repeat):
        fn()
    return (time.process_time() - began) * 1e6 / repeat


def verify_figures(repeat: int) -> dict[str, float]:
    verifier = WebhookVerifier({"k1": SECRET}, tolerance_s=300)
    bodies = {
        "accepted": _outcome("accepted", {}),
        "succeeded": _outcome("succeeded", RESULT),
        "64KiB": _outcome("succeeded", {**RESULT, "pad": "x" * 65_000}),
    }
    out: dict[str, float] = {}
    for name, body in bodies.items():
        headers = sign_headers("k1", SECRET, "wh_1", body)
        out[f"verify_us.{name}"] = round(
            _per_call_us(lambda b=body, h=headers: verifier.verify(b, h), repeat), 2
        )
        out[f"bytes.{name}"] = len(body)
    body = bodies["succeeded"]
    bad = {**sign_headers("k1", SECRET, "wh_1", body), "webhook-signature": "v1,AAAA"}

    def reject() -> None:
        try:
            verifier.verify(body, bad)
        except Exception:
            return
        raise AssertionError("a bad signature verified")

    out["rejected_us"] = round(_per_call_us(reject, repeat), 2)
    return out


async def intake_us(repeat: int) -> float:
    from accord.adapters.ingress.callbacks import CallbackIntake

    transport = MemoryTransport(SystemClock())
    intake = CallbackIntake(
        WebhookVerifier({"k1": SECRET}, tolerance_s=300, replay=MemoryReplayStore()), transport
    )
    calls = []
    for i in range(repeat + 1):
        body = _outcome("succeeded", RESULT, i)
        calls.append((body, sign_headers("k1", SECRET, f"wh_{i}", body)))
    await intake.take(*calls[0])
    began = time.process_time()
    for body, headers in calls[1:]:
        await intake.take(body, headers)
    spent = time.process_time() - began
    await transport.close()
    return spent * 1e6 / repeat


async def http_figures(n: int) -> dict[str, float]:
    import httpx
    from accord_worker_metadata_extract_http import LoopbackServer
    from fastapi import FastAPI

    from accord.adapters.ingress.callbacks import CALLBACKS_PATH, CallbackIntake, router

    transport = MemoryTransport(SystemClock())
    app = FastAPI()
    app.include_router(router)
    app.state.callbacks = CallbackIntake(WebhookVerifier({"k1": SECRET}), transport)
    latencies: list[float] = []
    async with LoopbackServer(app) as server, httpx.AsyncClient(base_url=server.url) as client:
        for i in range(n + 20):
            body = _outcome("succeeded", RESULT, i)
            headers = {
                **sign_headers("k1", SECRET, f"wh_{i}", body),
                "content-type": "application/json",
            }
            began = time.perf_counter()
            answer = await client.post(CALLBACKS_PATH, content=body, headers=headers)
            if i >= 20:  # the first few warm the connection and the server
                latencies.append(time.perf_counter() - began)
            if answer.status_code != 202:
                raise RuntimeError(f"callback answered {answer.status_code}: {answer.text}")
    await transport.close()
    latencies.sort()
    return {
        "p50_ms": round(statistics.median(latencies) * 1000, 3),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 3),
        "callbacks_per_s": round(len(latencies) / sum(latencies), 1),
    }


def run(smoke: bool) -> dict[str, Any]:
    repeat, n = (200, 50) if smoke else (20_000, 2_000)
    out: dict[str, Any] = verify_figures(repeat)
    out["intake_us"] = round(asyncio.run(intake_us(repeat // 4)), 2)
    out["http"] = asyncio.run(http_figures(n))
    return out


if __name__ == "__main__":
    print(json.dumps(run(smoke="--smoke" in sys.argv), indent=2))
