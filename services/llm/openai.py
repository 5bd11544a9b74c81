"""An OpenAI-compatible chat-completions client: `OpenAIChatModel` implements ChatModel.

The openai SDK's `AsyncOpenAI` speaks `POST {base_url}/chat/completions` (OpenAI,
vLLM, Ollama and LiteLLM serve it), plain or streamed (server-sent events with
`stream_options.include_usage`), with tools and `response_format`; this module is
the thin adapter around it: the slot queue, the deadline, the retries, the size cap, the
error mapping and the model metrics.

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
never request or response content (the SDK's errors quote the provider's
message: they are mapped, never passed on or logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx2
import openai

from services.common.admission import namespace_var
from services.common.backoff import backoff
from services.common.domain import Usage
from services.common.errors import DomainError
from services.common.shedding import SlotQueue
from services.llm import metrics
from services.llm.model import (
    ChatDelta,
    ChatRequest,
    ChatResponse,
    ModelFailed,
    ModelTimeout,
    ModelUnavailable,
)
from services.llm.settings import ModelSettings
from services.llm.wire import StreamState, chat_arguments, parse_completion

log = logging.getLogger(__name__)

T = TypeVar("T")

# A completion larger than this is not a chat answer we can use.
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
_CONNECT_TIMEOUT_S = 10.0
# The SDK refuses to start without a key; an endpoint that needs none (a local vLLM or
# Ollama) gets this one, never sent: each request omits the Authorization header.
_NO_KEY = "no-key"


@dataclass
class _Answer:
    """What a model call reports for its metrics once it finished."""

    usage: Usage | None = None


class OpenAIChatModel:
    """ChatModel over an OpenAI-compatible chat-completions endpoint (the openai SDK).

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
        max_concurrent: int = 64,
        max_queued: int = 256,
    ) -> None:
        # The slot queue in front of the model (bounded, deadline-aware); the pool is
        # as large, so a request never waits in it behind the queue's back.
        self._slots = SlotQueue("model", max_concurrent, max_queued)
        # The SDK's own retries are off (max_retries=0): its loop gives every attempt
        # the timeout the call started with and sleeps its own backoff (0.5-8 s, or a
        # Retry-After of up to two minutes) without a deadline, so a retry could run
        # past the caller's. `_open` retries instead, on the SDK's errors, each attempt
        # given what is left of the deadline. No I/O here: it connects on first use.
        self._client = openai.AsyncOpenAI(
            base_url=base_url.rstrip("/"),
            api_key=api_key or _NO_KEY,
            max_retries=0,
            timeout=timeout_s,
            http_client=httpx2.AsyncClient(
                timeout=timeout_s, limits=httpx2.Limits(max_connections=max_concurrent)
            ),
        )
        self._headers: dict[str, Any] = {} if api_key else {"Authorization": openai.omit}
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

    @classmethod
    def from_settings(cls, settings: ModelSettings, *, purpose: str) -> OpenAIChatModel:
        """The client of a role's model (services/llm/settings.py); `settings` has a URL."""
        return cls(
            settings.url,
            settings.name,
            settings.api_key,
            settings.timeout_s,
            settings.max_retries,
            purpose=purpose,
            max_concurrent=settings.max_concurrent,
            max_queued=settings.max_queued,
        )

    @property
    def provider(self) -> str:
        return self._provider

    @property
    def model(self) -> str:
        return self._model

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.close()

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

    async def _open(self, send: Callable[[httpx2.Timeout], Awaitable[T]], deadline: float) -> T:
        """`send(timeout)` until the SDK has a 2xx response's headers (the body unread),
        retrying what may succeed on a second try."""
        attempt = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ModelTimeout()
            retry_after = None
            try:
                return await send(httpx2.Timeout(left, connect=min(left, _CONNECT_TIMEOUT_S)))
            except openai.APITimeoutError:
                if deadline - time.monotonic() <= 0.001:
                    raise ModelTimeout() from None
                cause = "timeout"
            except openai.APIConnectionError as exc:
                # Refused, reset, or closed before any response: nothing was answered.
                cause = type(exc.__cause__).__name__ if exc.__cause__ else "connection error"
            except openai.APIStatusError as exc:
                status = exc.status_code
                if status != 429 and status < 500:
                    raise ModelFailed(
                        f"the model endpoint refused the request (HTTP {status})"
                    ) from None
                cause = f"HTTP {status}"
                retry_after = exc.response.headers.get("retry-after")
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
        except (httpx2.TransportError, httpx2.StreamError, openai.APIError):
            # After the headers: the body broke off, or the stream sent an error event.
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
        async with self._slots.slot(budget, namespace_var.get() or ""):
            return await self._complete(request, deadline)

    async def _complete(self, request: ChatRequest, deadline: float) -> ChatResponse:
        with self._answering("the model connection broke during the answer; retry later") as call:
            params = chat_arguments(self._model, request) | {"extra_headers": self._headers}
            async with (
                asyncio.timeout(max(0.0, deadline - time.monotonic())),
                contextlib.AsyncExitStack() as stack,
            ):
                # Streamed from the SDK (headers first) so that the body is read under the cap.
                response = await self._open(
                    lambda timeout: stack.enter_async_context(
                        self._client.chat.completions.with_streaming_response.create(
                            **params, timeout=timeout
                        )
                    ),
                    deadline,
                )
                raw = bytearray()
                async for piece in response.iter_bytes():
                    raw += piece
                    if len(raw) > MAX_RESPONSE_BYTES:
                        raise ModelFailed("the model's answer is too large")
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
            self._slots.slot(budget, namespace_var.get() or ""),
            contextlib.aclosing(self._stream(request, deadline)) as items,
        ):
            async for item in items:
                yield item

    async def _stream(
        self, request: ChatRequest, deadline: float
    ) -> AsyncGenerator[ChatDelta | ChatResponse]:
        with self._answering("the model stream broke; retry later") as call:
            params = chat_arguments(self._model, request) | {"extra_headers": self._headers}
            chunks = await self._open(
                lambda timeout: self._client.chat.completions.create(
                    **params, stream=True, stream_options={"include_usage": True}, timeout=timeout
                ),
                deadline,
            )
            state = StreamState()
            async with chunks:
                while True:
                    try:
                        # Each chunk before the deadline; the timeout spans no `yield`.
                        async with asyncio.timeout(deadline - time.monotonic()):
                            chunk = await anext(chunks)
                    except StopAsyncIteration:
                        break
                    except json.JSONDecodeError:
                        raise ModelFailed("the model streamed a chunk that is not JSON") from None
                    delta = state.feed(chunk)
                    if delta:
                        yield ChatDelta(delta)
            # The SDK ends the iteration at `[DONE]` and at the end of the body alike: a
            # stream is whole when a choice finished.
            if not state.finish_reason:
                raise ModelUnavailable("the model stream ended early; retry later")
            final = state.response(request)
            call.usage = final.usage
            yield final
