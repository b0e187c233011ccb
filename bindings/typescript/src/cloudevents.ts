// The CloudEvents 1.0 form of the envelope (envelope@2, and so envelope@1), both ways, without loss: the same
// mapping as accord.contracts.cloudevents (Python), attribute for attribute, so an event made
// in one language reads back in the other. docs/cloudevents.md has the table; in short:
//
//   id = messageId; source = "urn:accord:producer:" + percent-encoded producer;
//   type = "accord.<messageType>.v<contractVersion>"; dataschema = the published schema $id
//   "urn:accord:contract:<name>:<version>" (derived, checked); time = occurredAt, with the
//   exact text also in accordtime (SDKs re-render time; accordtime wins, same instant to the
//   millisecond); subject = "runs/<runId>[/stages/<stage>]" (derived, checked); data = payload
//   (application/json); traceparent as is; the other fields as accord* extensions; payloadRef
//   as accordrefdigest/accordrefkey/accordrefsize; explicit nulls named in accordnulls;
//   integers are CloudEvents Integers when they fit 32 bits, else their decimal digits.
//
// Binary mode (HTTP): ce-<name> headers percent-encoded as the HTTP binding's 3.1.3.2 says,
// content-type = datacontenttype, body = the payload's JSON text ("" without a payload).

import { decodeUtf8, JsonRejected, parseStrict } from "./strictjson";

export const SPECVERSION = "1.0";
export const JSON_CONTENT_TYPE = "application/json";
export const SOURCE_PREFIX = "urn:accord:producer:";
export const NULLS = "accordnulls";
export const TIME_TEXT = "accordtime";
const INT32_MIN = -(2 ** 31);
const INT32_MAX = 2 ** 31 - 1;

export type AttributeValue = string | number;
export type Attributes = Record<string, AttributeValue>;
export type Envelope = Record<string, unknown>;
type JsonObject = Record<string, unknown>;

export interface CloudEventParts {
  attributes: Attributes;
  /** The payload; undefined when the envelope has none (a payload is never null). */
  data: JsonObject | undefined;
}

export interface BinaryMessage {
  headers: Record<string, string>;
  /** The payload's JSON text (UTF-8 on the wire); "" without a payload. */
  body: string;
}

/** An envelope the mapping cannot carry, or an event it did not make; `attribute` names the
 * envelope field (on the way out) or the CloudEvents attribute (on the way back). */
export class CloudEventError extends Error {
  readonly attribute: string;
  readonly reason: string;
  constructor(attribute: string, reason: string) {
    super(`${attribute}: ${reason}`);
    this.name = "CloudEventError";
    this.attribute = attribute;
    this.reason = reason;
  }
}

export interface Extension {
  field: string;
  attribute: string;
  kind: "string" | "integer";
  nullable: boolean;
}

function ext(field: string, attribute: string, kind: "string" | "integer", nullable = false): Extension {
  return { field, attribute, kind, nullable };
}

export const EXTENSIONS: readonly Extension[] = [
  ext("correlationId", "accordcorrelation", "string"),
  ext("causationId", "accordcausation", "string", true),
  ext("tenant", "accordtenant", "string"),
  ext("workflow", "accordworkflow", "string"),
  ext("runId", "accordrun", "string"),
  ext("stage", "accordstage", "string"),
  ext("branch", "accordbranch", "string", true),
  ext("attempt", "accordattempt", "integer"),
  ext("fence", "accordfence", "string"),
  ext("definitionDigest", "accorddefdigest", "string"),
  ext("idempotencyKey", "accordidempotency", "string"),
  ext("deadline", "accorddeadline", "string"),
  ext("resultSchemaVersion", "accordresultver", "integer"),
  ext("traceparent", "traceparent", "string"),
  ext("replyTo", "accordreplyto", "string"), // envelope@2: where the job's outcomes go
];

export const PAYLOAD_REF: readonly Extension[] = [
  ext("digest", "accordrefdigest", "string"),
  ext("objectKey", "accordrefkey", "string"),
  ext("sizeBytes", "accordrefsize", "integer"),
];

