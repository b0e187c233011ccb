import assert from "node:assert/strict";
import { test } from "node:test";

import { validate } from "@accord/contracts";

import { WorkFailure } from "../src/failure";
import { formatOf, parseObj, parseStl } from "../src/mesh";
import { measure } from "../src/measure";
import { asciiStl, binaryStl, cubeObj, cubeTriangles, type Tri } from "./models";

function refusedWith(code: string): (error: unknown) => boolean {
  return (error) => error instanceof WorkFailure && error.code === code && !error.retryable;
}

test("binary STL cube: 8 welded vertices, 12 faces, closed, volume 1", () => {
  const m = measure(parseStl(binaryStl(cubeTriangles())), "cube", true);
  assert.equal(m.format, "stl");
  assert.equal(m.units, "unknown");
  assert.equal(m.vertexCount, 8);
  assert.equal(m.faceCount, 12);
  assert.equal(m.components, 1);
  assert.equal(m.watertight, true);
  assert.equal(m.windingConsistent, true);
  assert.equal(m.volume, 1);
  assert.equal(m.volumeUnavailableReason, null);
  assert.equal(m.surfaceArea, 6);
  assert.deepEqual(m.bounds, { min: { x: 0, y: 0, z: 0 }, max: { x: 1, y: 1, z: 1 } });
  assert.deepEqual(m.extents, { x: 1, y: 1, z: 1 });
  const checked = validate("technical-metadata", 1, m);
  assert.deepEqual(checked.errors, []);
});

test("ASCII STL and OBJ measure the same cube as binary STL", () => {
  const binary = measure(parseStl(binaryStl(cubeTriangles(2, [1, -3, 5]))), "c", true);
  const ascii = measure(parseStl(asciiStl(cubeTriangles(2, [1, -3, 5]))), "c", true);
  assert.deepEqual(ascii, binary);
  assert.equal(binary.volume, 8);
  assert.deepEqual(binary.bounds.min, { x: 1, y: -3, z: 5 });
  const obj = measure(parseObj(cubeObj("millimetre")), "c", true);
  assert.equal(obj.format, "obj");
  assert.equal(obj.units, "mm");
  assert.equal(obj.vertexCount, 8);
  assert.equal(obj.faceCount, 12); // six quads fanned
  assert.equal(obj.volume, 1);
  assert.equal(obj.windingConsistent, true);
});

test("an ASCII STL of several solids is one model; text after them is refused", () => {
  const two = Buffer.concat([asciiStl(cubeTriangles()), asciiStl(cubeTriangles(1, [4, 0, 0]))]);
  assert.equal(measure(parseStl(two), "c", true).components, 2);
  assert.throws(() => parseStl(Buffer.concat([asciiStl(cubeTriangles()), Buffer.from("garbage\n")])),
    refusedWith("malformed-model"));
});

test("a binary STL whose header starts with 'solid' is still binary", () => {
  const m = measure(parseStl(binaryStl(cubeTriangles(), "solid exported-by-cad")), "c", true);
  assert.equal(m.faceCount, 12);
});

test("scaled and moved cubes: volume size^3, area 6 size^2 (seeded sweep)", () => {
  let seed = 7;
  const next = (): number => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  for (let n = 0; n < 50; n++) {
    const size = 0.25 + Math.round(next() * 64) / 4; // exact in float32
    const offset = [0, 1, 2].map(() => Math.round((next() - 0.5) * 400) / 4);
    const m = measure(parseStl(binaryStl(cubeTriangles(size, offset))), "c", true);
    assert.ok(Math.abs(m.volume! - size ** 3) <= 1e-9 * size ** 3, `size ${size}`);
    assert.ok(Math.abs(m.surfaceArea - 6 * size ** 2) <= 1e-9 * size ** 2);
    assert.deepEqual(m.extents, { x: size, y: size, z: size });
  }
});

test("open box: not watertight, volume null with the reason", () => {
  const m = measure(parseStl(binaryStl(cubeTriangles().slice(2))), "box", true); // no bottom
  assert.equal(m.faceCount, 10);
  assert.equal(m.watertight, false);
  assert.equal(m.windingConsistent, true);
  assert.equal(m.volume, null);
  assert.equal(m.volumeUnavailableReason, "not-watertight");
  assert.equal(validate("technical-metadata", 1, m).ok, true);
});

test("one flipped triangle: closed but inconsistent winding, no volume", () => {
  const tris = cubeTriangles();
  const [a, b, c] = tris[3]!;
  tris[3] = [a, c, b] as Tri;
  const m = measure(parseStl(asciiStl(tris)), "c", true);
  assert.equal(m.watertight, true);
  assert.equal(m.windingConsistent, false);
  assert.equal(m.volumeUnavailableReason, "inconsistent-winding");
});

