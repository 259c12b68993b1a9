"""What the real pipeline learns from one pass over a corpus, and what it costs, against gensim.

    .venv/bin/python bench/cluster_learning.py [--corpus ../shared/data/wiki17m.txt.xz] [--max-tokens N]
        [--workers 2] [--partitions P] [--servers 1] [--checkpoint-interval S] [--env KEY=VALUE ...]
        [--kernels pairs,hogbatch] [--rounds 3] [--baseline FILE] [--record bench/results/pipeline_2_workers.json]
        [--hosts H]

``--kernels`` runs the pipeline once per kernel (``LIVEVEC_KERNEL``), each followed by its own gensim run, and
``--rounds`` repeats that with each kernel first in turn; the ratios to gensim (words/s and words per
CPU-second) are taken per run and their medians printed, because the machine's speed drifts by the minute.

Why: the learner benchmarks (``quality_vs_gensim.py``) train in process, and ``stream_throughput.py``
measures speed only. This one runs the path of ``livevec up`` end to end and scores the model the
cluster actually ends up with, so a change to the cluster learner (e.g. a worker-local replica with
periodic delta sync, whose settings ``--env`` passes to every task) is judged on quality, speed, the
parameter-server traffic and the checkpoint pauses together.

How it measures: ``run_pipeline``'s docstring.

"Trained token" is a corpus token of a trained record (the ledger's ``tokens``, before subsampling), the
count gensim's raw words/s uses; "effective" counts the tokens kept after subsampling
(``livevec_worker_words_trained_total``). "All roles" are the workers, the servers and the scheduler; Kafka's JVM
is shown apart. ``--baseline`` reads the JSON lines a 1-replica run printed (2 workers sharing one host replica,
the default) and prints the ratio of all roles' CPU per token to it. ``--hosts H`` (root) runs the group over H
network-namespace hosts (``online.deployment.netns_lab``), placed as Mesos would place it, the broker on the lab's
bridge: the workers of one host share its replica (``LIVEVEC_HOST_REPLICA``'s default), so 8 workers over 4 hosts
train 4 replicas of 2 processes each. Exit status 1 if the ledger did not settle
exactly once or the export failed.
"""
from __future__ import annotations

import argparse
import atexit
import calendar
import concurrent.futures
import dataclasses
import datetime
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

import result_record  # noqa: E402
from cluster_harness import assert_trained_exactly_once, coordinator_idle  # noqa: E402
from quality_vs_gensim import GensimRun, evaluate  # noqa: E402
from recovery_cluster import Cluster  # noqa: E402
from scaling import children_of, loadavg, proc_table, scrape, tree_cpu, tree_pids  # noqa: E402
from stream_throughput import DEFAULT_CORPUS, read_prefix  # noqa: E402

from online.checkpoint.store import CheckpointStore  # noqa: E402
from online.cli.up import local_cluster  # noqa: E402
from online.stream.kafka_broker import KafkaBroker  # noqa: E402
from online.stream.producer import produce  # noqa: E402
from online.stream.settings import KafkaBrokerSettings  # noqa: E402

TOPIC = "bench-learning"
FINAL_REASON = "livevec checkpoint now"   # the reason the coordinator logs for a request file


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} load {loadavg()}] {msg}", file=sys.stderr, flush=True)


class LearningCluster(Cluster):
    """``recovery_cluster.Cluster`` (its probe, log reader, start and stop) with ``livevec up``'s environment
    instead of the fast-recovery one, and no front end."""

    def __init__(self, work: Path, bootstrap: str, *, servers: int, workers: int, env: dict[str, str], lab=None):
        """With ``lab`` (a started NetnsLab) the group runs on all its hosts but the last, the probe's."""
        self.work, self.servers, self.workers, self.lab, self.probe = work, servers, workers, lab, None
        self.env = {"LIVEVEC_KAFKA_GROUP": "bench-learning", **env}
        self.runner = local_cluster(work, bootstrap, TOPIC, servers=servers, workers=workers, frontend=False,
                                    env=self.env, lab=lab, agents=len(lab.hosts) - 1 if lab else None)
        # the group's checkpoint directory as the tasks see it (the runner maps /mnt/mfs into the work dir)
        self.store = CheckpointStore(self.runner.app("scheduler")["env"]["LIVEVEC_CHECKPOINT_DIR"])
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=servers + workers + 1)

    def stop(self) -> None:
        super().stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def names(self) -> list[str]:
        return (["scheduler0"] + [f"server{i}" for i in range(self.servers)]
                + [f"worker{i}" for i in range(self.workers)])

    def metrics(self, name: str) -> dict[str, float]:
        app, index = name.rstrip("0123456789"), int(name[len(name.rstrip("0123456789")):])
        return scrape(self.runner.url(app, "metrics", "/metrics", index), timeout=5.0)

    def metrics_of(self, names: list[str], missing_ok: bool = False) -> dict[str, dict[str, float]]:
        """The tasks' /metrics read at the same time (OSError if one does not answer, unless ``missing_ok``)."""
        def one(name):
            try:
                return name, self.metrics(name)
            except OSError as exc:
                if not missing_ok:
                    raise
                log(f"{name} did not answer ({exc}); its counters count as 0")
                return name, {}
        return dict(self.pool.map(one, names))

    def ledger(self) -> dict | None:
        try:
            return self.probe.ledger()
        except Exception:   # noqa: BLE001 - a server busy or restarting: no reading this time
            return None


def snapshot(cluster: LearningCluster, broker: KafkaBroker) -> dict:
    """Server 0's ledger, every task's counters, then the time, then the CPU of every task's process tree and
    of the broker."""
    ledger = cluster.ledger()
    metrics = cluster.metrics_of(cluster.names(), missing_ok=True)
    t, wall = time.monotonic(), time.time()
    table = proc_table()
    kids = children_of(table)
    cpu = {f"{s.app}{s.index}": tree_cpu(s.pid, table, kids) for s in cluster.runner.status()}
    cpu["kafka0"] = tree_cpu(broker.process.pid if broker.process else None, table, kids)
    cpu["bench0"] = time.process_time()   # this process alone (probe, polling); its children are the tasks
    return {"t": t, "wall": wall, "metrics": metrics, "cpu": cpu, "ledger": ledger, "loadavg": loadavg()}