const BY_ATTRIBUTE = new Map(EXTENSIONS.map((x) => [x.attribute, x]));
const REQUIRED = ["messageId", "messageType", "contractVersion", "producer", "occurredAt"];
const CORE = ["specversion", "id", "source", "type", "time", "dataschema", "subject", "datacontenttype"];
const ENVELOPE_FIELDS = new Set([...REQUIRED, ...EXTENSIONS.map((x) => x.field), "payload", "payloadRef"]);
const KNOWN = new Set([
  ...CORE,
  ...EXTENSIONS.map((x) => x.attribute),
  ...PAYLOAD_REF.map((x) => x.attribute),
  NULLS,
  TIME_TEXT,
]);

const TYPE = /^accord\.([a-z][a-z0-9-]*)\.v([1-9][0-9]*)$/;
const MESSAGE_TYPE = /^[a-z][a-z0-9-]*$/;
const DECIMAL = /^-?(?:0|[1-9][0-9]*)$/;
const BAD_PERCENT = /%(?![0-9A-Fa-f]{2})/;
const DATE_TIME =
  /^([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))$/;

/** The published JSON Schema `$id` of a message contract (accord.contracts.jsonschema). */
export function schemaId(name: string, version: number): string {
  return `urn:accord:contract:${name}:${version}`;
}

function isObject(value: unknown): value is JsonObject {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function has(obj: object, key: string): boolean {
  return Object.prototype.hasOwnProperty.call(obj, key);
}

// -- envelope -> event --------------------------------------------------------------------------

export function toCloudEvent(envelope: unknown): CloudEventParts {
  if (!isObject(envelope)) throw new CloudEventError("$", "the envelope is not a JSON object");
  for (const name of Object.keys(envelope).sort()) {
    if (!ENVELOPE_FIELDS.has(name)) throw new CloudEventError(name, "not an envelope field");
  }
  for (const name of REQUIRED) if (!has(envelope, name)) throw new CloudEventError(name, "missing");
  const messageType = str(envelope, "messageType");
  if (!MESSAGE_TYPE.test(messageType)) {
    throw new CloudEventError("messageType", "does not match ^[a-z][a-z0-9-]*$");
  }
  const version = int(envelope, "contractVersion");
  if (version < 1) throw new CloudEventError("contractVersion", "must be at least 1");
  const occurred = str(envelope, "occurredAt");
  if (instant(occurred) === undefined) {
    throw new CloudEventError("occurredAt", "not an RFC 3339 date-time");
  }
  const attrs: Attributes = {
    specversion: SPECVERSION,
    id: str(envelope, "messageId"),
    source: SOURCE_PREFIX + percent(str(envelope, "producer"), "producer"),
    type: `accord.${messageType}.v${version}`,
    time: occurred,
    [TIME_TEXT]: occurred,
    dataschema: schemaId(messageType, version),
  };
  const nulls: string[] = [];
  for (const x of EXTENSIONS) {
    if (!has(envelope, x.field)) continue;
    if (envelope[x.field] === null) {
      if (!x.nullable) throw new CloudEventError(x.field, "null, and the envelope has no null here");
      nulls.push(x.attribute);
      continue;
    }
    attrs[x.attribute] = out(envelope, x);
  }
  if (nulls.length) attrs[NULLS] = nulls.sort().join(" ");
  const subj = subject(envelope.runId, envelope.stage);
  if (subj !== undefined) attrs.subject = subj;
  if (has(envelope, "payloadRef")) {
    const ref = envelope.payloadRef;
    if (!isObject(ref)) throw new CloudEventError("payloadRef", "not a JSON object");
    const fields = new Set(PAYLOAD_REF.map((x) => x.field));
    for (const name of Object.keys(ref).sort()) {
      if (!fields.has(name)) throw new CloudEventError(`payloadRef.${name}`, "not a payloadRef field");
    }
    for (const x of PAYLOAD_REF) {
      if (!has(ref, x.field)) throw new CloudEventError(`payloadRef.${x.field}`, "missing");
      attrs[x.attribute] = out(ref, x, "payloadRef.");
    }
  }
  let data: JsonObject | undefined;
  if (has(envelope, "payload")) {
    const payload = envelope.payload;
    if (!isObject(payload)) throw new CloudEventError("payload", "not a JSON object");
    data = payload;
    attrs.datacontenttype = JSON_CONTENT_TYPE;
  }
  return { attributes: attrs, data };
}

/** Structured mode: the event as one JSON object (application/cloudevents+json). */
export function toStructured(envelope: unknown): JsonObject {
  const { attributes, data } = toCloudEvent(envelope);
  return data === undefined ? { ...attributes } : { ...attributes, data };
}

/** Binary mode: ce-* headers, content-type and the payload's JSON text as body. */
export function toBinary(envelope: unknown): BinaryMessage {
  const { attributes, data } = toCloudEvent(envelope);
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(attributes)) {
    headers[name === "datacontenttype" ? "content-type" : `ce-${name}`] = headerEncode(String(value), name);
  }
  return { headers, body: data === undefined ? "" : JSON.stringify(data) };
}

