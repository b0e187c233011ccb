// The CloudEvents 1.0 mapping of the envelope: lossless both ways, in both content modes, on
// every golden fixture, and readable by (and from) the official npm package `cloudevents`.

import { deepStrictEqual, ok, strictEqual, throws } from "node:assert/strict";
import { join } from "node:path";
import { test } from "node:test";

import { CloudEvent, HTTP } from "cloudevents";

import { readFixtures } from "../fixtures";
import {
  CloudEventError,
  EXTENSIONS,
  fromBinary,
  fromCloudEvent,
  fromStructured,
  toBinary,
  toCloudEvent,
  toStructured,
  type Envelope,
} from "../index";

const root = join(__dirname, "..", "..", "..", "..", "schemas", "fixtures");
const fixtures = readFixtures(root);
const bases = fixtures
  .filter((f) => f.contract === "envelope" && f.expect.ok)
  .map((f) => [f.id, f.message as Envelope] as const);

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** Every valid envelope fixture, and every fixture message of every contract that is a JSON
 * object (valid or not: the payload is opaque here) as the payload of an envelope of that
 * messageType@contractVersion, the envelope fixtures taking turns as the frame. */
function golden(): [string, Envelope][] {
  const out: [string, Envelope][] = bases.map(([id, m]) => [id, m]);
  fixtures.forEach((f, i) => {
    if (!isObject(f.message)) return;
    const frame = bases[i % bases.length]?.[1] as Envelope;
    out.push([`payload:${f.id}`, { ...frame, messageType: f.contract, contractVersion: f.version, payload: f.message }]);
  });
  return out;
}

const GOLDEN = golden();

/** An SDK event's attributes as a plain object (its data apart, unset members dropped). */
function attributesOf(event: CloudEvent<unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(event)) if (k !== "data" && v !== undefined) out[k] = v;
  return out;
}

test("the golden set covers every contract's fixtures and the envelope's", () => {
  ok(bases.length >= 5);
  ok(GOLDEN.length > 500);
  const contracts = new Set(GOLDEN.filter(([k]) => k.startsWith("payload:")).map(([, e]) => e.messageType));
  deepStrictEqual(contracts, new Set(fixtures.map((f) => f.contract)));
});

test("round trip is lossless on every golden fixture, in both modes", () => {
  for (const [id, envelope] of GOLDEN) {
    const { attributes, data } = toCloudEvent(envelope);
    deepStrictEqual(fromCloudEvent(attributes, data), envelope, id);
    deepStrictEqual(fromStructured(JSON.parse(JSON.stringify(toStructured(envelope)))), envelope, id);
    const binary = toBinary(envelope);
    deepStrictEqual(fromBinary(binary.headers, binary.body), envelope, id);
    deepStrictEqual(fromBinary(binary.headers, new TextEncoder().encode(binary.body)), envelope, id);
  }
});

test("nulls, large integers and timestamp texts come back as they were", () => {
  const frame = bases[0]?.[1] as Envelope;
  const envelope: Envelope = {
    ...frame,
    causationId: null,
    branch: null,
    attempt: 2 ** 31,
    resultSchemaVersion: 7,
    occurredAt: "2026-01-31t12:30:00.123456789+05:30",
    payloadRef: { digest: "sha256:" + "a".repeat(64), objectKey: "k/x", sizeBytes: 3 * 2 ** 30 },
  };
  const { attributes } = toCloudEvent(envelope);
  strictEqual(attributes.accordnulls, "accordbranch accordcausation");
  strictEqual(attributes.accordattempt, String(2 ** 31));
  strictEqual(attributes.accordresultver, 7);
  strictEqual(attributes.time, envelope.occurredAt);
  const back = fromBinary(toBinary(envelope).headers, toBinary(envelope).body);
  deepStrictEqual(back, envelope);
  strictEqual(back.causationId, null);
  strictEqual(typeof back.attempt, "number");
});

test("attribute names follow the CloudEvents naming rule", () => {
  for (const x of EXTENSIONS) ok(/^[a-z0-9]{1,20}$/.test(x.attribute), x.attribute);
  const names = Object.keys(toCloudEvent(GOLDEN.find(([k]) => k.endsWith("full.json"))?.[1]).attributes);
  for (const name of names) ok(/^[a-z0-9]{1,20}$/.test(name), name);
});

test("refusals name the field or the attribute", () => {
  const full = GOLDEN.find(([k]) => k.endsWith("full.json"))?.[1] as Envelope;
  const refused = (fn: () => unknown, name: string) =>
    throws(fn, (e: unknown) => e instanceof CloudEventError && e.attribute === name && e.message.startsWith(`${name}: `));
  refused(() => toCloudEvent({ ...full, extra: 1 }), "extra");
  refused(() => toCloudEvent({ ...full, attempt: null }), "attempt");
  refused(() => toCloudEvent({ ...full, attempt: "1" }), "attempt");
  refused(() => toCloudEvent({ ...full, messageType: "A.b" }), "messageType");
  refused(() => toCloudEvent({ ...full, producer: "\ud800" }), "producer");
  const good = toCloudEvent(full);
  const back = (change: Record<string, unknown>) => () => fromCloudEvent({ ...good.attributes, ...change }, good.data);
  refused(back({ partitionkey: "p" }), "partitionkey");
  refused(back({ type: "com.example.thing" }), "type");
  refused(back({ source: "urn:accord:producer:%C3" }), "source");
  refused(back({ dataschema: "urn:accord:contract:other:1" }), "dataschema");
  refused(back({ subject: "runs/other" }), "subject");
  refused(back({ time: "2026-01-31T12:30:01Z" }), "time");
  refused(back({ accordattempt: "1.0" }), "accordattempt");
  refused(back({ accordnulls: "accordtenant" }), "accordnulls");
  refused(() => fromBinary(toBinary(full).headers, "{'a': 1}"), "body");
});

test("the npm cloudevents package reads our events, and we read its", () => {
  for (const [id, envelope] of GOLDEN) {
    // ours, parsed by the SDK
    const structured = HTTP.toEvent({
      headers: { "content-type": "application/cloudevents+json" },
      body: JSON.stringify(toStructured(envelope)),
    }) as CloudEvent<unknown>;
    strictEqual(structured.id, envelope.messageId, id);
    deepStrictEqual(fromCloudEvent(attributesOf(structured), structured.data), envelope, id);
    const ours = toBinary(envelope);
    const binary = HTTP.toEvent({ headers: ours.headers, body: ours.body || undefined }) as CloudEvent<unknown>;
    deepStrictEqual(fromCloudEvent(attributesOf(binary), binary.data), envelope, id);
    // the SDK's own forms of our attributes (it re-renders time to milliseconds)
    const { attributes, data } = toCloudEvent(envelope);
    const event = new CloudEvent<unknown>(data === undefined ? { ...attributes } : { ...attributes, data });
    const s = HTTP.structured(event);
    deepStrictEqual(fromStructured(JSON.parse(String(s.body))), envelope, id);
    const b = HTTP.binary(event);
    const body = b.body === undefined ? "" : typeof b.body === "string" ? b.body : JSON.stringify(b.body);
    deepStrictEqual(fromBinary(b.headers as Record<string, string>, body), envelope, id);
  }
});
