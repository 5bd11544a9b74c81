"""The chaos checker catches what it claims: a clean history passes, and each seeded
defect (a lost append, a duplicated model call, a surviving memory of an erased
incarnation, a duplicated watch entry, a refused write that took effect, data of another
namespace) fails it with the invariant it breaks."""

from __future__ import annotations

from collections import Counter

from chaos.checker import FinalEntry, FinalState, check
from chaos.history import History, Op, token

NS, OTHER = "chaos-a", "chaos-b"
CID = "11111111-1111-1111-1111-111111111111"


def _done(op: Op, outcome: str = "ok", at: float = 0.0, **reply: object) -> Op:
    op.start, op.end, op.outcome = at, at + 0.1, outcome
    op.reply = dict(reply)
    return op


def _world() -> tuple[History, FinalState]:
    """A small clean history: two appends, a turn, a watch, a memory, all as they should."""
    history = History()
    first = _done(
        history.begin("append", NS, CID, request_id="r1", count=2),
        at=1.0,
        version=1,
        first_sequence=1,
        last_sequence=2,
    )
    turn = _done(
        history.begin("turn", NS, CID, turn_id="t1", count=2),
        at=2.0,
        version=2,
        first_sequence=3,
        last_sequence=4,
        replayed=False,
    )
    texts = [
        token(NS, CID, first.id, 0),
        token(NS, CID, first.id, 1),
        token(NS, CID, turn.id, 0),
        token(NS, CID, turn.id, 1),
    ]
    watch = _done(history.begin("watch", NS, CID, after_sequence=0), at=0.5)
    watch.reply = {"entries": [(i + 1, t) for i, t in enumerate(texts)], "incarnation": 7}
    memory = _done(history.begin("upsert", NS, CID), at=3.0, memory_id="m1", revision=1)
    final = FinalState(
        entries={(NS, CID): [FinalEntry(i + 1, t) for i, t in enumerate(texts)]},
        incarnations={(NS, CID): 7},
        model_calls=Counter({turn.id: 1}),
        memories={(NS, "m1"): (token(NS, CID, memory.id, 0), [CID])},
    )
    return history, final


def _violations(history: History, final: FinalState) -> set[str]:
    return {v.invariant for v in check(history.ops, history.faults, final).violations}


def test_a_clean_history_passes() -> None:
    history, final = _world()
    report = check(history.ops, history.faults, final)
    assert report.violations == []
    assert report.checked["append-once"] and report.checked["watch-once"]


def test_a_lost_append_is_caught() -> None:
    history, final = _world()
    final.entries[(NS, CID)] = final.entries[(NS, CID)][2:]  # the first append vanished
    for i, entry in enumerate(final.entries[(NS, CID)]):
        entry.sequence = i + 1
    final.incarnations[(NS, CID)] = 8  # (and the watch saw another incarnation)
    assert "append-once" in _violations(history, final)


def test_a_duplicated_append_is_caught() -> None:
    history, final = _world()
    entries = final.entries[(NS, CID)]
    entries.append(FinalEntry(5, entries[0].text))
    assert "append-once" in _violations(history, final)


def test_a_duplicated_model_call_is_caught() -> None:
    history, final = _world()
    turn = next(op for op in history.ops if op.kind == "turn")
    final.model_calls[turn.id] = 2
    assert _violations(history, final) == {"one-model-call"}


def test_a_surviving_memory_of_an_erased_incarnation_is_caught() -> None:
    history, final = _world()
    _done(history.begin("erase", NS, CID), at=5.0)  # after the memory was acknowledged
    # The conversation was made again and written anew; the old memory still stands.
    final.entries[(NS, CID)] = []
    assert "erasure-final" in _violations(history, final)


def test_a_stale_summary_row_is_caught() -> None:
    history, final = _world()
    final.stale_rows.append("summary.jobs holds incarnation 3 of chaos-a/x, erased")
    assert _violations(history, final) == {"erasure-final"}


def test_a_duplicated_watch_entry_is_caught() -> None:
    history, final = _world()
    watch = next(op for op in history.ops if op.kind == "watch")
    entries = watch.reply["entries"]
    watch.reply["entries"] = [entries[0], entries[0], *entries[1:]]
    assert _violations(history, final) == {"watch-once"}


def test_a_refused_write_that_took_effect_is_caught() -> None:
    history, final = _world()
    refused = _done(history.begin("append", NS, CID, request_id="r2", count=1), "fail", at=4.0)
    refused.code, refused.reason = "ABORTED", "VERSION_CONFLICT"
    final.entries[(NS, CID)].append(FinalEntry(5, token(NS, CID, refused.id, 0)))
    assert "append-once" in _violations(history, final)


def test_another_namespaces_data_in_a_read_is_caught() -> None:
    history, final = _world()
    read = _done(history.begin("search", OTHER), at=4.0)
    read.reply = {"texts": [token(NS, CID, 1, 0)]}
    assert _violations(history, final) == {"namespace"}


def test_a_repeated_turn_refused_once_and_run_once_is_one_write() -> None:
    history, final = _world()
    first = _done(history.begin("turn", NS, CID, turn_id="t2", count=2), "fail", at=6.0)
    first.code, first.reason = "ABORTED", "CONVERSATION_BUSY"
    repeat = _done(
        history.begin("turn", NS, CID, turn_id="t2", count=2, repeat_of=first.id),
        at=6.0,
        version=3,
        first_sequence=5,
        last_sequence=6,
        replayed=False,
    )
    final.entries[(NS, CID)] += [
        FinalEntry(5, token(NS, CID, first.id, 0)),
        FinalEntry(6, token(NS, CID, first.id, 1)),
    ]
    final.model_calls[first.id] = 1
    assert _violations(history, final) == set(), repeat
