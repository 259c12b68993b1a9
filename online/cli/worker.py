"""``livevec worker``: consume Kafka, train SGNS mini-batches, send the servers what they changed.

The role itself is ``online.cluster.worker``; this command reads its settings, joins the
cluster, opens the stream, adds the checkpoint side when ``LIVEVEC_CHECKPOINT_DIR`` is set,
and runs until SIGTERM (an elastic worker then leaves the cluster instead of stopping it). The stop is
bounded by ``LIVEVEC_STOP_TIMEOUT`` (``online.cluster.stopping``): the final sync, the Kafka consumer's
close and the leave each get what is left of it, whatever the servers, the scheduler or Kafka do.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import time

from online.checkpoint.settings import CHECKPOINTS, checkpoint_dir, io_timeout
from online.cluster.stopping import STOP_TIMEOUT, STOPPING, StopDeadline
from online.cluster.segment_check import HostReplicaError, check_before_joining
from online.cluster.worker import WORKER_GROUPS, StreamingWorker, WorkerExtension, WorkerSettings, host_replica_rows
from online.learner import kernel_cache
from online.learner.trainer import warm_up
from online.stream.reader import KafkaStream
from online.stream.security import KafkaUnreachable
from ps_bridge.metrics import Registry
from ps_bridge.roles import serve_metrics, start_worker
from ps_bridge.settings import SettingError, add_groups
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.worker")

GROUPS = (*WORKER_GROUPS, CHECKPOINTS, STOPPING)


def configure(parser: argparse.ArgumentParser) -> None:
    add_groups(parser, GROUPS)


def read_settings(args: argparse.Namespace, env=None) -> tuple[WorkerSettings, str | None, StopDeadline]:
    """The worker's settings; with checkpoints, checked against how the latest one read the stream."""
    env = os.environ if env is None else env
    settings, directory = WorkerSettings.from_args(args, env), checkpoint_dir(args, env)
    deadline = StopDeadline(STOP_TIMEOUT.read(args, env), "worker")
    if directory:
        from online.checkpoint.participants import check_reading, worker_reading
        check_reading(directory, worker_reading(settings), io_timeout(args, env))
    return settings, directory, deadline


def check_host_replica(settings: WorkerSettings) -> None:
    """Before the worker joins ps-lite or Kafka (and before it compiles): a ``SettingError`` naming the cause when
    the workers already on this host hold the segment it would attach to with another layout or other settings
    (``segment_check``), instead of a failure after it has joined both."""
    path = StreamingWorker.host_replica_path(settings)
    if not path or settings.exchange != "replica":
        return
    cfg = settings.learner
    try:
        check_before_joining(path, dim=cfg.dim, rows=host_replica_rows(settings), optimizer=cfg.optimizer,
                             seed=cfg.seed)
    except HostReplicaError as exc:
        raise SettingError(exc.setting, exc.problem) from None


def run(args: argparse.Namespace) -> int:
    settings, directory, deadline = read_settings(args)
    check_host_replica(settings)   # a host replica this worker cannot share stops it here, before it joins anything
    kernel_cache.prepare("worker")   # the image's compiled kernels into NUMBA_CACHE_DIR, before the first one runs
    return asyncio.run(_main(settings, directory, deadline))


def _extension(directory: str | None) -> WorkerExtension | None:
    if not directory:
        return None
    from online.checkpoint.participants import WorkerCheckpointing
    return WorkerCheckpointing()


KAFKA_RETRY_S = 5.0   # between two checks of brokers that did not answer at start


async def _kafka_checked(stream: KafkaStream, stop: StopDeadline) -> bool:
    """Kafka's TLS and SASL settings fail here (``SettingError``), before this worker joins anything. Brokers that
    do not answer are not a configuration error: a worker relaunched during a broker outage waits for them (one
    line, then one a minute) instead of crash-looping with a traceback per launch. False: stopped meanwhile."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: (stop.arm(), stopping.set()))
    since = time.monotonic()
    last_line = None
    while True:
        try:
            await stream.check()
            break
        except KafkaUnreachable as exc:
            now = time.monotonic()
            if last_line is None or now - last_line >= 60.0:
                log_event(log, "kafka_unreachable_at_start", logging.WARNING, error=str(exc)[:300],
                          waited_s=round(now - since, 1), retry_s=KAFKA_RETRY_S)
                last_line = now
        try:
            await asyncio.wait_for(stopping.wait(), KAFKA_RETRY_S)
            return False
        except asyncio.TimeoutError:
            pass
    if last_line is not None:
        log_event(log, "kafka_reachable_at_start", waited_s=round(time.monotonic() - since, 1))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
    return True


async def _main(settings: WorkerSettings, directory: str | None, stop: StopDeadline) -> int:
    registry = Registry({"role": "worker"})
    stream = KafkaStream(settings.stream, metrics=registry)
    if not await _kafka_checked(stream, stop):
        return 0
    if settings.exchange == "replica":   # before joining Kafka's group and the cluster: a cold compile holds the GIL
        took = await asyncio.to_thread(warm_up, settings.learner)
        compiles, compile_s = kernel_cache.WATCH.totals()   # 0: every kernel came from the cache
        log_event(log, "kernel_compiled", kernel=settings.learner.kernel, dim=settings.learner.dim,
                  seconds=round(took, 2), compiles=compiles, compile_s=round(compile_s, 2))
    kv = await asyncio.to_thread(start_worker, settings.node, registry=registry)
    serve_metrics(kv.po, settings.metrics_port)
    await stream.start()
    worker = StreamingWorker(settings, kv, stream, registry, extension=_extension(directory))
    worker.stop_deadline = stop

    def _stop() -> None:
        stop.arm()
        worker.stopping.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _stop)
    # Declared dead and its id given to another worker (cut off, then replaced): outside the cluster for good, its
    # pushes fenced, so it stops (the servers have none of its uncommitted batches; Kafka redelivers them) and
    # exits 3 for Marathon to relaunch it, instead of holding its partitions while training nothing.
    kv.po.replaced_listeners.append(lambda _owner: loop.call_soon_threadsafe(_stop))
    log_event(log, "worker_ready", node_id=kv.po.node_id, pid=os.getpid(), topics=",".join(settings.stream.topics),
              group=settings.stream.group, kernel=settings.learner.kernel)
    try:
        await worker.run()
    finally:
        # Kafka down or rebalancing: the consumer's close (commit, leave group) must not hold the stop. Not
        # wait_for: it waits for the cancelled close to finish, and the Kafka client's close may not let go.
        closing = asyncio.ensure_future(stream.stop())
        done, _ = await asyncio.wait({closing}, timeout=stop.remaining(reserve=1.5, floor=0.5))
        if not done:
            log_event(log, "stream_stop_abandoned", logging.WARNING, waited_s=round(stop.elapsed(), 2),
                      setting="LIVEVEC_STOP_TIMEOUT")
        t = worker.trainer.totals
        log_event(log, "worker_stopping", node_id=kv.po.node_id, tokens=t.tokens, words=t.kept, pairs=t.pairs,
                  stop_s=round(stop.elapsed(), 2))
        # (A replaced worker does not leave: its id is another worker's now, whom a LEAVE would remove.)
        if kv.po.elastic and not kv.po.replaced_event.is_set():   # the scheduler gone: waited for what is left
            await asyncio.to_thread(kv.po.leave, min(5.0, stop.remaining(reserve=0.5, floor=0.2)))
        else:
            kv.po.stop()
    return 3 if kv.po.replaced_event.is_set() else 0
