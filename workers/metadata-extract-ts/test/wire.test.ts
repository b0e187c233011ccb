import assert from "node:assert/strict";
import { test } from "node:test";

import { validate } from "@accord/contracts";

import { failurePayload, WorkFailure } from "../src/failure";
import { checkedOutcome, identityOf, InvalidOutcome, outcome, replyQueue, type JobIdentity } from "../src/wire";

const JOB = {
  messageId: "run-1:extract:1", messageType: "metadata-extraction-request", contractVersion: 1,
  runId: "run-1", stage: "extract", attempt: 1, fence: "0123456789abcdef", tenant: "acme",
  resultSchemaVersion: 1, payload: {},
};

function identity(): JobIdentity {
  const id = identityOf(JOB);
  assert.notEqual(typeof id, "string");
  return id as JobIdentity;
}

/** The payload contract an outcome's kind selects, as outcome.v1.yaml lists them. */
const PAYLOAD: Record<string, [string, number | undefined]> = {
  accepted: ["stage-accepted", 1],
  heartbeat: ["stage-heartbeat", 1],
  progress: ["progress", 1],
  succeeded: ["technical-metadata", undefined],
  failed: ["stage-failed", 1],
};

function checked(body: string): Record<string, unknown> {
  const doc = JSON.parse(body) as Record<string, unknown>;
  const envelope = validate("outcome", 1, doc);
  assert.deepEqual(envelope.errors, [], body);
  const [name, version] = PAYLOAD[doc.messageType as string] ?? ["unknown", 1];
  if (doc.messageType !== "succeeded") {
    const payload = validate(name, version ?? 1, doc.payload);
    assert.deepEqual(payload.errors, [], body);
    assert.equal(doc.contractVersion, version);
  }
  return doc;
}

test("every outcome kind is an outcome@1 message with a payload its contract accepts", () => {
  const id = identity();
  const accepted = checked(outcome(id, "accepted", {}, 0, { workerId: "ts-1" }).body);
  assert.equal(accepted.workerId, "ts-1");
  assert.equal(accepted.producer, "ts-1");
  const beat = checked(outcome(id, "heartbeat", { at: 1_700_000_000.5 }, 2).body);
  assert.equal(beat.messageId, "run-1:extract:1:heartbeat:2");
  checked(outcome(id, "progress", { percent: 40, message: "parsing" }, 1).body);
  const failed = checked(outcome(id, "failed", { ...failurePayload(new WorkFailure("malformed-model", "bad", false)) }).body);
  assert.equal(failed.producer, "accord-worker");
  checked(outcome(id, "failed", { ...failurePayload(new Error("boom")) }).body);
});

/** A result technical-metadata@1 accepts: a unit cube. */
const RESULT = {
  modelId: "cube", format: "stl", units: "mm", vertexCount: 8, faceCount: 12, components: 1,
  bounds: { min: { x: 0, y: 0, z: 0 }, max: { x: 1, y: 1, z: 1 } }, extents: { x: 1, y: 1, z: 1 },
  surfaceArea: 6, volume: 1, volumeUnavailableReason: null, watertight: true, windingConsistent: true,
} as const;

test("an outcome names its run, the job that caused it, when and the result version", () => {
  const id = { ...identity(), producer: "ts-worker-7" };
  const doc = checked(outcome(id, "succeeded", { ...RESULT }, 0, {}, Date.UTC(2026, 0, 2, 3, 4, 5, 6)).body);
  assert.deepEqual(validate("technical-metadata", 1, doc.payload).errors, []);
  assert.equal(doc.correlationId, "run-1");
  assert.equal(doc.causationId, "run-1:extract:1");
  assert.equal(doc.contractVersion, 1);
  assert.equal(doc.producer, "ts-worker-7");
  assert.equal(doc.occurredAt, "2026-01-02T03:04:05.006Z");
});

