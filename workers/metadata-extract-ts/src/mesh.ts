/**
 * STL (binary and ASCII) and OBJ parsed into one welded triangle mesh, in plain TypeScript.
 *
 * A binary STL repeats every corner once per triangle, so vertices are welded: corners with
 * exactly equal coordinates become one vertex (`-0` and `0` are the same point). OBJ polygons are
 * fanned into triangles and their corners welded the same way, so a file that repeats a position
 * under two indices measures like one that shares it. Only vertices some face uses are kept.
 *
 * Binary or ASCII is decided by size first: a file of exactly `84 + 50·n` bytes, where `n` is the
 * header's triangle count, is binary even when its header starts with `solid` (many exporters do
 * that). Anything else starting with `solid` is parsed as ASCII, strictly, and a mistake names
 * its line. Every refusal is a terminal `malformed-model`; so is an STL with no triangles, while an
 * OBJ of points or lines only measures as a faceless mesh (counts and bounds of its points), as
 * in the Python worker. OBJ text may be UTF-8 or, with a byte-order mark, UTF-16.
 * Units come from a `units: mm` style comment in the first 4 KiB, as the Python worker reads them.
 */

import type { TechnicalMetadataV1 } from "@accord/contracts";

import { WorkFailure } from "./failure";

/** The formats this worker parses: a subset of the result contract's `format`. */
export type Format = Extract<TechnicalMetadataV1["format"], "stl" | "obj">;
export type Units = TechnicalMetadataV1["units"];

export interface Mesh {
  format: Format;
  units: Units;
  /** Welded vertex positions, xyz interleaved. */
  positions: Float64Array;
  /** Triangles as vertex indices, three per face. */
  faces: Uint32Array;
}

const UNIT_WORDS: Record<string, Units> = {
  millimeter: "mm", millimetre: "mm", mm: "mm", centimeter: "cm", centimetre: "cm", cm: "cm",
  meter: "m", metre: "m", m: "m", inch: "in", inches: "in", in: "in",
};
const UNIT_COMMENT = /^\s*(?:#|comment)\s*units?\s*[:=]?\s*([a-z]+)\s*$/im;

function malformed(message: string): WorkFailure {
  return new WorkFailure("malformed-model", message, false);
}

export function unitsOf(head: string): Units {
  const found = UNIT_COMMENT.exec(head.slice(0, 4096));
  return (found && UNIT_WORDS[found[1]!.toLowerCase()]) || "unknown";
}

/** Text by its byte-order mark: UTF-16 (either order) or UTF-8 (the default). */
export function decodeText(bytes: Uint8Array): string {
  const b = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (b[0] === 0xff && b[1] === 0xfe) return b.subarray(2).toString("utf16le");
  if (b[0] === 0xfe && b[1] === 0xff) return Buffer.from(b.subarray(2)).swap16().toString("utf16le");
  return b.toString("utf8").replace(/^\uFEFF/, "");
}

/** Welds corners by exact position and collects triangles. */
class Builder {
  private readonly index = new Map<string, number>();
  private readonly coords: number[] = [];
  private readonly tris: number[] = [];

  corner(x: number, y: number, z: number, where: string): number {
    if (!Number.isFinite(x) || !Number.isFinite(y) || !Number.isFinite(z)) {
      throw malformed(`${where}: a vertex coordinate is NaN or infinite`);
    }
    const key = `${x + 0},${y + 0},${z + 0}`; // + 0 folds -0 into 0
    let id = this.index.get(key);
    if (id === undefined) {
      id = this.coords.length / 3;
      this.index.set(key, id);
      this.coords.push(x + 0, y + 0, z + 0);
    }
    return id;
  }

  face(a: number, b: number, c: number): void {
    this.tris.push(a, b, c);
  }

  finish(format: Format, units: Units, pointsOnly = false): Mesh {
    if (this.coords.length === 0) throw malformed("the file holds no geometry");
    if (this.tris.length === 0 && !pointsOnly) throw malformed("the file holds no triangles");
    return { format, units, positions: Float64Array.from(this.coords), faces: Uint32Array.from(this.tris) };
  }
}

function isBinaryStl(bytes: Uint8Array): boolean {
  if (bytes.byteLength < 84) return false;
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  return bytes.byteLength === 84 + 50 * view.getUint32(80, true);
}

export function parseStl(bytes: Uint8Array): Mesh {
  const units = unitsOf(Buffer.from(bytes.buffer, bytes.byteOffset, Math.min(bytes.byteLength, 4096)).toString("latin1"));
  if (isBinaryStl(bytes)) return parseBinaryStl(bytes, units);
  const start = Buffer.from(bytes.buffer, bytes.byteOffset, Math.min(bytes.byteLength, 512)).toString("latin1");
  if (/^\s*solid\b/.test(start)) return parseAsciiStl(bytes, units);
  if (bytes.byteLength >= 84) {
    const count = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength).getUint32(80, true);
    throw malformed(`binary STL declares ${count} triangles (${84 + 50 * count} bytes) but holds ${bytes.byteLength} bytes`);
  }
  throw malformed(`STL of ${bytes.byteLength} bytes is neither binary (84-byte header) nor ASCII ('solid')`);
}

