"""Hostile input: hypothesis over every RPC of every service (from the descriptors).

Requests are generated from each RPC's input descriptor: random, oversized
(up to a few MiB) and unicode edge-case strings (NUL, RTL overrides,
zero-width joiners, combining marks, 4-byte emoji), negative and extreme
integers, invalid UUIDs, unknown enum values, out-of-range timestamps and
durations, deeply nested JSON, page tokens that were tampered with or come
from another namespace, and huge repeated and map fields (within the 16 MiB
transport cap). Fields that name resources point, often enough, at a real
world (a conversation with entries, a summary, memories) so that requests
get past validation and reach the stores.

Every call must end in OK or a canonical error with an UPPER_SNAKE ErrorInfo
reason and a message without stack trace or SQL: never INTERNAL, UNKNOWN,
UNAVAILABLE or a deadline. A failed call writes nothing: every row of the
namespaces it named is unchanged, with the exceptions the contract states (a
turn refused with SUMMARY_REQUIRED or SUMMARY_BACKLOG enqueues a job;
summary passes committed before a failure stay committed, and the error says
how many; a turn with create_if_missing creates its conversation only when it
commits, so a failed one leaves nothing). Raw bytes that are not a valid message
(corrupt wire format, invalid UTF-8 in a string field) are INVALID_ARGUMENT /
INVALID_REQUEST. Afterwards the server is SERVING and a normal call works.

The runs are derandomized (reproducible in CI) and bounded: EXAMPLES_PER_RPC
generated requests and RAW_EXAMPLES_PER_RPC random byte strings per RPC, plus
the fixed undecodable bodies.
"""

from __future__ import annotations

import base64
import functools
import re
import string
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.common import stubs
from services.common.validation import NAMESPACE_PATTERN
from tests.support.stack import Stack
from tests.system.security.support import (
    RPCS,
    Metadata,
    Outcome,
    Rpc,
    bearer,
    changed_tables,
    invoke,
    must,
    namespace_rows,
)
from tests.system.security.worlds import World, build_world

EXAMPLES_PER_RPC = 16
RAW_EXAMPLES_PER_RPC = 5
# Requests stay under the server's 16 MiB receive limit (a bigger one is refused
# by the transport, before any service code runs).
MAX_REQUEST_BYTES = 15 * 1024 * 1024
ANYONE: Metadata = bearer("*")
Rows = dict[str, list[tuple[Any, ...]]]

FORBIDDEN = {
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
}
REASON = re.compile(r"[A-Z][A-Z0-9_]*")
LEAKS = ("Traceback", 'File "', "psycopg", "SELECT ", "INSERT ", "UPDATE ", "Exception", "Error(")

HYPOTHESIS = settings(
    max_examples=EXAMPLES_PER_RPC,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)

# --- hostile values --------------------------------------------------------------------

