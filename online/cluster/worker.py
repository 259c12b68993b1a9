"""The worker role: consume Kafka as a consumer-group member, train SGNS mini-batches, push
to the parameter servers, and commit offsets only for what the servers acknowledged.
``livevec worker`` (``online.cli.worker``) reads the settings and runs it.

Flow per batch of records: ``KafkaStream.next_batch`` -> ``Trainer.train_records`` (in a
thread, so the event loop keeps the consumer alive) -> ``stream.mark_processed``. Two
exchanges with the servers (``LIVEVEC_EXCHANGE``):

* ``replica`` (the default): the trainer updates a local replica in place, and a sync every
  ``LIVEVEC_SYNC_MS`` (or ``LIVEVEC_SYNC_TOKENS``) sends the servers the rows' deltas
  (``online.cluster.replica``). A trained batch waits for the next acknowledged sync before
  its offsets are committed, so what is committed is on the servers.
* ``pullpush``: each mini-batch pulls its rows, computes against them, and pushes gradients
  that the servers' optimizer applies (kept for comparison and for stock ps-lite servers).

At most ``max_inflight`` batches are being trained at once: a slow server therefore slows
consumption instead of growing memory (backpressure).

Every trained batch's sampled loss, and every few seconds the norms of the hot rows, make the
worker's training signal (``online.cluster.training_signal``): ``/metrics``, and the report to
server 0 that the front end shows, so a diverging model does not go unnoticed.

Failures: a batch whose pull or push is not acknowledged (a server died) is retried with
backoff until the servers answer again; its offsets stay uncommitted meanwhile, so if
this worker dies too, the records are redelivered to the partition's next owner. Kafka
delivery is therefore at least once; the checkpoint extension (``WorkerExtension``)
adds exactly-once relative to a checkpoint by rolling back.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import orjson

from online.cluster import ps_commands as pc
from online.cluster.node_settings import METRICS_PORT, node_groups, node_settings
from online.cluster.ps_param_store import PSParamStore
from online.cluster.replica import REPLICA, SYNC, ReplicaStore
from online.cluster.sync_interval import SyncInterval
from online.cluster.training_pool import training_pool
from online.cluster.training_signal import TrainingSignal
from online.cluster.worker_metrics import WorkerMetrics
from online.learner.settings import LEARNER, WORKER_MODEL, learner_config
from online.learner.trainer import BatchStats, LearnerConfig, Trainer, kernel_for
from online.stream.batches import Batch
from online.stream.settings import STREAM, StreamSettings
from ps_bridge.customer import RequestTimeout
from ps_bridge.kv_app import KVWorker
from ps_bridge.metrics import Registry
from ps_bridge.settings import NodeSettings, Setting, SettingGroup
from ps_bridge.simple_app import SendError
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.worker")


WORKER = SettingGroup("worker", (
    Setting("max_inflight", "LIVEVEC_MAX_INFLIGHT", int, 2, minimum=1, maximum=64, help="batches trained at once"),
    Setting("request_timeout", "LIVEVEC_REQUEST_TIMEOUT", float, 30.0, minimum=0.1,
            help="seconds to wait for the servers before retrying a batch"),
    Setting("exchange", "LIVEVEC_EXCHANGE", default="replica", choices=("replica", "pullpush"),
            help="replica: train a local replica and sync deltas; pullpush: pull and push every mini-batch"),
    Setting("sync_tokens", "LIVEVEC_SYNC_TOKENS", int, 0, minimum=0,
            help="replica: sync sooner once this many tokens were trained since the last sync, and train no "
                 "further before a sync once 1.5 times as many are (2 with up to 4 replicas, 8 with one; the replica's "
                 "staleness, in tokens; a Kafka batch is no longer than this); 0: 640,000 / replicas^2 per "
                 "replica, 100 - 10,000 where replicas merge (160,000 for one), split over the processes sharing "
                 "it (replicas: DMLC_NUM_WORKER / the processes sharing this one)"),
    Setting("train_nice", "LIVEVEC_TRAIN_NICE", int, -1, minimum=-1, maximum=19,
            help="the training threads' nice above the process's, so its sync runs first (online/cluster/"
                 "training_pool.py); -1: 5 where DMLC_NUM_WORKER > 2 (replicas that merge), else 0"),
))

# What a worker reads: its node, the stream it consumes, the model and learner it trains with.
WORKER_GROUPS = (*node_groups(), *STREAM, WORKER_MODEL, LEARNER, WORKER, SYNC, REPLICA)


# The extension point (checkpointing plugs in here; this package never imports it).
class WorkerExtension:
    """Extra behaviour of one ``livevec worker``.

    ``attach`` is called once by ``StreamingWorker``'s constructor, on the worker's event
    loop; the extension may then drive the worker's ``paused`` / ``abandon`` events (see
    ``StreamingWorker``). ``close`` is called when ``run`` ends, before the stream stops.
    """

    def attach(self, worker: StreamingWorker) -> None:
        pass

    async def batch_done(self, batch: Batch, stats: BatchStats) -> bool:
        """A batch's pushes were acknowledged; its offsets are committed only if this says True."""
        return True

    async def batches_done(self, done: list[tuple[Batch, BatchStats]]) -> bool:
        """Several batches a replica sync carried, in training order; the same contract as ``batch_done``."""
        for batch, stats in done:
            if not await self.batch_done(batch, stats):
                return False
        return True

    def batch_retried(self, exc: BaseException) -> None:
        """A batch is trained again after ``exc`` (called from the training thread)."""

    def close(self) -> None:
        pass


