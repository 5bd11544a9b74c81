"""The MCP server: Runifold's memories and conversations as tools and resources, on the
official `mcp` SDK (MCPServer), calling Runifold through `AsyncClient` with the caller's
own credentials.

Identity: over stdio the process's RUNIFOLD_TOKEN; over Streamable HTTP with
RUNIFOLD_MCP_AUTH=bearer the bearer token of each HTTP request. The namespace is the
operator's RUNIFOLD_NAMESPACE or, when empty, the one the token grants (Runifold fills
it in): no tool takes a namespace, so a model can never choose one. Runifold checks the
token on every call and applies its per-namespace limits to these calls exactly as to
any gRPC caller: a RESOURCE_EXHAUSTED comes back as a tool error with its reason.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any, ParamSpec, TypeVar

import anyio
import anyio.abc
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.shared.exceptions import MCPError
from mcp.types import (
    ListResourcesResult,
    PaginatedRequestParams,
    Resource,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
    ToolAnnotations,
)
from pydantic import Field

import runifold_client
from runifold.common.v1 import common_pb2
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client.client import AsyncClient, source
from runifold_client.errors import NotFound, RunifoldError
from runifold_client.mcp import results
from runifold_client.mcp.results import DATA_NOTICE
from runifold_client.mcp.settings import McpSettings

CONVERSATION_URI = "runifold://conversations/{conversation_id}"
MEMORY_URI = "runifold://memories/{memory_id}"
# How many of each the resource listing shows (the first page of each listing).
LISTED = 100
# The entries a conversation resource shows (the recent window).
RESOURCE_WINDOW = 64
# The metadata key that marks what this server wrote.
ORIGIN_KEY = "runifold.mcp"
_CONVERSATION = re.compile(r"^runifold://conversations/([^/?#]+)$")
# A bearer token: one line of visible ASCII, bounded (Runifold verifies it on every call).
_TOKEN = re.compile(r"^[\x21-\x7e]{1,16384}$")

INSTRUCTIONS = f"""\
Runifold is this user's long-term memory and conversation store. Search memories before
answering questions about the user's past, preferences or decisions; remember durable
facts the user states. {DATA_NOTICE}"""

P = ParamSpec("P")
R = TypeVar("R")


def tool_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Answer a failed Runifold call as an MCP tool error with its reason and message
    (never a traceback; the SDK hands a CallToolResult through as it is)."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except RunifoldError as error:
            answer: Any = results.from_runifold(error)
            return answer  # type: ignore[no-any-return]
        except ArgumentError as error:
            invalid: Any = results.invalid(error.reason, error.field, str(error))
            return invalid  # type: ignore[no-any-return]

    return wrapper


class ArgumentError(ValueError):
    """A tool argument refused before Runifold is called."""

    def __init__(self, reason: str, field: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.field = field


class PassThroughVerifier:
    """Accepts a well-formed bearer token for Runifold to verify on every call.

    The MCP server holds no keys: the token is only carried. The principal is the
    token's hash, so the SDK binds each Streamable HTTP session to the token that
    opened it (another token cannot use the session)."""

    async def verify_token(self, token: str) -> AccessToken | None:
        if not _TOKEN.match(token):
            return None
        digest = hashlib.sha256(token.encode()).hexdigest()[:32]
        return AccessToken(token=token, client_id=f"bearer-{digest}", scopes=[])


def bearer_of(request: Any) -> str | None:
    """The bearer token of an HTTP request, or None (stdio, or no header)."""
    headers = getattr(request, "headers", None)
    if headers is None:
        return None
    value = str(headers.get("authorization", ""))
    if value[:7].lower() != "bearer ":
        return None
    return value[7:].strip() or None


class Runifold:
    """The state every call shares: the client (one channel), the settings, and the
    external URI that names this MCP server's sessions."""

    def __init__(self, settings: McpSettings, client: AsyncClient | None = None) -> None:
        self.settings = settings
        self.client = client or AsyncClient(
            settings.target,
            namespace=settings.namespace,
            token=settings.token or None,
            timeout=settings.timeout_s,
        )
        # Names this process when the transport has no session id (stdio).
        self.process_session = str(uuid.uuid4())

    def caller(self, request_context: ServerRequestContext[Any, Any]) -> AsyncClient:
        """The client acting for the caller of this request: the HTTP request's bearer
        token when authentication is on, else the process's own credentials."""
        if self.settings.auth == "bearer":
            token = bearer_of(request_context.request)
            if token is None:  # the SDK refuses such a request first; never fall back
                raise MCPError(code=-32001, message="a bearer token is required")
            return self.client.for_caller(token=token, namespace=self.settings.namespace)
        return self.client

    def session_uri(self, request_context: ServerRequestContext[Any, Any]) -> str:
        """The external URI of a fact remembered without a transcript range: the MCP
        session (Streamable HTTP's session id), else this server process."""
        headers = getattr(request_context.request, "headers", None)
        session = str(headers.get("mcp-session-id", "")) if headers is not None else ""
        if not re.fullmatch(r"[A-Za-z0-9._~-]{1,128}", session):
            session = self.process_session
        return f"mcp://runifold/sessions/{session}"