EDGE_STRINGS = [
    "\x00",
    "a\x00b",
    "\u200f",  # right-to-left mark
    "\u202e",  # right-to-left override
    "\u200d",  # zero-width joiner
    "\u200b",  # zero-width space
    "e\u0301\u0301\u0301",  # combining marks
    "\U0001f600",  # 4-byte emoji
    "\U0001f469\u200d\U0001f4bb",  # emoji joined by ZWJ
    "\ufeff",
    "\uffff",
    "\U0010ffff",
    "\r\n",
    "\t",
    " ",
    "%s%n%x",
    "'; DROP TABLE transcript.entries; --",
    "../../../etc/passwd",
    "\\",
    '"',
    "\x7f",
]
LONG_UNITS = ["a", "\u202e", "\U0001f600", "e\u0301", "\x00", "["]
LONG_BYTES = [129, 1025, 4097, 65537, 262145, 1 << 20, 3 << 20]
DEEP_JSON = ["[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000, "[" * 5000]


def _long(unit: str, size: int) -> str:
    return unit * max(1, size // len(unit.encode()))


long_strings = st.builds(_long, st.sampled_from(LONG_UNITS), st.sampled_from(LONG_BYTES))
hostile_text = st.one_of(
    st.text(max_size=24),
    st.lists(st.sampled_from(EDGE_STRINGS), min_size=1, max_size=8).map("".join),
    long_strings,
    st.sampled_from(["", " ", "\t\n"]),
)
plain_text = st.text(alphabet=string.ascii_letters + " ", min_size=1, max_size=40)
printable_ids = st.text(alphabet=string.printable, min_size=1, max_size=130)
uuidish = st.one_of(
    st.uuids().map(str),
    st.uuids().map(lambda u: str(u).upper()),
    st.uuids().map(lambda u: u.hex),
    st.uuids().map(lambda u: "{" + str(u) + "}"),
    st.uuids().map(lambda u: "urn:uuid:" + str(u)),
    st.uuids().map(lambda u: str(u)[:-1]),
    st.uuids().map(lambda u: str(u) + "\x00"),
    st.uuids().map(lambda u: " " + str(u)),
    st.sampled_from(
        ["00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff"]
    ),
)
valid_namespaces = st.from_regex(NAMESPACE_PATTERN, fullmatch=True)
# JSON that Python's json module takes and PostgreSQL's jsonb refuses (issue 27).
JSONB_REFUSED = [
    '{"a": "\\ud800"}',
    '{"a": "\\udc00"}',
    '{"a": 1e1000000}',
    '{"a": -1e1000000}',
    '{"a": "\\u0000"}',
    '{"a": ' + "[" * 200 + "]" * 200 + "}",
]
json_texts = st.one_of(
    st.sampled_from(['{"type": "object"}', "{}", "[]", "null", "1e999", '{"a": NaN}']),
    st.sampled_from(DEEP_JSON),
    st.sampled_from(JSONB_REFUSED),
    hostile_text,
)


@dataclass(frozen=True)
class Ref:
    """A value of the world under test, resolved when the example runs."""

    name: str


@dataclass(frozen=True)
class Tampered:
    """A page token of the world, altered: `op` at character `at`."""

    of: str
    op: str
    at: int


@dataclass(frozen=True)
class Copies:
    """A repeated field holding `count` copies of one element."""

    item: Any
    count: int


@dataclass(frozen=True)
class ManyKeys:
    """A map field with `count` distinct keys, all mapped to `value`."""

    value: Any
    count: int


TOKENS = ["conversations_token", "entries_token", "memories_token"]
page_tokens = st.one_of(
    st.sampled_from(TOKENS).map(Ref),
    st.sampled_from(TOKENS).map(lambda t: Ref("foreign_" + t)),
    st.builds(
        Tampered,
        st.sampled_from(TOKENS),
        st.sampled_from(["flip", "truncate", "append", "swapcase", "pad"]),
        st.integers(0, 200),
    ),
    st.binary(max_size=64).map(lambda b: base64.urlsafe_b64encode(b).decode()),
    hostile_text,
)


def _ints(bits: int, unsigned: bool = False) -> st.SearchStrategy[int]:
    low, high = (0, 2**bits - 1) if unsigned else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    edges = [low, high, low + 1, high - 1, -1, 0, 1, 2**31 - 1, 2**31, 2**53 + 1, -(2**31)]
    return st.one_of(
        st.integers(max(low, -2), 10),
        st.sampled_from([e for e in edges if low <= e <= high]),
        st.integers(low, high),
    )


_INTS: dict[int, st.SearchStrategy[int]] = {
    FieldDescriptor.TYPE_INT32: _ints(32),
    FieldDescriptor.TYPE_SINT32: _ints(32),
    FieldDescriptor.TYPE_SFIXED32: _ints(32),
    FieldDescriptor.TYPE_INT64: _ints(64),
    FieldDescriptor.TYPE_SINT64: _ints(64),
    FieldDescriptor.TYPE_SFIXED64: _ints(64),
    FieldDescriptor.TYPE_UINT32: _ints(32, unsigned=True),
    FieldDescriptor.TYPE_FIXED32: _ints(32, unsigned=True),
    FieldDescriptor.TYPE_UINT64: _ints(64, unsigned=True),
    FieldDescriptor.TYPE_FIXED64: _ints(64, unsigned=True),
}
_FLOATS = st.one_of(
    st.floats(width=32, allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, float("nan"), float("inf"), float("-inf")]),
)


def _hostile_string(name: str) -> st.SearchStrategy[Any]:
    """Hostile strings, and by what the field names: real ids of the world now and then."""
    if name == "namespace":
        return st.one_of(st.just(Ref("namespace")), valid_namespaces, hostile_text, st.just(""))
    if name.endswith("conversation_id"):
        return st.one_of(st.just(Ref("other_conversation_id")), uuidish, hostile_text)
    if name == "memory_id":
        return st.one_of(uuidish, hostile_text)
    if name == "page_token":
        return page_tokens
    if name in ("request_id", "turn_id"):
        return st.one_of(st.just(Ref(name)), printable_ids, hostile_text)
    if name.endswith("json") or name.endswith("json_schema"):
        return json_texts
    return hostile_text


def _plausible_string(name: str) -> st.SearchStrategy[Any]:
    """Values that pass validation, mostly, and name the world's resources."""
    if name == "namespace":
        return st.just(Ref("namespace"))
    if name.endswith("conversation_id"):
        return st.just(Ref("conversation_id"))
    if name == "memory_id":
        return st.one_of(st.just(Ref("memory_id")), st.just(""))
    if name == "page_token":
        return st.one_of(st.just(""), st.sampled_from(TOKENS).map(Ref))
    if name in ("request_id", "turn_id"):
        return st.one_of(st.uuids().map(str), st.just(Ref(name)))
    if name == "query":
        return st.one_of(st.just(Ref("memory_content")), plain_text)
    if name == "name":
        return st.from_regex(r"[A-Za-z0-9_]{1,20}", fullmatch=True)
    if name in ("id", "tool_call_id"):
        return st.from_regex(r"call_[a-z0-9]{1,8}", fullmatch=True)
    if name.endswith("json") or name.endswith("json_schema"):
        return st.sampled_from(['{"type": "object"}', "{}"])
    return plain_text


def _plausible_int(name: str) -> st.SearchStrategy[int]:
    if name in ("window", "summary_batch", "limit", "memory_limit", "page_size"):
        return st.integers(0, 8)
    if "sequence" in name or name.startswith("expected_"):
        return st.integers(0, 8)
    if name == "max_summary_passes":
        return st.integers(0, 4)
    if name.startswith("max_"):
        return st.one_of(st.just(0), st.integers(1, 100_000))
    return st.integers(0, 100)


def _scalar(field: FieldDescriptor, hostile: bool) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        return _hostile_string(field.name) if hostile else _plausible_string(field.name)
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return _FLOATS if hostile else st.floats(0, 1, width=32)
    if kind == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        known = [v.number for v in field.enum_type.values]
        if not hostile:
            return st.sampled_from([n for n in known if n] or known)
        return st.one_of(
            st.sampled_from(known), st.sampled_from([-1, max(known) + 1, 99, 2**31 - 1, -(2**31)])
        )
    return _INTS[kind] if hostile else _plausible_int(field.name)


def _message_type(field: Any) -> Descriptor:
    descriptor: Descriptor | None = field.message_type
    assert descriptor is not None, field.full_name
    return descriptor


def _is_map(field: Any) -> bool:
    return field.type == FieldDescriptor.TYPE_MESSAGE and bool(
        _message_type(field).GetOptions().map_entry
    )


# Plausible values of the well-known types (a future time, a positive duration).
_WELL_KNOWN: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "google.protobuf.Timestamp": st.fixed_dictionaries(
        {"seconds": st.integers(2_000_000_000, 3_000_000_000), "nanos": st.integers(0, 10**9 - 1)}
    ),
    "google.protobuf.Duration": st.fixed_dictionaries({"seconds": st.integers(1, 10**7)}),
}


def _plausible_item(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        message = _message_type(field)
        known = _WELL_KNOWN.get(message.full_name)
        return known if known is not None else requests(message, depth + 1, 0)
    return _scalar(field, hostile=False)


def _plausible(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if _is_map(field):
        value = _scalar(_message_type(field).fields_by_name["value"], hostile=False)
        return st.dictionaries(plain_text, value, max_size=2)
    item = _plausible_item(field, depth)
    return st.lists(item, min_size=1, max_size=3) if field.is_repeated else item


def _hostile(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if _is_map(field):
        value = _scalar(_message_type(field).fields_by_name["value"], hostile=True)
        mapping = st.dictionaries(st.one_of(plain_text, hostile_text), value, max_size=3)
        if depth:
            return mapping
        return st.one_of(mapping, st.builds(ManyKeys, value, st.sampled_from([33, 1000, 20_000])))
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        message = _message_type(field)
        # A plausible message with one hostile field inside, or hostile throughout.
        item = st.one_of(requests(message, depth + 1, 1), fully_hostile(message, depth + 1))
    else:
        item = _scalar(field, hostile=True)
    if not field.is_repeated:
        return item
    if depth:
        return st.lists(item, max_size=3)
    return st.one_of(
        st.lists(item, max_size=3),
        st.just([]),
        st.builds(
            Copies,
            st.one_of(_plausible_item(field, depth), item),
            st.sampled_from([65, 257, 1000, 20_000]),
        ),
    )


# Plausible messages where the generic rule would mostly make invalid ones.
_PLAUSIBLE_MESSAGES: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "runifold.common.v1.Message": st.fixed_dictionaries(
        {"role": st.sampled_from([1, 1, 2]), "text": plain_text}
    ),
}


@functools.cache
def requests(
    descriptor: Descriptor, depth: int = 0, max_hostile: int = 2
) -> st.SearchStrategy[dict[str, Any]]:
    """A plausible request (it names the world's resources and passes most checks)
    in which up to `max_hostile` fields, chosen at random, are hostile. The
    namespace stays the world's (fully_hostile covers it)."""
    fields = list(descriptor.fields)
    if depth > 4 or not fields:
        return st.just({})
    base = _PLAUSIBLE_MESSAGES.get(descriptor.full_name)
    candidates = [f.name for f in fields if f.name != "namespace"]

    @st.composite
    def draw(draw: st.DrawFn) -> dict[str, Any]:
        chosen: set[str] = set()
        if max_hostile and candidates:
            chosen = draw(st.sets(st.sampled_from(candidates), max_size=max_hostile))
        template: dict[str, Any] = dict(draw(base)) if base is not None else {}
        for field in fields:
            if field.name in chosen:
                template[field.name] = draw(_hostile(field, depth))
            elif base is None:
                template[field.name] = draw(_plausible(field, depth))
        return template

    return draw()


@functools.cache
def fully_hostile(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """Every field absent or hostile."""
    if depth > 4:
        return st.just({})
    fields = {
        field.name: st.one_of(st.none(), _hostile(field, depth)) for field in descriptor.fields
    }
    return st.fixed_dictionaries(fields).map(
        lambda drawn: {k: v for k, v in drawn.items() if v is not None}
    )


def templates(descriptor: Descriptor) -> st.SearchStrategy[dict[str, Any]]:
    """Mostly plausible requests with a hostile field or two; now and then, hostile throughout."""
    plausible, hostile = requests(descriptor), fully_hostile(descriptor)
    # one_of would weigh the two alike: one in five is hostile throughout.
    return st.integers(0, 4).flatmap(lambda pick: hostile if pick == 0 else plausible)


# --- turning a template into a request --------------------------------------------------


@dataclass
class Env:
    """The world under test (rebuilt after a call changed it) and a foreign one."""

    stack: Stack
    database_url: str
    foreign: World
    world: World | None = None
    dirty: bool = True

    async def current(self) -> World:
        if self.dirty or self.world is None:
            namespace = f"hostile-{uuid.uuid4().hex[:12]}"
            self.world = await build_world(
                self.stack.channel, namespace, ANYONE, with_turn=False, with_job=False
            )
            self.dirty = False
        return self.world


def _tamper(token: str, op: str, at: int) -> str:
    at = at % max(1, len(token))
    if op == "flip":
        swapped = "A" if token[at] != "A" else "B"
        return token[:at] + swapped + token[at + 1 :]
    if op == "truncate":
        return token[:at]
    if op == "append":
        return token + "AAAA"
    if op == "swapcase":
        return token.swapcase()
    return token + "=" * (at % 5)


def resolve(value: Any, world: World, foreign: World) -> Any:
    if isinstance(value, Ref):
        if value.name.startswith("foreign_"):
            return getattr(foreign, value.name.removeprefix("foreign_"))
        if value.name == "memory_id":
            return world.memory_ids[0]
        return getattr(world, value.name)
    if isinstance(value, Tampered):
        return _tamper(getattr(world, value.of), value.op, value.at)
    return value


def materialize(
    cls: type[Message], template: Mapping[str, Any], world: World, foreign: World
) -> Message:
    """The request a template describes, with world references filled in."""
    message = cls()
    fields = cls.DESCRIPTOR.fields_by_name
    for name, value in template.items():
        field = fields[name]
        target = getattr(message, name)
        if _is_map(field):
            if isinstance(value, ManyKeys):
                item = resolve(value.value, world, foreign)
                if value.count * (len(str(item)) + 16) > MAX_REQUEST_BYTES:
                    reject()
                target.update({f"key-{i}": item for i in range(value.count)})
            else:
                target.update(
                    {
                        resolve(k, world, foreign): resolve(v, world, foreign)
                        for k, v in value.items()
                    }
                )
        elif field.is_repeated:
            items, count = (value.item, value.count) if isinstance(value, Copies) else (value, 1)
            items = [items] if isinstance(value, Copies) else items
            for item in items:
                if field.type == FieldDescriptor.TYPE_MESSAGE:
                    element_class = message_factory.GetMessageClass(_message_type(field))
                    element = materialize(element_class, item, world, foreign)
                    if count * element.ByteSize() > MAX_REQUEST_BYTES:
                        reject()
                    target.extend([element] * count)
                else:
                    element = resolve(item, world, foreign)
                    # A scalar's wire size is at least a byte; a string's, its length.
                    if count * (len(str(element)) + 1) > MAX_REQUEST_BYTES:
                        reject()
                    target.extend([element] * count)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            target.CopyFrom(materialize(type(target), value, world, foreign))
        else:
            setattr(message, name, resolve(value, world, foreign))
    return message


# --- what every answer must look like -----------------------------------------------------


def check_answer(rpc: Rpc, outcome: Outcome, request: Any) -> None:
    shown = f"{rpc.id}: {outcome.describe()}\nrequest: {str(request)[:600]}"
    assert outcome.code not in FORBIDDEN, shown
    if outcome.ok:
        return
    assert outcome.reason is not None and REASON.fullmatch(outcome.reason), shown
    leaked = [word for word in LEAKS if word in outcome.details]
    assert not leaked, f"{shown}\nthe message reveals internals: {leaked}"


def _allowed_effects(rpc: Rpc, request: Any, outcome: Outcome) -> set[str]:
    """Tables a failed call may still change, as the contract says."""
    allowed = set()
    turn = rpc.name in ("RunConversation", "StreamConversation")
    if turn and outcome.reason in ("SUMMARY_REQUIRED", "SUMMARY_BACKLOG"):
        # The refused turn enqueues background summarization, which a worker may
        # already have run (committing a summary) before the state is read again.
        allowed |= {"summary.jobs", "summary.summaries", "summary.summary_history"}
    if outcome.error_metadata.get("passes", "0") != "0":
        allowed |= {"summary.summaries", "summary.summary_history"}  # passes stay committed
    return allowed


def check_no_partial_write(
    rpc: Rpc, request: Any, outcome: Outcome, before: Rows, after: Rows
) -> None:
    changed = set(changed_tables(before, after))
    if outcome.ok or not changed:
        return
    allowed = _allowed_effects(rpc, request, outcome)
    assert changed <= allowed, (
        f"{rpc.id} failed ({outcome.describe()}) but wrote {sorted(changed - allowed)}\n"
        f"request: {str(request)[:600]}"
    )


def _namespaces_named(request: Message, world: World) -> list[str]:
    named = getattr(request, "namespace", "")
    others = [named] if named != world.namespace and NAMESPACE_PATTERN.fullmatch(named) else []
    return [world.namespace, *others]


async def _rows(env: Env, namespaces: list[str]) -> dict[str, Rows]:
    return {ns: await namespace_rows(env.database_url, ns) for ns in namespaces}


@pytest.fixture(scope="module")
async def foreign(stack: Stack) -> World:
    """Another namespace, whose page tokens are offered to the world's listings."""
    namespace = f"hostile-foreign-{uuid.uuid4().hex[:8]}"
    return await build_world(stack.channel, namespace, ANYONE, with_turn=False, with_job=False)


@pytest.fixture
def env(stack: Stack, shared_database_url: str, foreign: World) -> Env:
    return Env(stack, shared_database_url, foreign)


# --- the suites -------------------------------------------------------------------------


@pytest.mark.parametrize("rpc", RPCS, ids=[rpc.id for rpc in RPCS])
@HYPOTHESIS
@given(data=st.data())
async def test_hostile_requests(rpc: Rpc, env: Env, data: st.DataObject) -> None:
    template = data.draw(templates(rpc.input), label="request")
    world = await env.current()
    request = materialize(rpc.request, template, world, env.foreign)
    if request.ByteSize() > MAX_REQUEST_BYTES:
        reject()
    namespaces = _namespaces_named(request, world)
    before = await _rows(env, namespaces)
    outcome = await invoke(env.stack.channel, rpc, request, ANYONE)
    check_answer(rpc, outcome, request)
    after = await _rows(env, namespaces)
    for namespace in namespaces:
        check_no_partial_write(rpc, request, outcome, before[namespace], after[namespace])
    if before != after:
        env.dirty = True  # start the next example from a fresh world


def _invalid_utf8_requests(descriptor: Descriptor) -> list[bytes]:
    """For every string field: a request whose value is not UTF-8."""
    bodies = []
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_STRING:
            tag = (field.number << 3) | 2
            for bad in (b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"ok\xf4\x90\x80\x80"):
                bodies.append(_varint(tag) + _varint(len(bad)) + bad)
    return bodies


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


CORRUPT = [
    b"\xff\xff\xff\xff",
    b"\x0a\xff\xff\xff\xff\x0f",  # a length beyond the buffer
    b"\x0a\x05abc",  # truncated
    b"\x7b" * 200,  # groups opened, never closed
    b"\x7b" * 20_000 + b"\x7c" * 20_000,  # nesting beyond the parser's limit
    b"\x08" + b"\xff" * 11,  # an over-long varint
    b"\x07",  # field 0
]


@pytest.mark.parametrize("rpc", RPCS, ids=[rpc.id for rpc in RPCS])
async def test_undecodable_bytes_are_invalid_argument(rpc: Rpc, stack: Stack) -> None:
    for body in _invalid_utf8_requests(rpc.input) + CORRUPT:
        outcome = await invoke(stack.channel, rpc, body, ANYONE)
        assert outcome.code == grpc.StatusCode.INVALID_ARGUMENT, (
            f"{rpc.id} {body[:40]!r}: {outcome.describe()}"
        )
        assert outcome.reason == "INVALID_REQUEST", f"{rpc.id}: {outcome.describe()}"


@pytest.mark.parametrize("rpc", RPCS, ids=[rpc.id for rpc in RPCS])
@settings(HYPOTHESIS, max_examples=RAW_EXAMPLES_PER_RPC)
@given(body=st.binary(max_size=256))
async def test_random_bytes(rpc: Rpc, stack: Stack, body: bytes) -> None:
    """Whatever the bytes decode to (or not), the answer is a canonical one."""
    outcome = await invoke(stack.channel, rpc, body, ANYONE)
    check_answer(rpc, outcome, body)


async def test_the_server_still_serves(stack: Stack, foreign: World) -> None:
    health = await stubs.health(stack.channel).Check(health_pb2.HealthCheckRequest())
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    got = await must(
        stack.channel,
        "TranscriptService.GetConversation",
        transcript_pb.GetConversationRequest(
            namespace=foreign.namespace, conversation_id=foreign.conversation_id
        ),
        ANYONE,
    )
    assert got.conversation.last_sequence == foreign.last_sequence
