"""The compiled kernels at a process's start: the image's numba cache copied in, and every compile logged.

A kernel decorated ``@njit(cache=True)`` compiles at its first call (about 15 s for the hogbatch window, a few
seconds for the others) unless numba's cache holds it for the same source (a hash of the file), the same
argument types and the same CPU (LLVM's name and feature string for it). In the image the cache directory,
``NUMBA_CACHE_DIR=/tmp/numba-cache``, is an emptyDir or a tmpfs, empty at every start, and numba uses a cache
only from a directory it can write. So the image carries a cache made when it was built (``livevec deploy
kernels``, ``online.cli.kernel_warm``) at :data:`SEED`, inside the virtualenv, and :func:`prepare` copies its
files into ``NUMBA_CACHE_DIR`` before the first kernel runs: about 3 MB, some milliseconds. A file already there
is kept (a container restarted in the same pod finds its own cache).

A compile still works whatever the cache holds: another CPU than the build's, a dimension, kernel or setting the
build did not run. :class:`CompileWatch` logs each one (``kernel_compile``, the function and its seconds) and
counts them, and ``prepare`` logs ``kernel_cache`` with what it copied, at WARNING when the seed was made for
another CPU (numba loads none of it there; every kernel compiles).

Design: docs/design/0009-kernel-cache.md
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from numba.core import config, event

from ps_bridge.structured_logging import log_event

SEED = Path(sys.prefix) / "share" / "livevec" / "kernel-cache"   # the image's: /opt/livevec/share/livevec/...
MANIFEST = "manifest.json"   # in the seed: what made it (numba, python, CPU, what was run), not copied

log = logging.getLogger("livevec.kernels")


def host_cpu() -> dict[str, str]:
    """The CPU as numba's cache keys see it: LLVM's name and feature string, or ``NUMBA_CPU_NAME`` /
    ``NUMBA_CPU_FEATURES`` where they are set (``numba.core.codegen.JITCPUCodegen.magic_tuple``)."""
    import llvmlite.binding as ll
    from numba.core.codegen import get_host_cpu_features
    name = config.CPU_NAME or ll.get_host_cpu_name()
    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else get_host_cpu_features()
    return {"name": name, "features": features}


class CompileWatch(event.Listener):
    """numba's ``numba:compile`` events: a cache miss, timed. A kernel that calls others compiles them inside its
    own compile; only the outermost is logged and counted, with the seconds of the whole."""

    def __init__(self):
        self._local = threading.local()
        self._lock = threading.Lock()
        self.count = 0
        self.seconds = 0.0

    def on_start(self, ev) -> None:
        depth = getattr(self._local, "depth", 0)
        if depth == 0:
            self._local.t0 = time.perf_counter()
        self._local.depth = depth + 1

    def on_end(self, ev) -> None:
        self._local.depth -= 1
        if self._local.depth:
            return
        took = time.perf_counter() - self._local.t0
        with self._lock:
            self.count += 1
            self.seconds += took
        dispatcher = (ev.data or {}).get("dispatcher")
        func = getattr(dispatcher, "py_func", None)
        name = f"{func.__module__}.{func.__qualname__}" if func is not None else str(dispatcher)
        arg_types = (ev.data or {}).get("args")
        log_event(log, "kernel_compile", function=name, seconds=round(took, 2),
                  types=";".join(str(a) for a in arg_types) if arg_types else None)

    def totals(self) -> tuple[int, float]:
        with self._lock:
            return self.count, self.seconds


WATCH = CompileWatch()
_registered = False


def watch() -> CompileWatch:
    """Count and log every compile of this process from now on (once per process)."""
    global _registered
    if not _registered:
        event.register("numba:compile", WATCH)
        _registered = True
    return WATCH


@dataclass
class SeedCopy:
    """What :func:`seed_cache` did."""

    cache_dir: str          # numba's NUMBA_CACHE_DIR ("" when unset: numba's own places, not seeded)
    seed: str               # the seed's directory ("" when there is none)
    copied: int = 0         # files copied in
    kept: int = 0           # files already there
    seconds: float = 0.0
    built_for: str = ""     # the CPU the seed was compiled for
    same_cpu: bool | None = None   # None: no seed
    error: str = ""         # why the copy stopped (a directory it cannot write): the kernels compile


def seed_cache(cache_dir: str | None = None, seed: Path = SEED) -> SeedCopy:
    """Copy the seed's files into ``cache_dir`` (default: numba's ``NUMBA_CACHE_DIR``) where absent.

    Each file goes in under a temporary name and is renamed, so two processes sharing the directory (workers of
    one pod) never read a half-written one."""
    t0 = time.perf_counter()
    cache_dir = config.CACHE_DIR if cache_dir is None else cache_dir
    manifest = seed / MANIFEST
    out = SeedCopy(cache_dir=cache_dir or "", seed=str(seed) if manifest.is_file() else "")
    if not out.seed or not cache_dir:
        return out
    built = json.loads(manifest.read_text())
    out.built_for = built.get("cpu", {}).get("name", "")
    out.same_cpu = built.get("cpu") == host_cpu()
    target = Path(cache_dir)
    try:
        for src in sorted(seed.rglob("*")):
            if not src.is_file() or src == manifest:
                continue
            dst = target / src.relative_to(seed)
            if dst.exists():
                out.kept += 1
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(f"{dst.name}.seed.{os.getpid()}")
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
            out.copied += 1
    except OSError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.seconds = time.perf_counter() - t0
    return out


def prepare(role: str) -> SeedCopy:
    """At a role's start, before its first kernel runs: watch the compiles, seed the cache, log ``kernel_cache``."""
    watch()
    done = seed_cache()
    if not done.seed:
        log_event(log, "kernel_cache", role=role, seed="none", cache_dir=done.cache_dir or "numba's default")
    elif not done.cache_dir:
        log_event(log, "kernel_cache", logging.WARNING, role=role, seed=done.seed, copied=0,
                  note="NUMBA_CACHE_DIR is not set: the image's kernels are not used, they compile")
    elif done.error:
        log_event(log, "kernel_cache", logging.WARNING, role=role, seed=done.seed, cache_dir=done.cache_dir,
                  copied=done.copied, error=done.error, note="the kernels not copied compile")
    elif not done.same_cpu:
        log_event(log, "kernel_cache", logging.WARNING, role=role, seed=done.seed, copied=done.copied,
                  kept=done.kept, built_for=done.built_for, this_cpu=host_cpu()["name"],
                  note="the image's kernels were compiled for another CPU: they compile here")
    else:
        log_event(log, "kernel_cache", role=role, seed=done.seed, cache_dir=done.cache_dir, copied=done.copied,
                  kept=done.kept, seconds=round(done.seconds, 3))
    return done
