"""MemoryService configuration, read once from environment variables.

Documented in docs/memory.md. A bad value fails at start with a message that
names the variable.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from services.common.domain import Budget
from services.common.settings import (
    Env,
    SettingsError,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_str,
)
from services.common.validation import NAMESPACE_PATTERN
from services.llm.settings import ModelSettings, model_settings

# The curator model with nothing set: its offline default.
DEFAULT_CHAT_MODEL = model_settings({}, "curator")

LOCAL_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
LOCAL_MODEL_DIMENSION = 384

_DURATION = re.compile(r"(\d+)\s*([smhd]?)")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(name: str, raw: str) -> timedelta | None:
    """`0` (none), or an integer with an optional unit s, m, h or d: `90d`, `3600`."""
    match = _DURATION.fullmatch(raw.strip())
    if not match:
        raise SettingsError(f"{name} must be a duration like 3600, 45m, 12h or 30d, got {raw!r}")
    seconds = int(match[1]) * _UNIT_SECONDS[match[2]]
    return timedelta(seconds=seconds) if seconds else None


def parse_namespace_ttls(name: str, raw: str) -> dict[str, timedelta | None]:
    """`ns-a=30d,ns-b=0`: per-namespace default TTLs (0 means none)."""
    ttls: dict[str, timedelta | None] = {}
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not NAMESPACE_PATTERN.fullmatch(key):
            raise SettingsError(f"{name} must be namespace=duration pairs, got {item!r}")
        ttls[key] = parse_duration(name, value)
    return ttls


@dataclass(frozen=True)
class MemoryLimits:
    """Explicit limits; each breach is INVALID_ARGUMENT."""

    max_content_bytes: int = 16 * 1024
    max_query_bytes: int = 4 * 1024
    max_sources: int = 32
    # An external source's URI (RUNIFOLD_MEMORY_MAX_EXTERNAL_URI_BYTES), in UTF-8 bytes.
    max_external_uri_bytes: int = 2048


# WatchMemories' byte budget (RUNIFOLD_MEMORY_WATCH_MAX_BUFFERED_BYTES*): 64 MiB for the
# process, 16 MiB a namespace, as WatchConversation's.
DEFAULT_WATCH_BUFFERED_BYTES = 64 * 1024 * 1024
DEFAULT_WATCH_BUFFERED_BYTES_PER_NAMESPACE = 16 * 1024 * 1024
# What a page holds per change beside its memory's text, charged with it: the change's
# Python objects (the event, the memory, its sources, metadata and times) and its framing.
CHANGE_OVERHEAD_BYTES = 2048
# The most a change's sources and metadata hold as stored JSON beyond its content: 32
# metadata pairs of a 64-character key and a 1 KiB value, each character escaped at
# worst, and 32 sources.
CHANGE_EXTRA_BYTES = 256 * 1024


@dataclass(frozen=True)
class WatchLimits:
    """The limits of WatchMemories (services/memory/watch/; docs/memory.md "The change
    feed"), read from RUNIFOLD_MEMORY_WATCH_*."""

    # Streams open at once in this process, and per namespace in this process. A stream
    # follows a whole namespace, so fewer are needed than of WatchConversation; with
    # its 512 the all-in-one server's streams stay below RUNIFOLD_MAX_CONCURRENT_RPCS.
    max_watchers: int = 256
    max_watchers_per_namespace: int = 32
    # A quiet stream gets a heartbeat this often (a request may ask for 1 s to 5 min).
    heartbeat_s: float = 30.0
    # How often the process looks at every watched namespace without being woken (the
    # safety net of a missed notification) and renews its `watched_until`.
    poll_s: float = 5.0
    # A message the client has not taken within this time ends the stream
    # (RESOURCE_EXHAUSTED / WATCHER_TOO_SLOW); the client resumes from its last change.
    send_timeout_s: float = 30.0
    # One read of a stream: at most this many changes, and about this many bytes.
    page_changes: int = 256
    page_bytes: int = 512 * 1024
    # The retry delay (RetryInfo) of a stream refused beyond a watcher limit.
    retry_after_s: float = 5.0
    # The bytes of the pages streams hold at once (read and not yet taken by the
    # transport), in this process and per namespace in it; a stream waits for room
    # before it reads (services/common/byte_budget.py).
    max_buffered_bytes: int = DEFAULT_WATCH_BUFFERED_BYTES
    max_buffered_bytes_per_namespace: int = DEFAULT_WATCH_BUFFERED_BYTES_PER_NAMESPACE
    # The largest memory content a page may end with (MemoryLimits.max_content_bytes).
    max_content_bytes: int = 16 * 1024

    @property
    def page_charge(self) -> int:
        """The most bytes one page is charged (what a stream reserves before it reads):
        `page_bytes` of changes, then the change that crosses it, and each change's share
        of what the stream holds beside its memory's text."""
        return (
            self.page_bytes
            + self.max_content_bytes
            + CHANGE_EXTRA_BYTES
            + self.page_changes * CHANGE_OVERHEAD_BYTES
        )

    @classmethod
    def from_env(cls, env: Env, max_content_bytes: int = 16 * 1024) -> WatchLimits:
        per_namespace = env_int(
            env,
            "RUNIFOLD_MEMORY_WATCH_MAX_BUFFERED_BYTES_PER_NAMESPACE",
            DEFAULT_WATCH_BUFFERED_BYTES_PER_NAMESPACE,
            minimum=1,
        )
        total = env_int(
            env,
            "RUNIFOLD_MEMORY_WATCH_MAX_BUFFERED_BYTES",
            DEFAULT_WATCH_BUFFERED_BYTES,
            minimum=1,
        )
        limits = cls(
            max_watchers=env_int(
                env, "RUNIFOLD_MEMORY_WATCH_MAX_WATCHERS", 256, minimum=1, maximum=100_000
            ),
            max_watchers_per_namespace=env_int(
                env,
                "RUNIFOLD_MEMORY_WATCH_MAX_WATCHERS_PER_NAMESPACE",
                32,
                minimum=1,
                maximum=100_000,
            ),
            heartbeat_s=env_float(
                env, "RUNIFOLD_MEMORY_WATCH_HEARTBEAT_S", 30.0, minimum=1.0, maximum=300.0
            ),
            poll_s=env_float(env, "RUNIFOLD_MEMORY_WATCH_POLL_S", 5.0, minimum=0.1, maximum=3600.0),
            send_timeout_s=env_float(
                env, "RUNIFOLD_MEMORY_WATCH_SEND_TIMEOUT_S", 30.0, minimum=0.1, maximum=3600.0
            ),
            max_buffered_bytes=total,
            max_buffered_bytes_per_namespace=per_namespace,
            max_content_bytes=max_content_bytes,
        )
        # A namespace must have room for one page, and the process for a namespace's share.
        if per_namespace < limits.page_charge:
            raise SettingsError(
                f"RUNIFOLD_MEMORY_WATCH_MAX_BUFFERED_BYTES_PER_NAMESPACE ({per_namespace}) "
                f"must be at least one page of a stream, {limits.page_charge} bytes"
            )
        if total < per_namespace:
            raise SettingsError(
                f"RUNIFOLD_MEMORY_WATCH_MAX_BUFFERED_BYTES ({total}) must be at least "
                f"RUNIFOLD_MEMORY_WATCH_MAX_BUFFERED_BYTES_PER_NAMESPACE ({per_namespace})"
            )
        return limits


@dataclass(frozen=True)
class MemoryConfig:
    """Everything MemoryService reads from the environment."""

    index: str = "edge"
    # Where the Edge shard lives; None: <RUNIFOLD_DATA_DIR>/memory-index.
    index_dir: Path | None = None
    qdrant_url: str = ""
    qdrant_api_key: str = ""
    qdrant_timeout_s: float = 5.0
    # pgvector: the HNSW search breadth and the database (default: DATABASE_URL).
    pgvector_ef_search: int = 200
    pgvector_exact_below: int = 10_000
    pgvector_url: str = ""
    pgvector_timeout_s: float = 5.0
    embeddings: str = "local"
    embeddings_url: str = ""
    embeddings_model: str = LOCAL_MODEL_NAME
    embeddings_dimension: int = LOCAL_MODEL_DIMENSION
    embeddings_api_key: str = ""
    embeddings_timeout_s: float = 30.0
    embeddings_batch: int = 64
    # ONNX Runtime intra-op threads for the local model; 0 leaves its default.
    embeddings_threads: int = 1
    # Where the local model's built graph is kept (None: $XDG_CACHE_HOME/runifold).
    embeddings_cache_dir: Path | None = None
    # The local model's forward passes: about this many tokens at most (keeps a pass,
    # which cannot be stopped, short). The queue in front of the model: texts (local)
    # or requests (endpoint) waiting at most; beyond, OVERLOADED. The endpoint's
    # requests in flight at most.
    embeddings_batch_tokens: int = 256
    embeddings_max_queued: int = 256
    embeddings_max_concurrent: int = 16
    # While other namespaces use the local model too, one namespace may keep it busy
    # at most this fraction of the time (1: no limit).
    embeddings_namespace_share: float = 0.25
    default_ttl: timedelta | None = None
    namespace_ttls: Mapping[str, timedelta | None] = field(default_factory=dict)
    # Search asks the index for limit * overfetch + 8 candidates: room for the
    # hits that the PostgreSQL re-read drops (deleted, expired, filtered).
    overfetch: int = 2
    # Search filters on valid time inside the index as well as in the store's re-read
    # (off: the store alone drops facts not valid at the time asked, as before issue 17;
    # for comparison, and an escape hatch should an engine's filtered search misbehave).
    index_validity_filter: bool = True
    # Search modes (issue 21, docs/memory.md "Search modes"): the mode of a request that
    # names none; how hybrid fuses the cosine and BM25, the weight of BM25, RRF's k.
    search_mode: str = "hybrid"  # "dense", "lexical" or "hybrid"
    hybrid_fusion: str = "score"  # "score" or "rrf"
    hybrid_weight: float = 0.2
    hybrid_rrf_k: int = 60
    # -- ProposeMemories -----------------------------------------------------------
    # The curator's model (RUNIFOLD_CURATOR_MODEL_*, RUNIFOLD_MODEL_*); no URL: the
    # offline proposer.
    chat_model: ModelSettings = DEFAULT_CHAT_MODEL
    # The longest range one call reads, and how much of each entry the model sees.
    propose_max_entries: int = 200
    propose_max_entry_chars: int = 4000
    # The budget a ProposeMemories gets where its Budget fields are 0 (one model call).
    propose_max_output_tokens: int = 4096
    propose_max_input_tokens: int = 200_000
    # -- automatic curation (curation/, docs/memory.md "Automatic curation") ---------
    # Curation workers in this process (0: this process runs no curation job).
    curation_workers: int = 1
    # Entries one batch reads (one proposer call, one transaction), proposals it keeps,
    # batches one attempt of a job runs before giving others a turn.
    curation_batch_entries: int = 32
    curation_max_proposals: int = 16
    curation_batches_per_run: int = 8
    # A batch refused because a memory it supersedes changed meanwhile is proposed again
    # this many times (each a model call) before the attempt fails.
    curation_conflict_retries: int = 2
    curation_poll_interval_s: float = 1.0
    curation_lease_s: float = 60.0
    curation_job_timeout_s: float = 300.0
    curation_max_failures: int = 5
    curation_backoff_s: float = 2.0
    curation_backoff_max_s: float = 300.0
    curation_gauge_interval_s: float = 5.0
    curation_job_retention_s: float = 7 * 24 * 3600.0
    # Per namespace: waiting or running jobs at most, and model calls and tokens (input
    # and output) its curation may use per clock hour (0: no limit).
    curation_max_pending: int = 1000
    curation_max_model_calls_per_hour: int = 600
    curation_max_tokens_per_hour: int = 2_000_000
    # Indexer loops in this process; each claims its own outbox batches.
    indexers: int = 1
    indexer_batch: int = 64
    # How long a claimed batch is an indexer's: past it, the rows are claimable again.
    indexer_claim_s: float = 60.0
    indexer_poll_s: float = 1.0
    indexer_backoff_max_s: float = 30.0
    # How long the index keeps the tombstone of a deleted memory (older writes of the
    # memory are refused while it stands).
    index_tombstone_retention: timedelta = timedelta(days=1)
    sweep_interval_s: float = 30.0
    sweep_batch: int = 500
    # How long an UpsertMemory request id is remembered (a retry after that writes again).
    request_id_retention_s: float = 24 * 3600.0
    limits: MemoryLimits = field(default_factory=MemoryLimits)
    # WatchMemories.
    watch: WatchLimits = field(default_factory=WatchLimits)

    @property
    def propose_budget(self) -> Budget:
        """The budget a ProposeMemories gets where its Budget fields are 0."""
        return Budget(
            max_output_tokens=self.propose_max_output_tokens,
            max_model_calls=1,
            max_input_tokens=self.propose_max_input_tokens,
        )

    def ttl_for(self, namespace: str) -> timedelta | None:
        """The default TTL of a namespace: its own entry, else the global default."""
        if namespace in self.namespace_ttls:
            return self.namespace_ttls[namespace]
        return self.default_ttl

    @classmethod
    def from_env(cls, env: Env | None = None) -> MemoryConfig:
        """Read every RUNIFOLD_MEMORY_* / QDRANT_* variable once."""
        env = os.environ if env is None else env
        index = env_choice(env, "RUNIFOLD_MEMORY_INDEX", "edge", ("edge", "qdrant", "pgvector"))
        qdrant_url = env_str(env, "QDRANT_URL", "")
        if index == "qdrant" and not qdrant_url:
            raise SettingsError("QDRANT_URL must be set when RUNIFOLD_MEMORY_INDEX=qdrant")
        embeddings = env_choice(env, "RUNIFOLD_EMBEDDINGS", "local", ("local", "openai"))
        embeddings_url = env_str(env, "RUNIFOLD_EMBEDDINGS_URL", "")
        if embeddings == "openai":
            if not embeddings_url:
                raise SettingsError(
                    "RUNIFOLD_EMBEDDINGS_URL must be set when RUNIFOLD_EMBEDDINGS=openai"
                )
            if not env_str(env, "RUNIFOLD_EMBEDDINGS_MODEL", ""):
                raise SettingsError(
                    "RUNIFOLD_EMBEDDINGS_MODEL must be set when RUNIFOLD_EMBEDDINGS=openai"
                )
            if not env_str(env, "RUNIFOLD_EMBEDDINGS_DIMENSION", ""):
                raise SettingsError(
                    "RUNIFOLD_EMBEDDINGS_DIMENSION must be set when RUNIFOLD_EMBEDDINGS=openai"
                )
        index_dir = env_str(env, "RUNIFOLD_MEMORY_INDEX_DIR", "")
        indexer_claim_s = env_float(env, "RUNIFOLD_MEMORY_INDEXER_CLAIM_S", 60.0, minimum=1.0)
        retention = parse_duration(
            "RUNIFOLD_MEMORY_INDEX_TOMBSTONE_RETENTION",
            env_str(env, "RUNIFOLD_MEMORY_INDEX_TOMBSTONE_RETENTION", "1d"),
        )
        # A tombstone must outlive every write that an indexer may still have in
        # flight: that write was claimed at most one claim lease before.
        if retention is None or retention.total_seconds() < 10 * indexer_claim_s:
            raise SettingsError(
                "RUNIFOLD_MEMORY_INDEX_TOMBSTONE_RETENTION must be at least 10 x "
                f"RUNIFOLD_MEMORY_INDEXER_CLAIM_S ({10 * indexer_claim_s:.0f} s)"
            )
        backoff_s = env_float(env, "RUNIFOLD_CURATION_JOB_BACKOFF_S", 2.0, minimum=0.0)
        if env_float(env, "RUNIFOLD_CURATION_JOB_BACKOFF_MAX_S", 300.0, minimum=0.0) < backoff_s:
            raise SettingsError(
                "RUNIFOLD_CURATION_JOB_BACKOFF_MAX_S must be at least "
                "RUNIFOLD_CURATION_JOB_BACKOFF_S"
            )
        return cls(
            index=index,
            index_dir=Path(index_dir) if index_dir else None,
            qdrant_url=qdrant_url,
            qdrant_api_key=env_str(env, "QDRANT_API_KEY", ""),
            qdrant_timeout_s=env_float(env, "RUNIFOLD_QDRANT_TIMEOUT_S", 5.0, minimum=0.1),
            pgvector_ef_search=env_int(
                env, "RUNIFOLD_MEMORY_PGVECTOR_EF_SEARCH", 200, minimum=10, maximum=1000
            ),
            pgvector_exact_below=env_int(
                env, "RUNIFOLD_MEMORY_PGVECTOR_EXACT_BELOW", 10_000, minimum=0, maximum=10_000_000
            ),
            pgvector_url=env_str(env, "RUNIFOLD_MEMORY_PGVECTOR_URL", ""),
            pgvector_timeout_s=env_float(
                env, "RUNIFOLD_MEMORY_PGVECTOR_TIMEOUT_S", 5.0, minimum=0.1
            ),
            embeddings=embeddings,
            embeddings_url=embeddings_url.rstrip("/"),
            embeddings_model=env_str(env, "RUNIFOLD_EMBEDDINGS_MODEL", LOCAL_MODEL_NAME)
            if embeddings == "openai"
            else LOCAL_MODEL_NAME,
            embeddings_dimension=env_int(
                env, "RUNIFOLD_EMBEDDINGS_DIMENSION", LOCAL_MODEL_DIMENSION, minimum=1, maximum=8192
            )
            if embeddings == "openai"
            else LOCAL_MODEL_DIMENSION,
            embeddings_api_key=env_str(env, "RUNIFOLD_EMBEDDINGS_API_KEY", ""),
            embeddings_timeout_s=env_float(env, "RUNIFOLD_EMBEDDINGS_TIMEOUT_S", 30.0, minimum=0.1),
            embeddings_batch=env_int(env, "RUNIFOLD_EMBEDDINGS_BATCH", 64, minimum=1, maximum=2048),
            embeddings_threads=env_int(
                env, "RUNIFOLD_EMBEDDINGS_THREADS", 1, minimum=0, maximum=256
            ),
            embeddings_cache_dir=Path(cache)
            if (cache := env_str(env, "RUNIFOLD_EMBEDDINGS_CACHE_DIR", ""))
            else None,
            embeddings_batch_tokens=env_int(
                env, "RUNIFOLD_EMBEDDINGS_BATCH_TOKENS", 256, minimum=16, maximum=1_000_000
            ),
            embeddings_max_queued=env_int(
                env, "RUNIFOLD_EMBEDDINGS_MAX_QUEUED", 256, minimum=1, maximum=1_000_000
            ),
            embeddings_max_concurrent=env_int(
                env, "RUNIFOLD_EMBEDDINGS_MAX_CONCURRENT", 16, minimum=1, maximum=4096
            ),
            embeddings_namespace_share=env_float(
                env, "RUNIFOLD_EMBEDDINGS_NAMESPACE_SHARE", 0.25, minimum=0.01, maximum=1.0
            ),
            default_ttl=parse_duration(
                "RUNIFOLD_MEMORY_DEFAULT_TTL", env_str(env, "RUNIFOLD_MEMORY_DEFAULT_TTL", "0")
            ),
            namespace_ttls=parse_namespace_ttls(
                "RUNIFOLD_MEMORY_NAMESPACE_TTLS", env_str(env, "RUNIFOLD_MEMORY_NAMESPACE_TTLS", "")
            ),
            overfetch=env_int(env, "RUNIFOLD_MEMORY_OVERFETCH", 2, minimum=1, maximum=16),
            index_validity_filter=env_bool(env, "RUNIFOLD_MEMORY_INDEX_VALIDITY_FILTER", True),
            search_mode=env_choice(
                env, "RUNIFOLD_MEMORY_SEARCH_MODE", "hybrid", ("dense", "lexical", "hybrid")
            ),
            hybrid_fusion=env_choice(
                env, "RUNIFOLD_MEMORY_HYBRID_FUSION", "score", ("score", "rrf")
            ),
            hybrid_weight=env_float(
                env, "RUNIFOLD_MEMORY_HYBRID_WEIGHT", 0.2, minimum=0.0, maximum=1.0
            ),
            hybrid_rrf_k=env_int(
                env, "RUNIFOLD_MEMORY_HYBRID_RRF_K", 60, minimum=1, maximum=10_000
            ),
            chat_model=model_settings(env, "curator"),
            propose_max_entries=env_int(
                env, "RUNIFOLD_MEMORY_PROPOSE_MAX_ENTRIES", 200, minimum=1, maximum=1000
            ),
            propose_max_entry_chars=env_int(
                env, "RUNIFOLD_MEMORY_PROPOSE_MAX_ENTRY_CHARS", 4000, minimum=64, maximum=1_000_000
            ),
            propose_max_output_tokens=env_int(
                env, "RUNIFOLD_MEMORY_PROPOSE_MAX_OUTPUT_TOKENS", 4096, minimum=64, maximum=65_536
            ),
            propose_max_input_tokens=env_int(
                env, "RUNIFOLD_MEMORY_PROPOSE_MAX_INPUT_TOKENS", 200_000, minimum=256
            ),
            curation_workers=env_int(env, "RUNIFOLD_CURATION_WORKERS", 1, minimum=0, maximum=64),
            curation_batch_entries=env_int(
                env, "RUNIFOLD_CURATION_BATCH_ENTRIES", 32, minimum=1, maximum=1000
            ),
            curation_max_proposals=env_int(
                env, "RUNIFOLD_CURATION_MAX_PROPOSALS", 16, minimum=1, maximum=32
            ),
            curation_batches_per_run=env_int(
                env, "RUNIFOLD_CURATION_BATCHES_PER_RUN", 8, minimum=1, maximum=1000
            ),
            curation_conflict_retries=env_int(
                env, "RUNIFOLD_CURATION_CONFLICT_RETRIES", 2, minimum=0, maximum=10
            ),
            curation_poll_interval_s=env_float(
                env, "RUNIFOLD_CURATION_POLL_INTERVAL_S", 1.0, minimum=0.01
            ),
            curation_lease_s=env_float(env, "RUNIFOLD_CURATION_JOB_LEASE_S", 60.0, minimum=0.5),
            curation_job_timeout_s=env_float(
                env, "RUNIFOLD_CURATION_JOB_TIMEOUT_S", 300.0, minimum=1.0
            ),
            curation_max_failures=env_int(
                env, "RUNIFOLD_CURATION_JOB_MAX_FAILURES", 5, minimum=1, maximum=1000
            ),
            curation_backoff_s=env_float(env, "RUNIFOLD_CURATION_JOB_BACKOFF_S", 2.0, minimum=0.0),
            curation_backoff_max_s=env_float(
                env, "RUNIFOLD_CURATION_JOB_BACKOFF_MAX_S", 300.0, minimum=0.0
            ),
            curation_gauge_interval_s=env_float(
                env, "RUNIFOLD_CURATION_GAUGE_INTERVAL_S", 5.0, minimum=0.05
            ),
            curation_job_retention_s=env_float(
                env, "RUNIFOLD_CURATION_JOB_RETENTION_S", 7 * 24 * 3600.0, minimum=1.0
            ),
            curation_max_pending=env_int(
                env, "RUNIFOLD_CURATION_MAX_PENDING_PER_NAMESPACE", 1000, minimum=1, maximum=100_000
            ),
            curation_max_model_calls_per_hour=env_int(
                env, "RUNIFOLD_CURATION_MAX_MODEL_CALLS_PER_HOUR", 600, minimum=0
            ),
            curation_max_tokens_per_hour=env_int(
                env, "RUNIFOLD_CURATION_MAX_TOKENS_PER_HOUR", 2_000_000, minimum=0
            ),
            indexers=env_int(env, "RUNIFOLD_MEMORY_INDEXERS", 1, minimum=0, maximum=64),
            indexer_batch=env_int(
                env, "RUNIFOLD_MEMORY_INDEXER_BATCH", 64, minimum=1, maximum=4096
            ),
            indexer_claim_s=indexer_claim_s,
            indexer_poll_s=env_float(env, "RUNIFOLD_MEMORY_INDEXER_POLL_S", 1.0, minimum=0.01),
            indexer_backoff_max_s=env_float(
                env, "RUNIFOLD_MEMORY_INDEXER_BACKOFF_MAX_S", 30.0, minimum=0.01
            ),
            index_tombstone_retention=retention,
            sweep_interval_s=env_float(env, "RUNIFOLD_MEMORY_SWEEP_INTERVAL_S", 30.0, minimum=0.01),
            request_id_retention_s=env_float(
                env, "RUNIFOLD_MEMORY_REQUEST_ID_RETENTION_S", 24 * 3600.0, minimum=60.0
            ),
            sweep_batch=env_int(
                env, "RUNIFOLD_MEMORY_SWEEP_BATCH", 500, minimum=1, maximum=100_000
            ),
            limits=MemoryLimits(
                max_external_uri_bytes=env_int(
                    env, "RUNIFOLD_MEMORY_MAX_EXTERNAL_URI_BYTES", 2048, minimum=64, maximum=65_536
                )
            ),
            watch=WatchLimits.from_env(env, MemoryLimits().max_content_bytes),
        )
