"""The checkpoint settings, declared once for the scheduler, the servers, the workers and
``livevec checkpoint``.

One directory turns checkpointing on: it must be set on every role (the deployment files
do), because the scheduler's coordinator, the servers' save/load side and the workers'
pause/seek side only work together. The timing settings are the coordinator's alone.

Importing this module imports nothing else of ``online.checkpoint``: a command reads the
directory first and imports the checkpoint machinery only when it is set.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass

from ps_bridge.settings import Setting, SettingGroup

CHECKPOINT_DIR = Setting(
    "checkpoint_dir", "LIVEVEC_CHECKPOINT_DIR", metavar="DIR",
    help="where coordinated checkpoints live, shared by the scheduler, the servers and the workers "
         "(unset: no checkpoints)")

# A dead FUSE mount (a MooseFS master or chunkserver gone) can hang a write forever: every call on
# the directory gets this long, then counts as a storage failure (the checkpoint is aborted).
IO_TIMEOUT = Setting(
    "io_timeout", "LIVEVEC_CHECKPOINT_IO_TIMEOUT", float, 120.0, minimum=0.5, metavar="SECONDS",
    flags=("--checkpoint-io-timeout",),
    help="seconds any call on the checkpoint directory (a shard write, a manifest, a listing) may take "
         "before it counts as a storage failure")

# What a server and a worker read: the directory (it switches their side on) and the deadline of its calls.
CHECKPOINTS = SettingGroup("checkpoints", (CHECKPOINT_DIR, IO_TIMEOUT))

COORDINATOR = SettingGroup("checkpoints (the coordinator runs when a directory is set)", (
    CHECKPOINT_DIR,
    Setting("interval", "LIVEVEC_CHECKPOINT_INTERVAL", float, 60.0, minimum=0.0, metavar="SECONDS",
            flags=("--checkpoint-interval",), help="seconds between checkpoints (0 = not on a timer)"),
    Setting("records", "LIVEVEC_CHECKPOINT_RECORDS", int, 0, minimum=0, metavar="RECORDS",
            flags=("--checkpoint-records",), help="also checkpoint after this many trained records (0 = off)"),
    Setting("keep", "LIVEVEC_CHECKPOINT_KEEP", int, 3, minimum=1, metavar="N",
            flags=("--checkpoint-keep",), help="complete checkpoints kept"),
    Setting("pause_timeout", "LIVEVEC_CHECKPOINT_PAUSE_TIMEOUT", float, 30.0, minimum=0.5, metavar="SECONDS",
            flags=("--checkpoint-pause-timeout",), help="seconds workers get to pause"),
    Setting("rollback_wait_timeout", "LIVEVEC_ROLLBACK_WAIT_TIMEOUT", float, 60.0, minimum=1.0, metavar="SECONDS",
            flags=("--rollback-wait-timeout",),
            help="seconds a rollback waits for workers that do not pause, fence or seek; it then starts again "
                 "with the workers that answer (the others are fenced until a later rollback takes them in)"),
    IO_TIMEOUT,
))

# ``livevec checkpoint`` works on the directory alone, named by its own shorter flag.
STORE = SettingGroup("checkpoint directory", (
    CHECKPOINT_DIR.replace(flags=("--dir",), required=True, metavar="DIR",
                           help="the checkpoint directory (local, or the cluster's shared file system)"),))


@dataclass
class CoordinatorSettings:
    checkpoint_dir: str
    interval: float = 60.0        # seconds between checkpoints (0: none on a timer)
    records: int = 0              # trained records between checkpoints (0: no record trigger)
    keep: int = 3                 # complete checkpoints kept
    pause_timeout: float = 30.0   # seconds the workers get to finish their batches in flight
    rollback_wait_timeout: float = 60.0   # seconds a rollback waits for members that do not answer
    io_timeout: float = 120.0     # seconds a call on the checkpoint directory may take

    @classmethod
    def from_args(cls, args: argparse.Namespace | None, env: Mapping[str, str] | None = None) \
            -> "CoordinatorSettings | None":
        """The coordinator's settings, or None when no checkpoint directory is set."""
        values = COORDINATOR.read(args, os.environ if env is None else env)
        return cls(**values) if values["checkpoint_dir"] else None


def checkpoint_dir(args: argparse.Namespace | None, env: Mapping[str, str] | None = None) -> str | None:
    """The checkpoint directory a role was given (None: checkpointing is off)."""
    return CHECKPOINT_DIR.read(args, os.environ if env is None else env) or None


def io_timeout(args: argparse.Namespace | None, env: Mapping[str, str] | None = None) -> float:
    """The deadline of one call on the checkpoint directory (``LIVEVEC_CHECKPOINT_IO_TIMEOUT``)."""
    return IO_TIMEOUT.read(args, os.environ if env is None else env)
