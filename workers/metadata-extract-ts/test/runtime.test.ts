import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { test } from "node:test";

import { Queue, type Job } from "bullmq";

import { parseConfig } from "../src/config";
import { MetadataWorker } from "../src/runtime";
import { identityOf, InvalidOutcome, jobData, jobIdFor, outcome, type JobIdentity } from "../src/wire";

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

test("every outcome of a job goes to its replyTo queue, a job without one to the outcome queue", async () => {
  const config = parseConfig(["--transport", URL, "--storage-root", "/nonexistent", "--worker-id", "ts-rt"], {});
  const worker = new MetadataWorker(config);
  const connection = { host: "127.0.0.1", port: 6379, db: 15 };
  const names = [config.outcomes, "accord.outcomes.s1", "accord.outcomes.s2"];
  const queues = names.map((name) => new Queue(name, { connection, prefix: PREFIX }));
  const jobs = [
    { ...JOB, messageId: "msg_reply_none", runId: "run-none" },
    { ...JOB, messageId: "msg_reply_s1", runId: "run-s1", replyTo: "accord.outcomes.s1" },
    { ...JOB, messageId: "msg_reply_s2", runId: "run-s2", replyTo: "accord.outcomes.s2" },
  ];
  const asJob = (envelope: Record<string, unknown>): Job =>
    ({ id: jobIdFor(String(envelope.messageId)), data: jobData(String(envelope.messageId), JSON.stringify(envelope)) }) as unknown as Job;
  const held = async (queue: Queue): Promise<string[]> =>
    (await queue.getJobs(["waiting", "delayed", "active", "completed", "failed"])).map((j) => String(j.id)).sort();
  try {
    for (const envelope of jobs) assert.equal((await worker.serve(asJob(envelope))).mode, "fresh");
    // each queue holds exactly its own job's accepted and final outcome
    for (const [i, queue] of queues.entries()) {
      const id = jobs[i]!.messageId;
      assert.deepEqual(await held(queue), [jobIdFor(`${id}:accepted`), jobIdFor(`${id}:failed`)].sort(), names[i]);
    }
    // a redelivery re-sends the recorded outcome to the same replyTo queue, never elsewhere
    await queues[1]!.remove(jobIdFor("msg_reply_s1:failed"));
    assert.equal((await worker.serve(asJob(jobs[1]!))).mode, "resent");
    assert.deepEqual(await held(queues[1]!), [jobIdFor("msg_reply_s1:accepted"), jobIdFor("msg_reply_s1:failed")].sort());
    assert.equal((await held(queues[0]!)).length, 2);
    assert.equal((await held(queues[2]!)).length, 2);
  } finally {
    for (const queue of queues) {
      await queue.obliterate({ force: true });
      await queue.close();
    }
    await worker.redis.del(...jobs.map((j) => worker.acceptanceKey(jobIdFor(j.messageId), j.fence)));
    await worker.close();
  }
});
