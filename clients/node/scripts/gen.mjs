// Copies the contract (../../proto) into this package and generates its TypeScript types.
//
// `npm run build` (and so `npm pack`, `npm test`) runs it first: the package ships the
// .proto files it loads at run time (proto/) and the types compiled from src/gen/, both
// made from the repository's proto/ at build time, never edited by hand (and not
// committed: they cannot go stale).

import { spawnSync } from "node:child_process";
import { cpSync, existsSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "..");
const contract = path.resolve(root, "../../proto");
const protoOut = path.join(root, "proto");
const typesOut = path.join(root, "src", "gen");

if (!existsSync(contract)) {
  console.error(`gen: no contract at ${contract}: build the package inside the Runifold repository`);
  process.exit(1);
}

function walk(folder) {
  return readdirSync(folder).flatMap((name) => {
    const full = path.join(folder, name);
    return statSync(full).isDirectory() ? walk(full) : [full];
  });
}

rmSync(protoOut, { recursive: true, force: true });
cpSync(contract, protoOut, { recursive: true, filter: (p) => statSync(p).isDirectory() || p.endsWith(".proto") });
const services = walk(path.join(protoOut, "runifold"))
  .filter((p) => p.endsWith("_service.proto"))
  .map((p) => path.relative(protoOut, p).split(path.sep).join("/"))
  .sort();

rmSync(typesOut, { recursive: true, force: true });
// Whatever an earlier build compiled (a test file since removed, say) goes too.
rmSync(path.join(root, "dist"), { recursive: true, force: true });
const require = createRequire(import.meta.url);
const generator = require.resolve("@grpc/proto-loader/build/bin/proto-loader-gen-types.js");
// The same options the client loads the protos with (src/index.ts, LOAD_OPTIONS).
const result = spawnSync(
  process.execPath,
  [
    generator,
    "--keepCase",
    "--longs=Number",
    "--enums=String",
    "--defaults",
    "--oneofs",
    "--grpcLib=@grpc/grpc-js",
    "-I",
    protoOut,
    "-O",
    typesOut,
    ...services,
  ],
  { stdio: ["ignore", "ignore", "inherit"] },
);
if (result.status !== 0) process.exit(result.status ?? 1);

// ES modules resolve relative imports by their full file name: add the ".js" that
// TypeScript's NodeNext resolution asks for, and drop the machine-specific path comment.
for (const file of walk(typesOut).filter((p) => p.endsWith(".ts"))) {
  const text = readFileSync(file, "utf8")
    .replace(/(from '\.{1,2}\/[^']*?)(?<!\.js)';/g, "$1.js';")
    .replace(/^\/\/ Original file: .*\n/m, "");
  writeFileSync(file, text);
}
console.log(`gen: ${services.length} services, types in src/gen, protos in proto/`);
