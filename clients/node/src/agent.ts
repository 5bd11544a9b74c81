// AgentService's calls: a turn (whole, or streamed), erasing a conversation everywhere, and
// the erasure's receipt.

import type * as grpc from "@grpc/grpc-js";

import { type CallOptions, Connection, randomId, rpcs } from "./connection.js";
import { AgentService } from "./gen/runifold/agent/v1/agent_service_pb.js";
import type {
  AgentService__Methods,
  ConcurrencyMode,
  ContextPolicy,
  EraseConversationResponse__Output,
  ErasureReceipt__Output,
  RunConversationRequest,
  RunConversationResponse__Output,
  StreamConversationResponse__Output,
  SummaryMode,
} from "./gen/runifold/agent/v1/agent_service_objects.js";
import type { Budget, Message, ToolDefinition } from "./gen/runifold/common/v1/common_objects.js";

const AGENT = rpcs<AgentService__Methods>(AgentService);

export type Input = string | Message | Array<string | Message>;

export interface TurnOptions extends CallOptions {
  conversationId?: string;
  /** Idempotency key of the turn (default: a new UUID). */
  turnId?: string;
  policy?: ContextPolicy;
  budget?: Budget;
  systemInstructions?: string;
  /** Create the conversation if it does not exist (default true). */
  createIfMissing?: boolean;
  tools?: ToolDefinition[];
  concurrency?: ConcurrencyMode;
}

/** A user message. */
export const user = (text: string, metadata?: Record<string, string>): Message => ({
  role: "ROLE_USER",
  text,
  metadata: metadata ?? {},
});
/** An assistant message (for direct transcript appends). */
export const assistant = (text: string): Message => ({ role: "ROLE_ASSISTANT", text });
/** The result of a tool call the model asked for, to send as the next turn's input. */
export const toolResult = (toolCallId: string, text: string): Message => ({
  role: "ROLE_TOOL",
  text,
  tool_call_id: toolCallId,
});

export function messages(input: Input): Message[] {
  const items = Array.isArray(input) ? input : [input];
  return items.map((item) => (typeof item === "string" ? user(item) : item));
}

/**
 * The summary mode of a turn whose policy names none: AUTO, as in the Python client and
 * the CLI. The server keeps summaries ahead of the window in the background, so a turn
 * only summarizes (charged to its budget) when that queue has fallen behind, and a chat
 * loop never sees SummaryRequired. `summary_mode: "SUMMARY_MODE_REQUIRE"` asks for the
 * seed's refusal instead.
 */
export const DEFAULT_SUMMARY_MODE: SummaryMode = "SUMMARY_MODE_AUTO";

function withDefaults(policy: ContextPolicy | undefined): ContextPolicy {
  const mode = policy?.summary_mode;
  const unset = mode === undefined || mode === 0 || mode === "SUMMARY_MODE_UNSPECIFIED";
  return { ...policy, summary_mode: unset ? DEFAULT_SUMMARY_MODE : mode };
}

/** A turn's request; RunConversation and StreamConversation take the same fields. */
function turnRequest(namespace: string, input: Input, options: TurnOptions): RunConversationRequest {
  return {
    namespace,
    conversation_id: options.conversationId ?? "",
    input: messages(input),
    turn_id: options.turnId ?? randomId(),
    policy: withDefaults(options.policy),
    budget: options.budget ?? {},
    system_instructions: options.systemInstructions ?? "",
    create_if_missing: options.createIfMissing ?? true,
    tools: options.tools ?? [],
    concurrency: options.concurrency ?? "CONCURRENCY_MODE_RACE",
  };
}

/** The methods of AgentService. */
export class AgentCalls extends Connection {
  /** Run one agent turn. Throws TurnConflict, SummaryRequired, ConversationBusy, ... */
  runConversation(input: Input, options: TurnOptions = {}): Promise<RunConversationResponse__Output> {
    return this.unary(AGENT.runConversation, turnRequest(this.ns(options), input, options), options);
  }

  /** The same turn as a stream of events: progress, text deltas, then the result. */
  async *streamConversation(
    input: Input,
    options: TurnOptions = {},
  ): AsyncGenerator<StreamConversationResponse__Output> {
    const call = this.stream(AGENT.streamConversation, turnRequest(this.ns(options), input, options), {
      deadline: this.deadline(options),
    });
    try {
      for await (const event of call) yield event as StreamConversationResponse__Output;
    } catch (error) {
      throw this.toError(error as grpc.ServiceError);
    } finally {
      call.cancel();
    }
  }

  /** Erase a conversation everywhere: entries, summaries, jobs, derived memories. The
   * reply's `receipt` says what was erased in each store (counts, never content). */
  eraseConversation(conversationId: string, options?: CallOptions): Promise<EraseConversationResponse__Output> {
    return this.unary(
      AGENT.eraseConversation,
      { namespace: this.ns(options), conversation_id: conversationId },
      options,
    );
  }

  /** The receipt of an erasure, by its id (or, with `conversationId` and an empty id, the
   * latest of that conversation); `complete_time` is set once the vector index caught up. */
  async getErasureReceipt(
    receiptId: string,
    options: CallOptions & { conversationId?: string } = {},
  ): Promise<ErasureReceipt__Output> {
    const reply = await this.unary(
      AGENT.getErasureReceipt,
      { namespace: this.ns(options), receipt_id: receiptId, conversation_id: options.conversationId ?? "" },
      options,
    );
    return reply.receipt!;
  }
}
