/**
 * The job loop on Node BullMQ: one `Worker` on the capability's queue, outcomes through a BullMQ
 * `Queue`, in the Python transport's job format, onto the job's `replyTo` queue (envelope@2: the
 * queue of the engine owning the run's shard) or `accord.outcomes` for a job without one. Every
 * outcome of a job goes there: accepted, heartbeats, the final one and a recorded one re-sent.
 *
 * Serving one job: decode the envelope (a job with no readable envelope cannot be answered, so
 * it is failed with `UnrecoverableError` into BullMQ's failed set, the transport's dead-letter
 * queue); claim the acceptance record; publish `accepted`; heartbeat every `heartbeatMs` while
 * the model is measured; publish `succeeded` (the result) or `failed` (`{code, message,
 * retryable}`); return, so BullMQ completes the job. Every outcome is built on the generated
 * bindings and checked by the generated validators before it is published (./wire): one they
 * refuse is never sent (a result that would break its contract becomes a terminal
 * `invalid-result`). An envelope that breaks `envelope@2`
 * (`invalid-envelope`), names another request contract or carries a request that breaks
 * `metadata-extraction-request@1` (both `invalid-request`) is answered with a terminal `failed`
 * and never crashes the process.
 *
 * **Acceptance record.** BullMQ owns retries only until a job is accepted. Redis key
 * `<prefix>:accord-acceptance:<job id>:<fence>` is claimed with `SET NX` before `accepted` is
 * published, and overwritten with the final outcome once known. A redelivered job (a stalled
 * lock, `attemptsStarted > 1`) that finds the key does not measure again: if it holds a final
 * outcome, that outcome is re-sent with its original message id (a harmless duplicate if it had
 * arrived); if it is still `accepted` (measured elsewhere now, or the process died mid-job), only
 * `accepted` is re-announced and the engine's deadlines decide about a new attempt. A retry by
 * the engine is a new attempt with a new fence, hence a new key, and runs normally.
 */

import { Keyring, openAll, SealingError, validate } from "@accord/contracts";
import { Queue, UnrecoverableError, Worker, type Job } from "bullmq";
import IORedis from "ioredis";

import type { WorkerConfig } from "./config";
import { CAPABILITY, extract, REQUEST } from "./extract";
import { failurePayload, WorkFailure } from "./failure";
import { StorageMap } from "./paths";
import {
  checkedOutcome, identityOf, InvalidOutcome, jobBody, jobData, jobIdFor, outcome, replyQueue, type JobIdentity,
  type Outcome,
} from "./wire";

import { Tracer } from "./tracing";

const ACCEPTED = "accepted";

export interface Served {
  jobId: string;
  /** fresh: measured now; resent: final outcome re-sent; reannounced: still in progress elsewhere */
  mode: "fresh" | "resent" | "reannounced";
}

export class MetadataWorker {
  readonly redis: IORedis;
  private readonly outcomes: Queue;
  /** A `Queue` per replyTo queue seen (one per shard owner), on the same connection. */
  private readonly replyQueues = new Map<string, Queue>();
  private worker: Worker | undefined;
  private readonly storage: StorageMap;
  private readonly keyring: Keyring | undefined;
  served = 0;
  readonly tracer: Tracer = Tracer.fromEnv(process.env, "accord-metadata-extract-ts");

  constructor(readonly config: WorkerConfig, private readonly log: (event: Record<string, unknown>) => void = () => {}) {
    const t = config.transport;
    this.redis = new IORedis({ host: t.host, port: t.port, db: t.db, maxRetriesPerRequest: null });
    this.outcomes = new Queue(config.outcomes, { connection: this.redis, prefix: t.prefix });
    this.storage = new StorageMap(config.storage);
    this.keyring = Keyring.fromEnv(); // a malformed key stops the worker before it takes a job
  }

  async start(): Promise<void> {
    const t = this.config.transport;
    this.worker = new Worker(this.config.queue, (job) => this.serve(job), {
      connection: { host: t.host, port: t.port, db: t.db, maxRetriesPerRequest: null },
      prefix: t.prefix,
      concurrency: this.config.concurrency,
      lockDuration: t.visibilityMs,
      stalledInterval: t.stalledMs,
      maxStalledCount: t.maxDeliveries,
      // the Python publisher names its nack backoff; a thrown error here retries after 1 s
      settings: { backoffStrategy: () => 1000 },
    });
    this.worker.on("error", (error) => this.log({ event: "worker-error", message: String(error) }));
    await this.worker.waitUntilReady();
    await this.outcomes.waitUntilReady();
  }

