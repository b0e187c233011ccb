// Bundles src/main.ts and copies index.html and the stylesheet into the folder the Python
// package serves under /ui/ (src/accord/adapters/ingress/ui_static). No asset names a CDN.
import { build } from "esbuild";
import { cpSync, mkdirSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "src", "accord", "adapters", "ingress", "ui_static");
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
await build({
  entryPoints: [join(here, "src", "main.ts")],
  bundle: true,
  minify: true,
  format: "esm",
  target: "es2022",
  outfile: join(out, "app.js"),
  legalComments: "linked",
  logLevel: "warning",
});
cpSync(join(here, "index.html"), join(out, "index.html"));
cpSync(join(here, "src", "style.css"), join(out, "app.css"));