def records_per_batch(cap: int, words_per_record: float, batch_words: int, sync_tokens: int = 0) -> int:
    """Kafka records per batch, so that a batch holds about ``batch_words / 2`` tokens whatever the records'
    size, and no more than ``sync_tokens`` with a replica (0: none); at most ``cap``, 64 while the records' size
    is unknown (``words_per_record`` <= 0).

    A checkpoint's pause waits for the batches in flight: with records of 100 words, 500 of them would be 50,000
    tokens, a third of a second of training each. A sync carries whole batches only (a row a running kernel
    writes is collected when the kernel ends), so a batch longer than ``sync_tokens`` stretches every replica's
    share of a round to the batch (16 replicas would sync every 5,000 tokens instead of 625).
    Design: docs/design/0003-sync-interval.md"""
    if words_per_record <= 0:
        return min(cap, 64)
    tokens = batch_words / 2
    if sync_tokens:
        tokens = min(tokens, sync_tokens)
    return max(1, min(cap, int(tokens / words_per_record)))


@dataclass
class WorkerSettings:
    node: NodeSettings
    stream: StreamSettings
    learner: LearnerConfig
    max_inflight: int = 2
    train_nice: int = -1
    batch_words: int = 10_000
    request_timeout: float = 30.0
    exchange: str = "replica"
    sync_ms: int = 250
    sync_tokens: int = 0
    refresh_share: float = 0.1
    host_replica: str = ""
    host_replica_rows: int = 0
    send_threshold: float = 0.05
    flush_syncs: int = 8
    delta_wire: str = "auto"
    report_interval: float = 2.0
    metrics_port: int | None = None

    def __post_init__(self):
        # LIVEVEC_KERNEL=auto for this cluster: each worker may hold a replica of its own, so the workers it declares
        # bound its replicas (as they set the sync interval; elastic workers and front ends beyond them are not
        # counted).
        self.learner = replace(self.learner, kernel=kernel_for(self.learner.kernel, self.node.num_worker))

    @classmethod
    def from_args(cls, args: argparse.Namespace | None, env: Mapping[str, str] | None = None) -> "WorkerSettings":
        env = os.environ if env is None else env
        node = node_settings(args, env, "worker")
        stream = StreamSettings.from_args(args, env)
        learner = {**WORKER_MODEL.read(args, env), **LEARNER.read(args, env)}
        worker = WORKER.read(args, env)
        return cls(node=node, stream=stream, learner=learner_config(learner), batch_words=learner["batch_words"],
                   metrics_port=METRICS_PORT.read(args, env), **worker,
                   **SYNC.read(args, env), **REPLICA.read(args, env))


