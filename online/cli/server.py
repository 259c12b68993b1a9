"""``livevec server``: run a parameter server that holds one key-range shard of the model.

The role itself is ``online.cluster.server``; this command reads its settings, adds the
checkpoint side when ``LIVEVEC_CHECKPOINT_DIR`` is set, and runs the node until SIGTERM, then stops
within ``LIVEVEC_STOP_TIMEOUT`` (``online.cluster.stopping``).
"""
from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import threading

from online.checkpoint.settings import CHECKPOINTS, checkpoint_dir, io_timeout
from online.cluster.server import SERVER_GROUPS, ServerSettings, build
from online.cluster.stopping import STOP_TIMEOUT, STOPPING, StopDeadline
from online.learner import kernel_cache
from ps_bridge.roles import serve_metrics
from ps_bridge.settings import add_groups
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.server")

GROUPS = (*SERVER_GROUPS, CHECKPOINTS, STOPPING)


def configure(parser: argparse.ArgumentParser) -> None:
    add_groups(parser, GROUPS)


def read_settings(args: argparse.Namespace, env=None) -> tuple[ServerSettings, str | None, float, StopDeadline]:
    env = os.environ if env is None else env
    return (ServerSettings.from_args(args, env), checkpoint_dir(args, env), io_timeout(args, env),
            StopDeadline(STOP_TIMEOUT.read(args, env), "server"))


def run(args: argparse.Namespace) -> int:
    settings, directory, directory_timeout, deadline = read_settings(args)
    kernel_cache.prepare("server")   # the image's compiled kernels: the first merges compile nothing
    extension = None
    if directory:
        from online.checkpoint.participants import ServerCheckpointing
        extension = functools.partial(ServerCheckpointing, directory, io_timeout=directory_timeout)
    po, _server, service = build(settings, extension=extension)
    stop = threading.Event()
    # Declared dead and replaced (e.g. cut off while a relaunched server took its id): outside the cluster
    # for good, so it exits (Marathon relaunches it, and it registers again) instead of idling.
    po.replaced_listeners.append(lambda _owner: stop.set())

    def _terminate(signum, _frame):
        deadline.arm()
        stop.set()

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)
    serve_metrics(po, settings.metrics_port)
    po.start()
    log_event(log, "server_ready", node_id=po.node_id, rank=po.rank, dim=settings.dim, pid=os.getpid())
    try:
        while not stop.wait(1.0):
            service.extension.tick()
    finally:
        log_event(log, "server_stopping", node_id=po.node_id, stop_s=round(deadline.elapsed(), 2), **service.stats())
        po.stop()
    return 3 if po.replaced_event.is_set() else 0
