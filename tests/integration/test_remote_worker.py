"""A stage served by a remote HTTP worker, on real sockets end to end.

The engine runs in process on the embedded default; its transport is wrapped by the HTTP
dispatch adapter, which POSTs the ``metadata`` job over https (a CA made here with
``cryptography``) to the reference remote worker (workers/metadata-extract-http) on uvicorn. The
worker measures the model and answers with signed callbacks to ``POST /v1/callbacks`` on a second
uvicorn, whose intake puts them on the engine's outcome queue. The host name ``remote.test``
resolves, through the adapter's resolver, to 127.0.0.1: the run completing proves the request
went to the checked address with the name as TLS server name.

The dispatch adapter's address rules are a table on their own: private, loopback and link-local
addresses refused unless allowlisted, a redirect not followed, an oversized answer and a slow
server cut off, http:// only where allowed.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ipaddress
import json
import struct
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from accord_worker_metadata_extract_http import LoopbackServer, RemoteWorker, Settings
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from accord.adapters import open_store, open_transport
from accord.adapters.clock import SystemClock
from accord.adapters.ingress.callbacks import CallbackIntake, router
from accord.adapters.ingress.remote import Remote, RemoteConfig, load_remote_config
from accord.adapters.ingress.webhooks import WebhookVerifier
from accord.adapters.transports.http import AddressRefused, HttpDispatchTransport, check_target
from accord.adapters.transports.memory import MemoryTransport
from accord.contracts.sources import load_catalog
from accord.engine.machine.state import RunState
from accord.engine.runtime.checks import contract_result_check
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.errors import TransportError
from accord.worker.storage import StorageMap
from accord.workflow.compiler import compile_workflow

ROOT = Path(__file__).resolve().parents[2]
TENANT, STAGE = "acme", "technical-metadata"
SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()
WORKFLOW = """\
name: remote-metadata
version: "1.0.0"
entry: technical-metadata
stages:
  - name: technical-metadata
    type: worker
    queue: metadata
    worker: metadata.extract@2
    input:
      modelId: "${context.modelId}"
      objectKey: "${context.objectKey}"
    retry: { max_attempts: 1 }
    timeouts: { queue_deadline_ms: 30000 }
    on_success: completed
    on_failure: failed
