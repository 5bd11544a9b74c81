// TranscriptService's calls: conversations, their entries and state, views, watching,
// and turn leases.

import * as grpc from "@grpc/grpc-js";

import { type Input, messages } from "./agent.js";
import { type CallOptions, Connection, PAGE_SIZE, duration, randomId, rpcs } from "./connection.js";
import type { Entry__Output, Usage } from "./gen/runifold/common/v1/common_objects.js";
import { TranscriptService } from "./gen/runifold/transcript/v1/transcript_service_pb.js";
import type {
  AcquireTurnLeaseResponse__Output,
  AppendEntriesResponse__Output,
  Append__Output,
  Checkpoint,
  CheckpointWrite,
  Checkpoint__Output,
  Conversation__Output,
  DeleteCheckpointsResponse__Output,
  DeleteConversationResponse__Output,
  EndedTurn,
  ErasureProgress,
  ErasureReceipt__Output as TranscriptErasureReceipt__Output,
  GetStateResponse__Output,
  LoadViewResponse__Output,
  MarkCuratedResponse__Output,
  PutCheckpointResponse__Output,
  StateDelta,
  TranscriptService__Methods,
  TurnLeaseMode,
  TurnLease__Output,
  WatchConversationResponse__Output,
} from "./gen/runifold/transcript/v1/transcript_service_objects.js";
import { type Verified, bytesOf, recompute } from "./digests.js";
import { Position, type WatchPosition, backoffMs } from "./watch.js";

const TRANSCRIPT = rpcs<TranscriptService__Methods>(TranscriptService);

export interface WatchOptions extends CallOptions {
  /** Deliver the entries after this sequence (0: from the first). */
  afterSequence?: number;
  /**
   * The incarnation followed, when resuming (a string keeps all 64 bits; see
   * `RunifoldClient.watchPosition`). 0: whatever incarnation exists.
   */
  incarnation?: string | number;
  /** How often a quiet stream gets a heartbeat, 1..300 s (default: the server's). */
  heartbeatSeconds?: number;
  /** Watch again after UNAVAILABLE and WATCHER_TOO_SLOW (default true). */
  resume?: boolean;
  /** The longest wait between two attempts (default 5000 ms). */
  maxBackoffMs?: number;
  /** Stop watching (the iteration then ends). */
  signal?: AbortSignal;
}

/** A UUIDv7 (RFC 9562): time-ordered like the server's ids, made here so that a retried
 * CreateConversation names the same conversation. */