def _proc_kib(path: str, field: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def memory(cluster: LearningCluster, env: dict[str, str]) -> dict:
    """Every task's peak RSS (the largest process of its tree, ``VmHWM``) and its tree's PSS now (shared pages,
    as a host replica's, divided among the processes mapping them), in MiB; and the host replica files."""
    table = proc_table()
    kids = children_of(table)
    tasks = {}
    for s in cluster.runner.status():
        pids = tree_pids(s.pid, table, kids)
        tasks[f"{s.app}{s.index}"] = {
            "peak_rss_mib": round(max((_proc_kib(f"/proc/{p}/status", "VmHWM") for p in pids), default=0) / 1024, 1),
            "pss_mib": round(sum(_proc_kib(f"/proc/{p}/smaps_rollup", "Pss") for p in pids) / 1024, 1)}
    shared = {}
    where = env.get("LIVEVEC_HOST_REPLICA")
    # unset here, the group's /dev/shm is mapped by the local runner to a directory of its own in /dev/shm
    files = Path(where).glob("*.replica") if where else Path("/dev/shm").glob("livevec-local-*/**/*.replica")
    for f in files:
        shared[f.name] = round(f.stat().st_size / 2**20, 1)
    return {"tasks": tasks, "host_replica_files_mib": shared}


def ledger_complete(ledger: dict | None, ends: dict[str, int]) -> bool:
    return bool(ledger) and all(ledger.get("frontier", {}).get(k, 0) >= v for k, v in ends.items())


def measure_window(cluster: LearningCluster, broker: KafkaBroker, ends: dict[str, int], timeout: float,
                   settle: float = 3.0) -> tuple[dict, dict]:
    """(first, end) snapshots around the training that is kept, once the cluster has settled: every record
    in the ledger, no rollback pending and the ledger unchanged for ``settle`` s (module docstring, step 3)."""
    poll = 0.25 if cluster.workers <= 4 else 0.5
    workers = [f"worker{i}" for i in range(cluster.workers)]
    deadline = time.monotonic() + timeout
    seen_rollbacks = rollbacks = recovering = None
    next_sched = last_print = 0.0
    first = end = base = previous = None
    settled_since, settled_ledger = None, None
    was_complete, trained_until = False, None   # wall time the ledger last became complete
    while time.monotonic() < deadline:
        time.sleep(poll)
        try:
            ask_scheduler = time.monotonic() >= next_sched or recovering or end is not None
            got = cluster.metrics_of(workers + ["scheduler0"] * bool(ask_scheduler))
            tokens = [got[w].get("livevec_worker_tokens_total", 0.0) for w in workers]
            if ask_scheduler:
                sched = got["scheduler0"]
                rollbacks, recovering = sched.get("livevec_rollbacks_total", 0.0), sched.get("livevec_recovering", 0.0)
                next_sched = time.monotonic() + 1.0
        except OSError:
            continue   # a task not listening yet
        if rollbacks is None:
            continue   # the scheduler has not answered yet
        total = sum(tokens)
        if rollbacks != seen_rollbacks:
            if first is not None:
                log(f"rollback {rollbacks:.0f} after {total - first['tokens']:,.0f} tokens in the window: "
                    f"it opens again")
            # a rollback to a checkpoint that holds every record retrains nothing: the last window stands
            previous = (first, end) if end is not None else previous
            seen_rollbacks, base, first, end, settled_since = rollbacks, total, None, None, None
        if recovering:
            settled_since = None
            continue
        if first is None and total > base:
            first = snapshot(cluster, broker)
            first["tokens"], first["rollbacks"] = total, rollbacks
            log(f"window opens: first batches acknowledged after rollback {rollbacks:.0f}")
        ledger = cluster.ledger()
        complete = ledger_complete(ledger, ends)
        if complete and not was_complete:
            trained_until = time.time()
        was_complete = complete
        if complete and end is None and first is not None:
            end = snapshot(cluster, broker)
            end["rollbacks"] = rollbacks
            log(f"window closes: every record in the ledger, {end['t'] - first['t']:.1f} s after it opened")
        window = (first, end) if end is not None else previous if first is None else None
        if complete and window is not None and coordinator_idle(cluster.runner):
            if settled_since is None or ledger != settled_ledger:
                settled_since, settled_ledger = time.monotonic(), ledger
            elif time.monotonic() - settled_since >= settle:
                return window[0], {**window[1], "trained_until": trained_until}
        else:
            settled_since = None
        if time.monotonic() - last_print > 10:
            last_print = time.monotonic()
            done = ledger.get("tokens", 0) if ledger else 0
            log(f"training: ledger {done:,} tokens; workers {', '.join(f'{t:,.0f}' for t in tokens)}")
    raise SystemExit(f"not every record trained and settled within {timeout:.0f} s; logs in {cluster.runner.log_dir}")


def run_cli(*args: str, timeout: float) -> str:
    done = subprocess.run([sys.executable, "-m", "online.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"livevec {' '.join(args)} exited {done.returncode}: "
                           f"{done.stdout[-500:]} {done.stderr[-1500:]}")
    return done.stdout


def parse_ts(ts: str) -> float:
    """A log line's ``ts=2026-12-01T13:27:00.123Z`` as Unix seconds."""
    return calendar.timegm(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S")) + float("0" + ts[19:].rstrip("Z"))


WORKER_STAGES = ("prepare", "kernel", "sync")   # livevec_worker_cpu_seconds_total's stages
TRAINING_ROLES = ("worker", "server", "scheduler")   # "all roles": what the cluster spends; Kafka's JVM apart


def role(name: str) -> str:
    return name.rstrip("0123456789")


def figures(first: dict, end: dict, cluster: LearningCluster) -> dict:
    """Words/s, CPU and ps-lite bytes per trained token between the two snapshots."""
    def sum_of(snap, prefix, metric):
        return sum(m.get(metric, 0.0) for n, m in snap["metrics"].items() if role(n) == prefix)

    def delta(prefix, metric):
        return sum_of(end, prefix, metric) - sum_of(first, prefix, metric)

    seconds = end["t"] - first["t"]
    # Server 0's ledger counts a batch's tokens before its worker does (the worker counts after the ledger's
    # answer), so it is the exact count at both ends; the workers' counters are the fallback without one.
    if first["ledger"] and end["ledger"]:
        tokens, counted_by = end["ledger"]["tokens"] - first["ledger"]["tokens"], "ledger"
    else:
        tokens, counted_by = delta("worker", "livevec_worker_tokens_total"), "workers"
    tokens = max(tokens, 1)
    # the share kept after subsampling, from the workers' own counters (both lag the ledger alike)
    kept = tokens * delta("worker", "livevec_worker_words_trained_total") \
        / max(delta("worker", "livevec_worker_tokens_total"), 1.0)
    cpu = {n: end["cpu"].get(n, 0.0) - first["cpu"].get(n, 0.0) for n in end["cpu"]}
    roles = sorted({role(n) for n in cpu})
    ps = {
        "workers_to_servers": {"sent_by_workers": delta("worker", "pslite_sent_bytes_total") / tokens,
                               "received_by_servers": delta("server", "pslite_received_bytes_total") / tokens},
        "servers_to_workers": {"sent_by_servers": delta("server", "pslite_sent_bytes_total") / tokens,
                               "received_by_workers": delta("worker", "pslite_received_bytes_total") / tokens},
        "scheduler": {"sent": delta("scheduler", "pslite_sent_bytes_total") / tokens,
                      "received": delta("scheduler", "pslite_received_bytes_total") / tokens},
    }
    # The workers' CPU by stage (each stage's thread CPU, from their /metrics); "other" is the rest of the
    # workers' process CPU: ps-lite's I/O threads, reports, the GC.
    def stage_of(snap, stage):
        return sum(v for n, m in snap["metrics"].items() if role(n) == "worker" for series, v in m.items()
                   if series.startswith("livevec_worker_cpu_seconds_total{") and f'stage="{stage}"' in series)

    stages = {stage: stage_of(end, stage) - stage_of(first, stage) for stage in WORKER_STAGES}
    stages["event loop"] = delta("worker", "livevec_worker_event_loop_cpu_seconds")
    stages["other"] = sum(v for n, v in cpu.items() if role(n) == "worker") - sum(stages.values())
    return {"seconds": seconds, "tokens": tokens, "tokens_counted_by": counted_by, "words_per_second": tokens / seconds,
            "effective_words_per_second": kept / seconds,
            "cpu_seconds_window": {n: round(v, 2) for n, v in sorted(cpu.items())},
            "cpu_seconds_window_per_role": {r: round(sum(v for n, v in cpu.items() if role(n) == r), 2) for r in roles},
            "cpu_seconds_since_launch_per_role": {r: round(sum(v for n, v in end["cpu"].items() if role(n) == r), 2)
                                                  for r in roles},
            "cpu_us_per_token": {r: round(1e6 * sum(v for n, v in cpu.items() if role(n) == r) / tokens, 2)
                                 for r in roles},
            "cpu_us_per_token_all_roles": round(1e6 * sum(v for n, v in cpu.items() if role(n) in TRAINING_ROLES)
                                                / tokens, 2),
            "worker_cpu_us_per_token_by_stage": {k: round(1e6 * v / tokens, 2) for k, v in stages.items()},
            # what the cores did: CPU-seconds over the window's seconds (2 cores here), and how long the workers
            # held off new batches at their unsynced bound (summed over workers)
            "cores_busy": round(sum(cpu.values()) / max(seconds, 1e-9), 2),
            "worker_bound_wait_seconds": round(delta("worker", "livevec_worker_bound_wait_seconds_total"), 2),
            "ps_bytes_per_token": {k: {kk: round(vv, 1) for kk, vv in v.items()} for k, v in ps.items()},
            "tokens_per_worker": [end["metrics"].get(f"worker{i}", {}).get("livevec_worker_tokens_total", 0.0)
                                  for i in range(cluster.workers)],
            "loadavg_window": [first["loadavg"], end["loadavg"]]}


def checkpoint_pauses(cluster: LearningCluster, first: dict, end: dict) -> dict:
    """Every checkpoint the coordinator logged, and the pause figures of those taken while training (before the
    ledger last became complete: one taken on the timer once every record was trained pauses nothing)."""
    def events(name, state):
        return [{**{k: v.strip('"') for k, v in c.items()}, "state": state}
                for c in cluster.log_events("scheduler", name)]
    done, aborted = events("checkpoint_done", "done"), events("checkpoint_aborted", "aborted")
    every = sorted(done + aborted, key=lambda c: c.get("ts", ""))
    for c in every:
        c["wall"] = parse_ts(c["ts"])
        c["in_window"] = first["wall"] <= c["wall"] <= end["wall"]
    training = [c for c in every if c["wall"] <= end["trained_until"] and c.get("reason") != FINAL_REASON]
    # training_pause_ms: 0 where every worker went on training (the replica exchange holds only its syncs)
    pauses = [float(c.get("training_pause_ms", c["pause_ms"])) for c in training if c["state"] == "done"]
    holds = [float(c["pause_ms"]) for c in training if c["state"] == "done"]
    final = [c for c in every if c.get("reason") == FINAL_REASON]
    return {"while_training": len(training), "in_window": sum(c["in_window"] for c in training),
            "aborted_pause_ms": [float(c["pause_ms"]) for c in training if c["state"] == "aborted"],
            "pause_ms": pauses, "pause_ms_median": statistics.median(pauses) if pauses else None,
            "pause_ms_max": max(pauses) if pauses else None,
            "coordinator_pause_ms": holds, "coordinator_pause_ms_max": max(holds) if holds else None,
            "coordinator_pause_ms_median": statistics.median(holds) if holds else None,
            "write_ms_median": statistics.median([float(c["write_ms"]) for c in training if "write_ms" in c])
            if any("write_ms" in c for c in training) else None,
            "final_pause_ms": float(final[-1]["pause_ms"]) if final else None,
            "log": [{k: c.get(k) for k in ("id", "state", "reason", "pause_ms", "training_pause_ms", "write_ms",
                                            "records", "workers",
                                            "in_window")} for c in every]}


def run_pipeline(args, records: list[str], tokens: int, work: Path, env: dict[str, str], lab=None) -> dict:
    """One pipeline run against its own gensim run. How it measures:

    1. A real Kafka broker. The corpus (its first ``--max-tokens`` tokens, text8-tokenised by
       ``stream_throughput.read_prefix``, in records of ``--words-per-record`` words, about what ``livevec up``
       sends) is produced round-robin into a fresh topic of ``--partitions`` partitions BEFORE the cluster
       starts; the same records, one per line, are the text gensim trains on.
    2. The production Marathon group through the local Marathon-like runner (``online.cli.up.local_cluster``,
       with ``livevec up``'s environment): scheduler with the checkpoint coordinator, ``--servers`` servers,
       ``--workers`` workers, no front end; checkpoints ON as the group configures them (its
       ``LIVEVEC_CHECKPOINT_DIR``; the coordinator's default interval of 60 s unless ``--checkpoint-interval``
       or ``--env LIVEVEC_CHECKPOINT_INTERVAL=`` says otherwise). A ps-lite probe node
       (``recovery_cluster.Probe``, joining once the group is healthy) reads server 0's batch ledger.
    3. The measuring window. The bench polls every worker's /metrics (every 0.25 s, 0.5 s above 4 workers),
       the scheduler's (rollbacks, ``livevec_recovering``) and the ledger. The window opens at the first poll
       that sees ``livevec_worker_tokens_total`` grow after the last rollback (every cluster starts with one,
       and each rebalance while workers join rolls back again, so the window covers training that is kept;
       the first acknowledged batches are left out of the count) and closes at the first poll at which the
       ledger covers every produced record. At both ends it takes a snapshot: every task's /metrics, the CPU
       time of every task's process tree and of the broker's JVM (/proc), the time. Pipeline words/s = tokens
       trained between the two snapshots (server 0's ledger: exact, relative to the restored checkpoint; the
       workers' counters where there is no ledger) / the time between them (resolution: one poll).
       It goes on polling until the cluster has settled (every record in the ledger, the coordinator idle, the
       ledger unchanged for 3 s): a rollback after the window closed reopens it (one to a checkpoint that holds
       every record retrains nothing and keeps it). ``cluster_harness.assert_trained_exactly_once`` then
       checks that every record and token was trained exactly once.
    4. ``livevec checkpoint now`` and ``livevec checkpoint export`` (the CLI, as an operator runs them) write the
       final checkpoint as word2vec vectors; after the cluster and the broker are stopped, gensim Word2Vec
       (sg=1, negative 5, window 5, min_count 5, sample 1e-3, dim 100, one epoch, workers=2; its ``train()``
       call timed, vocabulary scan excluded) trains on the same lines, so the two never share the cores.
       Both are scored by gensim's evaluators (``quality_vs_gensim.evaluate``: questions-words analogies with
       restrict_vocab=30000, WS353, SimLex-999).
    5. Prints: words/s of both; CPU seconds per task and role (window, and since launch) and µs per trained token
       by role and over all roles (against ``--baseline``'s when given); analogy / WS353 /
       SimLex of both; ps-lite payload bytes per trained token (``pslite_sent_bytes_total`` /
       ``pslite_received_bytes_total`` of ``ps_bridge/van.py``) in each direction, workers -> servers and servers
       -> workers, as both ends count them (the server side also counts the probe's few stats requests);
       the training pause of every checkpoint the coordinator took while training, i.e. before the ledger last
       became complete (its ``checkpoint_done`` /
       ``checkpoint_aborted`` log lines in the scheduler's log: ``pause_ms`` = from asking the workers to pause,
       through their drain and the servers' snapshot, until they were told to resume; ``training_pause_ms`` = 0
       where the workers did not stop training, as with the replica exchange, which only holds its syncs for
       ``pause_ms``), median and max of both; the
       load average at start and end; and one JSON line.
    """
    ends = {f"{TOPIC}/{p}": len(range(p, len(records), args.partitions)) for p in range(args.partitions)}
    env = dict(env)
    if args.checkpoint_interval is not None:
        env["LIVEVEC_CHECKPOINT_INTERVAL"] = str(args.checkpoint_interval)
    broker_settings = KafkaBrokerSettings.from_env()
    if lab is not None:   # where the lab's hosts reach it
        broker_settings = dataclasses.replace(broker_settings, host=lab.bridge_address)
    with KafkaBroker(broker_settings) as broker:
        t = time.perf_counter()
        produce(records, bootstrap=broker.bootstrap, topic=TOPIC, partitions=args.partitions, create_topic=True)
        log(f"produced {len(records):,} records into {args.partitions} partitions in {time.perf_counter() - t:.1f} s")
        cluster = LearningCluster(work / "cluster", broker.bootstrap, servers=args.servers, workers=args.workers,
                                  env=env, lab=lab)
        t_launch = time.monotonic()
        try:
            cluster.start(timeout=180 + 30 * args.workers)
            log(f"cluster healthy after {time.monotonic() - t_launch:.1f} s; logs in {cluster.runner.log_dir}")
            first, end = measure_window(cluster, broker, ends, args.timeout)
            try:   # returns at once: measure_window waited for the same state; this checks it
                settled = assert_trained_exactly_once(
                    cluster.probe.stats, TOPIC, len(records), tokens, partitions=args.partitions,
                    timeout=60, idle=lambda: coordinator_idle(cluster.runner))
                exactly_once = {"ok": True, "ledger": settled}
            except AssertionError as exc:
                exactly_once = {"ok": False, "error": str(exc)[:1000]}
                log(f"ledger not exactly once: {exc}")
            log("livevec checkpoint now")
            answer = json.loads(run_cli("checkpoint", "--dir", str(cluster.store.root), "now", "--timeout", "300",
                                        timeout=330))
            out = work / "export"
            log(run_cli("checkpoint", "--dir", str(cluster.store.root), "export", "--out", str(out),
                        timeout=600).strip())
            pauses = checkpoint_pauses(cluster, first, end)
            sched = cluster.metrics("scheduler0")
            pauses["metric_mean_ms"] = (1e3 * sched.get("livevec_checkpoint_pause_seconds_sum", 0.0)
                                        / sched["livevec_checkpoint_pause_seconds_count"]
                                        if sched.get("livevec_checkpoint_pause_seconds_count") else None)
            result = figures(first, end, cluster)
            result["memory"] = memory(cluster, env)
        finally:
            cluster.stop()
    return {**result, "startup_seconds": first["t"] - t_launch, "rollbacks": end["rollbacks"],
            "exactly_once": exactly_once, "final_checkpoint": answer, "checkpoints": pauses,
            "vectors": str(out / "vectors.bin"), "env": env}


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # run the finally blocks: stop the cluster
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--max-tokens", type=int, default=0, help="cut the corpus after this many tokens (0: all of it)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--hosts", type=int, default=0,
                    help="network-namespace hosts the group runs over (root; 0: this machine, one host)")
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--partitions", type=int, default=None,
                    help="partitions of the topic (default: 4; as many as workers from 8 workers up)")
    ap.add_argument("--words-per-record", type=int, default=100, help="words per Kafka record (100)")
    ap.add_argument("--checkpoint-interval", type=float, default=None,
                    help="LIVEVEC_CHECKPOINT_INTERVAL of the coordinator (default: the product's, 60 s)")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable given to every task (repeatable)")
    ap.add_argument("--timeout", type=float, default=7200, help="seconds the training may take")
    ap.add_argument("--work-dir", default=None,
                    help="logs, checkpoints, the export (default: a temporary dir, removed after a run that "
                         "succeeded unless --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary work dir")
    ap.add_argument("--seed", type=int, default=1, help="gensim's seed (round r: seed + r)")
    ap.add_argument("--kernels", default="",
                    help="comma list of LIVEVEC_KERNEL values to run in turn, each with its own gensim run "
                         "(default: the product's kernel)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat, each kernel first in turn; medians of the per-run ratios are printed")
    ap.add_argument("--baseline", metavar="FILE",
                    help="the JSON lines a 1-replica run of this bench printed (e.g. --workers 2, its stdout saved): "
                         "all roles' CPU per token is also printed as a ratio to that run's, and --record judges "
                         "the replicas rows against it")
    ap.add_argument("--record", metavar="FILE",
                    help="write the headline rows to this result file (bench/results/): the pipeline and its bytes "
                         "per token for 2 workers, or N workers with a replica each (--env LIVEVEC_HOST_REPLICA=)")
    args = ap.parse_args()
    record = result_record.start(args.record, "cluster_learning")
    try:
        args.env = dict(kv.split("=", 1) for kv in args.env)
    except ValueError:
        ap.error("--env takes KEY=VALUE")
    if args.partitions is None:
        args.partitions = 4 if args.workers < 8 else args.workers
    if not Path(args.corpus).is_file():
        ap.error(f"no corpus at {args.corpus}")
    baseline = load_baseline(args.baseline) if args.baseline else None
    if baseline and baseline["replicas"] != 1:
        log(f"--baseline {args.baseline} ran {baseline['replicas']} replicas, not one: the ratio is to that run")
    log(f"start; reading {args.corpus}")
    records = read_prefix(Path(args.corpus), args.max_tokens or 1 << 62, words_per_line=args.words_per_record)
    tokens = sum(len(r.split()) for r in records)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="livevec-bench-learning-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus_file = work / "corpus.txt"
    corpus_file.write_text("".join(r + "\n" for r in records), encoding="utf-8")
    log(f"corpus: {tokens:,} tokens in {len(records):,} records; work dir {work}")

    from gensim.models import KeyedVectors

    lab = None
    if args.hosts:
        from online.deployment.netns_lab import NetnsLab, lab_support_problem
        problem = lab_support_problem()
        if problem:
            ap.error(f"--hosts: {problem}")
        lab = NetnsLab(args.hosts + 1).start()   # the last host is the probe's
        atexit.register(lab.close)
        log(f"{args.hosts} hosts {lab.hosts[0].address} - {lab.hosts[-2].address} on bridge {lab.bridge_address}")
    runs = []   # (kernel, pipeline figures, gensim figures, load at start, load at end), in the order run
    kernels = args.kernels.split(",") if args.kernels else [None]
    for rnd in range(args.rounds):
        order = kernels[rnd % len(kernels):] + kernels[:rnd % len(kernels)]   # each kernel first in turn
        for kernel in order:
            load_start = loadavg()
            started = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
            env = {**args.env, **({"LIVEVEC_KERNEL": kernel} if kernel else {})}
            run_dir = work / f"round{rnd}-{kernel or 'default'}"
            run_dir.mkdir()
            pipe = run_pipeline(args, records, tokens, run_dir, env, lab)
            pipe["date"] = started
            pipe["quality"] = evaluate(KeyedVectors.load_word2vec_format(pipe["vectors"], binary=True))
            log(f"pipeline done; gensim (workers=2) on the same {tokens:,} tokens")
            gensim = GensimRun(corpus_file, passes=1, workers=2, seed=args.seed + rnd)
            gensim.train_pass(0)
            gens = gensim.finish()
            runs.append((kernel, pipe, gens, load_start, loadavg()))
            report(args, tokens, pipe, gens, load_start, runs[-1][4], baseline)
    if len(runs) > 1:
        summary(runs)
    if record is not None:
        result_record.write(record, headline_rows(args, tokens, runs, baseline))
    ok = all(pipe["exactly_once"]["ok"] for _, pipe, *_ in runs)
    if ok and not (args.work_dir or args.keep):
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"work dir kept: {work} (logs in {work}/round*/cluster/logs)", file=sys.stderr)
    return 0 if ok else 1


