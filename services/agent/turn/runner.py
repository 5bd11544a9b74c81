"""One agent turn, atomically, under a turn lease.

take the turn lease (or the outcome of a turn id that already ran) -> load
summary and view -> (summarize | refuse) -> recall memories -> call the model
-> check the reply against the transcript's rules -> ONE compare-and-swap
append of the input and the reply at the version the view was read at, with
request_id = turn_id, quoting the lease's fencing token (the commit ends the
lease).

The lease is what makes one turn id run the model once: a repeat that arrives
while the turn runs waits for it and gets its outcome; a turn whose model work
completed but could not commit (TURN_CONFLICT, MODEL_OUTPUT_INVALID) records
that outcome when it releases the lease, so a repeat returns it again. With
REJECT and ENQUEUE the lease is exclusive: one running turn per conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import uuid_utils

from services.agent import metrics
from services.agent.config import AgentConfig
from services.agent.model import (
    ConcurrencyMode,
    ContextReport,
    CurationMode,
    EndedState,
    LeaseState,
    ModelOutputInvalid,
    Outcome,
    PriorAppend,
    Progress,
    Recall,
    Stage,
    SummaryMode,
    SummaryState,
    TextDelta,
    Turn,
    TurnConflict,
    TurnEvent,
    TurnNotCommitted,
    TurnResult,
    ViewState,
)
from services.agent.ports import Memories, Summaries, Transcripts
from services.agent.turn.ahead import job_window_ahead
from services.agent.turn.budget import TurnBudget
from services.agent.turn.commit import calling_model, commit, release
from services.agent.turn.curation import CurationRequests
from services.agent.turn.lease import LeaseKeeper, ended_error, ended_state, lease_lost
from services.agent.turn.prompt import build_request, estimate_request_tokens, memory_query
from services.agent.turn.replay import replay
from services.agent.turn.reply import assistant_message, check_reply
from services.common import admission
from services.common.deadlines import remaining, time_left
from services.common.domain import (
    canonical_json,
    check_tool_pairing,
    open_tool_calls,
    payload_hash,
)
from services.common.errors import (
    DomainError,
    VersionConflict,
    failed_precondition,
)
from services.llm.model import (
    ChatDelta,
    ChatModel,
    ChatRequest,
    ChatResponse,
    ModelFailed,
    ModelUnavailable,
)

log = logging.getLogger(__name__)

# A lease not granted within this delay means the turn waits (ENQUEUE, or a
# running turn with the same id): the stream reports TURN_STAGE_WAITING.
_WAITING_AFTER_S = 0.1


@dataclass(frozen=True, repr=False)  # its config holds the model API key
class TurnRunner:
    """Runs turns against the transcript, summary and memory services and a ChatModel."""

    transcripts: Transcripts
    summaries: Summaries
    memories: Memories
    model: ChatModel
    config: AgentConfig
    # Where a committed AUTO turn asks for curation (None: never asked).
    curation: CurationRequests | None = None

    async def events(self, turn: Turn, stream: bool) -> AsyncIterator[TurnEvent]:
        """The turn as events (the request is already checked)."""
        namespace, policy = turn.namespace, turn.policy
        turn_id = turn.turn_id or str(uuid_utils.uuid7())
        conversation_id = turn.conversation_id or str(uuid.UUID(str(uuid_utils.uuid7())))

        yield Progress(Stage.LOADING_CONTEXT)
        # Memory lookup depends only on the input: it runs while the lease is taken and
        # the summary and the view load (its query embedding is the slowest part).
        recalling = (
            asyncio.ensure_future(
                self.memories.search(namespace, memory_query(turn.input), policy.memory_limit)
            )
            if policy.memory_limit > 0
            else None
        )
        # A RACE turn's context does not depend on the lease (its compare-and-swap decides
        # at commit), so it loads while the lease is taken. An exclusive turn reads its
        # context only once it holds the lease: it must see what the turns before it
        # committed.
        preloading = (
            asyncio.ensure_future(self._context(turn, conversation_id, turn_id))
            if turn.concurrency == ConcurrencyMode.RACE
            else None
        )
        try:
            acquiring = asyncio.ensure_future(
                self.transcripts.acquire_lease(
                    namespace,
                    conversation_id,
                    turn_id,
                    int(turn.concurrency),  # TurnLeaseMode has the same values
                    self.config.turn_lease_ttl_s,
                    payload_hash(canonical_json(turn.input)),
                    turn.create_if_missing,
                )
            )
            try:
                done, _ = await asyncio.wait({acquiring}, timeout=_WAITING_AFTER_S)
                if not done:
                    # A turn waiting for its lease holds a waiting place instead of its
                    # turn slot: a queue of waiting turns must not starve the namespace's
                    # other conversations (services/common/admission.py). It takes a
                    # slot again before its model work (_under_lease).
                    slot = admission.current()
                    if slot is not None:
                        slot.park()
                    yield Progress(Stage.WAITING)
                    await asyncio.wait({acquiring})
                acquired = await acquiring
            finally:
                if not acquiring.done():
                    acquiring.cancel()
                    with contextlib.suppress(asyncio.CancelledError, DomainError):
                        await acquiring
                elif not acquiring.cancelled():
                    acquiring.exception()  # seen: the turn ended for another reason
            if isinstance(acquired, PriorAppend):
                yield await replay(self.transcripts, turn, conversation_id, acquired)
                return
            if isinstance(acquired, EndedState):
                raise ended_error(acquired)
            async for event in self._under_lease(
                turn, conversation_id, turn_id, acquired, recalling, preloading, stream
            ):
                yield event
        finally:
            for pending in (recalling, preloading):
                if pending is not None and not pending.done():
                    pending.cancel()
                if pending is not None:
                    with contextlib.suppress(asyncio.CancelledError, DomainError):
                        await pending

    async def _under_lease(
        self,
        turn: Turn,
        conversation_id: str,
        turn_id: str,
        lease: LeaseState,
        recalling: asyncio.Future[Recall] | None,
        preloading: asyncio.Future[tuple[SummaryState, ViewState]] | None,
        stream: bool,
    ) -> AsyncIterator[TurnEvent]:
        keeper = LeaseKeeper(self.transcripts, turn, conversation_id, turn_id, lease.fencing_token)
        keeper.start(self.config.turn_lease_ttl_s)
        committed = False
        ended: EndedState | None = None
        try:
            slot = admission.current()
            if slot is not None and slot.parked:
                # The lease came after a wait: the turn's model work waits for one of
                # its namespace's turn slots, so that the limit holds however many
                # waits end together (the lease is renewed meanwhile).
                await slot.resume(time_left())
            async for event in self._turn(
                turn, conversation_id, turn_id, lease, keeper, recalling, preloading, stream
            ):
                committed = committed or isinstance(event, TurnResult)
                yield event
        except (TurnNotCommitted, ModelOutputInvalid) as error:
            # The model ran: keep its outcome so that a repeat returns it (a lost
            # lease belongs to whoever took it over).
            if error.reason != "TURN_LEASE_LOST":
                ended = ended_state(error, error.outcome)
            raise
        except DomainError as error:
            # Any other failure after the model answered (the commit's retries spent on an
            # outage, the deadline): the outcome is kept too, so a repeat returns it
            # instead of calling the model again.
            if keeper.outcome is not None:
                ended = EndedState(
                    keeper.outcome.output,
                    keeper.outcome.usage,
                    "TURN_NOT_COMMITTED",
                    {"cause": error.reason},
                )
            raise
        finally:
            try:
                await keeper.stop()
            finally:  # also when the caller's cancellation lands while the renewer stops
                if not committed:
                    try:
                        await asyncio.shield(
                            release(
                                self.transcripts,
                                turn,
                                conversation_id,
                                turn_id,
                                lease.fencing_token,
                                ended,
                                keeper.model_call_failed,
                            )
                        )
                    except DomainError as error:
                        # The lease lapses by itself; only a kept outcome is lost.
                        log.warning("turn lease not released", extra={"reason": error.reason})

    async def _turn(
        self,
        turn: Turn,
        conversation_id: str,
        turn_id: str,
        lease: LeaseState,
        keeper: LeaseKeeper,
        recalling: asyncio.Future[Recall] | None,
        preloading: asyncio.Future[tuple[SummaryState, ViewState]] | None,
        stream: bool,
    ) -> AsyncIterator[TurnEvent]:
        namespace, policy = turn.namespace, turn.policy
        summary, view = await self._loaded(turn, conversation_id, turn_id, lease, preloading)
        if view.prior_append is not None:  # committed by a plain append with this id
            yield await replay(self.transcripts, turn, conversation_id, view.prior_append)
            return

        spend = TurnBudget(turn.budget)
        passes = 0
        if view.summary_buffer:
            if policy.summary_mode == SummaryMode.REQUIRE:
                raise await self._summary_refused(
                    turn,
                    conversation_id,
                    view,
                    "SUMMARY_REQUIRED",
                    "the conversation has unsummarized entries outside the window; a summary "
                    "job was enqueued (or run the turn with SUMMARY_MODE_AUTO)",
                )
            yield Progress(Stage.SUMMARIZING)
            done = await self.summaries.summarize(
                namespace,
                conversation_id,
                policy.window,
                policy.summary_batch,
                policy.max_summary_passes,
                spend.for_summary(),
            )
            spend.used += done.usage
            passes = done.passes
            summary = done.summary
            view = await self.transcripts.load_view(
                namespace,
                conversation_id,
                policy.window,
                policy.summary_batch,
                summary.through_sequence,
                turn_id,
            )
            if view.summary_buffer:
                raise await self._summary_refused(
                    turn,
                    conversation_id,
                    view,
                    "SUMMARY_BACKLOG",
                    f"unsummarized entries remain after {passes} summary pass(es); a summary "
                    "job was enqueued",
                    passes=passes,
                )

        check_tool_pairing(
            turn.input, open_tool_calls([entry.message for entry in view.window]), "input"
        )

        recall = Recall()
        if recalling is not None:
            yield Progress(Stage.RETRIEVING_MEMORY)
            recall = await recalling

        left = spend.remaining()
        request = build_request(
            turn.system_instructions,
            summary,
            recall.memories,
            view.window,
            turn.input,
            turn.tools,
            max(1, left.max_output_tokens),
        )
        spend.require_call(estimate_request_tokens(request))
        if keeper.lost:  # never start model work the turn can no longer commit
            raise lease_lost()
        await calling_model(
            self.transcripts,
            turn,
            conversation_id,
            turn_id,
            lease.fencing_token,
            self.config.turn_lease_ttl_s,
        )

        yield Progress(Stage.CALLING_MODEL)
        response: ChatResponse | None = None
        try:
            async for piece in self._call_model(request, stream):
                if isinstance(piece, ChatDelta):
                    yield TextDelta(piece.text)
                else:
                    response = piece
            if response is None:
                raise ModelFailed("the model stream ended without an answer")
            reply = assistant_message(response)
        except (ModelFailed, ModelUnavailable):
            keeper.model_call_failed = True  # nothing came of it: the turn may run again
            raise
        spend.used += response.usage
        outcome = keeper.outcome = Outcome([reply], spend.used)
        check_reply(turn, reply, outcome, self.config.messages)

        yield Progress(Stage.COMMITTING)
        try:
            appended = await commit(
                self.transcripts,
                turn,
                conversation_id,
                view.version,
                [*turn.input, reply],
                turn_id,
                spend.used,
                lease.fencing_token,
            )
        except VersionConflict as conflict:
            raise TurnConflict(outcome, conflict.current_version, view.version) from None
        except DomainError as error:
            if error.reason in ("TURN_LEASE_LOST", "CONVERSATION_BUSY"):
                raise TurnNotCommitted(
                    error.reason,
                    error.message + "; the completed outcome is attached and was not committed",
                    outcome,
                    view.version,
                    view.version,
                    **error.metadata,
                ) from None
            if error.reason != "REQUEST_ID_REUSED":
                raise
            # A duplicate of this turn committed while we ran: return its outcome.
            latest = await self.transcripts.load_view(namespace, conversation_id, 1, 1, 0, turn_id)
            if latest.prior_append is None:
                raise
            yield await replay(self.transcripts, turn, conversation_id, latest.prior_append)
            return
        metrics.TURNS.labels("replayed" if appended.replayed else "committed").inc()
        if not appended.replayed:
            await self._keep_summary_ahead(
                turn, conversation_id, summary.through_sequence, appended.last_sequence
            )
        if turn.policy.curation is CurationMode.AUTO and self.curation is not None:
            # In the background: the answer does not wait (see turn/curation.py).
            self.curation.request(namespace, conversation_id)
        yield TurnResult(
            conversation_id=conversation_id,
            conversation_version=appended.version,
            first_sequence=appended.first_sequence,
            last_sequence=appended.last_sequence,
            outcome=outcome,
            tool_calls=reply.tool_calls,
            context=ContextReport(
                summary_through_sequence=summary.through_sequence,
                memory_ids=[m.memory_id for m in recall.memories],
                window_first_sequence=view.window[0].sequence if view.window else 0,
                window_last_sequence=view.window[-1].sequence if view.window else 0,
                summary_passes=passes,
                memory_degraded=recall.degraded,
            ),
            replayed=appended.replayed,
            created=lease.created,
        )

    async def _context(
        self, turn: Turn, conversation_id: str, turn_id: str
    ) -> tuple[SummaryState, ViewState]:
        """The summary, and the view after it."""
        policy = turn.policy
        summary = await self.summaries.get(turn.namespace, conversation_id)
        view = await self.transcripts.load_view(
            turn.namespace,
            conversation_id,
            policy.window,
            policy.summary_batch,
            summary.through_sequence,
            turn_id,
        )
        return summary, view

    async def _loaded(
        self,
        turn: Turn,
        conversation_id: str,
        turn_id: str,
        lease: LeaseState,
        preloading: asyncio.Future[tuple[SummaryState, ViewState]] | None,
    ) -> tuple[SummaryState, ViewState]:
        """The context loaded beside the lease (RACE), else (or when the lease just
        created the conversation) loaded now."""
        if preloading is not None and not lease.created:
            return await preloading
        return await self._context(turn, conversation_id, turn_id)

    async def _summary_refused(
        self,
        turn: Turn,
        conversation_id: str,
        view: ViewState,
        reason: str,
        message: str,
        **metadata: object,
    ) -> DomainError:
        """Enqueue a background summary job, and the FAILED_PRECONDITION that says so."""
        job_id = await self.summaries.request(
            turn.namespace, conversation_id, turn.policy.window, turn.policy.summary_batch
        )
        return failed_precondition(reason, message, backlog=view.pending, job_id=job_id, **metadata)

    async def _keep_summary_ahead(
        self, turn: Turn, conversation_id: str, summarized_through: int, last_sequence: int
    ) -> None:
        """Once the turn committed, ask the background queue for the job that keeps the
        summary ahead of the window (services/agent/turn/ahead.py), when one is due.

        Awaited before the turn answers, so that a caller who waits for the queue to be
        idle knows the job is in it; it never fails the turn (the turn is committed: the
        next turn asks again, and a view that finds the summary behind still refuses or
        summarizes as its policy says)."""
        policy = turn.policy
        job_window = job_window_ahead(
            policy.window, self.config.summary_lead, summarized_through, last_sequence
        )
        if job_window is None:
            return
        try:
            await self.summaries.request(
                turn.namespace, conversation_id, job_window, policy.summary_batch
            )
        except DomainError as error:
            metrics.SUMMARY_AHEAD.labels("failed").inc()
            log.warning("summary job ahead not enqueued", extra={"reason": error.reason})
            return
        metrics.SUMMARY_AHEAD.labels("requested").inc()

    async def _call_model(
        self, request: ChatRequest, stream: bool
    ) -> AsyncIterator[ChatDelta | ChatResponse]:
        timeout = remaining(self.config.chat_model.timeout_s)
        if stream:
            async for piece in self.model.stream(request, timeout=timeout):
                yield piece
        else:
            yield await self.model.complete(request, timeout=timeout)
