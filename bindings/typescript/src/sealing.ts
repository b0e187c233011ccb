// Sealed sensitive fields, as accord.contracts.sealing writes them: a string token
// `accord:sealed:v1:<key id>:<base64url(nonce ‖ ciphertext ‖ tag)>` standing where the clear
// value stood, AES-256-GCM with a 12-byte nonce, the additional data `accord:sealed:v1:<key id>`
// (the format version and the key id: a token moved to another id does not open), the plaintext
// the JSON of the value. A worker holding the key opens every token of a request before it
// validates it and calls its handler (`openAll`); a token under a key the ring lacks, an altered
// one, or one that reaches a worker without a key is a `SealingError`, never a wrong value.
// Keys come from ACCORD_SEALING_KEY (`<key id>:<base64 of 32 bytes>`, the current key) and
// ACCORD_SEALING_KEYS (retired keys, comma-separated, kept for opening only).

import { createCipheriv, createDecipheriv, randomBytes } from "node:crypto";

export const SEALED_PREFIX = "accord:sealed:v1:";
export const SEALING_KEY_ENV = "ACCORD_SEALING_KEY";
export const SEALING_KEYS_ENV = "ACCORD_SEALING_KEYS";
const KEY_BYTES = 32;
const NONCE = 12;
const TAG = 16;
const KID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;

export class SealingError extends Error {
  override name = "SealingError";
}

export function isSealed(value: unknown): value is string {
  return typeof value === "string" && value.startsWith(SEALED_PREFIX);
}

function entry(text: string, what: string): [string, Buffer] {
  const at = text.trim().indexOf(":");
  const kid = at < 0 ? "" : text.trim().slice(0, at);
  const b64 = at < 0 ? "" : text.trim().slice(at + 1).trim();
  if (!kid || !b64) throw new SealingError(`${what} must be <key id>:<base64 of ${KEY_BYTES} bytes>`);
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(b64)) throw new SealingError(`${what} '${kid}': not base64`);
  const key = Buffer.from(b64, "base64");
  if (key.length !== KEY_BYTES) throw new SealingError(`${what} '${kid}' is ${key.length} bytes, not ${KEY_BYTES}`);
  return [kid, key];
}

export class Keyring {
  private readonly keys: Map<string, Buffer>;

  constructor(readonly current: string, currentKey: Buffer, retired: Map<string, Buffer> = new Map()) {
    this.keys = new Map([...retired, [current, currentKey]]);
    for (const [kid, key] of this.keys) {
      if (!KID.test(kid)) throw new SealingError(`sealing key id '${kid}' must match ${KID.source}`);
      if (key.length !== KEY_BYTES) throw new SealingError(`sealing key '${kid}' is ${key.length} bytes, not ${KEY_BYTES}`);
    }
  }

  /** A ring from `<kid>:<base64 key>` and a comma-separated list of retired ones. */
  static parse(current: string, retired = ""): Keyring {
    const [kid, key] = entry(current, "sealing key");
    const old = new Map<string, Buffer>();
    for (const item of retired.split(",").map((s) => s.trim()).filter(Boolean)) {
      const [rid, rkey] = entry(item, "retired sealing key");
      old.set(rid, rkey);
    }
    return new Keyring(kid, key, old);
  }

  /** The ring the environment configures, or undefined when no key is set. */
  static fromEnv(env: NodeJS.ProcessEnv = process.env): Keyring | undefined {
    const current = (env[SEALING_KEY_ENV] ?? "").trim();
    const retired = env[SEALING_KEYS_ENV] ?? "";
    if (!current) {
      if (retired.trim()) throw new SealingError(`${SEALING_KEYS_ENV} is set but ${SEALING_KEY_ENV} is not`);
      return undefined;
    }
    return Keyring.parse(current, retired);
  }

  get kids(): string[] {
    return [...this.keys.keys()].sort();
  }

  seal(value: unknown): string {
    const nonce = randomBytes(NONCE);
    const cipher = createCipheriv("aes-256-gcm", this.keys.get(this.current) as Buffer, nonce);
    cipher.setAAD(Buffer.from(SEALED_PREFIX + this.current, "utf8"));
    const body = Buffer.concat([cipher.update(JSON.stringify(value), "utf8"), cipher.final()]);
    const raw = Buffer.concat([nonce, body, cipher.getAuthTag()]);
    return `${SEALED_PREFIX}${this.current}:${raw.toString("base64url")}`;
  }

  open(token: string): unknown {
    if (!isSealed(token)) throw new SealingError("not a sealed value");
    const rest = token.slice(SEALED_PREFIX.length);
    const at = rest.indexOf(":");
    if (at < 0) throw new SealingError("sealed value has no key id");
    const kid = rest.slice(0, at);
    const key = this.keys.get(kid);
    if (key === undefined) {
      throw new SealingError(`sealed with key '${kid}', which this keyring lacks (it has ${this.kids.join(", ")})`);
    }
    const raw = Buffer.from(rest.slice(at + 1), "base64url");
    if (raw.length < NONCE + TAG) throw new SealingError(`sealed value under key '${kid}' is truncated`);
    const decipher = createDecipheriv("aes-256-gcm", key, raw.subarray(0, NONCE));
    decipher.setAAD(Buffer.from(SEALED_PREFIX + kid, "utf8"));
    decipher.setAuthTag(raw.subarray(raw.length - TAG));
    let plain: string;
    try {
      plain = Buffer.concat([decipher.update(raw.subarray(NONCE, raw.length - TAG)), decipher.final()]).toString("utf8");
    } catch {
      throw new SealingError(`sealed value under key '${kid}' does not open (altered, or another key)`);
    }
    return JSON.parse(plain);
  }
}

/** `value` with every sealed token in it, at any depth, opened (the input is not mutated). */
export function openAll(value: unknown, keyring: Keyring | undefined): unknown {
  if (typeof value === "string") {
    if (!isSealed(value)) return value;
    if (keyring === undefined) throw new SealingError("a sealed value arrived and no sealing key is configured");
    return keyring.open(value);
  }
  if (Array.isArray(value)) return value.map((item) => openAll(item, keyring));
  if (value !== null && typeof value === "object") {
    const out: Record<string, unknown> = {};
    for (const [name, member] of Object.entries(value)) out[name] = openAll(member, keyring);
    return out;
  }
  return value;
}
