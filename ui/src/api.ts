// The /v1 API with the signed-in bearer key (kept in sessionStorage: gone when the tab closes).

const KEY = "accord.key";

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    detail: string,
    readonly doc: Record<string, unknown>,
  ) {
    super(detail);
  }
}

export const session = {
  key(): string | null {
    return sessionStorage.getItem(KEY);
  },
  set(key: string): void {
    sessionStorage.setItem(KEY, key);
  },
  clear(): void {
    sessionStorage.removeItem(KEY);
  },
};

function headers(extra: Record<string, string> = {}): Record<string, string> {
  const key = session.key();
  return { Accept: "application/json", ...(key ? { Authorization: `Bearer ${key}` } : {}), ...extra };
}

async function problem(res: Response): Promise<ApiError> {
  let doc: Record<string, unknown> = {};
  try {
    doc = (await res.json()) as Record<string, unknown>;
  } catch {
    doc = {};
  }
  const code = typeof doc["code"] === "string" ? doc["code"] : `http-${res.status}`;
  const detail = typeof doc["detail"] === "string" ? doc["detail"] : res.statusText;
  return new ApiError(res.status, code, detail, doc);
}

export async function get<T>(path: string, params?: Record<string, string | number | string[]>): Promise<T> {
  const url = new URL(path, location.origin);
  for (const [name, value] of Object.entries(params ?? {})) {
    for (const one of Array.isArray(value) ? value : [value]) url.searchParams.append(name, String(one));
  }
  const res = await fetch(url, { headers: headers() });
  if (!res.ok) throw await problem(res);
  return (await res.json()) as T;
}

/** A binary read (an image for a blob: URL, since <img> cannot send the bearer header). */
export async function getBlob(path: string, params: Record<string, string> = {}): Promise<Blob> {
  const url = new URL(path, location.origin);
  for (const [name, value] of Object.entries(params)) url.searchParams.append(name, value);
  const res = await fetch(url, { headers: headers({ Accept: "image/*" }) });
  if (!res.ok) throw await problem(res);
  return await res.blob();
}

export async function post<T>(path: string, body: unknown): Promise<T> {
  const res = await fetch(path, {
    method: "POST",
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify(body ?? {}),
  });
  if (!res.ok) throw await problem(res);
  return (await res.json()) as T;
}

export interface SseEvent {
  event: string;
  id: string;
  data: string;
}

/** Server-Sent Events read with fetch (EventSource cannot send the bearer header). */
export async function stream(path: string, onEvent: (e: SseEvent) => void, signal: AbortSignal): Promise<void> {
  const res = await fetch(path, { headers: headers({ Accept: "text/event-stream" }), signal });
  if (!res.ok || res.body === null) throw await problem(res);
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let current: SseEvent = { event: "message", id: "", data: "" };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let cut: number;
    while ((cut = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, cut).replace(/\r$/, "");
      buffer = buffer.slice(cut + 1);
      if (line === "") {
        if (current.data !== "") onEvent(current);
        current = { event: "message", id: "", data: "" };
      } else if (!line.startsWith(":")) {
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") current.event = text;
        else if (field === "id") current.id = text;
        else if (field === "data") current.data = current.data ? `${current.data}\n${text}` : text;
      }
    }
  }
}

export interface Me {
  principal: string;
  role: string;
  tenants: string[];
  may: Record<string, boolean>;
}
