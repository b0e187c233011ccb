// Reads golden fixtures: <root>/<contract>/<version>/<valid|invalid>/<case>.json.

import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";

export interface Fixture {
  id: string;
  contract: string;
  version: number;
  description: string;
  message: unknown;
  expect: { ok: boolean; paths: string[]; normalised?: unknown };
}

function dirs(path: string): string[] {
  return readdirSync(path)
    .filter((name) => statSync(join(path, name)).isDirectory())
    .sort();
}

export function readFixtures(root: string): Fixture[] {
  const out: Fixture[] = [];
  for (const contract of dirs(root)) {
    for (const version of dirs(join(root, contract))) {
      for (const verdict of ["valid", "invalid"]) {
        const folder = join(root, contract, version, verdict);
        let names: string[] = [];
        try {
          names = readdirSync(folder).filter((n) => n.endsWith(".json")).sort();
        } catch {
          continue;
        }
        for (const name of names) {
          const data = JSON.parse(readFileSync(join(folder, name), "utf8"));
          out.push({
            id: `${contract}/${version}/${verdict}/${name}`,
            contract,
            version: Number(version),
            description: data.description,
            message: data.message,
            expect: data.expect,
          });
        }
      }
    }
  }
  return out;
}
