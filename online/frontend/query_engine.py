"""Similarity queries off the event loop, fused into batches under load.

One exact query over 100k x 100 blocks for about 1.4 ms; run in the handler it stalls
every other request (ceilings.md: 620 req/s, p99 42 ms at 16 connections). So handlers
enqueue queries and await a future, and one compute thread takes *everything* that is
waiting (up to ``max_batch``) and answers it with a single matrix product against one
snapshot of the model. At low load a batch is one query and latency is one product; under
load the batch grows and the cost per query falls to about a quarter. numpy releases
the GIL inside BLAS and argpartition, so the loop keeps parsing requests meanwhile.

Words are resolved in the compute thread against the same snapshot that is searched, so
the answer, the version it reports and the "unknown word" verdict all come from one
model version.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from online.frontend.model_index import ModelHolder, Neighbour
from ps_bridge.metrics import Registry
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.frontend.query")


@dataclass
class QueryResult:
    version: int
    neighbours: list[Neighbour] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)      # words not in this version's vocabulary
    resolved: list[str] = field(default_factory=list)     # the vocabulary words the inputs matched


@dataclass
class _Job:
    positive: list[str]
    negative: list[str]
    k: int
    future: asyncio.Future
    result: QueryResult | None = None
    error: BaseException | None = None


class QueryEngine:
    """Batches queries and answers them from one snapshot per batch.

    ``threaded=True`` (default): a compute thread, so the loop parses requests while BLAS
    runs. ``threaded=False``: batches run on the event loop itself (scheduled with
    ``call_soon``, so every request that arrived meanwhile joins the batch); no GIL
    hand-offs between threads, at the price of blocking the loop for each batch.
    """

    def __init__(self, holder: ModelHolder, max_batch: int = 64, registry: Registry | None = None,
                 threaded: bool = True):
        self.holder = holder
        self.max_batch = max_batch
        self.threaded = threaded
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: collections.deque[_Job] = collections.deque()
        self._scheduled = False
        self._thread: threading.Thread | None = None
        registry = registry or Registry()
        self._batch_size = registry.histogram("livevec_frontend_query_batch_size",
                                              "queries answered by one matrix product",
                                              buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
        self._compute_seconds = registry.histogram("livevec_frontend_query_compute_seconds",
                                                   "time of one batched top-k computation")

    def start(self) -> None:
        if self.threaded and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="similarity-queries", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=10)
            self._thread = None

    async def query(self, positive: list[str], negative: list[str], k: int) -> QueryResult:
        """Top ``k`` words by cosine to sum(positive) - sum(negative), excluding the inputs."""
        future = asyncio.get_running_loop().create_future()
        self._submit(_Job(list(positive), list(negative), int(k), future))
        return await future

    async def query_many(self, words: list[str], k: int) -> list[QueryResult]:
        """Neighbours of each word; queued together so they share matrix products."""
        loop = asyncio.get_running_loop()
        jobs = [_Job([w], [], int(k), loop.create_future()) for w in words]
        for job in jobs:
            self._submit(job)
        return list(await asyncio.gather(*(job.future for job in jobs)))

    def _submit(self, job: _Job) -> None:
        if self.threaded:
            self._queue.put(job)
            return
        self._pending.append(job)
        if not self._scheduled:
            self._scheduled = True
            job.future.get_loop().call_soon(self._run_inline)

    def _run_inline(self) -> None:
        self._scheduled = False
        batch = [self._pending.popleft() for _ in range(min(self.max_batch, len(self._pending)))]
        if self._pending:                   # the rest after the loop has had a turn
            self._scheduled = True
            batch[0].future.get_loop().call_soon(self._run_inline)
        self._process(batch)
        _settle(batch)

    def _process(self, batch: list[_Job]) -> None:
        started = time.perf_counter()
        try:
            self._compute(batch)
        except Exception as exc:        # a bug, not user input: fail these queries, keep serving
            log_event(log, "query_batch_failed", logging.ERROR, size=len(batch), error=repr(exc))
            for j in batch:
                j.error = exc
        self._compute_seconds.observe(time.perf_counter() - started)
        self._batch_size.observe(len(batch))

    # ------------------------------------------------------------- compute thread
    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            batch = [job]
            stop = False
            while len(batch) < self.max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            self._process(batch)
            self._deliver(batch)
            if stop:
                return

    def _compute(self, batch: list[_Job]) -> None:
        index = self.holder.current            # one snapshot for the whole batch
        dim = index.dim
        active, exclude, ks = [], [], []
        queries = np.empty((len(batch), dim), dtype=np.float32)
        for job in batch:
            pos = [index.row(w) for w in job.positive]
            neg = [index.row(w) for w in job.negative]
            unknown = [w for w, r in zip(job.positive + job.negative, pos + neg) if r < 0]
            job.result = QueryResult(index.version, unknown=unknown)
            if unknown:
                continue
            job.result.resolved = [index.words[r] for r in pos + neg]
            queries[len(active)] = index.query_vector(pos, neg)
            active.append(job)
            exclude.append(pos + neg)
            ks.append(job.k)
        if not active:
            return
        answers = index.top_k(queries[:len(active)], exclude, ks)
        for job, neighbours in zip(active, answers):
            job.result.neighbours = neighbours

    @staticmethod
    def _deliver(batch: list[_Job]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[_Job]] = {}
        for job in batch:
            by_loop.setdefault(job.future.get_loop(), []).append(job)
        for loop, jobs in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, jobs)
            except RuntimeError:            # the loop has closed (shutdown); nobody is waiting
                pass


def _settle(jobs: list[_Job]) -> None:
    for job in jobs:
        if job.future.done():               # the client went away and the handler was cancelled
            continue
        if job.error is not None:
            job.future.set_exception(job.error)
        else:
            job.future.set_result(job.result)