def replicas(workers: int, env: dict[str, str], hosts: int = 0) -> int:
    """The replicas a run trains: one per worker with ``LIVEVEC_HOST_REPLICA=`` (as on separate hosts), else one per
    host that runs a worker (the local runner puts them all on one); none with the pull/push exchange."""
    if env.get("LIVEVEC_EXCHANGE") == "pullpush":
        return 0
    return workers if env.get("LIVEVEC_HOST_REPLICA") == "" else max(1, min(hosts, workers))


def all_roles_us(pipe: dict) -> float:
    """All roles' CPU µs per trained token: workers, servers and scheduler (from a JSON line without the field too)."""
    return pipe.get("cpu_us_per_token_all_roles",
                    sum(pipe["cpu_us_per_token"].get(r, 0.0) for r in TRAINING_ROLES))


def load_baseline(path: str) -> dict:
    """The reference figures from the JSON lines a run of this bench printed (its stdout, or any file that holds
    them): medians over its runs of the kernel ``auto`` picks for its worker count (over all its runs if none)."""
    from online.learner.trainer import kernel_for

    runs = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            obj = json.loads(line) if line.startswith("{") else None
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("bench") == "cluster_learning":
            runs.append(obj)
    if not runs:
        raise SystemExit(f"--baseline {path}: no JSON line of cluster_learning in it")

    def kernel(run):
        return kernel_for(run["livevec"].get("env", {}).get("LIVEVEC_KERNEL") or "auto", run["workers"])

    mine = [r for r in runs if kernel(r) == kernel_for("auto", r["workers"])] or runs
    first, med = mine[0], statistics.median
    return {"file": path, "runs": len(mine), "workers": first["workers"], "kernel": kernel(first),
            "replicas": first.get("replicas", replicas(first["workers"], first["livevec"].get("env", {}))),
            "date": first.get("date"), "loadavg_start": first.get("loadavg_start"),
            "cpu_us_per_token_all_roles": med(all_roles_us(r["livevec"]) for r in mine),
            "analogy": med(r["livevec"]["quality"]["analogy"] for r in mine),
            "ws353": med(r["livevec"]["quality"]["ws353"] for r in mine)}