def _positive(field: str, value: int | None) -> int:
    if value is None or value < 1:
        raise ArgumentError(
            "INVALID_SOURCE_RANGE", field, f"{field} must be a sequence number (1 or more)"
        )
    return value


def build_server(settings: McpSettings, client: AsyncClient | None = None) -> MCPServer[Any]:
    """The MCP server over one Runifold client (made from `settings` when not given)."""
    runifold = Runifold(settings, client)
    auth = (
        {
            "auth": AuthSettings(
                issuer_url="https://runifold.invalid",  # type: ignore[arg-type]
                resource_server_url=None,
            ),
            "token_verifier": PassThroughVerifier(),
        }
        if settings.auth == "bearer"
        else {}
    )
    server: MCPServer[Any] = MCPServer(
        "runifold",
        title="Runifold",
        description="Long-term memory and conversations of one Runifold namespace",
        instructions=INSTRUCTIONS,
        version=runifold_client.__version__,
        log_level="WARNING",
        **auth,  # type: ignore[arg-type]
    )
    server.runifold = runifold  # type: ignore[attr-defined]
    _tools(server, runifold)
    _resources(server, runifold)
    return server


def _tools(server: MCPServer[Any], runifold: Runifold) -> None:
    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(
        title="Search memories",
        annotations=read_only,
        description=(
            "Search the user's stored memories (facts curated from earlier conversations) "
            "by meaning and by words (hybrid ranking), best first. Use it before answering "
            "about the user's past, preferences or decisions. `as_of` asks what was true at "
            "a past time (RFC 3339). Cost: one embedding and one index search; limited per "
            f"namespace like every search. {DATA_NOTICE}"
        ),
    )
    @tool_errors
    async def search_memories(
        query: Annotated[
            str, Field(description="What to look for, in plain words (1 byte to 4 KiB).")
        ],
        ctx: Context,
        limit: Annotated[int, Field(ge=1, le=50, description="The most memories to return.")] = 8,
        as_of: Annotated[
            datetime | None,
            Field(description="Only memories valid at this time (RFC 3339); default: now."),
        ] = None,
    ) -> results.SearchResult:
        reply = await runifold.caller(ctx.request_context).search_memories(
            query, limit=limit, mode="hybrid", as_of=as_of
        )
        return {
            "notice": DATA_NOTICE,
            "results": [
                {"score": round(float(hit.score), 6), "memory": results.memory(hit.memory)}
                for hit in reply.results
            ],
            "degraded": reply.degraded,
        }

    @server.tool(
        title="Remember a fact",
        description=(
            "Store one durable fact about the user or their work, stated in one short "
            'sentence ("The user prefers metric units."). When the fact comes from a '
            "stored conversation, give its id and the range of entries it comes from; "
            "otherwise it is recorded as coming from this MCP session. Cost: one write "
            "and one embedding; limited per namespace like every write."
        ),
    )
    @tool_errors
    async def remember(
        fact: Annotated[
            str, Field(description="The fact, one self-contained sentence (at most 16 KiB).")
        ],
        ctx: Context,
        conversation_id: Annotated[
            str | None, Field(description="The conversation the fact comes from, if any.")
        ] = None,
        from_sequence: Annotated[
            int | None, Field(description="First entry of the range it comes from (1-based).")
        ] = None,
        through_sequence: Annotated[
            int | None, Field(description="Last entry of the range it comes from (inclusive).")
        ] = None,
    ) -> results.MemoryResult:
        caller = runifold.caller(ctx.request_context)
        if conversation_id:
            sources = [
                source(
                    conversation_id,
                    _positive("from_sequence", from_sequence),
                    _positive("through_sequence", through_sequence),
                )
            ]
        elif from_sequence is not None or through_sequence is not None:
            raise ArgumentError(
                "INVALID_SOURCE_RANGE",
                "conversation_id",
                "a range needs conversation_id, the conversation it is in",
            )
        else:
            sources = [source(external_uri=runifold.session_uri(ctx.request_context))]
        reply = await caller.upsert_memory(fact, sources=sources, metadata={ORIGIN_KEY: "remember"})
        return {"notice": DATA_NOTICE, "memory": results.memory(reply.memory)}

    @server.tool(
        title="Propose memories",
        annotations=read_only,
        description=(
            "Read a range of a stored conversation and propose facts worth remembering "
            "(each as add, supersede an older memory, or duplicate of one). Nothing is "
            "stored: call `remember` for each proposal you keep. Cost: one model call over "
            "the range (at most 200 entries); limited per namespace. " + DATA_NOTICE
        ),
    )
    @tool_errors
    async def propose_memories(
        conversation_id: Annotated[str, Field(description="The conversation to read.")],
        from_sequence: Annotated[int, Field(ge=1, description="First entry to read (1-based).")],
        through_sequence: Annotated[
            int, Field(ge=1, description="Last entry to read (inclusive).")
        ],
        ctx: Context,
        max_proposals: Annotated[
            int, Field(ge=0, le=32, description="The most proposals; 0: the server's default.")
        ] = 0,
    ) -> results.ProposalsResult:
        reply = await runifold.caller(ctx.request_context).propose_memories(
            conversation_id,
            from_sequence=from_sequence,
            through_sequence=through_sequence,
            max_proposals=max_proposals,
        )
        return {
            "notice": DATA_NOTICE,
            "proposals": [results.proposal(p) for p in reply.proposals],
            "stored": False,
        }

    @server.tool(
        title="Correct a memory",
        annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False),
        description=(
            "Replace a memory's text with a corrected one, keeping where it came from. "
            "Give the revision you read (from search_memories): if the memory changed "
            "since, nothing is written and the error's reason is REVISION_CONFLICT; read "
            "it again and decide. Cost: one read and one write."
        ),
    )
    @tool_errors
    async def correct_memory(
        memory_id: Annotated[str, Field(description="The memory to correct.")],
        expected_revision: Annotated[int, Field(ge=1, description="The revision you read.")],
        content: Annotated[str, Field(description="The corrected fact, one sentence.")],
        ctx: Context,
    ) -> results.MemoryResult:
        caller = runifold.caller(ctx.request_context)
        current = await caller.get_memory(memory_id)
        reply = await caller.upsert_memory(
            content,
            memory_id=memory_id,
            expected_revision=expected_revision,
            sources=list(current.sources),
            metadata={**dict(current.metadata), ORIGIN_KEY: "correct"},
        )
        return {"notice": DATA_NOTICE, "memory": results.memory(reply.memory)}

    @server.tool(
        title="Forget a memory",
        annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True),
        description=(
            "Delete a memory that is wrong or that the user asked to forget. Give the "
            "revision you read: if it changed since, nothing is deleted and the error's "
            "reason is REVISION_CONFLICT. Cost: one write."
        ),
    )
    @tool_errors
    async def forget_memory(
        memory_id: Annotated[str, Field(description="The memory to delete.")],
        expected_revision: Annotated[int, Field(ge=1, description="The revision you read.")],
        ctx: Context,
    ) -> results.Forgotten:
        deleted = await runifold.caller(ctx.request_context).delete_memory(
            memory_id, expected_revision=expected_revision
        )
        return {"memory_id": memory_id, "deleted": deleted}

    @server.tool(
        title="List conversations",
        annotations=read_only,
        description=(
            "List the stored conversations, oldest first, one page at a time (pass "
            "next_page_token back for the next page). Cost: one indexed read."
        ),
    )
    @tool_errors
    async def list_conversations(
        ctx: Context,
        page_size: Annotated[int, Field(ge=1, le=100, description="Conversations per page.")] = 20,
        page_token: Annotated[
            str, Field(description="From the previous page; empty: the first.")
        ] = "",
    ) -> results.ConversationsResult:
        caller = runifold.caller(ctx.request_context)
        # One page (the client's listing iterates every page).
        page = await caller._call(
            caller.transcripts.ListConversations,
            transcript_pb.ListConversationsRequest(
                namespace=caller.namespace, page_size=page_size, page_token=page_token
            ),
        )
        return {
            "conversations": [
                {
                    "conversation_id": c.conversation_id,
                    "version": int(c.version),
                    "last_sequence": int(c.last_sequence),
                    "update_time": results.time_text(c.update_time, c.HasField("update_time")),
                }
                for c in page.conversations
            ],
            "next_page_token": page.next_page_token,
        }

    @server.tool(
        title="Read a conversation",
        annotations=read_only,
        description=(
            "Read a stored conversation: its most recent entries and the summary of what "
            "came before them. Cost: two indexed reads, bounded by `window`. " + DATA_NOTICE
        ),
    )
    @tool_errors
    async def read_conversation(
        conversation_id: Annotated[str, Field(description="The conversation to read.")],
        ctx: Context,
        window: Annotated[int, Field(ge=1, le=64, description="How many recent entries.")] = 16,
    ) -> results.ConversationView:
        return await _view(runifold.caller(ctx.request_context), conversation_id, window)

    @server.tool(
        title="Append a note",
        description=(
            "Add a note to a stored conversation, as an assistant entry marked as written "
            "through MCP (for example a decision reached, or a summary of work done). Give "
            "the version you read to append only if nothing was added since "
            "(VERSION_CONFLICT otherwise). Cost: one write."
        ),
    )
    @tool_errors
    async def append_note(
        conversation_id: Annotated[str, Field(description="The conversation to add to.")],
        text: Annotated[str, Field(description="The note.")],
        ctx: Context,
        expected_version: Annotated[
            int | None, Field(ge=0, description="Append only at this version (from a read).")
        ] = None,
    ) -> results.Appended:
        note = common_pb2.Message(
            role=common_pb2.ROLE_ASSISTANT, text=text, metadata={ORIGIN_KEY: "note"}
        )
        reply = await runifold.caller(ctx.request_context).append(
            conversation_id, note, expected_version=expected_version
        )
        return {
            "conversation_id": conversation_id,
            "version": int(reply.version),
            "first_sequence": int(reply.first_sequence),
            "last_sequence": int(reply.last_sequence),
        }


