"""A worker's live training signal: the SGNS loss of a sample of its pairs, and the norms of its hot rows.

Why: a cluster that trains garbage says nothing by itself. Words per second, lag and syncs all look healthy
while an absurd ``LIVEVEC_ETA``, too many replicas adding up their deltas (docs/operations.md#exchange) or a bad merge
blow the rows up, and the front end goes on answering with neighbours that mean nothing. Two cheap figures
show it within seconds:

* **The sampled loss.** The in-place kernel adds up the SGNS loss of every 32nd pair, all of its
  1 + negative terms (``BatchStats.loss_sampled`` and ``loss_pairs``; the pull/push exchange gives every
  pair's, which the worker counts the same way). Per pair it is (1 + negative) ln 2 (4.2 with 5 negatives)
  for an untrained model, 2 - 3.5 while a healthy one learns, then falls slowly; a diverging model's rises, to
  thousands and more once its rows are long.
* **The hot rows' norms.** The input and output rows of the ``HOT_WORDS`` most frequent trainable words are
  trained most, so they blow up first: healthy ones stay about 1 - 5 long whatever the dimension (16 to 300
  measured), diverged ones reach tens to hundreds, thousands with an absurd rate. They are measured on the
  replica at every report (every few seconds, not per batch), in a thread: the top of the vocabulary's counts,
  one index lookup under the shard's lock and a copy of 2 x ``HOT_WORDS`` rows while storage cannot move
  (``EmbeddingShard.training``); 2.4 ms with 200,000 trainable words. The pull/push exchange holds no rows, so
  it reports no norms.

What a worker exports (``docs/operations.md#training-diverging`` says what the alert on them means and what to do):

``livevec_worker_training_loss`` (the mean loss per sampled pair over the last ``WINDOW`` s), its sum and pair
counters ``livevec_worker_training_loss_sum_total`` and ``..._pairs_total`` (their rates' ratio is the loss per
pair over any range), and ``livevec_worker_hot_row_norm{kind="input|output", stat="mean|max"}``.

Non-finite values. A row or a loss that overflowed is NaN or infinite, and Prometheus compares NaN with
nothing (``NaN > 10`` is false): an alert on such a gauge would stay silent in exactly the worst case. So a
non-finite measurement is exported as +Inf (``inf`` on ``/metrics``, which Prometheus parses as +Inf), which
every bound catches; NaN means only "not measured (yet)". The counters leave a non-finite batch out (one NaN
would poison a counter for the process's life). JSON has neither, so the report (``report``, sent to server 0
with the worker's other figures) gives None and counts them instead (``nonfinite_batches``,
``hot_rows.nonfinite``).

``summarise_reports`` is the other end: the front end's view of the cluster (``/v1/stats`` ``training``, the
page) from the reports server 0 keeps.
"""
from __future__ import annotations

import collections
import logging
import math
import threading
import time
from typing import Any

import numpy as np

from online.learner.keys import word_rows
from online.learner.trainer import BatchStats
from ps_bridge.metrics import Registry
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.worker")

HOT_WORDS = 100            # the most frequent trainable words whose rows are measured
WINDOW = 30.0              # seconds of batches the loss gauge averages
HOT_ROW_NORM_BOUND = 10.0  # mean hot-row norm beyond which a model diverges (LivevecTrainingDiverging uses it)
KINDS = ("input", "output")


def _finite_or_inf(value: float) -> float:
    """+Inf for NaN or an infinity (see the module docstring), the value otherwise."""
    return value if math.isfinite(value) else math.inf


def _json_number(value: float | None) -> float | None:
    return round(value, 4) if value is not None and math.isfinite(value) else None


def hot_rows(vocab, shard, words: int = HOT_WORDS) -> dict[str, Any] | None:
    """Norms of the rows of the ``words`` most frequent trainable words of ``vocab`` in ``shard``:
    ``{"words": n, "nonfinite": rows, "input": {"mean": x, "max": y}, "output": {...}}`` (None: no such row yet).

    Reads the vocabulary without the trainer's lock: a slot reassigned meanwhile gives the rows of another
    word, which changes nothing in a mean over a hundred. Norms in float64, so that a float32 row as long as
    float32 allows still has a finite norm."""
    slots = np.flatnonzero(vocab.trainable)
    if len(slots) > words:
        slots = slots[np.argpartition(vocab.counts[slots], len(slots) - words)[len(slots) - words:]]
    if not len(slots):
        return None
    rows = shard.rows_for(word_rows(vocab.keys[slots]), create=False)
    n = len(slots)
    with shard.training():   # storage does not move meanwhile (the kernels go on writing: a snapshot is moot)
        vectors = [shard.vectors[r[r >= 0]].astype(np.float64) for r in (rows[:n], rows[n:])]
    out: dict[str, Any] = {"words": int(min((rows[:n] >= 0).sum(), (rows[n:] >= 0).sum())), "nonfinite": 0}
    if not out["words"]:
        return None
    for kind, v in zip(KINDS, vectors):
        norms = np.linalg.norm(v, axis=1)
        bad = ~np.isfinite(norms)
        out["nonfinite"] += int(bad.sum())
        norms[bad] = np.inf
        out[kind] = {"mean": float(norms.mean()), "max": float(norms.max())}
    return out


