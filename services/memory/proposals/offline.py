"""The offline proposer: deterministic, no network, the embedded default and the
tests' (no curator model URL, or RUNIFOLD_CURATOR_MODEL_URL=offline). It finds durable
first-person statements in the user's messages (docs/memory.md, "Proposers") and
answers them in the chat-model proposer's JSON shape, so that the same checks apply to
both."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.common.domain import Entry, Role, Usage
from services.llm import metrics
from services.llm.model import estimate_tokens
from services.memory.proposals.model import ADD, DUPLICATE, SUPERSEDE, RelatedMemory, normalised
from services.memory.proposals.prompt import ProposalPrompt
from services.memory.proposals.proposer import ProposerOutput, _PromptBuilder

# Sentences with their end mark (a question states nothing), and the clauses of one.
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")
_CLAUSE = re.compile(r"\s*[,;]\s*|\s+(?:and|but)\s+(?=(?:I|we|my)\b)", re.IGNORECASE)
# Time phrases that end a statement ("I moved to Berlin last month"): not the fact.
_TIME_TAIL = re.compile(
    r"\s+(?:(?:last|this|next)\s+(?:week|month|year|summer|winter|spring|autumn)"
    r"|(?:in|since)\s+\d{4}|a while ago|(?:a few|two|three) (?:days|weeks|months|years) ago"
    r"|yesterday|today|recently|now|already|too|as well)$",
    re.IGNORECASE,
)
_MAX_OBJECT_CHARS = 160
_EMPTY_OBJECTS = {"it", "that", "this", "them", "you", "so", "to"}

_RELATIVES = (
    "sister|brother|wife|husband|partner|son|daughter|mother|father|mum|mom|dad|"
    "grandmother|grandfather|best friend|friend|manager|boss|colleague|dog|cat"
)
# How often a habit holds ("I always drink green tea in the morning").
_FREQUENCIES = "always|usually|normally|generally|typically|often|regularly|rarely|never"
# Words after a frequency that take no third-person -s ("I always can't sleep").
_UNCONJUGATED = frozenset(
    {"can", "can't", "cannot", "could", "couldn't", "will", "won't", "would", "wouldn't"}
    | {"shall", "should", "shouldn't", "may", "might", "must"}
)
_IRREGULAR = {"have": "has", "do": "does", "go": "goes", "am": "is", "don't": "doesn't"}


@dataclass(frozen=True, slots=True)
class _Pattern:
    """A durable first-person statement and the fact it states: the rest of the clause
    after `statement` is the fact's object. `key` names what the fact is about: a new fact
    with the same key and another object replaces the old one when the pattern is
    `exclusive` (one residence, one employer, one name)."""

    key: str
    statement: re.Pattern[str]
    template: str
    exclusive: bool = False
    # The object starts with a verb said in the first person ("drink green tea"), stated
    # of the user in the third ("drinks green tea").
    third_person: bool = False

    def stored(self) -> re.Pattern[str]:
        """The template read back: a stored memory worded like this pattern's facts."""
        body = re.escape(self.template)
        body = body.replace(r"\{object\}", "(?P<object>.+?)")
        body = body.replace(r"\{relative\}", f"(?P<relative>{_RELATIVES})")
        body = body.replace(r"\{frequency\}", f"(?P<frequency>{_FREQUENCIES})")
        return re.compile(f"^{body}$", re.IGNORECASE)


def _pattern(
    key: str, statement: str, template: str, *, exclusive: bool = False, third_person: bool = False
) -> _Pattern:
    return _Pattern(key, re.compile(statement, re.IGNORECASE), template, exclusive, third_person)


def _third_person(phrase: str) -> str:
    """A phrase that starts with a verb in the first person, in the third: "drink tea" is
    "drinks tea", "go" "goes", "watch" "watches", "study" "studies"; a modal stays."""
    verb, space, rest = phrase.partition(" ")
    lower = verb.lower()
    if lower in _UNCONJUGATED or (not lower.isalpha() and lower not in _IRREGULAR):
        return phrase
    if lower in _IRREGULAR:
        said = _IRREGULAR[lower]
    elif lower.endswith(("s", "sh", "ch", "x", "z", "o")):
        said = verb + "es"
    elif lower.endswith("y") and len(lower) > 1 and lower[-2] not in "aeiou":
        said = verb[:-1] + "ies"
    else:
        said = verb + "s"
    return said + space + rest


# Order matters: the first pattern that matches a clause states its fact.
_PATTERNS = (
    _pattern(
        "name",
        r"\b(?:my name is|please call me)\s+",
        "The user's name is {object}.",
        exclusive=True,
    ),
    _pattern(
        "relative-name:{relative}",
        rf"\bmy (?P<relative>{_RELATIVES})(?:'s name)? is (?:called |named )?(?=(?-i:[A-Z]))",
        "The user's {relative} is called {object}.",
        exclusive=True,
    ),
    _pattern(
        "residence",
        r"\bI(?: have|'ve)? (?:just |recently |finally )?(?:moved|relocated) to\s+"
        r"|\bI(?: now| still)? live in\s+",
        "The user lives in {object}.",
        exclusive=True,
    ),
    _pattern(
        "employer",
        r"\bI(?: now)? work (?:at|for)\s+",
        "The user works at {object}.",
        exclusive=True,
    ),
    _pattern("allergy", r"\bI(?:'m| am) allergic to\s+", "The user is allergic to {object}."),
    _pattern(
        "diet", r"\bI(?:'m| am) (?:an? )?(?=vegetarian|vegan|pescatarian)", "The user is {object}."
    ),
    _pattern(
        "birthday", r"\bmy birthday is (?:on )?", "The user's birthday is {object}.", exclusive=True
    ),
    _pattern("prefers", r"\bI (?:really |much |now )?prefer\s+", "The user prefers {object}."),
    _pattern(
        "dislikes",
        r"\bI (?:really )?(?:don't|do not) like\s+|\bI (?:really )?(?:hate|dislike|can't stand)\s+",
        "The user dislikes {object}.",
    ),
    _pattern("likes", r"\bI (?:really )?(?:like|love|enjoy)\s+", "The user likes {object}."),
    _pattern(
        "decision",
        r"\b(?:we|I) (?:have )?(?:decided|agreed) (?:to\s+)?",
        "The user decided to {object}.",
    ),
    _pattern(
        "habit",
        rf"\bI (?P<frequency>{_FREQUENCIES}) (?=[a-z])",
        "The user {frequency} {object}.",
        third_person=True,
    ),
)
_STORED = tuple((p, p.stored()) for p in _PATTERNS)


