/**
 * Parsing and measuring off the event loop, for models big enough to take time.
 *
 * Parsing is synchronous CPU work. On the main thread it would stop the event loop, and with it
 * BullMQ's lock renewal and this worker's heartbeats, so a long parse would look like a dead
 * worker and the job would stall. Models above `threadAboveBytes` are therefore measured in a
 * `worker_threads` thread with its own heap limit and a wall-clock limit: running out of heap is
 * a terminal `memory-limit`, running out of time a terminal `parse-timeout` (the Python worker's
 * codes for the same sandbox limits). Small models are measured inline: a thread costs more to
 * start than they take to parse.
 */

import { isMainThread, parentPort, Worker, workerData } from "node:worker_threads";

import { failurePayload, WorkFailure } from "./failure";
import { parseModel, type Format } from "./mesh";
import { measure, type TechnicalMetadata } from "./measure";

export interface MeasureJob {
  format: Format;
  bytes: Uint8Array;
  modelId: string;
  computeVolume: boolean;
}

export interface Limits {
  threadAboveBytes: number;
  timeMs: number;
  memoryMb: number;
}

/** The capability contract's limits: 120 s and 1 GiB. */
export const LIMITS: Limits = { threadAboveBytes: 1 << 20, timeMs: 120_000, memoryMb: 1024 };

function measureNow(job: MeasureJob): TechnicalMetadata {
  return measure(parseModel(job.format, job.bytes), job.modelId, job.computeVolume);
}

export function measureModel(job: MeasureJob, limits: Limits = LIMITS): Promise<TechnicalMetadata> {
  if (job.bytes.byteLength <= limits.threadAboveBytes) return Promise.resolve(measureNow(job));
  return new Promise((resolve, reject) => {
    const thread = new Worker(__filename, {
      workerData: job,
      // moved, not copied (models can be large); buffers this big never share Node's Buffer pool
      transferList: job.bytes.byteLength >= Buffer.poolSize ? [job.bytes.buffer as ArrayBuffer] : [],
      resourceLimits: { maxOldGenerationSizeMb: limits.memoryMb },
    });
    let settled = false;
    const settle = (fn: () => void): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      fn();
    };
    const timer = setTimeout(() => {
      settle(() => reject(new WorkFailure("parse-timeout", `measuring took longer than ${limits.timeMs} ms`)));
      void thread.terminate();
    }, limits.timeMs);
    thread.once("message", (reply: { result?: TechnicalMetadata; failure?: { code: string; message: string; retryable: boolean } }) =>
      settle(() =>
        reply.result !== undefined
          ? resolve(reply.result)
          : reject(new WorkFailure(reply.failure!.code, reply.failure!.message, reply.failure!.retryable)),
      ),
    );
    thread.once("error", (error: NodeJS.ErrnoException) =>
      settle(() =>
        reject(
          error.code === "ERR_WORKER_OUT_OF_MEMORY"
            ? new WorkFailure("memory-limit", `measuring needed more than ${limits.memoryMb} MiB`)
            : error,
        ),
      ),
    );
    thread.once("exit", (code) => settle(() => reject(new Error(`the measuring thread exited with ${code}`))));
  });
}

if (!isMainThread && parentPort !== null) {
  try {
    parentPort.postMessage({ result: measureNow(workerData as MeasureJob) });
  } catch (error) {
    parentPort.postMessage({ failure: failurePayload(error) });
  }
}
