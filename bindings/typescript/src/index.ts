// Runtime validation of Accord message contracts, agreeing with accord.contracts.validate:
// defaults fill only missing fields, null only where nullable, unknown fields refused unless a
// declared tolerance applies (and the validator is tolerant), every failing path reported once
// per (path, code), sorted, in the shared path spelling. Ajv (draft 2020-12, all errors, strict
// schema mode) checks the structure; the formats are the generated copy of the Python table.

import Ajv2020, { type ErrorObject, type ValidateFunction } from "ajv/dist/2020";

import { CONTRACTS, type ContractEntry } from "./generated/registry";
import { FORMAT_PATTERNS } from "./generated/formats";
import { normalise, toleranceTree, type Schema } from "./normalise";
import { fromPointer, join } from "./paths";
import { decodeUtf8, JsonRejected, parseStrict } from "./strictjson";

export * from "./generated/types";
export { CONTRACTS } from "./generated/registry";
export * from "./cloudevents";
export * from "./sealing";

export interface PathError {
  path: string;
  message: string;
  code: string;
}

export interface ValidationResult {
  ok: boolean;
  errors: PathError[];
  /** The normalised message (defaults applied, tolerated fields dropped). */
  value: unknown;
  ignored: string[];
}

export interface ValidateOptions {
  tolerate?: boolean;
}

const CODES: Record<string, string> = {
  type: "wrong-type",
  enum: "not-in-enum",
  pattern: "pattern",
  format: "format",
  minLength: "too-short",
  maxLength: "too-long",
  minimum: "too-small",
  exclusiveMinimum: "too-small",
  maximum: "too-large",
  exclusiveMaximum: "too-large",
  multipleOf: "not-multiple",
  minItems: "too-few-items",
  maxItems: "too-many-items",
};

const ajv = new Ajv2020({ allErrors: true, strict: true, allowUnionTypes: true });
for (const keyword of ["x-accord-unit", "x-accord-sensitive", "x-accord-contract"]) {
  ajv.addKeyword({ keyword, schemaType: ["string", "boolean", "object"] });
}
const knownFormats = new Set<string>();
for (const [name, pattern] of Object.entries(FORMAT_PATTERNS)) {
  const regex = new RegExp(pattern, "u");
  ajv.addFormat(name, { type: "string", validate: (s: string) => regex.test(s) });
  knownFormats.add(name);
}
const compiled = new Map<string, ValidateFunction>();

function formatsOf(node: unknown, found: Set<string>): Set<string> {
  if (Array.isArray(node)) node.forEach((n) => formatsOf(n, found));
  else if (typeof node === "object" && node !== null) {
    for (const [key, value] of Object.entries(node)) {
      if (key === "format" && typeof value === "string") found.add(value);
      else formatsOf(value, found);
    }
  }
  return found;
}

function entryFor(name: string, version: number): ContractEntry {
  const entry = CONTRACTS[`${name}@${version}`];
  if (!entry) throw new Error(`unknown message contract ${name}@${version}`);
  return entry;
}

function validatorFor(key: string, entry: ContractEntry): ValidateFunction {
  let fn = compiled.get(key);
  if (!fn) {
    for (const format of formatsOf(entry.schema, new Set())) {
      // A format Accord does not define is an annotation only, as in Python.
      if (!knownFormats.has(format)) {
        ajv.addFormat(format, true);
        knownFormats.add(format);
      }
    }
    fn = ajv.compile(entry.schema);
    compiled.set(key, fn);
  }
  return fn;
}

function translate(error: ErrorObject, root: unknown): PathError[] {
  const { path, value } = fromPointer(error.instancePath, root);
  const params = error.params as Record<string, unknown>;
  switch (error.keyword) {
    case "required":
      return [{ path: join(path, String(params.missingProperty)), message: "required field is missing", code: "missing" }];
    case "additionalProperties":
      return [{ path: join(path, String(params.additionalProperty)), message: "unknown field (not in the contract)", code: "unknown-field" }];
    case "type":
      if (value === null) return [{ path, message: "null is not allowed here (not nullable)", code: "null-not-allowed" }];
      break;
    default:
      break;
  }
  return [{ path, message: error.message ?? error.keyword, code: CODES[error.keyword] ?? "invalid" }];
}

/** Validates a decoded message against `name@version`; never throws for bad input. */
export function validate(
  name: string,
  version: number,
  value: unknown,
  options: ValidateOptions = {},
): ValidationResult {
  const entry = entryFor(name, version);
  const validator = validatorFor(`${name}@${version}`, entry);
  const tree = toleranceTree(options.tolerate ? entry.tolerates : []);
  const ignored: string[] = [];
  const normalised = normalise(entry.schema as Schema, value, tree, "", ignored);
  if (validator(normalised)) return { ok: true, errors: [], value: normalised, ignored };
  const found = new Map<string, PathError>();
  for (const error of validator.errors ?? []) {
    for (const item of translate(error, normalised)) {
      const key = `${item.path}\u0000${item.code}`;
      if (!found.has(key)) found.set(key, item);
    }
  }
  const errors = [...found.values()].sort((a, b) =>
    a.path < b.path ? -1 : a.path > b.path ? 1 : a.code < b.code ? -1 : a.code > b.code ? 1 : 0,
  );
  return { ok: false, errors, value: normalised, ignored };
}

/**
 * Like `validate` but for JSON text or UTF-8 bytes: input over the contract's byte limit is
 * refused before decoding, then decoding is strict (see ./strictjson), as in Python.
 */
export function validateJson(
  name: string,
  version: number,
  input: string | Uint8Array,
  options: ValidateOptions = {},
): ValidationResult {
  const entry = entryFor(name, version);
  const size = typeof input === "string" ? Buffer.byteLength(input, "utf8") : input.byteLength;
  if (size > entry.maxBytes) {
    const message = `${size} bytes exceeds the limit of ${entry.maxBytes}`;
    return { ok: false, errors: [{ path: "", message, code: "oversized" }], value: undefined, ignored: [] };
  }
  let value: unknown;
  try {
    value = parseStrict(typeof input === "string" ? input : decodeUtf8(input));
  } catch (error) {
    if (!(error instanceof JsonRejected)) throw error;
    return { ok: false, errors: [{ path: "", message: error.message, code: error.code }], value: undefined, ignored: [] };
  }
  return validate(name, version, value, options);
}
