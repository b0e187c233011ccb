/**
 * Worker configuration from flags and environment, with the transport named by the same URL the
 * Python side uses: `bullmq://host:port/db?prefix=bull&visibility_ms=30000&max_deliveries=5
 * &dedup_ms=600000&stalled_ms=30000` (every option optional, defaults as in Python's
 * `QueueOptions`). Unknown options are refused, as the Python transport refuses them.
 *
 * Flags (each also read from the environment variable in brackets):
 *   --transport URL        [ACCORD_TRANSPORT]     default bullmq://127.0.0.1:6379/0
 *   --storage-root DIR     [ACCORD_OBJECT_ROOT]   root of the `local` store (required)
 *   --storage NAME=DIR     more storageConnectionRef names (repeatable)
 *   --queue NAME           [ACCORD_QUEUE]         default metadata
 *   --outcomes NAME        [ACCORD_OUTCOMES]      default accord.outcomes
 *   --concurrency N        [ACCORD_CONCURRENCY]   default 4
 *   --heartbeat-ms N       [ACCORD_HEARTBEAT_MS]  default 5000
 *   --input-bytes N        [ACCORD_INPUT_BYTES]   default 536870912 (the contract's limit)
 *   --worker-id ID         [ACCORD_WORKER_ID]     default metadata-extract-ts-<pid>
 */

export interface TransportConfig {
  host: string;
  port: number;
  db: number;
  prefix: string;
  visibilityMs: number;
  maxDeliveries: number;
  dedupMs: number;
  stalledMs: number;
}

export interface WorkerConfig {
  transport: TransportConfig;
  storage: Map<string, string>;
  queue: string;
  outcomes: string;
  concurrency: number;
  heartbeatMs: number;
  inputBytes: number;
  workerId: string;
  /** How long acceptance records are kept (covers any redelivery window). */
  acceptanceTtlMs: number;
}

export class ConfigError extends Error {}

const OPTIONS = new Set(["prefix", "visibility_ms", "max_deliveries", "dedup_ms", "stalled_ms"]);

function positive(name: string, text: string | undefined, fallback: number): number {
  if (text === undefined || text === "") return fallback;
  const value = Number(text);
  if (!Number.isInteger(value) || value < 1) throw new ConfigError(`${name} must be a positive integer, got ${JSON.stringify(text)}`);
  return value;
}

export function parseTransport(url: string): TransportConfig {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new ConfigError(`transport URL ${JSON.stringify(url)} is not a URL`);
  }
  if (parsed.protocol !== "bullmq:" && parsed.protocol !== "redis+bullmq:") {
    throw new ConfigError(`transport URL must start with bullmq:// (got ${parsed.protocol}//)`);
  }
  const unknown = [...parsed.searchParams.keys()].filter((k) => !OPTIONS.has(k)).sort();
  if (unknown.length) throw new ConfigError(`unknown transport option(s) ${unknown.join(", ")}`);
  const q = (k: string): string | undefined => parsed.searchParams.get(k) ?? undefined;
  const visibilityMs = positive("visibility_ms", q("visibility_ms"), 30_000);
  const dedup = q("dedup_ms");
  const db = parsed.pathname.replace(/^\//, "");
  if (db !== "" && !/^\d+$/.test(db)) throw new ConfigError(`transport URL database must be a number, got ${JSON.stringify(db)}`);
  return {
    host: parsed.hostname || "127.0.0.1",
    port: parsed.port ? Number(parsed.port) : 6379,
    db: db === "" ? 0 : Number(db),
    prefix: q("prefix") ?? "bull",
    visibilityMs,
    maxDeliveries: positive("max_deliveries", q("max_deliveries"), 5),
    dedupMs: dedup === undefined ? 600_000 : Math.max(0, Number(dedup) || 0),
    stalledMs: positive("stalled_ms", q("stalled_ms"), visibilityMs),
  };
}

export function parseConfig(argv: readonly string[], env: NodeJS.ProcessEnv): WorkerConfig {
  const flags = new Map<string, string>();
  const storage = new Map<string, string>();
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i]!;
    const value = argv[i + 1];
    if (!flag.startsWith("--") || value === undefined) throw new ConfigError(`expected --flag value, got ${JSON.stringify(flag)}`);
    i += 1;
    if (flag === "--storage") {
      const at = value.indexOf("=");
      if (at < 1) throw new ConfigError(`--storage takes NAME=DIR, got ${JSON.stringify(value)}`);
      storage.set(value.slice(0, at), value.slice(at + 1));
    } else {
      flags.set(flag.slice(2), value);
    }
  }
  const known = ["transport", "storage-root", "queue", "outcomes", "concurrency", "heartbeat-ms", "input-bytes", "worker-id"];
  const extra = [...flags.keys()].filter((k) => !known.includes(k));
  if (extra.length) throw new ConfigError(`unknown flag(s) --${extra.join(", --")}`);
  const get = (flag: string, name: string): string | undefined => flags.get(flag) ?? env[name];
  const root = get("storage-root", "ACCORD_OBJECT_ROOT");
  if (root) storage.set("local", root);
  if (storage.size === 0) throw new ConfigError("no storage root: pass --storage-root DIR or set ACCORD_OBJECT_ROOT");
  return {
    transport: parseTransport(get("transport", "ACCORD_TRANSPORT") ?? "bullmq://127.0.0.1:6379/0"),
    storage,
    queue: get("queue", "ACCORD_QUEUE") ?? "metadata",
    outcomes: get("outcomes", "ACCORD_OUTCOMES") ?? "accord.outcomes",
    concurrency: positive("concurrency", get("concurrency", "ACCORD_CONCURRENCY"), 4),
    heartbeatMs: positive("heartbeat-ms", get("heartbeat-ms", "ACCORD_HEARTBEAT_MS"), 5_000),
    inputBytes: positive("input-bytes", get("input-bytes", "ACCORD_INPUT_BYTES"), 512 * 1024 * 1024),
    workerId: get("worker-id", "ACCORD_WORKER_ID") ?? `metadata-extract-ts-${process.pid}`,
    acceptanceTtlMs: 7 * 24 * 3600 * 1000,
  };
}
