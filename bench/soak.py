"""Soak test (not run in CI): kill random livevec processes for a while, then account for every record.

A local cluster (scheduler with the checkpoint coordinator, 2 servers, 2 workers, front end, real
Kafka) trains the planted sample corpus streamed at a steady rate. Every ``--kill-every`` seconds
(randomised) one random process is killed with SIGKILL and relaunched by the local Marathon-like
runner. After ``--duration`` seconds the producer stops, the cluster drains the backlog, and the
script reports:

* records produced against records trained (server 0's ledger: trained once, twice, or skipped);
* downtime: seconds during which the backlog was not empty and nothing was trained;
* kills, rollbacks, checkpoints;
* final quality (planted-neighbour score of the final checkpoint) against an uninterrupted run
  over the same records (a second consumer group on the same topic, no kills).

    .venv/bin/python bench/soak.py --duration 600
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recovery_cluster import Cluster, Producer, new_topic, planted_quality, start_broker  # noqa: E402

from online.stream.sample_corpus import iter_sentences  # noqa: E402

ROLES = [("worker", 0), ("worker", 1), ("server", 0), ("server", 1), ("scheduler", 0), ("frontend", 0)]
ENV = {"LIVEVEC_CHECKPOINT_INTERVAL": "10", "LIVEVEC_DIM": "50", "LIVEVEC_KAFKA_BATCH_RECORDS": "50"}


def records(n: int, lines_per_record: int = 10) -> list[str]:
    it = iter_sentences(seed=11)
    return ["\n".join(next(it) for _ in range(lines_per_record)) for _ in range(n)]


def drain(cluster: Cluster, produced: int, timeout: float) -> dict:
    def caught_up():
        ledger = cluster.probe.ledger()
        stats = cluster.probe.stats()
        return ledger if ledger and ledger["offsets"] >= produced and not any(
            s.get("recovering") for s in stats or []) else False
    return cluster.wait(caught_up, timeout, "the backlog to be trained", interval=1.0)


def soak(args, work: Path, bootstrap: str, topic: str, recs: list[str]) -> dict:
    rng = random.Random(args.seed)
    cluster = Cluster(work / "soak", bootstrap, topic, env=ENV)
    producer = Producer(bootstrap, topic, recs, rate=args.rate)
    kills: list[str] = []
    down = 0.0
    try:
        cluster.start()
        producer.start()
        t0 = time.monotonic()
        next_kill = t0 + rng.uniform(0.5, 1.5) * args.kill_every
        last = (time.monotonic(), 0)
        while time.monotonic() - t0 < args.duration:
            time.sleep(0.5)
            ledger = cluster.probe.ledger()
            now = time.monotonic()
            if ledger is not None:
                trained = ledger["offsets"]
                if trained == last[1] and producer.sent > trained:
                    down += now - last[0]
                last = (now, trained)
            else:
                down += now - last[0]
                last = (now, last[1])
            if now >= next_kill:
                app, index = rng.choice(ROLES)
                cluster.runner.kill_task(app, index)
                kills.append(f"{now - t0:.1f}s {app}#{index}")
                print(f"[{now - t0:6.1f}s] kill -9 {app}#{index}  (trained {last[1]} / produced {producer.sent})",
                      flush=True)
                next_kill = now + rng.uniform(0.5, 1.5) * args.kill_every
        producer.stop.set()
        producer.join(timeout=60)
        produced = producer.sent
        ledger = drain(cluster, produced, timeout=600)
        cluster.checkpoint_now()
        quality = planted_quality(cluster.store)
        rollbacks = len(cluster.log_events("scheduler", "rollback_done"))
        checkpoints = len(cluster.log_events("scheduler", "checkpoint_done"))
        return {"produced": produced, "trained_offsets": ledger["offsets"], "trained_records": ledger["records"],
                "trained_twice": ledger["overlaps"], "skipped": ledger["gaps"], "downtime_s": round(down, 1),
                "kills": kills, "rollbacks_logged": rollbacks, "checkpoints_logged": checkpoints,
                "quality": round(quality, 3)}
    finally:
        cluster.stop()


def uninterrupted(work: Path, bootstrap: str, topic: str, produced: int) -> float:
    cluster = Cluster(work / "reference", bootstrap, topic, env=ENV)
    try:
        cluster.start()
        drain(cluster, produced, timeout=900)
        cluster.checkpoint_now()
        return planted_quality(cluster.store)
    finally:
        cluster.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of killing (600)")
    ap.add_argument("--kill-every", type=float, default=20.0, help="mean seconds between kills (20)")
    ap.add_argument("--rate", type=float, default=60.0, help="records per second produced (60; 10 lines each)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--skip-reference", action="store_true", help="no uninterrupted run for the quality ratio")
    args = ap.parse_args()
    recs = records(int(args.duration * args.rate) + 1)
    broker = start_broker()
    try:
        topic = new_topic(broker.bootstrap)
        with tempfile.TemporaryDirectory(prefix="livevec-soak-") as tmp:
            result = soak(args, Path(tmp), broker.bootstrap, topic, recs)
            if not args.skip_reference:
                reference = uninterrupted(Path(tmp), broker.bootstrap, topic, result["produced"])
                result["quality_uninterrupted"] = round(reference, 3)
                result["quality_ratio"] = round(result["quality"] / reference, 3) if reference else None
    finally:
        broker.stop()
    ok = result["trained_offsets"] == result["produced"] and not result["trained_twice"] and not result["skipped"]
    result["exactly_once"] = ok
    print(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