def baseline_name(baseline: dict) -> str:
    return "the 1-replica run's" if baseline["replicas"] == 1 else f"the {baseline['replicas']}-replica baseline's"


def headline_rows(args, tokens: int, runs: list, baseline: dict | None = None) -> list[dict]:
    """The result file's rows, from the runs of the kernel ``auto`` picks for this many workers (medians over
    rounds): the pipeline and its bytes per token for 2 workers sharing a host replica, ``replicas_N`` for N
    workers with a replica each, or ``hosts_4x2`` for 8 workers on 4 hosts (``--hosts 4``), two sharing each host's
    replica, judged against ``baseline`` when given. Other shapes have no headline row."""
    from online.learner.trainer import kernel_for

    own = args.env.get("LIVEVEC_HOST_REPLICA") == ""
    kernel = kernel_for("auto", args.workers)
    mine = [(p, g) for k, p, g, *_ in runs if kernel_for(k or "auto", args.workers) == kernel]
    if args.workers == 2 and not own and not args.hosts:
        keys = ["pipeline_vs_gensim", "bytes_per_token"]
    elif own and args.workers in (8, 16):
        keys = [f"replicas_{args.workers}"]
    elif args.hosts == 4 and args.workers == 8:
        keys = ["hosts_4x2"]
    else:
        log(f"--record: no headline row for {args.workers} workers {'with' if own else 'without'} a replica each")
        return []
    if not mine:
        log(f"--record: no run with the {kernel} kernel, which auto picks for {args.workers} workers")
        return []
    med = statistics.median
    q = {m: med(p["quality"][m] for p, _ in mine) for m in ("analogy", "ws353", "simlex")}
    gq = {m: med(g[m] for _, g in mine) for m in ("analogy", "ws353")}
    points = med(100 * (p["quality"]["analogy"] - g["analogy"]) for p, g in mine)
    ws = med(p["quality"]["ws353"] - g["ws353"] for p, g in mine)
    us = {r: med(p["cpu_us_per_token"].get(r, 0.0) for p, _ in mine) for r in (*TRAINING_ROLES, "kafka")}
    all_us = med(all_roles_us(p) for p, _ in mine)
    cost = (f"worker {us['worker']:.2f} + server {us['server']:.2f} + scheduler {us['scheduler']:.2f} = "
            f"{all_us:.2f} µs per token over all roles (Kafka {us['kafka']:.2f} apart)")
    out_b = [p["ps_bytes_per_token"]["workers_to_servers"]["sent_by_workers"] for p, _ in mine]
    in_b = [p["ps_bytes_per_token"]["servers_to_workers"]["received_by_workers"] for p, _ in mine]
    once = all(p["exactly_once"]["ok"] for p, _ in mine)
    pause = max((p["checkpoints"]["pause_ms_max"] or 0.0 for p, _ in mine), default=0.0)
    rounds = f"medians of {len(mine)} runs, " if len(mine) > 1 else ""
    what = f"{rounds}{tokens:,} tokens, {kernel}"

    def spread(values: list[float]) -> str:
        return f"{min(values):,.0f}" if round(min(values)) == round(max(values)) \
            else f"{min(values):,.0f} - {max(values):,.0f}"

    if keys[0] == "pipeline_vs_gensim":
        words = [p["words_per_second"] / g["raw_words_per_s"] for p, g in mine]
        per_cpu = med(per_cpu_second_ratio(p, g) for p, g in mine)
        return [
            result_record.row(
                "pipeline_vs_gensim",
                f"{med(words):.2f}x gensim's words/s (runs {', '.join(f'{x:.2f}' for x in words)}), {per_cpu:.2f}x "
                f"per CPU-second; analogy {100 * q['analogy']:.2f} % / WS353 {q['ws353']:.3f} against "
                f"{100 * gq['analogy']:.2f} % / {gq['ws353']:.3f}; {cost}; "
                f"{'exactly once' if once else 'NOT exactly once'}, training pause "
                f"per checkpoint at most {pause:.0f} ms; {what}",
                "≥ 2.0x words/s; analogy ≥ gensim + 5 points, WS353 ≥ gensim's; exactly once, 0 ms pause",
                result_record.met(med(words) >= 2.0 and points >= 5 and ws >= 0 and once and pause == 0)),
            result_record.row(
                "bytes_per_token", f"{spread(out_b)} out, {spread(in_b)} in (workers to servers, servers to workers; "
                                   f"{len(mine)} run{'s' * (len(mine) > 1)}, {kernel})",
                "≤ 292 / 285: half the pull/push exchange's 585 / 571",
                result_record.met(max(out_b) <= 292 and max(in_b) <= 285))]
    bound = med(p["worker_bound_wait_seconds"] / max(p["seconds"] * args.workers, 1e-9) for p, _ in mine)
    status = None
    if baseline:
        ratio = all_us / baseline["cpu_us_per_token_all_roles"]
        cost += f", {ratio:.1f}x {baseline_name(baseline)} {baseline['cpu_us_per_token_all_roles']:.2f}"
        # "within": no worse than the baseline by more than that (better is fine)
        quality_ok = (baseline["analogy"] - q["analogy"] <= 0.01 and baseline["ws353"] - q["ws353"] <= 0.02
                      and once)
        cost_ok = ratio <= 1.5 and max(out_b) <= 300 and max(in_b) <= 300
        status = f"quality {result_record.met(quality_ok)}; cost {result_record.met(cost_ok)}"
    return [result_record.row(
        keys[0],
        f"analogy {100 * q['analogy']:.2f} % / WS353 {q['ws353']:.3f} / SimLex {q['simlex']:.3f} (gensim "
        f"{100 * gq['analogy']:.2f} %); {cost}; "
        f"{spread(out_b)} / {spread(in_b)} B per token out / in; workers held at their unsynced bound "
        f"{100 * bound:.0f} % of the time; {'exactly once' if once else 'NOT exactly once'}; {what}",
        "analogy within 1 point and WS353 within 0.02 of 2 workers; all roles' CPU per token ≤ 1.5x 2 workers'; "
        "≤ 300 B per token each way", status)]


