"""Similarity queries off the event loop, fused into batches under load.

One exact query over 100k x 100 blocks for about 1.4 ms; run in the handler it stalls
every other request (620 req/s at most, p99 42 ms at 16 connections). So handlers
enqueue queries and await a future, and one compute thread takes *everything* that is
waiting (up to ``max_batch``) and answers it with a single matrix product against one
snapshot of the model. At low load a batch is one query and latency is one product; under
load the batch grows and the cost per query falls to about a quarter. numpy releases
the GIL inside BLAS and argpartition, so the loop keeps parsing requests meanwhile.

Words are resolved in the compute thread against the same snapshot that is searched, so
the answer, the version it reports and the "unknown word" verdict all come from one
model version. Each answer says how it was searched (``search``: "exact", or "ivf" when
the snapshot's inverted file answered it); an ivf answer that the snapshot redid exactly
(``ModelIndex.search``: too few rows probed, or a weak k-th score) says "exact" and is
counted in ``redone_exactly`` by reason.

Load shedding. A query waits at most ``max_wait`` seconds before its computation starts.
At admission the engine estimates the wait of the queries already waiting (their number
times the recent cost per query) and refuses new ones beyond ``max_wait`` or beyond
``queue_limit`` waiting queries (``Overloaded``: the handler answers 503 with
Retry-After); a query that still waited past its deadline when the compute thread takes
it is refused then instead of computed late. So under overload clients get fast 503s
and the queries that are answered keep their latency, instead of everyone queueing
without bound.
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

from online.search.model_index import ModelHolder, Neighbour, answered_by
from online.frontend import vector_queries
from online.frontend.vector_queries import QueryRejected, Term
from ps_bridge.metrics import Registry
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.frontend.query")


SHED_REASONS = ("queue_full", "wait_estimate", "deadline")
REDO_REASONS = ("short", "weak")           # why an ivf answer was redone exactly (ModelIndex.search)


class Overloaded(Exception):
    """The engine refused a query (load shedding); answer 503 and let the client retry."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class QueryResult:
    version: int
    neighbours: list[Neighbour] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)      # words not in this version's vocabulary
    resolved: list[str | None] = field(default_factory=list)   # the words the inputs matched (None: a vector)
    search: str = "exact"                                 # how it was answered: exact or ivf
    rejected: QueryRejected | None = None                 # not answerable on this snapshot as asked (a 400)


