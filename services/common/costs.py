"""The cost class of every RPC: its admission kind (or the reason it has none), what one
call may hold in memory, and how it waits. One table, by method path, for gRPC and the
HTTP port alike (they serve the same methods through the same guard).

A method that is not in this table cannot be served without a decision: the test
tests/system/security/test_cost_classes.py walks every service's descriptors and the HTTP
port's routes and fails for a method that declares nothing. docs/production.md shows
the table (rendered by `table()`; the test checks the page agrees).

- `admission`: the kind whose per-namespace limit admits the call
  (services/common/admission.py, RUNIFOLD_NAMESPACE_MAX_*), or "exempt".
- `why`: for an exemption, why no per-namespace limit is needed; for a kind, what the
  limit protects.
- `memory`: the most one call holds, from the settings that bound it.
- `waits`: how the call waits: "never" (a bounded number of statements or reads, each
  under RUNIFOLD_DB_STATEMENT_TIMEOUT_MS), "queue" (a bounded, deadline-aware queue in
  front of a shared resource: the model or embedding queue, refused with OVERLOADED when
  full), "lease" (for a turn lease, event-driven, with bounded waiters per conversation
  and per namespace), "stream" (as long as the client follows, bounded in bytes, closed
  when the client stops reading).

No transport import: admission reads its kinds from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Waits = Literal["never", "queue", "lease", "stream"]


@dataclass(frozen=True)
class CostClass:
    admission: str
    why: str
    memory: str
    waits: Waits


_T = "/runifold.transcript.v1.TranscriptService/"
_S = "/runifold.summary.v1.SummaryService/"
_M = "/runifold.memory.v1.MemoryService/"
_A = "/runifold.agent.v1.AgentService/"

# Reasons shared by several exemptions.
_ONE_WRITE = "one short transaction on the pool; no model, no embedding"
_ONE_READ = "one bounded read on the pool; no model, no embedding"
_REQUEST = "the request (at most the transport's receive cap)"
_PAGE = "a page of at most 1000 rows (page_size)"

COSTS: dict[str, CostClass] = {
    # -- TranscriptService ---------------------------------------------------------------
    _T + "CreateConversation": CostClass("exempt", _ONE_WRITE, _REQUEST, "never"),
    _T + "GetConversation": CostClass("exempt", _ONE_READ, "one conversation row", "never"),
    _T + "AppendEntries": CostClass(
        "exempt",
        _ONE_WRITE + " (compare-and-swap, idempotency record and entries in one statement)",
        _REQUEST + ": RUNIFOLD_MAX_APPEND_BYTES and three state documents",
        "never",
    ),
    _T + "ListEntries": CostClass(
        "exempt", _ONE_READ, _PAGE + " of entries, each at most RUNIFOLD_MAX_MESSAGE_BYTES", "never"
    ),
    _T + "LoadView": CostClass(
        "exempt",
        _ONE_READ + " (by sequence ranges: its cost never grows with the transcript)",
        "window + summary_batch entries (each at most 4096), each at most "
        "RUNIFOLD_MAX_MESSAGE_BYTES",
        "never",
    ),
    _T + "ListConversations": CostClass(
        "exempt",
        _ONE_READ + " (one index range scan, and one probe of at most 16 entries per "
        "conversation for its preview)",
        _PAGE + " of conversations (50 with their state), each with a preview of at most "
        "200 characters",
        "never",
    ),
    _T + "DeleteConversation": CostClass(
        "exempt", _ONE_WRITE + " (batched deletes)", "the conversation's key", "never"
    ),
    _T + "GetState": CostClass(
        "exempt", _ONE_READ, "at most 100 state documents of RUNIFOLD_MAX_STATE_BYTES", "never"
    ),
    _T + "AcquireTurnLease": CostClass(
        "exempt",
        "a granted lease is one short transaction; a wait is bounded by the lease waiters "
        "(RUNIFOLD_TURN_MAX_WAITERS_PER_CONVERSATION, RUNIFOLD_NAMESPACE_MAX_LEASE_WAITERS) "
        "and holds no connection",
        "one turn's row and outcome (at most RUNIFOLD_MAX_APPEND_BYTES)",
        "lease",
    ),
    _T + "RenewTurnLease": CostClass("exempt", _ONE_WRITE, "one turn row", "never"),
    _T + "ReleaseTurnLease": CostClass(
        "exempt", _ONE_WRITE, _REQUEST + ": the outcome kept (RUNIFOLD_MAX_APPEND_BYTES)", "never"
    ),
    _T + "WatchConversation": CostClass(
        "exempt",
        "streams are limited per namespace and per process (RUNIFOLD_WATCH_MAX_WATCHERS*), "
        "and the bytes they hold by a byte budget per namespace and per process "
        "(RUNIFOLD_WATCH_MAX_BUFFERED_BYTES*); an idle stream costs no connection, no "
        "query and no buffered bytes",
        "2 x (RUNIFOLD_WATCH_PAGE_BYTES + RUNIFOLD_MAX_MESSAGE_BYTES + 256 KiB) + 64 KiB "
        "(about 2 MiB): one page read and one message in flight",
        "stream",
    ),
    _T + "MarkCurated": CostClass(
        "exempt",
        _ONE_WRITE + " (one conditional update of the conversation row)",
        "one conversation row",
        "never",
    ),
    _T + "ListNamespaces": CostClass(
        "exempt",
        _ONE_READ + " (one index probe per namespace listed, or per namespace the "
        "identity grants: never a scan of the conversations); its callers take turns on "
        "the pool as one lane, apart from every namespace's",
        _PAGE + " of namespace names (each at most 128 characters)",
        "never",
    ),
    _T + "RecordErasureReceipt": CostClass(
        "exempt",
        _ONE_WRITE + " (one upsert of the receipt; erasure is never refused for load): "
        "made only for an incarnation that exists, or merged into one kept, so rows are "
        "bounded by the conversations a namespace had",
        _REQUEST + ": at most 32 counts and 32 part names",
        "never",
    ),
    _T + "GetErasureReceipt": CostClass(
        "exempt", _ONE_READ + " (by key)", "one receipt (at most 32 counts)", "never"
    ),
    _T + "ForkConversation": CostClass(
        "exempt",
        _ONE_WRITE + " (index probes, one per conversation of the source's lineage, and two "
        "rows written: no entry is copied, whatever the prefix's length)",
        "one conversation row and its state (RUNIFOLD_MAX_STATE_BYTES)",
        "never",
    ),
    _T + "ListAppends": CostClass(
        "exempt",
        _ONE_READ + " (a range of the appends' primary key per segment of a fork's lineage)",
        _PAGE + " of appends (digests and retracted sequences, at most 256 each)",
        "never",
    ),
    _T + "ListForks": CostClass(
        "exempt",
        _ONE_READ + " (a recursive walk of the forks index: one probe per fork of the "
        "tree, whichever page is asked)",
        _PAGE + " of forks (id, incarnation, source, fork point)",
        "never",
    ),
    _T + "PutCheckpoint": CostClass(
        "exempt",
        _ONE_WRITE + " (the new channel values, the checkpoint's row and its size, one probe "
        "per channel; a value stored as a delta reads its base's chain, at most 32 rows)",
        _REQUEST + " (a put carries at most RUNIFOLD_MAX_APPEND_BYTES) and one base value at "
        "a time (RUNIFOLD_CHECKPOINT_MAX_BLOB_BYTES)",
        "never",
    ),
    _T + "PutCheckpointWrites": CostClass(
        "exempt",
        _ONE_WRITE + " (one insert of one task's writes, then the checkpoint's weight with "
        "all its writes: at most RUNIFOLD_CHECKPOINT_MAX_BYTES, as a read returns them all)",
        _REQUEST + ": RUNIFOLD_CHECKPOINT_MAX_VALUES_PER_CALL writes of at most "
        "RUNIFOLD_CHECKPOINT_MAX_BLOB_BYTES",
        "never",
    ),
    _T + "GetCheckpoint": CostClass(
        "exempt",
        _ONE_READ + " (by key: the checkpoint, a probe per channel, its writes)",
        "one checkpoint with its values and writes (RUNIFOLD_CHECKPOINT_MAX_BYTES)",
        "never",
    ),
    _T + "ListCheckpoints": CostClass(
        "exempt",
        _ONE_READ + " (a range of the checkpoints' key, cut by weight before values are read)",
        "a page of at most RUNIFOLD_CHECKPOINT_MAX_PAGE_SIZE checkpoints and "
        "RUNIFOLD_CHECKPOINT_MAX_BYTES (never less than one checkpoint)",
        "never",
    ),
    _T + "DeleteCheckpoints": CostClass(
        "exempt",
        _ONE_WRITE + " (at most 1000 runs or conversations; the unnamed values of those "
        "conversations found by an anti-join over their own rows, in passes: one per level "
        "of a delta chain, at most 33)",
        "three counts",
        "never",
    ),
    _T + "CopyCheckpoints": CostClass(
        "exempt",
        _ONE_WRITE + " (three INSERT ... SELECT inside PostgreSQL: no row passes through "
        "the service; the whole thread in one transaction, as long as the thread is)",
        "one count",
        "never",
    ),
    # -- SummaryService -----------------------------------------------------------------
    _S + "GetSummary": CostClass("exempt", _ONE_READ, "one summary", "never"),
    _S + "CommitSummary": CostClass(
        "exempt", _ONE_WRITE + " (and one transcript read)", _REQUEST, "never"
    ),
    _S + "Summarize": CostClass(
        "summarize",
        "model calls: the namespace's share of the summarizer model",
        "the summary and one buffer of summary_batch entries a pass",
        "queue",
    ),
    _S + "RequestSummary": CostClass(
        "exempt", _ONE_WRITE + " (one pending job per conversation)", "one job row", "never"
    ),
    _S + "GetBacklog": CostClass("exempt", _ONE_READ + " (counts)", "a few counts", "never"),
    _S + "EraseSummaries": CostClass("exempt", _ONE_WRITE, "the conversation's key", "never"),
    # -- MemoryService ------------------------------------------------------------------
    _M + "UpsertMemory": CostClass(
        "upsert",
        "a source check against TranscriptService, a write, and an embedding in the "
        "background (the embedding queue is shared)",
        _REQUEST,
        "never",
    ),
    _M + "GetMemory": CostClass("exempt", _ONE_READ, "one memory", "never"),
    _M + "ListMemories": CostClass("exempt", _ONE_READ, _PAGE + " of memories", "never"),
    _M + "SearchMemories": CostClass(
        "search",
        "an embedding of the query (the embedding queue is shared) and an index search",
        "limit (at most 256) memories, and a few times as many candidates",
        "queue",
    ),
    _M + "DeleteMemory": CostClass(
        "exempt", _ONE_WRITE + " (and an outbox row)", "one memory", "never"
    ),
    _M + "ForgetSource": CostClass(
        "exempt",
        _ONE_WRITE + " (batched deletes; the index follows through the outbox)",
        "the ids it deleted",
        "never",
    ),
    _M + "ListMemoryRevisions": CostClass("exempt", _ONE_READ, _PAGE + " of revisions", "never"),
    _M + "WatchMemories": CostClass(
        "exempt",
        "streams are limited per namespace and per process (RUNIFOLD_MEMORY_WATCH_MAX_WATCHERS*), "
        "and the bytes they hold by a byte budget per namespace and per process "
        "(RUNIFOLD_MEMORY_WATCH_MAX_BUFFERED_BYTES*); an idle stream costs no connection, no "
        "query and no buffered bytes; a write pays one row update of its namespace's feed",
        "2 x (512 KiB page + 272 KiB largest change + 256 x 2 KiB) + 64 KiB (about 2.6 MiB): "
        "one page read and one message in flight",
        "stream",
    ),
    _M + "ProposeMemories": CostClass(
        "propose",
        "a transcript read, an embedding batch, an index search per entry and a model call: "
        "the namespace's share of the proposer model and the embedding queue",
        "the entries read (at most the range's 256 entries) and the proposals",
        "queue",
    ),
    _M + "RequestCuration": CostClass(
        "curate",
        "a transcript read and one enqueue (one waiting job per conversation, at most "
        "RUNIFOLD_CURATION_MAX_PENDING_PER_NAMESPACE waiting a namespace); the job's model "
        "calls are charged to the namespace's hourly curation budget",
        "one job row",
        "never",
    ),
    _M + "GetCurationBacklog": CostClass(
        "exempt",
        _ONE_READ + " (counts of the namespace's jobs and budget)",
        "a few counts",
        "never",
    ),
    _M + "GetMemoryErasure": CostClass(
        "exempt",
        _ONE_READ + " (by key) and one update by key (records when the index caught up, "
        "from one probe of the outbox's primary key)",
        "one erasure's counts",
        "never",
    ),
    # -- AgentService -------------------------------------------------------------------
    _A + "RunConversation": CostClass(
        "turn",
        "a model call, a memory search and maybe a summary: the namespace's share of the "
        "model; a turn waiting for its lease holds a waiting place (turn_wait) instead",
        "the view (window and summary buffer), the recalled memories and the reply "
        "(at most the model client's 16 MiB response cap)",
        "lease",
    ),
    _A + "StreamConversation": CostClass(
        "turn",
        "as RunConversation: the same turn, as a stream of its events",
        "as RunConversation",
        "lease",
    ),
    _A + "EraseConversation": CostClass(
        "exempt",
        "erasure is never refused for load: a person's right to erasure does not wait "
        "for a tenant's quota (each step is a short transaction on one service)",
        "the counts of what was erased",
        "never",
    ),
    _A + "GetErasureReceipt": CostClass(
        "exempt",
        "a receipt read by key on TranscriptService; while only the index is left, one "
        "GetMemoryErasure and one RecordErasureReceipt (each a short statement by key)",
        "one receipt",
        "never",
    ),
    # -- served beside the services ------------------------------------------------------
    "/grpc.health.v1.Health/Check": CostClass(
        "exempt", "no namespace: answered from memory", "one status", "never"
    ),
    "/grpc.health.v1.Health/List": CostClass(
        "exempt", "no namespace: answered from memory", "one status per service", "never"
    ),
    "/grpc.health.v1.Health/Watch": CostClass(
        "exempt",
        "no namespace: the probes of the platform, a status change at a time",
        "one status",
        "stream",
    ),
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": CostClass(
        "exempt", "no namespace: descriptors from memory", "one file descriptor set", "stream"
    ),
}


def admission_kinds() -> dict[str, str]:
    """The admission kind of each admission-controlled method."""
    return {method: cost.admission for method, cost in COSTS.items() if cost.admission != "exempt"}


def table() -> str:
    """The cost classes as a Markdown table (docs/production.md holds it)."""
    rows = ["| method | admission | memory per call | waits | why |", "|---|---|---|---|---|"]
    for method, cost in COSTS.items():
        name = method.rsplit("/", 2)[-2].rsplit(".", 1)[-1] + "." + method.rsplit("/", 1)[-1]
        rows.append(f"| {name} | {cost.admission} | {cost.memory} | {cost.waits} | {cost.why} |")
    return "\n".join(rows)