def per_cpu_second_ratio(pipe: dict, gens: dict) -> float:
    """The pipeline's words per CPU-second (every task's CPU in the window but the bench's own polling) over
    gensim's raw words per CPU-second."""
    cpu = sum(v for r, v in pipe["cpu_seconds_window_per_role"].items() if r != "bench")
    return pipe["tokens"] / cpu / gens["raw_words_per_cpu_s"]


def summary(runs: list) -> None:
    """Medians over the rounds, per kernel: the ratios are taken per run (the machine's speed drifts)."""
    print("\nmedians over the rounds (ratios to gensim in the same run):")
    print(f"{'kernel':10}{'runs':>5}{'words/s':>10}{'per CPU-s':>11}{'worker us/tok':>15}{'all us/tok':>12}"
          f"{'analogy':>9}"
          f"{'gensim':>8}{'WS353':>8}{'gensim':>8}")
    med = statistics.median
    for kernel in dict.fromkeys(k for k, *_ in runs):
        mine = [(p, g) for k, p, g, *_ in runs if k == kernel]
        print(f"{kernel or 'default':10}{len(mine):>5}"
              f"{med([p['words_per_second'] / g['raw_words_per_s'] for p, g in mine]):>9.2f}x"
              f"{med([per_cpu_second_ratio(p, g) for p, g in mine]):>10.2f}x"
              f"{med([p['cpu_us_per_token']['worker'] for p, _ in mine]):>15.2f}"
              f"{med([all_roles_us(p) for p, _ in mine]):>12.2f}"
              f"{med([p['quality']['analogy'] for p, _ in mine]):>9.2%}{med([g['analogy'] for _, g in mine]):>8.2%}"
              f"{med([p['quality']['ws353'] for p, _ in mine]):>8.3f}{med([g['ws353'] for _, g in mine]):>8.3f}")


