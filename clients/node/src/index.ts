// TypeScript client of the Runifold conversation services (@grpc/grpc-js).
//
// Every RPC of the four services (AgentService, TranscriptService, SummaryService,
// MemoryService) is a method of RunifoldClient, composed of one class of methods per
// service (agent.ts, transcript.ts, summary.ts, memory.ts) on one connection
// (connection.ts). The messages are generated from the contract by `buf generate`
// (the repository's gen/ts, copied into the package when it is built): protoc-gen-es's
// messages on the wire, plain objects in the methods (objects.ts). Errors are typed
// (errors.ts): the server's google.rpc.ErrorInfo reason picks the class, its metadata and
// the other status details (TurnConflict, RetryInfo, BadRequest, ...) are decoded.
//
// Writes are safe to retry: a turn carries a `turn_id`, appends and memory writes a
// `request_id`, createConversation a conversation id, each made here when you pass
// none, so a retry returns the first result. gRPC retries UNAVAILABLE itself (a
// service-config retryPolicy), on every method but Summarize and ProposeMemories.

import { AgentCalls } from "./agent.js";
import { type ClientOptions, Connection } from "./connection.js";
import { AgentService } from "./gen/runifold/agent/v1/agent_service_pb.js";
import { MemoryService } from "./gen/runifold/memory/v1/memory_service_pb.js";
import { SummaryService } from "./gen/runifold/summary/v1/summary_service_pb.js";
import { TranscriptService } from "./gen/runifold/transcript/v1/transcript_service_pb.js";
import { MemoryCalls } from "./memory.js";
import { SummaryCalls } from "./summary.js";
import { TranscriptCalls } from "./transcript.js";

export * from "./errors.js";
export {
  DEFAULT_SUMMARY_MODE,
  assistant,
  toolResult,
  user,
  type Input,
  type TurnOptions,
} from "./agent.js";
export {
  DEFAULT_TARGET,
  NAMESPACE_ENV,
  PAGE_SIZE,
  TARGET_ENV,
  TOKEN_ENV,
  fromEnvironment,
  type CallOptions,
  type ClientOptions,
} from "./connection.js";
export { newConversationId, type WatchOptions } from "./transcript.js";
export type { WatchMemoriesOptions } from "./memory.js";
export { VerificationFailed, type Verified } from "./digests.js";
export type { WatchPosition } from "./watch.js";
export { ConcurrencyMode, SummaryMode, TurnStage } from "./gen/runifold/agent/v1/agent_service_objects.js";
export { Role } from "./gen/runifold/common/v1/common_objects.js";
export { TurnFinish, TurnLeaseMode } from "./gen/runifold/transcript/v1/transcript_service_objects.js";
export type {
  ContextPolicy,
  EraseConversationResponse__Output as EraseConversationResponse,
  RunConversationResponse__Output as TurnResult,
  StreamConversationResponse__Output as StreamEvent,
} from "./gen/runifold/agent/v1/agent_service_objects.js";
export type {
  Budget,
  Entry__Output as Entry,
  Message,
  ToolDefinition,
  Usage,
} from "./gen/runifold/common/v1/common_objects.js";
export type {
  Memory__Output as Memory,
  MemoryEvent__Output as MemoryEvent,
  MemorySource,
  SearchMemoriesResponse__Output as SearchMemoriesResponse,
  UpsertMemoryResponse__Output as UpsertMemoryResponse,
  WatchMemoriesResponse__Output as MemoryWatchEvent,
} from "./gen/runifold/memory/v1/memory_service_objects.js";
export type {
  GetBacklogResponse__Output as GetBacklogResponse,
  RequestSummaryResponse__Output as RequestSummaryResponse,
  SummarizeResponse__Output as SummarizeResponse,
  Summary__Output as Summary,
} from "./gen/runifold/summary/v1/summary_service_objects.js";
export type {
  AcquireTurnLeaseResponse__Output as AcquireTurnLeaseResponse,
  AppendEntriesResponse__Output as AppendEntriesResponse,
  Conversation__Output as Conversation,
  DeleteConversationResponse__Output as DeleteConversationResponse,
  EndedTurn,
  LoadViewResponse__Output as LoadViewResponse,
  TurnLease__Output as TurnLease,
  WatchConversationResponse__Output as WatchEvent,
} from "./gen/runifold/transcript/v1/transcript_service_objects.js";

/** The version of this package. */
export const VERSION = "0.1.0";

const SERVICES = [AgentService, TranscriptService, SummaryService, MemoryService];
const PARTS = [AgentCalls, TranscriptCalls, SummaryCalls, MemoryCalls];

/** Client of every Runifold service on one channel. */
export class RunifoldClient extends Connection {
  constructor(options: ClientOptions = {}) {
    super(SERVICES, options);
  }
}

// The methods of each service's class, on RunifoldClient itself.
export interface RunifoldClient extends AgentCalls, TranscriptCalls, SummaryCalls, MemoryCalls {}
for (const part of PARTS) {
  for (const name of Object.getOwnPropertyNames(part.prototype)) {
    if (name === "constructor") continue;
    Object.defineProperty(
      RunifoldClient.prototype,
      name,
      Object.getOwnPropertyDescriptor(part.prototype, name)!,
    );
  }
}
