"""The same services over the HTTP port (RUNIFOLD_HTTP_LISTEN): JSON as curl sends it,
Connect and gRPC-Web, from the same servicers, with the same errors, authentication and
metrics as gRPC.

The whole system runs in one real server (offline model, real PostgreSQL, real
embedding model); JSON calls go over real HTTP to its port: a turn, a compare-and-swap
conflict with its ErrorInfo, a memory upsert and search, the summary backlog; a turn
streamed over Connect and over gRPC-Web; malformed, oversized and unroutable requests.
With JWT authentication on (TranscriptService alone): the same refusals as gRPC, a
namespace filled from the identity, and an unauthenticated request answered before its
body is read.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest
from connectrpc.code import Code as ConnectCode
from connectrpc.errors import ConnectError
from connectrpc.protocol import ProtocolType
from prometheus_client import REGISTRY

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.common import stubs
from services.common.auth import AuthSettings
from services.common.http.settings import HttpSettings
from services.common.server import RunningServer, serving
from services.common.status import error_info
from services.transcript.component import TranscriptComponent
from tests.support.grpc_calls import authorization, jwt_token, user
from tests.support.http_calls import connect_call, post_json
from tests.support.http_calls import error_info as connect_error_info
from tests.support.settings import server_settings
from tests.support.stack import HTTP_ON, Stack, full_stack
from tests.support.waiting import wait_for

TRANSCRIPT = "runifold.transcript.v1.TranscriptService"
SUMMARY = "runifold.summary.v1.SummaryService"
MEMORY = "runifold.memory.v1.MemoryService"
AGENT = "runifold.agent.v1.AgentService"
STREAM = agent_pb.DESCRIPTOR.services_by_name["AgentService"].methods_by_name["StreamConversation"]
GET_CONVERSATION = transcript_pb.DESCRIPTOR.services_by_name["TranscriptService"].methods_by_name[
    "GetConversation"
]


@pytest.fixture(scope="module")
async def stack(
    shared_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with full_stack(
        shared_database_url, tmp_path_factory.mktemp("http"), None, http=HTTP_ON
    ) as running:
        yield running


async def created(stack: Stack, namespace: str) -> str:
    reply = await post_json(
        stack.http_url, f"{TRANSCRIPT}/CreateConversation", {"namespace": namespace}
    )
    assert reply.status == 200, reply.body
    assert reply.body["created"] is True
    return str(reply.body["conversation"]["conversationId"])


def read_cap(stack: Stack) -> int:
    assert stack.running.http is not None
    return stack.running.http.read_max_bytes


def handled(service: str, method: str, code: str) -> float:
    labels = {"grpc_type": "unary", "grpc_service": service, "grpc_method": method}
    return (
        REGISTRY.get_sample_value("grpc_server_handled_total", {**labels, "grpc_code": code}) or 0
    )


async def test_curl_runs_a_turn_and_reads_the_transcript(stack: Stack, namespace: str) -> None:
    """The README's curl line works as written, and a turn over JSON commits what gRPC
    then reads."""
    url = f"{stack.http_url}/{TRANSCRIPT}/CreateConversation"
    body = json.dumps({"namespace": namespace})
    out = await asyncio.to_thread(
        subprocess.run,
        ["curl", "-sS", "-H", "Content-Type: application/json", "-d", body, url],
        capture_output=True,
        text=True,
        check=True,
    )
    cid = json.loads(out.stdout)["conversation"]["conversationId"]
    turn = await post_json(
        stack.http_url,
        f"{AGENT}/RunConversation",
        {
            "namespace": namespace,
            "conversationId": cid,
            "input": [{"role": "ROLE_USER", "text": "hello over HTTP"}],
            "turnId": "turn-1",
        },
    )
    assert turn.status == 200, turn.body
    assert turn.body["conversationVersion"] == "1"  # int64 as a string: proto3 JSON
    assert turn.body["outcome"]["output"][0]["role"] == "ROLE_ASSISTANT"
    over_grpc = await stack.transcript.ListEntries(
        transcript_pb.ListEntriesRequest(namespace=namespace, conversation_id=cid)
    )
    assert over_grpc.entries[0].message.text == "hello over HTTP"
    listed = await post_json(
        stack.http_url,
        f"{TRANSCRIPT}/ListEntries",
        {"namespace": namespace, "conversationId": cid},
    )
    assert [e["sequence"] for e in listed.body["entries"]] == [
        str(e.sequence) for e in over_grpc.entries
    ]
    assert listed.headers["x-call-id"], "the call id comes back as on gRPC"


async def test_a_conflict_carries_its_error_info_as_over_grpc(stack: Stack, namespace: str) -> None:
    cid = await created(stack, namespace)
    append = {
        "namespace": namespace,
        "conversationId": cid,
        "messages": [{"role": "ROLE_USER", "text": "one"}],
    }
    first = await post_json(stack.http_url, f"{TRANSCRIPT}/AppendEntries", append)
    assert first.body["version"] == "1"
    before = handled(TRANSCRIPT, "AppendEntries", "ABORTED")
    stale = await post_json(
        stack.http_url, f"{TRANSCRIPT}/AppendEntries", {**append, "expectedVersion": "0"}
    )
    assert stale.status == 409
    assert stale.body["code"] == "aborted"
    info = stale.error_info
    assert info is not None and info.reason == "VERSION_CONFLICT"
    assert dict(info.metadata) == {"current_version": "1", "expected_version": "0"}
    # Each detail also reads as JSON, for people with curl.
    assert stale.body["details"][0]["debug"]["reason"] == "VERSION_CONFLICT"
    # The very error gRPC gives.
    with pytest.raises(grpc.aio.AioRpcError) as over_grpc:
        await stack.transcript.AppendEntries(
            transcript_pb.AppendEntriesRequest(
                namespace=namespace,
                conversation_id=cid,
                expected_version=0,
                messages=[user("one")],
                request_id="",
            )
        )
    assert over_grpc.value.code() == grpc.StatusCode.ABORTED
    assert over_grpc.value.details() == stale.body["message"]
    assert error_info(over_grpc.value) == info
    # Counted with the gRPC calls, under the gRPC code's name.
    assert handled(TRANSCRIPT, "AppendEntries", "ABORTED") - before == 2


async def test_a_memory_is_upserted_and_found_over_json(stack: Stack, namespace: str) -> None:
    cid = await created(stack, namespace)
    await post_json(
        stack.http_url,
        f"{TRANSCRIPT}/AppendEntries",
        {
            "namespace": namespace,
            "conversationId": cid,
            "messages": [{"role": "ROLE_USER", "text": "I moved to Lisbon last spring"}],
        },
    )
    upserted = await post_json(
        stack.http_url,
        f"{MEMORY}/UpsertMemory",
        {
            "namespace": namespace,
            "content": "The user lives in Lisbon.",
            "sources": [{"conversationId": cid, "fromSequence": "1", "throughSequence": "1"}],
        },
    )
    assert upserted.status == 200, upserted.body
    memory_id = upserted.body["memory"]["memoryId"]

    async def found() -> bool:
        reply = await post_json(
            stack.http_url,
            f"{MEMORY}/SearchMemories",
            {"namespace": namespace, "query": "where does the user live?", "limit": 4},
        )
        assert reply.status == 200, reply.body
        hits = reply.body.get("results", [])
        return bool(hits) and hits[0]["memory"]["memoryId"] == memory_id

    await wait_for(found, timeout=30)
    bad = await post_json(
        stack.http_url,
        f"{MEMORY}/SearchMemories",
        {"namespace": namespace, "query": "x", "limit": 257},
    )
    assert bad.status == 400 and bad.body["code"] == "invalid_argument"
    assert bad.error_info is not None and bad.error_info.reason == "INVALID_LIMIT"
    backlog = await post_json(stack.http_url, f"{SUMMARY}/GetBacklog", {"namespace": namespace})
    assert backlog.status == 200, backlog.body


@pytest.mark.parametrize("protocol", [ProtocolType.CONNECT, ProtocolType.GRPC_WEB])
async def test_a_turn_streams_over_connect_and_grpc_web(
    stack: Stack, namespace: str, protocol: ProtocolType
) -> None:
    events = await connect_call(
        stack.http_url,
        STREAM,
        agent_pb.StreamConversationRequest(
            namespace=namespace,
            conversation_id=str(uuid.uuid4()),
            create_if_missing=True,
            input=[user("stream me")],
        ),
        protocol=protocol,
        json=protocol is ProtocolType.CONNECT,
    )
    kinds = [event.WhichOneof("event") for event in events]
    assert kinds[-1] == "result" and "progress" in kinds
    assert events[-1].result.conversation_version == 1  # type: ignore[attr-defined]
    # A unary error over gRPC-Web: the same code and ErrorInfo.
    with pytest.raises(ConnectError) as missing:
        await connect_call(
            stack.http_url,
            GET_CONVERSATION,
            transcript_pb.GetConversationRequest(
                namespace=namespace, conversation_id=str(uuid.uuid4())
            ),
            protocol=protocol,
            json=False,
        )
    assert missing.value.code is ConnectCode.NOT_FOUND
    info = connect_error_info(missing.value)
    assert info is not None and info.reason == "CONVERSATION_NOT_FOUND"


async def test_requests_that_are_not_calls_are_refused_in_the_error_model(
    stack: Stack, namespace: str
) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        base = stack.http_url
        garbled = await client.post(
            f"{base}/{TRANSCRIPT}/AppendEntries",
            content=b'{"namespace": "' + namespace.encode() + b'", "expectedVersion": "SECRET"}',
            headers={"content-type": "application/json"},
        )
        assert garbled.status_code == 400
        body = garbled.json()
        assert body["details"][0]["debug"]["reason"] == "INVALID_REQUEST"
        # The field is named; the caller's value is not quoted back.
        assert "expectedVersion" in body["message"] and "SECRET" not in body["message"]
        not_json = await client.post(
            f"{base}/{TRANSCRIPT}/GetConversation",
            content=b"{",
            headers={"content-type": "application/json"},
        )
        assert not_json.status_code == 400
        assert not_json.json()["details"][0]["debug"]["reason"] == "INVALID_REQUEST"
        # Larger than the gRPC listener's receive cap: refused as gRPC refuses it.
        huge = await client.post(
            f"{base}/{TRANSCRIPT}/GetConversation",
            content=b" " * (read_cap(stack) + 1),
            headers={"content-type": "application/json"},
        )
        assert huge.status_code == 429 and huge.json()["code"] == "resource_exhausted"
        unknown_method = await client.post(
            f"{base}/{TRANSCRIPT}/NoSuchMethod",
            json={},
            headers={"content-type": "application/json"},
        )
        assert unknown_method.status_code == 404
        no_console = await client.get(f"{base}/")
        assert no_console.status_code == 404, "the console is off unless asked for"
        # HTTP/2 gRPC belongs on the gRPC port: refused, not crashed.
        grpc_over_h1 = await client.post(
            f"{base}/{TRANSCRIPT}/GetConversation",
            content=b"\x00\x00\x00\x00\x00",
            headers={"content-type": "application/grpc"},
        )
        assert grpc_over_h1.status_code == 415
        # No CORS unless configured: a page of another origin reads nothing.
        preflight = await client.options(
            f"{base}/{TRANSCRIPT}/GetConversation",
            headers={
                "origin": "https://elsewhere.example",
                "access-control-request-method": "POST",
            },
        )
        assert "access-control-allow-origin" not in preflight.headers


async def test_every_refusal_says_what_the_port_accepts(stack: Stack) -> None:
    """No Content-Type stays 415, an unknown method 404 and a GET 405, each now with a
    body that says what went wrong: a Connect error (ErrorInfo first) to a Connect
    client, the gRPC status in the headers to a gRPC-Web one, one line of text to curl
    or a browser."""
    get = f"{stack.http_url}/{TRANSCRIPT}/GetConversation"
    async with httpx.AsyncClient(timeout=30) as client:
        # curl -d without -H: no Content-Type at all, or a form's.
        bare = await client.post(get, content=b"{}")
        assert bare.status_code == 415 and bare.headers["accept-post"]
        assert bare.headers["content-type"].startswith("text/plain")
        assert bare.text.startswith("415 Unsupported Media Type: the request has no Content-Type")
        assert "application/json" in bare.text and "application/connect+json" in bare.text
        form = await client.post(
            get, content=b"{}", headers={"content-type": "application/x-www-form-urlencoded"}
        )
        assert form.status_code == 415
        assert "Content-Type application/x-www-form-urlencoded is not one" in form.text
        # A Connect client learns the same in Connect's error shape.
        connect = await client.post(get, content=b"{}", headers={"connect-protocol-version": "1"})
        assert connect.status_code == 415
        body = connect.json()
        assert body["code"] == "invalid_argument" and "application/proto" in body["message"]
        info = body["details"][0]["debug"]
        assert info["reason"] == "CONTENT_TYPE_UNSUPPORTED"
        assert "application/grpc-web+proto" in info["metadata"]["accepted"]
        # An unknown method: the service's methods are named.
        unknown = await client.post(
            f"{stack.http_url}/{TRANSCRIPT}/NoSuchMethod",
            json={},
            headers={"content-type": "application/json"},
        )
        assert unknown.status_code == 404 and unknown.json()["code"] == "unimplemented"
        assert "has no method NoSuchMethod" in unknown.json()["message"]
        info = unknown.json()["details"][0]["debug"]
        assert info["reason"] == "METHOD_NOT_FOUND"
        assert "GetConversation" in info["metadata"]["methods"].split(", ")
        # An unknown service: the port's services are named.
        nowhere = await client.post(
            f"{stack.http_url}/runifold.nothing.v1.NoService/Get",
            json={},
            headers={"content-type": "application/json"},
        )
        assert nowhere.status_code == 404
        services = nowhere.json()["details"][0]["debug"]["metadata"]["services"]
        assert TRANSCRIPT in services.split(", ") and TRANSCRIPT in nowhere.json()["message"]
        # The text form names the same (curl or a browser shows no metadata).
        browsed_home = await client.get(f"{stack.http_url}/runifold.nothing.v1.NoService/Get")
        assert browsed_home.text.startswith("404 Not Found: no such service on this port")
        assert TRANSCRIPT in browsed_home.text
        # A browser's GET: 405 in words; with Accept: application/json, Connect's shape.
        browsed = await client.get(get)
        assert browsed.status_code == 405 and browsed.headers["allow"] == "POST"
        assert browsed.text.startswith("405 Method Not Allowed: ")
        assert "GetConversation is called with POST, not GET" in browsed.text
        fetched = await client.get(get, headers={"accept": "application/json"})
        assert fetched.status_code == 405
        assert fetched.json()["details"][0]["debug"]["reason"] == "HTTP_METHOD_NOT_ALLOWED"
        # gRPC-Web reads the status from the headers.
        web = await client.post(
            f"{stack.http_url}/{TRANSCRIPT}/NoSuchMethod",
            content=b"\x00\x00\x00\x00\x00",
            headers={"content-type": "application/grpc-web+proto"},
        )
        assert web.status_code == 404 and web.headers["grpc-status"] == "12"
        assert "has no method NoSuchMethod" in web.headers["grpc-message"]


# -- authentication on ---------------------------------------------------------------

SECRET = "http-suite-secret-" + "s" * 32


@pytest.fixture(scope="module")
async def guarded(shared_database_url: str) -> AsyncIterator[RunningServer]:
    """TranscriptService alone with JWT authentication, CORS for one origin, the console."""
    async with serving(
        [TranscriptComponent()],
        server_settings(),
        database_url=shared_database_url,
        auth=AuthSettings(mode="jwt", jwt_secret=SECRET, jwt_audience="runifold"),
        http=HttpSettings(
            listen_address="127.0.0.1:0", cors_origins=("https://console.example",), console=True
        ),
    ) as running:
        yield running


def bearer(*namespaces: str) -> dict[str, str]:
    return dict(authorization(jwt_token(SECRET, *namespaces)))


async def test_authentication_and_namespaces_as_over_grpc(
    guarded: RunningServer, namespace: str
) -> None:
    assert guarded.http is not None
    base, method = guarded.http.url, f"{TRANSCRIPT}/CreateConversation"
    anonymous = await post_json(base, method, {"namespace": namespace})
    assert anonymous.status == 401 and anonymous.body["code"] == "unauthenticated"
    assert anonymous.error_info is not None and anonymous.error_info.reason == "UNAUTHENTICATED"
    forged = await post_json(
        base, method, {"namespace": namespace}, {"authorization": "Bearer not.a.token"}
    )
    assert forged.status == 401
    other = await post_json(base, method, {"namespace": namespace}, bearer(namespace + "-other"))
    assert other.status == 403 and other.body["code"] == "permission_denied"
    assert other.error_info is not None and other.error_info.reason == "NAMESPACE_NOT_GRANTED"
    # An empty namespace is the identity's one namespace, as on gRPC.
    own = await post_json(base, method, {}, bearer(namespace))
    assert own.status == 200 and own.body["conversation"]["namespace"] == namespace
    async with grpc.aio.insecure_channel(guarded.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as over_grpc:
            await stubs.transcript(channel).CreateConversation(
                transcript_pb.CreateConversationRequest(namespace=namespace),
                metadata=tuple(bearer(namespace + "-other").items()),
            )
    assert over_grpc.value.details() == other.body["message"]
    assert error_info(over_grpc.value) == other.error_info


async def test_an_unauthenticated_request_is_answered_before_its_body_is_read(
    guarded: RunningServer,
) -> None:
    """A caller without credentials announces 8 MiB and sends a few bytes: the refusal
    comes at once, while the rest of its body has not even been sent."""
    assert guarded.http is not None
    host, _, port = guarded.http.address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            (
                f"POST /{TRANSCRIPT}/CreateConversation HTTP/1.1\r\nHost: {host}\r\n"
                "Content-Type: application/json\r\n"
                f"Content-Length: {8 * 1024 * 1024}\r\n\r\n" + '{"namespace": "'
            ).encode()
        )
        await writer.drain()
        async with asyncio.timeout(30):
            status = await reader.readline()
        assert status.startswith(b"HTTP/1.1 401"), status
    finally:
        writer.close()


async def test_cors_answers_only_the_configured_origin(guarded: RunningServer) -> None:
    assert guarded.http is not None
    url = f"{guarded.http.url}/{TRANSCRIPT}/GetConversation"
    async with httpx.AsyncClient(timeout=30) as client:
        for origin, allowed in (("https://console.example", True), ("https://evil.example", False)):
            preflight = await client.options(
                url,
                headers={
                    "origin": origin,
                    "access-control-request-method": "POST",
                    "access-control-request-headers": "authorization,content-type",
                },
            )
            assert (preflight.headers.get("access-control-allow-origin") == origin) is allowed


async def test_the_console_learns_the_identity_only_from_the_caller_s_credentials(
    guarded: RunningServer, namespace: str
) -> None:
    """The console's session: who the bearer is and what it grants; its counters only for
    an authenticated caller."""
    assert guarded.http is not None
    base = guarded.http.url
    async with httpx.AsyncClient(timeout=30) as client:
        anonymous = (await client.get(f"{base}/console/api/session")).json()
        assert anonymous["auth"] == "jwt" and anonymous["identity"] is None
        assert anonymous["identity_error"]["reason"] == "UNAUTHENTICATED"
        assert anonymous["actions"] is False
        signed = await client.get(f"{base}/console/api/session", headers=bearer(namespace))
        identity = signed.json()["identity"]
        assert identity["namespaces"] == [namespace] and identity["all"] is False
        refused = await client.get(f"{base}/console/api/metrics")
        assert refused.status_code == 401 and refused.json()["reason"] == "UNAUTHENTICATED"
        counters = await client.get(f"{base}/console/api/metrics", headers=bearer(namespace))
        assert counters.status_code == 200
        assert "summary_jobs_depth" in counters.json()["values"]
        page = await client.get(f"{base}/")
        assert page.status_code == 200 and "console.js" in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
