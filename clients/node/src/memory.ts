// MemoryService's calls: curated memories (written, read, listed, searched, deleted,
// forgotten with their source), their revisions, proposals to confirm, and the change
// feed of a namespace's memories.

import * as grpc from "@grpc/grpc-js";

import { type CallOptions, Connection, PAGE_SIZE, duration, randomId, rpcs, timestamp } from "./connection.js";
import type { Budget } from "./gen/runifold/common/v1/common_objects.js";
import { MemoryService } from "./gen/runifold/memory/v1/memory_service_pb.js";
import type {
  MemoryErasure__Output,
  MemoryProposal__Output,
  MemoryRevision__Output,
  MemoryService__Methods,
  MemorySource,
  Memory__Output,
  GetCurationBacklogResponse__Output,
  ProposeMemoriesResponse__Output,
  RequestCurationResponse__Output,
  SearchMemoriesResponse__Output,
  UpsertMemoryResponse__Output,
  WatchMemoriesResponse__Output,
} from "./gen/runifold/memory/v1/memory_service_objects.js";
import { backoffMs } from "./watch.js";

const MEMORY = rpcs<MemoryService__Methods>(MemoryService);

const SEARCH_MODES = {
  unspecified: "SEARCH_MODE_UNSPECIFIED",
  dense: "SEARCH_MODE_DENSE",
  lexical: "SEARCH_MODE_LEXICAL",
  hybrid: "SEARCH_MODE_HYBRID",
} as const;

export interface WatchMemoriesOptions extends CallOptions {
  /** Deliver the changes after this change sequence (0: from the first). */
  afterChangeSequence?: number;
  /** How often a quiet stream gets a heartbeat, 1..300 s (default: the server's). */
  heartbeatSeconds?: number;
  /** Watch again after UNAVAILABLE and WATCHER_TOO_SLOW (default true). */
  resume?: boolean;
  /** The longest wait between two attempts (default 5000 ms). */
  maxBackoffMs?: number;
  /** Stop watching (the iteration then ends). */
  signal?: AbortSignal;
}

/** The methods of MemoryService. */
export class MemoryCalls extends Connection {
  /** Create a memory, or replace it by compare-and-swap on expectedRevision
   * (RevisionConflict). Idempotent by requestId (made here when absent). */
  upsertMemory(
    content: string,
    options: CallOptions & {
      sources: MemorySource[];
      memoryId?: string;
      expectedRevision?: number;
      metadata?: Record<string, string>;
      ttlSeconds?: number;
      expireTime?: Date;
      requestId?: string;
      /** When the fact became true (default: the create time of its earliest source entry). */
      validFrom?: Date;
      /** When it stops being true (default: open-ended). */
      validUntil?: Date;
      /** Memories this one replaces: each ends where this one begins, kept in its history. */
      supersedes?: { memoryId: string; expectedRevision?: number }[];
    },
  ): Promise<UpsertMemoryResponse__Output> {
    return this.unary(
      MEMORY.upsertMemory,
      {
        namespace: this.ns(options),
        memory_id: options.memoryId ?? "",
        request_id: options.requestId ?? randomId(),
        content,
        sources: options.sources,
        metadata: options.metadata ?? {},
        expected_revision: options.expectedRevision,
        ttl: duration(options.ttlSeconds),
        expire_time: timestamp(options.expireTime),
        valid_from_time: timestamp(options.validFrom),
        valid_until_time: timestamp(options.validUntil),
        supersedes: (options.supersedes ?? []).map((s) => ({
          memory_id: s.memoryId,
          expected_revision: s.expectedRevision,
        })),
      },
      options,
    );
  }

  /** Curate a fact from one transcript range (both ends inclusive). */
  async remember(
    content: string,
    options: CallOptions & {
      conversationId: string;
      fromSequence: number;
      throughSequence: number;
      metadata?: Record<string, string>;
      requestId?: string;
    },
  ): Promise<Memory__Output> {
    const reply = await this.upsertMemory(content, {
      ...options,
      sources: [
        {
          conversation_id: options.conversationId,
          from_sequence: options.fromSequence,
          through_sequence: options.throughSequence,
        },
      ],
    });
    return reply.memory!;
  }

  /** One memory. */
  async getMemory(memoryId: string, options?: CallOptions): Promise<Memory__Output> {
    const reply = await this.unary(
      MEMORY.getMemory,
      { namespace: this.ns(options), memory_id: memoryId },
      options,
    );
    return reply.memory!;
  }