class TrainingSignal:
    """The signal of one worker: ``record`` each trained batch (event loop), ``measure`` the hot rows now and
    then (a thread), ``report`` both for server 0. ``shard`` is the replica (None: pull/push, no norms)."""

    def __init__(self, registry: Registry, vocab, shard=None, *, window: float = WINDOW, words: int = HOT_WORDS):
        self.vocab, self.shard = vocab, shard
        self.window, self.words = window, words
        self._lock = threading.Lock()
        self._batches: collections.deque = collections.deque()   # (monotonic time, loss, pairs), finite or not
        # The window's sums, kept as batches come and go: summed afresh per batch they cost the event loop
        # O(batches in the window) each time, thousands of them at tens of batches a second.
        self._finite_loss = 0.0
        self._pairs = 0
        self._nonfinite = 0
        self._recorded = 0
        self.hot: dict[str, Any] | None = None
        self._above_bound = False
        r = registry
        self.m_loss = r.gauge("livevec_worker_training_loss",
                              f"mean SGNS loss per sampled pair over the last {window:g} s of batches "
                              "(every 32nd pair, all its terms; +Inf: overflowed, NaN: not measured yet)")
        self.m_loss.set(math.nan)
        self.m_sum = r.counter("livevec_worker_training_loss_sum_total",
                               "SGNS loss of the sampled pairs, summed (batches with a finite loss)")
        self.m_pairs = r.counter("livevec_worker_training_loss_pairs_total",
                                 "pairs whose loss livevec_worker_training_loss_sum_total sums")
        self.m_norm = {(kind, stat): r.gauge("livevec_worker_hot_row_norm",
                                             f"L2 norm of the input and output rows of the {words} most frequent "
                                             "trainable words, mean and max (+Inf: overflowed, NaN: not measured)",
                                             kind=kind, stat=stat)
                       for kind in KINDS for stat in ("mean", "max")}
        for gauge in self.m_norm.values():
            gauge.set(math.nan)

    # ------------------------------------------------------------------ the loss
    def record(self, stats: BatchStats) -> None:
        """A trained batch's sampled loss (nothing when it sampled no pair)."""
        if stats.loss_pairs <= 0:
            return
        loss, pairs = float(stats.loss_sampled), int(stats.loss_pairs)
        if math.isfinite(loss):
            self.m_sum.inc(loss)
            self.m_pairs.inc(pairs)
        with self._lock:
            self._batches.append((time.monotonic(), loss, pairs))
            self._count(loss, pairs, 1)
            self._recorded += 1
            if self._recorded % 4096 == 0:   # the running sum's rounding, reset now and then
                self._finite_loss = math.fsum(x for _, x, _ in self._batches if math.isfinite(x))
            self._prune()
            mean, _, _ = self._window_loss()
        self.m_loss.set(_finite_or_inf(mean))

    def _prune(self) -> None:
        """Drop batches older than the window, keeping the last one (the gauge keeps the latest loss)."""
        horizon = time.monotonic() - self.window
        while len(self._batches) > 1 and self._batches[0][0] < horizon:
            _, loss, pairs = self._batches.popleft()
            self._count(loss, pairs, -1)

    def _count(self, loss: float, pairs: int, sign: int) -> None:
        self._pairs += sign * pairs
        if math.isfinite(loss):
            self._finite_loss += sign * loss
        else:
            self._nonfinite += sign

    def _window_loss(self) -> tuple[float, int, int]:
        """(mean loss per pair, pairs, non-finite batches) over the window; NaN mean with nothing in it, and
        the non-finite losses' own sum (inf or NaN) while one is in it."""
        pairs, nonfinite = self._pairs, self._nonfinite
        total = self._finite_loss
        if nonfinite:
            total = sum(loss for _, loss, _ in self._batches)
        return (total / pairs if pairs else math.nan), pairs, nonfinite

    # ------------------------------------------------------------------ the hot rows
    def measure(self) -> dict[str, Any] | None:
        """Measure the hot rows now (blocking: call it from a thread) and set the gauges. Logs
        ``hot_rows_diverging`` (WARNING) when their mean norm goes beyond ``HOT_ROW_NORM_BOUND``, once per
        crossing, and ``hot_rows_recovered`` when it comes back."""
        if self.shard is None:
            return None
        hot = hot_rows(self.vocab, self.shard, self.words)
        self.hot = hot
        if hot is None:
            return None
        for (kind, stat), gauge in self.m_norm.items():
            gauge.set(_finite_or_inf(hot[kind][stat]))
        worst = max(hot[kind]["mean"] for kind in KINDS)
        above = not worst <= HOT_ROW_NORM_BOUND   # NaN or infinite counts as above
        if above != self._above_bound:
            self._above_bound = above
            log_event(log, "hot_rows_diverging" if above else "hot_rows_recovered",
                      logging.WARNING if above else logging.INFO, words=hot["words"], bound=HOT_ROW_NORM_BOUND,
                      input_mean=_json_number(hot["input"]["mean"]), output_mean=_json_number(hot["output"]["mean"]),
                      nonfinite=hot["nonfinite"], loss=_json_number(self.m_loss.value))
        return hot

    # ------------------------------------------------------------------ the report
    def report(self) -> dict[str, Any]:
        """This worker's signal as JSON-able values (non-finite ones as None, and counted)."""
        with self._lock:
            self._prune()
            mean, pairs, nonfinite = self._window_loss()
        hot = self.hot
        rows = None
        if hot is not None:
            rows = {"words": hot["words"], "nonfinite": hot["nonfinite"],
                    **{kind: {stat: _json_number(v) for stat, v in hot[kind].items()} for kind in KINDS}}
        return {"loss": _json_number(mean), "loss_pairs": pairs, "nonfinite_batches": nonfinite,
                "window_seconds": self.window, "hot_rows": rows}


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def summarise_reports(reports: list[dict]) -> dict[str, Any] | None:
    """The cluster's signal from the workers' reports (``{"node": id, "training": report(), ...}``), for the
    front end: the loss per pair over every worker's window (weighted by their pairs), the worst worker's hot
    rows (a diverging replica is the news, not the average), each worker's own figures, and ``diverging``:
    some worker's hot rows are beyond ``HOT_ROW_NORM_BOUND`` or overflowed (whether the loss rose is the
    alert's to judge: that needs its history). None: no report carries a signal (none yet, or workers of an
    older version)."""
    workers = [{"node": r.get("node"), **r["training"]} for r in reports
               if isinstance(r, dict) and isinstance(r.get("training"), dict)]
    if not workers:
        return None
    workers.sort(key=lambda w: w["node"] if isinstance(w["node"], int) else -1)
    measured = [(_number(w.get("loss")), int(w.get("loss_pairs") or 0)) for w in workers]
    measured = [(loss, n) for loss, n in measured if loss is not None and n > 0]
    pairs = sum(n for _, n in measured)
    loss = sum(loss * n for loss, n in measured) / pairs if pairs else None
    hot = [w["hot_rows"] for w in workers if isinstance(w.get("hot_rows"), dict)]
    norms = {kind: {stat: max((v for h in hot if (v := _number((h.get(kind) or {}).get(stat))) is not None),
                              default=None) for stat in ("mean", "max")} for kind in KINDS} if hot else None
    nonfinite_rows = sum(int(h.get("nonfinite") or 0) for h in hot)
    nonfinite_batches = sum(int(w.get("nonfinite_batches") or 0) for w in workers)
    worst = max((v["mean"] for v in (norms or {}).values() if v["mean"] is not None), default=None)
    beyond = worst is not None and worst > HOT_ROW_NORM_BOUND
    return {"loss": None if loss is None else round(loss, 4), "loss_pairs": pairs, "hot_row_norm": norms,
            "hot_row_norm_bound": HOT_ROW_NORM_BOUND, "nonfinite_batches": nonfinite_batches,
            "nonfinite_rows": nonfinite_rows, "diverging": bool(nonfinite_rows or nonfinite_batches or beyond),
            "workers": workers}


def summed_reasons(counts) -> dict[str, int]:
    """The records the live workers skipped as malformed since they started, by reason (a report without them, from
    an older worker, or a bad one, adds nothing)."""
    out: dict[str, int] = {}
    for by_reason in counts:
        if isinstance(by_reason, dict):
            for reason, n in by_reason.items():
                if isinstance(reason, str) and isinstance(n, int) and not isinstance(n, bool):
                    out[reason] = out.get(reason, 0) + n
    return out
