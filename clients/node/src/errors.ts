// Typed errors: what the server said (the gRPC status, google.rpc.ErrorInfo's stable
// reason and metadata, and the other status details) as one exception class per case.
// Branch with `instanceof` (or on `reason`), never on the message.

import * as grpc from "@grpc/grpc-js";

import type { TurnOutcome__Output } from "./gen/runifold/agent/v1/agent_service_objects.js";

/** A status detail the client decoded: its type name and its fields. */
export interface Detail {
  typeName: string;
  value: Record<string, any>;
}

/** The turn outcome an error carries (the `TurnConflict` / `ModelOutputInvalid` detail). */
export type Outcome = TurnOutcome__Output;

const EMPTY_OUTCOME: Outcome = { output: [], usage: null };

/** A failed call: the gRPC status, the stable ErrorInfo reason and what the server attached. */
export class RunifoldError extends Error {
  constructor(
    readonly code: grpc.status,
    readonly reason: string,
    message: string,
    readonly metadata: Record<string, string>,
    readonly details: Detail[] = [],
  ) {
    // A reason that only repeats the code (no ErrorInfo) is said once.
    super(`${grpc.status[code] === reason ? reason : `${grpc.status[code]} ${reason}`}: ${message}`);
    this.name = new.target.name;
    this.serverMessage = message;
  }

  /** The server's message (for people; it never contains message or memory text). */
  readonly serverMessage: string;

  /** The first detail of a type, e.g. "google.rpc.RetryInfo". */
  detail(typeName: string): Record<string, any> | undefined {
    return this.details.find((d) => d.typeName === typeName)?.value;
  }

  /** The TurnConflict detail, when the error carries one (TURN_CONFLICT and kin). */
  get turnConflict():
    | { outcome: Outcome; current_version: number; expected_version: number }
    | undefined {
    return this.detail("runifold.agent.v1.TurnConflict") as any;
  }
}

/** The request can never succeed as sent; `field` names the field at fault. */
export class InvalidArgument extends RunifoldError {
  get field(): string {
    const violations = this.detail("google.rpc.BadRequest")?.field_violations ?? [];
    return violations[0]?.field ?? "";
  }
}
/** No such resource in this namespace. */
export class NotFound extends RunifoldError {}
/** The resource exists. */
export class AlreadyExists extends RunifoldError {}
/** The caller's identity does not grant the namespace. */
export class PermissionDenied extends RunifoldError {}
/** Missing or invalid credentials. */
export class Unauthenticated extends RunifoldError {}
/** A store or service is unavailable (gRPC already retried); retry later. One that never
 * reached a Runifold server (reason UNAVAILABLE: no ErrorInfo) names the address the
 * client called: in its message, once, and as `target`. */
export class Unavailable extends RunifoldError {
  target = "";
}
/** The call's deadline passed. */
export class DeadlineExceeded extends RunifoldError {}
/** The system is not in the state the call needs. */
export class FailedPrecondition extends RunifoldError {}
/** A compare-and-swap lost. */
export class Aborted extends RunifoldError {}

/** A limit was reached; `retryDelayMs` (google.rpc.RetryInfo) says when to retry, if known. */
export class ResourceExhausted extends RunifoldError {
  get retryDelayMs(): number | undefined {
    const delay = this.detail("google.rpc.RetryInfo")?.retry_delay;
    if (!delay) return undefined;
    return Number(delay.seconds ?? 0) * 1000 + Number(delay.nanos ?? 0) / 1e6;
  }
}

/** An append's expected version was not current; `currentVersion` says what is. */
export class VersionConflict extends Aborted {
  get currentVersion(): number {
    return Number(this.metadata.current_version ?? 0);
  }
}

/** A memory write or delete at a stale `expected_revision`. */
export class RevisionConflict extends Aborted {
  get currentRevision(): number {
    return Number(this.metadata.current_revision ?? 0);
  }
}

/** A summary commit at a stale `expected_through_sequence`. */
export class SummaryConflict extends Aborted {
  get currentThroughSequence(): number {
    return Number(this.metadata.current_through_sequence ?? 0);
  }
}