// -- event -> envelope --------------------------------------------------------------------------

/** The envelope of an event toCloudEvent made (or an equal one an SDK re-encoded); `time` may be
 * a Date (as an SDK may hold it). */
export function fromCloudEvent(attributes: Record<string, unknown>, data?: unknown): Envelope {
  const attrs: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(attributes)) if (v !== undefined) attrs[k] = v;
  for (const name of Object.keys(attrs).sort()) {
    if (!KNOWN.has(name)) throw new CloudEventError(name, "not an attribute of the Accord mapping");
  }
  if (text(attrs, "specversion") !== SPECVERSION) {
    throw new CloudEventError("specversion", `must be '${SPECVERSION}'`);
  }
  const kind = TYPE.exec(text(attrs, "type"));
  if (kind === null) throw new CloudEventError("type", "not accord.<messageType>.v<contractVersion>");
  const messageType = kind[1] as string;
  const version = Number(kind[2]);
  if (!Number.isSafeInteger(version)) throw new CloudEventError("type", "contract version too large");
  const source = text(attrs, "source");
  if (!source.startsWith(SOURCE_PREFIX)) {
    throw new CloudEventError("source", `does not start with '${SOURCE_PREFIX}'`);
  }
  const envelope: Envelope = {
    messageId: text(attrs, "id"),
    messageType,
    contractVersion: version,
    producer: unpercent(source.slice(SOURCE_PREFIX.length), "source", true),
    occurredAt: occurredAt(attrs),
  };
  if (has(attrs, "dataschema") && text(attrs, "dataschema") !== schemaId(messageType, version)) {
    throw new CloudEventError("dataschema", `is not '${schemaId(messageType, version)}'`);
  }
  const nulls = nullNames(attrs);
  for (const x of EXTENSIONS) {
    if (nulls.has(x.attribute)) envelope[x.field] = null;
    else if (has(attrs, x.attribute)) envelope[x.field] = into(attrs, x);
  }
  const present = PAYLOAD_REF.filter((x) => has(attrs, x.attribute));
  if (present.length) {
    const missing = PAYLOAD_REF.find((x) => !has(attrs, x.attribute));
    if (missing) throw new CloudEventError(missing.attribute, "missing beside the other payloadRef ones");
    const ref: JsonObject = {};
    for (const x of PAYLOAD_REF) ref[x.field] = into(attrs, x);
    envelope.payloadRef = ref;
  }
  const subj = subject(envelope.runId, envelope.stage);
  if (attrs.subject !== subj) {
    const want = subj === undefined ? "absent without accordrun" : `'${subj}'`;
    throw new CloudEventError("subject", `must be ${want}, from accordrun and accordstage`);
  }
  if (data !== undefined && data !== null) {
    const contentType = attrs.datacontenttype;
    if (contentType !== undefined && !isJson(contentType)) {
      throw new CloudEventError("datacontenttype", `must be '${JSON_CONTENT_TYPE}'`);
    }
    if (!isObject(data)) throw new CloudEventError("data", "the payload must be a JSON object");
    envelope.payload = data;
  }
  return envelope;
}

/** The envelope of a structured-mode event (one JSON object). */
export function fromStructured(doc: unknown): Envelope {
  if (!isObject(doc)) throw new CloudEventError("$", "a structured event is a JSON object");
  if (has(doc, "data_base64")) throw new CloudEventError("data_base64", "the payload travels as JSON data");
  const attrs: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(doc)) if (k !== "data" && v !== null) attrs[k] = v;
  return fromCloudEvent(attrs, doc.data);
}

