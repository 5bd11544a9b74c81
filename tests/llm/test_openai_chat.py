"""OpenAIChatModel against the fake OpenAI-compatible server (real HTTP on loopback)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from services.common.domain import ToolCall, ToolDefinition
from services.common.errors import Code, DomainError
from services.llm import openai as openai_adapter
from services.llm.model import (
    ChatDelta,
    ChatMessage,
    ChatRequest,
    ChatResponse,
    ModelFailed,
    ModelTimeout,
    ModelUnavailable,
)
from services.llm.openai import OpenAIChatModel
from tests.support.fake_openai import (
    DISCONNECT,
    FakeOpenAI,
    FakeReply,
    FakeToolCall,
    RawReply,
    fake_openai,
)
from tests.support.waiting import holds, wait_for

REQUEST = ChatRequest(
    messages=(ChatMessage("system", "be brief"), ChatMessage("user", "hello there")),
    max_output_tokens=64,
)


@pytest.fixture
async def server() -> AsyncIterator[FakeOpenAI]:
    async with fake_openai() as fake:
        yield fake


def model_for(url: str, **options: Any) -> OpenAIChatModel:
    options.setdefault("backoff_s", 0.001)
    options.setdefault("purpose", "test")
    return OpenAIChatModel(url, "fake-model", "sk-test", **options)


def errors(purpose: str = "test") -> float:
    value = REGISTRY.get_sample_value(
        "runifold_model_errors_total", {"purpose": purpose, "provider": "openai"}
    )
    return value or 0.0


async def test_complete_sends_the_request_and_parses_the_answer(server: FakeOpenAI) -> None:
    server.respond_with(
        lambda body: FakeReply(
            text="hi", tool_calls=[FakeToolCall("lookup", '{"q":1}', "c1")], usage=(12, 3)
        )
    )
    model = model_for(server.base_url)
    request = ChatRequest(
        messages=(
            *REQUEST.messages,
            ChatMessage("assistant", "", tool_calls=(ToolCall("c0", "lookup", "{}"),)),
            ChatMessage("tool", "42", tool_call_id="c0"),
        ),
        max_output_tokens=64,
        tools=(ToolDefinition("lookup", "finds things", '{"type":"object"}'),),
        temperature=0.0,
    )
    try:
        answer = await model.complete(request, timeout=5)
    finally:
        await model.aclose()
    assert answer.text == "hi" and answer.finish_reason == "tool_calls"
    assert answer.tool_calls == (ToolCall("c1", "lookup", '{"q":1}'),)
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (12, 3)
    sent = server.chat_requests[0]
    assert sent.headers["Authorization"] == "Bearer sk-test"
    assert sent.body["model"] == "fake-model" and sent.body["max_tokens"] == 64
    assert sent.body["temperature"] == 0.0 and "stream" not in sent.body
    assert sent.body["tools"][0]["function"]["parameters"] == {"type": "object"}
    assert sent.messages[2]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": "{}"}
    assert sent.messages[3] == {"role": "tool", "content": "42", "tool_call_id": "c0"}


async def test_stream_yields_deltas_then_the_whole_answer(server: FakeOpenAI) -> None:
    server.respond_with(
        lambda body: FakeReply(
            text="one two three", tool_calls=[FakeToolCall("add", '{"a":1,"b":2}')], usage=(7, 5)
        )
    )
    model = model_for(server.base_url)
    try:
        items = [item async for item in model.stream(REQUEST, timeout=5)]
    finally:
        await model.aclose()
    deltas = [i.text for i in items if isinstance(i, ChatDelta)]
    assert deltas == ["one ", "two ", "three"]
    final = items[-1]
    assert isinstance(final, ChatResponse) and final.text == "one two three"
    assert final.tool_calls == (ToolCall("call_0", "add", '{"a":1,"b":2}'),)
    assert (final.usage.input_tokens, final.usage.output_tokens, final.usage.model_calls) == (
        7,
        5,
        1,
    )
    body = server.chat_requests[0].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


async def test_missing_usage_is_estimated(server: FakeOpenAI) -> None:
    server.respond_with(lambda body: FakeReply(text="x" * 40, usage=False))
    model = model_for(server.base_url)
    try:
        answer = await model.complete(REQUEST, timeout=5)
    finally:
        await model.aclose()
    assert answer.usage.output_tokens == 10 and answer.usage.input_tokens > 0


@pytest.mark.parametrize("status", [500, 503, 429, DISCONNECT])
async def test_unavailable_class_failures_are_retried(server: FakeOpenAI, status: int) -> None:
    server.fail(status, times=2)
    model = model_for(server.base_url, max_retries=2)
    try:
        answer = await model.complete(REQUEST, timeout=5)
    finally:
        await model.aclose()
    assert answer.text.startswith("Fake summary")
    assert len(server.chat_requests) == 3


async def test_retries_run_out_as_model_unavailable(server: FakeOpenAI) -> None:
    server.fail(503)
    model = model_for(server.base_url, max_retries=1)
    before = errors()
    try:
        with pytest.raises(ModelUnavailable) as error:
            await model.complete(REQUEST, timeout=5)
        with pytest.raises(ModelUnavailable):
            async for _ in model.stream(REQUEST, timeout=5):
                pass
    finally:
        await model.aclose()
    assert (error.value.code, error.value.reason) == (Code.UNAVAILABLE, "MODEL_UNAVAILABLE")
    assert len(server.chat_requests) == 4
    assert errors() == before + 2


async def test_a_retry_after_beyond_the_deadline_is_unavailable_at_once(
    server: FakeOpenAI,
) -> None:
    # Waiting 30 s as asked would pass the 5 s deadline: no retry, no wait for it.
    server.fail(429, retry_after="30")
    model = model_for(server.base_url, max_retries=2, backoff_max_s=60.0)
    try:
        with pytest.raises(ModelUnavailable) as error:
            await model.complete(REQUEST, timeout=5)
    finally:
        await model.aclose()
    assert "429" in error.value.message
    assert len(server.chat_requests) == 1


async def test_a_refusal_is_not_retried(server: FakeOpenAI) -> None:
    server.fail(400)
    model = model_for(server.base_url, max_retries=3)
    try:
        with pytest.raises(ModelFailed) as error:
            await model.complete(REQUEST, timeout=5)
    finally:
        await model.aclose()
    assert error.value.code is Code.FAILED_PRECONDITION and "400" in error.value.message
    assert len(server.chat_requests) == 1


async def test_an_unreachable_endpoint_is_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        model = model_for(f"http://127.0.0.1:{port}/v1", max_retries=2)
        try:
            with pytest.raises(ModelUnavailable):
                await model.complete(REQUEST, timeout=5)
        finally:
            await model.aclose()


async def test_the_deadline_is_model_timeout(server: FakeOpenAI) -> None:
    server.delay = 30
    model = model_for(server.base_url)
    try:
        with pytest.raises(ModelTimeout) as error:
            await model.complete(REQUEST, timeout=0.2)
        with pytest.raises(ModelTimeout):
            async for _ in model.stream(REQUEST, timeout=0.2):
                pass
    finally:
        await model.aclose()
    assert (error.value.code, error.value.reason) == (Code.DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED")


@pytest.mark.parametrize(
    ("payload", "kind"),
    [
        (b"not json", ModelFailed),
        (json.dumps({"choices": []}).encode(), ModelFailed),
        (json.dumps({"choices": [{"message": {"content": 5}}]}).encode(), ModelFailed),
    ],
)
async def test_unusable_answers_are_model_failed(
    server: FakeOpenAI, payload: bytes, kind: type[DomainError]
) -> None:
    server.respond_with(lambda body: RawReply(payload))
    model = model_for(server.base_url)
    try:
        with pytest.raises(kind):
            await model.complete(REQUEST, timeout=5)
    finally:
        await model.aclose()


async def test_an_answer_over_the_size_cap_is_model_failed(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(openai_adapter, "MAX_RESPONSE_BYTES", 1024)
    server.respond_with(lambda body: "x" * 2048)
    model = model_for(server.base_url)
    try:
        with pytest.raises(ModelFailed) as error:
            await model.complete(REQUEST, timeout=5)
        server.respond_with(lambda body: "x" * 512)
        assert (await model.complete(REQUEST, timeout=5)).text == "x" * 512
    finally:
        await model.aclose()
    assert "too large" in error.value.message


async def test_without_a_key_no_authorization_header_is_sent(server: FakeOpenAI) -> None:
    model = OpenAIChatModel(server.base_url, "fake-model", purpose="test")
    try:
        await model.complete(REQUEST, timeout=5)
        async for _ in model.stream(REQUEST, timeout=5):
            pass
    finally:
        await model.aclose()
    assert [r.headers.get("Authorization") for r in server.chat_requests] == [None, None]


async def test_a_stream_that_breaks_off_is_unavailable(server: FakeOpenAI) -> None:
    chunk = {"choices": [{"index": 0, "delta": {"content": "par"}, "finish_reason": None}]}
    events = f"data: {json.dumps(chunk)}\n\n".encode()
    server.respond_with(lambda body: RawReply(events, "text/event-stream"))
    model = model_for(server.base_url)
    seen: list[object] = []
    try:
        with pytest.raises(ModelUnavailable):
            async for item in model.stream(REQUEST, timeout=5):
                seen.append(item)
    finally:
        await model.aclose()
    assert seen == [ChatDelta("par")]


async def test_fake_server_embeddings_are_deterministic_unit_vectors(server: FakeOpenAI) -> None:
    async with httpx.AsyncClient() as client:
        first = await client.post(f"{server.base_url}/embeddings", json={"input": ["a", "b"]})
        again = await client.post(f"{server.base_url}/embeddings", json={"input": "a"})
    vectors = [item["embedding"] for item in first.json()["data"]]
    assert len(vectors) == 2 and len(vectors[0]) == server.embedding_dim
    assert again.json()["data"][0]["embedding"] == vectors[0]
    assert abs(sum(v * v for v in vectors[1]) - 1.0) < 1e-9


@pytest.mark.usefixtures("own_context")
async def test_chat_model_calls_beyond_the_queue_are_overloaded_and_waits_end_at_the_deadline() -> (
    None
):
    release = asyncio.Event()

    async def held(body: Any) -> str:
        await release.wait()
        return "done"

    async with fake_openai() as server:
        server.respond_with(held)
        model = OpenAIChatModel(
            server.base_url, "fake", max_retries=0, max_concurrent=1, max_queued=1
        )
        request = ChatRequest([ChatMessage("user", "hello")])
        try:
            running = asyncio.ensure_future(model.complete(request, timeout=30))
            await wait_for(holds(lambda: len(server.chat_requests) == 1))
            # One waits behind it; the wait ends at its deadline, its place given up.
            with pytest.raises(DomainError) as late:
                await model.complete(request, timeout=0.2)
            assert late.value.reason == "DEADLINE_EXCEEDED"
            waiting = asyncio.ensure_future(model.complete(request, timeout=30))
            await wait_for(holds(lambda: model._slots.waiting == 1))
            with pytest.raises(DomainError) as refused:
                await model.complete(request, timeout=30)
            assert refused.value.reason == "OVERLOADED"
            assert refused.value.metadata == {"resource": "model"}
            assert refused.value.retry_after_s is not None and refused.value.retry_after_s > 0
            assert len(server.chat_requests) == 1, "neither reached the model"
            release.set()
            assert [r.text for r in await asyncio.gather(running, waiting)] == ["done", "done"]
        finally:
            await model.aclose()