async def _view(caller: AsyncClient, conversation_id: str, window: int) -> results.ConversationView:
    """A conversation's recent window and summary."""
    view = await caller.load_view(conversation_id, window=window, summary_batch=1)
    summary = await caller.get_summary(conversation_id)
    return {
        "notice": DATA_NOTICE,
        "conversation_id": conversation_id,
        "version": int(view.version),
        "last_sequence": max([int(e.sequence) for e in view.window], default=0),
        "summary": (
            {"text": summary.text, "through_sequence": int(summary.through_sequence)}
            if summary is not None
            else None
        ),
        "recent": [results.entry(e) for e in view.window],
    }


def _resource_error(error: RunifoldError) -> ResourceError:
    return ResourceError(f"{error.reason}: {error.message}")


def _resources(server: MCPServer[Any], runifold: Runifold) -> None:
    @server.resource(
        CONVERSATION_URI,
        name="conversation",
        title="A conversation",
        description=f"A conversation's recent entries and its summary, as JSON. {DATA_NOTICE}",
        mime_type="application/json",
    )
    async def conversation(conversation_id: str, ctx: Context) -> str:
        try:
            view = await _view(
                runifold.caller(ctx.request_context), conversation_id, RESOURCE_WINDOW
            )
        except RunifoldError as error:
            raise _resource_error(error) from None
        return json.dumps(view)

    @server.resource(
        MEMORY_URI,
        name="memory",
        title="A memory",
        description=f"One stored memory, as JSON. {DATA_NOTICE}",
        mime_type="application/json",
    )
    async def memory(memory_id: str, ctx: Context) -> str:
        try:
            found = await runifold.caller(ctx.request_context).get_memory(memory_id)
        except RunifoldError as error:
            raise _resource_error(error) from None
        return json.dumps({"notice": DATA_NOTICE, "memory": results.memory(found)})

    async def list_resources(
        ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams | None
    ) -> ListResourcesResult:
        """The caller's conversations and memories (the first LISTED of each): the
        listing depends on who asks, so it is not MCPServer's static one."""
        caller = runifold.caller(ctx)
        listed: list[Resource] = []
        try:
            async for item in caller.list_conversations(page_size=LISTED):
                listed.append(
                    Resource(
                        uri=f"runifold://conversations/{item.conversation_id}",
                        name=f"conversation {item.conversation_id}",
                        description=f"{item.last_sequence} entries",
                        mime_type="application/json",
                    )
                )
                if len(listed) >= LISTED:
                    break
            count = 0
            async for found in caller.list_memories(page_size=LISTED):
                listed.append(
                    Resource(
                        uri=f"runifold://memories/{found.memory_id}",
                        name=f"memory {found.memory_id}",
                        description=f"revision {found.revision}",
                        mime_type="application/json",
                    )
                )
                count += 1
                if count >= LISTED:
                    break
        except RunifoldError as error:
            raise MCPError(code=-32603, message=f"{error.reason}: {error.message}") from None
        return ListResourcesResult(resources=listed)

    listen = WatchingListen(runifold)
    lowlevel = server._lowlevel_server  # the SDK's documented seam for replacing a handler
    lowlevel.add_request_handler("resources/list", PaginatedRequestParams, list_resources)
    lowlevel.add_request_handler("subscriptions/listen", SubscriptionsListenRequestParams, listen)