export function newConversationId(): string {
  const bytes = globalThis.crypto.getRandomValues(new Uint8Array(16));
  const millis = BigInt(Date.now());
  for (let i = 0; i < 6; i++) bytes[i] = Number((millis >> BigInt(8 * (5 - i))) & 0xffn);
  bytes[6] = (bytes[6] & 0x0f) | 0x70; // version 7
  bytes[8] = (bytes[8] & 0x3f) | 0x80; // RFC 4122 variant
  const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/** The exact incarnation of a watch event (the message's int64), when it has one. */
function incarnationOf(message: any): string | null {
  const event = message.event;
  if (event?.case !== "appended" && event?.case !== "heartbeat") return null;
  return String(event.value.incarnation);
}

/** The methods of TranscriptService. */
export class TranscriptCalls extends Connection {
  /** Create (or get, when it exists) a conversation; its id is made here when absent. */
  async createConversation(
    options: CallOptions & {
      conversationId?: string;
      labels?: Record<string, string>;
      /** The conversation's user (its user state, ListConversations' filter). */
      userId?: string;
      /** Initial state, as JSON objects of keys (conversation, user, namespace). */
      state?: StateDelta;
    } = {},
  ): Promise<Conversation__Output> {
    const reply = await this.unary(
      TRANSCRIPT.createConversation,
      {
        namespace: this.ns(options),
        conversation_id: options.conversationId || newConversationId(),
        labels: options.labels ?? {},
        user_id: options.userId ?? "",
        state: options.state ?? null,
      },
      options,
    );
    return reply.conversation!;
  }

  /** A conversation's version and counters. */
  async getConversation(conversationId: string, options?: CallOptions): Promise<Conversation__Output> {
    const reply = await this.unary(
      TRANSCRIPT.getConversation,
      { namespace: this.ns(options), conversation_id: conversationId },
      options,
    );
    return reply.conversation!;
  }

  /** Every conversation of a namespace, in id order, page by page. */
  listConversations(
    options: CallOptions & {
      pageSize?: number;
      /** Only this user's conversations. */
      userId?: string;
      /** With each conversation's state (pages of at most 50). */
      withState?: boolean;
      /** Newest first (by creation), instead of id order. */
      newestFirst?: boolean;
    } = {},
  ): AsyncGenerator<Conversation__Output> {
    return this.pages(
      (token) =>
        this.unary(
          TRANSCRIPT.listConversations,
          {
            namespace: this.ns(options),
            page_size: options.pageSize ?? (options.withState ? 50 : PAGE_SIZE),
            page_token: token,
            user_id: options.userId ?? "",
            view: options.withState ? "CONVERSATION_VIEW_FULL" : "CONVERSATION_VIEW_BASIC",
            order: options.newestFirst ? "CONVERSATION_ORDER_NEWEST_FIRST" : "CONVERSATION_ORDER_ID",
          },
          options,
        ),
      (page) => page.conversations,
      (page) => page.next_page_token,
    );
  }

  /** The namespaces that hold conversations among those the caller may read (its
   * identity's grants; every one when the server has no authentication), by name. */
  listNamespaces(options: CallOptions & { pageSize?: number } = {}): AsyncGenerator<string> {
    return this.pages(
      (token) =>
        this.unary(
          TRANSCRIPT.listNamespaces,
          { page_size: options.pageSize ?? PAGE_SIZE, page_token: token },
          options,
        ),
      (page) => page.namespaces,
      (page) => page.next_page_token,
    );
  }

  /** Append messages; with expectedVersion it is a compare-and-swap (VersionConflict).
   * Idempotent by requestId (made here when absent). Also `append`. */
  appendEntries(
    conversationId: string,
    input: Input,
    options: CallOptions & {
      expectedVersion?: number;
      requestId?: string;
      usage?: Usage;
      fencingToken?: number;
      /** State changes committed with the append, under its version. */
      stateDelta?: StateDelta;
      /** Entries to retract (recorded; views and summaries leave them out); needs
       * expectedVersion. */
      retractSequences?: number[];
    } = {},
  ): Promise<AppendEntriesResponse__Output> {
    return this.unary(
      TRANSCRIPT.appendEntries,
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        messages: messages(input),
        request_id: options.requestId ?? randomId(),
        usage: options.usage ?? null,
        expected_version: options.expectedVersion,
        fencing_token: options.fencingToken,
        state_delta: options.stateDelta ?? null,
        retract_sequences: options.retractSequences ?? [],
      },
      options,
    );
  }

  /** The namespace's state and, for each user asked, that user's state (JSON). */
  getState(options: CallOptions & { userIds?: string[] } = {}): Promise<GetStateResponse__Output> {
    return this.unary(
      TRANSCRIPT.getState,
      { namespace: this.ns(options), user_ids: options.userIds ?? [] },
      options,
    );
  }

  /** The same as appendEntries. */
  append(...args: Parameters<TranscriptCalls["appendEntries"]>): Promise<AppendEntriesResponse__Output> {
    return this.appendEntries(...args);
  }

  /**
   * A new conversation from the entries 1..throughSequence of this one, sharing them
   * (edit and regenerate: fork before the message to edit, run the turn on the fork).
   * Idempotent by requestId (made here when absent).
   */
  async forkConversation(
    conversationId: string,
    throughSequence: number,
    options: CallOptions & { newConversationId?: string; requestId?: string } = {},
  ): Promise<Conversation__Output> {
    const reply = await this.unary(
      TRANSCRIPT.forkConversation,
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        through_sequence: throughSequence,
        new_conversation_id: options.newConversationId ?? "",
        request_id: options.requestId ?? randomId(),
      },
      options,
    );
    return reply.conversation!;
  }

  /** Every fork of a conversation at any depth, in the order they were made (a fork
   * before its own forks), each with its incarnation, its source and the last entry of
   * the source it shares: what an erasure of the conversation takes with it. Reads
   * every page of ListForks. */
  async listForks(
    conversationId: string,
    options: CallOptions & { pageSize?: number } = {},
  ): Promise<
    {
      conversationId: string;
      incarnation: number;
      sourceConversationId: string;
      throughSequence: number;
    }[]
  > {
    const forks = [];
    const pages = this.pages(
      (token) =>
        this.unary(
          TRANSCRIPT.listForks,
          {
            namespace: this.ns(options),
            conversation_id: conversationId,
            page_size: options.pageSize ?? PAGE_SIZE,
            page_token: token,
          },
          options,
        ),
      (page) => page.forks,
      (page) => page.next_page_token,
    );
    for await (const fork of pages) {
      forks.push({
        conversationId: fork.conversation_id,
        incarnation: Number(fork.incarnation),
        sourceConversationId: fork.source_conversation_id,
        throughSequence: Number(fork.through_sequence),
      });
    }
    return forks;
  }

  /** Every append after a version, with its digest and the one it follows, page by page. */
  listAppends(
    conversationId: string,
    options: CallOptions & { afterVersion?: number } = {},
  ): AsyncGenerator<Append__Output> {
    return this.pages(
      (token) =>
        this.unary(
          TRANSCRIPT.listAppends,
          {
            namespace: this.ns(options),
            conversation_id: conversationId,
            after_version: options.afterVersion ?? 0,
            page_size: PAGE_SIZE,
            page_token: token,
          },
          options,
        ),
      (page) => page.appends,
      (page) => page.next_page_token,
    );
  }

  /**
   * Recompute the conversation's digest chain from its entries and appends and compare it
   * with GetConversation's head digest, or find on it the `headDigest` you hold (an
   * append's digest you kept); throws VerificationFailed at the first append that was
   * changed, removed or reordered.
   */
  async verifyConversation(
    conversationId: string,
    options: CallOptions & { headDigest?: Uint8Array } = {},
  ): Promise<Verified> {
    const conversation = await this.getConversation(conversationId, options);
    const appends: Append__Output[] = [];
    for await (const append of this.listAppends(conversationId, options)) {
      if (append.version <= conversation.version) appends.push(append);
    }
    const last = appends.length ? appends[appends.length - 1].last_sequence : 0;
    const entries = new Map<number, Entry__Output>();
    if (last > 0) {
      for await (const entry of this.listEntries(conversationId, { ...options, throughSequence: last })) {
        if (entry.sequence <= last) entries.set(entry.sequence, entry);
      }
    }
    const held = options.headDigest && options.headDigest.length > 0;
    const head = bytesOf(held ? options.headDigest! : conversation.head_digest);
    return recompute(appends, entries, head, Boolean(held));
  }

  /** Every entry after a sequence (up to throughSequence; 0: the end), page by page. */
  listEntries(
    conversationId: string,
    options: CallOptions & { afterSequence?: number; throughSequence?: number } = {},
  ): AsyncGenerator<Entry__Output> {
    return this.pages(
      (token) =>
        this.unary(
          TRANSCRIPT.listEntries,
          {
            namespace: this.ns(options),
            conversation_id: conversationId,
            after_sequence: options.afterSequence ?? 0,
            through_sequence: options.throughSequence ?? 0,
            page_size: PAGE_SIZE,
            page_token: token,
          },
          options,
        ),
      (page) => page.entries,
      (page) => page.next_page_token,
    );
  }

  /**
   * Follow a conversation (TranscriptService.WatchConversation): the entries after
   * `afterSequence` (`appended` events, each entry once and in order), `retracted` for
   * delivered entries a later write retracted, the turns that run on it (`turn_started`,
   * `turn_finished`), `heartbeat`s while it is quiet, and a final
   * `erased` (then the iteration ends). No deadline: break out of the loop, or abort
   * `signal`, to leave.
   *
   * A stream that breaks (UNAVAILABLE; RESOURCE_EXHAUSTED / WATCHER_TOO_SLOW) is watched
   * again from the last sequence received and its incarnation, with backoff: nothing is
   * missed and nothing repeats (a retraction the resumed stream reports again is dropped
   * here). Running turns are not reported started twice; a turn that
   * finished while the stream was down is reported `turn_finished` with
   * `TURN_FINISH_UNSPECIFIED`. Other errors are thrown (NotFound, ResourceExhausted /
   * WATCHER_LIMIT with its retry delay, ...), and so is a first stream that reaches no
   * server at all (`Unavailable` naming the address: a wrong target is said, not waited on).
   */
  async *watchConversation(
    conversationId: string,
    options: WatchOptions = {},
  ): AsyncGenerator<WatchConversationResponse__Output> {
    const position = new Position(options.afterSequence ?? 0, options.incarnation ?? 0);
    let reached = false; // whether a stream ever delivered an event
    const maxBackoffMs = options.maxBackoffMs ?? 5000;
    while (!options.signal?.aborted) {
      const request = {
        namespace: this.ns(options),
        conversation_id: conversationId,
        after_sequence: position.after,
        incarnation: position.known,
        heartbeat_interval: duration(options.heartbeatSeconds),
      };
      const call = this.stream(TRANSCRIPT.watchConversation, request, {}, (event, message) => ({
        event,
        incarnation: incarnationOf(message),
      }));
      const stop = () => call.cancel();
      options.signal?.addEventListener("abort", stop);
      try {
        for await (const { event, incarnation } of call as AsyncIterable<{
          event: WatchConversationResponse__Output;
          incarnation: string | null;
        }>) {
          reached = true;
          for (const reported of position.see(event, incarnation)) {
            if (reported === event) this.positions.set(event, position.position);
            yield reported;
          }
          if (event.event === "erased") return;
        }
        return;
      } catch (error) {
        if (options.signal?.aborted) return;
        const failure = this.toError(error as grpc.ServiceError);
        const resumable =
          failure.code === grpc.status.UNAVAILABLE ||
          (failure.code === grpc.status.RESOURCE_EXHAUSTED && failure.reason === "WATCHER_TOO_SLOW");
        // A first stream that reaches no server at all is said, not waited on.
        const neverReached = !reached && failure.reason === "UNAVAILABLE";
        if (!(options.resume ?? true) || !resumable || neverReached) throw failure;
      } finally {
        options.signal?.removeEventListener("abort", stop);
        call.cancel();
      }
      position.resumed();
      await new Promise((resolve) => setTimeout(resolve, backoffMs(position.attempt, maxBackoffMs)));
      position.attempt += 1;
    }
  }

  /** Where a watch stood after `event` (one this client's watchConversation yielded). */
  watchPosition(event: WatchConversationResponse__Output): WatchPosition | undefined {
    return this.positions.get(event);
  }

  /** The bounded context of a turn: the recent window, the summary buffer, the backlog. */
  loadView(
    conversationId: string,
    options: CallOptions & {
      window?: number;
      summaryBatch?: number;
      summarizedThrough?: number;
      requestId?: string;
    } = {},
  ): Promise<LoadViewResponse__Output> {
    return this.unary(
      TRANSCRIPT.loadView,
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        window: options.window ?? 16,
        summary_batch: options.summaryBatch ?? 64,
        summarized_through: options.summarizedThrough ?? 0,
        request_id: options.requestId ?? "",
      },
      options,
    );
  }

  /** Erase a transcript (only the transcript: see eraseConversation). */
  deleteConversation(
    conversationId: string,
    options: CallOptions & { incarnation?: number } = {},
  ): Promise<DeleteConversationResponse__Output> {
    return this.unary(
      TRANSCRIPT.deleteConversation,
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        incarnation: options.incarnation ?? 0,
      },
      options,
    );
  }

  /** Record (or merge into) the receipt of an erasure of one incarnation of a conversation:
   * what eraseConversation calls; an application erasing its own way may report here too.
   * Counts only grow and parts only leave `remaining`. (Read receipts with
   * getErasureReceipt, AgentService's, which completes them.) */
  async recordErasureReceipt(
    conversationId: string,
    incarnation: number,
    progress: ErasureProgress,
    options?: CallOptions,
  ): Promise<TranscriptErasureReceipt__Output> {
    const reply = await this.unary(
      TRANSCRIPT.recordErasureReceipt,
      { namespace: this.ns(options), conversation_id: conversationId, incarnation, progress },
      options,
    );
    return reply.receipt!;
  }

  /** Record that a curator curated the conversation's entries through `curatedThrough`
   * (it only moves forward), for the incarnation it read (0: the current one). */
  async markCurated(
    conversationId: string,
    curatedThrough: number,
    options: CallOptions & { incarnation?: number } = {},
  ): Promise<Conversation__Output> {
    const reply: MarkCuratedResponse__Output = await this.unary(
      TRANSCRIPT.markCurated,
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        curated_through: curatedThrough,
        incarnation: options.incarnation ?? 0,
      },
      options,
    );
    return reply.conversation!;
  }

  /** Take a turn lease before model work (`lease`), or learn that the turn committed
   * (`committed`) or ended (`ended`) already. */
  acquireTurnLease(
    conversationId: string,
    turnId: string,
    options: CallOptions & {
      mode?: TurnLeaseMode;
      ttlSeconds?: number;
      payloadHash?: Uint8Array;
      createIfMissing?: boolean;
    } = {},
  ): Promise<AcquireTurnLeaseResponse__Output> {
    return this.unary(
      TRANSCRIPT.acquireTurnLease,
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        turn_id: turnId,
        mode: options.mode ?? "TURN_LEASE_MODE_SHARED",
        ttl: duration(options.ttlSeconds),
        payload_hash: options.payloadHash ? Buffer.from(options.payloadHash) : Buffer.alloc(0),
        create_if_missing: options.createIfMissing ?? false,
      },
      options,
    );
  }

  /** Extend a lease still held (TurnLeaseLost otherwise). */
  async renewTurnLease(
    conversationId: string,
    turnId: string,
    fencingToken: number,
    options: CallOptions & { ttlSeconds?: number } = {},
  ): Promise<TurnLease__Output> {
    const reply = await this.unary(
      TRANSCRIPT.renewTurnLease,
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        turn_id: turnId,
        fencing_token: fencingToken,
        ttl: duration(options.ttlSeconds),
      },
      options,
    );
    return reply.lease!;
  }

  /** End a turn that will not append (keeping its outcome when `ended` is given);
   * false when the lease was no longer held. */
  async releaseTurnLease(
    conversationId: string,
    turnId: string,
    fencingToken: number,
    options: CallOptions & { ended?: EndedTurn } = {},
  ): Promise<boolean> {
    const reply = await this.unary(
      TRANSCRIPT.releaseTurnLease,
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        turn_id: turnId,
        fencing_token: fencingToken,
        ended: options.ended ?? null,
      },
      options,
    );
    return reply.released;
  }

  /** Store a LangGraph checkpoint of the conversation (its thread) with the values of its
   * channels whose version is new; fenced by a turn lease when fencingToken is given. */
  putCheckpoint(
    conversationId: string,
    checkpoint: Checkpoint,
    options: CallOptions & { runId?: string; turnId?: string; fencingToken?: number | string } = {},
  ): Promise<PutCheckpointResponse__Output> {
    return this.unary(
      TRANSCRIPT.putCheckpoint,
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        checkpoint,
        run_id: options.runId ?? "",
        turn_id: options.turnId ?? "",
        ...(options.fencingToken !== undefined ? { fencing_token: options.fencingToken } : {}),
      },
      options,
    );
  }

  /** Store one task's pending writes against a checkpoint; how many were stored. */
  async putCheckpointWrites(
    conversationId: string,
    checkpointNs: string,
    checkpointId: string,
    writes: CheckpointWrite[],
    options: CallOptions & { turnId?: string; fencingToken?: number | string } = {},
  ): Promise<number> {
    const reply = await this.unary(
      TRANSCRIPT.putCheckpointWrites,
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        checkpoint_ns: checkpointNs,
        checkpoint_id: checkpointId,
        writes,
        turn_id: options.turnId ?? "",
        ...(options.fencingToken !== undefined ? { fencing_token: options.fencingToken } : {}),
      },
      options,
    );
    return reply.stored;
  }

  /** A checkpoint with its values and pending writes (the newest of checkpointNs without
   * checkpointId); null when there is none. */
  async getCheckpoint(
    conversationId: string,
    options: CallOptions & { checkpointNs?: string; checkpointId?: string } = {},
  ): Promise<Checkpoint__Output | null> {
    const reply = await this.unary(
      TRANSCRIPT.getCheckpoint,
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        checkpoint_ns: options.checkpointNs ?? "",
        checkpoint_id: options.checkpointId ?? "",
      },
      options,
    );
    return reply.checkpoint ?? null;
  }

  /** The conversation's checkpoints, newest first, page by page. */
  listCheckpoints(
    conversationId: string,
    options: CallOptions & { checkpointNs?: string; filterJson?: string; beforeCheckpointId?: string } = {},
  ): AsyncGenerator<Checkpoint__Output> {
    return this.pages(
      (token) =>
        this.unary(
          TRANSCRIPT.listCheckpoints,
          {
            namespace: this.ns(options),
            conversation_id: conversationId,
            ...(options.checkpointNs !== undefined ? { checkpoint_ns: options.checkpointNs } : {}),
            filter_json: options.filterJson ?? "",
            before_checkpoint_id: options.beforeCheckpointId ?? "",
            page_token: token,
          },
          options,
        ),
      (page) => page.checkpoints,
      (page) => page.next_page_token,
    );
  }

  /** Delete the checkpoints of runs, or of conversations (all, or all but the newest of
   * each checkpoint namespace with keepLatest). Not an erasure. */
  deleteCheckpoints(
    options: CallOptions & { runIds?: string[]; conversationIds?: string[]; keepLatest?: boolean } = {},
  ): Promise<DeleteCheckpointsResponse__Output> {
    return this.unary(
      TRANSCRIPT.deleteCheckpoints,
      {
        namespace: this.ns(options),
        run_ids: options.runIds ?? [],
        conversation_ids: options.conversationIds ?? [],
        keep_latest: options.keepLatest ?? false,
      },
      options,
    );
  }

  /** Copy every checkpoint of a conversation into another (a fork of it). */
  async copyCheckpoints(
    conversationId: string,
    targetConversationId: string,
    options?: CallOptions,
  ): Promise<number> {
    const reply = await this.unary(
      TRANSCRIPT.copyCheckpoints,
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        target_conversation_id: targetConversationId,
      },
      options,
    );
    return Number(reply.checkpoints_copied);
  }
}