  /** Every memory of a namespace (only those from one conversation when given). */
  listMemories(
    options: CallOptions & {
      conversationId?: string;
      pageSize?: number;
      /** The memories valid at this time (default: now). */
      asOf?: Date;
      /** Every memory not deleted or expired, whatever its validity. */
      ignoreValidity?: boolean;
    } = {},
  ): AsyncGenerator<Memory__Output> {
    return this.pages(
      (token) =>
        this.unary(
          MEMORY.listMemories,
          {
            namespace: this.ns(options),
            conversation_id: options.conversationId ?? "",
            page_size: options.pageSize ?? PAGE_SIZE,
            page_token: token,
            as_of_time: timestamp(options.asOf),
            ignore_validity: options.ignoreValidity ?? false,
          },
          options,
        ),
      (page) => page.memories,
      (page) => page.next_page_token,
    );
  }

  /** Semantic search inside one namespace (limit 1..256; 0 means the default, 8). */
  searchMemories(
    query: string,
    options: CallOptions & {
      limit?: number;
      metadataFilter?: Record<string, string>;
      minScore?: number;
      /** The facts valid at this time (default: now). */
      asOf?: Date;
      /** How results are ranked: "dense", "lexical" or "hybrid" (default: the server's). */
      mode?: "dense" | "lexical" | "hybrid";
    } = {},
  ): Promise<SearchMemoriesResponse__Output> {
    return this.unary(
      MEMORY.searchMemories,
      {
        namespace: this.ns(options),
        query,
        limit: options.limit ?? 8,
        metadata_filter: options.metadataFilter ?? {},
        min_score: options.minScore ?? 0,
        as_of_time: timestamp(options.asOf),
        mode: SEARCH_MODES[options.mode ?? "unspecified"],
      },
      options,
    );
  }

  /** Delete a memory (compare-and-swap on its revision when given); false when it was
   * already gone. */
  async deleteMemory(
    memoryId: string,
    options: CallOptions & { expectedRevision?: number } = {},
  ): Promise<boolean> {
    const reply = await this.unary(
      MEMORY.deleteMemory,
      {
        namespace: this.ns(options),
        memory_id: memoryId,
        expected_revision: options.expectedRevision,
      },
      options,
    );
    return reply.deleted;
  }

