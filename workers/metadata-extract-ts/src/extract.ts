/**
 * `metadata.extract@2`: check the request, find the model, refuse it if too large, measure it.
 *
 * The request is validated with the generated bindings (`metadata-extraction-request@1`, defaults
 * filled: `computeVolume` is `true` unless stated) and so is the result (`technical-metadata@1`)
 * before anything is published: a request that breaks its contract is a terminal
 * `invalid-request`, a result that would break its contract a terminal `invalid-result`. The
 * model is `objectKey` (or `models/<modelId>.stl`, then `.obj`, when the request names no key) in
 * the tenant's store behind `storageConnectionRef`; its size is checked with `stat` before a byte
 * is read. Large models are measured in a limited thread (./offload).
 */

import { promises as fs } from "node:fs";

import { validate } from "@accord/contracts";

import { WorkFailure } from "./failure";
import { formatOf } from "./mesh";
import type { TechnicalMetadata } from "./measure";
import { LIMITS, measureModel, type Limits } from "./offload";
import type { StorageMap } from "./paths";

export const CAPABILITY = "metadata.extract@2";
export const REQUEST = { name: "metadata-extraction-request", version: 1 } as const;
export const RESULT = { name: "technical-metadata", version: 1 } as const;
/** The capability contract's `inputBytes` limit (512 MiB). */
export const INPUT_BYTES = 512 * 1024 * 1024;

export interface ExtractOptions {
  storage: StorageMap;
  inputBytes?: number;
  limits?: Partial<Limits>;
}

interface Request {
  modelId: string;
  storageConnectionRef?: string;
  objectKey?: string;
  computeVolume: boolean;
}

function described(errors: { path: string; message: string }[]): string {
  return errors.slice(0, 10).map((e) => `${e.path || "<root>"}: ${e.message}`).join("; ");
}

export function checkRequest(payload: unknown): Request {
  const checked = validate(REQUEST.name, REQUEST.version, payload);
  if (!checked.ok) {
    throw new WorkFailure("invalid-request", `request breaks ${REQUEST.name}@${REQUEST.version}: ${described(checked.errors)}`);
  }
  return checked.value as Request;
}

export function checkResult(result: TechnicalMetadata): TechnicalMetadata {
  const checked = validate(RESULT.name, RESULT.version, result);
  if (!checked.ok) {
    throw new WorkFailure("invalid-result", `result breaks ${RESULT.name}@${RESULT.version}: ${described(checked.errors)}`);
  }
  return checked.value as TechnicalMetadata;
}

function locate(request: Request, tenant: string, storage: StorageMap): { key: string; file: string } {
  if (request.objectKey !== undefined) {
    return { key: request.objectKey, file: storage.locate(request.storageConnectionRef, tenant, request.objectKey) };
  }
  for (const ext of ["stl", "obj"]) {
    const key = `models/${request.modelId}.${ext}`;
    try {
      return { key, file: storage.locate(request.storageConnectionRef, tenant, key) };
    } catch (error) {
      if (!(error instanceof WorkFailure && error.code === "object-not-found")) throw error;
    }
  }
  throw new WorkFailure("object-not-found", `no model stored for modelId ${JSON.stringify(request.modelId)} under models/`);
}

async function readBounded(file: string, limit: number): Promise<Buffer> {
  let size: number;
  try {
    const stat = await fs.stat(file);
    if (!stat.isFile()) throw new WorkFailure("object-not-found", "the object is not a regular file");
    size = stat.size;
  } catch (error) {
    if (error instanceof WorkFailure) throw error;
    throw new WorkFailure("storage-unavailable", `cannot read the object: ${(error as Error).message}`, true);
  }
  if (size > limit) throw new WorkFailure("input-too-large", `the model is ${size} bytes; the limit is ${limit}`);
  const handle = await fs.open(file, "r");
  try {
    // read at most limit + 1 bytes: a file that grew after stat is still refused, never slurped
    const buffer = Buffer.alloc(Math.min(size, limit) + 1);
    const { bytesRead } = await handle.read(buffer, 0, buffer.length, 0);
    if (bytesRead > limit) throw new WorkFailure("input-too-large", `the model grew past the limit of ${limit} bytes`);
    return buffer.subarray(0, bytesRead);
  } finally {
    await handle.close();
  }
}

/** Measure the model a request names, for `tenant`; throws `WorkFailure` for every refusal. */
export async function extract(payload: unknown, tenant: string, options: ExtractOptions): Promise<TechnicalMetadata> {
  const request = checkRequest(payload);
  const { key, file } = locate(request, tenant, options.storage);
  const format = formatOf(key);
  const bytes = await readBounded(file, options.inputBytes ?? INPUT_BYTES);
  const job = { format, bytes, modelId: request.modelId, computeVolume: request.computeVolume !== false };
  return checkResult(await measureModel(job, { ...LIMITS, ...options.limits }));
}
