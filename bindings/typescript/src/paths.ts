// Field paths, spelled exactly as the Python binding spells them (accord.contracts.paths):
// members joined with ".", array items as "[index]", the root as "", and a member name that is
// not a plain identifier written as ["…"] with JSON string escaping.

const IDENT = /^[A-Za-z_][A-Za-z0-9_-]*$/;

export function join(base: string, part: string | number): string {
  if (typeof part === "number") return `${base}[${part}]`;
  if (IDENT.test(part)) return base ? `${base}.${part}` : part;
  return `${base}[${JSON.stringify(part)}]`;
}

/** Splits a tolerance path (`views[].angle`) into member names and "[]" markers. */
export function toleranceSegments(path: string): string[] {
  const out: string[] = [];
  for (const piece of path.split(".")) {
    const match = /^([A-Za-z_][A-Za-z0-9_-]*)((?:\[\])*)$/.exec(piece);
    if (!match || match[1] === undefined) throw new Error(`bad tolerance path ${JSON.stringify(path)}`);
    out.push(match[1]);
    for (let i = 0; i < (match[2] ?? "").length / 2; i += 1) out.push("[]");
  }
  return out;
}

/** Converts an Ajv instancePath (JSON pointer) into a field path, using the value for indexes. */
export function fromPointer(pointer: string, root: unknown): { path: string; value: unknown } {
  let path = "";
  let value: unknown = root;
  if (pointer === "") return { path, value };
  for (const raw of pointer.slice(1).split("/")) {
    const key = raw.replace(/~1/g, "/").replace(/~0/g, "~");
    if (Array.isArray(value)) {
      const index = Number(key);
      path = join(path, index);
      value = value[index];
    } else {
      path = join(path, key);
      value = isObject(value) ? value[key] : undefined;
    }
  }
  return { path, value };
}

export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
