"""A loopback OTLP/HTTP receiver for the telemetry tests: accepts ``POST /v1/traces`` (and
``/v1/metrics``) in both OTLP encodings — protobuf, decoded as ``ExportTraceServiceRequest`` /
``ExportMetricsServiceRequest`` with opentelemetry-proto, and JSON (OTLP's hex ids turned into the
protobuf JSON mapping's base64 before parsing) — and keeps every span it received."""

from __future__ import annotations

import base64
import gzip
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

_IDS = ("traceId", "spanId", "parentSpanId")


@dataclass(frozen=True)
class Span:
    service: str
    trace_id: str
    span_id: str
    parent: str
    name: str
    attributes: dict[str, Any]
    status: int
    encoding: str  # "protobuf" or "json"


def _b64(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {
            k: base64.b64encode(bytes.fromhex(v)).decode() if k in _IDS and v else _b64(v)
            for k, v in doc.items()
        }
    if isinstance(doc, list):
        return [_b64(v) for v in doc]
    return doc


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass
class Receiver:
    spans: list[Span] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)  # every body, as received (decompressed)
    metrics: list[ExportMetricsServiceRequest] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, path: str, body: bytes, content_type: str) -> None:
        encoding = "json" if "json" in content_type else "protobuf"
        with self.lock:
            self.raw.append(body)
        if path.endswith("/v1/metrics"):
            m = ExportMetricsServiceRequest()
            if encoding == "json":
                json_format.ParseDict(json.loads(body), m)
            else:
                m.ParseFromString(body)
            with self.lock:
                self.metrics.append(m)
            return
        req = ExportTraceServiceRequest()
        if encoding == "json":
            json_format.ParseDict(_b64(json.loads(body)), req)
        else:
            req.ParseFromString(body)
        got = []
        for rs in req.resource_spans:
            res = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(Span(
                        service=str(res.get("service.name", "")), trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(), parent=s.parent_span_id.hex(), name=s.name,
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        status=s.status.code, encoding=encoding,
                    ))  # fmt: skip
        with self.lock:
            self.spans.extend(got)

    def of_trace(self, trace_id: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]


class _Handler(BaseHTTPRequestHandler):
    receiver: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        try:
            self.receiver.take(self.path, body, self.headers.get("Content-Type") or "")
        except Exception as exc:  # a malformed export is the client's fault: 400, as a collector
            self.send_response(400)
            self.end_headers()
            self.wfile.write(str(exc).encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class OtlpServer:
    """The receiver on a free loopback port, serving from a thread until closed."""

    def __init__(self) -> None:
        self.receiver = Receiver()
        handler = type("Handler", (_Handler,), {"receiver": self.receiver})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
