"""The scheduler role: ps-lite's scheduler, with an optional companion beside it.

Without an extension this is exactly ``ps_bridge.roles``' plain scheduler. With one (the
checkpoint coordinator, when ``livevec scheduler`` has a checkpoint directory) the
extension runs in this process: the scheduler already knows who is in the cluster, and
there is exactly one of it.
"""
from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from online.cluster.node_settings import METRICS_PORT, node_groups, node_settings
from online.cluster.stopping import STOP_TIMEOUT, STOPPING, StopDeadline
from online.cluster.token_cost import process_cpu
from ps_bridge.metrics import Registry
from ps_bridge.postoffice import Postoffice
from ps_bridge.roles import serve_metrics
from ps_bridge.settings import NodeSettings
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.scheduler")

SCHEDULER_GROUPS = (*node_groups(), STOPPING)


# The extension point (checkpointing plugs in here; this package never imports it).
class SchedulerExtension:
    """Something that runs beside the ps-lite scheduler, in its process.

    Made from the scheduler's ``Postoffice`` before the node starts (so any app it
    creates exists before the first registration), ``start``-ed once the node is up and
    ``stop``-ped when the scheduler ends.
    """

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


@dataclass
class SchedulerSettings:
    node: NodeSettings
    metrics_port: int | None = None
    stop_timeout: float = STOP_TIMEOUT.default

    @classmethod
    def from_args(cls, args: argparse.Namespace | None, env: Mapping[str, str] | None = None) \
            -> "SchedulerSettings":
        env = os.environ if env is None else env
        return cls(node=node_settings(args, env, "scheduler"), metrics_port=METRICS_PORT.read(args, env),
                   stop_timeout=STOP_TIMEOUT.read(args, env))


def run(settings: SchedulerSettings, extension: Callable[[Postoffice], SchedulerExtension] | None = None) -> int:
    """Run the scheduler in this thread until the cluster finalizes (or SIGTERM).

    ``extension`` makes the companion from the node before the node starts, so that any
    app it creates exists before the first node registers. SIGTERM (or SIGINT) stops it within
    ``LIVEVEC_STOP_TIMEOUT`` (``online.cluster.stopping``)."""
    registry = Registry({"role": "scheduler"})
    process_cpu(registry)   # the cost of a trained token counts every role's CPU
    po = Postoffice(settings.node, registry)
    companion = extension(po) if extension is not None else SchedulerExtension()
    stop = StopDeadline(settings.stop_timeout, "scheduler")

    def _terminate(signum, _frame):
        stop.arm()
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
        signal.signal(signal.SIGINT, _terminate)
        faulthandler.register(signal.SIGUSR1)   # kill -USR1 <pid>: every thread's stack to stderr
    try:
        serve_metrics(po, settings.metrics_port)
        po.start()
        companion.start()
        po.finalize()
        return 0
    except SystemExit as exc:
        log_event(log, "terminated", role="scheduler", code=exc.code)
        return 0
    finally:
        companion.stop()
        po.stop()