/** The envelope of a binary-mode event: ce-* headers, content-type and the body (text or bytes). */
export function fromBinary(headers: Record<string, unknown>, body: string | Uint8Array): Envelope {
  const attrs: Record<string, unknown> = {};
  for (const [rawName, rawValue] of Object.entries(headers)) {
    const name = rawName.toLowerCase();
    const value = Number.isInteger(rawValue) ? String(rawValue) : rawValue;
    if (typeof value !== "string") throw new CloudEventError(name, "a header value is a string");
    if (name === "content-type") attrs.datacontenttype = value;
    else if (name.startsWith("ce-")) {
      if (has(attrs, name.slice(3))) throw new CloudEventError(name, "repeated");
      attrs[name.slice(3)] = unpercent(value, name, false);
    }
  }
  let data: unknown;
  const bytes = typeof body === "string" ? new TextEncoder().encode(body) : body;
  if (bytes.length) {
    if (!isJson(attrs.datacontenttype ?? "")) {
      throw new CloudEventError("content-type", `must be '${JSON_CONTENT_TYPE}' for a body`);
    }
    try {
      data = parseStrict(decodeUtf8(bytes));
    } catch (e) {
      if (e instanceof JsonRejected) throw new CloudEventError("body", `not strict JSON (${e.code}): ${e.message}`);
      throw e;
    }
    if (data === null) throw new CloudEventError("body", "the payload must be a JSON object");
  }
  return fromCloudEvent(attrs, data);
}

// -- the pieces ---------------------------------------------------------------------------------

function str(obj: JsonObject, name: string, prefix = ""): string {
  const value = obj[name];
  if (typeof value !== "string") throw new CloudEventError(prefix + name, "not a string");
  return value;
}

function int(obj: JsonObject, name: string, prefix = ""): number {
  const value = obj[name];
  if (typeof value !== "number" || !Number.isInteger(value)) {
    throw new CloudEventError(prefix + name, "not an integer");
  }
  if (!Number.isSafeInteger(value)) throw new CloudEventError(prefix + name, "beyond 2**53: not exact here");
  return value;
}

function out(obj: JsonObject, x: Extension, prefix = ""): AttributeValue {
  if (x.kind === "string") return str(obj, x.field, prefix);
  const value = int(obj, x.field, prefix);
  return value >= INT32_MIN && value <= INT32_MAX ? value : String(value);
}

function text(attrs: Record<string, unknown>, name: string): string {
  if (!has(attrs, name)) throw new CloudEventError(name, "missing");
  const value = attrs[name];
  if (typeof value !== "string") throw new CloudEventError(name, "not a string");
  return value;
}

function into(attrs: Record<string, unknown>, x: Extension): AttributeValue {
  const value = attrs[x.attribute];
  if (x.kind === "string") {
    if (typeof value !== "string") throw new CloudEventError(x.attribute, "not a string");
    return value;
  }
  if (typeof value === "number" && Number.isInteger(value)) return value;
  if (typeof value === "string" && DECIMAL.test(value)) {
    const n = Number(value);
    if (!Number.isSafeInteger(n)) throw new CloudEventError(x.attribute, "beyond 2**53: not exact here");
    return n;
  }
  throw new CloudEventError(x.attribute, "not an integer");
}

function nullNames(attrs: Record<string, unknown>): Set<string> {
  if (!has(attrs, NULLS)) return new Set();
  const names = text(attrs, NULLS).split(" ");
  for (const name of names) {
    const x = BY_ATTRIBUTE.get(name);
    if (x === undefined || !x.nullable) {
      throw new CloudEventError(NULLS, `'${name}' is not a nullable Accord attribute`);
    }
    if (has(attrs, name)) throw new CloudEventError(NULLS, `'${name}' is named null and also has a value`);
  }
  if (new Set(names).size !== names.length) throw new CloudEventError(NULLS, "names an attribute twice");
  return new Set(names);
}

function occurredAt(attrs: Record<string, unknown>): string {
  const stamp = attrs.time;
  if (stamp instanceof Date) attrs = { ...attrs, time: stamp.toISOString() };
  const time = text(attrs, "time");
  const when = instant(time);
  if (when === undefined) throw new CloudEventError("time", "not an RFC 3339 date-time");
  if (!has(attrs, TIME_TEXT)) return time;
  const exact = text(attrs, TIME_TEXT);
  const at = instant(exact);
  if (at === undefined) throw new CloudEventError(TIME_TEXT, "not an RFC 3339 date-time");
  if (at[0] !== when[0] || at[1] !== when[1]) {
    throw new CloudEventError("time", `is not the instant of ${TIME_TEXT} '${exact}'`);
  }
  return exact;
}

