// Every golden fixture gives the expected verdict, failing paths and normalised value.

import { deepStrictEqual, ok, strictEqual } from "node:assert/strict";
import { join } from "node:path";
import { test } from "node:test";

import { readFixtures } from "../fixtures";
import { CONTRACTS, validate } from "../index";

const root = join(__dirname, "..", "..", "..", "..", "schemas", "fixtures");
const fixtures = readFixtures(root);

test("fixtures exist for every registered contract", () => {
  const covered = new Set(fixtures.map((f) => `${f.contract}@${f.version}`));
  for (const key of Object.keys(CONTRACTS)) ok(covered.has(key), `no fixtures for ${key}`);
  ok(fixtures.length > 100);
});

for (const fixture of fixtures) {
  test(fixture.id, () => {
    const result = validate(fixture.contract, fixture.version, fixture.message);
    strictEqual(result.ok, fixture.expect.ok, fixture.description);
    deepStrictEqual([...new Set(result.errors.map((e) => e.path))].sort(), fixture.expect.paths);
    if (fixture.expect.ok) deepStrictEqual(result.value, fixture.expect.normalised);
  });
}
