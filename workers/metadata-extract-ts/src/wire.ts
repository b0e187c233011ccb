/**
 * The wire as the Python BullMQ transport writes it, so both sides agree byte for byte.
 *
 * - **Job ids**: `m-` + the message id with `%` and `:` percent-escaped (`%` first), one-to-one,
 *   never integer-like and never containing `:` (`accord.adapters.transports._bullmq_consume`).
 * - **Job data**: `{"message_id": id, "body": "<UTF-8 text>"}`, or `body_b64` for bytes that are
 *   not UTF-8.
 * - **Outcomes**: `outcome@1` documents built on the generated bindings (`OutcomeV1` and the
 *   payload types its `messageType` selects: `StageAcceptedV1`, `StageHeartbeatV1`, `ProgressV1`,
 *   the job's result contract for `succeeded`, `StageFailedV1`), as docs/protocol.md §4 lists
 *   them. Every outcome is checked by the generated validator (the outcome envelope, then its
 *   payload against the contract its kind selects) when it is built and again before it is
 *   published: an invalid outcome raises `InvalidOutcome` and is never sent. The message id is
 *   `<job message id>:<kind>` (plus `:<n>` for the n-th heartbeat or progress report), so a job
 *   served twice answers with the same ids and the transport drops the copy. Bodies are
 *   canonical JSON (sorted keys, no spaces), as Python's `canonical_json`.
 * - **Where outcomes go**: every outcome of a job goes to the job's `replyTo` queue (envelope@2:
 *   the queue of the engine that owns the run's shard), or to `accord.outcomes` (the worker's
 *   `--outcomes`) when the job has none (`JobIdentity.replyTo`, `replyQueue`).
 */

import {
  validate, validateJson,
  type OutcomeV1, type PathError, type ProgressV1, type StageAcceptedV1, type StageFailedV1,
  type StageHeartbeatV1, type TechnicalMetadataV1,
} from "@accord/contracts";

export const OUTCOMES_QUEUE = "accord.outcomes";

/** envelope@2's pattern for `replyTo`. A job whose replyTo breaks it is answered (as
 * `invalid-envelope`) on the shared outcome queue: a name that breaks the contract is not used. */
export const REPLY_TO = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$/;

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
  /** The queue every outcome of the job goes to (envelope@2 `replyTo`); unset: the outcome queue. */
  replyTo?: string;
}

/** The queue the outcomes of `job` go to: its `replyTo`, else `outcomes` (the shared queue). */
export function replyQueue(job: Pick<JobIdentity, "replyTo">, outcomes: string): string {
  return job.replyTo ?? outcomes;
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
  const replyTo = typeof e.replyTo === "string" && REPLY_TO.test(e.replyTo) ? e.replyTo : undefined;
  return {
    messageId: e.messageId as string, runId: e.runId as string, stage: e.stage as string,
    attempt: e.attempt, fence: e.fence as string, tenant, resultSchemaVersion,
    ...(replyTo === undefined ? {} : { replyTo }),
  };
}

export type OutcomeKind = OutcomeV1["messageType"];

/** The payload each kind of outcome carries (docs/protocol.md §4), as the generated types. */
export interface OutcomePayloads {
  accepted: StageAcceptedV1;
  heartbeat: StageHeartbeatV1;
  progress: ProgressV1;
  succeeded: TechnicalMetadataV1;
  failed: StageFailedV1;
}

/** The result contract of `metadata.extract@2`: what a `succeeded` payload is checked against. */
export const RESULT_CONTRACT = "technical-metadata";

/** The payload contract `messageType` selects; `succeeded` is the job's result contract. */
const PAYLOAD_CONTRACTS: Record<Exclude<OutcomeKind, "succeeded">, { name: string; version: number }> = {
  accepted: { name: "stage-accepted", version: 1 },
  heartbeat: { name: "stage-heartbeat", version: 1 },
  progress: { name: "progress", version: 1 },
  failed: { name: "stage-failed", version: 1 },
};

