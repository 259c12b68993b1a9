"""The cluster across links with a round trip: words/s, time held at the unsynced bound, and freshness.

    .venv/bin/python bench/cluster_links.py [--rtt-ms 0,1,10] [--hosts 4] [--workers-per-host 2] [--servers 1]
        [--max-tokens 8000000] [--trials 10] [--delay-kafka] [--quick] [--record FILE]

A network-namespace lab of ``--hosts`` hosts (``online.deployment.netns_lab``, lab id 70 - 79) runs the committed
Marathon group as ``livevec up --hosts N`` places it (``online.deployment.lab_runner``): a scheduler, ``--servers``
servers, ``--workers-per-host`` workers on every host (the workers of a host share its host replica, the group's
``LIVEVEC_HOST_REPLICA``, a file named by the host's address) and a front end. Kafka is a broker on the lab's
bridge, in the root namespace.

How the round trip is made (``bench/link_delay.py``; this kernel has no netem): every host runs a delaying relay
in its own namespace, and an nftables ``redirect`` rule there sends the host's new TCP connections to every other
host to it. The relay connects on to the original destination (``SO_ORIGINAL_DST``) and holds each chunk for
RTT/2 before passing it on, in each direction. A connection is relayed once, by the host that opened it, so a
message from host A to host B arrives RTT/2 late and an answer, on B's connection to A, another RTT/2: every
request between two hosts takes one RTT more. Traffic within a host (a worker and a server on the same host)
goes direct, as on a real host. Kafka's connections are not delayed unless ``--delay-kafka`` (then those of
every host to the broker are relayed too). ``direct`` in ``--rtt-ms`` runs without relays at all: against the
0 ms point it shows what the relays themselves cost (their CPU is reported as the role ``relay``).

Per round trip, with a fresh cluster, topic and relays:
1. Throughput. The corpus's first ``--max-tokens`` tokens (``stream_throughput.read_prefix``, records of 100
   words) are produced into a topic of one partition per worker before the cluster starts, so the workers train
   a backlog at full speed. The window, the figures and the exactly-once check are ``bench/cluster_learning.py``'s
   (``measure_window``, ``figures``, ``assert_trained_exactly_once``): words/s from server 0's batch ledger, and
   "held at bound" = the workers' ``livevec_worker_bound_wait_seconds_total`` over the window, as a share of
   the window's worker-seconds. Checkpoints run every ``--checkpoint-interval`` s; their training pause is
   reported.
2. Freshness, the probe of ``bench/freshness.py`` (its ``trial``): once the backlog is trained, the sample corpus
   streams in at 2,000 lines/s; when the front end knows the planted pairs, ``--trials`` new words are planted
   as one record each, then ``--trials`` more spread one sentence per record over every partition
   (``--spread`` there). p99 from Kafka's acknowledgement to the planted neighbour in ``/v1/similar``.
Prints a table (round trip, words/s, held at bound, freshness p99 both ways, load average over the window, relay
CPU per token) and one JSON line per round trip. Needs root. ``--record`` writes the ``links`` row, judged at the
largest round trip: held at bound under 5 % and freshness p99 at most 1 s in both modes, exactly once.
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import json
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

import cluster_learning  # noqa: E402
import freshness  # noqa: E402
import result_record  # noqa: E402
from cluster_harness import assert_trained_exactly_once, coordinator_idle  # noqa: E402
from cluster_learning import LearningCluster, checkpoint_pauses, figures, measure_window  # noqa: E402
from link_delay import DEFAULT_MARK, redirect_ruleset  # noqa: E402
from recovery_cluster import Cluster  # noqa: E402
from scaling import children_of, loadavg, proc_table, tree_cpu  # noqa: E402
from stream_throughput import DEFAULT_CORPUS, read_prefix  # noqa: E402

from online.checkpoint.store import CheckpointStore  # noqa: E402
from online.cli.up import local_cluster  # noqa: E402
from online.deployment.netns_lab import NetnsLab, lab_support_problem  # noqa: E402
from online.stream.kafka_broker import KafkaBroker  # noqa: E402
from online.stream.producer import produce  # noqa: E402
from online.stream.settings import KafkaBrokerSettings  # noqa: E402

LAB_IDS = range(70, 80)          # bench/scaling.py uses 60 - 69, tests 100 - 199, `livevec up` 0
RELAY_PORT = 15001               # the relay's port on each host's 127.0.0.1
NFT_TABLE = "lvdelay"
WORDS_PER_RECORD = 100
UP_ENV = {"PS_HEARTBEAT_INTERVAL": "1", "PS_HEARTBEAT_TIMEOUT": "10"}   # what `livevec up` adds to the group


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} load {loadavg()}] {msg}", file=sys.stderr, flush=True)


def label(point: str) -> str:
    """A round trip as the output names it: ``10 ms``, or ``direct`` (no relays)."""
    return point if point == "direct" else f"{point} ms"


def free_lab_id() -> int:
    names = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for lab_id in LAB_IDS:
        if f"lv{lab_id}br" not in names and not re.search(rf"\blv{lab_id}h\d", netns):
            return lab_id
    raise SystemExit(f"every lab id in {LAB_IDS.start}-{LAB_IDS.stop - 1} is in use (ip netns list)")


class Relays:
    """A delaying relay in every host's namespace, and the rule that sends the host's connections to the other
    hosts (and to ``kafka``, an (address, port), if given) through it."""

    def __init__(self, lab: NetnsLab, rtt_ms: float, kafka: tuple[str, int] | None = None):
        self.lab, self.rtt_ms, self.kafka = lab, rtt_ms, kafka
        self.procs: list[subprocess.Popen] = []
        self.stats: list[dict] = []

    def start(self) -> "Relays":
        try:
            for host in self.lab.hosts:
                proc = subprocess.Popen(
                    [*self.lab.exec_prefix(host.name), sys.executable, str(REPO / "bench" / "link_delay.py"),
                     "--delay-ms", str(self.rtt_ms / 2), "--transparent", "--listen", f"127.0.0.1:{RELAY_PORT}",
                     "--mark", hex(DEFAULT_MARK)], stdout=subprocess.PIPE, text=True)
                self.procs.append(proc)
                if not proc.stdout.readline().startswith("ready"):
                    raise RuntimeError(f"the relay on {host.name} did not start")
                others = [h.address for h in self.lab.hosts if h is not host]
                rules = redirect_ruleset(NFT_TABLE, others, RELAY_PORT)
                if self.kafka:   # a second rule: the broker's port only (the bridge address also serves metrics)
                    rules += redirect_ruleset(NFT_TABLE + "k", [self.kafka[0]], RELAY_PORT, ports=[self.kafka[1]])
                subprocess.run([*self.lab.exec_prefix(host.name), "nft", "-f", "-"], input=rules, text=True,
                               check=True, capture_output=True)
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self) -> None:
        for host in self.lab.hosts:
            for table in (NFT_TABLE, NFT_TABLE + "k"):
                subprocess.run([*self.lab.exec_prefix(host.name), "nft", "delete", "table", "ip", table],
                               capture_output=True)
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                out = proc.communicate(timeout=10)[0]
                self.stats.append(json.loads(out.strip().splitlines()[-1]))
            except (subprocess.TimeoutExpired, ValueError, IndexError):
                proc.kill()
        self.procs = []


class LinkCluster(LearningCluster):
    """``cluster_learning``'s cluster (its metrics and ledger) placed over the lab, with a front end, and the
    ledger read by a probe on the last host (``recovery_cluster.Cluster.start``)."""

    def __init__(self, work: Path, bootstrap: str, topic: str, lab: NetnsLab, *, servers: int, workers: int,
                 env: dict[str, str]):
        self.work, self.servers, self.workers, self.lab, self.probe = work, servers, workers, lab, None
        self.env = {"LIVEVEC_KAFKA_GROUP": f"links-{topic}", **UP_ENV, **env}
        self.runner = local_cluster(work, bootstrap, topic, servers=servers, workers=workers, frontend=True,
                                    env=self.env, lab=lab)
        self.store = CheckpointStore(self.runner.app("scheduler")["env"]["LIVEVEC_CHECKPOINT_DIR"])
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=servers + workers + 1)
        self.relay_pids: list[int] = []

    start = Cluster.start

    def workers_per_host(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for (app_id, _), host in self.runner.placement.items():
            if app_id.endswith("/worker"):
                out[host] = out.get(host, 0) + 1
        return dict(sorted(out.items()))


_snapshot = cluster_learning.snapshot


def snapshot_with_relays(cluster, broker) -> dict:
    """``cluster_learning.snapshot`` and the relays' CPU (role ``relay``), which its window then reads."""
    snap = _snapshot(cluster, broker)
    table = proc_table()
    kids = children_of(table)
    for i, pid in enumerate(getattr(cluster, "relay_pids", [])):
        snap["cpu"][f"relay{i}"] = tree_cpu(pid, table, kids)
    return snap


