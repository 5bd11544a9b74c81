"""Verifying a transcript: recompute a conversation's digest chain from its entries and
appends and compare it with the head digest (docs/transcript.md defines the encoding).

    digest(v) = SHA-256(digest(v - 1) || canonical(v)),  digest(0) = 32 zero bytes

The client recomputes it itself: it trusts nothing of the server but what it reads. The
same code verifies an export (`runifold transcript export`) offline.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from runifold.common.v1 import common_pb2
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb

GENESIS = bytes(32)

_INT = struct.Struct(">q")


def _str(value: str) -> bytes:
    encoded = value.encode("utf-8")
    return _INT.pack(len(encoded)) + encoded


def message_bytes(message: common_pb2.Message) -> bytes:
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


def append_digest(
    previous: bytes, append: transcript_pb.Append, messages: Iterable[common_pb2.Message]
) -> bytes:
    """digest(v) of an append from the digest before it and its entries' messages."""
    micros = append.commit_time.seconds * 1_000_000 + append.commit_time.nanos // 1000
    retracted = sorted(append.retracted_sequences)
    parts = [
        previous,
        _INT.pack(append.version),
        _INT.pack(append.first_sequence),
        _INT.pack(append.last_sequence),
        _INT.pack(micros),
        _INT.pack(len(retracted)),
        *(_INT.pack(s) for s in retracted),
        *(message_bytes(m) for m in messages),
    ]
    return hashlib.sha256(b"".join(parts)).digest()


class VerificationFailed(Exception):
    """The transcript does not match its digests: which append, and why."""

    def __init__(self, version: int, why: str) -> None:
        super().__init__(f"version {version}: {why}")
        self.version = version
        self.why = why


@dataclass(frozen=True)
class Verified:
    """A transcript whose every digested append was recomputed and matched."""

    head_digest: bytes
    appends: int  # appends whose digest was recomputed
    entries: int


def recompute(
    appends: Iterable[transcript_pb.Append],
    entries: Mapping[int, common_pb2.Entry],
    head_digest: bytes,
    *,
    held: bool = False,
) -> Verified:
    """Recompute the chain of `appends` (in version order, from version 1) over `entries`
    (by sequence) and compare its end with `head_digest`, or, when the head is one you
    `held` from before (the conversation may have grown since), find it on the chain;
    VerificationFailed otherwise. An append recorded before digests existed has none:
    the chain starts again after it."""
    seen: set[bytes] = set()
    previous = GENESIS
    expected = 1
    checked = 0
    covered = 0
    last_version = 0
    for append in appends:
        if append.version != expected:
            raise VerificationFailed(expected, "an append is missing")
        expected += 1
        last_version = append.version
        sequences = range(append.first_sequence, append.last_sequence + 1)
        covered += len(sequences)
        if not append.digest:
            previous = GENESIS
            continue
        if append.previous_digest != previous:
            raise VerificationFailed(append.version, "it does not follow the previous digest")
        missing = [s for s in sequences if s not in entries]
        if missing:
            raise VerificationFailed(append.version, f"entry {missing[0]} is missing")
        digest = append_digest(previous, append, (entries[s].message for s in sequences))
        if digest != append.digest:
            raise VerificationFailed(
                append.version, "its entries, retractions or commit time changed"
            )
        previous = digest
        seen.add(digest)
        checked += 1
    if covered != len(entries):
        raise VerificationFailed(last_version, "entries beyond the appends")
    if held and head_digest not in seen:
        raise VerificationFailed(last_version, "the head digest you hold is not on the chain")
    if not held and checked and previous != head_digest:
        raise VerificationFailed(last_version, "the chain does not end at the head digest")
    return Verified(previous if checked else b"", checked, len(entries))
