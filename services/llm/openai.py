"""An OpenAI-compatible chat-completions client: `OpenAIChatModel` implements ChatModel.

Speaks `POST {base_url}/chat/completions` as OpenAI, vLLM, Ollama and LiteLLM
serve it, plain or streamed (server-sent events with `stream_options.
include_usage`), with tools. Shared by the summarizer and the agent.

Failures map to the model errors of services.llm.model:
- connect errors, timeouts before a response, HTTP 429 and 5xx are retried
  with exponential backoff (at most `max_retries` times, never past the
  deadline), then ModelUnavailable;
- any other HTTP error, or an answer that is not a chat completion, is
  ModelFailed (retrying would not help);
- the deadline (`timeout`, capped by `timeout_s`) passing is ModelTimeout.
At most `max_concurrent` calls are in flight (the connection pool is as large);
further calls wait, first come first served, until their deadline, at most
`max_queued` of them; beyond, RESOURCE_EXHAUSTED / OVERLOADED with a retry delay
(services/common/shedding.py). A caller who cancels gives up its place.
A stream that breaks after it started is ModelUnavailable and is not
retried (the caller has seen deltas). Error messages carry status codes,
never request or response content.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from services.common import metrics
from services.common.backoff import backoff
from services.common.domain import ToolCall, ToolDefinition, Usage
from services.common.errors import DomainError, invalid_argument
from services.common.shedding import BoundedGate
from services.llm.model import (
    ChatDelta,
    ChatMessage,
    ChatRequest,
    ChatResponse,
    ModelFailed,
    ModelTimeout,
    ModelUnavailable,
    estimate_tokens,
)

log = logging.getLogger(__name__)

# A completion larger than this is not a chat answer we can use.
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
_CONNECT_TIMEOUT_S = 10.0


def _message(message: ChatMessage) -> dict[str, Any]:
    wire: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        wire["content"] = message.content or None
        wire["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_json or "{}"},
            }
            for call in message.tool_calls
        ]
    if message.role == "tool":
        wire["tool_call_id"] = message.tool_call_id
    return wire


def _tool(tool: ToolDefinition) -> dict[str, Any]:
    try:
        parameters = (
            json.loads(tool.parameters_json_schema)
            if tool.parameters_json_schema
            else {"type": "object", "properties": {}}
        )
    except ValueError:
        raise invalid_argument(
            "INVALID_TOOL", "a tool's parameters_json_schema is not valid JSON", field="tools"
        ) from None
    function: dict[str, Any] = {"name": tool.name, "parameters": parameters}
    if tool.description:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _usage(raw: Any, request: ChatRequest, text: str) -> Usage:
    """Usage as reported, or estimated when the provider sent none (budgets need a figure)."""
    if isinstance(raw, Mapping) and isinstance(raw.get("prompt_tokens"), int):
        completion = raw.get("completion_tokens")
        return Usage(raw["prompt_tokens"], completion if isinstance(completion, int) else 0, 1)
    prompt = sum(estimate_tokens(m.content) for m in request.messages)
    return Usage(prompt, estimate_tokens(text), 1)


def _tool_calls(raw: Any) -> tuple[ToolCall, ...]:
    if not raw:
        return ()
    if not isinstance(raw, list):
        raise ModelFailed("the model answered malformed tool calls")
    calls = []
    for item in raw:
        function = item.get("function") if isinstance(item, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ModelFailed("the model answered malformed tool calls")
        arguments = function.get("arguments") or ""
        calls.append(ToolCall(str(item.get("id") or ""), function["name"], str(arguments)))
    return tuple(calls)


def parse_completion(document: Any, request: ChatRequest) -> ChatResponse:
    """A ChatResponse from a non-streamed chat.completion document."""
    try:
        choice = document["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise ModelFailed("the model answered something that is not a chat completion") from None
    content = message.get("content") or ""
    if not isinstance(content, str):
        raise ModelFailed("the model answered non-text content")
    return ChatResponse(
        text=content,
        tool_calls=_tool_calls(message.get("tool_calls")),
        usage=_usage(document.get("usage"), request, content),
        finish_reason=str(choice.get("finish_reason") or "stop"),
    )


class _StreamState:
    """Accumulates the chunks of a streamed completion."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.usage: Any = None
        self.finish_reason = ""
        self.done = False

    def feed(self, chunk: Any) -> str:
        """Take one chunk; return its text delta."""
        if not isinstance(chunk, Mapping):
            raise ModelFailed("the model streamed a malformed chunk")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        delta_text = ""
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if isinstance(content, str) and content:
                delta_text += content
            for piece in delta.get("tool_calls") or ():
                call = self.calls.setdefault(
                    int(piece.get("index", 0)), {"id": "", "name": "", "arguments": []}
                )
                if piece.get("id"):
                    call["id"] = piece["id"]
                function = piece.get("function") or {}
                if function.get("name") and not call["name"]:
                    call["name"] = function["name"]
                if function.get("arguments"):
                    call["arguments"].append(function["arguments"])
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        self.text.append(delta_text)
        return delta_text

    def response(self, request: ChatRequest) -> ChatResponse:
        text = "".join(self.text)
        calls = tuple(
            ToolCall(call["id"], call["name"], "".join(call["arguments"]))
            for _, call in sorted(self.calls.items())
        )
        if any(not call.name for call in calls):
            raise ModelFailed("the model streamed a tool call without a name")
        return ChatResponse(
            text=text,
            tool_calls=calls,
            usage=_usage(self.usage, request, text),
            finish_reason=self.finish_reason or "stop",
        )


