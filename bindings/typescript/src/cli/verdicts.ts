// Prints this binding's verdict on every golden fixture, for the cross-language test:
//   node dist/cli/verdicts.js <schemas/fixtures>
// Output: {"<contract>/<version>/<valid|invalid>/<case>.json": {"ok", "paths", "normalised"}}.

import { readFileSync } from "node:fs";

import { readFixtures } from "../fixtures";
import { validate, validateJson } from "../index";

//   node dist/cli/verdicts.js --raw <cases.json>   ([{contract, version, base64}] → codes)

const root = process.argv[2];
if (!root) {
  process.stderr.write("usage: verdicts <fixtures-root> | verdicts --raw <cases.json>\n");
  process.exit(2);
}
if (root === "--raw") {
  const cases = JSON.parse(readFileSync(process.argv[3] ?? "", "utf8")) as {
    contract: string;
    version: number;
    base64: string;
  }[];
  const verdicts = cases.map((c) => {
    const result = validateJson(c.contract, c.version, Buffer.from(c.base64, "base64"));
    return { ok: result.ok, codes: result.errors.map((e) => e.code), paths: result.errors.map((e) => e.path) };
  });
  process.stdout.write(JSON.stringify(verdicts) + "\n");
  process.exit(0);
}
const out: Record<string, { ok: boolean; paths: string[]; normalised: unknown }> = {};
for (const fixture of readFixtures(root)) {
  const result = validate(fixture.contract, fixture.version, fixture.message);
  const paths = [...new Set(result.errors.map((e) => e.path))].sort();
  out[fixture.id] = { ok: result.ok, paths, normalised: result.value };
}
process.stdout.write(JSON.stringify(out) + "\n");
