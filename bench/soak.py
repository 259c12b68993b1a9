"""Soak test (not run in CI): kill, cut off and starve random livevec processes for a while, then
account for every record.

A cluster (scheduler with the checkpoint coordinator, 2 servers, 2 workers, front end, real Kafka)
trains the planted sample corpus streamed at a steady rate, with a malformed record (invalid UTF-8)
every ``--malformed-every`` records. Every ``--kill-every`` seconds (randomised) something fails:

* on one machine, one random process is killed with SIGKILL and relaunched by the local
  Marathon-like runner;
* with ``--hosts N`` (root) the group runs across N network-namespace hosts, placed as Mesos
  would place it, and the failure is one of: kill -9 of one task; a partition of one host's link
  for 5 - 15 s (its processes stay alive); a host loss (kill -9 of every task on it); a trickle
  (its link shaped to 1 mbit/s for 10 - 20 s).

After ``--duration`` seconds the producer stops, the cluster drains the backlog, and the script
reports:

* records produced against records trained (server 0's ledger: trained once, twice, or skipped),
  and the malformed records produced (counted and skipped by the workers, never lost or trained);
* downtime: seconds during which the backlog was not empty and nothing was trained;
* every failure injected, rollbacks, checkpoints;
* each role's RSS at start and at end, and the largest growth of one process over its life
  (a leak shows as growth; a relaunched process starts again);
* final quality (planted-neighbour score of the final checkpoint) against an uninterrupted run
  over the same records (a second consumer group on the same topic, no failures, on one host).

    .venv/bin/python bench/soak.py --duration 600 --hosts 4
"""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recovery_cluster import Cluster, Producer, new_topic, planted_quality, start_broker  # noqa: E402

from online.deployment.netns_lab import NetnsLab, lab_support_problem  # noqa: E402
from online.stream.sample_corpus import iter_sentences  # noqa: E402

ROLES = [("worker", 0), ("worker", 1), ("server", 0), ("server", 1), ("scheduler", 0), ("frontend", 0)]
ENV = {"LIVEVEC_CHECKPOINT_INTERVAL": "10", "LIVEVEC_DIM": "50", "LIVEVEC_KAFKA_BATCH_RECORDS": "50"}
MALFORMED = b"\xff\xfe not utf-8 \xc3\x28"
LAB_ID = 70


def records(n: int, lines_per_record: int = 10, malformed_every: int = 0) -> list:
    it = iter_sentences(seed=11)
    out: list = []
    for i in range(n):
        if malformed_every and (i + 1) % malformed_every == 0:
            out.append(MALFORMED)
        else:
            out.append("\n".join(next(it) for _ in range(lines_per_record)))
    return out


def coordinator_idle(cluster: Cluster) -> bool:
    """No rollback pending or running (the scheduler's ``livevec_recovering`` is 0)."""
    import urllib.request
    try:
        with urllib.request.urlopen(cluster.runner.url("scheduler", "metrics", "/metrics"), timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return False
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("livevec_recovering")]
    return bool(values) and values[0] == 0.0


def drain(cluster: Cluster, produced: int, timeout: float) -> dict:
    """The ledger once the backlog is trained with no rollback pending, unchanged over 5 s (a worker whose
    partitions moved after a rollback's seek can train a range twice until the rollback it then asks for)."""
    def caught_up():
        stats = cluster.probe.stats()
        ledger = stats[0].get("ledger") if stats else None
        # the frontiers, not the offsets counted: a skipped offset is reported, not waited for
        return ledger if ledger and sum(ledger["frontier"].values()) >= produced and not any(
            s.get("recovering") for s in stats or []) and coordinator_idle(cluster) else False

    def settled():
        first = caught_up()
        if not first:
            return False
        time.sleep(5.0)
        return first if caught_up() == first else False
    try:
        return cluster.wait(settled, timeout, "the backlog to be trained", interval=1.0)
    except TimeoutError:
        stats = cluster.probe.stats()
        print(f"drain: not settled; coordinator idle {coordinator_idle(cluster)}, servers "
              f"{[{k: s.get(k) for k in ('recovering', 'ledger', 'checkpoint_loaded')} for s in stats or []]}",
              flush=True)
        raise


