import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, realpathSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { test } from "node:test";

import { checkResult, extract } from "../src/extract";
import { WorkFailure } from "../src/failure";
import { resolveObject, StorageMap, validateObjectKey } from "../src/paths";
import { canonicalJson, jobIdFor, messageIdOf } from "../src/wire";
import { binaryStl, cubeTriangles } from "./models";

function refusedWith(code: string): (error: unknown) => boolean {
  return (error) => error instanceof WorkFailure && error.code === code;
}

function store(): string {
  const root = mkdtempSync(path.join(tmpdir(), "accord-ts-"));
  mkdirSync(path.join(root, "acme", "models"), { recursive: true });
  writeFileSync(path.join(root, "acme", "models", "cube.stl"), binaryStl(cubeTriangles()));
  return root;
}

test("traversal and encoded keys are refused before touching the filesystem", () => {
  const bad = [
    "", "../x.stl", "models/../../x.stl", "/etc/passwd", "C:/x.stl", "models\\x.stl", "models/x\u0000.stl",
    "%2e%2e/x.stl", "models/%2fx.stl", "models//x.stl", "./x.stl", "models/．．/x.stl", "models/a b.stl",
    "x".repeat(1025),
  ];
  for (const key of bad) assert.throws(() => validateObjectKey(key), refusedWith("invalid-object-key"), JSON.stringify(key));
  assert.equal(validateObjectKey("models/cube.stl"), "models/cube.stl");
});

test("resolveObject stays inside root/tenant, symlinks included", () => {
  const root = store();
  const outside = mkdtempSync(path.join(tmpdir(), "accord-out-"));
  writeFileSync(path.join(outside, "secret.stl"), "solid s\nendsolid s\n");
  symlinkSync(path.join(outside, "secret.stl"), path.join(root, "acme", "models", "escape.stl"));
  symlinkSync(outside, path.join(root, "acme", "linked"));
  assert.equal(resolveObject(root, "acme", "models/cube.stl"), realpathSync(path.join(root, "acme/models/cube.stl")));
  assert.throws(() => resolveObject(root, "acme", "models/escape.stl"), refusedWith("invalid-object-key"));
  assert.throws(() => resolveObject(root, "acme", "linked/secret.stl"), refusedWith("invalid-object-key"));
  assert.throws(() => resolveObject(root, "../acme", "models/cube.stl"), refusedWith("invalid-object-key"));
  assert.throws(() => resolveObject(root, "acme", "models/none.stl"), refusedWith("object-not-found"));
  assert.throws(() => resolveObject(root, "other", "models/cube.stl"), refusedWith("object-not-found"));
});

test("extract: a valid request is measured; bad requests and refs are classified", async () => {
  const storage = StorageMap.local(store());
  const request = { modelId: "cube", storageConnectionRef: "local", objectKey: "models/cube.stl" };
  const result = await extract(request, "acme", { storage });
  assert.equal(result.faceCount, 12);
  assert.equal(result.volume, 1);
  const byId = await extract({ modelId: "cube" }, "acme", { storage }); // models/<modelId>.stl
  assert.deepEqual(byId, result);
  await assert.rejects(extract({ objectKey: "models/cube.stl" }, "acme", { storage }), refusedWith("invalid-request"));
  await assert.rejects(extract({ ...request, modelId: "no spaces" }, "acme", { storage }), refusedWith("invalid-request"));
  await assert.rejects(extract({ ...request, extra: 1 }, "acme", { storage }), refusedWith("invalid-request"));
  await assert.rejects(extract({ ...request, storageConnectionRef: "s3" }, "acme", { storage }), refusedWith("storage-unavailable"));
  // the contract's object-key format already refuses traversal; the store refuses it again
  await assert.rejects(extract({ ...request, objectKey: "../acme/models/cube.stl" }, "acme", { storage }), refusedWith("invalid-request"));
  await assert.rejects(extract(request, "../acme", { storage }), refusedWith("invalid-object-key"));
  await assert.rejects(extract(request, "acme", { storage, inputBytes: 100 }), refusedWith("input-too-large"));
});

test("job ids and canonical JSON agree with the Python transport", () => {
  assert.equal(jobIdFor("msg_abc"), "m-msg_abc");
  assert.equal(jobIdFor("a:b%3A:c"), "m-a%3Ab%253A%3Ac");
  for (const id of ["a:b%3A:c", "x%", "::", "123"]) assert.equal(messageIdOf(jobIdFor(id)), id);
  assert.equal(canonicalJson({ b: 1, a: [true, null, "é"], c: { z: 1.5, y: "x" } }), '{"a":[true,null,"é"],"b":1,"c":{"y":"x","z":1.5}}');
  assert.throws(() => canonicalJson({ a: NaN }), RangeError);
});

test("large models are measured in a thread, with the same answer, and its limits hold", async () => {
  const root = store();
  const many = [];
  for (let i = 0; i < 400; i++) many.push(...cubeTriangles(1, [3 * i, 0, 0]));
  writeFileSync(path.join(root, "acme", "models", "many.stl"), binaryStl(many));
  const storage = StorageMap.local(root);
  const request = { modelId: "many", objectKey: "models/many.stl" };
  const inline = await extract(request, "acme", { storage });
  const threaded = await extract(request, "acme", { storage, limits: { threadAboveBytes: 1000 } });
  assert.deepEqual(threaded, inline);
  assert.equal(inline.components, 400);
  assert.equal(inline.volume, 400);
  await assert.rejects(extract(request, "acme", { storage, limits: { threadAboveBytes: 1000, timeMs: 1 } }),
    refusedWith("parse-timeout"));
  const corrupt = binaryStl(cubeTriangles());
  writeFileSync(path.join(root, "acme", "models", "bad.stl"), corrupt.subarray(0, corrupt.length - 1));
  await assert.rejects(extract({ modelId: "bad", objectKey: "models/bad.stl" }, "acme", { storage, limits: { threadAboveBytes: 10 } }),
    refusedWith("malformed-model"));
});

test("a result that would break technical-metadata@1 is refused as invalid-result", async () => {
  const good = await extract({ modelId: "cube" }, "acme", { storage: StorageMap.local(store()) });
  assert.deepEqual(checkResult(good), good);
  assert.throws(() => checkResult({ ...good, faceCount: -1 }), (e) =>
    refusedWith("invalid-result")(e) && /faceCount/.test((e as Error).message));
  assert.throws(() => checkResult({ ...good, extents: { x: 1, y: 1 } } as never), refusedWith("invalid-result"));
});