/** An RFC 3339 date-time as [seconds since the epoch, milliseconds]; plain arithmetic, as in
 * the Python binding, so a leap second (:60) is the next second in both. */
export function instant(value: string): [number, number] | undefined {
  const m = DATE_TIME.exec(value);
  if (m === null) return undefined;
  const [y, mo, d, h, mi, s] = [1, 2, 3, 4, 5, 6].map((i) => Number(m[i])) as [
    number, number, number, number, number, number,
  ];
  if (!(mo >= 1 && mo <= 12 && d >= 1 && d <= 31 && h <= 23 && mi <= 59 && s <= 60)) return undefined;
  let seconds = daysFromCivil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s;
  if (m[8]) {
    const offset = Number(m[9]) * 3600 + Number(m[10]) * 60;
    seconds -= m[8] === "+" ? offset : -offset;
  }
  const millis = Number((m[7] ?? "").padEnd(3, "0").slice(0, 3));
  return [seconds, millis];
}

function daysFromCivil(year: number, month: number, day: number): number {
  const y = month <= 2 ? year - 1 : year;
  const era = Math.floor(y / 400);
  const yoe = y - era * 400;
  const doy = Math.floor((153 * (month + (month > 2 ? -3 : 9)) + 2) / 5) + day - 1;
  return era * 146097 + yoe * 365 + Math.floor(yoe / 4) - Math.floor(yoe / 100) + doy - 719468;
}

function subject(run: unknown, stage: unknown): string | undefined {
  if (typeof run !== "string") return undefined;
  let out = "runs/" + percent(run, "runId");
  if (typeof stage === "string") out += "/stages/" + percent(stage, "stage");
  return out;
}

const UNRESERVED = /[A-Za-z0-9\-._~]/;
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

function utf8(value: string, name: string): Uint8Array {
  if (LONE_SURROGATE.test(value)) throw new CloudEventError(name, "not encodable as UTF-8 (a lone surrogate)");
  return new TextEncoder().encode(value);
}

function hex(b: number): string {
  return "%" + b.toString(16).toUpperCase().padStart(2, "0");
}

/** Every UTF-8 byte outside the URI unreserved set as %XX (upper-case hex). */
function percent(value: string, name: string): string {
  let out = "";
  for (const b of utf8(value, name)) out += b < 0x80 && UNRESERVED.test(String.fromCharCode(b)) ? String.fromCharCode(b) : hex(b);
  return out;
}

/** The HTTP binding's encoding: printable ASCII stays, except space, '"' and '%'. */
function headerEncode(value: string, name: string): string {
  let out = "";
  for (const b of utf8(value, name)) {
    out += b >= 0x21 && b <= 0x7e && b !== 0x22 && b !== 0x25 ? String.fromCharCode(b) : hex(b);
  }
  return out;
}

function unpercent(value: string, name: string, uri: boolean): string {
  if (BAD_PERCENT.test(value)) throw new CloudEventError(name, "a '%' not followed by two hex digits");
  const bytes: number[] = [];
  for (let i = 0; i < value.length; ) {
    const ch = value[i] as string;
    if (ch === "%") {
      bytes.push(parseInt(value.slice(i + 1, i + 3), 16));
      i += 3;
      continue;
    }
    const code = value.codePointAt(i) as number;
    const char = String.fromCodePoint(code);
    if (uri && !(code < 0x80 && UNRESERVED.test(char))) {
      throw new CloudEventError(name, `'${char}' must be percent-encoded`);
    }
    bytes.push(...new TextEncoder().encode(char));
    i += char.length;
  }
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(new Uint8Array(bytes));
  } catch {
    throw new CloudEventError(name, "percent-encoded bytes are not UTF-8");
  }
}

function isJson(contentType: unknown): boolean {
  if (typeof contentType !== "string") return false;
  return (contentType.split(";", 1)[0] as string).trim().toLowerCase() === JSON_CONTENT_TYPE;
}
