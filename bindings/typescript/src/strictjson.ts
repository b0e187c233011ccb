// Strict JSON decoding, mirroring accord.contracts.strictjson: bytes must be UTF-8 (a BOM is
// refused), no duplicate keys, no lone surrogates, nesting at most MAX_DEPTH; the same stable
// codes as Python: not-utf8, malformed-json, duplicate-key, lone-surrogate, too-deep.
// JSON.parse refuses NaN and Infinity as malformed; they are reported as non-finite-number, as in
// Python, when they are the only problem.

export const DEFAULT_MAX_DEPTH = 64;

export class JsonRejected extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

const LONE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

export function decodeUtf8(bytes: Uint8Array): string {
  try {
    return new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(bytes);
  } catch {
    throw new JsonRejected("not-utf8", "input is not UTF-8");
  }
}

export function parseStrict(text: string, maxDepth = DEFAULT_MAX_DEPTH): unknown {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    if (nonFiniteOnly(text)) throw new JsonRejected("non-finite-number", "NaN or Infinity is not a JSON number");
    throw new JsonRejected("malformed-json", `malformed JSON: ${(error as Error).message}`);
  }
  scan(text, maxDepth);
  return value;
}

/** Whether the text would parse if its NaN / Infinity literals were numbers (Python's code). */
function nonFiniteOnly(text: string): boolean {
  const patched = text.replace(/(?<=[[:,]\s*)-?(?:NaN|Infinity)(?=\s*[,\]}])/g, "0");
  if (patched === text) return false;
  try {
    JSON.parse(patched);
    return true;
  } catch {
    return false;
  }
}

/** Walks the (already well-formed) text once: keys per object, depth, string contents. */
function scan(text: string, maxDepth: number): void {
  const stack: { keys: Set<string> | null; expectKey: boolean }[] = [];
  let i = 0;
  while (i < text.length) {
    const ch = text[i];
    if (ch === '"') {
      let end = i + 1;
      while (text[end] !== '"') end += text[end] === "\\" ? 2 : 1;
      const decoded = JSON.parse(text.slice(i, end + 1)) as string;
      if (LONE.test(decoded)) throw new JsonRejected("lone-surrogate", "string holds a lone surrogate");
      const top = stack[stack.length - 1];
      if (top && top.keys && top.expectKey) {
        if (top.keys.has(decoded)) {
          throw new JsonRejected("duplicate-key", `duplicate key ${JSON.stringify(decoded)} in an object`);
        }
        top.keys.add(decoded);
        top.expectKey = false;
      }
      i = end + 1;
      continue;
    }
    if (ch === "{" || ch === "[") {
      stack.push({ keys: ch === "{" ? new Set() : null, expectKey: ch === "{" });
      if (stack.length > maxDepth) throw new JsonRejected("too-deep", `nesting deeper than ${maxDepth} levels`);
    } else if (ch === "}" || ch === "]") {
      stack.pop();
    } else if (ch === ",") {
      const top = stack[stack.length - 1];
      if (top && top.keys) top.expectKey = true;
    }
    i += 1;
  }
}
