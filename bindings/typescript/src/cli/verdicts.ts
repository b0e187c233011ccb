// Prints this binding's verdict on every golden fixture, for the cross-language test:
//   node dist/cli/verdicts.js <schemas/fixtures>
// Output: {"<contract>/<version>/<valid|invalid>/<case>.json": {"ok", "paths", "normalised"}}.

import { readFixtures } from "../fixtures";
import { validate } from "../index";

const root = process.argv[2];
if (!root) {
  process.stderr.write("usage: verdicts <fixtures-root>\n");
  process.exit(2);
}
const out: Record<string, { ok: boolean; paths: string[]; normalised: unknown }> = {};
for (const fixture of readFixtures(root)) {
  const result = validate(fixture.contract, fixture.version, fixture.message);
  const paths = [...new Set(result.errors.map((e) => e.path))].sort();
  out[fixture.id] = { ok: result.ok, paths, normalised: result.value };
}
process.stdout.write(JSON.stringify(out) + "\n");
