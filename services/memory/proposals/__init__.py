"""Assisted curation: proposers read a range of a transcript and propose memories.

Two proposers behind one interface: a chat model (any OpenAI-compatible
provider, asked for structured output with a JSON schema) and an offline,
deterministic one (the default) that finds durable first-person statements:
preferences, decisions, and facts about the user and the people in their
life. Both answer in the same shape, the items of `PROPOSALS_SCHEMA`, and
both report usage, so every call is charged to the caller's budget the same
way.

What a proposer answers is untrusted: `check_proposals` keeps only the items
that are well formed, whose sources lie inside the range that was read, and
whose related memory is one the proposer was shown; the others are dropped
and counted. Nothing here stores anything.

The transcript and the stored memories reach the model as delimited,
escaped data (`trust="untrusted"`) in the user message; the instructions
are the constant system message, which no transcript text can change.

ProposeMemories itself (the read, the related memories, the call) is in
service.py; the proposers in proposer.py and offline.py, their prompt in
prompt.py, the records and checks in model.py.
"""
