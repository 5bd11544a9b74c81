"""The campaign's checker: the promises, checked against the recorded history and the
final state. It knows the contract, not the server's code: it imports nothing of
services/, only what the history (chaos/history.py) and the final state hold.

What it checks (each a named invariant; a violation names the operations involved):

- `append-once`: every acknowledged write (append or turn) of a conversation's final
  incarnation is present exactly once, in order, at the sequences it was acknowledged
  with; no write is present twice or in pieces (an unknown outcome at most once); the
  entries are contiguous from 1; writes of one incarnation have distinct versions.
- `erasure-final`: nothing written by an operation that started before the last erasure
  of its conversation is in the final incarnation; no summary, job, memory, or index
  point of an erased incarnation remains (memories: a memory whose write started before
  its source conversation's last erasure ended).
- `one-model-call`: the model was called at most once per turn id (unless the turn was
  sent again after its conversation was erased: an erasure takes the turn ids with it),
  exactly once for a turn acknowledged as run (not replayed).
- `race-loser`: a turn that lost the race (TURN_CONFLICT) was told a current version
  past the one it read.
- `watch-once`: every watch stream delivered each entry once, in order, with no gap;
  for the final incarnation, the entries the final transcript holds at those sequences.
- `namespace`: no read returned another namespace's data.
- `revision-monotonic`: a memory's revision never goes back between two operations
  one after the other in real time.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from chaos.history import Fault, Op, parse_token

Key = tuple[str, str]  # (namespace, conversation id)
WRITES = ("append", "turn")


@dataclass
class FinalEntry:
    sequence: int
    text: str
    retracted: bool = False


@dataclass
class FinalState:
    """What the campaign read at the end, after healing every fault."""

    # The conversations that exist at the end, with every entry (ListEntries), and the
    # incarnation of each.
    entries: dict[Key, list[FinalEntry]] = field(default_factory=dict)
    incarnations: dict[Key, int] = field(default_factory=dict)
    # Calls the model received, by the op id of the turn that made them.
    model_calls: Counter[int] = field(default_factory=Counter)
    # Live memories: (namespace, memory id) -> (content, [source conversation ids]).
    memories: dict[tuple[str, str], tuple[str, list[str]]] = field(default_factory=dict)
    # Rows found in the stores that name an incarnation that is not a conversation's
    # current one (summaries, their history, jobs): a description each.
    stale_rows: list[str] = field(default_factory=list)
    # Index points (live) whose memory is not live: a description each.
    stale_points: list[str] = field(default_factory=list)


@dataclass
class Violation:
    invariant: str
    message: str
    ops: list[int] = field(default_factory=list)

    def __str__(self) -> str:
        ops = f" (ops {', '.join(map(str, self.ops[:10]))})" if self.ops else ""
        return f"[{self.invariant}] {self.message}{ops}"


@dataclass
class Report:
    ops: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    checked: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = ["operations by kind and outcome:"]
        out += [f"  {name:<28} {count}" for name, count in sorted(self.ops.items())]
        out.append("faults by kind:")
        out += [f"  {name:<28} {count}" for name, count in sorted(self.faults.items())]
        out.append("invariants checked (cases):")
        out += [f"  {name:<28} {count}" for name, count in sorted(self.checked.items())]
        out.append(f"violations: {len(self.violations)}")
        out += [f"  {v}" for v in self.violations[:50]]
        return out


class _Checker:
    def __init__(self, ops: list[Op], faults: list[Fault], final: FinalState) -> None:
        self.ops = ops
        self.by_id = {op.id: op for op in ops}
        self.final = final
        self.report = Report()
        for op in ops:
            self.report.ops[f"{op.kind} {op.outcome}"] += 1
        for fault in faults:
            self.report.faults[fault.kind] += 1
        # The calls that sent each turn: the first op's id -> every op with its turn id.
        self.repeats: dict[int, list[Op]] = defaultdict(list)
        for op in ops:
            if op.kind == "turn":
                self.repeats[op.request.get("repeat_of", op.id)].append(op)
        # The erasures of each conversation that were acknowledged, in order.
        self.erasures: dict[Key, list[Op]] = defaultdict(list)
        for op in sorted(ops, key=lambda o: o.end):
            if op.kind == "erase" and op.outcome == "ok":
                self.erasures[(op.namespace, op.conversation_id)].append(op)

    def fail(self, invariant: str, message: str, ops: Iterable[int] = ()) -> None:
        self.report.violations.append(Violation(invariant, message, sorted(set(ops))))

    def case(self, invariant: str) -> None:
        self.report.checked[invariant] += 1

    # -- the transcript ---------------------------------------------------------------

    def last_erasure(self, key: Key) -> Op | None:
        erasures = self.erasures.get(key)
        return erasures[-1] if erasures else None

    def transcripts(self) -> None:
        writes: dict[Key, list[Op]] = defaultdict(list)
        for op in self.ops:
            if op.kind in WRITES:
                writes[(op.namespace, op.conversation_id)].append(op)
        for key, entries in self.final.entries.items():
            self.transcript(key, entries, writes.get(key, []))
        for key, ops in writes.items():
            if key in self.final.entries:
                continue
            # Gone at the end: only an erasure takes a conversation away, so every write
            # acknowledged must have been sent before its last erasure ended.
            erased = self.last_erasure(key)
            for op in ops:
                if op.outcome == "ok" and (erased is None or op.start > erased.end):
                    self.case("append-once")
                    self.fail(
                        "append-once",
                        f"{key[1]}: acknowledged after its last erasure, but the "
                        "conversation is gone",
                        [op.id],
                    )

    def transcript(self, key: Key, entries: list[FinalEntry], writes: list[Op]) -> None:
        namespace, cid = key
        erased = self.last_erasure(key)
        # A write acknowledged before the last erasure ended took effect before it (the
        # conversation was made again only after): it must be gone. A write whose outcome
        # is unknown may have taken effect at any time after it was sent.
        erased_end = erased.end if erased is not None else float("-inf")
        self.case("append-once")
        sequences = [e.sequence for e in entries]
        if sequences != list(range(1, len(entries) + 1)):
            self.fail("append-once", f"{cid}: sequences are not contiguous from 1")
        placed: dict[int, list[tuple[int, int]]] = defaultdict(list)  # op -> [(index, seq)]
        for entry in entries:
            parsed = parse_token(entry.text)
            if parsed is None:
                continue  # not written by the campaign: nothing to trace
            ns, conversation, op_id, index = parsed
            self.case("namespace")
            if (ns, conversation) != key:
                self.fail(
                    "namespace",
                    f"{cid} (of {namespace}) holds a message written to {conversation} of {ns}",
                    [op_id],
                )
            placed[op_id].append((index, entry.sequence))
        for op_id, places in placed.items():
            op = self.by_id.get(op_id)
            self.case("append-once")
            if op is None:
                self.fail("append-once", f"{cid}: a message of no recorded operation", [op_id])
                continue
            indexes = [i for i, _ in places]
            seqs = [s for _, s in places]
            whole = list(range(op.request.get("count", len(places))))
            if indexes != whole or seqs != list(range(seqs[0], seqs[0] + len(seqs))):
                self.fail(
                    "append-once",
                    f"{cid}: a write stands {len(places)} times or in pieces "
                    f"(messages {indexes} at {seqs})",
                    [op_id],
                )
            if self.refused(op):
                self.fail(
                    "append-once",
                    f"{cid}: a write refused with {op.code}/{op.reason} took effect",
                    [op_id],
                )
            self.case("erasure-final")
            if op.outcome == "ok" and op.end < erased_end:
                assert erased is not None
                self.fail(
                    "erasure-final",
                    f"{cid}: a write acknowledged before the conversation's last erasure "
                    "ended stands in its new incarnation",
                    [op_id, erased.id],
                )
        versions: dict[int, int] = {}
        for op in writes:
            if (
                op.outcome != "ok"
                or op.end < erased_end
                or op.start < (erased.start if erased is not None else float("-inf"))
            ):
                continue  # before (or across) the last erasure: not this incarnation's
            self.case("append-once")
            # A repeat of a turn (its turn id sent again) wrote under the first one's tokens.
            found = placed.get(op.request.get("repeat_of", op.id), [])
            if not found:
                self.fail("append-once", f"{cid}: an acknowledged write is missing", [op.id])
                continue
            first, last = op.reply.get("first_sequence", 0), op.reply.get("last_sequence", 0)
            seqs = [s for _, s in found]
            if first and (seqs[0], seqs[-1]) != (first, last):
                self.fail(
                    "append-once",
                    f"{cid}: an acknowledged write stands at {seqs[0]}..{seqs[-1]}, "
                    f"acknowledged at {first}..{last}",
                    [op.id],
                )
            version = op.reply.get("version", 0)
            if version:
                other = versions.get(version)
                if other is not None and not self.same_write(other, op.id):
                    self.fail(
                        "append-once",
                        f"{cid}: two writes acknowledged with version {version}",
                        [other, op.id],
                    )
                versions[version] = op.id

    def refused(self, op: Op) -> bool:
        """The write of `op` was refused by every call that sent it (a turn may be sent
        more than once under one turn id: each call is an op, the first one's tokens)."""
        if op.kind != "turn":
            return op.outcome == "fail"
        senders = self.repeats.get(op.id, [op])
        return all(sender.outcome == "fail" for sender in senders)

    def same_write(self, a: int, b: int) -> bool:
        """Two ops that are one write (a turn and its repeat under one turn id)."""
        first, second = self.by_id[a], self.by_id[b]
        key = "turn_id" if first.kind == "turn" else "request_id"
        return bool(first.request.get(key)) and first.request.get(key) == second.request.get(key)

    # -- the model ----------------------------------------------------------------------

    def model(self) -> None:
        by_turn: dict[str, list[Op]] = defaultdict(list)
        for op in self.ops:
            if op.kind == "turn":
                by_turn[op.request["turn_id"]].append(op)
        for turn_id, ops in by_turn.items():
            calls = sum(self.final.model_calls.get(op.id, 0) for op in ops)
            self.case("one-model-call")
            # An erasure erases the conversation's turn ids with it: a turn sent again
            # after its conversation was erased is a new turn to the service.
            first, last = min(op.start for op in ops), max(op.end for op in ops)
            erased_between = any(
                first < erasure.end < last
                for erasure in self.erasures.get((ops[0].namespace, ops[0].conversation_id), [])
            )
            if calls > 1 and not erased_between:
                self.fail(
                    "one-model-call",
                    f"turn {turn_id}: the model was called {calls} times",
                    [op.id for op in ops],
                )
            ran = [op for op in ops if op.outcome == "ok" and not op.reply.get("replayed")]
            if ran and calls == 0:
                self.fail(
                    "one-model-call",
                    f"turn {turn_id}: ran without a model call",
                    [op.id for op in ran],
                )
        for op in self.ops:
            if op.kind == "turn" and op.reason == "TURN_CONFLICT":
                self.case("race-loser")
                current = op.reply.get("current_version", 0)
                expected = op.reply.get("expected_version", 0)
                if current <= expected:
                    self.fail(
                        "race-loser",
                        f"a turn lost the race at version {expected} but was told {current}",
                        [op.id],
                    )

    # -- memory ---------------------------------------------------------------------------

    def memory(self) -> None:
        for row in self.final.stale_rows:
            self.case("erasure-final")
            self.fail("erasure-final", row)
        for row in self.final.stale_points:
            self.case("erasure-final")
            self.fail("erasure-final", f"an index point of a memory that is gone: {row}")
        for (namespace, memory_id), (content, sources) in self.final.memories.items():
            parsed = parse_token(content)
            self.case("namespace")
            if parsed is None:
                continue  # written by a proposal's confirmation or the model
            ns, _, op_id, _ = parsed
            if ns != namespace:
                self.fail(
                    "namespace", f"memory {memory_id} of {namespace} holds {ns}'s data", [op_id]
                )
            op = self.by_id.get(op_id)
            for cid in sources:
                erased = self.last_erasure((namespace, cid))
                self.case("erasure-final")
                if (
                    op is not None
                    and erased is not None
                    and op.outcome == "ok"
                    and op.end < erased.end
                ):
                    self.fail(
                        "erasure-final",
                        f"memory {memory_id} was acknowledged from {cid} before its last "
                        "erasure ended, and survives it",
                        [op.id, erased.id],
                    )
        self.revisions()

    def revisions(self) -> None:
        seen: dict[str, list[Op]] = defaultdict(list)
        for op in self.ops:
            if op.outcome == "ok" and op.reply.get("memory_id") and op.reply.get("revision"):
                seen[op.reply["memory_id"]].append(op)
        for memory_id, ops in seen.items():
            ops.sort(key=lambda o: o.end)
            for later in ops:
                self.case("revision-monotonic")
                for earlier in ops:
                    if (
                        earlier.end < later.start
                        and earlier.reply["revision"] > later.reply["revision"]
                    ):
                        self.fail(
                            "revision-monotonic",
                            f"memory {memory_id}: revision {later.reply['revision']} read after "
                            f"{earlier.reply['revision']}",
                            [earlier.id, later.id],
                        )
                        break

    # -- reads and watches ------------------------------------------------------------------

    def reads(self) -> None:
        for op in self.ops:
            for text in op.reply.get("texts", []):
                parsed = parse_token(text)
                if parsed is None:
                    continue
                self.case("namespace")
                if parsed[0] != op.namespace:
                    self.fail(
                        "namespace",
                        f"a {op.kind} of {op.namespace} returned {parsed[0]}'s data",
                        [op.id],
                    )

    def watches(self) -> None:
        for op in self.ops:
            if op.kind != "watch":
                continue
            key = (op.namespace, op.conversation_id)
            delivered = [(int(s), str(t)) for s, t in op.reply.get("entries", [])]
            self.case("watch-once")
            if not delivered:
                continue
            seqs = [s for s, _ in delivered]
            start = op.request.get("after_sequence", 0) + 1
            if seqs != list(range(start, start + len(seqs))):
                self.fail(
                    "watch-once",
                    f"{op.conversation_id}: a stream delivered {_gaps(seqs, start)}",
                    [op.id],
                )
                continue
            final = self.final.entries.get(key)
            if final is None or op.reply.get("incarnation") != self.final.incarnations.get(key):
                continue  # an erased incarnation: checked for order and gaps only
            at = {e.sequence: e.text for e in final}
            for sequence, text in delivered:
                if at.get(sequence) != text:
                    self.fail(
                        "watch-once",
                        f"{op.conversation_id}: a stream delivered at {sequence} what the "
                        "transcript does not hold there",
                        [op.id],
                    )
                    break


def _gaps(seqs: list[int], start: int) -> str:
    repeated = [s for s, n in Counter(seqs).items() if n > 1]
    if repeated:
        return f"{repeated[:5]} more than once"
    return f"{seqs[:8]}... from {start}, not one after another"


def check(ops: list[Op], faults: list[Fault], final: FinalState) -> Report:
    """Every invariant over a history and the final state."""
    checker = _Checker(ops, faults, final)
    checker.transcripts()
    checker.model()
    checker.memory()
    checker.reads()
    checker.watches()
    return checker.report


def as_entries(pairs: Iterable[tuple[int, str]]) -> list[FinalEntry]:
    return [FinalEntry(sequence, text) for sequence, text in pairs]