function parseBinaryStl(bytes: Uint8Array, units: Units): Mesh {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const count = view.getUint32(80, true);
  const mesh = new Builder();
  for (let t = 0; t < count; t++) {
    const at = 84 + 50 * t + 12; // skip the facet normal: it is recomputed, never trusted
    const ids: number[] = [];
    for (let k = 0; k < 3; k++) {
      const o = at + 12 * k;
      ids.push(mesh.corner(view.getFloat32(o, true), view.getFloat32(o + 4, true), view.getFloat32(o + 8, true), `triangle ${t}`));
    }
    mesh.face(ids[0]!, ids[1]!, ids[2]!);
  }
  return mesh.finish("stl", units);
}

function number(token: string | undefined, line: number): number {
  const value = token === undefined || token === "" ? NaN : Number(token);
  if (!Number.isFinite(value)) throw malformed(`line ${line}: expected a finite number, found ${JSON.stringify(token ?? "")}`);
  return value;
}

function parseAsciiStl(bytes: Uint8Array, units: Units): Mesh {
  const lines = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("latin1").split(/\r?\n/);
  const mesh = new Builder();
  // expected keyword sequence of one facet; "vertex" repeats three times
  const facet = ["facet", "outer", "vertex", "vertex", "vertex", "endloop", "endfacet"];
  let step = -1; // -1: between facets
  let corners: number[] = [];
  let ended = false;
  let started = false;
  for (let n = 0; n < lines.length; n++) {
    const words = lines[n]!.trim().split(/\s+/).filter((w) => w !== "");
    if (words.length === 0) continue;
    const word = words[0]!.toLowerCase();
    const line = n + 1;
    if (ended) {
      if (word !== "solid") throw malformed(`line ${line}: expected 'solid' or the end after 'endsolid'`);
      ended = false; // files holding several solids are one model
      continue;
    }
    if (!started) {
      if (word !== "solid") throw malformed(`line ${line}: expected 'solid'`);
      started = true;
      continue;
    }
    if (step === -1) {
      if (word === "endsolid") { ended = true; continue; }
      if (word !== "facet") throw malformed(`line ${line}: expected 'facet' or 'endsolid', found ${JSON.stringify(word)}`);
      step = 0;
    } else if (word !== facet[step]) {
      throw malformed(`line ${line}: expected '${facet[step]}', found ${JSON.stringify(word)}`);
    }
    if (word === "vertex") {
      if (words.length !== 4) throw malformed(`line ${line}: a vertex needs exactly three coordinates`);
      corners.push(mesh.corner(number(words[1], line), number(words[2], line), number(words[3], line), `line ${line}`));
    }
    step += 1;
    if (step === facet.length) {
      mesh.face(corners[0]!, corners[1]!, corners[2]!);
      corners = [];
      step = -1;
    }
  }
  if (step !== -1) throw malformed("the file ends inside a facet");
  if (!ended) throw malformed("the file ends without 'endsolid'");
  return mesh.finish("stl", units);
}

/** OBJ: `v` positions and `f` polygons (`i`, `i/t`, `i//n`, `i/t/n`, negative = relative). */
export function parseObj(bytes: Uint8Array): Mesh {
  const text = decodeText(bytes);
  const units = unitsOf(text);
  const lines = text.split(/\r?\n/);
  const raw: number[] = [];
  const mesh = new Builder();
  const welded = new Map<number, number>();
  for (let n = 0; n < lines.length; n++) {
    const words = lines[n]!.trim().split(/\s+/);
    const line = n + 1;
    if (words[0] === "v") {
      if (words.length < 4) throw malformed(`line ${line}: a vertex needs three coordinates`);
      raw.push(number(words[1], line), number(words[2], line), number(words[3], line));
    } else if (words[0] === "f") {
      if (words.length < 4) throw malformed(`line ${line}: a face needs at least three vertices`);
      const ids = words.slice(1).map((ref) => {
        const index = Number(ref.split("/")[0]);
        const count = raw.length / 3;
        const at = index < 0 ? count + index : index - 1;
        if (!Number.isInteger(index) || index === 0 || at < 0 || at >= count) {
          throw malformed(`line ${line}: face refers to vertex ${JSON.stringify(ref)}, which does not exist`);
        }
        let id = welded.get(at);
        if (id === undefined) {
          id = mesh.corner(raw[3 * at]!, raw[3 * at + 1]!, raw[3 * at + 2]!, `line ${line}`);
          welded.set(at, id);
        }
        return id;
      });
      for (let k = 1; k + 1 < ids.length; k++) mesh.face(ids[0]!, ids[k]!, ids[k + 1]!);
    }
  }
  if (welded.size === 0) {
    // a point cloud or polyline: no faces, its points still have a count and bounds
    for (let at = 0; at < raw.length; at += 3) mesh.corner(raw[at]!, raw[at + 1]!, raw[at + 2]!, "vertex list");
    return mesh.finish("obj", units, true);
  }
  return mesh.finish("obj", units);
}

/** The format from the key's extension, or terminal `unsupported-format`. */
export function formatOf(key: string): Format {
  const ext = key.slice(key.lastIndexOf(".") + 1).toLowerCase();
  if (ext === "stl" || ext === "obj") return ext;
  throw new WorkFailure("unsupported-format", `this worker reads STL and OBJ, not ${JSON.stringify(ext)}`, false);
}

export function parseModel(format: Format, bytes: Uint8Array): Mesh {
  return format === "stl" ? parseStl(bytes) : parseObj(bytes);
}