test("two separate cubes are two components; volume not requested stays null", () => {
  const tris = [...cubeTriangles(), ...cubeTriangles(1, [5, 0, 0])];
  const m = measure(parseStl(binaryStl(tris)), "two", false);
  assert.equal(m.components, 2);
  assert.equal(m.vertexCount, 16);
  assert.equal(m.volume, null);
  assert.equal(m.volumeUnavailableReason, "not-requested");
});

test("malformed STL is refused as malformed-model, naming what is wrong", () => {
  const whole = binaryStl(cubeTriangles());
  assert.throws(() => parseStl(whole.subarray(0, whole.length - 7)), refusedWith("malformed-model"));
  assert.throws(() => parseStl(Buffer.from("solid x\n facet normal 0 0 0\n outer loop\n vertex 1 2\n")), (e) =>
    refusedWith("malformed-model")(e) && /line 4/.test((e as Error).message));
  assert.throws(() => parseStl(Buffer.from("solid x\n facet normal 0 0 0\n outer loop\n vertex 1 2 nan\n")),
    refusedWith("malformed-model"));
  assert.throws(() => parseStl(Buffer.from("solid empty\nendsolid empty\n")), refusedWith("malformed-model"));
  assert.throws(() => parseStl(Buffer.from("hello")), refusedWith("malformed-model"));
  const inf = binaryStl([[[0, 0, 0], [1, 0, 0], [0, 1, 0]]]);
  inf.writeFloatLE(Infinity, 84 + 12);
  assert.throws(() => parseStl(inf), refusedWith("malformed-model"));
});

test("malformed OBJ is refused as malformed-model", () => {
  assert.throws(() => parseObj(Buffer.from("v 0 0 0\nv 1 0 0\nf 1 2 3\n")), refusedWith("malformed-model"));
  assert.throws(() => parseObj(Buffer.from("# nothing\n")), refusedWith("malformed-model"));
  assert.throws(() => parseObj(Buffer.from("v 0 0 0\nv 1 0 0\nf 1 2\n")), refusedWith("malformed-model"));
  assert.throws(() => parseObj(Buffer.from("v 0 x 0\n")), refusedWith("malformed-model"));
});

test("an OBJ of points only measures as a faceless mesh; UTF-16 OBJ reads like UTF-8", () => {
  const m = measure(parseObj(Buffer.from("v 0 0 0\nv 2 1 0\nv 0 0 0\nv 1 1 3\n")), "p", true);
  assert.equal(m.vertexCount, 3); // welded
  assert.equal(m.faceCount, 0);
  assert.equal(m.components, 0);
  assert.equal(m.watertight, false);
  assert.equal(m.windingConsistent, false);
  assert.equal(m.volumeUnavailableReason, "not-watertight");
  assert.deepEqual(m.bounds.max, { x: 2, y: 1, z: 3 });
  const text = cubeObj("cm").toString("utf8");
  const le = Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from(text, "utf16le")]);
  const be = Buffer.concat([Buffer.from([0xfe, 0xff]), Buffer.from(text, "utf16le").swap16()]);
  const utf8 = measure(parseObj(cubeObj("cm")), "c", true);
  assert.equal(utf8.units, "cm");
  assert.deepEqual(measure(parseObj(le), "c", true), utf8);
  assert.deepEqual(measure(parseObj(be), "c", true), utf8);
});

test("formats other than STL and OBJ are unsupported", () => {
  assert.equal(formatOf("models/a.STL"), "stl");
  assert.equal(formatOf("a.obj"), "obj");
  assert.throws(() => formatOf("a.ply"), refusedWith("unsupported-format"));
});

test("triangle order and the starting corner of each triangle change nothing (seeded sweep)", () => {
  const base = measure(parseStl(binaryStl(cubeTriangles(3, [1, 1, 1]))), "c", true);
  let seed = 11;
  const next = (n: number): number => Math.floor(((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31) * n);
  for (let n = 0; n < 30; n++) {
    const tris = cubeTriangles(3, [1, 1, 1]).map((t) => {
      const k = next(3); // rotating a triangle's corners keeps its winding
      return [t[k], t[(k + 1) % 3], t[(k + 2) % 3]] as Tri;
    });
    for (let i = tris.length - 1; i > 0; i--) {
      const j = next(i + 1);
      [tris[i], tris[j]] = [tris[j]!, tris[i]!];
    }
    const m = measure(parseStl(n % 2 ? asciiStl(tris) : binaryStl(tris)), "c", true);
    assert.deepEqual(m, base);
  }
});