  /** Delete every memory derived from a conversation (or a range of it), or, with
   * `externalUri` (and an empty conversation id), every memory one of whose sources is that
   * URI, exactly; the count. A memory with several sources goes when any one is forgotten.
   * (A source outside a transcript is written as `{ external_uri: "mcp://notes/42" }`.) */
  async forgetSource(
    conversationId: string,
    options: CallOptions & {
      fromSequence?: number;
      throughSequence?: number;
      incarnation?: number;
      externalUri?: string;
    } = {},
  ): Promise<number> {
    const reply = await this.unary(
      MEMORY.forgetSource,
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        from_sequence: options.fromSequence ?? 0,
        through_sequence: options.throughSequence ?? 0,
        incarnation: options.incarnation ?? 0,
        external_uri: options.externalUri ?? "",
      },
      options,
    );
    return reply.deleted_count;
  }

  /** What the erasure of one incarnation of a conversation erased in MemoryService, and
   * whether the vector index has caught up (`index_complete_time`). */
  async getMemoryErasure(
    conversationId: string,
    incarnation: number,
    options?: CallOptions,
  ): Promise<MemoryErasure__Output> {
    const reply = await this.unary(
      MEMORY.getMemoryErasure,
      { namespace: this.ns(options), conversation_id: conversationId, incarnation },
      options,
    );
    return reply.erasure!;
  }

  /** Queue a background curation job of a conversation (an operator's call; turns with
   * curation AUTO ask for it themselves): the waiting or running job, and whether it
   * was made now. */
  requestCuration(
    conversationId: string,
    options?: CallOptions,
  ): Promise<RequestCurationResponse__Output> {
    return this.unary(
      MEMORY.requestCuration,
      { namespace: this.ns(options), conversation_id: conversationId },
      options,
    );
  }

  /** The namespace's curation queue: depth, oldest waiting age, failed and running jobs,
   * and what the hour's budget has used. */
  getCurationBacklog(options?: CallOptions): Promise<GetCurationBacklogResponse__Output> {
    return this.unary(MEMORY.getCurationBacklog, { namespace: this.ns(options) }, options);
  }

  /** Every revision of a memory, oldest first (erased ones keep only number, kind, time). */
  listMemoryRevisions(
    memoryId: string,
    options: CallOptions & { pageSize?: number } = {},
  ): AsyncGenerator<MemoryRevision__Output> {
    return this.pages(
      (token) =>
        this.unary(
          MEMORY.listMemoryRevisions,
          {
            namespace: this.ns(options),
            memory_id: memoryId,
            page_size: options.pageSize ?? PAGE_SIZE,
            page_token: token,
          },
          options,
        ),
      (page) => page.revisions,
      (page) => page.next_page_token,
    );
  }

  /** Proposals of memories from a transcript range (both ends inclusive); nothing is
   * stored until you confirm one (`confirmProposal`). Not retried: it spends model calls. */
  proposeMemories(
    conversationId: string,
    options: CallOptions & {
      fromSequence: number;
      throughSequence: number;
      maxProposals?: number;
      budget?: Budget;
      /** Only stored memories with these metadata pairs are matched. */
      metadataFilter?: Record<string, string>;
    },
  ): Promise<ProposeMemoriesResponse__Output> {
    return this.unary(
      MEMORY.proposeMemories,
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        from_sequence: options.fromSequence,
        through_sequence: options.throughSequence,
        max_proposals: options.maxProposals ?? 0,
        budget: options.budget ?? {},
        metadata_filter: options.metadataFilter ?? {},
      },
      options,
    );
  }

  /** Store a proposal: UpsertMemory with its content, sources and valid time (a SUPERSEDE
   * supersedes its related memory). A DUPLICATE is already stored: it throws. */
  confirmProposal(
    proposal: MemoryProposal__Output,
    options: CallOptions & { requestId?: string } = {},
  ): Promise<UpsertMemoryResponse__Output> {
    if (proposal.action === "PROPOSAL_ACTION_DUPLICATE") {
      throw new Error("a DUPLICATE proposal is already stored: there is nothing to confirm");
    }
    const from = proposal.valid_from_time;
    return this.upsertMemory(proposal.content, {
      ...options,
      sources: proposal.sources,
      validFrom: from ? new Date(Number(from.seconds) * 1000 + Math.floor(from.nanos / 1e6)) : undefined,
      supersedes:
        proposal.action === "PROPOSAL_ACTION_SUPERSEDE"
          ? [{ memoryId: proposal.related_memory_ids[0] }]
          : [],
    });
  }
  /**
   * Follow the memories of a namespace (MemoryService.WatchMemories): every change after
   * `afterChangeSequence` (`change` events: created, updated, superseded, deleted,
   * expired, erased), each once and in the order the changes committed, then the changes
   * as they commit, with `heartbeat`s while it is quiet. No deadline: break out of the
   * loop, or abort `signal`, to leave.
   *
   * A stream that breaks (UNAVAILABLE: a replica restarted or shut down; RESOURCE_EXHAUSTED
   * / WATCHER_TOO_SLOW: this reader fell behind) is watched again from the last change
   * sequence received, with backoff: nothing is missed and nothing repeats. Other errors
   * are thrown (ResourceExhausted / WATCHER_LIMIT with its retry delay, InvalidArgument /
   * SEQUENCE_OUT_OF_RANGE for a sequence the namespace never reached, ...).
   */
  async *watchMemories(options: WatchMemoriesOptions = {}): AsyncGenerator<WatchMemoriesResponse__Output> {
    let after = options.afterChangeSequence ?? 0;
    let attempt = 0;
    const maxBackoffMs = options.maxBackoffMs ?? 5000;
    while (!options.signal?.aborted) {
      const call = this.stream(
        MEMORY.watchMemories,
        {
          namespace: this.ns(options),
          after_change_sequence: after,
          heartbeat_interval: duration(options.heartbeatSeconds),
        },
        {},
      );
      const stop = () => call.cancel();
      options.signal?.addEventListener("abort", stop);
      try {
        for await (const event of call as AsyncIterable<WatchMemoriesResponse__Output>) {
          if (event.event === "change") {
            after = Number(event.change!.change_sequence);
          } else {
            after = Math.max(after, Number(event.heartbeat?.change_sequence ?? 0));
            attempt = 0;
          }
          yield event;
        }
        return;
      } catch (error) {
        if (options.signal?.aborted) return;
        const failure = this.toError(error as grpc.ServiceError);
        const resumable =
          failure.code === grpc.status.UNAVAILABLE ||
          (failure.code === grpc.status.RESOURCE_EXHAUSTED && failure.reason === "WATCHER_TOO_SLOW");
        if (!(options.resume ?? true) || !resumable) throw failure;
      } finally {
        options.signal?.removeEventListener("abort", stop);
        call.cancel();
      }
      await new Promise((resolve) => setTimeout(resolve, backoffMs(attempt, maxBackoffMs)));
      attempt += 1;
    }
  }
}
