"""AgentService domain logic: one agent turn, atomically.

load summary and view -> (summarize | refuse) -> recall memories -> call the
model -> ONE compare-and-swap append of the input and the model's messages at
the version the view was read at, with request_id = turn_id. A lost race is
TURN_CONFLICT carrying the completed outcome; the model is never re-run.

Takes ports to the other services and a ChatModel; knows nothing of gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field

import uuid_utils

from services.agent.config import AgentConfig
from services.agent.model import (
    ContextReport,
    Erasure,
    Outcome,
    Policy,
    Progress,
    Recall,
    Stage,
    SummaryMode,
    SummaryState,
    TextDelta,
    Turn,
    TurnConflict,
    TurnEvent,
    TurnResult,
    ViewState,
)
from services.agent.ports import Memories, Summaries, Transcripts
from services.agent.prompt import build_request, estimate_request_tokens
from services.common import metrics, peers, validation
from services.common.domain import (
    Budget,
    Message,
    Role,
    ToolCall,
    ToolDefinition,
    Usage,
    canonical_json,
    check_tool_pairing,
    open_tool_calls,
)
from services.common.errors import (
    Code,
    DomainError,
    VersionConflict,
    failed_precondition,
    invalid_argument,
)
from services.common.llm import (
    ChatDelta,
    ChatModel,
    ChatRequest,
    ChatResponse,
    ModelFailed,
    budget_exhausted,
    budget_left,
    require_call,
    with_defaults,
)

# The context of a conversation that does not exist yet (create_if_missing).
EMPTY_VIEW = ViewState(version=0, window=(), summary_buffer=(), summary_backlog=0)
_TOOL_NAME = re.compile(r"[A-Za-z0-9_\-]{1,64}")
_MAX_MEMORY_QUERY_BYTES = 4096


@dataclass
class _Spend:
    """What is left of a turn's budget."""

    budget: Budget
    used: Usage = field(default_factory=Usage)

    def remaining(self) -> Budget:
        return budget_left(self.budget, self.used)

    def for_summary(self) -> Budget:
        """What summarization may spend: everything but the turn's own model call.

        One call and a share of the output tokens (half, at most 512) stay
        reserved, so that a turn is never summarized into a budget it cannot
        finish with.
        """
        left = self.require_call()
        reserve_output = max(1, min(left.max_output_tokens // 2, 512))
        if left.max_model_calls < 2:
            raise budget_exhausted("max_model_calls", self.budget.max_model_calls)
        if left.max_output_tokens - reserve_output < 1:
            raise budget_exhausted("max_output_tokens", self.budget.max_output_tokens)
        return Budget(
            max_output_tokens=left.max_output_tokens - reserve_output,
            max_model_calls=left.max_model_calls - 1,
            max_input_tokens=left.max_input_tokens,
        )

    def require_call(self, input_tokens: int = 0) -> Budget:
        """The budget left for one more model call, or RESOURCE_EXHAUSTED."""
        return require_call(self.budget, self.used, input_tokens)


def _first_user_text(messages: Sequence[Message]) -> str:
    texts = [m.text for m in messages if m.role == Role.USER and m.text.strip()]
    if not texts:
        texts = [m.text for m in messages if m.text.strip()]
    query = "\n".join(texts)
    return query.encode()[:_MAX_MEMORY_QUERY_BYTES].decode(errors="ignore")


class AgentService:
    """Runs agent turns against the transcript, summary and memory services."""

    def __init__(
        self,
        transcripts: Transcripts,
        summaries: Summaries,
        memories: Memories,
        model: ChatModel,
        config: AgentConfig,
    ) -> None:
        self.transcripts = transcripts
        self.summaries = summaries
        self.memories = memories
        self.model = model
        self.config = config

    # -- request shaping -----------------------------------------------------

    def policy(
        self,
        window: int,
        summary_batch: int,
        memory_limit: int,
        summary_mode: int,
        max_summary_passes: int,
    ) -> Policy:
        """A validated policy; zero fields take the documented defaults."""
        window = window or self.config.default_window
        summary_batch = summary_batch or self.config.default_summary_batch
        validation.view_bounds(window, summary_batch, prefix="policy.")
        validation.in_range(
            memory_limit,
            (0, validation.MEMORY_LIMIT_RANGE[1]),
            "policy.memory_limit",
            "INVALID_MEMORY_LIMIT",
        )
        if summary_mode not in (0, SummaryMode.REQUIRE, SummaryMode.AUTO):
            raise invalid_argument(
                "INVALID_SUMMARY_MODE",
                "policy.summary_mode is unknown",
                field="policy.summary_mode",
            )
        passes = max_summary_passes or 1
        validation.in_range(
            passes,
            validation.SUMMARY_PASSES_RANGE,
            "policy.max_summary_passes",
            "INVALID_SUMMARY_PASSES",
        )
        return Policy(
            window,
            summary_batch,
            memory_limit,
            SummaryMode(summary_mode or SummaryMode.REQUIRE),
            passes,
        )

    def budget(self, budget: Budget) -> Budget:
        """The caller's budget with server defaults for zero fields."""
        return with_defaults(budget, self.config.default_budget)

    def _validate(self, turn: Turn) -> None:
        validation.namespace(turn.namespace)
        if turn.conversation_id or not turn.create_if_missing:
            validation.conversation_id(turn.conversation_id)
        validation.request_id(turn.turn_id, "turn_id")
        if not turn.input:
            raise invalid_argument("NO_INPUT", "input must not be empty", field="input")
        if len(turn.input) > self.config.max_input_messages:
            raise invalid_argument(
                "TOO_MANY_MESSAGES",
                f"input carries at most {self.config.max_input_messages} messages",
                field="input",
            )
        size = 0
        for index, message in enumerate(turn.input):
            field = f"input[{index}]"
            # A system message is refused next, by the transcript's rules.
            if message.role not in (Role.USER, Role.TOOL, Role.SYSTEM):
                raise invalid_argument(
                    "INVALID_INPUT_ROLE",
                    "input holds user messages or tool results",
                    field=f"{field}.role",
                )
            size += validation.message(message, field, max_bytes=self.config.max_message_bytes)
            if message.tool_calls:
                raise invalid_argument(
                    "INVALID_MESSAGE", "input messages carry no tool calls", field=field
                )
        validation.messages_size(size, "input", max_bytes=self.config.max_input_bytes)
        validation.text(
            turn.system_instructions,
            "system_instructions",
            max_bytes=self.config.max_system_instructions_bytes,
            reason="INVALID_SYSTEM_INSTRUCTIONS",
        )
        self._validate_tools(turn.tools)

    def _validate_tools(self, tools: Sequence[ToolDefinition]) -> None:
        if len(tools) > self.config.max_tools:
            raise invalid_argument(
                "INVALID_TOOLS", f"at most {self.config.max_tools} tools", field="tools"
            )
        names: set[str] = set()
        for index, tool in enumerate(tools):
            field = f"tools[{index}]"
            if not _TOOL_NAME.fullmatch(tool.name) or tool.name in names:
                raise invalid_argument(
                    "INVALID_TOOLS",
                    "tool names are unique, 1..64 characters of [A-Za-z0-9_-]",
                    field=f"{field}.name",
                )
            names.add(tool.name)
            validation.text(
                tool.parameters_json_schema,
                f"{field}.parameters_json_schema",
                max_bytes=self.config.max_tool_schema_bytes,
                reason="INVALID_TOOLS",
            )
            if tool.parameters_json_schema:
                try:
                    schema = json.loads(tool.parameters_json_schema)
                except (ValueError, RecursionError):  # RecursionError: nested too deep
                    schema = None
                if not isinstance(schema, dict):
                    raise invalid_argument(
                        "INVALID_TOOLS",
                        "parameters_json_schema must be a JSON object",
                        field=f"{field}.parameters_json_schema",
                    )
            validation.text(
                tool.description,
                f"{field}.description",
                max_bytes=16 * 1024,
                reason="INVALID_TOOLS",
            )

    # -- the turn --------------------------------------------------------------

    async def run(self, turn: Turn) -> TurnResult:
        """Run a turn and return its committed result."""
        result: TurnResult | None = None
        async for event in self.events(turn, stream=False):
            if isinstance(event, TurnResult):
                result = event
        if result is None:  # pragma: no cover - events always ends in a result or raises
            raise RuntimeError("turn ended without a result")
        return result

    async def events(self, turn: Turn, *, stream: bool) -> AsyncIterator[TurnEvent]:
        """The turn as events: progress, text deltas (when streaming), then the result."""
        self._validate(turn)
        try:
            async for event in self._events(turn, stream):
                yield event
        except TurnConflict:
            metrics.TURN_CONFLICTS.inc()
            metrics.TURNS.labels("conflict").inc()
            raise
        except DomainError as error:
            if error.reason in {"SUMMARY_REQUIRED", "SUMMARY_BACKLOG"}:
                metrics.SUMMARY_REQUIRED.labels(error.reason).inc()
            metrics.TURNS.labels("error").inc()
            raise

    async def _events(self, turn: Turn, stream: bool) -> AsyncIterator[TurnEvent]:
        namespace, policy = turn.namespace, turn.policy
        turn_id = turn.turn_id or str(uuid_utils.uuid7())
        # With create_if_missing the conversation is created only when the turn
        # commits, so a turn that fails leaves nothing behind.
        conversation_id = turn.conversation_id or str(uuid.UUID(str(uuid_utils.uuid7())))

        yield Progress(Stage.LOADING_CONTEXT)
        # Memory lookup depends only on the input: it runs while the summary and
        # the view load (its query embedding is the slowest part of a turn).
        recalling = (
            asyncio.ensure_future(
                self.memories.search(namespace, _first_user_text(turn.input), policy.memory_limit)
            )
            if policy.memory_limit > 0
            else None
        )
        try:
            async for event in self._turn_with_context(
                turn, conversation_id, turn_id, recalling, stream
            ):
                yield event
        finally:
            if recalling is not None and not recalling.done():
                recalling.cancel()
                with contextlib.suppress(asyncio.CancelledError, DomainError):
                    await recalling

    async def _turn_with_context(
        self,
        turn: Turn,
        conversation_id: str,
        turn_id: str,
        recalling: asyncio.Future[Recall] | None,
        stream: bool,
    ) -> AsyncIterator[TurnEvent]:
        namespace, policy = turn.namespace, turn.policy
        missing = turn.create_if_missing and not turn.conversation_id
        summary, view = SummaryState(), EMPTY_VIEW
        if not missing:
            try:
                summary = await self.summaries.get(namespace, conversation_id)
                view = await self.transcripts.load_view(
                    namespace,
                    conversation_id,
                    policy.window,
                    policy.summary_batch,
                    summary.through_sequence,
                    turn_id,
                )
            except DomainError as error:
                if not (turn.create_if_missing and error.reason == "CONVERSATION_NOT_FOUND"):
                    raise
                missing = True  # a new conversation: an empty context
        if view.prior_append is not None:
            yield await self._replay(turn, conversation_id, view)
            return

        spend = _Spend(turn.budget)
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
            if view.prior_append is not None:
                yield await self._replay(turn, conversation_id, view)
                return
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

        yield Progress(Stage.CALLING_MODEL)
        response: ChatResponse | None = None
        async for piece in self._call_model(request, stream):
            if isinstance(piece, ChatDelta):
                yield TextDelta(piece.text)
            else:
                response = piece
        if response is None:
            raise ModelFailed("the model stream ended without an answer")
        spend.used += response.usage
        reply = self._assistant_message(response)
        outcome = Outcome([reply], spend.used)

        yield Progress(Stage.COMMITTING)
        messages = [*turn.input, reply]
        created = False
        if missing:
            # Created now, at the version the turn assumed (0); if another writer
            # created and wrote it meanwhile, the append below conflicts as usual.
            _, created = await self.transcripts.create_conversation(namespace, conversation_id)
        try:
            appended = await self.transcripts.append(
                namespace, conversation_id, view.version, messages, turn_id, spend.used
            )
        except VersionConflict as conflict:
            raise TurnConflict(outcome, conflict.current_version, view.version) from None
        except DomainError as error:
            if error.reason != "REQUEST_ID_REUSED":
                raise
            # A duplicate of this turn committed while we ran: return its outcome.
            latest = await self.transcripts.load_view(namespace, conversation_id, 1, 1, 0, turn_id)
            if latest.prior_append is None:
                raise
            yield await self._replay(turn, conversation_id, latest)
            return
        metrics.TURNS.labels("replayed" if appended.replayed else "committed").inc()
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
            created=created,
        )

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

    async def _call_model(
        self, request: ChatRequest, stream: bool
    ) -> AsyncIterator[ChatDelta | ChatResponse]:
        timeout = peers.remaining(self.config.model_timeout_s)
        if stream:
            async for piece in self.model.stream(request, timeout=timeout):
                yield piece
        else:
            yield await self.model.complete(request, timeout=timeout)

    def _assistant_message(self, response: ChatResponse) -> Message:
        calls: list[ToolCall] = []
        seen: set[str] = set()
        for index, call in enumerate(response.tool_calls):
            call_id = (
                call.id
                if call.id and call.id not in seen
                else f"call_{uuid.uuid4().hex[:12]}_{index}"
            )
            seen.add(call_id)
            calls.append(ToolCall(call_id, call.name, call.arguments_json))
        if not response.text.strip() and not calls:
            raise ModelFailed("the model returned neither text nor tool calls")
        return Message(Role.ASSISTANT, response.text, tuple(calls))

    async def erase(self, namespace: str, conversation_id: str) -> Erasure:
        """Erase a conversation everywhere: transcript, summaries and jobs, derived memories.

        Idempotent and resumable: each part is erased on its own; a part whose
        service is unavailable is reported in `remaining` and a retry completes
        it. The transcript goes first, so that nothing new can be derived from
        it while the rest is erased (summaries and memories are only written for
        conversations that exist).
        """
        validation.namespace(namespace)
        validation.conversation_id(conversation_id)
        remaining: list[str] = []

        async def part(name: str, action: Awaitable[int]) -> int:
            try:
                return await action
            except DomainError as error:
                if error.code in (Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED):
                    remaining.append(name)
                    return 0
                raise

        entries = await part(
            "transcript", self.transcripts.delete_conversation(namespace, conversation_id)
        )
        summaries = await part("summary", self.summaries.erase(namespace, conversation_id)) > 0
        memories = await part(
            "memory", self.memories.forget_conversation(namespace, conversation_id)
        )
        return Erasure(entries, summaries, memories, remaining)

    async def _replay(self, turn: Turn, conversation_id: str, view: ViewState) -> TurnResult:
        """The stored outcome of a turn that already committed (no model call)."""
        prior = view.prior_append
        assert prior is not None
        entries = await self.transcripts.entries(
            turn.namespace, conversation_id, prior.first_sequence, prior.last_sequence
        )
        stored = [entry.message for entry in entries]
        count = len(turn.input)
        if canonical_json(stored[:count]) != canonical_json(turn.input):
            raise invalid_argument(
                "TURN_ID_REUSED",
                "turn_id was already used for a turn with different input",
                field="turn_id",
            )
        output = stored[count:]
        calls = next((m.tool_calls for m in reversed(output) if m.role == Role.ASSISTANT), ())
        metrics.TURNS.labels("replayed").inc()
        return TurnResult(
            conversation_id=conversation_id,
            conversation_version=prior.version,
            first_sequence=prior.first_sequence,
            last_sequence=prior.last_sequence,
            outcome=Outcome(output, prior.usage),
            tool_calls=calls,
            context=ContextReport(),
            replayed=True,
        )
