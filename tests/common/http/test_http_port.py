"""The HTTP port's settings (RUNIFOLD_HTTP_*, RUNIFOLD_CONSOLE*) and its RPC cap."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from services.common.http.listener import Router
from services.common.http.settings import HttpSettings
from services.common.settings import SettingsError


def test_a_service_serves_no_http_unless_asked() -> None:
    assert HttpSettings.from_env({}) == HttpSettings()
    assert not HttpSettings.from_env({}).enabled
    asked = HttpSettings.from_env({"RUNIFOLD_HTTP_LISTEN": "127.0.0.1:9000"})
    assert asked.listen_address == "127.0.0.1:9000" and not asked.console


def test_the_all_in_one_server_serves_the_console_on_loopback_by_default() -> None:
    default = HttpSettings.from_env({}, all_in_one=True)
    assert default.listen_address == "127.0.0.1:8080"
    assert default.console and not default.console_actions and not default.cors_origins
    off = HttpSettings.from_env({"RUNIFOLD_HTTP_LISTEN": "off"}, all_in_one=True)
    assert off.listen_address is None
    quiet = HttpSettings.from_env({"RUNIFOLD_CONSOLE": "0"}, all_in_one=True)
    assert quiet.enabled and not quiet.console


def test_cors_origins_are_exact_origins_or_star() -> None:
    env = {"RUNIFOLD_HTTP_CORS_ORIGINS": "https://a.example, http://127.0.0.1:3000"}
    assert HttpSettings.from_env(env).cors_origins == ("https://a.example", "http://127.0.0.1:3000")
    assert HttpSettings.from_env({"RUNIFOLD_HTTP_CORS_ORIGINS": "*"}).cors_origins == ("*",)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RUNIFOLD_HTTP_LISTEN", "8080"),
        ("RUNIFOLD_HTTP_CORS_ORIGINS", "https://a.example/path"),
        ("RUNIFOLD_HTTP_CORS_ORIGINS", "*.example"),
        ("RUNIFOLD_CONSOLE", "maybe"),
        ("RUNIFOLD_CONSOLE_ACTIONS", "2"),
    ],
)
def test_a_bad_value_fails_naming_its_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        HttpSettings.from_env({name: value})


async def test_calls_beyond_the_rpc_cap_are_refused_before_they_are_read() -> None:
    """RUNIFOLD_MAX_CONCURRENT_RPCS on the HTTP port: one call more is RESOURCE_EXHAUSTED
    (Connect's 429, grpc's words) without its body being read; then served again."""
    release = asyncio.Event()
    entered = asyncio.Event()
    reads: list[str] = []

    async def service(scope: dict[str, Any], receive: Any, send: Any) -> None:
        reads.append(scope["path"])
        entered.set()
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    router = Router({"runifold.x.v1.X": service}, None, max_rpcs=1)

    async def call(path: str) -> tuple[int, bytes]:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            raise AssertionError("the body of a refused call is never read")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "path": path, "method": "POST", "headers": []}
        await router(scope, receive, send)
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

    first = asyncio.ensure_future(call("/runifold.x.v1.X/A"))
    await entered.wait()
    status, body = await call("/runifold.x.v1.X/B")
    assert status == 429
    assert json.loads(body) == {
        "code": "resource_exhausted",
        "message": "Concurrent RPC limit exceeded!",
    }
    release.set()
    assert (await first)[0] == 200
    assert (await call("/runifold.x.v1.X/C"))[0] == 200
    assert reads == ["/runifold.x.v1.X/A", "/runifold.x.v1.X/C"]
