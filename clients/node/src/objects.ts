// The plain objects the client takes and returns, to and from protoc-gen-es's messages.
//
// The objects keep the shape this client has always had (the types in gen's
// *_objects.ts, written by scripts/protoc-gen-objects.mjs): the proto field names, int64
// as a JS number, enums by name, every field of a reply present (its default when unset,
// an unset message null), a oneof named by a field holding the name of the member that is
// set (`event: "appended"`), a proto3 `optional` absent when unset (and named, when set,
// by its synthetic oneof `_name`). The conversion reads the messages' descriptors, so it
// follows the contract as generated, field by field.

import {
  type DescEnum,
  type DescField,
  type DescMessage,
  type Message,
  ScalarType,
  create,
  fromBinary,
  toBinary,
} from "@bufbuild/protobuf";

type Plain = Record<string, unknown>;
type Any = any; // eslint-disable-line @typescript-eslint/no-explicit-any

const LONGS = new Set([
  ScalarType.INT64,
  ScalarType.UINT64,
  ScalarType.SINT64,
  ScalarType.FIXED64,
  ScalarType.SFIXED64,
]);

/** The wire form of an object of a message (the request of a call). */
export function encode(desc: DescMessage, object: unknown): Buffer {
  return Buffer.from(toBinary(desc, fromObject(desc, object as Plain)));
}

/** The object of a message's wire form (the reply of a call), and the message itself. */
export function decode(desc: DescMessage, bytes: Uint8Array): [Plain, Message] {
  const message = fromBinary(desc, bytes);
  return [toObject(desc, message), message];
}

// -- message -> object --------------------------------------------------------------

function scalarOut(scalar: ScalarType, value: unknown): unknown {
  if (LONGS.has(scalar)) return Number(value);
  if (scalar === ScalarType.BYTES) {
    const bytes = value as Uint8Array;
    return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }
  return value;
}

function enumOut(desc: DescEnum, value: number): string | number {
  return desc.value[value]?.name ?? value;
}

function valueOut(field: DescField, kind: string, value: unknown): unknown {
  if (kind === "enum") return enumOut(field.enum!, value as number);
  if (kind === "message") return toObject(field.message!, value as Message);
  return scalarOut(field.scalar!, value);
}

function fieldOut(field: DescField, value: unknown): unknown {
  switch (field.fieldKind) {
    case "list":
      return (value as unknown[]).map((item) => valueOut(field, field.listKind, item));
    case "map":
      return Object.fromEntries(
        Object.entries(value as Plain).map(([key, item]) => [key, valueOut(field, field.mapKind, item)]),
      );
    default:
      return valueOut(field, field.fieldKind, value);
  }
}

/** The synthetic oneof of a proto3 `optional` field (`_name`), or undefined. */
function syntheticOneof(field: DescField): string | undefined {
  if (!field.proto.proto3Optional) return undefined;
  return field.parent.proto.oneofDecl[field.proto.oneofIndex ?? 0]?.name;
}

/** The object of a message: lists first, then maps, then the other fields (defaults
 * for those unset), then the oneof member set, as @grpc/proto-loader ordered them. */
export function toObject(desc: DescMessage, message: Message): Plain {
  const source = message as Any;
  const object: Plain = {};
  const plain = desc.fields.filter((f) => f.oneof === undefined && !f.proto.proto3Optional);
  for (const field of plain.filter((f) => f.fieldKind === "list")) {
    object[field.name] = fieldOut(field, source[field.localName]);
  }
  for (const field of plain.filter((f) => f.fieldKind === "map")) {
    object[field.name] = fieldOut(field, source[field.localName]);
  }
  for (const field of plain.filter((f) => f.fieldKind !== "list" && f.fieldKind !== "map")) {
    const value = source[field.localName];
    object[field.name] = value === undefined ? null : fieldOut(field, value);
  }
  for (const field of desc.fields) {
    if (field.oneof !== undefined) {
      const chosen = source[field.oneof.localName] as { case?: string; value?: unknown };
      if (chosen.case !== field.localName) continue;
      object[field.name] = fieldOut(field, chosen.value);
      object[field.oneof.name] = field.name;
    } else if (field.proto.proto3Optional && source[field.localName] !== undefined) {
      object[field.name] = fieldOut(field, source[field.localName]);
      object[syntheticOneof(field)!] = field.name;
    }
  }
  return object;
}

// -- object -> message --------------------------------------------------------------

function scalarIn(field: DescField, scalar: ScalarType, value: unknown): unknown {
  switch (scalar) {
    case ScalarType.STRING:
      return String(value);
    case ScalarType.BOOL:
      return Boolean(value);
    case ScalarType.BYTES:
      return typeof value === "string" ? new Uint8Array(Buffer.from(value, "base64")) : (value as Uint8Array);
    case ScalarType.DOUBLE:
    case ScalarType.FLOAT:
      return Number(value);
    case ScalarType.UINT32:
    case ScalarType.FIXED32:
      return Number(value) >>> 0;
    default:
      if (!LONGS.has(scalar)) return Number(value) | 0;
      // A number (truncated), a decimal string, a bigint, or a Long-like object.
      return typeof value === "number" ? BigInt(Math.trunc(value)) : BigInt(String(value));
  }
}

function enumIn(desc: DescEnum, value: unknown): number | undefined {
  if (typeof value === "number") return value;
  return desc.values.find((v) => v.name === value)?.number;
}

function valueIn(field: DescField, kind: string, value: unknown): unknown {
  if (kind === "enum") return enumIn(field.enum!, value);
  if (kind === "message") return fromObject(field.message!, value as Plain);
  return scalarIn(field, field.scalar!, value);
}

function fieldIn(field: DescField, value: unknown): unknown {
  const where = `${field.parent.typeName}.${field.name}`;
  switch (field.fieldKind) {
    case "list":
      if (!Array.isArray(value)) throw new TypeError(`${where}: array expected`);
      return value.map((item) => valueIn(field, field.listKind, item));
    case "map":
      if (typeof value !== "object") throw new TypeError(`${where}: object expected`);
      return Object.fromEntries(
        Object.entries(value as Plain).map(([key, item]) => [key, valueIn(field, field.mapKind, item)]),
      );
    default:
      return valueIn(field, field.fieldKind, value);
  }
}

/** The message of an object: fields null or undefined stay unset, names unknown to the
 * message are ignored, an enum name it does not have leaves its field unset. */
export function fromObject(desc: DescMessage, object: Plain): Message {
  const message = create(desc) as Any;
  for (const field of desc.fields) {
    const value = object[field.name];
    if (value === null || value === undefined) continue;
    const converted = fieldIn(field, value);
    if (converted === undefined) continue;
    if (field.oneof !== undefined) {
      message[field.oneof.localName] = { case: field.localName, value: converted };
    } else {
      message[field.localName] = converted;
    }
  }
  return message as Message;
}
