"""Checkpoint and recovery numbers for a 100k-word model: time, size, training pause, recovery per role.

Part 1, in process: one shard holding a 100k-word model (200k rows: input and output vectors,
dim 100) - how long the snapshot (the part of the training pause spent on the server), the
atomic write with SHA-256, a full verification and a load take, and the file size.

Part 2, a real local cluster (2 servers, 2 workers, front end, scheduler with the coordinator,
real Kafka): the cluster starts from a seeded 100k-word checkpoint, trains a planted stream,
takes checkpoints every few seconds (pause and write as the coordinator logs them), then each
role is killed with SIGKILL in turn; recovery time = kill -> the cluster trains again (the
servers' ledger advances after the rollback), split into detection (PS_HEARTBEAT_TIMEOUT),
relaunch and the rollback itself.

    .venv/bin/python bench/checkpoint_numbers.py [--words 100000] [--skip-cluster]
        [--record bench/results/recovery.json]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import result_record  # noqa: E402
from recovery_cluster import FAST_RECOVERY_ENV, Cluster, Producer, new_topic, start_broker  # noqa: E402

from online.checkpoint.store import (CheckpointStore, read_shard_file, restore_shard, snapshot_shard,  # noqa: E402
                                     write_shard_file)
from online.learner.embedding_shard import EmbeddingShard  # noqa: E402
from online.learner.keys import word_rows  # noqa: E402
from online.stream.sample_corpus import generate_lines  # noqa: E402
from online.learner.keys import word_key  # noqa: E402
from ps_bridge.postoffice import server_key_ranges  # noqa: E402

DIM = 100


def model_shard(n_words: int, optimizer: str, key_range=None) -> EmbeddingShard:
    words = [f"w{i:06d}" for i in range(n_words)]
    keys = np.array([word_key(w) for w in words], dtype=np.uint64)
    if key_range is not None:
        keep = (keys >= np.uint64(key_range[0])) & (keys < np.uint64(key_range[1]))
        keys, words = keys[keep], [w for w, k in zip(words, keep.tolist()) if k]
    rows = np.sort(word_rows(keys))
    rng = np.random.default_rng(1)
    shard = EmbeddingShard(DIM, optimizer=optimizer, initial_rows=len(rows))
    shard.assign(rows, rng.normal(0, 0.1, (len(rows), DIM)).astype(np.float32),
                 rng.random((len(rows), shard.accum.shape[1] if shard.accum.shape[0] else 1)).astype(np.float32)
                 if shard.accum.shape[0] else None)
    shard.add_counts(keys, rng.integers(5, 10_000, len(keys)))
    shard.set_words(keys, words)
    return shard


def timed(fn, repeat: int = 3):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def part1(n_words: int, work: Path) -> dict:
    results = {}
    for optimizer in ("adagrad", "rowadagrad"):
        shard = model_shard(n_words, optimizer)
        t_snap, state = timed(lambda: snapshot_shard(shard))
        path = work / f"server-0-{optimizer}.npz"
        t_write, entry = timed(lambda: write_shard_file(path, state))
        store = CheckpointStore(work / f"store-{optimizer}")
        store.prepare(1)
        entry = write_shard_file(store.path_of(1) / "server-0.npz", state)
        store.write_manifest(1, {"num_servers": 1, "files": {"server-0.npz": entry}, "offsets": {}})
        t_verify, _ = timed(lambda: store.verify(1))
        t_load, _ = timed(lambda: restore_shard([read_shard_file(path)], dim=DIM, optimizer=optimizer, eta=None,
                                                seed=0))
        results[optimizer] = {"rows": len(shard), "bytes": entry["bytes"], "snapshot_s": t_snap, "write_s": t_write,
                              "verify_s": t_verify, "load_s": t_load}
        print(f"[{optimizer:10s}] {n_words} words / {len(shard)} rows: file {entry['bytes'] / 1e6:.1f} MB | "
              f"snapshot {t_snap * 1e3:.0f} ms | write+sha256 {t_write * 1e3:.0f} ms | verify {t_verify * 1e3:.0f} ms"
              f" | load {t_load * 1e3:.0f} ms", flush=True)
    return results


def seed_checkpoint(store: CheckpointStore, n_words: int, servers: int) -> None:
    """A complete checkpoint holding a 100k-word model split like the servers will split it."""
    path = store.prepare(1)
    files = {}
    for rank, key_range in enumerate(server_key_ranges(servers)):
        shard = model_shard(n_words, "adagrad", key_range)
        files[f"server-{rank}.npz"] = write_shard_file(path / f"server-{rank}.npz",
                                                       snapshot_shard(shard, {"rank": rank, "num_servers": servers}))
    store.write_manifest(1, {"num_servers": servers, "files": files, "offsets": {}, "reason": "seeded by bench"})


def part2(n_words: int, work: Path) -> dict:
    broker = start_broker()
    cluster = None
    try:
        topic = new_topic(broker.bootstrap)
        env = {"LIVEVEC_CHECKPOINT_INTERVAL": "5", "LIVEVEC_DIM": str(DIM), "LIVEVEC_KAFKA_BATCH_RECORDS": "50"}
        cluster = Cluster(work, broker.bootstrap, topic, env=env)
        seed_checkpoint(cluster.store, n_words, 2)
        lines = generate_lines(120_000, seed=3)
        records = ["\n".join(lines[i:i + 10]) for i in range(0, len(lines), 10)]
        producer = Producer(broker.bootstrap, topic, records, rate=150.0)
        t0 = time.monotonic()
        cluster.start()
        print(f"cluster healthy in {time.monotonic() - t0:.1f} s", flush=True)
        producer.start()
        probe = cluster.probe
        cluster.wait(lambda: (probe.ledger() or {}).get("records", 0) > 200, 120, "training")
        time.sleep(30)   # a few checkpoints of the 100k-word model while training
        ckpts = [c for c in cluster.log_events("scheduler", "checkpoint_done") if int(c.get("workers", 0)) == 2]
        pauses = [float(c["pause_ms"]) for c in ckpts]
        writes = [float(c["write_ms"]) for c in ckpts]
        sizes = [int(c["bytes"]) for c in ckpts]
        print(f"checkpoints while training: {len(ckpts)}; pause ms median {statistics.median(pauses):.0f} "
              f"max {max(pauses):.0f}; write ms median {statistics.median(writes):.0f}; "
              f"size {max(sizes) / 1e6:.1f} MB", flush=True)
        recovery = {}
        for app, index in [("worker", 0), ("server", 1), ("scheduler", 0), ("frontend", 0)]:
            before = probe.ledger()["records"]
            rollbacks_before = len(cluster.log_events("scheduler", "rollback_done"))
            t_kill = time.monotonic()
            cluster.runner.kill_task(app, index)
            if app == "frontend":
                def ready():
                    try:
                        with urllib.request.urlopen(cluster.runner.url("frontend", "http", "/ready"), timeout=2) as r:
                            return r.status == 200
                    except OSError:
                        return False
                time.sleep(0.5)
                cluster.wait(ready, 180, "the front end to be ready again")
                recovery[app] = {"total_s": time.monotonic() - t_kill}
            else:
                advanced = []

                def rolled_back():
                    return len(cluster.log_events("scheduler", "rollback_done")) > rollbacks_before

                def trains_again():
                    stats = probe.stats(timeout=1.0)
                    if stats and not advanced and stats[0]["ledger"]["records"] > before:
                        advanced.append(time.monotonic() - t_kill)   # trained on before the rollback
                    if not stats or any(s.get("recovering") for s in stats) or not rolled_back():
                        return False
                    if not hasattr(trains_again, "base"):
                        trains_again.base = stats[0]["ledger"]["records"]
                    return stats[0]["ledger"]["records"] > trains_again.base

                cluster.wait(trains_again, 180, f"training after killing {app}")
                rb = cluster.log_events("scheduler", "rollback_done")[-1]
                recovery[app] = {"total_s": time.monotonic() - t_kill, "rollback_ms": float(rb["ms"]),
                                 "kept_training_s": advanced[0] if advanced else None}
            print(f"kill -9 {app}: trains again after the rollback {recovery[app]['total_s']:.1f} s after the kill "
                  f"(rollback itself {recovery[app].get('rollback_ms', 0):.0f} ms; survivors kept training: "
                  f"{recovery[app].get('kept_training_s')})", flush=True)
            time.sleep(8)
        producer.stop.set()
        return {"pause_ms_median": statistics.median(pauses), "pause_ms_max": max(pauses),
                "write_ms_median": statistics.median(writes), "bytes": max(sizes), "recovery": recovery}
    finally:
        if cluster is not None:
            cluster.stop()
        broker.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--words", type=int, default=100_000)
    ap.add_argument("--skip-cluster", action="store_true")
    ap.add_argument("--record", metavar="FILE", help="write the recovery row to this result file (bench/results/)")
    args = ap.parse_args()
    record = result_record.start(args.record, "checkpoint_numbers")
    with tempfile.TemporaryDirectory(prefix="livevec-ckpt-bench-") as tmp:
        part1(args.words, Path(tmp))
        if not args.skip_cluster:
            result_record.write(record, [recovery_row(args.words, part2(args.words, Path(tmp) / "cluster"))])
    return 0


def recovery_row(n_words: int, cluster: dict) -> dict:
    """The result file's row: seconds from each role's SIGKILL until the cluster trains again (the front end:
    until it is ready again)."""
    s = {app: r["total_s"] for app, r in cluster["recovery"].items()}
    session_s = int(FAST_RECOVERY_ENV["LIVEVEC_KAFKA_SESSION_TIMEOUT_MS"]) / 1e3
    return result_record.row(
        "recovery", f"training again {s['worker']:.1f} s after a worker is killed, {s['server']:.1f} s after a "
                    f"server, {s['scheduler']:.1f} s after the scheduler; a front end ready again in "
                    f"{s['frontend']:.1f} s ({n_words:,} words, PS_HEARTBEAT_TIMEOUT="
                    f"{FAST_RECOVERY_ENV['PS_HEARTBEAT_TIMEOUT']}, a {session_s:g} s Kafka session timeout)",
        "every role back without an operator (no time target)", "met")


if __name__ == "__main__":
    sys.exit(main())