class MemoryWatch(threading.Thread):
    """Every task's RSS every ``interval`` s, per process life: (app, index, launch) -> [(t, kB)]."""

    def __init__(self, runner, interval: float = 15.0):
        super().__init__(name="rss-watch", daemon=True)
        self.runner, self.interval = runner, interval
        self.samples: dict[tuple[str, int, int], list[tuple[float, int]]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            now = time.monotonic()
            for s in self.runner.status():
                if s.pid is None or s.state != "running":
                    continue
                try:
                    text = Path(f"/proc/{s.pid}/status").read_text()
                except OSError:
                    continue
                kb = next((int(line.split()[1]) for line in text.splitlines() if line.startswith("VmRSS:")), None)
                if kb:
                    self.samples.setdefault((s.app, s.index, s.launches), []).append((now, kb))

    def report(self, settle: float = 60.0, min_life: float = 120.0, window: int = 4) -> dict:
        """Per role: RSS (MiB) of the first sample and of the last one, and the largest growth of one
        process from ``settle`` s into its life to its end, over lives of at least ``min_life`` s.

        Growth compares the median of the first ``window`` samples after ``settle`` with the median of
        the last ``window`` (at most half of the settled samples each): a worker's RSS swings by 5 - 10 %
        from one sample to the next (batches and sync buffers come and go), so two single samples would
        report that swing, while a leak moves both medians."""
        out: dict[str, dict] = {}
        for (app, _index, _launch), series in sorted(self.samples.items()):
            role = out.setdefault(app, {"rss_start_mib": None, "rss_end_mib": None, "max_growth": None,
                                        "lives_measured": 0})
            if role["rss_start_mib"] is None:
                role["rss_start_mib"] = round(series[0][1] / 1024, 1)
            role["rss_end_mib"] = round(series[-1][1] / 1024, 1)
            born = series[0][0] - self.interval
            settled = [kb for t, kb in series if t - born >= settle]
            if len(settled) >= 2 and series[-1][0] - born >= min_life:
                w = max(1, min(window, len(settled) // 2))
                growth = statistics.median(settled[-w:]) / statistics.median(settled[:w]) - 1.0
                role["max_growth"] = round(max(growth, role["max_growth"] or -1.0), 4)
                role["lives_measured"] += 1
        return out


def inject(rng: random.Random, cluster: Cluster, lab: NetnsLab | None, hosts: int, t: float) -> tuple[str, list]:
    """One failure; returns its description and what to undo later as (when, action)."""
    if lab is None:
        app, index = rng.choice(ROLES)
        cluster.runner.kill_task(app, index)
        return f"kill -9 {app}#{index}", []
    kind = rng.choice(["kill", "kill", "partition", "partition", "host_loss", "trickle"])
    host = lab.hosts[rng.randrange(hosts)]
    on_host = sorted(k for k, h in cluster.runner.placement.items() if h == host.address)
    if kind == "kill":
        app, index = rng.choice(ROLES)
        cluster.runner.kill_task(app, index)
        return f"kill -9 {app}#{index}", []
    if kind == "host_loss":
        for app_id, index in on_host:
            cluster.runner.kill_task(app_id, index)
        names = ", ".join(f"{app_id.rsplit('/', 1)[-1]}#{index}" for app_id, index in on_host)
        return f"host loss {host.address} ({names})", []
    if kind == "partition":
        seconds = rng.uniform(5, 15)
        lab.partition(host.name)
        return f"partition {host.address} for {seconds:.0f}s", [(t + seconds, lambda: lab.heal(host.name))]
    seconds = rng.uniform(10, 20)
    lab.shape(host.name, "1mbit")
    return f"trickle {host.address} (1mbit) for {seconds:.0f}s", [(t + seconds, lambda: lab.shape(host.name, lab.link))]


def soak(args, work: Path, bootstrap: str, topic: str, recs: list, lab: NetnsLab | None) -> dict:
    rng = random.Random(args.seed)
    cluster = Cluster(work / "soak", bootstrap, topic, env=ENV, lab=lab, agents=args.hosts or None)
    producer = Producer(bootstrap, topic, recs, rate=args.rate)
    events: list[str] = []
    undo: list = []
    down = 0.0
    memory = MemoryWatch(cluster.runner)
    try:
        cluster.start()
        memory.start()
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
            for item in [u for u in undo if u[0] <= now]:
                item[1]()
                undo.remove(item)
            if now >= next_kill:
                what, later = inject(rng, cluster, lab, args.hosts, now)
                undo += later
                events.append(f"{now - t0:.1f}s {what}")
                print(f"[{now - t0:6.1f}s] {what}  (trained {last[1]} / produced {producer.sent})", flush=True)
                next_kill = now + rng.uniform(0.5, 1.5) * args.kill_every
        for _, action in undo:
            action()
        producer.stop.set()
        producer.join(timeout=60)
        produced = producer.sent
        ledger = drain(cluster, produced, timeout=900)
        memory.stop.set()
        cluster.checkpoint_now()
        quality = planted_quality(cluster.store)
        rollbacks = len(cluster.log_events("scheduler", "rollback_done"))
        checkpoints = len(cluster.log_events("scheduler", "checkpoint_done"))
        malformed = sum(1 for r in recs[:produced] if isinstance(r, bytes))
        return {"hosts": args.hosts or 1, "produced": produced, "malformed_produced": malformed,
                "trained_offsets": ledger["offsets"], "trained_records": ledger["records"],
                "trained_twice": ledger["overlaps"], "skipped": ledger["gaps"], "downtime_s": round(down, 1),
                "failures": events, "rollbacks_logged": rollbacks, "checkpoints_logged": checkpoints,
                "memory": memory.report(), "quality": round(quality, 3)}
    finally:
        memory.stop.set()
        for _, action in undo:
            try:
                action()
            except Exception:   # noqa: BLE001 - the lab is torn down next anyway
                pass
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
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of failures (600)")
    ap.add_argument("--kill-every", type=float, default=20.0, help="mean seconds between failures (20)")
    ap.add_argument("--rate", type=float, default=60.0, help="records per second produced (60; 10 lines each)")
    ap.add_argument("--hosts", type=int, default=0, help="network-namespace hosts (root; 0: one machine)")
    ap.add_argument("--link", default=None, help="with --hosts: every link's rate, e.g. 1gbit (default unshaped)")
    ap.add_argument("--malformed-every", type=int, default=1000, help="one malformed record in every N (1000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--skip-reference", action="store_true", help="no uninterrupted run for the quality ratio")
    ap.add_argument("--json", type=Path, help="also write the result here")
    ap.add_argument("--work", type=Path, help="keep every process's log and the checkpoints here (default: a "
                    "temporary directory, removed)")
    args = ap.parse_args()
    if args.hosts:
        problem = lab_support_problem()
        if problem:
            print(f"soak --hosts: {problem}", file=sys.stderr)
            return 2
    recs = records(int(args.duration * args.rate) + 1, malformed_every=args.malformed_every)
    lab = NetnsLab(args.hosts + 1, lab_id=LAB_ID, link=args.link).start() if args.hosts else None
    print(f"load average before: {open('/proc/loadavg').read().split()[:3]}", flush=True)
    try:
        broker = start_broker(lab.bridge_address if lab else "127.0.0.1")
        try:
            topic = new_topic(broker.bootstrap)
            with (contextlib.nullcontext(str(args.work)) if args.work
                  else tempfile.TemporaryDirectory(prefix="livevec-soak-")) as tmp:
                result = soak(args, Path(tmp), broker.bootstrap, topic, recs, lab)
                if not args.skip_reference:
                    reference = uninterrupted(Path(tmp), broker.bootstrap, topic, result["produced"]) if lab is None \
                        else None
                    if lab is not None:   # the reference runs on one host, against a broker it can reach
                        ref_broker = start_broker()
                        try:
                            ref_topic = new_topic(ref_broker.bootstrap)
                            ref = Producer(ref_broker.bootstrap, ref_topic, recs[:result["produced"]], rate=None)
                            ref.start()
                            ref.join()
                            reference = uninterrupted(Path(tmp), ref_broker.bootstrap, ref_topic, result["produced"])
                        finally:
                            ref_broker.stop()
                    result["quality_uninterrupted"] = round(reference, 3)
                    result["quality_ratio"] = round(result["quality"] / reference, 3) if reference else None
        finally:
            broker.stop()
    finally:
        if lab is not None:
            lab.close()
    result["load_average_after"] = open("/proc/loadavg").read().split()[:3]
    ok = result["trained_offsets"] == result["produced"] and not result["trained_twice"] and not result["skipped"]
    result["exactly_once"] = ok
    growth = [r["max_growth"] for r in result["memory"].values() if r["max_growth"] is not None]
    result["rss_growth_under_10pct"] = bool(growth) and max(growth) < 0.10
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