  acceptanceKey(jobId: string, fence: string): string {
    return `${this.config.transport.prefix}:accord-acceptance:${jobId}:${fence}`;
  }

  /**
   * The BullMQ queue named `name`: the outcome queue, or one made for a replyTo queue. envelope@2
   * admits `:` in a replyTo, which Node BullMQ refuses in a queue name: such a job is answered on
   * the shared outcome queue, which the engines forward to the owner of the run's shard.
   */
  private queueFor(name: string): Queue {
    if (name === this.config.outcomes) return this.outcomes;
    if (name.includes(":")) {
      this.log({ event: "reply-to-unusable", queue: name, reason: "Node BullMQ queue names cannot contain ':'" });
      return this.outcomes;
    }
    let queue = this.replyQueues.get(name);
    if (queue === undefined) {
      queue = new Queue(name, { connection: this.redis, prefix: this.config.transport.prefix });
      this.replyQueues.set(name, queue);
    }
    return queue;
  }

  /**
   * Publishes one outcome to `job`'s `replyTo` queue, else to the outcome queue; refuses (throws
   * `InvalidOutcome`) one its contracts do not accept.
   */
  async publish(out: Outcome, job: Pick<JobIdentity, "replyTo"> = {}): Promise<void> {
    checkedOutcome(out);
    const t = this.config.transport;
    const queue = this.queueFor(replyQueue(job, this.config.outcomes));
    await queue.add("accord", jobData(out.messageId, out.body), {
      jobId: jobIdFor(out.messageId),
      attempts: t.maxDeliveries,
      backoff: { type: "accord-nack" },
      removeOnComplete: { age: Math.max(1, Math.ceil(t.dedupMs / 1000)) },
      removeOnFail: false,
    });
  }

  /** The BullMQ processor (public for tests): answers one job, then lets BullMQ complete it. */
  async serve(job: Job): Promise<Served> {
    const jobId = String(job.id);
    const body = jobBody(job.data);
    if (body === undefined) throw new UnrecoverableError("accord: the job carries no body");
    let envelope: unknown;
    try {
      envelope = JSON.parse(body.toString("utf8"));
    } catch (error) {
      throw new UnrecoverableError(`accord: the job body is not JSON: ${(error as Error).message}`);
    }
    const found = identityOf(envelope);
    if (typeof found === "string") throw new UnrecoverableError(`accord: ${found}`);
    const id: JobIdentity = { ...found, producer: this.config.workerId }; // every outcome names this worker
    let accepted: Outcome;
    try {
      accepted = outcome(id, "accepted", {}, 0, { workerId: this.config.workerId });
    } catch (error) {
      // identity fields no valid outcome can echo: the engine could never read an answer
      if (error instanceof InvalidOutcome) throw new UnrecoverableError(`accord: ${error.message}`);
      throw error;
    }
    const key = this.acceptanceKey(jobId, id.fence);
    const ttl = this.config.acceptanceTtlMs;
    const claimed = await this.redis.set(key, ACCEPTED, "PX", ttl, "NX");
    if (claimed !== "OK") return this.redelivered(jobId, key, accepted, id);
    await this.publish(accepted, id);
    const env = envelope as Record<string, unknown>;
    const attributes = {
      "accord.run_id": id.runId, "accord.stage": id.stage, "accord.attempt": id.attempt,
      "accord.capability": CAPABILITY, "accord.contract": `${String(env.messageType)}@${String(env.contractVersion)}`,
    };
    const final = await this.tracer.span(`accord.execute ${id.stage}`, env.traceparent, attributes, () => this.work(id, env));
    // the record first, then the answer: whoever has seen the answer (an engine, a redelivery
    // racing it) finds the record, so a redelivered job re-sends this outcome rather than
    // re-announcing acceptance; if the publish fails, the job is retried and the redelivery
    // re-sends it from the record
    await this.redis.set(key, JSON.stringify(final), "PX", ttl);
    await this.publish(final, id);
    this.served += 1;
    return { jobId, mode: "fresh" };
  }

