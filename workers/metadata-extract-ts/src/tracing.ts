/**
 * OpenTelemetry spans over OTLP/HTTP (JSON encoding), continuing the job envelope's `traceparent`.
 *
 * Off unless `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` is set (the
 * standard variables; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it off). The
 * worker records one `accord.execute <stage>` span per job it measures, a child of the attempt span
 * the envelope names, with the run, stage, attempt, capability and contract version as attributes
 * (never a payload value). Spans are posted in small batches; a failed export is dropped, never
 * retried into the job's time.
 *
 * Sampling follows the engine: the SDK's `ParentBasedSampler` (root: `TraceIdRatioBasedSampler` at
 * the `OTEL_TRACES_SAMPLER`/`OTEL_TRACES_SAMPLER_ARG` ratio) decides from the envelope's
 * `traceparent`, whose trace flags carry the engine's per-run decision: `-00` is dropped and `-01`
 * kept whatever this worker's ratio. A ratio of 0 (`always_off`) turns the worker's spans off.
 */

import { randomBytes } from "node:crypto";
import { ROOT_CONTEXT, SpanKind, TraceFlags, trace } from "@opentelemetry/api";
import { ParentBasedSampler, SamplingDecision, TraceIdRatioBasedSampler, type Sampler } from "@opentelemetry/sdk-trace-base";

export interface SpanAttributes {
  [key: string]: string | number;
}

interface Finished {
  traceId: string;
  spanId: string;
  parentSpanId: string;
  name: string;
  kind: number;
  startTimeUnixNano: string;
  endTimeUnixNano: string;
  attributes: { key: string; value: { stringValue: string } | { intValue: string } }[];
  status: { code: number; message?: string };
}

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;
const SPAN_KIND_CONSUMER = 5;

/** The OTLP/HTTP traces URL the standard variables name, or undefined when tracing is off. */
export function tracesEndpoint(env: NodeJS.ProcessEnv): string | undefined {
  if ((env.OTEL_SDK_DISABLED ?? "").trim().toLowerCase() === "true") return undefined;
  if ((env.OTEL_TRACES_EXPORTER ?? "otlp").trim().toLowerCase() === "none") return undefined;
  if (env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) return env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT;
  const base = env.OTEL_EXPORTER_OTLP_ENDPOINT;
  return base ? `${base.replace(/\/+$/, "")}/v1/traces` : undefined;
}

const SAMPLERS: Record<string, number> = {
  always_on: 1,
  always_off: 0,
  parentbased_always_on: 1,
  parentbased_always_off: 0,
};

/** The trace ratio `OTEL_TRACES_SAMPLER` (and `…_ARG`) name; 1 when unset or not understood. */
export function sampleRatio(env: NodeJS.ProcessEnv): number {
  const name = (env.OTEL_TRACES_SAMPLER ?? "").trim().toLowerCase();
  const fixed = SAMPLERS[name];
  if (fixed !== undefined) return fixed;
  if (name === "traceidratio" || name === "parentbased_traceidratio") {
    const ratio = Number(env.OTEL_TRACES_SAMPLER_ARG ?? "1");
    return Number.isFinite(ratio) && ratio >= 0 && ratio <= 1 ? ratio : 1;
  }
  return 1;
}

function nanos(ms: number): string {
  return (BigInt(Math.round(ms * 1000)) * 1000n).toString();
}

export class Tracer {
  private pending: Finished[] = [];
  private inflight: Promise<void>[] = [];
  private timer: NodeJS.Timeout | undefined;
  private readonly sampler: Sampler;

  constructor(
    private readonly endpoint: string | undefined,
    private readonly service: string,
    readonly ratio = 1,
  ) {
    this.sampler = new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(ratio) });
  }

  static fromEnv(env: NodeJS.ProcessEnv, service: string): Tracer {
    return new Tracer(tracesEndpoint(env), env.OTEL_SERVICE_NAME || service, sampleRatio(env));
  }

  get on(): boolean {
    return this.endpoint !== undefined && this.ratio > 0;
  }

  /** Whether a span continuing `traceparent` is recorded: the parent's sampled flag decides. */
  sampled(traceparent: unknown): boolean {
    const parsed = typeof traceparent === "string" ? TRACEPARENT.exec(traceparent) : null;
    if (!this.on || parsed === null) return false;
    const flags = parseInt(parsed[3] ?? "00", 16) & TraceFlags.SAMPLED ? TraceFlags.SAMPLED : TraceFlags.NONE;
    const parent = trace.setSpanContext(ROOT_CONTEXT, {
      traceId: parsed[1] ?? "",
      spanId: parsed[2] ?? "",
      traceFlags: flags,
      isRemote: true,
    });
    const result = this.sampler.shouldSample(parent, parsed[1] ?? "", "accord.execute", SpanKind.CONSUMER, {}, []);
    return result.decision === SamplingDecision.RECORD_AND_SAMPLED;
  }

  /** Runs `fn` inside a span that continues `traceparent`; just `fn` when tracing is off or the
   * engine did not sample the run. */
  async span<T>(name: string, traceparent: unknown, attributes: SpanAttributes, fn: () => Promise<T>): Promise<T> {
    const parsed = typeof traceparent === "string" ? TRACEPARENT.exec(traceparent) : null;
    if (parsed === null || !this.sampled(traceparent)) return fn();
    const start = performance.timeOrigin + performance.now();
    let error: string | undefined;
    try {
      return await fn();
    } catch (caught) {
      error = caught instanceof Error ? caught.name : "error";
      throw caught;
    } finally {
      const end = performance.timeOrigin + performance.now();
      this.pending.push({
        traceId: parsed[1] ?? "",
        spanId: randomBytes(8).toString("hex"),
        parentSpanId: parsed[2] ?? "",
        name,
        kind: SPAN_KIND_CONSUMER,
        startTimeUnixNano: nanos(start),
        endTimeUnixNano: nanos(end),
        attributes: Object.entries(attributes).map(([key, v]) =>
          typeof v === "number" ? { key, value: { intValue: String(Math.trunc(v)) } } : { key, value: { stringValue: v } },
        ),
        status: error === undefined ? { code: 0 } : { code: 2, message: error },
      });
      this.schedule();
    }
  }

  private schedule(): void {
    if (this.pending.length >= 64) this.flushSoon();
    else this.timer ??= setTimeout(() => this.flushSoon(), 200);
  }

  private flushSoon(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    const spans = this.pending;
    this.pending = [];
    if (spans.length === 0 || this.endpoint === undefined) return;
    const body = JSON.stringify({
      resourceSpans: [
        {
          resource: { attributes: [{ key: "service.name", value: { stringValue: this.service } }] },
          scopeSpans: [{ scope: { name: "accord" }, spans }],
        },
      ],
    });
    const sent = fetch(this.endpoint, { method: "POST", headers: { "content-type": "application/json" }, body })
      .then(() => undefined)
      .catch(() => undefined); // telemetry never fails a job
    this.inflight.push(sent);
    void sent.finally(() => {
      this.inflight = this.inflight.filter((p) => p !== sent);
    });
  }

  /** Sends what is pending and waits for the exports under way. */
  async flush(): Promise<void> {
    this.flushSoon();
    await Promise.all(this.inflight);
  }
}
