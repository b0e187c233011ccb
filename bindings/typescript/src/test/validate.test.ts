// The DSL's rules in the TypeScript binding: defaults, null, unknown fields, paths, JSON input.

import { deepStrictEqual, strictEqual, throws } from "node:assert/strict";
import { test } from "node:test";

import { validate, validateJson } from "../index";
import { fromPointer, join, toleranceSegments } from "../paths";

const request = { modelId: "m-1", previewType: "inspection" };

test("defaults fill only missing fields and the input is not mutated", () => {
  const input = { modelId: "m-1" };
  const result = validate("thumbnail-generation-request", 2, input);
  strictEqual(result.ok, true);
  deepStrictEqual(result.value, { modelId: "m-1", previewType: "gallery", generate360Views: true, maxEdge: 512 });
  deepStrictEqual(input, { modelId: "m-1" });
});

test("explicit null is refused where not nullable, even with a default", () => {
  const result = validate("thumbnail-generation-request", 2, { ...request, maxEdge: null });
  strictEqual(result.ok, false);
  deepStrictEqual(result.errors.map((e) => [e.path, e.code]), [["maxEdge", "null-not-allowed"]]);
});

test("every failing path is reported, sorted, with stable codes", () => {
  const result = validate("thumbnail-generation-request", 2, { previewType: "poster", maxEdge: 10, junk: 1 });
  deepStrictEqual(
    result.errors.map((e) => [e.path, e.code]),
    [["junk", "unknown-field"], ["maxEdge", "too-small"], ["modelId", "missing"], ["previewType", "not-in-enum"]],
  );
});

test("JSON text over the byte limit is refused before parsing", () => {
  const big = "{" + " ".repeat(2_000_000) + "}";
  deepStrictEqual(validateJson("thumbnail-generation-request", 2, big).errors.map((e) => e.code), ["oversized"]);
  deepStrictEqual(validateJson("thumbnail-generation-request", 2, "{").errors.map((e) => e.code), ["malformed-json"]);
  strictEqual(validateJson("thumbnail-generation-request", 2, JSON.stringify(request)).ok, true);
});

test("unknown contracts are a usage error, not a verdict", () => {
  throws(() => validate("no-such-contract", 1, {}), /unknown message contract/);
});

test("paths are spelled as in Python", () => {
  strictEqual(join(join(join("", "views"), 2), "angle"), "views[2].angle");
  strictEqual(join("", "a.b"), '["a.b"]');
  deepStrictEqual(fromPointer("/views/2/angle", { views: [0, 1, { angle: 3 }] }), { path: "views[2].angle", value: 3 });
  deepStrictEqual(fromPointer("/m/0", { m: { "0": "x" } }), { path: 'm["0"]', value: "x" });
  deepStrictEqual(toleranceSegments("views[].angle"), ["views", "[]", "angle"]);
});

test("bytes are decoded strictly with the Python codes", () => {
  const codes = (input: string | Uint8Array) =>
    validateJson("progress", 1, input).errors.map((e) => e.code);
  deepStrictEqual(codes('{"percent": 1, "percent": 2}'), ["duplicate-key"]);
  deepStrictEqual(codes('{"a": {"x": 1}, "b": {"x": 2}, "percent": 1}'), ["unknown-field", "unknown-field"]);
  deepStrictEqual(codes('{"percent": NaN}'), ["non-finite-number"]);
  deepStrictEqual(codes(new Uint8Array([0x7b, 0xff, 0x7d])), ["not-utf8"]);
  deepStrictEqual(codes(new Uint8Array([0xef, 0xbb, 0xbf, 0x7b, 0x7d])), ["malformed-json"]);
  deepStrictEqual(codes('{"percent": 1, "message": "\\ud800"}'), ["lone-surrogate"]);
  deepStrictEqual(codes("[".repeat(65) + "]".repeat(65)), ["too-deep"]);
  deepStrictEqual(codes('{"percent": 1, "message": "a\\",{[b"}'), []);
});
