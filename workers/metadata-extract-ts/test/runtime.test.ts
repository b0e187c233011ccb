import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { test } from "node:test";

import { Queue } from "bullmq";

import { parseConfig } from "../src/config";
import { MetadataWorker } from "../src/runtime";
import { identityOf, InvalidOutcome, jobIdFor, outcome, type JobIdentity } from "../src/wire";

// the real Redis of the test services (127.0.0.1:6379, db 15), on a key prefix of its own
const PREFIX = `tsrt-${randomBytes(5).toString("hex")}`;
const URL = `bullmq://127.0.0.1:6379/15?prefix=${PREFIX}`;

const JOB = {
  messageId: "msg_runtime", messageType: "metadata-extraction-request", contractVersion: 1,
  runId: "run-rt", stage: "extract", attempt: 1, fence: "0123456789abcdef", tenant: "acme",
  resultSchemaVersion: 1, payload: {},
};

test("the worker publishes a valid outcome and refuses an invalid one before it reaches the queue", async () => {
  const config = parseConfig(["--transport", URL, "--storage-root", "/nonexistent", "--worker-id", "ts-rt"], {});
  const worker = new MetadataWorker(config);
  const outcomes = new Queue(config.outcomes, { connection: { host: "127.0.0.1", port: 6379, db: 15 }, prefix: PREFIX });
  try {
    const id = identityOf(JOB) as JobIdentity;
    const good = outcome(id, "failed", { code: "malformed-model", message: "no faces", retryable: false });
    await worker.publish(good);
    const sent = await outcomes.getJob(jobIdFor(good.messageId));
    assert.equal(sent?.data.body, good.body);

    // a final outcome as a tampered acceptance record might hold it: stage-failed@1 needs `retryable`
    const doc = JSON.parse(outcome(id, "failed", { code: "x", message: "y", retryable: true }).body) as Record<string, unknown>;
    const bad = { messageId: `${JOB.messageId}:failed`, body: JSON.stringify({ ...doc, messageId: `${JOB.messageId}:failed`, payload: { code: "x", message: "y" } }) };
    await outcomes.remove(jobIdFor(good.messageId));
    await assert.rejects(worker.publish(bad), (error) => {
      assert.ok(error instanceof InvalidOutcome);
      assert.deepEqual(error.errors.map((e) => e.path), ["payload.retryable"]);
      return true;
    });
    assert.equal(await outcomes.getJob(jobIdFor(bad.messageId)), undefined);
    assert.equal(await outcomes.count(), 0);
  } finally {
    await outcomes.obliterate({ force: true });
    await outcomes.close();
    await worker.close();
  }
});