@dataclass
class _Job:
    terms: list[Term]
    k: int
    future: asyncio.Future
    kind: str = "add"                                     # vector_queries.KINDS
    deadline: float = float("inf")                        # perf_counter time its computation must start by
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
                 threaded: bool = True, max_wait: float = 0.1, queue_limit: int = 1024, searcher=None):
        self.holder = holder
        # ``searcher``: ``search_processes.SearchProcesses``; one compute thread per process, each handing its
        # batch's search to one of them (else one thread that searches itself)
        self.searcher = searcher
        self.parallel = max(1, searcher.count) if searcher is not None else 1
        self._threads: list[threading.Thread] = []
        self.max_batch = max_batch
        self.threaded = threaded
        self.max_wait = max_wait
        self.queue_limit = queue_limit
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: collections.deque[_Job] = collections.deque()
        self._scheduled = False
        self._lock = threading.Lock()
        self.waiting = 0                       # admitted, computation not started
        self.per_query = 0.0                   # recent compute seconds per query (moving average)
        registry = registry or Registry()
        self._answered = {m: registry.counter("livevec_frontend_queries_total", "similarity queries answered, by "
                                              "how they were searched", search=m) for m in ("exact", "ivf")}
        self._redone = {r: registry.counter("livevec_frontend_queries_redone_exactly_total", "ivf answers redone "
                                            "exactly: probed lists too small (short) or k-th score below "
                                            "the floor, /v1/stats search.exact_below (weak)", reason=r) for r in REDO_REASONS}
        self._shed = {r: registry.counter("livevec_frontend_queries_shed_total", "similarity queries refused "
                                          "with 503 (load shedding), by reason", reason=r) for r in SHED_REASONS}
        registry.gauge("livevec_frontend_queries_waiting", "queries admitted and not yet computed",
                       fn=lambda: float(self.waiting))
        self._batch_size = registry.histogram("livevec_frontend_query_batch_size",
                                              "queries answered by one matrix product",
                                              buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
        self._compute_seconds = registry.histogram("livevec_frontend_query_compute_seconds",
                                                   "time of one batched top-k computation")

    def start(self) -> None:
        if self.searcher is not None:
            self.searcher.start()
        if self.threaded and not self._threads:
            self._threads = [threading.Thread(target=self._run, name=f"similarity-queries-{i}", daemon=True)
                             for i in range(self.parallel)]
            for t in self._threads:
                t.start()

    def stop(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(timeout=10)
        self._threads = []
        if self.searcher is not None:
            self.searcher.stop()

    async def query(self, positive: list[str], negative: list[str], k: int) -> QueryResult:
        """Top ``k`` words by cosine to sum(positive) - sum(negative), excluding the inputs.
        Raises ``Overloaded`` when shed."""
        terms = [Term(w, 1.0) for w in positive] + [Term(w, -1.0) for w in negative]
        return await self.query_terms(terms, k)

    async def query_terms(self, terms: list[Term], k: int, kind: str = "add") -> QueryResult:
        """Words and vectors with weights (``vector_queries``): ``add`` (3CosAdd), ``mul`` (3CosMul)
        or ``closer`` (two words: the rows nearer the first than the second is; ``k`` unused).
        A query the snapshot cannot answer comes back with ``rejected``; shed: ``Overloaded``."""
        if kind not in vector_queries.KINDS:
            raise ValueError(f"kind must be one of {vector_queries.KINDS}, got {kind!r}")
        future = asyncio.get_running_loop().create_future()
        self._submit([_Job(list(terms), int(k), future, kind)])
        return await future

    async def query_many(self, words: list[str], k: int) -> list[QueryResult]:
        """Neighbours of each word; queued together so they share matrix products (admitted or
        shed together)."""
        loop = asyncio.get_running_loop()
        jobs = [_Job([Term(w, 1.0)], int(k), loop.create_future()) for w in words]
        self._submit(jobs)
        return list(await asyncio.gather(*(job.future for job in jobs)))

    def _admit(self, jobs: list[_Job]) -> None:
        """Refuse ``jobs`` if the queries already waiting would make them start after ``max_wait``
        (or there are too many); else give each its deadline (a request's own queries are
        computed one after the other, so later ones get their predecessors' cost on top)."""
        with self._lock:
            waiting, per_query = self.waiting, self.per_query
            if waiting + len(jobs) > self.queue_limit and waiting:
                reason, message = "queue_full", f"{waiting} queries are waiting (limit {self.queue_limit}); retry"
            elif waiting * per_query / self.parallel > self.max_wait:
                reason = "wait_estimate"
                message = (f"{waiting} queries are waiting, about {1e3 * waiting * per_query / self.parallel:.0f} ms "
                           f"of work, more "
                           f"than the {1e3 * self.max_wait:.0f} ms a query may wait; retry")
            else:
                self.waiting += len(jobs)
                now = time.perf_counter()
                for i, job in enumerate(jobs):
                    job.deadline = now + self.max_wait + 2 * i * per_query / self.parallel
                return
        self._shed[reason].inc(len(jobs))
        raise Overloaded(reason, message)

    def _submit(self, jobs: list[_Job]) -> None:
        self._admit(jobs)
        if self.threaded:
            for job in jobs:
                self._queue.put(job)
            return
        self._pending.extend(jobs)
        if not self._scheduled:
            self._scheduled = True
            jobs[0].future.get_loop().call_soon(self._run_inline)

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
        with self._lock:
            self.waiting -= len(batch)
        late = [j for j in batch if started > j.deadline]
        if late:                            # waited past its deadline: refused now rather than answered late
            self._shed["deadline"].inc(len(late))
            for j in late:
                j.error = Overloaded("deadline", f"the query waited {1e3 * (started - j.deadline + self.max_wait):.0f}"
                                                 f" ms, more than {1e3 * self.max_wait:.0f} ms; retry")
            batch = [j for j in batch if j.error is None]
        if not batch:
            return
        try:
            self._compute(batch)
        except Exception as exc:        # a bug, not user input: fail these queries, keep serving
            log_event(log, "query_batch_failed", logging.ERROR, size=len(batch), error=repr(exc))
            for j in batch:
                j.error = exc
        elapsed = time.perf_counter() - started
        with self._lock:
            self.per_query = 0.8 * self.per_query + 0.2 * (elapsed / len(batch)) if self.per_query else \
                elapsed / len(batch)
        self._compute_seconds.observe(elapsed)
        self._batch_size.observe(len(batch))

    def report(self) -> dict:
        """Load shedding and search methods for ``/v1/stats``."""
        return {"waiting": self.waiting, "ms_per_query": round(1e3 * self.per_query, 3),
                "compute_threads": self.parallel,
                "search_processes": self.searcher.report() if self.searcher is not None else None,
                "max_wait_ms": round(1e3 * self.max_wait, 1), "queue_limit": self.queue_limit,
                "answered": {m: int(c.value) for m, c in self._answered.items()},
                "redone_exactly": {r: int(c.value) for r, c in self._redone.items()},
                "shed": {r: int(c.value) for r, c in self._shed.items()}}

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
            job.result = QueryResult(index.version)
            try:
                resolved = vector_queries.resolve(index, job.terms)
                job.result.unknown, job.result.resolved = resolved.unknown, resolved.words
                if resolved.unknown:
                    continue
                rows = resolved.rows
                if job.kind == "mul":
                    job.result.neighbours = vector_queries.cosmul_top_k(index, job.terms, rows, job.k)
                    self._answered["exact"].inc()
                    continue
                if job.kind == "closer":
                    job.result.neighbours = vector_queries.closer_than(index, rows[0], rows[1])
                    continue
                queries[len(active)] = vector_queries.direction(index, job.terms, rows)
            except QueryRejected as exc:
                job.result.rejected = exc
                continue
            active.append(job)
            exclude.append([r for r in rows if r >= 0])
            ks.append(job.k)
        if not active:
            return
        if self.searcher is not None:       # index stays referenced until the answer is back: nothing it maps changes
            top, top_scores, why = self.searcher.search_rows(index, queries[:len(active)], exclude, ks)
        else:
            top, top_scores, why = index.search_rows(queries[:len(active)], exclude, ks)
        answers = index.neighbours(top, top_scores, ks)
        methods = answered_by(why)
        for job, neighbours, method, reason in zip(active, answers, methods, why):
            job.result.neighbours = neighbours
            job.result.search = method
            self._answered[method].inc()
            if reason in self._redone:
                self._redone[reason].inc()

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
