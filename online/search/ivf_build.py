"""Building the inverted file in the background, and watching how good it still is.

``IvfMaintainer.run`` is a task of the front end. Every ``CHECK_INTERVAL`` it asks whether
the served snapshot needs lists (``wanted``): none yet on a model of ``ivf_min_rows`` rows or
more, too many rows placed since the last build (``REBUILD_DRIFT`` of them: the centroids
describe an older model), the vocabulary grew or shrank by half, or the measured recall
fell below ``REBUILD_RECALL``. A build runs in a worker thread and never holds a snapshot
for long (which would keep the sync from reusing its buffer, ``row_store``):

1. spherical k-means (``train``): ``L`` centroids (``ivf_lists``, default sqrt(n)) from
   a sample of up to ``SAMPLE_PER_LIST`` rows per list, ``ITERATIONS`` Lloyd steps;
2. every row's nearest centroid (``assign``), read ``READ_CHUNK`` rows at a time from the
   snapshot current at that moment. With many lists the centroids are grouped under
   sqrt(L) super-centroids and a row is compared with the members of its ``SUPER_PROBE``
   best groups only (about 5x fewer products than all L, at the price of a few rows
   filed in their second-best list);
3. the result goes to the store (``pending_ivf``); the syncs install it a part at a time
   (``snapshot_writer.Relayout``): rows changed since step 1 started (``Store.watch``) and rows
   added since are re-assigned as they are moved, and once the last part is in, queries use it.

Until the first lists are in, and whenever ``LIVEVEC_SEARCH=exact``, queries are answered exactly.

``RecallMonitor``: every ``MONITOR_INTERVAL`` a few vocabulary words (``MONITOR_QUERIES``, fewer
above ``MONITOR_ROWS`` / 8 rows, so a check costs at most about one exact search of 8M rows)
are searched both ways (as served, and exact) on the served snapshot; the running recall@10 over the last
``MONITOR_WINDOW`` queries is in ``/v1/stats`` (``search.recall_at_10``) and triggers a
rebuild when it drops. The same words searched in the lists alone (no exact redo) give pairs
(k-th score, recall); from them the monitor picks the lowest k-th score below which answers
must be redone exactly for the vocabulary's recall to reach ``FLOOR_TARGET``
(``RecallMonitor.floor``), and the maintainer hands it to the snapshots
(``SearchConfig.ivf_exact_below``). Words are drawn uniformly from the vocabulary, so the
target is recall over all words, rare ones included, not over the traffic.

The same words are also searched in the lists alone at fewer lists per query (``nprobe_ladder``:
down to a quarter of ``ivf_nprobe``), and the monitor serves the fewest that reach the same
target with their own floor without redoing more answers exactly (``RecallMonitor.choose``,
``SearchConfig.nprobe_served``; ``LIVEVEC_IVF_NPROBE_AUTO``). The configured nprobe is sized for
the hardest neighbourhoods; where a model's sit in fewer lists, the scan costs less per query
(the int8 scan is most of a query's cost at 10M words). The served answers keep being sampled,
so a choice that stops holding shows in ``recall_at_10`` and is revised at the next check.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import time

import numpy as np
from numba import njit

from online.search import ivf as ivf_lists
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.frontend.ivf")

CHECK_INTERVAL = 1.0
SAMPLE_PER_LIST = 64
MAX_SAMPLE = 131072
ITERATIONS = 8
READ_CHUNK = 65536
SUPER_PROBE = 4
TWO_LEVEL_FROM = 256          # lists from which the assignment goes through super-centroids
REBUILD_DRIFT = 0.25
REBUILD_RECALL = 0.97
MIN_REBUILD_SECONDS = 60.0
MONITOR_INTERVAL = 2.0
MONITOR_QUERIES = 8
MONITOR_ROWS = 8_000_000      # rows searched exactly per check at most: fewer queries on larger models
MONITOR_WINDOW = 512
MONITOR_K = 10
FLOOR_TARGET = 0.995          # recall@10 the calibrated floor aims at (0.99 is the target; 512 samples are noisy)
FLOOR_MIN_SAMPLES = 128       # pairs before the monitor overrides the configured floor
NPROBE_RUNGS = (1.0, 0.75, 0.5, 0.375, 0.25)   # shares of --ivf-nprobe the monitor also measures
REDO_MARGIN = 0.002           # a smaller nprobe may redo this share of answers more than the configured one


def default_lists(n: int) -> int:
    return int(min(65536, max(16, round(math.sqrt(n)))))


def train(sample: np.ndarray, lists: int, rng: np.random.Generator, iterations: int = ITERATIONS) -> np.ndarray:
    """Spherical k-means: ``lists`` unit centroids of the unit rows ``sample``."""
    lists = min(lists, len(sample))
    centroids = sample[rng.choice(len(sample), lists, replace=False)].copy()
    for _ in range(iterations):
        assign = ivf_lists.nearest(sample, centroids)
        sums = np.zeros_like(centroids)
        np.add.at(sums, assign, sample)
        empty = np.flatnonzero(np.bincount(assign, minlength=lists) == 0)
        if len(empty):                     # an empty list restarts at a random sample row
            sums[empty] = sample[rng.choice(len(sample), len(empty))]
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        centroids = (sums / np.where(norms == 0, 1, norms)).astype(np.float32)
    return centroids


class Assigner:
    """Nearest centroid of rows: all L products for few lists, two levels for many."""

    def __init__(self, centroids: np.ndarray, rng: np.random.Generator):
        self.centroids = centroids
        lists = len(centroids)
        self.groups = None
        if lists >= TWO_LEVEL_FROM:
            supers = train(centroids, int(math.ceil(math.sqrt(lists))), rng)
            owner = ivf_lists.nearest(centroids, supers)
            order = np.argsort(owner, kind="stable")
            ptr = np.zeros(len(supers) + 1, np.int64)
            np.cumsum(np.bincount(owner, minlength=len(supers)), out=ptr[1:])
            self.supers, self.members, self.ptr = supers, order.astype(np.int64), ptr
            self.groups = len(supers)

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        if self.groups is None:
            return ivf_lists.nearest(rows, self.centroids)
        out = np.empty(len(rows), np.int64)
        probe = min(SUPER_PROBE, self.groups)
        for lo in range(0, len(rows), ivf_lists.ASSIGN_CHUNK):
            part = rows[lo:lo + ivf_lists.ASSIGN_CHUNK]
            best = np.argpartition(-(part @ self.supers.T), probe - 1, axis=1)[:, :probe]
            out[lo:lo + len(part)] = _best_member(part, np.ascontiguousarray(best), self.ptr, self.members,
                                                  self.centroids)
        return out


@njit(nogil=True, cache=True, fastmath=True)
def _best_member(rows, groups, ptr, members, centroids):
    out = np.empty(len(rows), np.int64)
    d = rows.shape[1]
    for i in range(len(rows)):
        best, best_s = 0, -np.inf
        for g in groups[i]:
            for j in range(ptr[g], ptr[g + 1]):
                c = members[j]
                s = np.float32(0.0)
                for t in range(d):
                    s += rows[i, t] * centroids[c, t]
                if s > best_s:
                    best, best_s = c, s
        out[i] = best
    return out


class BuildResult:
    def __init__(self, store, generation, centroids, neighbours, assign, version, seconds, assigner):
        self.store, self.generation = store, generation
        self.centroids, self.neighbours, self.assign = centroids, neighbours, assign
        self.version, self.seconds, self.assigner = version, seconds, assigner


def build(current, lists: int | None = None, seed: int = 0) -> BuildResult | None:
    """Build lists for the model ``current()`` returns (called again for every chunk it reads, so
    no snapshot is held for long). None if the model was replaced meanwhile (a full load)."""
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    index = current()
    store, n, version = index.store, index.n, index.version
    with store.lock:
        generation = store.generation
        store.watch = np.zeros(max(n, 1), bool)
        store.building = True
    try:
        lists = min(lists or default_lists(n), n)
        sample_rows = np.sort(rng.choice(n, min(n, max(lists * SAMPLE_PER_LIST, min(n, MAX_SAMPLE // 4)),
                                                    MAX_SAMPLE), replace=False))
        sample = index.unit_rows(sample_rows)
        sample = sample[np.linalg.norm(sample, axis=1) > 0]
        del index
        centroids = train(sample, lists, rng)
        assigner = Assigner(centroids, rng)
        assign = np.empty(n, np.int64)
        for lo in range(0, n, READ_CHUNK):
            index = current()
            if index.store is not store or store.generation != generation:
                return None
            chunk = index.unit_rows(np.arange(lo, min(n, lo + READ_CHUNK)))
            del index
            assign[lo:lo + len(chunk)] = assigner(chunk)
        return BuildResult(store, generation, centroids, ivf_lists.neighbour_lists(centroids), assign, version,
                           time.perf_counter() - started, assigner)
    except BaseException:
        with store.lock:
            store.watch, store.building = None, False
        raise


def nprobe_ladder(ceiling: int) -> list[int]:
    """The lists per query the monitor measures: ``NPROBE_RUNGS`` of the configured ``ceiling``, largest first."""
    return sorted({max(1, int(round(ceiling * f))) for f in NPROBE_RUNGS}, reverse=True)


class RecallMonitor:
    """Recall@10 of the inverted file against exact search, on vocabulary words of the served model.

    Besides the answers as served, it keeps per rung of ``nprobe_ladder`` the lists' own answers
    (no exact redo) as pairs (k-th score, recall), from the same exact searches: the exact search
    is what a check costs (one of 10M rows: about 50 ms), the rungs about a query each. From them
    ``floor`` calibrates the exact-redo floor of one rung, and ``choose`` the fewest lists per query
    that keep the target without redoing more answers exactly than the configured number does."""

    def __init__(self, window: int = MONITOR_WINDOW):
        self.window = window
        self.samples: collections.deque = collections.deque(maxlen=window)
        self.rungs: dict[int, collections.deque] = {}    # nprobe -> (k-th score, recall) of the lists alone
        self.ceiling: int | None = None                  # the configured nprobe the rungs belong to
        self.checked_version: int | None = None
        self.checked_at: float | None = None
        self.lists_built_at: float | None = None
        self._choice: tuple | None = None                # (arguments, ``choose``'s answer) until the next check
        self.rng = np.random.default_rng(1)

    def reset(self) -> None:
        self.samples.clear()
        self.rungs.clear()
        self._choice = None

    def check(self, index, queries: int | None = None, k: int = MONITOR_K) -> float | None:
        if index.ivf is None or index.n <= k + 1:
            return None
        if queries is None:
            queries = max(1, min(MONITOR_QUERIES, MONITOR_ROWS // index.n))
        if self.lists_built_at != index.ivf.built_at or self.ceiling != index.config.ivf_nprobe:
            self.reset()                # new lists, or another configured nprobe: the old figures say nothing
            self.lists_built_at, self.ceiling = index.ivf.built_at, index.config.ivf_nprobe
        rows = self.rng.choice(index.n, min(queries, index.n), replace=False)
        rows = rows[index.norms[rows] > 0]
        if not len(rows):
            return None
        q = index.unit_rows(rows)
        exclude = [[int(r)] for r in rows]
        approx, _ = index.search(q, exclude, [k] * len(rows), exact=False)
        rungs = {p: index.search(q, exclude, [k] * len(rows), exact=False, floor=0.0, nprobe=p)[0]
                 for p in nprobe_ladder(self.ceiling)}
        exact = index.top_k(q, exclude, [k] * len(rows))
        for i, (a, e) in enumerate(zip(approx, exact)):
            want = {n.word for n in e}
            if not want or not all(answers[i] for answers in rungs.values()):
                continue
            self.samples.append(len(want & {n.word for n in a}) / len(want))
            for p, answers in rungs.items():
                got = answers[i]
                self.rungs.setdefault(p, collections.deque(maxlen=self.window)).append(
                    (got[-1].score, len(want & {n.word for n in got}) / len(want)))
        self._choice = None
        self.checked_version, self.checked_at = index.version, time.time()
        return self.recall()

    def recall(self) -> float | None:
        return float(np.mean(self.samples)) if self.samples else None

    def floor(self, target: float = FLOOR_TARGET, min_samples: int = FLOOR_MIN_SAMPLES,
              nprobe: int | None = None) -> float | None:
        """The lowest k-th score ``f`` such that redoing exactly the answers whose k-th score is
        below ``f`` brings the sampled recall at ``nprobe`` lists (default: the configured number)
        to ``target``, or None with too few samples. Exact answers count as recall 1; ties in the
        k-th score are cut together."""
        pairs = self.rungs.get(self.ceiling if nprobe is None else nprobe, ())
        if len(pairs) < min_samples:
            return None
        return calibrate_floor(np.array([s for s, _ in pairs]), np.array([r for _, r in pairs]), target)

    def choose(self, target: float = FLOOR_TARGET, min_samples: int = FLOOR_MIN_SAMPLES) -> tuple[int, float] | None:
        """(nprobe, floor): the fewest lists per query whose calibrated floor reaches ``target`` while
        redoing at most ``REDO_MARGIN`` more of the sampled answers exactly than the configured nprobe
        (an exact redo costs a full scan), or None with too few samples. Why: the configured nprobe is a
        ceiling for the hardest models; on one whose neighbourhoods sit in fewer lists, scanning all of
        them buys nothing (10M synthetic words: 16 lists of 3,162 kept recall 0.9995 at 0.98 ms a query,
        32 cost 1.36 ms). Kept until the next check: ``/v1/stats`` asks for it on the event loop."""
        if self._choice is None or self._choice[0] != (target, min_samples):
            self._choice = ((target, min_samples), self._choose(target, min_samples))
        return self._choice[1]

    def _choose(self, target: float, min_samples: int) -> tuple[int, float] | None:
        top = self.floor(target, min_samples)
        if top is None:
            return None
        redo_top = self._redone(self.ceiling, top)
        for p in sorted(self.rungs):
            f = self.floor(target, min_samples, p)
            if f is not None and self._redone(p, f) <= redo_top + REDO_MARGIN:
                return p, f
        return self.ceiling, top

    def _redone(self, nprobe: int, floor: float) -> float:
        return float(np.mean([s < floor for s, _ in self.rungs[nprobe]]))


def calibrate_floor(kth: np.ndarray, recall: np.ndarray, target: float) -> float:
    """See ``RecallMonitor.floor``: 0.0 when the lists alone reach ``target``."""
    order = np.argsort(kth, kind="stable")
    kth, recall = kth[order], recall[order]
    n = len(kth)
    # cut j: the j lowest k-th scores redone exactly (recall 1), the rest as the lists answered
    tail = np.concatenate([np.cumsum(recall[::-1])[::-1], [0.0]])
    overall = (np.arange(n + 1) + tail) / n
    for j in np.flatnonzero(overall >= target - 1e-12).tolist():
        if j == 0:
            return 0.0
        if j == n or kth[j] > kth[j - 1]:      # a cut between two different scores
            return float(kth[j]) if j < n else float(np.nextafter(np.float32(kth[-1]), np.float32(2)))
    return float(np.nextafter(np.float32(kth[-1]), np.float32(2)))


class IvfMaintainer:
    """Decides when to (re)build the inverted file, builds it off the event loop, and monitors it."""

    def __init__(self, holder, config):
        self.holder, self.config = holder, config
        self.monitor = RecallMonitor()
        self.builds = 0
        self.floor_updates = 0
        self.failed = 0
        self.last_build_seconds: float | None = None
        self.last_reason: str | None = None
        self.building_since: float | None = None
        self._last_build_end = -math.inf
        self._stopping = False

    def wanted(self, index) -> str | None:
        """Why ``index`` needs new lists, or None."""
        cfg = self.config
        if cfg.search == "exact" or index.n < cfg.ivf_min_rows or index.store is None \
                or index.store.pending_ivf is not None or index.store.building:
            return None
        ivf = index.ivf
        if ivf is None:
            return "no lists yet"
        if time.monotonic() - self._last_build_end < MIN_REBUILD_SECONDS:
            return None
        if ivf.drift > REBUILD_DRIFT * max(ivf.built_rows, 1):
            return f"{ivf.drift} rows placed since the build"
        if not ivf.built_rows / 1.5 <= index.n <= ivf.built_rows * 1.5:
            return f"the vocabulary changed from {ivf.built_rows} to {index.n} words"
        recall = self.monitor.recall()
        if recall is not None and len(self.monitor.samples) >= 64 and recall < REBUILD_RECALL:
            return f"recall@10 fell to {recall:.3f}"
        return None

    def build_now(self, reason: str) -> bool:
        """One build and hand-over (blocking; run in a thread)."""
        self.building_since = time.time()
        self.last_reason = reason
        log_event(log, "ivf_build_started", reason=reason, vocab=self.holder.current.n)
        try:
            result = build(lambda: self.holder.current, self.config.ivf_lists or None, seed=self.builds)
        except Exception as exc:
            self.failed += 1
            log_event(log, "ivf_build_failed", logging.ERROR, error=repr(exc))
            return False
        finally:
            self.building_since = None
            self._last_build_end = time.monotonic()
        if result is None:
            return False
        with result.store.lock:
            if result.store.generation == result.generation:
                result.store.pending_ivf = result
            else:
                result.store.watch, result.store.building = None, False
        self.builds += 1
        self.last_build_seconds = result.seconds
        log_event(log, "ivf_built", lists=len(result.centroids), rows=len(result.assign),
                  seconds=round(result.seconds, 2))
        return True

    def stop(self) -> None:
        self._stopping = True

    async def run(self) -> None:
        last_check = 0.0
        while not self._stopping:
            # until the window holds enough samples to calibrate (after each build) the monitor checks four
            # times as often: at 10M words that is 64 s of an exact search every 0.5 s, then one every 2 s
            calibrating = len(self.monitor.samples) < FLOOR_MIN_SAMPLES
            interval = MONITOR_INTERVAL / 4 if calibrating else MONITOR_INTERVAL
            await asyncio.sleep(min(CHECK_INTERVAL, interval))
            if not self.holder.loaded:
                continue
            reason = self.wanted(self.holder.current)
            if reason is not None:
                await asyncio.to_thread(self.build_now, reason)
            elif self.holder.current.ivf is not None and time.monotonic() - last_check >= interval:
                last_check = time.monotonic()
                await asyncio.to_thread(self.check_recall)

    def check_recall(self) -> None:
        index = self.holder.current
        try:
            self.monitor.check(index)
            self.apply_floor()
        except Exception as exc:       # a monitor must never take the front end down
            log_event(log, "ivf_recall_check_failed", logging.WARNING, error=repr(exc))

    def apply_floor(self) -> float | None:
        """Hand the calibrated floor (and with ``ivf_nprobe_auto`` the lists per query) to the served
        snapshot. Its config is what the next snapshot inherits; a sync that built the next one from the
        previous snapshot meanwhile carries the old value, which the next check sets again (every
        ``MONITOR_INTERVAL``)."""
        index = self.holder.current
        config = index.config
        if not config.ivf_exact_below_auto:
            return None
        nprobe = 0
        if config.ivf_nprobe_auto:
            chosen = self.monitor.choose()
            floor = None if chosen is None else chosen[1]
            nprobe = 0 if chosen is None or chosen[0] == config.ivf_nprobe else chosen[0]
        else:
            floor = self.monitor.floor()
        if floor is not None and (floor, nprobe) != (config.ivf_exact_below, config.nprobe_served):
            index.config = dataclasses.replace(config, ivf_exact_below=floor, nprobe_served=nprobe)
            self.floor_updates += 1
        return floor

    def report(self, index) -> dict:
        recall = self.monitor.recall()
        return {"builds": self.builds, "failed_builds": self.failed,
                "building_since": self.building_since, "last_build_reason": self.last_reason,
                "last_build_seconds": None if self.last_build_seconds is None else round(self.last_build_seconds, 2),
                "recall_at_10": None if recall is None else round(recall, 4),
                "recall_samples": len(self.monitor.samples), "recall_checked_version": self.monitor.checked_version,
                "exact_below_calibrated": self.monitor.floor(), "exact_below_updates": self.floor_updates,
                "nprobe_calibrated": (self.monitor.choose() or (None,))[0],
                "recall_by_nprobe": {str(p): round(float(np.mean([r for _, r in pairs])), 4)
                                     for p, pairs in sorted(self.monitor.rungs.items())},
                "pending_install": index.store is not None and index.store.pending_ivf is not None,
                "install": None if index.store is None or index.store.relayout is None
                else index.store.relayout.describe()}
