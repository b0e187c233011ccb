import assert from "node:assert/strict";
import { createServer, type IncomingMessage } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { Tracer, tracesEndpoint } from "../src/tracing";

const TRACE = "0af7651916cd43dd8448eb211c80319c";
const PARENT = "b7ad6b7169203331";

test("the standard variables name the endpoint, or turn tracing off", () => {
  assert.equal(tracesEndpoint({}), undefined);
  assert.equal(tracesEndpoint({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://h:4318/" }), "http://h:4318/v1/traces");
  assert.equal(tracesEndpoint({ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "http://h/t" }), "http://h/t");
  assert.equal(tracesEndpoint({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://h", OTEL_SDK_DISABLED: "true" }), undefined);
  assert.equal(tracesEndpoint({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://h", OTEL_TRACES_EXPORTER: "none" }), undefined);
});

test("off: the work runs and nothing is sent", async () => {
  const tracer = new Tracer(undefined, "svc");
  assert.equal(await tracer.span("x", `00-${TRACE}-${PARENT}-01`, {}, async () => 7), 7);
  await tracer.flush();
});

test("a span continues the traceparent and is posted as OTLP JSON", async () => {
  const bodies: unknown[] = [];
  const server = createServer((req: IncomingMessage, res) => {
    let data = "";
    req.on("data", (chunk: Buffer) => (data += chunk.toString("utf8")));
    req.on("end", () => {
      bodies.push({ type: req.headers["content-type"], doc: JSON.parse(data) });
      res.writeHead(200).end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  try {
    const tracer = new Tracer(`http://127.0.0.1:${port}/v1/traces`, "svc");
    const attributes = { "accord.stage": "extract", "accord.attempt": 2 };
    await tracer.span("accord.execute extract", `00-${TRACE}-${PARENT}-01`, attributes, async () => undefined);
    await assert.rejects(tracer.span("failing", `00-${TRACE}-${PARENT}-01`, {}, async () => {
      throw new TypeError("boom");
    }));
    await tracer.span("untraced", "not-a-traceparent", {}, async () => undefined); // no span
    await tracer.flush();
    assert.equal(bodies.length, 1);
    const { type, doc } = bodies[0] as { type: string; doc: any };
    assert.equal(type, "application/json");
    const spans = doc.resourceSpans[0].scopeSpans[0].spans;
    assert.deepEqual(spans.map((s: any) => s.name), ["accord.execute extract", "failing"]);
    assert.equal(spans[0].traceId, TRACE);
    assert.equal(spans[0].parentSpanId, PARENT);
    assert.match(spans[0].spanId, /^[0-9a-f]{16}$/);
    assert.deepEqual(spans[0].attributes, [
      { key: "accord.stage", value: { stringValue: "extract" } },
      { key: "accord.attempt", value: { intValue: "2" } },
    ]);
    assert.deepEqual(spans[1].status, { code: 2, message: "TypeError" });
    assert.equal(doc.resourceSpans[0].resource.attributes[0].value.stringValue, "svc");
  } finally {
    server.close();
  }
});
