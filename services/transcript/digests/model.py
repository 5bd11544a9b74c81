"""Digests: each append of a conversation is bound to the ones before it by a SHA-256
chain, so that anyone holding a conversation's head digest can tell whether an entry was
changed, removed or reordered, or a commit time changed. Pure rules: no I/O.

    digest(v) = SHA-256(digest(v - 1) || canonical(v))

with 32 zero bytes before the first append of a chain (version 1; a fork's chain goes on
from its source's digest at the fork point). canonical(v), where int is 8 bytes
big-endian two's complement and str is int(length in bytes) then its UTF-8 bytes:

    int(version) int(first_sequence) int(last_sequence)
    int(commit_time: microseconds since 1970-01-01T00:00:00Z)
    int(number of retracted sequences) int(sequence)...          (increasing)
    for each entry, in sequence order:
      int(role: 1 user, 2 assistant, 3 tool) str(text)
      int(number of tool calls) (str(id) str(name) str(arguments_json))...
      str(tool_call_id)
      int(number of metadata entries) (str(key) str(value))...  (keys in UTF-8 byte order)
      str(native_json)

docs/transcript.md says the same; the clients' verify_conversation() recomputes it. The
append statement computes the chain step in SQL (the previous digest is on the row it
updates): the body (from the retractions on) is made here, once per append.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from services.common.domain import Message

# Before the first append of a chain.
GENESIS = bytes(32)

_INT = struct.Struct(">q")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _str(value: str) -> bytes:
    encoded = value.encode("utf-8")
    return _INT.pack(len(encoded)) + encoded


def message_bytes(message: Message) -> bytes:
    """The canonical bytes of one entry's message."""
    parts = [_INT.pack(int(message.role)), _str(message.text), _INT.pack(len(message.tool_calls))]
    for call in message.tool_calls:
        parts += [_str(call.id), _str(call.name), _str(call.arguments_json)]
    parts.append(_str(message.tool_call_id))
    items = sorted(message.metadata.items(), key=lambda item: item[0].encode("utf-8"))
    parts.append(_INT.pack(len(items)))
    for key, value in items:
        parts += [_str(key), _str(value)]
    parts.append(_str(message.native_json))
    return b"".join(parts)


def body(retracted: Sequence[int], messages: Iterable[Message]) -> bytes:
    """The canonical bytes of an append after its header: its retractions and messages."""
    parts = [_INT.pack(len(retracted)), *(_INT.pack(s) for s in sorted(retracted))]
    parts += [message_bytes(m) for m in messages]
    return b"".join(parts)


def microseconds(moment: datetime) -> int:
    """A commit time as the chain holds it: whole microseconds since the Unix epoch."""
    delta = moment - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def chain_step(
    previous: bytes,
    version: int,
    first_sequence: int,
    last_sequence: int,
    commit_time: datetime,
    append_body: bytes,
) -> bytes:
    """digest(v) from digest(v - 1) and the append (its body from `body`)."""
    header = _INT.pack(version) + _INT.pack(first_sequence) + _INT.pack(last_sequence)
    header += _INT.pack(microseconds(commit_time))
    return hashlib.sha256(previous + header + append_body).digest()


@dataclass(frozen=True, slots=True)
class ChainLink:
    """One append in a conversation's digest chain (ListAppends)."""

    version: int
    first_sequence: int
    last_sequence: int
    digest: bytes  # b"": recorded before digests
    previous_digest: bytes
    commit_time: datetime
    retracted_sequences: tuple[int, ...] = ()


def links(
    rows: Sequence[tuple[int, int, int, bytes | None, datetime, Sequence[int] | None]],
    previous: bytes,
) -> list[ChainLink]:
    """Appends read in version order (version, first, last, digest, commit time,
    retracted) as links of the chain, the first following `previous`; an append recorded
    before digests has none, and the next starts a chain again."""
    found: list[ChainLink] = []
    for version, first, last, digest, commit_time, retracted in rows:
        found.append(
            ChainLink(
                version,
                first,
                last,
                digest or b"",
                previous,
                commit_time,
                tuple(sorted(retracted or ())),
            )
        )
        previous = digest or GENESIS
    return found


def recompute(chain: Sequence[ChainLink], messages: Mapping[int, Message]) -> bytes:
    """The head digest of a chain recomputed from its appends and the messages by
    sequence, checking each append's recorded digest and link on the way; raises
    ChainBroken at the first that does not hold."""
    previous = GENESIS
    expected_version = chain[0].version if chain else 1
    for link in chain:
        if link.version != expected_version:
            raise ChainBroken(expected_version, "an append is missing")
        expected_version += 1
        if not link.digest:  # recorded before digests: the chain starts again after it
            previous = GENESIS
            continue
        if link.previous_digest != previous:
            raise ChainBroken(link.version, "it does not follow the previous append's digest")
        sequences = range(link.first_sequence, link.last_sequence + 1)
        missing = [s for s in sequences if s not in messages]
        if missing:
            raise ChainBroken(link.version, f"entry {missing[0]} is missing")
        digest = chain_step(
            previous,
            link.version,
            link.first_sequence,
            link.last_sequence,
            link.commit_time,
            body(link.retracted_sequences, [messages[s] for s in sequences]),
        )
        if digest != link.digest:
            raise ChainBroken(link.version, "its entries, retractions or commit time changed")
        previous = digest
    return previous


class ChainBroken(Exception):
    """A digest chain that does not hold: at which version, and why."""

    def __init__(self, version: int, why: str) -> None:
        super().__init__(f"version {version}: {why}")
        self.version = version
        self.why = why
