/**
 * The wire as the Python BullMQ transport writes it, so both sides agree byte for byte.
 *
 * - **Job ids**: `m-` + the message id with `%` and `:` percent-escaped (`%` first), one-to-one,
 *   never integer-like and never containing `:` (`accord.adapters.transports._bullmq_consume`).
 * - **Job data**: `{"message_id": id, "body": "<UTF-8 text>"}`, or `body_b64` for bytes that are
 *   not UTF-8.
 * - **Outcome envelopes**: `outcome@1` messages (the generated `OutcomeV1`): the job's identity
 *   echoed (`runId`, `stage`, `attempt`, `fence`, `tenant`), `correlationId` = the run id,
 *   `causationId` = the job's message id, `producer`, `occurredAt`, and `contractVersion` = the
 *   version of the payload's contract (`stage-accepted`, `stage-heartbeat`, `progress`,
 *   `stage-failed`, or for `succeeded` the job's `resultSchemaVersion`). The message id is
 *   `<job message id>:<kind>` (plus `:<n>` for the n-th heartbeat), so a job served twice answers
 *   with the same ids and the transport drops the copy. Bodies are canonical JSON (sorted keys,
 *   no spaces), as Python's `canonical_json`.
 */

import type { OutcomeV1 } from "@accord/contracts";

export const OUTCOMES_QUEUE = "accord.outcomes";

export function jobIdFor(messageId: string): string {
  return "m-" + messageId.replace(/%/g, "%25").replace(/:/g, "%3A");
}

export function messageIdOf(jobId: string): string {
  return jobId.slice(2).replace(/%3A/g, ":").replace(/%25/g, "%");
}

export interface JobData {
  message_id: string;
  body?: string;
  body_b64?: string;
}

export function jobData(messageId: string, body: string): JobData {
  return { message_id: messageId, body };
}

/** The body bytes of a job's data (either encoding), or `undefined` when it carries none. */
export function jobBody(data: unknown): Buffer | undefined {
  if (typeof data !== "object" || data === null) return undefined;
  const record = data as Record<string, unknown>;
  if (typeof record.body_b64 === "string") return Buffer.from(record.body_b64, "base64");
  if (typeof record.body === "string") return Buffer.from(record.body, "utf8");
  return undefined;
}

/** Sorted keys, no insignificant whitespace; refuses non-finite numbers as Python does. */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value === "boolean" || typeof value === "string") return JSON.stringify(value);
  if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new RangeError("canonical JSON has no NaN or infinity");
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (typeof value === "object") {
    const entries = Object.entries(value as Record<string, unknown>).filter(([, v]) => v !== undefined);
    entries.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(",")}}`;
  }
  throw new TypeError(`cannot serialise ${typeof value}`);
}

/** The fields of a job envelope an outcome must echo. */
export interface JobIdentity {
  messageId: string;
  runId: string;
  stage: string;
  attempt: number;
  fence: string;
  tenant: string;
  /** The result contract version the job asks for (`resultSchemaVersion`, 1 when unstated). */
  resultSchemaVersion: number;
  /** Who the outcomes name as their producer (`DEFAULT_PRODUCER` when unset). */
  producer?: string;
}

/** An outcome's producer when the worker names none. */
export const DEFAULT_PRODUCER = "accord-worker";

/** The identity of a decoded job envelope, or a reason it has none. */
export function identityOf(envelope: unknown): JobIdentity | string {
  if (typeof envelope !== "object" || envelope === null || Array.isArray(envelope)) return "the envelope is not a JSON object";
  const e = envelope as Record<string, unknown>;
  for (const key of ["messageId", "runId", "stage", "fence"]) {
    if (typeof e[key] !== "string" || e[key] === "") return `envelope field ${key} must be a non-empty string`;
  }
  if (typeof e.attempt !== "number" || !Number.isInteger(e.attempt)) return "envelope field attempt must be an integer";
  const tenant = typeof e.tenant === "string" ? e.tenant : "";
  const version = e.resultSchemaVersion;
  const resultSchemaVersion = typeof version === "number" && Number.isInteger(version) && version > 0 ? version : 1;
  return {
    messageId: e.messageId as string, runId: e.runId as string, stage: e.stage as string,
    attempt: e.attempt, fence: e.fence as string, tenant, resultSchemaVersion,
  };
}

export type OutcomeKind = "accepted" | "heartbeat" | "progress" | "succeeded" | "failed";

export interface Outcome {
  messageId: string;
  body: string;
}

/** Epoch milliseconds as RFC 3339 UTC with milliseconds, as the engine writes times. */
export function isoMs(atMs: number): string {
  return new Date(atMs).toISOString();
}

/**
 * One outcome@1 answering `job`. `extra` adds top-level fields (`workerId` on `accepted`; a
 * `producer` there overrides the job's).
 */
export function outcome(
  job: JobIdentity, kind: OutcomeKind, payload: Record<string, unknown> = {}, seq = 0,
  extra: Record<string, unknown> = {}, atMs: number = Date.now(),
): Outcome {
  const messageId = `${job.messageId}:${kind}` + (seq ? `:${seq}` : "");
  const workerId = typeof extra.workerId === "string" ? extra.workerId : undefined;
  const doc: OutcomeV1 = {
    messageId, messageType: kind,
    contractVersion: kind === "succeeded" ? job.resultSchemaVersion : 1,
    correlationId: job.runId, causationId: job.messageId,
    producer: job.producer ?? workerId ?? DEFAULT_PRODUCER,
    occurredAt: isoMs(atMs),
    runId: job.runId, stage: job.stage, attempt: job.attempt,
    fence: job.fence, tenant: job.tenant, payload, ...extra,
  };
  return { messageId, body: canonicalJson(doc) };
}