def report(args, tokens: int, pipe: dict, gens: dict, load_start, load_end, baseline: dict | None = None) -> None:
    """One run's figures, as text and as one JSON line."""
    w = f"{args.workers} worker{'s' * (args.workers > 1)}"
    print(f"\ncluster_learning: {tokens:,} tokens, {args.servers} server, {w}, {args.partitions} partitions, "
          f"extra env {pipe['env'] or '-'}")
    print(f"load average at start {load_start}, at end {load_end} (window {pipe['loadavg_window'][0]} -> "
          f"{pipe['loadavg_window'][1]})")
    print(f"\n{'':24}{'words/s':>10}{'effective/s':>13}{'seconds':>9}{'analogy':>9}{'WS353':>8}{'SimLex':>8}"
          f"{'vocab':>8}")
    q = pipe["quality"]
    print(f"{'livevec pipeline':24}{pipe['words_per_second']:>10,.0f}{pipe['effective_words_per_second']:>13,.0f}"
          f"{pipe['seconds']:>9.1f}{q['analogy']:>9.2%}{q['ws353']:>8.3f}{q['simlex']:>8.3f}{q['vocabulary']:>8,}")
    print(f"{'gensim workers=2':24}{gens['raw_words_per_s']:>10,.0f}{gens['effective_words_per_s']:>13,.0f}"
          f"{gens['seconds']:>9.1f}{gens['analogy']:>9.2%}{gens['ws353']:>8.3f}{gens['simlex']:>8.3f}"
          f"{gens['vocabulary']:>8,}")
    print(f"livevec / gensim words/s: {pipe['words_per_second'] / gens['raw_words_per_s']:.2f}x   (pipeline window: "
          f"{pipe['tokens']:,.0f} tokens trained (by the {pipe['tokens_counted_by']}) between two polls, after "
          f"{pipe['rollbacks']:.0f} rollbacks and "
          f"{pipe['startup_seconds']:.1f} s of start-up; gensim: its train() call)")
    print(f"livevec / gensim words per CPU-second: {per_cpu_second_ratio(pipe, gens):.2f}x   (every task's CPU in "
          f"the window but the bench's; gensim: its process's)")
    print(f"CPU seconds in the window per role: {pipe['cpu_seconds_window_per_role']}   "
          f"(gensim: {gens['cpu_seconds']})")
    print(f"CPU seconds since launch per role:  {pipe['cpu_seconds_since_launch_per_role']}")
    print(f"CPU us per token per role:          {pipe['cpu_us_per_token']}")
    all_us = all_roles_us(pipe)
    compared = None
    if baseline:
        compared = {**baseline, "cpu_all_roles_ratio": round(all_us / baseline["cpu_us_per_token_all_roles"], 3)}
    print(f"CPU us per token over all roles:    {all_us:.2f} (workers + servers + scheduler; Kafka's JVM apart: "
          f"{pipe['cpu_us_per_token'].get('kafka', 0.0):.2f})"
          + (f"; {compared['cpu_all_roles_ratio']:.2f}x {baseline_name(baseline)} "
             f"{baseline['cpu_us_per_token_all_roles']:.2f} ({baseline['workers']} workers, {baseline['kernel']}, "
             f"median of {baseline['runs']} run{'s' * (baseline['runs'] > 1)} started {baseline['date']}, load "
             f"{baseline['loadavg_start']}; --baseline {baseline['file']})" if compared else ""))
    print(f"worker CPU us per token by stage:   {pipe['worker_cpu_us_per_token_by_stage']}")
    print(f"cores busy in the window: {pipe['cores_busy']}; workers held at their unsynced bound: "
          f"{pipe['worker_bound_wait_seconds']} s (summed)")
    ps = pipe["ps_bytes_per_token"]
    print(f"ps-lite bytes per trained token: workers -> servers {ps['workers_to_servers']['sent_by_workers']:,.1f} "
          f"(servers received {ps['workers_to_servers']['received_by_servers']:,.1f}); servers -> workers "
          f"{ps['servers_to_workers']['sent_by_servers']:,.1f} (workers received "
          f"{ps['servers_to_workers']['received_by_workers']:,.1f}); scheduler sent/received "
          f"{ps['scheduler']['sent']:.2f} / {ps['scheduler']['received']:.2f}")
    c = pipe["checkpoints"]
    if c["pause_ms"]:
        print(f"training pause per checkpoint while training: median {c['pause_ms_median']:.0f} ms, max "
              f"{c['pause_ms_max']:.0f} ms over {len(c['pause_ms'])} checkpoints ({c['in_window']} in the window, "
              f"all: {', '.join(f'{p:.0f}' for p in c['pause_ms'])} ms); "
              f"the coordinator's pause (workers paused or, with the replica exchange, syncs held): median "
              f"{c['coordinator_pause_ms_median']:.0f} ms, max {c['coordinator_pause_ms_max']:.0f} ms; "
              f"write after the pause, median {c['write_ms_median']:.0f} ms"
              + (" (few: pass --checkpoint-interval for more)" if len(c["pause_ms"]) < 3 else ""))
    else:
        print("training pause per checkpoint: NO checkpoint completed while training (the run is shorter than "
              "the interval: pass --checkpoint-interval)")
    if c["aborted_pause_ms"]:
        print(f"aborted checkpoints while training (training paused all the same): "
              f"{', '.join(f'{p:.0f}' for p in c['aborted_pause_ms'])} ms")
    print(f"final checkpoint (livevec checkpoint now, after training): pause {c['final_pause_ms']} ms; "
          f"coordinator's histogram mean over all: {c['metric_mean_ms'] and round(c['metric_mean_ms'], 1)} ms")
    mem = pipe["memory"]
    by_role: dict[str, list] = {}
    for name, m in mem["tasks"].items():
        by_role.setdefault(name.rstrip("0123456789"), []).append(m)
    print("memory per task, MiB (peak RSS of its largest process, max over the role's tasks / PSS at the end, "
          "mean): " + "; ".join(f"{r} {max(m['peak_rss_mib'] for m in ms):,.0f} / "
                                f"{sum(m['pss_mib'] for m in ms) / len(ms):,.0f}" for r, ms in sorted(by_role.items()))
          + (f"; host replica files: {mem['host_replica_files_mib']} MiB" if mem["host_replica_files_mib"] else ""))
    eo = pipe["exactly_once"]
    print(f"ledger: {'every record trained exactly once' if eo['ok'] else 'NOT settled exactly once: ' + eo['error']}")
    print(f"tokens per worker (since launch, retraining after rollbacks included): "
          f"{', '.join(f'{t:,.0f}' for t in pipe['tokens_per_worker'])}")
    print(json.dumps({"bench": "cluster_learning", "date": pipe.get("date"), "tokens": tokens,
                      "workers": args.workers, "replicas": replicas(args.workers, pipe["env"], args.hosts),
                      "hosts": args.hosts or 1,
                      "servers": args.servers, "partitions": args.partitions, "loadavg_start": load_start,
                      "loadavg_end": load_end, "livevec": pipe, "gensim": gens, "baseline": compared},
                     default=str), flush=True)


if __name__ == "__main__":
    sys.exit(main())
