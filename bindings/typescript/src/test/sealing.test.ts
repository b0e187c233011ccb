// Sealed values as the Python side writes them open here to the same value; a round trip, a
// rotation, an altered token and a missing key behave as in accord.contracts.sealing.

import { deepStrictEqual, ok, strictEqual, throws } from "node:assert/strict";
import { test } from "node:test";

import { Keyring, openAll, SEALED_PREFIX, SealingError } from "../sealing";

const PY_KEY = Buffer.from(Array.from({ length: 32 }, (_, i) => i));
// sealed by `Keyring(("py2026", bytes(range(32)))).seal(...)` in Python
const FROM_PYTHON = "accord:sealed:v1:py2026:lFQ_DYfzcQMuYUT1VFgcmMfZgTUoX4eXT6w3GZsnXGLlnfKRuEXVTCgeH17r-Wvn";
const OBJECT_FROM_PYTHON =
  "accord:sealed:v1:py2026:LPFXCOTcvh3BhBOWp9Z5o7bj5YV3CgDEvI8-vNi4iGIHXOaOcT3sDla3P87SDeaJ2_t6RqI";

test("a token sealed in Python opens to its value", () => {
  const ring = new Keyring("py2026", PY_KEY);
  strictEqual(ring.open(FROM_PYTHON), "canary-from-python");
  deepStrictEqual(ring.open(OBJECT_FROM_PYTHON), { n: 7, tags: ["a", "é"] });
  deepStrictEqual(openAll({ modelId: "m1", ref: FROM_PYTHON, list: [FROM_PYTHON] }, ring), {
    modelId: "m1", ref: "canary-from-python", list: ["canary-from-python"],
  });
});

test("round trip, rotation and the key id", () => {
  const old = Keyring.parse(`a:${Buffer.alloc(32, 1).toString("base64")}`);
  const token = old.seal({ secret: 1 });
  ok(token.startsWith(`${SEALED_PREFIX}a:`));
  const rotated = Keyring.parse(`b:${Buffer.alloc(32, 2).toString("base64")}`, `a:${Buffer.alloc(32, 1).toString("base64")}`);
  deepStrictEqual(rotated.open(token), { secret: 1 });
  ok(rotated.seal("x").startsWith(`${SEALED_PREFIX}b:`));
  throws(() => old.open(rotated.seal("x")), /sealed with key 'b', which this keyring lacks/);
});

test("an altered token, a missing key and a bad key are errors", () => {
  const ring = new Keyring("py2026", PY_KEY);
  const flipped = FROM_PYTHON.slice(0, -2) + (FROM_PYTHON.endsWith("n") ? "A" : "n") + FROM_PYTHON.slice(-1);
  throws(() => ring.open(flipped), SealingError);
  throws(() => openAll({ ref: FROM_PYTHON }, undefined), /no sealing key/);
  throws(() => Keyring.parse("nokey"), /<key id>:<base64/);
  throws(() => Keyring.parse(`k:${Buffer.alloc(5).toString("base64")}`), /'k' is 5 bytes/);
  strictEqual(Keyring.fromEnv({}), undefined);
});
