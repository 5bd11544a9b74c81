// SummaryService's calls: the current summary, committing one, summarizing now or in the
// background, the job queue, and erasing a conversation's summaries.

import { type CallOptions, Connection, rpcs } from "./connection.js";
import type { Budget } from "./gen/runifold/common/v1/common_objects.js";
import { SummaryService } from "./gen/runifold/summary/v1/summary_service_pb.js";
import type {
  GetBacklogResponse__Output,
  RequestSummaryResponse__Output,
  SummarizeResponse__Output,
  Summary__Output,
  SummaryService__Methods,
} from "./gen/runifold/summary/v1/summary_service_objects.js";

const SUMMARY = rpcs<SummaryService__Methods>(SummaryService);

/** The methods of SummaryService. */
export class SummaryCalls extends Connection {
  /** The current summary, or null. */
  async getSummary(conversationId: string, options?: CallOptions): Promise<Summary__Output | null> {
    const reply = await this.unary(
      SUMMARY.getSummary,
      { namespace: this.ns(options), conversation_id: conversationId },
      options,
    );
    return reply.summary ?? null;
  }

  /** Commit a summary of 1..throughSequence (monotonic; a compare-and-swap on
   * expectedThroughSequence when given: SummaryConflict). */
  async commitSummary(
    conversationId: string,
    text: string,
    throughSequence: number,
    options: CallOptions & { expectedThroughSequence?: number } = {},
  ): Promise<Summary__Output> {
    const reply = await this.unary(
      SUMMARY.commitSummary,
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        text,
        through_sequence: throughSequence,
        expected_through_sequence: options.expectedThroughSequence,
      },
      options,
    );
    return reply.summary!;
  }

  /** Run the summarizer now (never retried: its passes would spend model calls again). */
  summarize(
    conversationId: string,
    options: CallOptions & {
      window?: number;
      summaryBatch?: number;
      maxSummaryPasses?: number;
      budget?: Budget;
    } = {},
  ): Promise<SummarizeResponse__Output> {
    return this.unary(
      SUMMARY.summarize,
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        window: options.window ?? 16,
        summary_batch: options.summaryBatch ?? 64,
        max_summary_passes: options.maxSummaryPasses ?? 1,
        budget: options.budget ?? {},
      },
      options,
    );
  }

  /** Enqueue background summarization (one pending job per conversation). */
  requestSummary(
    conversationId: string,
    options: CallOptions & { window?: number; summaryBatch?: number } = {},
  ): Promise<RequestSummaryResponse__Output> {
    return this.unary(
      SUMMARY.requestSummary,
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        window: options.window ?? 16,
        summary_batch: options.summaryBatch ?? 64,
      },
      options,
    );
  }

  /** The summary job queue of a namespace. */
  getBacklog(options?: CallOptions): Promise<GetBacklogResponse__Output> {
    return this.unary(
      SUMMARY.getBacklog,
      { namespace: this.ns(options) },
      options,
    );
  }

  /** Erase every summary and summary job of a conversation; the rows erased. */
  async eraseSummaries(
    conversationId: string,
    options: CallOptions & { incarnation?: number } = {},
  ): Promise<number> {
    const reply = await this.unary(
      SUMMARY.eraseSummaries,
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        incarnation: options.incarnation ?? 0,
      },
      options,
    );
    return reply.erased;
  }
}