/** An outcome the generated validators refuse; it is never published. */
export class InvalidOutcome extends Error {
  constructor(readonly messageId: string, readonly errors: PathError[]) {
    super(`refusing to send outcome ${messageId}: ${errors.slice(0, 5).map((e) => `${e.path || "<root>"}: ${e.message}`).join("; ")}`);
    this.name = "InvalidOutcome";
  }
}

/** The errors of an outcome@1 document and of its payload under the contract its kind selects. */
export function outcomeErrors(doc: unknown): PathError[] {
  const envelope = validate("outcome", 1, doc);
  if (!envelope.ok) return envelope.errors;
  const checked = doc as OutcomeV1;
  const contract = checked.messageType === "succeeded"
    ? { name: RESULT_CONTRACT, version: checked.contractVersion }
    : PAYLOAD_CONTRACTS[checked.messageType];
  if (checked.contractVersion !== contract.version) {
    return [{ path: "contractVersion", message: `${checked.messageType} payloads are ${contract.name}@${contract.version}`, code: "invalid" }];
  }
  let payload;
  try {
    payload = validate(contract.name, contract.version, checked.payload);
  } catch (error) { // a contract the bindings do not have
    return [{ path: "contractVersion", message: (error as Error).message, code: "invalid" }];
  }
  return payload.errors.map((e) => ({ ...e, path: e.path ? `payload.${e.path}` : "payload" }));
}

export interface Outcome {
  messageId: string;
  body: string;
}

/** `out` when its body is a valid outcome (byte limit, strict JSON, contracts); else throws. */
export function checkedOutcome(out: Outcome): Outcome {
  const parsed = validateJson("outcome", 1, out.body);
  const errors = parsed.ok ? outcomeErrors(parsed.value) : parsed.errors;
  if (errors.length === 0 && (parsed.value as OutcomeV1).messageId !== out.messageId) {
    errors.push({ path: "messageId", message: `the body names ${(parsed.value as OutcomeV1).messageId}`, code: "invalid" });
  }
  if (errors.length) throw new InvalidOutcome(out.messageId, errors);
  return out;
}

/** Epoch milliseconds as RFC 3339 UTC with milliseconds, as the engine writes times. */
export function isoMs(atMs: number): string {
  return new Date(atMs).toISOString();
}

/** Top-level fields an outcome may add: `workerId` (on `accepted`), and a `producer` overriding the job's. */
export type OutcomeExtra = Partial<Pick<OutcomeV1, "workerId" | "producer">>;

/**
 * One outcome@1 answering `job`, checked by the generated validators; throws `InvalidOutcome`
 * rather than return one the engine would refuse.
 */
export function outcome<K extends OutcomeKind>(
  job: JobIdentity, kind: K, payload: OutcomePayloads[K], seq = 0,
  extra: OutcomeExtra = {}, atMs: number = Date.now(),
): Outcome {
  const messageId = `${job.messageId}:${kind}` + (seq ? `:${seq}` : "");
  const doc: OutcomeV1 = {
    messageId, messageType: kind,
    contractVersion: kind === "succeeded" ? job.resultSchemaVersion : PAYLOAD_CONTRACTS[kind as Exclude<OutcomeKind, "succeeded">].version,
    correlationId: job.runId, causationId: job.messageId,
    producer: extra.producer ?? job.producer ?? extra.workerId ?? DEFAULT_PRODUCER,
    occurredAt: isoMs(atMs),
    runId: job.runId, stage: job.stage, attempt: job.attempt,
    fence: job.fence, tenant: job.tenant,
    payload: payload as unknown as OutcomeV1["payload"],
    ...(extra.workerId === undefined ? {} : { workerId: extra.workerId }),
  };
  const errors = outcomeErrors(doc);
  if (errors.length) throw new InvalidOutcome(messageId, errors);
  return { messageId, body: canonicalJson(doc) };
}
