#!/usr/bin/env node
/**
 * `accord-metadata-extract`: serve `metadata.extract@2` until SIGTERM or SIGINT.
 *
 * Flags and environment are described in ./config. One JSON line goes to stdout when the worker
 * is consuming (`{"event":"ready",...}`) and one when it has stopped; events and failures go to
 * stderr as JSON lines. A bad configuration exits 2 with the reason; a clean stop exits 0.
 */

import { ConfigError, parseConfig } from "./config";
import { MetadataWorker } from "./runtime";

async function main(): Promise<number> {
  let worker: MetadataWorker;
  try {
    worker = new MetadataWorker(parseConfig(process.argv.slice(2), process.env), (event) =>
      process.stderr.write(JSON.stringify(event) + "\n"),
    );
  } catch (error) {
    if (error instanceof ConfigError) {
      process.stderr.write(`accord-metadata-extract: ${error.message}\n`);
      return 2;
    }
    throw error;
  }
  await worker.start();
  const { queue, workerId } = worker.config;
  process.stdout.write(JSON.stringify({ event: "ready", queue, workerId }) + "\n");
  await new Promise<void>((resolve) => {
    process.once("SIGTERM", resolve);
    process.once("SIGINT", resolve);
  });
  await worker.close();
  process.stdout.write(JSON.stringify({ event: "stopped", served: worker.served }) + "\n");
  return 0;
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    process.stderr.write(`accord-metadata-extract: ${error instanceof Error ? error.stack : String(error)}\n`);
    process.exit(1);
  },
);
