// What a watch that resumes remembers: where to resume from, and what it reported.
//
// WatchConversation's stream breaks (a replica restarts, a reader falls behind); the
// client watches again from the last sequence received and its incarnation. The new
// stream reports again what the old one had (running turns, retractions up to the
// version seen): `Position` drops those repeats and, once the new stream has caught up,
// reports the turns that finished while it was down.

import type { WatchConversationResponse__Output } from "./gen/runifold/transcript/v1/transcript_service_objects.js";

/** Where a watch stands: what to send back to resume it elsewhere. */
export interface WatchPosition {
  afterSequence: number;
  /** Exact (64 bits) as a decimal string. */
  incarnation: string;
}

/** Where a watch stands, and what it reported (no I/O). */
export class Position {
  after: number;
  /** The incarnation followed, exact: int64 arrives as a JS number (53 bits) in the
   * objects, so it is read from the message itself. */
  known: string;
  // The newest version an event showed: every retraction up to it was reported (the
  // server sends them before later entries), so a resumed stream's repeat is dropped.
  private version = 0;
  private readonly running = new Set<string>();
  private announced: Set<string> | null = null;
  attempt = 0;

  constructor(afterSequence: number, incarnation: string | number) {
    this.after = afterSequence;
    this.known = String(incarnation);
  }

  /** A new stream starts: it reports the running turns again. */
  resumed(): void {
    this.announced = new Set();
  }

  /** The events to report for one the stream sent (its exact incarnation, when it has
   * one): none for a repeat; before a heartbeat that ends a resume, a `turn_finished`
   * for each turn that finished while the stream was down. */
  *see(event: WatchConversationResponse__Output, incarnation: string | null): Generator<WatchConversationResponse__Output> {
    if (incarnation !== null && incarnation !== "0") this.known = incarnation;
    if (event.event === "appended") {
      const entries = event.appended?.entries ?? [];
      if (entries.length) this.after = Number(entries[entries.length - 1].sequence);
      this.version = Math.max(this.version, Number(event.appended?.version ?? 0));
    } else if (event.event === "retracted") {
      const at = Number(event.retracted?.version ?? 0);
      if (at <= this.version) return; // reported before the resume
      this.version = at;
    } else if (event.event === "turn_started") {
      const turnId = event.turn_started!.turn_id;
      this.announced?.add(turnId);
      if (this.running.has(turnId)) return; // reported by the stream before the resume
      this.running.add(turnId);
    } else if (event.event === "turn_finished") {
      this.running.delete(event.turn_finished!.turn_id);
    } else if (event.event === "heartbeat") {
      this.version = Math.max(this.version, Number(event.heartbeat?.version ?? 0));
      this.attempt = 0;
      if (this.announced !== null) {
        const announced = this.announced;
        for (const turnId of [...this.running].filter((t) => !announced.has(t)).sort()) {
          this.running.delete(turnId);
          yield {
            event: "turn_finished",
            turn_finished: { turn_id: turnId, finish: "TURN_FINISH_UNSPECIFIED", version: 0, reason: "" },
          } as WatchConversationResponse__Output;
        }
        this.announced = null;
      }
    }
    yield event;
  }

  /** Where the watch stands now. */
  get position(): WatchPosition {
    return { afterSequence: this.after, incarnation: this.known };
  }
}

/** The wait before watching again: 100 ms doubling up to `maxBackoffMs`, jittered. */
export function backoffMs(attempt: number, maxBackoffMs: number): number {
  return Math.min(maxBackoffMs, 100 * 2 ** Math.min(attempt, 16)) * (0.5 + Math.random() / 2);
}