/** Another writer committed first. `outcome` is the completed, uncommitted answer; the
 * model is never re-run for you. */
export class TurnConflict extends Aborted {
  get outcome(): Outcome {
    return this.turnConflict?.outcome ?? EMPTY_OUTCOME;
  }
  get currentVersion(): number {
    return this.turnConflict?.current_version ?? Number(this.metadata.current_version ?? 0);
  }
  get expectedVersion(): number {
    return this.turnConflict?.expected_version ?? 0;
  }
}

/** The turn stalled past its lease and another attempt took over; retrying the same turn
 * id returns what that attempt produced. */
export class TurnLeaseLost extends TurnConflict {}

/** Another turn runs (or waits) on the conversation. A REJECT turn ran nothing (`outcome`
 * is empty); a RACE turn that met an exclusive turn at its commit carries its outcome. */
export class ConversationBusy extends Aborted {
  get runningTurnId(): string {
    return this.metadata.running_turn_id ?? "";
  }
  get outcome(): Outcome {
    return this.turnConflict?.outcome ?? EMPTY_OUTCOME;
  }
}

/** The conversation needs a summary first; a background job was enqueued. */
export class SummaryRequired extends FailedPrecondition {
  /** Unsummarized entries outside the window. */
  get backlog(): number {
    return Number(this.metadata.backlog ?? 0);
  }
  get jobId(): string {
    return this.metadata.job_id ?? "";
  }
}

/** Backlog remained after the turn's own summarizer passes (SUMMARY_MODE_AUTO). */
export class SummaryBacklog extends SummaryRequired {}

/** The model's reply broke the transcript's limits and was not appended. */
export class ModelOutputInvalid extends FailedPrecondition {
  get outcome(): Outcome {
    return (this.detail("runifold.agent.v1.ModelOutputInvalid")?.outcome as Outcome) ?? EMPTY_OUTCOME;
  }
  get violations(): string[] {
    return this.detail("runifold.agent.v1.ModelOutputInvalid")?.violations ?? [];
  }
}

/** The request's budget does not cover the next model call. */
export class BudgetExhausted extends ResourceExhausted {}

/** Too many turns wait on the conversation (ENQUEUE); retry after `retryDelayMs`. */
export class TurnQueueFull extends ResourceExhausted {}

type ErrorClass = new (
  code: grpc.status,
  reason: string,
  message: string,
  metadata: Record<string, string>,
  details: Detail[],
) => RunifoldError;

export const BY_REASON: Record<string, ErrorClass> = {
  VERSION_CONFLICT: VersionConflict,
  REVISION_CONFLICT: RevisionConflict,
  SUMMARY_CONFLICT: SummaryConflict,
  TURN_CONFLICT: TurnConflict,
  TURN_LEASE_LOST: TurnLeaseLost,
  CONVERSATION_BUSY: ConversationBusy,
  SUMMARY_REQUIRED: SummaryRequired,
  SUMMARY_BACKLOG: SummaryBacklog,
  MODEL_OUTPUT_INVALID: ModelOutputInvalid,
  BUDGET_EXHAUSTED: BudgetExhausted,
  TURN_QUEUE_FULL: TurnQueueFull,
};

export const BY_CODE: Partial<Record<grpc.status, ErrorClass>> = {
  [grpc.status.INVALID_ARGUMENT]: InvalidArgument,
  [grpc.status.NOT_FOUND]: NotFound,
  [grpc.status.ALREADY_EXISTS]: AlreadyExists,
  [grpc.status.PERMISSION_DENIED]: PermissionDenied,
  [grpc.status.UNAUTHENTICATED]: Unauthenticated,
  [grpc.status.UNAVAILABLE]: Unavailable,
  [grpc.status.DEADLINE_EXCEEDED]: DeadlineExceeded,
  [grpc.status.RESOURCE_EXHAUSTED]: ResourceExhausted,
  [grpc.status.FAILED_PRECONDITION]: FailedPrecondition,
  [grpc.status.ABORTED]: Aborted,
};
