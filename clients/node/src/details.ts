// The status details a failed call carries (the `grpc-status-details-bin` trailer):
// google.rpc.Status and the details the server sends (ErrorInfo, RetryInfo, BadRequest,
// and Runifold's own: TurnConflict, ModelOutputInvalid), decoded into the same plain
// objects as every reply (objects.ts).

import {
  type DescMessage,
  createFileRegistry,
  createRegistry,
  create,
  fromBinary,
} from "@bufbuild/protobuf";
import {
  FieldDescriptorProto_Label as Label,
  FieldDescriptorProto_Type as Type,
  FileDescriptorProtoSchema,
  file_google_protobuf_any,
  file_google_protobuf_duration,
  file_google_protobuf_timestamp,
} from "@bufbuild/protobuf/wkt";

import type { Detail } from "./errors.js";
import { toObject } from "./objects.js";
import { file_runifold_agent_v1_agent_service } from "./gen/runifold/agent/v1/agent_service_pb.js";
import { file_runifold_common_v1_common } from "./gen/runifold/common/v1/common_pb.js";

const field = (name: string, number: number, type: Type, more: object = {}) => ({
  name,
  number,
  type,
  label: Label.OPTIONAL,
  ...more,
});
const repeated = { label: Label.REPEATED };

// google/rpc/status.proto and error_details.proto (the messages read here, with their
// names and field numbers): the client needs no googleapis.
const GOOGLE_RPC = create(FileDescriptorProtoSchema, {
  name: "google/rpc/status_details.proto",
  package: "google.rpc",
  syntax: "proto3",
  dependency: ["google/protobuf/any.proto", "google/protobuf/duration.proto"],
  messageType: [
    {
      name: "Status",
      field: [
        field("code", 1, Type.INT32),
        field("message", 2, Type.STRING),
        field("details", 3, Type.MESSAGE, { ...repeated, typeName: ".google.protobuf.Any" }),
      ],
    },
    {
      name: "ErrorInfo",
      field: [
        field("reason", 1, Type.STRING),
        field("domain", 2, Type.STRING),
        field("metadata", 3, Type.MESSAGE, {
          ...repeated,
          typeName: ".google.rpc.ErrorInfo.MetadataEntry",
        }),
      ],
      nestedType: [
        {
          name: "MetadataEntry",
          field: [field("key", 1, Type.STRING), field("value", 2, Type.STRING)],
          options: { mapEntry: true },
        },
      ],
    },
    {
      name: "RetryInfo",
      field: [field("retry_delay", 1, Type.MESSAGE, { typeName: ".google.protobuf.Duration" })],
    },
    {
      name: "BadRequest",
      field: [
        field("field_violations", 1, Type.MESSAGE, {
          ...repeated,
          typeName: ".google.rpc.BadRequest.FieldViolation",
        }),
      ],
      nestedType: [
        {
          name: "FieldViolation",
          field: [field("field", 1, Type.STRING), field("description", 2, Type.STRING)],
        },
      ],
    },
  ],
});

const WELL_KNOWN = [file_google_protobuf_any, file_google_protobuf_duration, file_google_protobuf_timestamp];
const rpc = createFileRegistry(GOOGLE_RPC, (name) => WELL_KNOWN.find((file) => file.name + ".proto" === name));
// The types a detail may be: google.rpc's, and AgentService's with what it uses.
const TYPES = createRegistry(rpc, file_runifold_agent_v1_agent_service, file_runifold_common_v1_common, ...WELL_KNOWN);
const STATUS = rpc.getMessage("google.rpc.Status")!;

/** The details of a google.rpc.Status (a detail of a type this client does not know is
 * left out). */
export function statusDetails(raw: Uint8Array): Detail[] {
  const status = fromBinary(STATUS, raw) as unknown as {
    details: { typeUrl: string; value: Uint8Array }[];
  };
  const details: Detail[] = [];
  for (const packed of status.details) {
    const typeName = packed.typeUrl.split("/").pop() ?? "";
    const desc: DescMessage | undefined = TYPES.getMessage(typeName);
    if (desc === undefined) continue;
    details.push({ typeName, value: toObject(desc, fromBinary(desc, packed.value)) });
  }
  return details;
}