class WatchingListen:
    """Serves `subscriptions/listen`: a resource-updated event for each change of a
    subscribed conversation, from WatchConversation called with the listener's own
    credentials. Each listen stream has a bus of its own, so no caller is told about
    another's resources (the SDK's shared bus would fan every event out to everyone)."""

    def __init__(self, runifold: Runifold) -> None:
        self.runifold = runifold

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], params: SubscriptionsListenRequestParams
    ) -> SubscriptionsListenResult:
        caller = self.runifold.caller(ctx)
        uris = list(params.notifications.resource_subscriptions or ())
        watched = [(uri, m.group(1)) for uri in uris if (m := _CONVERSATION.match(uri))]
        if len(watched) > self.runifold.settings.max_watched:
            raise MCPError(
                code=-32602,
                message=f"at most {self.runifold.settings.max_watched} conversations per listen",
            )
        # Each conversation's position is read before the acknowledgement: a change the
        # client makes once it is acknowledged comes after it, so none is missed.
        positions = []
        for uri, conversation_id in watched:
            try:
                conversation = await caller.get_conversation(conversation_id)
            except NotFound:
                continue  # not in this namespace: nothing to tell (its existence neither)
            except RunifoldError as error:
                raise MCPError(code=-32603, message=f"{error.reason}: {error.message}") from None
            positions.append((uri, conversation_id, int(conversation.last_sequence)))
        bus = InMemorySubscriptionBus()
        handler = ListenHandler(bus, max_subscriptions=1)
        answer: SubscriptionsListenResult | None = None
        failures: list[RunifoldError] = []
        async with anyio.create_task_group() as group:
            for position in positions:
                group.start_soon(self._follow, caller, bus, failures, group, *position)
            try:
                answer = await handler(ctx, params)
            finally:
                group.cancel_scope.cancel()
        if answer is None:
            # A watch was refused (WATCHER_LIMIT, ...): end the stream with its reason,
            # so that the client listens again rather than waiting for nothing.
            refused = failures[0]
            raise MCPError(code=-32603, message=f"{refused.reason}: {refused.message}")
        return answer

    @staticmethod
    async def _follow(
        caller: AsyncClient,
        bus: InMemorySubscriptionBus,
        failures: list[RunifoldError],
        group: anyio.abc.TaskGroup,
        uri: str,
        conversation_id: str,
        after_sequence: int,
    ) -> None:
        """Publish `uri` updated at each event that changes the conversation (the watch
        resumes by itself across a replica's restart)."""
        try:
            async for event in caller.watch_conversation(
                conversation_id, after_sequence=after_sequence
            ):
                if event.WhichOneof("event") in {"appended", "retracted", "erased"}:
                    await bus.publish(ResourceUpdated(uri=uri))
        except NotFound:
            return  # erased (its last event was published): nothing more will change
        except RunifoldError as error:
            failures.append(error)
            group.cancel_scope.cancel()
