"""SummaryService domain logic: monotonic summaries, the summarization workflow, the queue.

Takes a `SummaryStore`, a `Transcripts` port (TranscriptService's API) and a
`Summarizer`; knows nothing of gRPC or SQL. The store makes each commit
atomic and monotonic; this layer validates input, reads transcripts only
through the port, charges every summarizer call to the caller's budget and
deadline, and refuses summarizer output that may not be committed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence

import uuid_utils

from services.common import validation
from services.common.deadlines import remaining
from services.common.domain import Budget, Entry, Role, Usage
from services.common.errors import Code, DomainError, invalid_argument
from services.common.validation import conversation_id
from services.llm.model import require_call, with_defaults
from services.summary import metrics
from services.summary.config import SummaryConfig
from services.summary.jobs.model import Job, JobQueue, NewJob
from services.summary.model import (
    CommitResult,
    ConversationState,
    NewSummary,
    SummarizeResult,
    Summary,
    SummaryErasure,
    conversation_erased,
)
from services.summary.ports import Transcripts
from services.summary.store import SummaryStore
from services.summary.summarizers.prompt import Summarizer, SummaryPrompt


def is_not_found(error: DomainError) -> bool:
    """True when TranscriptService says the conversation does not exist (here)."""
    return error.code is Code.NOT_FOUND


def summary_invalid(problem: str, **metadata: object) -> DomainError:
    """The summarizer produced something that may not be committed (nothing was)."""
    return DomainError(
        Code.FAILED_PRECONDITION,
        "SUMMARY_INVALID",
        f"the summarizer's output was refused ({problem}); nothing was committed",
        metadata={"problem": problem, **metadata},
    )


class SummaryService:
    """Summaries of transcript prefixes and their background queue."""

    def __init__(
        self,
        store: SummaryStore,
        transcripts: Transcripts,
        summarizer: Summarizer,
        config: SummaryConfig,
    ) -> None:
        self.store = store
        self.transcripts = transcripts
        self.summarizer = summarizer
        self.config = config
        # Called after a job is enqueued, so local workers need not wait for their poll.
        self.on_enqueue: Callable[[], None] | None = None

    # -- summaries ------------------------------------------------------------------

    async def _current(
        self, namespace: str, cid: uuid.UUID
    ) -> tuple[Summary | None, ConversationState]:
        """The summary of the conversation as it exists now, and the conversation. A stored
        summary of an erased incarnation of the id describes nothing that exists: it is not
        this conversation's (and an erasure removes it)."""
        summary, state = await asyncio.gather(
            self.store.get_summary(namespace, cid), self.transcripts.conversation(namespace, cid)
        )
        if summary is not None and summary.describes(state):
            return summary, state
        return await self._inherited(namespace, state), state

    async def _inherited(self, namespace: str, state: ConversationState) -> Summary | None:
        """For a fork without a summary of its own: its source's summary, when it lies
        within the prefix the fork shares (it summarizes the fork's entries too), and
        theirs for a fork of a fork. It keeps its source's conversation_id."""
        source, through = state.fork_source, state.fork_through
        while source is not None:
            summary, source_state = await asyncio.gather(
                self.store.get_summary(namespace, source),
                self.transcripts.conversation(namespace, source),
            )
            if (
                summary is not None
                and summary.describes(source_state)
                and summary.through_sequence <= through
            ):
                return summary
            # None of the source's serves (none, or one beyond the fork point): its own
            # source's may (within both prefixes, which share those entries).
            source = source_state.fork_source
            through = min(through, source_state.fork_through)
        return None

    async def get_summary(self, namespace: str, conversation_id_text: str) -> Summary | None:
        """The current summary; None when none was committed. NOT_FOUND when the
        conversation does not exist in the namespace."""
        validation.namespace(namespace)
        summary, _ = await self._current(namespace, conversation_id(conversation_id_text))
        return summary

    def _validate_text(self, text: str) -> None:
        limit = self.config.max_summary_bytes
        if len(text.encode("utf-8", "surrogatepass")) > limit:
            raise invalid_argument(
                "SUMMARY_TOO_LARGE", f"text exceeds {limit} bytes", field="text", limit_bytes=limit
            )
        # The size has its own reason (above); the rest are the common text rules.
        validation.text(text, "text", max_bytes=None, reason="INVALID_SUMMARY_TEXT", required=True)

    async def commit_summary(
        self,
        namespace: str,
        conversation_id_text: str,
        text: str,
        through_sequence: int,
        expected_through_sequence: int | None,
    ) -> CommitResult:
        """Commit a summary of entries 1..through_sequence.

        Monotonic: through_sequence must exist in the transcript, must not end
        between a tool call and its results, and must be newer than the current
        summary (else FAILED_PRECONDITION / SUMMARY_NOT_NEWER). With
        expected_through_sequence it is a compare-and-swap (ABORTED /
        SUMMARY_CONFLICT). Committing the current summary again (same range,
        same text) is a no-op that returns it.
        """
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        self._validate_text(text)
        if through_sequence < 1:
            raise invalid_argument(
                "INVALID_SEQUENCE", "through_sequence must be at least 1", field="through_sequence"
            )
        if expected_through_sequence is not None and expected_through_sequence < 0:
            raise invalid_argument(
                "INVALID_SEQUENCE",
                "expected_through_sequence must not be negative",
                field="expected_through_sequence",
            )
        state, after = await asyncio.gather(
            self.transcripts.conversation(namespace, cid),
            self.transcripts.entry_after(namespace, cid, through_sequence),
        )
        last = state.last_sequence
        if through_sequence > last:
            raise invalid_argument(
                "SEQUENCE_OUT_OF_RANGE",
                "through_sequence is beyond the transcript",
                field="through_sequence",
                last_sequence=last,
            )
        if after is not None and after.message.role == Role.TOOL:
            raise invalid_argument(
                "SPLITS_TOOL_CALL",
                "through_sequence ends between a tool call and its results",
                field="through_sequence",
            )
        inherited = await self._inherited(namespace, state) if state.fork_source else None
        return await self.store.commit_summary(
            NewSummary(
                namespace,
                cid,
                text,
                through_sequence,
                expected_through_sequence,
                state.incarnation,
                inherited.through_sequence if inherited is not None else 0,
            )
        )

    # -- the summarization workflow -----------------------------------------------

    def _prepare(
        self, limits: Budget, usage: Usage, previous: str | None, buffer: Sequence[Entry]
    ) -> SummaryPrompt:
        """The next pass's prompt, when the budget covers the call; BUDGET_EXHAUSTED otherwise."""
        left = require_call(limits, usage)
        prompt = self.summarizer.prepare(
            previous,
            buffer,
            max_output_tokens=min(self.config.max_output_tokens_per_pass, left.max_output_tokens),
        )
        require_call(limits, usage, prompt.input_tokens)
        return prompt

    def _checked_output(self, text: str) -> str:
        """The summarizer's text if it may be committed; SUMMARY_INVALID otherwise."""
        if not text.strip():
            raise summary_invalid("empty")
        if "\x00" in text:
            raise summary_invalid("nul_character")
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > self.config.max_summary_bytes:
            raise summary_invalid(
                "too_large", size_bytes=size, limit_bytes=self.config.max_summary_bytes
            )
        return text

    async def summarize(
        self,
        namespace: str,
        conversation_id_text: str,
        window: int,
        summary_batch: int,
        max_summary_passes: int,
        budget: Budget,
        incarnation: int | None = None,
    ) -> SummarizeResult:
        """Summarize the buffer in passes, up to `max_summary_passes` (0 means 1).

        Each pass reads the view after the current summary (TranscriptService's
        LoadView keeps a tool call and its results on one side of the buffer's
        end), gives the summarizer the previous summary plus the buffer, and
        commits the result with a compare-and-swap on the summary it started
        from. Every summarizer call is charged to `budget` (zero fields take the
        server defaults) and must finish before the request's deadline.
        When another writer moves the summary meanwhile, the pass's result is dropped (the
        summary never regresses) and work continues from the newer summary; that attempt
        counts against `max_summary_passes` unless the newer summary falls short of what it
        would have covered (a turn whose pass lost to a job ahead of a wider window still
        summarizes what the job left; the budget still bounds model calls), and only
        committed passes are reported. Raises RESOURCE_EXHAUSTED / BUDGET_EXHAUSTED when the
        budget does not cover the next pass; passes committed before stay committed, and the
        error's metadata reports them and the usage spent. Every commit names the
        conversation's incarnation: one erased meanwhile refuses it (NOT_FOUND /
        CONVERSATION_ERASED), even after the model call. With `incarnation` (a background
        job's), a conversation of another incarnation is CONVERSATION_ERASED at once.
        """
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        validation.view_bounds(window, summary_batch)
        if max_summary_passes == 0:
            max_summary_passes = 1
        validation.in_range(
            max_summary_passes,
            validation.SUMMARY_PASSES_RANGE,
            "max_summary_passes",
            "INVALID_MAX_SUMMARY_PASSES",
        )
        limits = with_defaults(budget, self.config.default_budget)
        usage = Usage()
        passes = 0
        current, state = await self._current(namespace, cid)
        if incarnation is not None and incarnation != state.incarnation:
            raise conversation_erased()
        through = current.through_sequence if current else 0
        try:
            view = await self.transcripts.load_view(namespace, cid, window, summary_batch, through)
            if view.incarnation != state.incarnation:  # erased and made again meanwhile
                raise conversation_erased()
            attempts = 0
            while view.summary_buffer:
                if attempts == max_summary_passes:
                    return SummarizeResult(
                        current, passes, len(view.summary_buffer) + view.summary_backlog, usage
                    )
                attempts += 1
                previous = current.text if current else None
                # A retracted entry stays in the range the summary covers (contiguous),
                # but its text is not the conversation's any more: the model never sees it.
                standing = [e for e in view.summary_buffer if not e.retracted_version]
                prompt = self._prepare(limits, usage, previous, standing)
                output = await self.summarizer.summarize(
                    prompt, timeout=remaining(self.config.chat_model.timeout_s)
                )
                usage = usage + output.usage
                text = self._checked_output(output.text)
                new_through = view.summary_buffer[-1].sequence
                try:
                    inherited = (
                        current.through_sequence
                        if current is not None and current.conversation_id != cid
                        else 0
                    )
                    result = await self.store.commit_summary(
                        NewSummary(
                            namespace,
                            cid,
                            text,
                            new_through,
                            through,
                            state.incarnation,
                            inherited,
                        )
                    )
                except DomainError as error:
                    if error.reason != "SUMMARY_CONFLICT":
                        raise
                    # Another summarizer (a background job) moved the summary forward
                    # meanwhile: nothing regressed; carry on from where it is now.
                    current = await self.store.get_summary(namespace, cid)
                    through = current.through_sequence if current else 0
                    if through < new_through:
                        # It fell short of this pass (a job ahead of a wider window):
                        # the attempt is given back, so the caller gets the reach it
                        # asked for. Summaries only move forward: this repeats at most
                        # once per newer summary, each call charged to the budget.
                        attempts -= 1
                    view = await self.transcripts.load_view(
                        namespace, cid, window, summary_batch, through
                    )
                    continue
                current, through = result.summary, new_through
                passes += 1
                metrics.SUMMARY_PASSES.inc()
                if view.summary_backlog == 0:
                    break  # the view said nothing else waits: spare a round trip
                view = await self.transcripts.load_view(
                    namespace, cid, window, summary_batch, through
                )
        except DomainError as error:
            error.metadata.update(
                passes=str(passes),
                summarized_through=str(through),
                usage_model_calls=str(usage.model_calls),
                usage_input_tokens=str(usage.input_tokens),
                usage_output_tokens=str(usage.output_tokens),
            )
            raise
        return SummarizeResult(current, passes, 0, usage)

    # -- the background queue ------------------------------------------------------

    async def request_summary(
        self, namespace: str, conversation_id_text: str, window: int, summary_batch: int
    ) -> tuple[Job, bool]:
        """Enqueue background summarization; at most one waiting job per conversation.

        A repeat returns the waiting (or running) job with False; a running job
        then runs again when it finishes, so the request is not lost.
        """
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        validation.view_bounds(window, summary_batch)
        state = await self.transcripts.conversation(namespace, cid)
        job, created = await self.store.enqueue(
            NewJob(
                uuid.UUID(str(uuid_utils.uuid7())),
                namespace,
                cid,
                window,
                summary_batch,
                state.incarnation,
            )
        )
        if self.on_enqueue is not None:
            self.on_enqueue()
        return job, created

    async def erase(
        self, namespace: str, conversation_id_text: str, incarnation: int = 0
    ) -> SummaryErasure:
        """Erase every summary, history row and job of a conversation (idempotent).

        Used when a conversation is erased, before its transcript is (the transcript
        is another service's). With its `incarnation`, the erasure also leaves its
        tombstone: a commit or job for it is refused from now on, even one whose model
        call is in flight. A running job notices at its next step (its lease is gone) and stops.
        Returns the rows this call erased, and what every erasure of the incarnation erased
        (the tombstone adds them up: a retry reports the first call's too).
        """
        validation.namespace(namespace)
        if incarnation < 0:
            raise invalid_argument(
                "INVALID_INCARNATION", "incarnation must not be negative", field="incarnation"
            )
        return await self.store.erase_conversation(
            namespace, conversation_id(conversation_id_text), incarnation
        )

    async def get_backlog(self, namespace: str) -> JobQueue:
        """The job queue of a namespace: depth, oldest waiting age, parked and running jobs."""
        validation.namespace(namespace)
        return await self.store.backlog(namespace)
