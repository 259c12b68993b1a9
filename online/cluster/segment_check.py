"""Whether a worker may attach to its host's replica segment (``online.cluster.host_replica``), checked at start.

A segment is shared by every worker process of one cluster on one host (``LIVEVEC_HOST_REPLICA``), so they must
agree on its layout (``segment_layout.LAYOUT``) and on the settings that shape it: dim, optimizer, seed and rows.
The layout is in the file's name, so the workers of two releases with different layouts on one host (a rolling
upgrade) make a segment each and never meet here; the header is still compared, first its layout, then each
setting, so that a message names the first cause and never a setting that agrees. ``check_before_joining`` runs
this comparison before the worker joins ps-lite or Kafka (``livevec worker`` then exits 2 with the cause's
setting named); ``HostSegment``'s attach runs it again under the segment's lock. Design: docs/design/0009-versions.md
"""
from __future__ import annotations

import fcntl
import logging
import os
import re
import struct
import time
from pathlib import Path

from online import __version__
from online.cluster.segment_layout import (H_ACCUM, H_DIM, H_LAYOUT, H_MAGIC, H_OPT, H_RELEASE, H_ROWS, H_SEED,
                                           H_SLOTS, LAYOUT, MAGIC, PAGE, segment_layout)
from online.learner.embedding_shard import OPTIMIZERS
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.worker")


def other_layouts(path: str | Path) -> list[Path]:
    """The segments beside ``path`` of the same cluster and host made by workers of other layouts (layout 2's
    name carries no layout), live or not (``reclaim_dead_segments`` removes the dead ones)."""
    path = Path(path)
    stem = path.name[:path.name.rindex("-layout")]
    same = re.compile(rf"{re.escape(stem)}(-layout\d+)?\.replica")
    return sorted(p for p in path.parent.glob(f"{stem}*.replica") if p != path and same.fullmatch(p.name))


def release_number(version: str = __version__) -> int:
    """``"0.2.0"`` -> 2000: the release as the header keeps it."""
    major, minor, patch = (int(re.match(r"\d+", part).group()) for part in (version.split(".") + ["0", "0"])[:3])
    return major * 1_000_000 + minor * 1_000 + patch


def _release_name(number: int) -> str:
    if number <= 0:
        return "a release before 0.2.0"
    return f"livevec {number // 1_000_000}.{number // 1_000 % 1_000}.{number % 1_000}"


