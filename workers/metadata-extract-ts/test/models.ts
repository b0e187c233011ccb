/** Test models written from scratch: a cube as binary STL, ASCII STL and OBJ, and variants. */

export type Tri = [number[], number[], number[]];

const CORNERS = [
  [0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0],
  [0, 0, 1], [1, 0, 1], [1, 1, 1], [0, 1, 1],
];
// outward-facing (counter-clockwise seen from outside) triangles of the unit cube
const CUBE_FACES = [
  [0, 2, 1], [0, 3, 2], // bottom z=0
  [4, 5, 6], [4, 6, 7], // top z=1
  [0, 1, 5], [0, 5, 4], // front y=0
  [2, 3, 7], [2, 7, 6], // back y=1
  [1, 2, 6], [1, 6, 5], // right x=1
  [3, 0, 4], [3, 4, 7], // left x=0
];

export function cubeTriangles(size = 1, offset: number[] = [0, 0, 0]): Tri[] {
  return CUBE_FACES.map((f) => f.map((i) => CORNERS[i]!.map((c, k) => c * size + offset[k]!)) as Tri);
}

export function binaryStl(tris: Tri[], header = "binary cube"): Buffer {
  const out = Buffer.alloc(84 + 50 * tris.length);
  out.write(header.slice(0, 80), 0, "latin1");
  out.writeUInt32LE(tris.length, 80);
  tris.forEach((tri, t) => {
    const at = 84 + 50 * t + 12;
    tri.forEach((v, k) => v.forEach((c, j) => out.writeFloatLE(c, at + 12 * k + 4 * j)));
  });
  return out;
}

export function asciiStl(tris: Tri[], extra = ""): Buffer {
  const lines = [`solid cube${extra}`];
  for (const tri of tris) {
    lines.push("  facet normal 0 0 0", "    outer loop");
    for (const v of tri) lines.push(`      vertex ${v.join(" ")}`);
    lines.push("    endloop", "  endfacet");
  }
  lines.push("endsolid cube", "");
  return Buffer.from(lines.join("\n"), "latin1");
}

/** The cube as OBJ with quads, 1-based and negative indices mixed. */
export function cubeObj(units?: string): Buffer {
  const lines = units ? [`# units: ${units}`] : [];
  for (const c of CORNERS) lines.push(`v ${c.join(" ")}`);
  lines.push("vn 0 0 1");
  lines.push("f 1 4 3 2", "f 5 6 7 8", "f 1//1 2//1 6//1 5//1", "f 3 4 8 7", "f 2 3 7 6", "f -5 -8 -4 -1");
  return Buffer.from(lines.join("\n") + "\n", "utf8");
}
