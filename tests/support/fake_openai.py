"""A fake OpenAI-compatible HTTP server for tests: real HTTP on 127.0.0.1, scripted answers.

Usage::

    async with fake_openai() as server:
        model = OpenAIChatModel(server.base_url, "fake-model")
        server.respond_with(lambda body: FakeReply(text="hello", usage=(12, 3)))
        server.fail(503, times=2)        # the next two requests get HTTP 503
        server.fail(429, retry_after="30")  # with a Retry-After header
        server.fail(DISCONNECT)          # every request: connection closed, no response
        server.recover()                 # answer normally again
        server.delay = 0.5               # wait before each answer (interrupted on close)
        server.requests[-1].body         # the parsed JSON of the last request

Endpoints:
- POST /v1/chat/completions: plain JSON, or server-sent events when the body
  says `"stream": true` (text in word-sized deltas, tool calls in pieces, a
  usage chunk when `stream_options.include_usage`, then `data: [DONE]`).
- POST /v1/embeddings: deterministic unit vectors of `embedding_dim` floats
  derived from a hash of each input.

The responder receives the parsed request body and returns a FakeReply, a
plain string (the text), a dict or list (a JSON document, as a model answers
a `response_format` of type `json_schema`: the text is its JSON), a RawReply
(bytes sent as they are with HTTP 200: an unusable answer, a stream that breaks
off), or an awaitable of any of them. Without one, the server answers a short
deterministic text naming how many messages it received. The server does not
enforce a schema (not every provider does): what it answers is what the test
scripted, malformed or not.
The server runs inside the test's event loop; it needs no thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import json
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

# `fail(DISCONNECT)`: close the connection without sending any response.
DISCONNECT = 0


@dataclass
class FakeToolCall:
    """A tool call the fake model makes."""

    name: str
    arguments: str = "{}"
    id: str = ""


@dataclass
class FakeReply:
    """What the fake model answers. `usage` is (prompt_tokens, completion_tokens);
    None estimates it from the characters (4 a token); `usage=False` sends none."""

    text: str = ""
    tool_calls: list[FakeToolCall] = field(default_factory=list)
    usage: tuple[int, int] | bool | None = None
    finish_reason: str | None = None


@dataclass
class RawReply:
    """Bytes the server answers as they are (HTTP 200), whatever the request asked for."""

    body: bytes
    content_type: str = "application/json"


@dataclass
class ReceivedRequest:
    """One request the server received, with when it started and finished (monotonic)."""

    path: str
    body: Any
    headers: dict[str, str]
    started: float
    finished: float | None = None
    status: int | None = None  # None while in progress; 0 when the connection was closed

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The chat messages of a chat completion request."""
        value = self.body.get("messages", []) if isinstance(self.body, dict) else []
        return list(value)

    @property
    def response_format(self) -> dict[str, Any] | None:
        """The structured-output request of a chat completion (`response_format`), if any."""
        value = self.body.get("response_format") if isinstance(self.body, dict) else None
        return value if isinstance(value, dict) else None


Reply = FakeReply | RawReply | str | dict[str, Any] | list[Any]
Responder = Callable[[Any], "Reply | Awaitable[Reply]"]


def _default_reply(body: Any) -> FakeReply:
    count = len(body.get("messages", [])) if isinstance(body, dict) else 0
    return FakeReply(text=f"Fake summary of a request with {count} messages.")


def _estimate(text: str) -> int:
    return (len(text) + 3) // 4