@dataclass
class _Answer:
    """What a model call reports for its metrics once it finished."""

    usage: Usage | None = None


class OpenAIChatModel:
    """ChatModel over an OpenAI-compatible chat-completions endpoint (httpx, async).

    `base_url` ends before `/chat/completions` (e.g. `https://api.openai.com/v1`).
    `purpose` labels the model metrics ("summary", "agent"). Close with `aclose()`.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str = "",
        timeout_s: float = 60.0,
        max_retries: int = 2,
        *,
        purpose: str = "chat",
        provider: str = "openai",
        backoff_s: float = 0.25,
        backoff_max_s: float = 4.0,
        transport: httpx.AsyncBaseTransport | None = None,
        max_concurrent: int = 64,
        max_queued: int = 256,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # The gate is the queue in front of the model (bounded, deadline-aware); the
        # pool is as large, so a request never waits in it behind the gate's back.
        self._gate = BoundedGate("model", max_concurrent, max_queued)
        # No I/O here: the client connects on the first request.
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/") + "/",
            headers=headers,
            transport=transport,
            timeout=timeout_s,
            limits=httpx.Limits(max_connections=max_concurrent),
        )
        self._model = model
        self._provider = provider
        self.purpose = purpose
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._seconds = metrics.MODEL_SECONDS.labels(purpose, provider)
        self._errors = metrics.MODEL_ERRORS.labels(purpose, provider)
        self._tokens_in = metrics.MODEL_TOKENS.labels(purpose, provider, "input")
        self._tokens_out = metrics.MODEL_TOKENS.labels(purpose, provider, "output")

    @property
    def provider(self) -> str:
        return self._provider

    @property
    def model(self) -> str:
        return self._model

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()

    def _body(self, request: ChatRequest, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._model,
            "messages": [_message(m) for m in request.messages],
        }
        if request.max_output_tokens is not None:
            body["max_tokens"] = request.max_output_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.tools:
            body["tools"] = [_tool(t) for t in request.tools]
        if request.response_format is not None:
            fmt = request.response_format
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": fmt.name, "schema": dict(fmt.schema), "strict": fmt.strict},
            }
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def _record(self, started: float, usage: Usage | None, error: BaseException | None) -> None:
        self._seconds.observe(time.perf_counter() - started)
        if usage is not None:
            self._tokens_in.inc(usage.input_tokens)
            self._tokens_out.inc(usage.output_tokens)
        if isinstance(error, DomainError):
            self._errors.inc()

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        delay = backoff(attempt - 1, base_s=self.backoff_s, max_s=self.backoff_max_s)
        if retry_after and retry_after.strip().isdigit():
            delay = max(delay, min(float(retry_after), self.backoff_max_s))
        return delay

    async def _open(self, body: Mapping[str, Any], deadline: float) -> httpx.Response:
        """Send the request until a 2xx response's headers arrive (body unread), retrying
        what may succeed on a second try."""
        attempt = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ModelTimeout()
            retry_after = None
            try:
                request = self._client.build_request(
                    "POST",
                    "chat/completions",
                    json=body,
                    timeout=httpx.Timeout(left, connect=min(left, _CONNECT_TIMEOUT_S)),
                )
                response = await self._client.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                cause = type(exc).__name__
            except httpx.TimeoutException:
                if deadline - time.monotonic() <= 0.001:
                    raise ModelTimeout() from None
                cause = "timeout"
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
                # The connection closed before any response: nothing was answered.
                cause = type(exc).__name__
            else:
                status = response.status_code
                if status < 400:
                    return response
                await response.aclose()
                if status != 429 and status < 500:
                    raise ModelFailed(f"the model endpoint refused the request (HTTP {status})")
                cause = f"HTTP {status}"
                retry_after = response.headers.get("retry-after")
            attempt += 1
            if attempt > self.max_retries:
                raise ModelUnavailable(f"the model is unavailable ({cause}); retry later")
            delay = self._backoff(attempt, retry_after)
            if time.monotonic() + delay >= deadline:
                raise ModelUnavailable(f"the model is unavailable ({cause}); retry later")
            log.warning(
                "model call retried",
                extra={"provider": self._provider, "cause": cause, "attempt": attempt},
            )
            await asyncio.sleep(delay)

    @contextlib.contextmanager
    def _answering(self, broken: str) -> Iterator[_Answer]:
        """Map a model call's failures to the model errors, and record its metrics."""
        started = time.perf_counter()
        answer = _Answer()
        error: BaseException | None = None
        try:
            yield answer
        except TimeoutError:
            error = ModelTimeout()
            raise error from None
        except (httpx.TransportError, httpx.StreamError):
            error = ModelUnavailable(broken)
            raise error from None
        except DomainError as exc:
            error = exc
            raise
        finally:
            self._record(started, answer.usage, error)

    async def complete(self, request: ChatRequest, *, timeout: float) -> ChatResponse:
        """One completion, within `timeout` seconds (capped by `timeout_s`)."""
        budget = min(timeout, self.timeout_s)
        deadline = time.monotonic() + budget
        async with self._gate.slot(budget):
            return await self._complete(request, deadline)

    async def _complete(self, request: ChatRequest, deadline: float) -> ChatResponse:
        with self._answering("the model connection broke during the answer; retry later") as call:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                response = await self._open(self._body(request, stream=False), deadline)
                try:
                    raw = bytearray()
                    async for piece in response.aiter_bytes():
                        raw += piece
                        if len(raw) > MAX_RESPONSE_BYTES:
                            raise ModelFailed("the model's answer is too large")
                finally:
                    await response.aclose()
            try:
                document = json.loads(raw)
            except ValueError:
                raise ModelFailed("the model answered something that is not JSON") from None
            answer = parse_completion(document, request)
            call.usage = answer.usage
            return answer

    async def stream(
        self, request: ChatRequest, *, timeout: float
    ) -> AsyncIterator[ChatDelta | ChatResponse]:
        """Text deltas as they arrive, then one final ChatResponse (tool calls, usage)."""
        budget = min(timeout, self.timeout_s)
        deadline = time.monotonic() + budget
        async with (
            self._gate.slot(budget),
            contextlib.aclosing(self._stream(request, deadline)) as items,
        ):
            async for item in items:
                yield item

    async def _stream(
        self, request: ChatRequest, deadline: float
    ) -> AsyncGenerator[ChatDelta | ChatResponse]:
        with self._answering("the model stream broke; retry later") as call:
            response = await self._open(self._body(request, stream=True), deadline)
            state = _StreamState()
            try:
                async for event in self._events(response, deadline):
                    if event == "[DONE]":
                        state.done = True
                        break
                    try:
                        chunk = json.loads(event)
                    except ValueError:
                        raise ModelFailed("the model streamed a chunk that is not JSON") from None
                    delta = state.feed(chunk)
                    if delta:
                        yield ChatDelta(delta)
            finally:
                await response.aclose()
            if not state.done and not state.finish_reason:
                raise ModelUnavailable("the model stream ended early; retry later")
            final = state.response(request)
            call.usage = final.usage
            yield final

    @staticmethod
    async def _events(response: httpx.Response, deadline: float) -> AsyncIterator[str]:
        """The `data` payloads of a server-sent event stream, each read before the deadline."""
        lines = response.aiter_lines()
        data: list[str] = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            try:
                line = await asyncio.wait_for(anext(lines), left)
            except StopAsyncIteration:
                break
            if line == "":
                if data:
                    yield "\n".join(data)
                    data = []
                continue
            if line.startswith(":"):
                continue  # a comment (keep-alive)
            field, _, value = line.partition(":")
            if field == "data":
                data.append(value[1:] if value.startswith(" ") else value)
        if data:
            yield "\n".join(data)
        with contextlib.suppress(Exception):
            await lines.aclose()  # type: ignore[attr-defined]
