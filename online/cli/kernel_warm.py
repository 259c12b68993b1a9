"""``livevec deploy kernels``: compile the roles' numba kernels into ``NUMBA_CACHE_DIR``, the image's kernel cache.

``deploy/Dockerfile`` runs it when the image is built, with ``NUMBA_CACHE_DIR`` at the seed inside the virtualenv
(``online.learner.kernel_cache.SEED``), which every role copies into its own empty cache directory at start.

numba's cache holds a kernel for the argument types it was called with, and those depend on the caller's code path:
a record's bytes are read-only, a delta sliced off the wire is not contiguous, a column of the word table is a
strided view. A list of signatures kept by hand would drift from the code; so this runs the roles' own paths, in
one process, on loopback:

- each in-place kernel (hogbatch, pairs) at d = 100 and at one other d, through a worker's own warm-up
  (``trainer.warm_up``): hogbatch compiles d = 100 as a constant and every other d as one function, so two d's
  cover every d;
- records as the stream hands them over: text (``text8`` and ``tokens`` tokenizers) and JSON (a text field, an
  item list);
- per kernel, a scheduler, a server and three workers (two sharing a host replica, one with its own) that train
  records into their replicas and sync: the workers' collect and apply, the server's merge of two senders, its
  answers, the counts and journals; then the server's shard checkpointed and restored, and the workers reloaded,
  as a rollback or a relaunched server does;
- the front end's search kernels (``model_index.warm_up``).

A role that runs anything else (the pull/push exchange, another optimizer, a kernel changed since the build)
compiles it at its start or first use, and logs ``kernel_compile`` (``online.learner.kernel_cache``).
Then the manifest: numba, Python, the CPU compiled for, what ran, the seconds.
"""
from __future__ import annotations

import json
import logging
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

import numba
from numba.core import config

from online.learner import kernel_cache
from ps_bridge.settings import SettingError
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.kernels")

DIMS = (100, 64)               # hogbatch's constant d and one other (online.learner.hogbatch_kernel.DIM_COMPILED)
KERNELS = ("hogbatch", "pairs")
WORKERS = 3                    # two on one host replica, one on its own: the server merges two senders
_LINES = ("the quick brown fox jumps over the lazy dog . a dog is not a fox and a fox is not a dog",
          "king queen man woman paris france berlin germany words of a window of words")


def _records(n: int = 64) -> list[str]:
    return [_LINES[i % len(_LINES)] + f" w{i % 7}" for i in range(n)]


def warm_learner() -> list[str]:
    """Each kernel at each d, then the stream's record formats and tokenizers, each through a throwaway trainer."""
    from online.learner.trainer import LearnerConfig, Trainer, warm_up
    from online.stream.batches import decode_records
    from online.stream.records import RecordFormat
    ran = []
    for kernel in KERNELS:
        for dim in DIMS:
            warm_up(LearnerConfig(dim=dim, kernel=kernel))
            ran.append(f"{kernel} d={dim}")
    texts = [line.encode() for line in _LINES]
    events = [json.dumps({"text": line, "items": line.split()[:6]}).encode() for line in _LINES]
    for fmt, field, tokenizer, values in (("text", "", "tokens", texts), ("json", "text", "text8", events),
                                          ("json", "items", "text8", events)):
        records = [text for text, reason in decode_records(values * 4, 1 << 20, RecordFormat(fmt, field))
                   if reason is None]
        trainer = Trainer(LearnerConfig(tokenizer=tokenizer, min_count=1, sample=0.0, vocab_capacity=64), inplace=True)
        trainer.train_records(records)
        ran.append(f"records {fmt}{'.' + field if field else ''} {tokenizer}")
    return ran