cluster_learning.snapshot = snapshot_with_relays


async def _late(session, url: str, word: str, anchor: str, timeout: float) -> str:
    """For a missed trial: whether the word shows (and with its anchor) within ``timeout`` s more."""
    t0, seen = time.monotonic(), None
    while time.monotonic() - t0 < timeout:
        status, body = await freshness.get_json(session, f"{url}v1/similar?word={word}&k=10")
        if status == 200:
            seen = seen or time.monotonic() - t0
            if anchor in [n["word"] for n in body["neighbours"]]:
                return f"served with {anchor} {time.monotonic() - t0:.1f} s later"
        await asyncio.sleep(0.1)
    if seen:
        return f"visible {seen:.1f} s later, without {anchor}, after {timeout:.0f} s more"
    _, listed = await freshness.get_json(session, f"{url}v1/vocab?prefix={word}&limit=5")
    return (f"still unknown after {timeout:.0f} s more (the front end's vocabulary lists "
            f"{listed.get('words') if isinstance(listed, dict) else listed})")


async def freshness_phase(cluster: LinkCluster, bootstrap: str, topic: str, args) -> dict:
    """bench/freshness.py's trials against the running cluster: one record per trial, then spread."""
    from aiokafka import AIOKafkaProducer
    import aiohttp
    from online.stream.producer import produce_async
    from online.stream.sample_corpus import PLANTED_CONTEXTS, iter_sentences

    freshness.TOPIC = topic     # its plant() writes to this module's topic
    url = cluster.runner.url("frontend", "http", "/")
    background = asyncio.create_task(produce_async(
        iter_sentences(seed=7), bootstrap=bootstrap, topic=topic, partitions=args.partitions,
        rate=args.rate / 10, lines_per_record=10, create_topic=False))
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    await producer.start()
    out: dict = {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            async def trained():
                hits = []
                for a, b in PLANTED_CONTEXTS:
                    status, body = await freshness.get_json(session, f"{url}v1/similar?word={a}&k=5")
                    hits.append(status == 200 and b in [n["word"] for n in body["neighbours"]])
                return sum(hits) >= len(hits) - 1

            t0 = time.monotonic()
            await freshness.wait_for(trained, 300, "the front end to serve the planted pairs (paris ~ france, ...)")
            await asyncio.sleep(max(0.0, args.warmup - (time.monotonic() - t0)))
            log(f"freshness: planted pairs served after {time.monotonic() - t0:.0f} s of the sample corpus")
            rng = random.Random(args.seed)
            anchors = [a for pair in PLANTED_CONTEXTS for a in pair]
            planted_words: set[str] = set()
            number = 0
            for spread in (False, True):
                targs = argparse.Namespace(sentences=args.sentences, top=10, trial_timeout=args.trial_timeout,
                                           spread=spread, partitions=args.partitions)
                planted, missed = [], 0
                for _ in range(args.trials):
                    anchor = anchors[number % len(anchors)]
                    before = set(planted_words)
                    v, p, _, last = await freshness.trial(session, producer, url, anchor, targs, rng,
                                                          planted_words, number)
                    number += 1
                    if p is None:
                        missed += 1
                        word = next(iter(planted_words - before), "?")
                        late = await _late(session, url, word, anchor, args.late_timeout)
                        log(f"freshness trial {number} missed: {word} ({anchor}'s place) not with {anchor} in the top "
                            f"10 within {args.trial_timeout:.0f} s; visible after {v} s, neighbours then: "
                            f"{' '.join(last[:10]) or '-'}; {late}")
                    else:
                        planted.append(p)
                every = planted + [float("inf")] * missed
                mode = "spread" if spread else "record"
                out[mode] = {"p50": freshness.pct(every, 50), "p99": freshness.pct(every, 99), "missed": missed,
                             "trials": args.trials, "seconds": [round(x, 3) for x in planted]}
                log(f"freshness ({mode}): p50 {out[mode]['p50']:.2f} s, p99 {out[mode]['p99']:.2f} s, "
                    f"missed {missed} of {args.trials}")
    finally:
        await producer.stop()
        background.cancel()
        await asyncio.gather(background, return_exceptions=True)
    return out


def run_point(args, lab: NetnsLab, broker: KafkaBroker, point: str, index: int, records: list[str], tokens: int,
              root: Path) -> dict:
    """One round trip: relays, topic, cluster, the window, the exactly-once check, freshness; all stopped after."""
    rtt = None if point == "direct" else float(point)
    topic = f"links{index}"
    workers = args.hosts * args.workers_per_host
    ends = {f"{topic}/{p}": len(range(p, len(records), args.partitions)) for p in range(args.partitions)}
    relays = None
    if rtt is not None:
        kafka = (lab.bridge_address, broker.port) if args.delay_kafka else None
        relays = Relays(lab, rtt, kafka).start()
    t = time.perf_counter()
    produce(records, bootstrap=broker.bootstrap, topic=topic, partitions=args.partitions, create_topic=True)
    log(f"{label(point)}: produced {len(records):,} records into {topic} in {time.perf_counter() - t:.1f} s")
    env = {**args.env, "LIVEVEC_CHECKPOINT_INTERVAL": str(args.checkpoint_interval)}
    cluster = LinkCluster(root / f"rtt-{point}-{index}", broker.bootstrap, topic, lab, servers=args.servers,
                          workers=workers, env=env)
    cluster.relay_pids = relays.pids if relays else []
    placement = {f"{a.rsplit('/', 1)[-1]}{i}": h for (a, i), h in sorted(cluster.runner.placement.items())}
    spread = cluster.workers_per_host()
    if len(spread) != args.hosts or set(spread.values()) != {args.workers_per_host}:
        cluster.pool.shutdown(wait=False)
        if relays:
            relays.stop()
        raise SystemExit(f"the group placed its workers {spread}, not {args.workers_per_host} on each of "
                         f"{args.hosts} hosts")
    t_launch = time.monotonic()
    try:
        cluster.start(timeout=180 + 30 * workers)
        log(f"{label(point)}: cluster healthy after {time.monotonic() - t_launch:.1f} s; placement {placement}; "
            f"logs in {cluster.runner.log_dir}")
        first, end = measure_window(cluster, broker, ends, args.timeout)
        try:
            assert_trained_exactly_once(cluster.probe.stats, topic, len(records), tokens,
                                        partitions=args.partitions, timeout=120,
                                        idle=lambda: coordinator_idle(cluster.runner))
            once = {"ok": True}
        except AssertionError as exc:
            once = {"ok": False, "error": str(exc)[:1000]}
            log(f"ledger not exactly once: {exc}")
        result = figures(first, end, cluster)
        result["checkpoints"] = checkpoint_pauses(cluster, first, end)
        result["exactly_once"] = once
        result["held_at_bound"] = result["worker_bound_wait_seconds"] / max(result["seconds"] * workers, 1e-9)
        result.update(sync_figures(first, end, result["seconds"]))
        result["replica_files"] = sorted(p.name for p in Path(cluster.runner.memory_dir).rglob("*.replica")) \
            if cluster.runner.memory_dir else []
        log(f"{label(point)}: {result['words_per_second']:,.0f} words/s, held at bound "
            f"{100 * result['held_at_bound']:.1f} %, {once}; freshness next")
        result["freshness"] = asyncio.run(freshness_phase(cluster, broker.bootstrap, topic, args)) \
            if args.trials else {}
        result["replica_rows"] = replica_rows(cluster)
        log(f"{label(point)}: host replicas at the end (rows held / refused, per worker): "
            + ", ".join(f"{n} {r['held']:,.0f} / {r['refused']:,.0f}" for n, r in result["replica_rows"].items()))
    finally:
        cluster.stop()
        if relays is not None:
            relays.stop()
    return {"rtt_ms": point, "workers": workers, "hosts": args.hosts, "servers": args.servers,
            "partitions": args.partitions, "placement": placement, "startup_seconds": first["t"] - t_launch,
            "relays": relays.stats if relays else None, "delay_kafka": bool(args.delay_kafka and relays),
            **result}


def replica_rows(cluster: LinkCluster) -> dict:
    """Every worker's replica rows now, and the rows a full host replica refused (their words are not trained on
    that host: ``LIVEVEC_HOST_REPLICA_ROWS``)."""
    got = cluster.metrics_of([f"worker{i}" for i in range(cluster.workers)], missing_ok=True)
    return {n: {"held": m.get("livevec_worker_replica_rows", 0.0),
                "refused": m.get("livevec_worker_replica_rows_refused", 0.0)} for n, m in sorted(got.items())}


def sync_figures(first: dict, end: dict, seconds: float) -> dict:
    """The workers' syncs in the window: how many per second (all workers), their mean duration (collect, round
    trips, apply: ``livevec_worker_sync_seconds``) and the sync thread's CPU per sync: the rest of a sync's
    time it waits (for answers, for the host's other sync, for a core)."""
    def delta(metric):
        return sum(m.get(metric, 0.0) - first["metrics"].get(n, {}).get(metric, 0.0)
                   for n, m in end["metrics"].items() if n.startswith("worker"))
    count = delta("livevec_worker_sync_seconds_count")
    def sync_cpu(snap):
        return sum(v for n, m in snap["metrics"].items() if n.startswith("worker") for series, v in m.items()
                   if series.startswith("livevec_worker_cpu_seconds_total{") and 'stage="sync"' in series)
    cpu = sync_cpu(end) - sync_cpu(first)
    return {"syncs_per_second": round(delta("livevec_worker_syncs_total") / max(seconds, 1e-9), 2),
            "sync_seconds_mean": round(delta("livevec_worker_sync_seconds_sum") / count, 4) if count else None,
            # the sync thread's CPU per sync (it also runs the vocabulary exchanges of syncs a host's pacing skips)
            "sync_cpu_seconds_per_sync": round(cpu / count, 4) if count else None}


def print_table(points: list[dict]) -> None:
    print(f"\n{'RTT ms':>7}{'words/s':>10}{'held at bound':>15}{'fresh p99 record':>18}{'p99 spread':>12}"
          f"{'load (window)':>22}{'relay us/tok':>14}{'all roles us/tok':>18}{'B/token out/in':>16}"
          f"{'once':>6}{'pause ms':>10}{'syncs/s':>9}{'sync ms':>10}{'sync CPU ms':>14}")
    for p in points:
        f = p.get("freshness") or {}
        fr = lambda m: f"{f[m]['p99']:.2f} s" if m in f else "-"   # noqa: E731
        ps = p["ps_bytes_per_token"]
        load = " -> ".join(x.split()[0] for x in p["loadavg_window"])
        print(f"{p['rtt_ms']:>7}{p['words_per_second']:>10,.0f}{100 * p['held_at_bound']:>14.1f}%"
              f"{fr('record'):>18}{fr('spread'):>12}{load:>22}"
              f"{p['cpu_us_per_token'].get('relay', 0.0):>14.2f}{p['cpu_us_per_token_all_roles']:>18.2f}"
              f"{ps['workers_to_servers']['sent_by_workers']:>9,.0f} / "
              f"{ps['servers_to_workers']['received_by_workers']:,.0f}"
              f"{'yes' if p['exactly_once']['ok'] else 'NO':>6}"
              f"{p['checkpoints']['pause_ms_max'] if p['checkpoints']['pause_ms_max'] is not None else '-':>10}"
              f"{p['syncs_per_second']:>9.1f}{ms(p['sync_seconds_mean']):>10.0f}{ms(p['sync_cpu_seconds_per_sync']):>14.0f}")


def ms(seconds: float | None) -> float:
    return float("nan") if seconds is None else 1000 * seconds


def record_rows(points: list[dict]) -> list[dict]:
    delayed = [p for p in points if p["rtt_ms"] != "direct"]
    if not delayed:
        return []
    worst = max(delayed, key=lambda p: float(p["rtt_ms"]))
    parts = []
    for p in points:
        f = p.get("freshness") or {}
        fresh = " / ".join(f"{f[m]['p99']:.2f}" for m in ("record", "spread") if m in f) or "-"
        parts.append(f"{label(p['rtt_ms'])}: {p['words_per_second']:,.0f} words/s, held at bound "
                     f"{100 * p['held_at_bound']:.1f} %, freshness p99 {fresh} s (load "
                     f"{p['loadavg_window'][0].split()[0]})")
    f = worst.get("freshness") or {}
    ok = (worst["held_at_bound"] < 0.05 and worst["exactly_once"]["ok"]
          and len(f) == 2 and all(f[m]["p99"] <= 1.0 and not f[m]["missed"] for m in f))
    return [result_record.row(
        "links", f"{worst['hosts']} hosts x {worst['workers'] // worst['hosts']} workers, relayed round trips: "
                 + "; ".join(parts) + " (freshness one record / spread)",
        f"at {worst['rtt_ms']} ms RTT: held at bound < 5 %, freshness p99 ≤ 1 s in both modes, exactly once",
        result_record.met(ok))]


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # run the finally blocks: stop everything
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rtt-ms", default="0,1,10",
                    help="round trips between hosts, in ms, comma-separated; 'direct' = no relays (0,1,10)")
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--workers-per-host", type=int, default=2, help="at most 2: the group's hostname:MAX_PER:2")
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--max-tokens", type=int, default=8_000_000, help="the corpus prefix trained per point")
    ap.add_argument("--checkpoint-interval", type=float, default=30.0, help="LIVEVEC_CHECKPOINT_INTERVAL (30)")
    ap.add_argument("--trials", type=int, default=10, help="freshness trials per mode (10; 0 = no freshness)")
    ap.add_argument("--sentences", type=int, default=200, help="planted sentences per trial (200)")
    ap.add_argument("--trial-timeout", type=float, default=15.0)
    ap.add_argument("--late-timeout", type=float, default=30.0,
                    help="after a missed trial, how long to watch whether its word shows at all (30 s)")
    ap.add_argument("--rate", type=float, default=2000.0, help="background lines/s during freshness (2000)")
    ap.add_argument("--warmup", type=float, default=10.0,
                    help="seconds of the sample corpus before the first trial, at least (10)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--delay-kafka", action="store_true", help="relay the hosts' connections to Kafka too")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="for every task (repeatable)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds a point's training may take")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    ap.add_argument("--record", metavar="FILE", help="write the links row to this result file")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 1,000,000 tokens (a smaller backlog may be trained before the window "
                         "can open), 2 trials per mode, 10 ms only unless --rtt-ms; without root it prints "
                         "'skipped' and exits 0")
    args = ap.parse_args()
    if args.quick:
        given = " ".join(sys.argv[1:])
        args.max_tokens = 1_000_000 if "--max-tokens" not in given else args.max_tokens
        args.trials = 2 if "--trials" not in given else args.trials
        args.warmup = 0.0 if "--warmup" not in given else args.warmup
        args.rtt_ms = "10" if "--rtt-ms" not in given else args.rtt_ms
    record = result_record.start(args.record, "cluster_links")
    try:
        args.env = dict(kv.split("=", 1) for kv in args.env)
    except ValueError:
        ap.error("--env takes KEY=VALUE")
    points = [p.strip() for p in args.rtt_ms.split(",") if p.strip()]
    for p in points:
        if p != "direct":
            try:
                if float(p) < 0:
                    raise ValueError
            except ValueError:
                ap.error(f"--rtt-ms: {p!r} is not a round trip in ms (or 'direct')")
    if not 1 <= args.workers_per_host <= 2:
        ap.error("--workers-per-host: 1 or 2 (the group places at most 2 workers on a host)")
    problem = lab_support_problem()
    if problem:
        if args.quick:   # bench/run_all.py's smoke run on a machine without the lab: skipped, not failed
            print(f"skipped: {problem}")
            return 0
        raise SystemExit(f"bench/cluster_links.py: {problem}")
    args.partitions = args.hosts * args.workers_per_host
    log(f"start; reading {args.corpus}")
    records = read_prefix(Path(args.corpus), args.max_tokens, words_per_line=WORDS_PER_RECORD)
    tokens = sum(len(r.split()) for r in records)
    args.timeout = args.timeout or 300 + tokens / 10_000
    log(f"corpus: {tokens:,} tokens in {len(records):,} records")
    root = Path(tempfile.mkdtemp(prefix="livevec-bench-links-"))
    lab = broker = None
    results: list[dict] = []
    load_start = loadavg()
    try:
        lab_id = free_lab_id()
        lab = NetnsLab(args.hosts, lab_id=lab_id).start()
        log(f"lab {lab_id}: hosts {[h.address for h in lab.hosts]}, bridge {lab.bridge_address}")
        broker = KafkaBroker(dataclasses.replace(KafkaBrokerSettings.from_env(), host=lab.bridge_address, port=0,
                                                 data_dir=root / "kafka", state_file=None))
        broker.start()
        for i, point in enumerate(points):
            res = run_point(args, lab, broker, point, i, records, tokens, root)
            results.append(res)
            print(json.dumps({"bench": "cluster_links", "tokens": tokens, **res}, default=str), flush=True)
    finally:
        if broker is not None:
            broker.stop()
        if lab is not None:
            lab.close()
        if args.keep or not results or not all(r["exactly_once"]["ok"] for r in results):
            print(f"work directory kept: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\ncluster_links: {args.hosts} hosts x {args.workers_per_host} workers (a host replica each host), "
          f"{args.servers} server(s), {tokens:,} tokens per point, {args.partitions} partitions; Kafka "
          f"{'relayed' if args.delay_kafka else 'direct'}; load average at start {load_start}, at end {loadavg()}")
    print_table(results)
    result_record.write(record, record_rows(results))
    return 0 if all(r["exactly_once"]["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