test("the outcome contract refuses an outcome without its contract fields", () => {
  const doc = JSON.parse(outcome(identity(), "heartbeat", {}, 1).body) as Record<string, unknown>;
  delete doc.causationId;
  delete doc.occurredAt;
  const paths = validate("outcome", 1, doc).errors.map((e) => e.path);
  assert.deepEqual(paths, ["causationId", "occurredAt"]);
});

function refused(...paths: string[]): (error: unknown) => boolean {
  return (error) => {
    assert.ok(error instanceof InvalidOutcome, String(error));
    assert.deepEqual(error.errors.map((e) => e.path), paths);
    return true;
  };
}

test("an outcome its contracts refuse is never built", () => {
  const id = identity();
  // payloads that break the contract their kind selects
  assert.throws(() => outcome(id, "failed", { code: "", message: "x", retryable: false }), refused("payload.code"));
  assert.throws(() => outcome(id, "progress", { percent: 140 }, 1), refused("payload.percent"));
  const { volume: _volume, ...noVolume } = RESULT;
  assert.throws(() => outcome(id, "succeeded", noVolume as typeof RESULT), refused("payload.volume"));
  const extra = { ...RESULT, colour: "red" };
  assert.throws(() => outcome(id, "succeeded", extra), refused("payload.colour"));
  // a result version the bindings have no contract for
  assert.throws(() => outcome({ ...id, resultSchemaVersion: 3 }, "succeeded", { ...RESULT }), refused("contractVersion"));
  // identity fields no outcome@1 can carry
  assert.throws(() => outcome({ ...id, fence: "f".repeat(513) }, "accepted", {}), refused("fence"));
});

test("an outcome body is checked again before it is published", () => {
  const good = outcome(identity(), "heartbeat", { at: 1 }, 1);
  assert.equal(checkedOutcome(good), good);
  const doc = JSON.parse(good.body) as Record<string, unknown>;
  const tampered = { messageId: good.messageId, body: JSON.stringify({ ...doc, payload: { at: -1 } }) };
  assert.throws(() => checkedOutcome(tampered), refused("payload.at"));
  const renamed = { messageId: "another", body: good.body };
  assert.throws(() => checkedOutcome(renamed), refused("messageId"));
  assert.throws(() => checkedOutcome({ messageId: good.messageId, body: "{" }), InvalidOutcome);
});

test("a job's replyTo is where its outcomes go; a job without one, or with one envelope@2 refuses, uses the outcome queue", () => {
  const routed = identityOf({ ...JOB, replyTo: "accord.outcomes.s3" }) as JobIdentity;
  assert.equal(routed.replyTo, "accord.outcomes.s3");
  assert.equal(replyQueue(routed, "accord.outcomes"), "accord.outcomes.s3");
  assert.equal(replyQueue(identity(), "accord.outcomes"), "accord.outcomes");
  assert.equal(identity().replyTo, undefined);
  for (const bad of ["", "has space", ".dot-first", "x".repeat(201), 7]) {
    const id = identityOf({ ...JOB, replyTo: bad }) as JobIdentity;
    assert.equal(id.replyTo, undefined, String(bad));
    assert.equal(replyQueue(id, "accord.outcomes"), "accord.outcomes");
  }
  // the contract agrees: a bad replyTo breaks envelope@2 at that field, a good one passes
  const envelope = {
    messageId: "m", messageType: "a", contractVersion: 1, correlationId: "c", producer: "p", tenant: "acme",
    occurredAt: "2026-01-31T12:30:00Z", payload: {},
  };
  assert.deepEqual(validate("envelope", 2, { ...envelope, replyTo: "accord.outcomes.s3" }).errors, []);
  assert.deepEqual(validate("envelope", 2, { ...envelope, replyTo: "has space" }).errors.map((e) => e.path), ["replyTo"]);
  assert.deepEqual(validate("envelope", 1, { ...envelope, replyTo: "accord.outcomes.s3" }).errors.map((e) => e.path), ["replyTo"]);
});