def warm_exchange(kernel: str, work: Path, syncs: int = 3, timeout: float = 60.0) -> None:
    """A scheduler, a server and ``WORKERS`` workers in this process on 127.0.0.1, each worker made as ``livevec
    worker`` makes it (``StreamingWorker``, its replica and trainer), training records and syncing ``syncs`` times
    as its sync loop does, then once more with every waiting delta (a checkpoint's or a drain's flush)."""
    from online.cluster.node_settings import node_settings
    from online.cluster.server import ServerSettings, build
    from online.cluster.worker import StreamingWorker, WorkerSettings
    from ps_bridge.metrics import Registry
    from ps_bridge.roles import start_scheduler, start_worker
    common = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_NODE_HOST": "127.0.0.1", "DMLC_NUM_SERVER": "1",
              "DMLC_NUM_WORKER": str(WORKERS), "LIVEVEC_ELASTIC_WORKERS": "1", "LIVEVEC_KERNEL": kernel,
              "LIVEVEC_MIN_COUNT": "1", "LIVEVEC_SAMPLE": "0", "LIVEVEC_VOCAB_CAPACITY": "4096",
              "LIVEVEC_HOST_REPLICA_ROWS": "16384",
              "LIVEVEC_KAFKA_BOOTSTRAP": "127.0.0.1:9", "LIVEVEC_KAFKA_TOPICS": "warm"}   # (never connected)
    sched, _thread = start_scheduler(node_settings(None, {**common, "DMLC_PS_ROOT_PORT": "0"}, "scheduler"))
    env = {**common, "DMLC_PS_ROOT_PORT": str(sched.my_node.port)}
    po, _kv_server, service = build(ServerSettings.from_args(None, {**env, "DMLC_ROLE": "server"}))
    started: dict[int, object] = {}
    errors: list[BaseException] = []

    def _start(i: int) -> None:
        try:
            if i < 0:
                po.start(timeout=timeout)
                return
            shared = {"LIVEVEC_HOST_REPLICA": str(work)} if i < 2 else {}
            settings = WorkerSettings.from_args(None, {**env, "DMLC_ROLE": "worker", **shared})
            started[i] = (settings, start_worker(settings.node, timeout=timeout))
        except BaseException as exc:   # noqa: BLE001 - raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=_start, args=(i,), daemon=True) for i in range(-1, WORKERS)]
    for t in threads:
        t.start()
    workers = []
    try:
        for t in threads:
            t.join(timeout)
        if errors or len(started) != WORKERS:
            raise RuntimeError(f"the loopback cluster did not start: {errors or 'timed out'}")
        workers = [StreamingWorker(settings, kv, None, Registry({"role": "worker"})) for settings, kv in
                   (started[i] for i in range(WORKERS))]
        records = _records()
        for w in workers:
            w.trainer.reseed(w.kv.po.node_id)
        for i in range(syncs + 1):   # as the sync loop runs them: packed deltas held back or sent, then a flush
            for w in workers:
                w.trainer.train_records(records)
            for w in workers:
                w.replica.sync(flush=i == syncs)
        _checkpoint_and_rollback(service.shard, work / "shard.npz")
        for w in workers:
            w.replica.reload()
    finally:
        for w in workers:
            w.replica.shard.close()   # the host replica's segment: the last process removes it
        for _settings, kv in started.values():
            kv.po.stop()
        po.stop()
        sched.stop()


def _checkpoint_and_rollback(shard, path: Path) -> None:
    """A server's side of a checkpoint and of a rollback, or of a relaunched server's start: the shard's snapshot
    written and read back, and a shard restored from it (and an empty one), as ``online.checkpoint.participants``."""
    from online.checkpoint.store import read_shard_file, restore_shard, snapshot_shard, write_shard_file
    write_shard_file(path, snapshot_shard(shard, {"rank": 0}))
    params = dict(dim=shard.dim, optimizer=shard.optimizer, eta=shard.eta, seed=shard.seed,
                  adagrad_init=shard.adagrad_init, min_count=shard.word_counts.min_count,
                  word_capacity=shard.word_counts.capacity)
    restore_shard([read_shard_file(path)], **params)
    restore_shard([], **params)


def warm_search() -> None:
    from online.search.model_index import warm_up
    warm_up()


def run(args) -> int:
    """Compile into numba's ``NUMBA_CACHE_DIR`` and write its manifest; exit 2 when it is not set."""
    if not config.CACHE_DIR:
        raise SettingError("NUMBA_CACHE_DIR", "set it to the directory to fill (the Dockerfile: the seed, "
                                              f"{kernel_cache.SEED})")
    watch = kernel_cache.watch()
    t0 = time.perf_counter()
    ran = warm_learner()
    for kernel in KERNELS:
        with tempfile.TemporaryDirectory(prefix="livevec-warm-") as work:
            warm_exchange(kernel, Path(work))
        ran.append(f"exchange {kernel} ({WORKERS} workers, 1 server)")
    warm_search()
    ran.append("search")
    compiled, compile_s = watch.totals()
    manifest = {"numba": numba.__version__, "python": platform.python_version(), "cpu": kernel_cache.host_cpu(),
                "ran": ran, "dims": list(DIMS), "kernels_compiled": compiled,
                "seconds": round(time.perf_counter() - t0, 1)}
    out = Path(config.CACHE_DIR)
    out.mkdir(parents=True, exist_ok=True)
    (out / kernel_cache.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    files = [p for p in out.rglob("*") if p.is_file()]
    log_event(log, "kernels_warmed", cache_dir=str(out), compiled=compiled, compile_s=round(compile_s, 1),
              files=len(files), bytes=sum(p.stat().st_size for p in files), seconds=manifest["seconds"],
              cpu=manifest["cpu"]["name"])
    print(json.dumps({k: v for k, v in manifest.items() if k != "cpu"} | {"cpu": manifest["cpu"]["name"]}),
          file=sys.stderr)
    return 0
