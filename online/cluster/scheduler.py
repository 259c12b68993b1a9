"""``livevec scheduler``: the ps-lite scheduler, plus the checkpoint coordinator when
``LIVEVEC_CHECKPOINT_DIR`` (or ``--checkpoint-dir``) is set.

Without a checkpoint directory this is exactly ``ps_bridge.roles``' plain scheduler. With one,
the coordinator (``online.checkpoint.coordinator``) runs next to it in this process: it takes
coordinated checkpoints and rolls the cluster back when a node dies.
"""
from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import threading

from online.checkpoint.coordinator import CheckpointCoordinator, CoordinatorSettings, add_coordinator_arguments
from ps_bridge.metrics import Registry
from ps_bridge.structured_logging import log_event
from ps_bridge.postoffice import Postoffice
from ps_bridge.roles import run_scheduler, serve_metrics
from ps_bridge.settings import NodeSettings, add_node_arguments

log = logging.getLogger("livevec.scheduler")


def configure(parser: argparse.ArgumentParser) -> None:
    add_node_arguments(parser, role="scheduler")
    add_coordinator_arguments(parser)


def run(args: argparse.Namespace) -> int:
    node = NodeSettings.from_args(args, role="scheduler")
    coordinated = CoordinatorSettings.from_args(args)
    if coordinated is None:
        return run_scheduler(node)
    registry = Registry({"role": "scheduler"})
    po = Postoffice(node, registry)
    coordinator = CheckpointCoordinator(po, coordinated, registry)   # its app exists before anyone registers

    def _terminate(signum, _frame):
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
        faulthandler.register(signal.SIGUSR1)   # kill -USR1 <pid>: every thread's stack to stderr
    try:
        serve_metrics(po, node.metrics_port)
        po.start()
        coordinator.start()
        po.finalize()
        return 0
    except SystemExit as exc:
        log_event(log, "terminated", role="scheduler", code=exc.code)
        return 0
    finally:
        coordinator.stop()
        po.stop()
