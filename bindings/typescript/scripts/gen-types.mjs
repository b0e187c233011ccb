// Renders TypeScript declarations for Accord contract schemas with json-schema-to-typescript.
// Reads {"items": [{"name": TypeName, "schema": {...}}]} on stdin and writes
// {"TypeName": "source", ...} on stdout. Used by `accord contracts codegen`; no network, no clock.
import { compile } from "json-schema-to-typescript";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const { items } = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const out = {};
for (const { name, schema } of items) {
  out[name] = await compile(schema, name, {
    bannerComment: "",
    additionalProperties: true,
    ignoreMinAndMaxItems: true,
    declareExternallyReferenced: true,
    enableConstEnums: false,
    unknownAny: true,
    strictIndexSignatures: true,
    format: true,
    style: { singleQuote: false, printWidth: 100 },
    cwd: process.cwd(),
    $refOptions: { resolve: { external: false, file: false, http: false } },
  });
}
process.stdout.write(JSON.stringify(out));
