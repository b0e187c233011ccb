/**
 * A classified failure: what the worker reports as a `failed` outcome instead of crashing.
 *
 * `code` follows the terminal-error grammar (`^[a-z][a-z0-9-]*$`); `retryable` tells the engine
 * whether another attempt could succeed (a storage hiccup) or not (a corrupt model, a bad key).
 * Anything thrown that is not a `WorkFailure` is a bug or an outage, reported as retryable
 * `worker-error` so the engine's retry policy, not this process, decides what happens next.
 */

import type { StageFailedV1 } from "@accord/contracts";

export class WorkFailure extends Error {
  readonly code: string;
  readonly retryable: boolean;
  readonly details: Record<string, unknown>;

  constructor(code: string, message: string, retryable = false, details: Record<string, unknown> = {}) {
    super(message);
    this.name = "WorkFailure";
    this.code = code;
    this.retryable = retryable;
    this.details = details;
  }
}

/** The `failed` payload, `stage-failed@1`, as the generated bindings type it. */
export type FailurePayload = StageFailedV1;

/** The `failed` outcome payload for anything thrown while serving a job. */
export function failurePayload(error: unknown): FailurePayload {
  if (error instanceof WorkFailure) {
    return { code: error.code, message: error.message.slice(0, 2000), retryable: error.retryable };
  }
  const message = error instanceof Error ? error.message : String(error);
  return { code: "worker-error", message: message.slice(0, 2000), retryable: true };
}
