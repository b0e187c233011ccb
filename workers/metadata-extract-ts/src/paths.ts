/**
 * Object keys and tenants from payloads, turned into paths that cannot leave the storage root.
 *
 * The same rules as the Python store (`accord.worker.paths`): both the tenant (from the
 * envelope) and the object key (from the payload) come from outside, so both are checked twice —
 * as text, refusing rather than normalising (absolute paths, drive letters, backslashes, NUL and
 * control characters, `.`/`..`/empty segments, percent-encoding, text that changes under NFKC,
 * characters outside `[A-Za-z0-9._~+=@-]`), then on the filesystem: the real path, after every
 * symlink is followed, must still lie under `realpath(root)/tenant`. Every refusal is a terminal
 * `invalid-object-key`.
 *
 * A storage root is configured per `storageConnectionRef` name (`local` by default); a ref that
 * names no configured root is a terminal `storage-unavailable`.
 */

import { realpathSync } from "node:fs";
import * as path from "node:path";

import { WorkFailure } from "./failure";

export const MAX_KEY_LENGTH = 1024;
export const DEFAULT_REF = "local";
const TENANT = /^[A-Za-z0-9_-]{1,64}$/;
const SEGMENT = /^[A-Za-z0-9._~+=@-]+$/;
const DRIVE = /^[A-Za-z]:/;

function refuse(reason: string, value: string): WorkFailure {
  const shown = JSON.stringify(value).slice(0, 200);
  return new WorkFailure("invalid-object-key", `${reason}: ${shown}`, false, { objectKey: shown });
}

export function validateTenant(tenant: unknown): string {
  if (typeof tenant !== "string" || !TENANT.test(tenant)) {
    throw refuse("tenant must match [A-Za-z0-9_-]{1,64}", String(tenant));
  }
  return tenant;
}

/** Returns `key` unchanged when it is a plain relative key; throws `invalid-object-key`. */
export function validateObjectKey(key: unknown): string {
  if (typeof key !== "string" || key.length === 0) throw refuse("object key is empty or not a string", String(key));
  if (key.length > MAX_KEY_LENGTH) throw refuse(`object key is longer than ${MAX_KEY_LENGTH} characters`, key);
  for (const ch of key) {
    const code = ch.codePointAt(0) ?? 0;
    if (code < 0x20 || code === 0x7f) throw refuse("object key contains a NUL or control character", key);
  }
  if (key.includes("\\")) throw refuse("object key contains a backslash", key);
  if (key.includes("%")) throw refuse("object key contains percent-encoding", key);
  if (key.normalize("NFKC") !== key) throw refuse("object key changes under Unicode normalisation (NFKC)", key);
  if (key.startsWith("/") || DRIVE.test(key)) throw refuse("object key is an absolute path", key);
  for (const segment of key.split("/")) {
    if (segment === "" || segment === "." || segment === "..") {
      throw refuse("object key has an empty, '.' or '..' segment", key);
    }
    if (!SEGMENT.test(segment)) throw refuse("object key segment has characters outside [A-Za-z0-9._~+=@-]", key);
  }
  return key;
}

function within(child: string, parent: string): boolean {
  const rel = path.relative(parent, child);
  return rel !== "" && !rel.startsWith("..") && !path.isAbsolute(rel);
}

function realpathOrMissing(file: string, key: string): string {
  try {
    return realpathSync(file);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT" || code === "ENOTDIR") {
      throw new WorkFailure("object-not-found", `no object ${JSON.stringify(key)} in this tenant's store`, false, {
        objectKey: key,
      });
    }
    throw new WorkFailure("storage-unavailable", `cannot resolve the object: ${code ?? "error"}`, true);
  }
}

/**
 * The real path of an existing object `key` under `root/tenant`, refusing anything that leaves
 * the tenant's directory (text rules first, then the real path after symlinks).
 */
export function resolveObject(root: string, tenant: string, key: string): string {
  validateTenant(tenant);
  validateObjectKey(key);
  const top = realpathOrMissing(root, ".");
  const base = realpathOrMissing(path.join(top, tenant), key);
  if (!within(base, top)) throw refuse("the tenant's directory is a link out of the storage root", tenant);
  const target = realpathOrMissing(path.join(base, key), key);
  if (!within(target, base)) throw refuse("object key resolves outside the tenant's storage root", key);
  return target;
}

/** Configured `storageConnectionRef` names → root directories. */
export class StorageMap {
  constructor(readonly roots: ReadonlyMap<string, string>) {}

  static local(root: string): StorageMap {
    return new StorageMap(new Map([[DEFAULT_REF, root]]));
  }

  /** The checked path of `key` for `tenant` in the store `ref` names (`local` when absent). */
  locate(ref: string | undefined, tenant: string, key: string): string {
    const root = this.roots.get(ref ?? DEFAULT_REF);
    if (root === undefined) {
      throw new WorkFailure("storage-unavailable", "storageConnectionRef names no configured store", false);
    }
    return resolveObject(root, tenant, key);
  }
}
