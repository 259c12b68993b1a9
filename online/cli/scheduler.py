"""``livevec scheduler``: the ps-lite scheduler, plus the checkpoint coordinator when
``LIVEVEC_CHECKPOINT_DIR`` (or ``--checkpoint-dir``) is set.

The coordinator (``online.checkpoint.coordinator``) runs next to the scheduler in this
process: it takes coordinated checkpoints and rolls the cluster back when a node dies.
"""
from __future__ import annotations

import argparse
import os

from online.checkpoint.settings import COORDINATOR, CoordinatorSettings
from online.cluster import scheduler
from ps_bridge.settings import add_groups

GROUPS = (*scheduler.SCHEDULER_GROUPS, COORDINATOR)


def configure(parser: argparse.ArgumentParser) -> None:
    add_groups(parser, GROUPS)


def read_settings(args: argparse.Namespace, env=None):
    env = os.environ if env is None else env
    return scheduler.SchedulerSettings.from_args(args, env), CoordinatorSettings.from_args(args, env)


def run(args: argparse.Namespace) -> int:
    settings, coordinated = read_settings(args)
    if coordinated is None:
        return scheduler.run(settings)
    from online.checkpoint.coordinator import CheckpointCoordinator

    return scheduler.run(settings, lambda po: CheckpointCoordinator(po, coordinated))