terminals: [completed, failed]
"""


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate it signs for ``remote.test`` and 127.0.0.1."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "accord test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("remote.test"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "remote.test")]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    ca_file, cert_file, key_file = (directory / n for n in ("ca.pem", "cert.pem", "key.pem"))
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_file, cert_file, key_file


def _cube_stl(edge: float) -> bytes:
    """A binary STL of an axis-aligned cube of ``edge``, corner at the origin."""
    corners = [(x * edge, y * edge, z * edge) for z in (0, 1) for y in (0, 1) for x in (0, 1)]
    quads = [(0, 2, 3, 1), (4, 5, 7, 6), (0, 1, 5, 4), (2, 6, 7, 3), (1, 3, 7, 5), (0, 4, 6, 2)]
    tris = [t for a, b, c, d in quads for t in ((a, b, c), (a, c, d))]
    out = bytearray(b"cube".ljust(80, b" ") + struct.pack("<I", len(tris)))
    for tri in tris:
        out += struct.pack("<3f", 0, 0, 0)
        for i in tri:
            out += struct.pack("<3f", *corners[i])
        out += b"\0\0"
    return bytes(out)


async def _resolve_test_names(host: str, port: int) -> Sequence[str]:
    if host == "remote.test":
        return ["127.0.0.1"]
    raise OSError(f"unknown host {host}")


class Flaky:
    """ASGI middleware: the first ``failures`` job POSTs are answered 503."""

    def __init__(self, app: Any, failures: int) -> None:
        self.app, self.failures, self.refused = app, failures, 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/jobs" and self.failures > 0:
            self.failures -= 1
            self.refused += 1
            await Response(status_code=503)(scope, receive, send)
            return
        await self.app(scope, receive, send)


@dataclass
class RemoteStack:
    engine: Engine
    transport: HttpDispatchTransport
    worker: RemoteWorker
    flaky: Flaky

    async def finished(self, run_id: str, seconds: float = 60) -> RunState:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            run = await self.engine.load(run_id)
            if run is not None and run.terminal:
                return run
            await asyncio.sleep(0.05)
        pytest.fail(f"run {run_id} not terminal within {seconds} s")


@pytest.fixture
async def remote(tmp_path: Path) -> AsyncIterator[RemoteStack]:
    catalog = load_catalog(ROOT / "schemas" / "contracts")
    _, cert_file, key_file = _certificates(tmp_path)  # the CA file is named in the config
    storage = tmp_path / "objects"
    (storage / TENANT / "models").mkdir(parents=True)
    (storage / TENANT / "models" / "cube.stl").write_bytes(_cube_stl(2.0))
    callbacks = FastAPI()
    callbacks.include_router(router)
    async with LoopbackServer(callbacks) as cb_server:
        worker = RemoteWorker(
            Settings(
                callback_url=f"{cb_server.url}/v1/callbacks", key_id="k1", secret=SECRET,
                job_secrets={"k1": SECRET}, storage=StorageMap.local(storage), catalog=catalog,
                heartbeat_ms=200, acceptance_path=tmp_path / "acceptance.sqlite",
            )
        )  # fmt: skip
        flaky = Flaky(worker.app, failures=0)
        async with LoopbackServer(flaky, certfile=cert_file, keyfile=key_file) as w_server:
            config_file = tmp_path / "remote-workers.yaml"
            config_file.write_text(
                "callbacks: {tolerance_s: 60}\n"
                "remotes:\n"
                "  metadata:\n"
                "    capability: metadata.extract@2\n"
                f"    url: https://remote.test:{w_server.port}/v1/jobs\n"
                f"    cancel_url: https://remote.test:{w_server.port}/v1/cancel\n"
                "    allow: [remote.test, 127.0.0.1/32]\n"
                "    ca_file: ca.pem\n"
                "    timeout_ms: 5000\n"
                "    secrets:\n"
                "      k1: env:ACCORD_TEST_REMOTE_SECRET\n"
            )
            config = load_remote_config(config_file, env={"ACCORD_TEST_REMOTE_SECRET": SECRET})
            url = f"sqlite:///{tmp_path / 'engine.db'}"
            store = open_store(url)
            inner = open_transport("embedded://", store=store)
            transport = HttpDispatchTransport(inner, config, resolver=_resolve_test_names)
            engine = Engine(
                store, transport, SystemClock(), EngineOptions(poll_ms=10, grace_ms=200),
                result_checks=[contract_result_check(catalog)], owns_ports=True,
            )  # fmt: skip
            plan = compile_workflow(WORKFLOW, "remote-metadata.yaml", catalog).unwrap()
            await engine.register_plan(plan)
            callbacks.state.callbacks = CallbackIntake.from_config(config, transport)
            await engine.start()
            try:
                yield RemoteStack(engine, transport, worker, flaky)
            finally:
                await engine.stop()


async def test_a_run_completes_through_the_remote_http_worker(remote: RemoteStack) -> None:
    run_id = await remote.engine.start_run(
        "remote-metadata", {"modelId": "cube", "objectKey": "models/cube.stl"}, tenant=TENANT
    )
    run = await remote.finished(run_id)
    assert run.status == "completed", run.error
    result = run.stages[STAGE].result
    assert result is not None
    assert (result["vertexCount"], result["faceCount"], result["volume"]) == (8, 12, 8.0)
    assert result["extents"] == {"x": 2.0, "y": 2.0, "z": 2.0}
    history = [h for h in await remote.engine.history(run_id) if h.accepted]
    accepted = [h.event for h in history if h.event["kind"] == "stage-accepted"]
    assert len(accepted) == 1 and accepted[0]["worker_id"].startswith("metadata-extract-http/acc_")
    assert remote.transport.delivered == 1 and remote.worker.handled == 1
    assert f"{accepted[0]['message_id'].rsplit(':', 1)[0]}:succeeded" in remote.worker.sent


async def test_delivery_is_retried_until_the_remote_accepts(remote: RemoteStack) -> None:
    remote.flaky.failures = 3
    run_id = await remote.engine.start_run(
        "remote-metadata", {"modelId": "cube", "objectKey": "models/cube.stl"}, tenant=TENANT
    )
    run = await remote.finished(run_id)
    assert run.status == "completed", run.error
    assert remote.flaky.refused == 3 and remote.transport.refused == 3
    assert remote.transport.delivered == 1 and remote.worker.handled == 1


async def test_a_redelivered_job_gets_its_first_acceptance_and_runs_nothing(
    remote: RemoteStack,
) -> None:
    run_id = await remote.engine.start_run(
        "remote-metadata", {"modelId": "cube", "objectKey": "models/cube.stl"}, tenant=TENANT
    )
    assert (await remote.finished(run_id)).status == "completed"
    run = await remote.engine.load(run_id)
    assert run is not None
    events = [h.event for h in await remote.engine.history(run_id)]
    accepted = next(e for e in events if e["kind"] == "stage-accepted")
    stage = run.stages[STAGE]
    envelope = {  # the job again, as the engine's outbox would republish it
        "messageId": accepted["message_id"].rsplit(":", 1)[0],
        "messageType": "metadata-extraction-request", "contractVersion": 1,
        "correlationId": run_id, "producer": "accord-engine", "tenant": TENANT,
        "occurredAt": "2026-01-01T00:00:00.000Z", "runId": run_id, "stage": STAGE,
        "attempt": stage.attempt, "fence": stage.fence,
        "payload": {"modelId": "cube", "objectKey": "models/cube.stl"},
    }  # fmt: skip
    body = json.dumps(envelope).encode()
    sent_before = len(remote.worker.sent)
    await remote.transport.publish("metadata", "job_again", body)
    deadline = time.monotonic() + 10
    while len(remote.worker.sent) == sent_before and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    # answered from the acceptance record: the recorded outcome sent again, nothing measured
    assert remote.worker.sent[sent_before:] == [f"{envelope['messageId']}:succeeded"]
    assert remote.worker.handled == 1 and remote.transport.delivered == 2
    history = await remote.engine.history(run_id)
    assert all(h.reason in (None, "late", "duplicate") for h in history)


# -- the address rules of the dispatch adapter ----------------------------------------------


def _remote(url: str, allow: list[str], **extra: Any) -> Remote:
    hosts = frozenset(a for a in allow if "/" not in a)
    nets = tuple(ipaddress.ip_network(a) for a in allow if "/" in a)
    return Remote(
        queue="metadata", url=url, secrets={"k1": SECRET}, signing_key="k1",
        allow_hosts=hosts, allow_networks=nets, allow_http=url.startswith("http:"), **extra,
    )  # fmt: skip


async def _names(table: dict[str, list[str]]) -> Any:
    async def resolve(host: str, port: int) -> Sequence[str]:
        if host in table:
            return table[host]
        raise OSError(f"unknown host {host}")

    return resolve


ADDRESS_TABLE: list[tuple[str, str, list[str], dict[str, list[str]], str | None]] = [
    ("name resolving to loopback", "http://svc.test/j", ["svc.test"],
     {"svc.test": ["127.0.0.1"]}, "loopback"),
    ("name resolving to loopback, network allowlisted", "http://svc.test/j",
     ["svc.test", "127.0.0.0/8"], {"svc.test": ["127.0.0.1"]}, None),
    ("loopback literal, network allowlisted", "http://127.0.0.1:9/j", ["127.0.0.0/8"], {}, None),
    ("loopback literal, not allowlisted", "http://127.0.0.1:9/j", ["svc.test"], {}, "allowlist"),
    ("name resolving to a private address", "https://svc.test/j", ["svc.test"],
     {"svc.test": ["192.168.1.5"]}, "private-range"),
    ("name resolving to 10/8, network allowlisted", "https://svc.test/j",
     ["svc.test", "10.0.0.0/8"], {"svc.test": ["10.1.2.3"]}, None),
    ("name resolving to the link-local metadata address", "http://svc.test/latest",
     ["svc.test"], {"svc.test": ["169.254.169.254"]}, "link-local"),
    ("link-local literal, not allowlisted", "http://169.254.169.254/latest", ["svc.test"], {},
     "allowlist"),
    ("name resolving to IPv6 loopback", "http://svc.test/j", ["svc.test"],
     {"svc.test": ["::1"]}, "loopback"),
    ("name resolving to IPv6 link-local", "http://svc.test/j", ["svc.test"],
     {"svc.test": ["fe80::1%eth0"]}, "link-local"),
    ("name resolving to IPv4-mapped loopback", "http://svc.test/j", ["svc.test"],
     {"svc.test": ["::ffff:127.0.0.1"]}, "loopback"),
    ("name resolving to public and private", "https://svc.test/j", ["svc.test"],
     {"svc.test": ["93.184.216.34", "10.0.0.7"]}, "private-range"),
    ("name resolving to public only", "https://svc.test/j", ["svc.test"],
     {"svc.test": ["93.184.216.34"]}, None),
    ("wildcard host", "https://a.svc.test/j", ["*.svc.test"], {"a.svc.test": ["93.184.216.34"]},
     None),
    ("host not on the allowlist", "https://other.test/j", ["svc.test"],
     {"other.test": ["93.184.216.34"]}, "allowlist"),
    ("name resolving to the unspecified address", "http://svc.test/j", ["svc.test"],
     {"svc.test": ["0.0.0.0"]}, "unspecified"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "url", "allow", "names", "refusal"), ADDRESS_TABLE, ids=[c[0] for c in ADDRESS_TABLE]
)
async def test_address_rule_table(
    case: str, url: str, allow: list[str], names: dict[str, list[str]], refusal: str | None
) -> None:
    remote = _remote(url, allow)
    resolver = await _names(names)
    if refusal is None:
        target = await check_target(url, remote, resolver)
        assert target.address in (names.get(target.host) or [target.host])
    else:
        with pytest.raises(AddressRefused, match=refusal):
            await check_target(url, remote, resolver)


async def test_http_is_refused_unless_allowed() -> None:
    remote = Remote(
        queue="metadata", url="http://svc.test/j", secrets={"k1": SECRET}, signing_key="k1",
        allow_hosts=frozenset({"svc.test"}),
    )  # fmt: skip
    with pytest.raises(AddressRefused, match="http://"):
        await check_target("http://svc.test/j", remote, await _names({}))


def _envelope() -> bytes:
    return json.dumps({
        "messageId": "msg_" + "a" * 32, "runId": "run_x", "stage": STAGE, "attempt": 1,
        "fence": "f" * 32, "tenant": TENANT, "payload": {"modelId": "m"},
    }).encode()  # fmt: skip


async def _slow(_: Request) -> Response:
    await asyncio.sleep(5)
    return JSONResponse({"acceptanceId": "late"}, 202)


async def _huge(_: Request) -> Response:
    return Response(b"x" * 200_000, 202, media_type="application/json")


async def _redirect(_: Request) -> Response:
    return RedirectResponse("http://127.0.0.1:1/elsewhere", status_code=307)


async def _empty(_: Request) -> Response:
    return JSONResponse({}, 202)


async def _broken(_: Request) -> Response:
    return JSONResponse({"error": "down"}, 500)


CANCELS: list[dict[str, Any]] = []


async def _cancel(request: Request) -> Response:
    body = await request.body()
    verified = WebhookVerifier({"k1": SECRET}).verify(body, request.headers)
    CANCELS.append({"key": verified.key_id, **json.loads(body)})
    return JSONResponse({"cancelled": True}, 202)


async def _good(request: Request) -> Response:
    assert request.headers["webhook-signature"].startswith("v1,")
    assert request.headers["accord-job-id"] == "job_1"
    return JSONResponse({"acceptanceId": "acc_1", "workerId": "w1"}, 202)


async def _ssrf_server() -> LoopbackServer:
    app = Starlette(
        routes=[
            Route(f"/{name}", fn, methods=["POST"])
            for name, fn in (("slow", _slow), ("huge", _huge), ("redirect", _redirect),
                             ("empty", _empty), ("broken", _broken), ("good", _good),
                             ("cancel", _cancel))
        ]
    )  # fmt: skip
    server = LoopbackServer(app)
    await server.start()
    return server


ANSWER_TABLE: list[tuple[str, str, str | None]] = [
    ("redirect not followed", "redirect", "redirects are not followed"),
    ("oversized answer", "huge", "over 65536 bytes"),
    ("slow server", "slow", "no complete answer within 300 ms"),
    ("2xx without an acceptance id", "empty", "without an acceptanceId"),
    ("server error", "broken", "answered 500"),
    ("acceptance", "good", None),
]


@pytest.mark.parametrize(("case", "path", "error"), ANSWER_TABLE, ids=[c[0] for c in ANSWER_TABLE])
async def test_answer_rule_table(case: str, path: str, error: str | None) -> None:
    server = await _ssrf_server()
    try:
        url = f"{server.url}/{path}"
        config = RemoteConfig({"metadata": _remote(url, ["127.0.0.1/32"], timeout_ms=300)})
        inner = MemoryTransport(SystemClock())
        transport = HttpDispatchTransport(inner, config)
        started = time.monotonic()
        if error is None:
            await transport.publish("metadata", "job_1", _envelope())
            stream = inner.consume("accord.outcomes")
            got = await asyncio.wait_for(anext(stream), 5)
            doc = json.loads(got.body)
            assert (doc["messageType"], doc["workerId"]) == ("accepted", "w1/acc_1")
            assert doc["messageId"] == "msg_" + "a" * 32 + ":accepted"
            assert (doc["fence"], doc["attempt"], doc["tenant"]) == ("f" * 32, 1, TENANT)
        else:
            with pytest.raises(TransportError, match=error):
                await transport.publish("metadata", "job_1", _envelope())
            assert time.monotonic() - started < 3
            assert await inner.dead_letters("accord.outcomes") == []
        await transport.close()
    finally:
        await server.stop()


async def test_loopback_remote_not_allowlisted_is_never_contacted() -> None:
    server = await _ssrf_server()
    try:
        url = f"{server.url}/good"
        url = url.replace("127.0.0.1", "loop.test")
        config = RemoteConfig({"metadata": _remote(url, ["loop.test"])})  # the name, no network
        resolver = await _names({"loop.test": ["127.0.0.1"]})
        transport = HttpDispatchTransport(MemoryTransport(SystemClock()), config, resolver=resolver)
        with pytest.raises(AddressRefused, match="loopback"):
            await transport.publish("metadata", "job_1", _envelope())
        await transport.close()
    finally:
        await server.stop()


async def test_other_queues_go_to_the_inner_transport() -> None:
    config = RemoteConfig({"metadata": _remote("http://127.0.0.1:9/j", ["127.0.0.1/32"])})
    inner = MemoryTransport(SystemClock())
    transport = HttpDispatchTransport(inner, config)
    await transport.publish("rendering", "job_2", b"{}")
    await transport.publish("accord.control.metadata", "job_1:cancel", b"{}")  # no cancel_url
    got = await asyncio.wait_for(anext(transport.consume("rendering")), 5)
    assert got.message_id == "job_2"
    assert transport.cancels_dropped == 1
    await transport.close()


async def test_cancellation_requests_are_posted_signed_to_the_cancel_url() -> None:
    server = await _ssrf_server()
    try:
        remote = _remote(f"{server.url}/good", ["127.0.0.1/32"], cancel_url=f"{server.url}/cancel")
        inner = MemoryTransport(SystemClock())
        transport = HttpDispatchTransport(inner, RemoteConfig({"metadata": remote}))
        request = {"fence": "f" * 32, "stage": STAGE, "kind": "request-cancellation"}
        await transport.publish(
            "accord.control.metadata", "job_1:cancel", json.dumps(request).encode()
        )
        assert CANCELS[-1] == {"key": "k1", **request}
        assert (transport.cancels_sent, transport.cancels_dropped) == (1, 0)
        assert await inner.dead_letters("accord.control.metadata") == []
        await transport.close()
    finally:
        await server.stop()


async def test_open_engine_wraps_its_transport_for_the_remote_queues(tmp_path: Path) -> None:
    from accord.adapters import open_engine

    config = RemoteConfig({"metadata": _remote("http://127.0.0.1:9/j", ["127.0.0.1/32"])})
    url = f"sqlite:///{tmp_path / 'engine.db'}"
    engine = open_engine(url, url, remote=config)
    try:
        assert isinstance(engine.transport, HttpDispatchTransport)
        assert engine.transport.config is config
        with pytest.raises(TransportError, match="no job envelope"):
            await engine.transport.publish("metadata", "job_1", b"[]")
    finally:
        await engine.stop()