class FakeOpenAI:
    """The server object `fake_openai()` yields."""

    def __init__(self, *, embedding_dim: int = 8) -> None:
        self.base_url = ""
        self.requests: list[ReceivedRequest] = []
        self.delay = 0.0
        self.embedding_dim = embedding_dim
        self._responder: Responder = _default_reply
        self._fail_status: int | None = None
        self._fail_left: int | None = None
        self._retry_after: str | None = None
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None

    # -- the scripting API ------------------------------------------------------

    def respond_with(self, responder: Responder) -> None:
        """Answer chat completions with `responder(parsed_body)`."""
        self._responder = responder

    def fail(
        self, status: int = 503, times: int | None = None, *, retry_after: str | None = None
    ) -> None:
        """Fail the next `times` requests (all of them until `recover()` when None)
        with HTTP `status` (and a `Retry-After: retry_after` header when given), or by
        closing the connection when status is DISCONNECT."""
        self._fail_status = status
        self._fail_left = times
        self._retry_after = retry_after

    def recover(self) -> None:
        """Stop failing."""
        self._fail_status = None
        self._fail_left = None
        self._retry_after = None

    @property
    def chat_requests(self) -> list[ReceivedRequest]:
        """The chat completion requests received, in arrival order."""
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    @property
    def failing(self) -> bool:
        """True while failures are being injected."""
        return self._fail_status is not None

    # -- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        """Listen on 127.0.0.1 on a free port."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/embeddings", self._embeddings)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}/v1"

    async def close(self) -> None:
        """Stop listening; requests still waiting on `delay` end at once."""
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- handlers -------------------------------------------------------------------

    async def _receive(self, request: web.Request) -> ReceivedRequest:
        try:
            body = await request.json()
        except ValueError:
            body = None
        received = ReceivedRequest(request.path, body, dict(request.headers), time.monotonic())
        self.requests.append(received)
        if self.delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.delay)
        return received

    def _injected_failure(self) -> int | None:
        if self._fail_status is None:
            return None
        status = self._fail_status
        if self._fail_left is not None:
            self._fail_left -= 1
            if self._fail_left <= 0:
                self.recover()
        return status

    def _finish(self, received: ReceivedRequest, status: int) -> None:
        received.status = status
        received.finished = time.monotonic()

    async def _fail_or_none(
        self, request: web.Request, received: ReceivedRequest
    ) -> web.StreamResponse | None:
        retry_after = self._retry_after  # read first: the last injected failure recovers
        status = self._injected_failure()
        if status is None:
            return None
        self._finish(received, status)
        if status == DISCONNECT:
            if request.transport is not None:
                request.transport.close()
            return web.Response()
        headers = {"Retry-After": retry_after} if retry_after is not None else None
        return web.json_response(
            {"error": {"message": "injected failure", "type": "server_error"}},
            status=status,
            headers=headers,
        )

    async def _reply(self, body: Any) -> FakeReply | RawReply:
        answer = self._responder(body)
        if inspect.isawaitable(answer):
            answer = await answer
        if isinstance(answer, dict | list):
            return FakeReply(text=json.dumps(answer))
        return FakeReply(text=answer) if isinstance(answer, str) else answer

    @staticmethod
    def _usage(reply: FakeReply, body: Any) -> dict[str, int] | None:
        if reply.usage is False:
            return None
        if isinstance(reply.usage, tuple):
            prompt, completion = reply.usage
        else:
            prompt = sum(_estimate(str(m.get("content") or "")) for m in body.get("messages", []))
            completion = _estimate(reply.text)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        received = await self._receive(request)
        failure = await self._fail_or_none(request, received)
        if failure is not None:
            return failure
        body = received.body if isinstance(received.body, dict) else {}
        reply = await self._reply(body)
        if isinstance(reply, RawReply):
            self._finish(received, 200)
            return web.Response(body=reply.body, headers={"Content-Type": reply.content_type})
        calls = [
            {
                "id": call.id or f"call_{index}",
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for index, call in enumerate(reply.tool_calls)
        ]
        finish = reply.finish_reason or ("tool_calls" if calls else "stop")
        usage = self._usage(reply, body)
        model = str(body.get("model", "fake-model"))
        if body.get("stream"):
            response = await self._stream(request, body, model, reply, calls, finish, usage)
            self._finish(received, 200)
            return response
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if calls:
            message["tool_calls"] = calls
        document: dict[str, Any] = {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
        if usage is not None:
            document["usage"] = usage
        self._finish(received, 200)
        return web.json_response(document)

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        model: str,
        reply: FakeReply,
        calls: list[dict[str, Any]],
        finish: str,
        usage: dict[str, int] | None,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def send(choices: list[dict[str, Any]], **extra: Any) -> None:
            chunk: dict[str, Any] = {
                "id": "chatcmpl-stream",
                "object": "chat.completion.chunk",
                "model": model,
                "choices": choices,
                **extra,
            }
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())

        await send([{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}])
        words = reply.text.split(" ")
        for index, word in enumerate(words):
            piece = word if index == len(words) - 1 else word + " "
            if piece:
                await send([{"index": 0, "delta": {"content": piece}, "finish_reason": None}])
        for index, call in enumerate(calls):
            head = {"index": index, "id": call["id"], "type": "function"}
            head["function"] = {"name": call["function"]["name"], "arguments": ""}
            await send([{"index": 0, "delta": {"tool_calls": [head]}, "finish_reason": None}])
            arguments = call["function"]["arguments"]
            middle = len(arguments) // 2
            for part in (arguments[:middle], arguments[middle:]):
                if part:
                    delta = {"tool_calls": [{"index": index, "function": {"arguments": part}}]}
                    await send([{"index": 0, "delta": delta, "finish_reason": None}])
        await send([{"index": 0, "delta": {}, "finish_reason": finish}])
        if usage is not None and (body.get("stream_options") or {}).get("include_usage"):
            await send([], usage=usage)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        received = await self._receive(request)
        failure = await self._fail_or_none(request, received)
        if failure is not None:
            return failure
        body = received.body if isinstance(received.body, dict) else {}
        inputs = body.get("input", [])
        if isinstance(inputs, str):
            inputs = [inputs]
        data = []
        for index, text in enumerate(inputs):
            digest = hashlib.sha256(str(text).encode()).digest()
            raw = [digest[i % len(digest)] - 127.5 for i in range(self.embedding_dim)]
            norm = math.sqrt(sum(v * v for v in raw)) or 1.0
            data.append(
                {"object": "embedding", "index": index, "embedding": [v / norm for v in raw]}
            )
        tokens = sum(_estimate(str(text)) for text in inputs)
        self._finish(received, 200)
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": body.get("model", "fake-embedding"),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )


@contextlib.asynccontextmanager
async def fake_openai(*, embedding_dim: int = 8) -> AsyncIterator[FakeOpenAI]:
    """A started FakeOpenAI for the duration of the block."""
    server = FakeOpenAI(embedding_dim=embedding_dim)
    await server.start()
    try:
        yield server
    finally:
        await server.close()