def host_replica_rows(settings: WorkerSettings) -> int:
    """The rows of the host's replica (``LIVEVEC_HOST_REPLICA_ROWS``; 0: twice the vocabulary's capacity)."""
    return settings.host_replica_rows or 2 * settings.learner.vocab_capacity


def mini_batches(texts: list[str], max_words: int):
    """Consecutive runs of ``texts`` of at most ``max_words`` whitespace-separated words each
    (a single longer record forms a run of its own)."""
    chunk: list[str] = []
    words = 0
    for text in texts:
        n = len(text.split())
        if chunk and words + n > max_words:
            yield chunk
            chunk, words = [], 0
        chunk.append(text)
        words += n
    if chunk:
        yield chunk


class BatchAbandoned(Exception):
    """A rollback (the ``abandon`` event) dropped this batch: it is not retried and not committed."""


class StreamingWorker:
    """One worker process: the Kafka stream, the trainer and the ps-lite node.

    Made on the event loop that will ``run`` it. An extension may hold the worker with
    ``paused`` (it drains its batches in flight and sets ``idle``) and make batches in
    flight give up instead of retrying with ``abandon`` (a rollback).
    """

    def __init__(self, settings: WorkerSettings, kv: KVWorker, stream, registry: Registry,
                 extension: WorkerExtension | None = None):
        self.settings = settings
        self.kv = kv
        self.stream = stream
        self.metrics = WorkerMetrics(registry)
        cfg = settings.learner
        if settings.exchange == "replica":
            self.replica = ReplicaStore(kv, cfg.dim, optimizer=cfg.optimizer, eta=cfg.eta, seed=cfg.seed,
                                        timeout=settings.request_timeout, registry=registry,
                                        refresh_share=settings.refresh_share,
                                        host_replica=self.host_replica_path(settings),
                                        host_rows=host_replica_rows(settings),
                                        prefetch_rows=cfg.vocab_capacity, kernel=cfg.kernel,
                                        send_threshold=settings.send_threshold, flush_syncs=settings.flush_syncs,
                                        delta_wire=settings.delta_wire)
            self.trainer = Trainer(cfg, self.replica)
            self.replica.on_totals = self.trainer.apply_cluster_counts
            self.replica.on_trainable = self.trainer.learn_cluster_trainable
        else:
            self.replica = None
            self.trainer = Trainer(cfg, PSParamStore(kv, cfg.dim, settings.request_timeout, registry))
        self.signal = TrainingSignal(registry, self.trainer.vocab, self.replica.shard if self.replica else None)
        self._awaiting: list[tuple[Batch, BatchStats]] = []   # trained into the replica, not yet synced
        self._awaiting_tokens = 0
        self._completed = 0   # batches trained into the replica and then committed or dropped
        self._sync_lock = asyncio.Lock()
        self._syncs_held = False   # by a checkpoint (``hold_syncs``)
        self._sync_soon = asyncio.Event()
        self._covered = asyncio.Event()   # set when a sync completed batches (what a worker at its bound awaits)
        self._words_per_record = 0.0   # moving average, sizes the Kafka batches (``_records_per_batch``)
        self.stopping = asyncio.Event()
        self.paused = asyncio.Event()   # set while an extension holds the stream
        self.idle = asyncio.Event()     # set by run() once paused with nothing in flight
        self.abandon = threading.Event()
        self.stop_deadline = None   # a ``StopDeadline`` (``online.cluster.stopping``): bounds the final sync
        self._inflight: collections.deque = collections.deque()
        self._train_pool = training_pool(settings.max_inflight, settings.train_nice, settings.node.num_worker)
        self.interval = SyncInterval(settings.node.num_worker, settings.sync_tokens,
                                     self.replica.shard.members if self.replica is not None else lambda: 1)
        self._rate_window: collections.deque = collections.deque(maxlen=10_000)
        self.extension = extension or WorkerExtension()
        self.extension.attach(self)

    @staticmethod
    def host_replica_path(settings: WorkerSettings) -> str:
        if not settings.host_replica:
            return ""
        from online.cluster.host_replica import segment_path
        node = settings.node
        return str(segment_path(settings.host_replica, node.root_uri, node.root_port, node.node_host))

    # -------------------------------------------------------------- training
    def _train_blocking(self, texts: list[str]) -> BatchStats:
        """Train a Kafka batch as mini-batches of at most ``batch_words`` tokens.

        Records can be anything from a short sentence to a 1,000-word paragraph, so a batch of
        N records says little about its size; capping the tokens per pull/push keeps the
        requests, the memory and the staleness of the pulled rows bounded whatever producers
        send (larger pull/push batches also learn less per pass).
        """
        total = BatchStats()
        for chunk in mini_batches(texts, self.settings.batch_words):
            stats = self._train_with_retry(chunk)
            if stats.loss is not None and not stats.loss_pairs:   # pull/push: every pair's loss, not a sample
                stats.loss_sampled, stats.loss_pairs = stats.loss, stats.pairs
            total.add(stats)
        return total

    def _train_with_retry(self, texts: list[str]) -> BatchStats:
        backoff = 0.2
        while True:
            if self.abandon.is_set():
                raise BatchAbandoned("rollback in progress")
            try:
                return self.trainer.train_records(texts)
            except (RequestTimeout, SendError) as exc:
                if self.abandon.is_set():
                    raise BatchAbandoned("rollback in progress") from exc
                self.metrics.errors.inc()
                log_event(log, "batch_retry", logging.WARNING, error=f"{type(exc).__name__}: {exc}",
                          backoff=round(backoff, 2))
                if self.stopping.is_set():
                    raise
                self.extension.batch_retried(exc)
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    def _records_per_batch(self) -> int:
        return records_per_batch(self.stream.batch_records, self._words_per_record, self.settings.batch_words,
                                 self.interval.tokens() if self.replica is not None else 0)

    async def _finish_oldest(self) -> None:
        batch, task = self._inflight.popleft()
        self.metrics.inflight.set(len(self._inflight))
        try:
            stats = await task
        except BatchAbandoned:
            return
        except (RequestTimeout, SendError) as exc:
            # Only while stopping: left uncommitted, the records go to the partition's next owner.
            log_event(log, "batch_abandoned", logging.WARNING, error=f"{type(exc).__name__}: {exc}",
                      records=len(batch))
            return
        except Exception as exc:
            # Not a transient failure (a bug, or a record the learner cannot digest). Leaving the batch
            # uncommitted would stall its partitions forever, and every re-read would fail again: skip
            # it, loudly, with its offsets, and carry on.
            self.metrics.skipped.inc(len(batch))
            log_event(log, "batch_skipped", logging.ERROR, error=f"{type(exc).__name__}: {exc}", records=len(batch),
                      ranges=";".join(f"{t}/{p}:{a}-{b}" for (t, p), (a, b) in batch.ranges.items()))
            if await self.extension.batch_done(batch, BatchStats()):
                await self.stream.mark_processed(batch)
            return
        self.metrics.cpu["prepare"].inc(stats.cpu_prepare)
        self.metrics.cpu["kernel"].inc(stats.cpu_kernel)
        self.signal.record(stats)   # what was trained, whether or not a rollback drops it later
        if len(batch) and stats.tokens:
            seen = stats.tokens / len(batch)
            self._words_per_record = seen if self._words_per_record <= 0 else 0.8 * self._words_per_record + 0.2 * seen
        if self.replica is not None:
            self._awaiting.append((batch, stats))
            self.replica.shard.batch_finished()
            self._awaiting_tokens += stats.tokens
            self.metrics.unsynced.set(self._awaiting_tokens)
            if self._awaiting_tokens >= self.interval.tokens():
                self._sync_soon.set()   # the sync loop runs it while the next batches train
            return
        await self._complete(batch, stats)

    async def _complete(self, batch: Batch, stats: BatchStats) -> None:
        """The batch's effect is on the servers: record it in the ledger and commit its offsets."""
        if not await self.extension.batch_done(batch, stats):
            return
        await self.stream.mark_processed(batch)
        self._count(batch, stats)

    async def _complete_all(self, done: list[tuple[Batch, BatchStats]]) -> None:
        """``_complete`` for the batches a sync carried: one ledger message and one commit for all of them
        (a checkpoint's pause waits for this)."""
        if not done or not await self.extension.batches_done(done):
            return
        await self.stream.mark_all_processed([batch for batch, _ in done])
        for batch, stats in done:
            self._count(batch, stats)

    def _count(self, batch: Batch, stats: BatchStats) -> None:
        m = self.metrics
        m.batches.inc()
        m.records.inc(len(batch))
        m.tokens.inc(stats.tokens)
        m.words.inc(stats.kept)
        m.pairs.inc(stats.pairs)
        m.batch_seconds.observe(stats.seconds)
        self._rate_window.append((time.monotonic(), stats.tokens))

    async def hold_syncs(self, timeout: float) -> bool:
        """Start no sync until ``release_syncs``: a checkpoint snapshots the servers meanwhile. Waits for
        a sync in progress, then runs one that sends every waiting delta (``flush``: the snapshot must hold all
        that the batches it counts trained), and completes the batches it carried (False, and nothing held,
        if that takes over ``timeout`` s, fails, or a rollback begins). Training goes on, into the replica,
        and its batches stay uncommitted until the next sync.

        With a replica the host's processes share, the hold is the host's: no process of it starts a
        sync meanwhile, this one waits for a sync another is running, and commits the batches of its
        own that such syncs carried, so what this worker reports is exactly what the servers have."""
        self.replica.shard.hold(True)   # the host's other processes start no sync from now on
        deadline = time.monotonic() + timeout
        while self._sync_lock.locked():
            if time.monotonic() > deadline or self.abandon.is_set():
                self.release_syncs()
                return False
            await asyncio.sleep(0.002)
        async with self._sync_lock:
            if not await asyncio.to_thread(self.replica.shard.wait_host_idle, max(0.0, deadline - time.monotonic())):
                self.release_syncs()
                return False
            if not await asyncio.to_thread(self._flush_once):
                self.release_syncs()
                return False
            self._syncs_held = True
            await self._complete_covered()
        return True

    def _flush_once(self) -> bool:
        """One sync that sends every waiting delta; False when a server did not answer (the next sync sends
        what was not acknowledged)."""
        c0 = time.thread_time()
        try:
            self.replica.sync(flush=True)
            return True
        except (RequestTimeout, SendError) as exc:
            self.metrics.errors.inc()
            log_event(log, "flush_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
            return False
        finally:
            self.metrics.cpu["sync"].inc(time.thread_time() - c0)

    def release_syncs(self) -> None:
        if self.replica is not None:
            self.replica.shard.hold(False)
        if self._syncs_held:
            self._syncs_held = False
            self._sync_soon.set()

    async def drain(self) -> None:
        """Finish every batch in flight and sync what they trained (used at shutdown and by checkpoints)."""
        while self._inflight:
            await self._finish_oldest()
        if self.replica is not None:
            await self.sync(flush=True, remainders=True)

    async def sync(self, paced: bool = False, flush: bool = False, remainders: bool = False) -> None:
        """Send the replica's deltas (and counts and words) to the servers, then complete the batches
        trained before it. A sync the servers do not acknowledge is retried (a rollback is asked
        for: part of it may have been applied); one a rollback abandons drops its batches uncommitted."""
        async with self._sync_lock:
            if self._syncs_held:   # a checkpoint is snapshotting the servers: the next sync takes these too
                return
            await self._complete_covered()   # what another process's sync of a shared replica carried
            if not self._awaiting and not self.replica.has_pending():
                return
            if not await asyncio.to_thread(self._sync_with_retry, paced, flush, remainders):
                return
            await self._complete_covered()

    async def _complete_covered(self) -> None:
        """Complete, in training order, this process's batches that acknowledged syncs carried."""
        n = min(len(self._awaiting), self.replica.shard.covered_batches() - self._completed)
        if n <= 0:
            return
        done, self._awaiting = self._awaiting[:n], self._awaiting[n:]
        self._completed += n
        self._covered.set()
        self._awaiting_tokens = sum(stats.tokens for _, stats in self._awaiting)
        self.metrics.unsynced.set(self._awaiting_tokens)
        await self._complete_all(done)

    def _sync_with_retry(self, paced: bool = False, flush: bool = False, remainders: bool = False) -> bool:
        """``paced``: the sync loop's, which a replica shared by the host skips when another process of
        the host began one within the interval (drains and checkpoints always sync)."""
        backoff = 0.2
        gap = self.settings.sync_ms / 1000.0 if paced else 0.0
        while True:
            if self.abandon.is_set():
                return False
            c0 = time.thread_time()
            try:
                self.replica.sync(min_gap=gap, flush=flush, remainders=remainders)
                return True
            except (RequestTimeout, SendError) as exc:
                if self.abandon.is_set():
                    return False
                self.metrics.errors.inc()
                log_event(log, "sync_retry", logging.WARNING, error=f"{type(exc).__name__}: {exc}",
                          backoff=round(backoff, 2))
                if self.stopping.is_set():
                    return False
                self.extension.batch_retried(exc)
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                self.metrics.cpu["sync"].inc(time.thread_time() - c0)

    def reload_replica(self) -> int:
        """After a rollback: forget unsynced work and take the reloaded servers' rows (blocking)."""
        self._awaiting, self._awaiting_tokens = [], 0
        if self.replica is None:
            return 0
        self._completed = self.replica.shard.finished_batches()   # the dropped ones count as done
        return self.replica.reload()

    async def _sync_loop(self) -> None:
        interval = self.settings.sync_ms / 1000.0
        while True:
            try:
                await asyncio.wait_for(self._sync_soon.wait(), interval)
            except asyncio.TimeoutError:
                pass
            self._sync_soon.clear()
            if (self._awaiting or self.replica.has_pending()) and not self.abandon.is_set() \
                    and not self.paused.is_set():
                try:
                    # Held by the bound, this process syncs itself: the host's next paced sync may be a whole
                    # LIVEVEC_SYNC_MS away, and the process would stand still until then.
                    await self.sync(paced=self._awaiting_tokens < self.interval.limit())
                except Exception:
                    log.exception("sync failed")

    async def run(self) -> None:
        self.trainer.reseed(self.kv.po.node_id)   # the node has registered: its id is its sampling stream
        report = asyncio.create_task(self._report_loop())
        syncing = asyncio.create_task(self._sync_loop()) if self.replica is not None else None
        bounding = asyncio.create_task(self._bound_stop())
        try:
            while not self.stopping.is_set():
                if self.paused.is_set():
                    await self.drain()
                    self.idle.set()
                    await asyncio.sleep(0.05)
                    continue
                self.idle.clear()
                if self.replica is not None and self._awaiting_tokens >= self.interval.limit():
                    # The replica's staleness is bounded in tokens, not only in time: where syncs are slow (many
                    # replicas on few cores) training would otherwise run ahead, and every replica would walk its
                    # rows further from the cluster's between two merges (docs/design/0003-sync-interval.md).
                    # It waits for a sync to complete batches, not polling: 8 workers polling every 2 ms on 2 cores
                    # spent 8 us of event loop per trained token. The timeout notices a pause or a stop.
                    self._sync_soon.set()
                    self._covered.clear()
                    t0 = time.monotonic()
                    try:
                        await asyncio.wait_for(self._covered.wait(), 0.05)
                    except asyncio.TimeoutError:
                        pass
                    self.metrics.bound_wait.inc(time.monotonic() - t0)
                    continue
                # a short poll: a checkpoint's pause is noticed within it when the stream is quiet
                batch = await self.stream.next_batch(self._records_per_batch(), timeout=0.1)
                if batch is not None and batch.ranges:
                    if len(batch):
                        task = asyncio.wrap_future(self._train_pool.submit(self._train_blocking, batch.texts))
                    else:
                        # Every record in it was malformed: nothing to train, but its offsets are processed.
                        # It completes in order with the others (ledger, commit, checkpoint positions);
                        # left out, it would hold its partition's frontier back for good, so every
                        # checkpoint would store an offset the ledger had already passed.
                        task = asyncio.get_running_loop().create_future()
                        task.set_result(BatchStats())
                    self._inflight.append((batch, task))
                    self.metrics.inflight.set(len(self._inflight))
                while self._inflight and (self._inflight[0][1].done()
                                          or len(self._inflight) >= self.settings.max_inflight):
                    await self._finish_oldest()
            await self.drain()
        finally:
            report.cancel()
            bounding.cancel()
            if syncing is not None:
                syncing.cancel()
            self.extension.close()
            self._train_pool.shutdown(wait=False)
            if self.replica is not None:
                self.replica.shard.close()   # a host's shared replica: the last process removes it

    STOP_RESERVE = 3.0   # seconds of the stop budget kept for what follows the final sync (Kafka, leave)

    async def _bound_stop(self) -> None:
        """Once stopping, the batches in flight and the final sync get the stop budget (less ``STOP_RESERVE``);
        then what still waits on the servers is dropped, uncommitted (``abandon``, every request failed), so a
        dead server holds the stop no longer than that. Its records go to the partitions' next owner."""
        await self.stopping.wait()
        d = self.stop_deadline
        budget = d.remaining(reserve=self.STOP_RESERVE, floor=0.5) if d is not None else self.settings.request_timeout
        await asyncio.sleep(budget)
        log_event(log, "final_sync_abandoned", logging.WARNING, waited_s=round(budget, 2),
                  batches_in_flight=len(self._inflight), batches_unsynced=len(self._awaiting),
                  setting="LIVEVEC_STOP_TIMEOUT")
        self.abandon.set()
        while True:   # again and again: a request made after one round would otherwise wait its full timeout
            self.kv.customer.fail_all(RequestTimeout("stopping: the servers did not answer within the stop budget"))
            await asyncio.sleep(0.1)

    # ------------------------------------------------------------ reporting
    RATE_WINDOW = 10.0   # seconds of batches that words/s is averaged over

    def words_per_second(self) -> float:
        """Tokens per second over the last ``RATE_WINDOW`` seconds (0 when idle)."""
        now = time.monotonic()
        recent = [n for t, n in self._rate_window if now - t <= self.RATE_WINDOW]
        return sum(recent) / self.RATE_WINDOW

    async def _report_loop(self) -> None:
        """Tell server 0 this worker's lag, rate and training signal, so the front end can show them. The hot
        rows are measured here, every report, in a thread (``online.cluster.training_signal``)."""
        server0 = self.kv.po.server_ids()[0]
        while True:
            await asyncio.sleep(self.settings.report_interval)
            lag = sum(self.stream.lag().values())
            wps = self.words_per_second()
            self.metrics.lag.set(lag)
            self.metrics.words_per_second.set(wps)
            try:
                await asyncio.to_thread(self.signal.measure)
            except Exception as exc:   # a figure missing from one report; training goes on
                log_event(log, "training_signal_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
            body = orjson.dumps({"node": self.kv.po.node_id, "lag": lag, "words_per_second": wps,
                                 "tokens": self.trainer.totals.tokens, "time": time.time(),
                                 "malformed": dict(self.stream.counters.malformed),
                                 "training": self.signal.report()})
            try:
                ts = self.kv.request(pc.HEAD_WORKER_REPORT, body, server0)
                await self.kv.wait_async(ts, 5.0)
            except (RequestTimeout, SendError) as exc:
                log_event(log, "report_failed", logging.DEBUG, error=str(exc))