def _object(rest: str) -> str | None:
    """The object of a statement: the rest of its clause, without a closing time phrase."""
    obj = rest.strip().rstrip(".!").strip()
    while True:
        shorter = _TIME_TAIL.sub("", obj)
        if shorter == obj:
            break
        obj = shorter.strip()
    if not obj or obj.lower() in _EMPTY_OBJECTS or len(obj) > _MAX_OBJECT_CHARS:
        return None
    return obj


def _facts(text: str) -> list[tuple[_Pattern, str, str, str]]:
    """(pattern, key, object, content) of each durable statement of a message."""
    facts = []
    for sentence in _SENTENCE.findall(text):
        if sentence.rstrip().endswith("?"):
            continue
        for clause in _CLAUSE.split(sentence):
            for pattern in _PATTERNS:
                match = pattern.statement.search(clause)
                if match is None:
                    continue
                obj = _object(clause[match.end() :])
                if obj is not None:
                    if pattern.third_person:
                        obj = _third_person(obj)
                    groups = {k: (v or "").lower() for k, v in match.groupdict().items()}
                    relative = groups.pop("relative", "")
                    content = pattern.template.format(object=obj, relative=relative, **groups)
                    facts.append(
                        (pattern, pattern.key.format(relative=relative), obj.lower(), content)
                    )
                break
    return facts


def _stored_fact(content: str) -> tuple[str, str] | None:
    """(key, object) of a stored memory worded like an offline fact."""
    for pattern, stored in _STORED:
        match = stored.match(content.strip())
        if match:
            relative = (match.groupdict().get("relative") or "").lower()
            return pattern.key.format(relative=relative), match.group("object").strip().lower()
    return None


def offline_proposals(
    entries: Sequence[Entry], related: Sequence[RelatedMemory], max_proposals: int
) -> list[dict[str, Any]]:
    """The durable statements of the user's messages, as items of PROPOSALS_SCHEMA.

    A statement that a related memory already says is DUPLICATE; one that gives an
    exclusive fact (a residence, an employer, a name) another value than an open related
    memory is SUPERSEDE of it; anything else is ADD. Of several values of one exclusive
    fact in the entries read ("I live in Oslo", later "I moved to Bergen"), only the
    latest is proposed: the earlier one was replaced before the range ends, and nothing
    stored yet could be superseded by the later one (automatic curation reads a batch of
    turns at once). Deterministic: the same entries and memories give the same proposals.
    """
    stored = [(r, _stored_fact(r.memory.content)) for r in related]
    said = [
        (entry, fact)
        for entry in entries
        if entry.message.role == Role.USER
        for fact in _facts(entry.message.text)
    ]
    latest = {fact[1]: i for i, (_, fact) in enumerate(said) if fact[0].exclusive}
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, (entry, (pattern, key, obj, content)) in enumerate(said):
        if pattern.exclusive and latest[key] != i:
            continue  # replaced later in the same range
        if normalised(content) in seen:
            continue
        seen.add(normalised(content))
        topic = key.split(":")[0]
        action, alias, reason = ADD, None, f"a {topic} the user stated"
        for memory, parsed in stored:
            if normalised(memory.memory.content) == normalised(content):
                action, alias, reason = DUPLICATE, memory.alias, "already stored"
                break
            if (
                pattern.exclusive
                and parsed is not None
                and parsed[0] == key
                and parsed[1] != obj
                and memory.memory.valid_until_time is None
            ):
                action, alias = SUPERSEDE, memory.alias
                reason = f"the user stated a newer {topic}"
        items.append(
            {
                "content": content,
                "sources": [{"from_sequence": entry.sequence, "through_sequence": entry.sequence}],
                "valid_from_time": None,
                "action": action,
                "related_memory": alias,
                "reason": reason,
            }
        )
        if len(items) >= max_proposals:
            return items
    return items


class OfflineProposer(_PromptBuilder):
    """The deterministic proposer of the embedded default and the tests: no network."""

    provider = "offline"

    def __init__(self, *, max_entry_chars: int = 4000) -> None:
        self.max_entry_chars = max_entry_chars
        self._seconds = metrics.MODEL_SECONDS.labels("memory_proposal", "offline")

    async def propose(self, prompt: ProposalPrompt, *, timeout: float) -> ProposerOutput:
        started = time.perf_counter()
        items = offline_proposals(prompt.entries, prompt.related, prompt.max_proposals)
        output = estimate_tokens(json.dumps({"proposals": items}))
        # Like a model asked for at most max_output_tokens: what does not fit is not said.
        while items and output > prompt.max_output_tokens:
            items = items[:-1]
            output = estimate_tokens(json.dumps({"proposals": items}))
        self._seconds.observe(time.perf_counter() - started)
        return ProposerOutput(items, Usage(prompt.input_tokens, output, 1))