  private async redelivered(jobId: string, key: string, accepted: Outcome, id: JobIdentity): Promise<Served> {
    const prior = await this.redis.get(key);
    if (prior !== null && prior !== ACCEPTED) {
      await this.publish(JSON.parse(prior) as Outcome, id); // the same envelope: the same replyTo
      this.log({ event: "resent", jobId });
      return { jobId, mode: "resent" };
    }
    await this.publish(accepted, id);
    this.log({ event: "reannounced", jobId });
    return { jobId, mode: "reannounced" };
  }

  private async work(id: JobIdentity, envelope: Record<string, unknown>): Promise<Outcome> {
    let beats = 0;
    const opened: string[] = []; // the text of values that arrived sealed, scrubbed from failures
    const timer = setInterval(() => {
      beats += 1;
      // a heartbeat that cannot be built or published is skipped, not fatal
      Promise.resolve()
        .then(() => this.publish(outcome(id, "heartbeat", { at: Date.now() / 1000 }, beats), id))
        .catch((error) => this.log({ event: "heartbeat-failed", message: String(error) }));
    }, this.config.heartbeatMs);
    try {
      // envelope@2: every envelope@1 job is valid under it, and it admits replyTo
      const checked = validate("envelope", 2, envelope);
      if (!checked.ok) {
        const where = checked.errors.slice(0, 5).map((e) => `${e.path || "<root>"}: ${e.message}`).join("; ");
        throw new WorkFailure("invalid-envelope", `job envelope breaks envelope@2: ${where}`);
      }
      if (envelope.messageType !== REQUEST.name || envelope.contractVersion !== REQUEST.version) {
        const got = `${String(envelope.messageType)}@${String(envelope.contractVersion)}`;
        throw new WorkFailure("invalid-request", `the job names ${got}; this worker takes ${REQUEST.name}@${REQUEST.version}`);
      }
      let payload: unknown;
      try {
        payload = openAll(envelope.payload, this.keyring);
      } catch (error) {
        if (!(error instanceof SealingError)) throw error;
        throw new WorkFailure("unsealable-request", `the request has a sealed field this worker cannot open: ${error.message}`);
      }
      collectOpened(envelope.payload, payload, opened);
      const result = await extract(payload, id.tenant, { storage: this.storage, inputBytes: this.config.inputBytes });
      try {
        return outcome(id, "succeeded", result);
      } catch (error) {
        if (!(error instanceof InvalidOutcome)) throw error;
        throw new WorkFailure("invalid-result", `the result breaks its contract: ${error.message}`);
      }
    } catch (error) {
      const failure = failurePayload(error);
      for (const value of opened) failure.message = failure.message.split(value).join("***");
      this.log({ event: "failed", runId: id.runId, stage: id.stage, ...failure });
      try {
        return outcome(id, "failed", failure);
      } catch (error) {
        if (!(error instanceof InvalidOutcome)) throw error;
        // the failure itself breaks stage-failed@1 (say, an empty code): report that instead
        return outcome(id, "failed", { code: "worker-error", message: error.message.slice(0, 2000), retryable: true });
      }
    } finally {
      clearInterval(timer);
    }
  }

  async close(): Promise<void> {
    await this.worker?.close();
    await this.tracer.flush();
    for (const queue of this.replyQueues.values()) await queue.close();
    await this.outcomes.close();
    this.redis.disconnect();
  }
}

/** Add to `into` the text of every value of `opened` that was a sealed token in `sealed`. */
function collectOpened(sealed: unknown, opened: unknown, into: string[]): void {
  if (typeof sealed === "string") {
    if (sealed !== opened && opened !== null && opened !== undefined) {
      const text = typeof opened === "string" ? opened : JSON.stringify(opened);
      if (text.length > 0) into.push(text);
    }
    return;
  }
  if (Array.isArray(sealed) && Array.isArray(opened)) {
    sealed.forEach((item, i) => collectOpened(item, opened[i], into));
    return;
  }
  if (sealed !== null && typeof sealed === "object" && opened !== null && typeof opened === "object") {
    const o = opened as Record<string, unknown>;
    for (const [name, member] of Object.entries(sealed)) collectOpened(member, o[name], into);
  }
}
