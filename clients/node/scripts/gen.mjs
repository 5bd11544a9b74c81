// Copies the generated code of the contract (the repository's gen/ts, made by
// `buf generate` from proto/) into this package, where the client imports it (src/gen).
//
// `npm run build` (and so `npm pack`, `npm test`) runs it first: the package holds
// everything it needs once installed. The copy is never edited and not committed;
// gen/ts is (regenerate it with `buf generate` at the repository's root after a change
// to proto/).

import { cpSync, existsSync, rmSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "..");
const generated = path.resolve(root, "../../gen/ts");
const copy = path.join(root, "src", "gen");

if (!existsSync(generated)) {
  console.error(`gen: no generated code at ${generated}: build the package inside the Runifold repository`);
  process.exit(1);
}

rmSync(copy, { recursive: true, force: true });
cpSync(generated, copy, { recursive: true});
// Whatever an earlier build compiled (a test file since removed, say) goes too.
rmSync(path.join(root, "dist"), { recursive: true, force: true });
// The .proto files an earlier build copied here (the package no longer loads them).
rmSync(path.join(root, "proto"), { recursive: true, force: true });
console.log("gen: the contract's TypeScript (gen/ts) in src/gen");
