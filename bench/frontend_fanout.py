"""What N front ends cost the parameter servers, per second of sync.

    .venv/bin/python bench/frontend_fanout.py [--frontends 0,1,2,4] [--window 30] [--warmup 60] [--rate 2000]
        [--workers 2] [--sync-interval 0.5] [--env KEY=VALUE ...]

Why: every front end keeps its own copy of the model by asking every server for the rows changed since
the version it last saw (``HEAD_CHANGES``, ``online.frontend.ps_source``), every ``LIVEVEC_SYNC_INTERVAL``,
and for the training statistics every second. Each one more front end therefore sends every server the
same changed rows once more. Scaling the front ends out for queries is only cheap if that repeated
answer is cheap next to what training already costs the server; this measures it instead of guessing.

How it measures: one real Kafka broker for the whole run; for each N in ``--frontends``, a fresh topic,
consumer group and cluster, the production Marathon group run as ``livevec up`` runs it
(``online.cli.up.local_cluster``: scheduler with checkpoints as the group configures them, 1 server,
``--workers`` workers, N front ends, each with the ports the runner assigns as Marathon would), while the
sample corpus streams into the topic at ``--rate`` lines/s from the moment the cluster starts, so the
model keeps changing at the same pace whatever N. Once every task is healthy and ready (the front ends'
/ready: a model loaded) and every front end has synced, the window opens ``--warmup`` seconds after the
cluster's start (so each N measures a model of the same age) and lasts ``--window`` seconds. At both ends
a snapshot: the CPU seconds (utime + stime from /proc/<pid>/stat) of the server's process tree and of
each front end's, the server's /metrics (ps-lite payload bytes sent and received, HEAD_CHANGES and stats
requests served, rows updated by the workers' deltas), each front end's /metrics (syncs, rows received)
and the workers' (tokens read and trained). Rates are the differences over the time between the two.

The cost of one more front end is the difference to N = 0 divided by N, and the least-squares slope over
all N. The rows a front end receives per second are the distinct rows the training changed per sync
interval, which is what each further front end adds to the server's bytes out. On this 2-core machine
the tasks share the cores, so the workers train a little slower with more front ends: their tokens/s is
printed next to each N, and a checkpoint or rollback inside a window is reported, to judge a row by.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from scaling import children_of, loadavg, proc_table, tree_cpu  # noqa: E402

from online.deployment.local_runner import describe  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} load {loadavg()}] {msg}", flush=True)


def scrape(url: str) -> dict[str, float]:
    """A Prometheus page as ``name{labels}`` -> value (histogram buckets dropped)."""
    out: dict[str, float] = {}
    with urllib.request.urlopen(url, timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line and not line.startswith("#") and "_bucket{" not in line:
                series, value = line.rsplit(" ", 1)
                out[series] = out.get(series, 0.0) + float(value)
    return out


def metric(page: dict[str, float], name: str, **labels: str) -> float:
    """Sum of the series of exactly ``name`` whose labels include ``labels``."""
    total = 0.0
    for series, value in page.items():
        m = re.match(r"([^{]+)(\{.*\})?$", series)
        if m.group(1) == name and all(f'{k}="{v}"' in (m.group(2) or "") for k, v in labels.items()):
            total += value
    return total


def snapshot(runner, n: int, workers: int) -> dict:
    """Everything the rates are made of, read as close together as the tasks answer."""
    statuses = {(s.app, s.index): s for s in runner.status()}
    table = proc_table()
    kids = children_of(table)
    t = time.monotonic()
    return {
        "t": t,
        "launches": {f"{a}{i}": s.launches for (a, i), s in statuses.items()},
        "server_cpu": tree_cpu(statuses[("server", 0)].pid, table, kids),
        "frontend_cpu": [tree_cpu(statuses[("frontend", i)].pid, table, kids) for i in range(n)],
        "server": scrape(runner.url("server", "metrics", "/metrics")),
        "frontends": [scrape(runner.url("frontend", "http", "/metrics", i)) for i in range(n)],
        "workers": [scrape(runner.url("worker", "metrics", "/metrics", i)) for i in range(workers)],
        "scheduler": scrape(runner.url("scheduler", "metrics", "/metrics")),
    }


def rates(n: int, a: dict, b: dict) -> dict:
    dt = b["t"] - a["t"]

    def per_s(name: str, pages: str = "server", **labels) -> float:
        if pages == "server":
            return (metric(b["server"], name, **labels) - metric(a["server"], name, **labels)) / dt
        return sum(metric(y, name) - metric(x, name) for x, y in zip(a[pages], b[pages])) / dt

    syncs = [(metric(y, "livevec_frontend_syncs_total") - metric(x, "livevec_frontend_syncs_total")) / dt
             for x, y in zip(a["frontends"], b["frontends"])]
    rows = [(metric(y, "livevec_frontend_synced_rows_total") - metric(x, "livevec_frontend_synced_rows_total")) / dt
            for x, y in zip(a["frontends"], b["frontends"])]
    sched = {k: metric(b["scheduler"], k) - metric(a["scheduler"], k)
             for k in ("livevec_checkpoints_total", "livevec_rollbacks_total")}
    return {
        "frontends": n,
        "window_s": round(dt, 2),
        "server_cpu_s_per_s": round((b["server_cpu"] - a["server_cpu"]) / dt, 4),
        "server_sent_bytes_per_s": round(per_s("pslite_sent_bytes_total")),
        "server_received_bytes_per_s": round(per_s("pslite_received_bytes_total")),
        "server_changes_requests_per_s": round(per_s("livevec_server_requests_total", kind="changes"), 2),
        "server_stats_requests_per_s": round(per_s("livevec_server_requests_total", kind="stats"), 2),
        "server_rows_updated_per_s": round(per_s("livevec_server_keys_pushed_total")),
        "frontend_cpu_s_per_s": [round((y - x) / dt, 4) for x, y in zip(a["frontend_cpu"], b["frontend_cpu"])],
        "frontend_syncs_per_s": [round(s, 3) for s in syncs],
        "frontend_rows_per_s": [round(r) for r in rows],
        "frontend_rows_per_sync": [round(r / s, 1) if s else None for r, s in zip(rows, syncs)],
        "worker_tokens_per_s": round(per_s("livevec_worker_tokens_total", "workers")),
        "worker_words_trained_per_s": round(per_s("livevec_worker_words_trained_total", "workers")),
        "checkpoints_in_window": round(sched["livevec_checkpoints_total"]),
        "rollbacks_in_window": round(sched["livevec_rollbacks_total"]),
        "relaunched_in_window": sorted(k for k in b["launches"] if b["launches"][k] != a["launches"].get(k)),
    }


async def measure(n: int, broker, args, work: Path) -> dict:
    from online.cli.up import local_cluster
    from online.stream.producer import ensure_topic, produce_async
    from online.stream.sample_corpus import iter_sentences

    topic = f"livevec-fanout-{n}"
    await ensure_topic(broker.bootstrap, topic, args.partitions)
    runner = local_cluster(work / f"frontends-{n}", broker.bootstrap, topic, servers=1, workers=args.workers,
                           frontends=n,
                           env={"LIVEVEC_SYNC_INTERVAL": str(args.sync_interval), "LIVEVEC_LOG_LEVEL": "WARNING",
                                "LIVEVEC_KAFKA_GROUP": f"livevec-fanout-{n}", **dict(args.env)})
    t0 = time.monotonic()
    background = asyncio.create_task(produce_async(
        iter_sentences(seed=7), bootstrap=broker.bootstrap, topic=topic, partitions=args.partitions,
        rate=args.rate / 10, lines_per_record=10, create_topic=False))
    try:
        await asyncio.to_thread(runner.start)
        if not await asyncio.to_thread(runner.wait_healthy, None, 240):
            raise RuntimeError(f"N={n}: the cluster did not become healthy and ready within 240 s:\n"
                               + describe(runner.status()))
        ports = [runner.port("frontend", "http", i) for i in range(n)]
        if len(set(ports)) != n:
            raise RuntimeError(f"N={n}: front ends share HTTP ports {ports}")

        def synced_and_training() -> bool:
            fronts = [json.loads(urllib.request.urlopen(runner.url("frontend", "http", "/v1/stats", i),
                                                        timeout=5).read()) for i in range(n)]
            tokens = sum(metric(scrape(runner.url("worker", "metrics", "/metrics", i)), "livevec_worker_tokens_total")
                         for i in range(args.workers))
            return tokens > 0 and all(f["ready"] and f["sync"]["syncs"] > 0 for f in fronts)

        while not await asyncio.to_thread(synced_and_training):
            if time.monotonic() - t0 > 300:
                raise RuntimeError(f"N={n}: no training or no front-end sync within 300 s")
            await asyncio.sleep(1.0)
        up = time.monotonic() - t0
        await asyncio.sleep(max(5.0, args.warmup - up))
        log(f"N={n}: up, front ends on ports {ports or '-'}, synced and training after {up:.0f} s; "
            f"measuring {args.window:g} s")
        start = await asyncio.to_thread(snapshot, runner, n, args.workers)
        await asyncio.sleep(args.window)
        end = await asyncio.to_thread(snapshot, runner, n, args.workers)
        if background.done():
            background.result()   # the producer stopped: its error, or a stream that ran dry
            raise RuntimeError(f"N={n}: the background stream stopped during the window")
        return {**rates(n, start, end), "up_after_s": round(up, 1)}
    finally:
        background.cancel()
        await asyncio.gather(background, return_exceptions=True)
        await asyncio.to_thread(runner.stop)


def per_frontend(results: list[dict], key: str) -> tuple[dict[int, float], float | None]:
    """Increment per added front end against N = 0, for each N > 0, and the least-squares slope over all N."""
    base = next((r[key] for r in results if r["frontends"] == 0), None)
    steps = {r["frontends"]: (r[key] - base) / r["frontends"] for r in results if base is not None and r["frontends"]}
    xs, ys = [r["frontends"] for r in results], [r[key] for r in results]
    if len(set(xs)) < 2:
        return steps, None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return steps, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def fmt(v, digits: int = 0, sign: str = "") -> str:
    return "-" if v is None else f"{v:{sign},.{digits}f}"


def report(results: list[dict]) -> dict:
    cost = {key: per_frontend(results, key) for key in
            ("server_cpu_s_per_s", "server_sent_bytes_per_s", "server_received_bytes_per_s")}
    print("\n| N | server CPU s/s | +CPU per FE | bytes out/s | +out per FE | bytes in/s | +in per FE "
          "| FE syncs/s (each) | rows/sync | FE rows/s | changes req/s | tokens/s | rows updated/s |")
    print("|" + " --- |" * 13)
    for r in results:
        n = r["frontends"]
        steps = {k: v[0].get(n) for k, v in cost.items()}
        print(f"| {n} | {r['server_cpu_s_per_s']:.3f} | {fmt(steps['server_cpu_s_per_s'], 3, '+')} "
              f"| {r['server_sent_bytes_per_s']:,} | {fmt(steps['server_sent_bytes_per_s'], 0, '+')} "
              f"| {r['server_received_bytes_per_s']:,} | {fmt(steps['server_received_bytes_per_s'], 0, '+')} "
              f"| {' / '.join(f'{s:.2f}' for s in r['frontend_syncs_per_s']) or '-'} "
              f"| {fmt(mean(r['frontend_rows_per_sync']))} | {fmt(mean(r['frontend_rows_per_s']))} "
              f"| {r['server_changes_requests_per_s']:.2f} | {r['worker_tokens_per_s']:,} "
              f"| {r['server_rows_updated_per_s']:,} |")
    slopes = {k: v[1] for k, v in cost.items()}
    if slopes["server_cpu_s_per_s"] is not None:
        print(f"\nper added front end (least squares over N): server CPU {slopes['server_cpu_s_per_s']:+.4f} s/s, "
              f"bytes out {slopes['server_sent_bytes_per_s']:+,.0f} B/s, "
              f"bytes in {slopes['server_received_bytes_per_s']:+,.0f} B/s")
    for r in results:
        notes = [f"{r['checkpoints_in_window']} checkpoint(s)" * bool(r["checkpoints_in_window"]),
                 f"{r['rollbacks_in_window']} rollback(s)" * bool(r["rollbacks_in_window"]),
                 f"relaunched {r['relaunched_in_window']}" * bool(r["relaunched_in_window"])]
        notes = [x for x in notes if x]
        if notes:
            print(f"N={r['frontends']}: in the window {', '.join(notes)}")
    return {"per_frontend_slope": {k: None if v is None else round(v, 4) for k, v in slopes.items()},
            "per_frontend_vs_0": {k: {str(n): round(s, 4) for n, s in v[0].items()} for k, v in cost.items()}}


async def run(args) -> int:
    from online.stream.kafka_broker import KafkaBroker
    from online.stream.settings import KafkaBrokerSettings

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    work = Path(tempfile.mkdtemp(prefix="livevec-fanout-"))
    broker = KafkaBroker(KafkaBrokerSettings.from_env())
    load_start = loadavg()
    log(f"start; front ends {args.frontends}, 1 server, {args.workers} workers, {args.rate:g} lines/s, "
        f"sync every {args.sync_interval:g} s, window {args.window:g} s (work dir {work})")
    results, failed = [], []
    try:
        await asyncio.to_thread(broker.start)
        for n in args.frontends:
            try:
                results.append(await measure(n, broker, args, work))
            except (RuntimeError, OSError) as exc:   # the other counts still say something
                failed.append(n)
                log(f"N={n} FAILED: {type(exc).__name__}: {exc}")
    finally:
        await asyncio.to_thread(broker.stop)
    load_end = loadavg()
    if not results:
        return 1
    summary = report(results)
    print(f"\nload average at start {load_start}, at end {load_end}")
    print(json.dumps({"bench": "frontend_fanout", "workers": args.workers, "servers": 1, "rate_lines_per_s": args.rate,
                      "sync_interval_s": args.sync_interval, "window_s": args.window, "warmup_s": args.warmup,
                      "loadavg_start": load_start, "loadavg_end": load_end, "failed": failed, "results": results,
                      **summary}))
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frontends", default="0,1,2,4", help="front-end counts, one fresh cluster each (0,1,2,4)")
    parser.add_argument("--window", type=float, default=30.0, help="seconds measured per N (30)")
    parser.add_argument("--warmup", type=float, default=60.0,
                        help="the window opens this long after the cluster's start, and >= 5 s after it is up (60)")
    parser.add_argument("--rate", type=float, default=2000.0, help="background lines/s (2000, as livevec up)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--sync-interval", type=float, default=0.5, help="the front ends' sync interval (0.5)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        type=lambda kv: tuple(kv.split("=", 1)) if "=" in kv else parser.error(f"--env {kv}: KEY=VALUE"),
                        help="extra setting for every task (repeat)")
    args = parser.parse_args()
    try:
        args.frontends = [int(x) for x in args.frontends.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--frontends {args.frontends}: a comma list of counts")
    if not args.frontends or min(args.frontends) < 0:
        parser.error("--frontends needs counts >= 0")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
