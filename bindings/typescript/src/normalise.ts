// The DSL's own rules that JSON Schema leaves out, mirrored from accord.contracts.normalise:
// a `default` fills a field only when the key is absent (an explicit null stays null), recursively
// inside present objects and every item of present arrays; when tolerant, unknown members named by
// a declared tolerance are dropped and reported as ignored. The input is never mutated.

import { isObject, join, toleranceSegments } from "./paths";

export type Schema = { [keyword: string]: unknown };
type Tree = Map<string, Tree>;

export function toleranceTree(paths: readonly string[]): Tree {
  const root: Tree = new Map();
  for (const path of paths) {
    let node = root;
    for (const segment of toleranceSegments(path)) {
      let next = node.get(segment);
      if (!next) {
        next = new Map();
        node.set(segment, next);
      }
      node = next;
    }
  }
  return root;
}

function properties(schema: Schema): Record<string, Schema> | undefined {
  return isObject(schema.properties) ? (schema.properties as Record<string, Schema>) : undefined;
}

export function normalise(
  schema: Schema,
  value: unknown,
  tree: Tree,
  path: string,
  ignored: string[],
): unknown {
  const props = properties(schema);
  if (props) {
    if (!isObject(value)) return value;
    const out: Record<string, unknown> = { ...value };
    for (const name of [...tree.keys()].sort()) {
      if (name !== "[]" && !(name in props) && Object.prototype.hasOwnProperty.call(out, name)) {
        delete out[name];
        ignored.push(join(path, name));
      }
    }
    for (const name of Object.keys(props).sort()) {
      const child = props[name] as Schema;
      if (!Object.prototype.hasOwnProperty.call(out, name)) {
        if (!("default" in child)) continue;
        out[name] = structuredClone(child.default);
      }
      out[name] = normalise(child, out[name], tree.get(name) ?? new Map(), join(path, name), ignored);
    }
    return out;
  }
  if (isObject(schema.items) && Array.isArray(value)) {
    const items = schema.items as Schema;
    const sub = tree.get("[]") ?? new Map();
    return value.map((item, i) => normalise(items, item, sub, join(path, i), ignored));
  }
  return value;
}