def _still_named(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (not removed, nor replaced, meanwhile)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


class HostReplicaError(RuntimeError):
    """The segment cannot be used (its file, its room, another layout or other settings): ``setting`` is the one
    that is the cause, and the message starts with it."""

    def __init__(self, setting: str, problem: str):
        super().__init__(f"{setting}: {problem}")
        self.setting, self.problem = setting, problem


ACCUM_WIDTH = {"adagrad": lambda dim: dim, "rowadagrad": lambda dim: 1, "sgd": lambda dim: 0}
# The header slots a worker's settings fill, and the setting each comes from.
_SETTING_OF = {H_DIM: ("LIVEVEC_DIM", "dim"), H_ROWS: ("LIVEVEC_HOST_REPLICA_ROWS", "rows"),
               H_SEED: ("LIVEVEC_SEED", "seed"), H_OPT: ("LIVEVEC_OPTIMIZER", "optimizer")}


def wanted_header(dim: int, rows: int, optimizer: str, seed: int) -> tuple[dict[int, int], int]:
    """(header slot -> value every process attached must agree on, the segment's size in bytes)."""
    accum_width = ACCUM_WIDTH[optimizer](dim)
    _arrays, slots, size = segment_layout(dim, rows, accum_width)
    return {H_MAGIC: MAGIC, H_LAYOUT: LAYOUT, H_DIM: dim, H_ROWS: rows, H_SLOTS: slots, H_ACCUM: accum_width,
            H_SEED: seed & 0x7FFFFFFFFFFFFFFF, H_OPT: OPTIMIZERS.index(optimizer)}, size


def _shown(slot: int, value: int) -> str:
    return OPTIMIZERS[value] if slot == H_OPT and 0 <= value < len(OPTIMIZERS) else str(value)


def header_problem(path: Path, header, file_size: int, want: dict[int, int], size: int) -> HostReplicaError | None:
    """Why a live segment (its ``header``, int64 slots, and file size) cannot take a worker that wants ``want`` and
    ``size`` bytes; None if it can. The causes are tried in order (what it is, its layout, each setting, its
    size), so a message names the first that differs and never a setting that agrees."""
    fix = ("stop the other workers of this host first (the last one removes the segment), or give this worker "
           "another LIVEVEC_HOST_REPLICA directory")
    if len(header) <= H_LAYOUT or int(header[H_MAGIC]) != MAGIC:
        return HostReplicaError("LIVEVEC_HOST_REPLICA", f"{path} is in use, and is not a livevec host replica "
                                                        f"segment (or is damaged): {fix}")
    if int(header[H_LAYOUT]) != LAYOUT:
        theirs = int(header[H_LAYOUT])
        made_by = _release_name(int(header[H_RELEASE])) if theirs >= 3 else "livevec 0.1.0 or earlier"
        return HostReplicaError("LIVEVEC_HOST_REPLICA", (
            f"{path} is in use by workers of host replica layout {theirs} ({made_by}); this worker "
            f"(livevec {__version__}) uses layout {LAYOUT}, and workers of two layouts cannot share a segment: "
            f"{fix}"))
    for slot, (setting, name) in _SETTING_OF.items():
        if int(header[slot]) != want[slot]:
            return HostReplicaError(setting, (
                f"{path} is in use by workers with {name} {_shown(slot, int(header[slot]))}, this worker has "
                f"{_shown(slot, want[slot])}: every worker sharing a host replica must have the same {setting} "
                f"(their layout, {LAYOUT}, and their other settings agree)"))
    if any(int(header[slot]) != value for slot, value in want.items()) or file_size != size:
        return HostReplicaError("LIVEVEC_HOST_REPLICA", (
            f"{path} is in use, its layout ({LAYOUT}) and settings agree with this worker's, but its header or "
            f"size does not ({file_size} bytes, {size} expected): the segment is damaged; stop the workers of "
            "this host and remove it"))
    return None


def _read_header(fd: int) -> tuple[int, ...]:
    raw = os.pread(fd, PAGE, 0)
    return struct.unpack(f"<{len(raw) // 8}q", raw[:len(raw) // 8 * 8])


def check_before_joining(path: str | Path, *, dim: int, rows: int, optimizer: str, seed: int,
                         wait: float = 0.5) -> list[Path]:
    """At a worker's start, before it joins ps-lite or Kafka: raises ``HostReplicaError`` (the cause's setting
    named) when live workers hold the segment at ``path`` with another layout or other settings; returns the
    segments of other layouts beside it (an upgrade in progress: each layout trains its own). A segment nobody
    holds is started afresh by the attach, so it is not compared. Reads under the segment's ``.lock`` (as an
    attach does), waiting at most ``wait`` s for it; a segment busy for longer is left to the attach's check."""
    path = Path(path)
    want, size = wanted_header(dim, rows, optimizer, seed)
    live = _live_header(path, wait)
    if live is not None:
        problem = header_problem(path, live[1], live[0], want, size)
        if problem is not None:
            raise problem
    others = other_layouts(path) if path.parent.is_dir() else []
    if others:
        log_event(log, "host_replica_other_layouts", path=str(path), layout=LAYOUT,
                  others=",".join(p.name for p in others),
                  reason="workers of another release on this host keep their own segment until they leave")
    return others


def _live_header(path: Path, wait: float) -> tuple[int, tuple[int, ...]] | None:
    """(file size, header) of the segment at ``path`` if a live process is attached to it, else None."""
    lock_path = f"{path}.lock"
    try:
        lock_fd = os.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        return None   # never made, or being removed
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.005)
        if not _still_named(lock_fd, lock_path):
            return None
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return None   # nobody attached (closing the file releases the lock)
            except BlockingIOError:
                pass
            return os.fstat(fd).st_size, _read_header(fd)
        finally:
            os.close(fd)
    finally:
        os.close(lock_fd)   # (releases .lock)
