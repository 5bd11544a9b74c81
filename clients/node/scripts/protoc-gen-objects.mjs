#!/usr/bin/env node
// protoc-gen-objects: a protoc plugin (run by `buf generate`, see the repository's
// buf.gen.yaml) that writes, beside protoc-gen-es's messages (*_pb.ts), the types of the
// plain objects the TypeScript client takes and returns (*_objects.ts).
//
// Those objects are what the client has always used (@grpc/proto-loader's shape): the
// proto field names (snake_case), int64 as a JS number, enums by their names, every
// field of a reply present (its default when unset; an unset message is null), a oneof
// named by a field holding the name of the member that is set, a proto3 `optional`
// absent when unset. For each service `S`, `S__Methods`: each method's request and reply
// objects. For each message `M`: `M` (what a request may hold: every field
// optional, an enum by name or number, an int64 as a number or a decimal string) and
// `M__Output` (what a reply holds). For each enum `E`: `E` (an object of its names), the
// type `E` (a name or a number) and `E__Output` (a name). src/objects.ts converts between
// these objects and protoc-gen-es's messages, field by field, from the same descriptors.
//
// Every file it is given is written, with the files they depend on (google/protobuf/
// timestamp.proto, ...): run it with `strategy: all`, so that each is written once.

import { ScalarType } from "@bufbuild/protobuf";
import { createEcmaScriptPlugin, runNodeJs } from "@bufbuild/protoplugin";

const SUFFIX = "_objects";

/** The name of a message or enum's types: nested ones joined by "_" (Parent_Child). */
function nameOf(desc) {
  const inside = desc.typeName.slice(desc.file.proto.package ? desc.file.proto.package.length + 1 : 0);
  return inside.split(".").join("_");
}

/** The module of a file's object types, from the output's root. */
function moduleOf(file) {
  return `./${file.name}${SUFFIX}.js`;
}

function scalarInput(scalar) {
  switch (scalar) {
    case ScalarType.STRING:
      return "string";
    case ScalarType.BOOL:
      return "boolean";
    case ScalarType.BYTES:
      return "Buffer | Uint8Array | string";
    case ScalarType.INT64:
    case ScalarType.UINT64:
    case ScalarType.SINT64:
    case ScalarType.FIXED64:
    case ScalarType.SFIXED64:
      return "number | string | bigint";
    case ScalarType.DOUBLE:
    case ScalarType.FLOAT:
      return "number | string";
    default:
      return "number";
  }
}

function scalarOutput(scalar) {
  switch (scalar) {
    case ScalarType.STRING:
      return "string";
    case ScalarType.BOOL:
      return "boolean";
    case ScalarType.BYTES:
      return "Buffer";
    default:
      return "number";
  }
}

/** Every file to write: those asked for, and the files they depend on. */
function withDependencies(files) {
  const found = new Map();
  const visit = (file) => {
    if (found.has(file.name)) return;
    found.set(file.name, file);
    file.dependencies.forEach(visit);
  };
  files.forEach(visit);
  return [...found.values()];
}

function* nested(messages) {
  for (const message of messages) {
    yield message;
    yield* nested(message.nestedMessages);
  }
}

function generate(schema) {
  for (const file of withDependencies(schema.files)) {
    const f = schema.generateFile(`${file.name}${SUFFIX}.ts`);
    f.preamble(file);
    const ref = (desc, output) => {
      const name = nameOf(desc) + (output ? "__Output" : "");
      return desc.file === file ? name : f.import(name, moduleOf(desc.file), true);
    };
    const enums = [...file.enums, ...[...nested(file.messages)].flatMap((m) => m.nestedEnums)];
    for (const desc of enums) writeEnum(f, desc);
    for (const desc of nested(file.messages)) writeMessage(f, desc, ref);
    for (const desc of file.services) writeService(f, desc, ref);
  }
}

function writeEnum(f, desc) {
  const name = nameOf(desc);
  f.print(f.jsDoc(desc));
  f.print(f.export("const", name), " = {");
  for (const value of desc.values) f.print(`  ${value.name}: '${value.name}',`);
  f.print("} as const;");
  f.print();
  f.print(f.jsDoc(desc));
  f.print(f.export("type", name), " =");
  for (const value of desc.values) f.print(`  | '${value.name}'`, "\n", `  | ${value.number}`);
  f.print();
  f.print(f.export("type", `${name}__Output`), ` = typeof ${name}[keyof typeof ${name}];`);
  f.print();
}

/** The type of one value of a field (an element of a list, a value of a map). */
function valueType(field, kind, ref, output) {
  switch (kind) {
    case "scalar":
      return output ? scalarOutput(field.scalar) : scalarInput(field.scalar);
    case "enum":
      return [ref(field.enum, output)];
    default:
      return [ref(field.message, output)];
  }
}

function fieldType(field, ref, output) {
  switch (field.fieldKind) {
    case "list":
      return ["(", valueType(field, field.listKind, ref, output), ")[]"];
    case "map":
      return ["({[key: string]: ", valueType(field, field.mapKind, ref, output), "})"];
    case "message":
      return ["(", valueType(field, "message", ref, output), " | null)"];
    default:
      return ["(", valueType(field, field.fieldKind, ref, output), ")"];
  }
}

/** The name of a proto3 `optional` field's synthetic oneof (`_name`), or undefined. */
function syntheticOneof(field) {
  if (!field.proto.proto3Optional) return undefined;
  return field.parent.proto.oneofDecl[field.proto.oneofIndex].name;
}

function writeMessage(f, desc, ref) {
  const name = nameOf(desc);
  for (const output of [false, true]) {
    f.print(f.jsDoc(desc));
    f.print(f.export("interface", output ? `${name}__Output` : name), " {");
    for (const field of desc.fields) {
      const optional = !output || field.oneof !== undefined || field.proto.proto3Optional;
      f.print(f.jsDoc(field, "  "));
      f.print(`  '${field.name}'${optional ? "?" : ""}: `, fieldType(field, ref, output), ";");
      const synthetic = syntheticOneof(field);
      if (synthetic) f.print(`  '${synthetic}'?: "${field.name}";`);
    }
    for (const oneof of desc.oneofs) {
      const members = oneof.fields.map((field) => `"${field.name}"`).join("|");
      f.print(`  '${oneof.name}'?: ${members};`);
    }
    f.print("}");
    f.print();
  }
}

/** A service's methods (by protoc-gen-es's name: `runConversation`), each with the
 * objects of its request and its reply. */
function writeService(f, desc, ref) {
  f.print(f.jsDoc(desc));
  f.print(f.export("interface", `${desc.name}__Methods`), " {");
  for (const method of desc.methods) {
    f.print(f.jsDoc(method, "  "));
    f.print(
      `  ${method.localName}: { request: `,
      ref(method.input, false),
      "; response: ",
      ref(method.output, true),
      " };",
    );
  }
  f.print("}");
  f.print();
}

runNodeJs(
  createEcmaScriptPlugin({
    name: "protoc-gen-objects",
    version: "v1",
    generateTs: generate,
  }),
);
