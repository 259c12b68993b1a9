"""Query load on the live front end at real vocabulary sizes, against an empty aiohttp handler in the same run.

For each ``--words`` size (default 100k, 1M and 10M) a fresh front end (``livevec frontend``,
its own process) serves a synthetic n x 100 model (``online.frontend.synthetic``: clustered
vectors; ``--updates`` rows per second keep changing and are pulled by the sync loop every
0.5 s, as changed rows are pulled from the parameter servers). The benchmark waits until
the front end answers with its inverted file (sizes from ``LIVEVEC_IVF_MIN_ROWS``; smaller
models are searched exactly), then starts the training that competes for the two cores:
``--training local`` runs the in-process learner (``online.learner.trainer.Trainer`` on the
sample corpus) in another process; ``--training cluster`` runs the real pipeline (Kafka
broker, scheduler, 1 server, 2 workers, as ``livevec up``). The served model stays the
synthetic one.

Per size it reports: the front end's memory (RSS now and its peak), the start (process
start to ready, which includes the synthetic source's making of its 10M words' keys), the full
load (the source's answer and the snapshot built from it, as a front end fed by the servers
pays it) and the snapshot's share alone, the delta syncs (mean and max time of
building the next snapshot, rows per sync), the inverted file's build time, recall@10
against exact search (the front end's own monitor of random vocabulary words while the
model changes, and for sizes up to ``--offline-recall-max`` an offline check of
``--recall-queries`` words on the same model built in this process), and an open loop at
each ``--rates`` rate (default 100 and 500 requests/s): p50/p99 measured from each
request's scheduled send time (no coordinated omission), with 503s (load shedding) counted
apart, next to the empty handler at the same rate. Target: p99 <= 10 ms at 500 req/s.

The load generator is a separate process (aiohttp client, 127.0.0.1 only); ``--concurrency``
adds closed loops (max requests/s). The generator is Python too, so neither number is the
server's ceiling (wrk reaches 30k-40k req/s on the empty handler here).

    .venv/bin/python bench/query_load.py                                # 100k, 1M, 10M: about 10 minutes
    .venv/bin/python bench/query_load.py --words 1000000 --training none
    .venv/bin/python bench/query_load.py --frontend-cpus 0 --training local \
        --words 1000000,10000000 --record bench/results/serving.json   # the rows of bench/README.md's table
    .venv/bin/python bench/query_load.py --frontend-cpus 0 --training none --words 10000000 \
        --record bench/results/frontend_10m.json         # a 10M-word front end with its defaults

``--logs DIR`` keeps each child process's log lines in DIR (the front end's at INFO).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import result_record  # noqa: E402  (bench/ is on the path: this script's directory)
from stream_throughput import cpu_seconds  # noqa: E402


# ------------------------------------------------------------------ child roles
def empty_server() -> None:
    """An aiohttp app whose only handler returns {} (the reference)."""
    from aiohttp import web

    async def empty(request):
        return web.Response(body=b"{}", content_type="application/json")

    async def main():
        app = web.Application()
        app.router.add_get("/empty", empty)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        print(f"serving http://127.0.0.1:{port}/", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def training_load() -> None:
    """The in-process learner training on the sample corpus until killed; prints words/s on SIGTERM."""
    from online.stream.sample_corpus import iter_sentences
    from online.learner.trainer import LearnerConfig, Trainer

    trainer = Trainer(LearnerConfig(dim=100))
    lines = iter_sentences(seed=3)
    started = time.perf_counter()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    print("training", flush=True)
    while not stop:
        trainer.train_records([next(lines) for _ in range(2000)])
    elapsed = time.perf_counter() - started
    print(json.dumps({"words": trainer.totals.tokens, "seconds": elapsed,
                      "words_per_second": trainer.totals.tokens / elapsed}), flush=True)


def cluster_training() -> None:
    """The real pipeline (Kafka -> 2 workers -> 1 server, as ``livevec up``) training on the sample
    corpus until SIGTERM; prints its words/s (from its own front end's /v1/stats) at the end."""
    import tempfile
    import threading
    import urllib.request

    from online.stream.kafka_broker import KafkaBroker
    from online.stream.settings import KafkaBrokerSettings
    from online.stream.producer import produce_async
    from online.stream.sample_corpus import iter_sentences
    from online.cli.up import local_cluster

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    broker = KafkaBroker(KafkaBrokerSettings.from_env())
    broker.start()
    runner = None
    loop = asyncio.new_event_loop()
    try:
        runner = local_cluster(Path(tempfile.mkdtemp(prefix="livevec-qload-")), broker.bootstrap, "qload",
                               servers=1, workers=2, env={"LIVEVEC_LOG_LEVEL": "WARNING"})
        runner.start()
        task = loop.create_task(produce_async(iter_sentences(seed=5), bootstrap=broker.bootstrap, topic="qload",
                                              partitions=4, rate=200.0, lines_per_record=10))
        threading.Thread(target=loop.run_until_complete, args=(task,), daemon=True).start()
        runner.wait_healthy(timeout=180)
        url = runner.url("frontend", "http", "/")
        print("training", flush=True)
        samples = []
        while not stop.wait(1.0):
            with urllib.request.urlopen(url + "v1/stats", timeout=10) as r:
                samples.append(json.load(r).get("words_per_second") or 0.0)
        loop.call_soon_threadsafe(task.cancel)
        print(json.dumps({"words_per_second": float(sum(samples) / max(len(samples), 1))}), flush=True)
    finally:
        if runner is not None:
            runner.stop()
        broker.stop()


def loadgen(spec: dict) -> dict:
    """Run one measurement (closed loop at a concurrency, or open loop at a rate).

    The generator is an instrument, so its own pauses must not be counted as the server's:
    Python's cyclic collector is off while it measures (a full collection over the requests'
    task objects takes 40 - 180 ms, about every 33 s, growing with the run, and would put 100 - 290 ms
    latencies into the results), and finished requests are not kept.
    """
    import gc

    import aiohttp
    import numpy as np

    gc.collect()
    gc.disable()

    vocab = spec.get("vocab", 0)
    rnd = random.Random(spec.get("seed", 1))
    base = spec["base"]
    named = ["king", "paris", "kafka", "guitar"]

    def path() -> str:
        if spec["path"] == "/empty":
            return base + "empty"
        word = f"w{rnd.randrange(vocab)}" if rnd.random() < 0.999 else rnd.choice(named)
        return f"{base}v1/similar?word={word}&k=10"

    async def closed() -> dict:
        c = spec["concurrency"]
        lat: list[float] = []
        codes: dict[int, int] = {}
        connector = aiohttp.TCPConnector(limit=c)
        async with aiohttp.ClientSession(connector=connector) as session:
            loop = asyncio.get_running_loop()
            warm_until = loop.time() + spec["warmup"]
            deadline = warm_until + spec["duration"]
            measured_from = None

            async def worker():
                nonlocal measured_from
                while True:
                    now = loop.time()
                    if now >= deadline or len(lat) >= spec["max_requests"]:
                        return
                    t = time.perf_counter()
                    async with session.get(path()) as r:
                        await r.read()
                        status = r.status
                    if loop.time() >= warm_until:
                        if measured_from is None:
                            measured_from = t
                        lat.append(time.perf_counter() - t)
                        codes[status] = codes.get(status, 0) + 1

            await asyncio.gather(*(worker() for _ in range(c)))
            elapsed = time.perf_counter() - (measured_from or time.perf_counter())
        return summary(lat, codes, elapsed)

    async def open_loop() -> dict:
        rate = spec["rate"]
        n = int(rate * (spec["duration"] + spec["warmup"]))
        skip = int(rate * spec["warmup"])
        lat: list[float] = []
        raw: list[tuple[float, float]] = []
        codes: dict[int, int] = {}
        connector = aiohttp.TCPConnector(limit=256)
        async with aiohttp.ClientSession(connector=connector) as session:
            loop = asyncio.get_running_loop()
            t0 = loop.time() + 0.05

            async def one(i: int, scheduled: float):
                async with session.get(path()) as r:
                    await r.read()
                    status = r.status
                if i >= skip:
                    lat.append(loop.time() - scheduled)      # from the scheduled send time
                    codes[status] = codes.get(status, 0) + 1
                    if spec.get("raw"):
                        raw.append((scheduled - t0, lat[-1]))

            pending: set[asyncio.Task] = set()
            for i in range(n):
                scheduled = t0 + i / rate
                delay = scheduled - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(one(i, scheduled))
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.gather(*pending)
            elapsed = loop.time() - (t0 + skip / rate)
        out = summary(lat, codes, elapsed)
        if spec.get("raw"):
            out["raw"] = raw
        return out

    def summary(lat, codes, elapsed) -> dict:
        a = np.asarray(lat) * 1e3
        ok = codes.get(200, 0)
        return {"requests": len(lat), "ok": ok, "shed": codes.get(503, 0), "errors": len(lat) - ok - codes.get(503, 0),
                "rps": ok / elapsed if elapsed > 0 else 0.0,
                "p50_ms": float(np.percentile(a, 50)) if len(a) else None,
                "p99_ms": float(np.percentile(a, 99)) if len(a) else None,
                "max_ms": float(a.max()) if len(a) else None}

    return asyncio.run(closed() if spec["mode"] == "closed" else open_loop())


def offline_recall(n: int, dim: int, queries: int, env: dict, nprobe: int | None = None) -> dict:
    """recall@10 of the inverted file against exact search on the synthetic model of n words, built here,
    scanning ``nprobe`` lists a query (the number the front end's monitor chose and served; default: the
    configured one)."""
    import numpy as np

    from online.frontend.blas_threads import set_blas_threads
    from online.search.ivf_build import IvfMaintainer
    from online.search.model_index import ModelHolder, SearchConfig, warm_up
    from online.frontend.settings import settings_from
    from online.search.delta import ModelDelta
    from online.frontend.synthetic import SyntheticSource

    set_blas_threads(1)
    warm_up()
    s = settings_from(None, {**env, "LIVEVEC_MODEL_SOURCE": "x"})
    config = SearchConfig.of(s)
    if nprobe:
        config = dataclasses.replace(config, nprobe_served=nprobe)
    holder = ModelHolder(config)
    holder.swap(holder.current.apply(SyntheticSource(n, dim)._changes_since(0)))
    if config.search != "exact" and n >= config.ivf_min_rows:
        IvfMaintainer(holder, config).build_now("offline recall")
        holder.swap(holder.current.apply(ModelDelta.unchanged(holder.current.version + 1, dim)))
    index = holder.current
    rows = np.random.default_rng(17).choice(n, min(queries, n), replace=False)
    hits, methods = [], {}
    for lo in range(0, len(rows), 32):
        part = rows[lo:lo + 32]
        q = index.unit[part].copy()
        ex = [[int(r)] for r in part]
        approx, how = index.search(q, ex, [10] * len(part))
        exact = index.top_k(q, ex, [10] * len(part))
        for a, e, m in zip(approx, exact, how):
            hits.append(len({x.word for x in a} & {x.word for x in e}) / max(len(e), 1))
            methods[m] = methods.get(m, 0) + 1
    return {"recall_at_10": float(np.mean(hits)), "min": float(np.min(hits)), "queries": len(hits),
            "methods": methods, "lists": index.ivf.lists if index.ivf is not None else 0,
            "nprobe": index.config.nprobe}


# --------------------------------------------------------------------- driver
# ``--frontend-cpus``: the CPUs of the front end and the empty handler, and those of everything else (the
# training and the load generator). Empty sets: no pinning.
CPUS: dict[str, set[int]] = {"frontend": set(), "others": set()}


LOADGEN_NICE = -10


def _child_setup(nice: int, cpus: set[int]):
    def setup() -> None:
        if nice:
            try:
                os.nice(nice)
            except PermissionError:        # raising priority needs root (CAP_SYS_NICE): run as is
                pass
        if cpus:
            os.sched_setaffinity(0, cpus)
    return setup


LOGS: Path | None = None   # --logs: each child process's stderr (its structured log lines) goes to a file here


def start(cmd: list[str], env: dict | None = None, nice: int = 0, cpus: str = "others") -> tuple[subprocess.Popen, str]:
    stderr = subprocess.DEVNULL
    if LOGS is not None:
        LOGS.mkdir(parents=True, exist_ok=True)
        name = "-".join(part.rsplit("/", 1)[-1] for part in cmd[1:4] if not part.startswith("-"))
        stderr = open(LOGS / f"{time.strftime('%H%M%S')}-{name}.log", "w")   # (the child keeps its own copy)
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True,
                            preexec_fn=_child_setup(nice, CPUS[cpus]))
    if stderr is not subprocess.DEVNULL:
        stderr.close()
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{cmd} did not start")
    return proc, line.split()[-1]


def stop(proc: subprocess.Popen) -> str:
    proc.terminate()
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out or ""


def measure(spec: dict) -> dict:
    """One measurement in a load generator process. With ``--frontend-cpus`` the generator shares
    its core with the training, so it runs at a higher priority (``LOADGEN_NICE``, when allowed):
    a request whose send or read waits for the trainer's time slice (3 - 6 ms) is the
    instrument's delay, not the server's; the training gets what the generator leaves."""
    out = subprocess.run([sys.executable, __file__, "_loadgen"], input=json.dumps(spec), capture_output=True,
                         text=True, cwd=REPO, timeout=spec["duration"] + spec["warmup"] + 120,
                         preexec_fn=_child_setup(LOADGEN_NICE if CPUS["frontend"] else 0, CPUS["others"]))
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout)


def get_json(url: str, timeout: float = 30.0):
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


def wait_ready(url: str, timeout: float) -> None:
    import urllib.error

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if get_json(url + "ready", 5).get("ready"):
                return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError("the front end did not become ready")


def wait_search(url: str, want: str, timeout: float) -> dict:
    deadline = time.time() + timeout
    while True:
        stats = get_json(url + "v1/stats")
        if stats["search"]["answering"] == want or time.time() > deadline:
            return stats
        time.sleep(0.5)


def wait_calibrated(url: str, timeout: float) -> dict:
    """Until the recall monitor has samples enough to set the floor and the lists per query (a front end
    in service runs calibrated from a minute or so after each build on)."""
    deadline = time.time() + timeout
    while True:
        stats = get_json(url + "v1/stats")
        if stats["search"]["exact_below_calibrated"] is not None or time.time() > deadline:
            return stats
        time.sleep(1.0)


def memory(pid: int) -> dict:
    """RSS and peak RSS (VmHWM) of a process, in GB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1e6
    return {"rss_gb": out.get("VmRSS"), "peak_gb": out.get("VmHWM")}


def scrape(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(url + "metrics", timeout=10) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith(("livevec_frontend_query_batch_size_sum", "livevec_frontend_query_batch_size_count",
                            "livevec_frontend_syncs_total", "livevec_frontend_synced_rows_total",
                            "livevec_frontend_sync_seconds_sum", "livevec_frontend_query_compute_seconds_sum")):
            values[line.split("{")[0]] = float(line.split()[-1])
    return values


def fmt(r: dict) -> str:
    return (f"{r['rps']:7.0f} req/s  p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:8.2f} ms  max {r['max_ms']:7.1f} ms"
            f"  n={r['requests']:6d} 503={r['shed']} errors={r['errors']}")


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


# The front end's peak per word and dimension, with a margin: the float32 rows (the full load's buffer becomes the
# pool), the int8 codes once (an install fills its lists in the same arrays), the maps, the strings; the drift
# checkpoints on disk. 10M x 100 peaked at 8 - 9 GB, the synthetic source included.
PEAK_BYTES_PER_WORD_AND_DIM = 10
BASE_BYTES = 1.0e9           # the interpreter and libraries of the front end, the trainer and this process


def memory_needed(n: int, dim: int) -> float:
    return n * (PEAK_BYTES_PER_WORD_AND_DIM * dim + 100) + BASE_BYTES


def memory_available() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024.0
    return float("inf")


def run_size(args, n: int, empty_url: str) -> dict:
    """One vocabulary size: a fresh front end, its figures, its load runs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIVEVEC_", "DMLC_"))}
    env.update({k: v for k, v in os.environ.items() if k.startswith(("LIVEVEC_SEARCH", "LIVEVEC_IVF_",
                                                                       "LIVEVEC_QUERY_", "LIVEVEC_DRIFT_",
                                                                       "LIVEVEC_RISING_"))})
    env.update({"LIVEVEC_SYNTHETIC_WORDS": str(n), "LIVEVEC_DIM": str(args.dim),
                "LIVEVEC_SYNTHETIC_UPDATES": str(args.updates), "LIVEVEC_SYNTHETIC_NEW_WORDS": "2",
                "LIVEVEC_LOG_LEVEL": "INFO" if LOGS is not None else "WARNING"})
    out: dict = {"words": n, "load_before": load()}
    started = time.perf_counter()
    frontend, url = start([sys.executable, "-m", "online.cli", "frontend", "--port", "0",
                           "--source", "online.frontend.synthetic:create_source",
                           "--query-batch", str(args.query_batch),
                           "--query-thread" if args.query_thread else "--no-query-thread"], env, cpus="frontend")
    trainer = None
    try:
        wait_ready(url, timeout=1800)
        out["ready_s"] = time.perf_counter() - started
        stats = get_json(url + "v1/stats")
        out["full_ms"] = stats["sync"]["apply"]["full"]["last_ms"]
        out["full_sync_ms"] = stats["sync"]["last_full_sync_ms"]      # the source's answer and the snapshot
        out["memory_loaded"] = memory(frontend.pid)
        want = "ivf" if stats["search"]["mode"] != "exact" and n >= stats["search"]["ivf_min_rows"] else "exact"
        stats = wait_search(url, want, timeout=1800)
        if want == "ivf":               # the recall monitor's first calibration of the floor and nprobe
            stats = wait_calibrated(url, timeout=300)
        out["answering"] = stats["search"]["answering"]
        out["ivf_build_s"] = stats["search"]["last_build_seconds"]
        out["ivf_ready_s"] = time.perf_counter() - started
        print(f"\n== {n:,} words x {args.dim}: ready after {out['ready_s']:.1f} s (full load "
              f"{out['full_sync_ms'] / 1e3:.1f} s, of which the snapshot {out['full_ms'] / 1e3:.1f} s), answering "
              f"{out['answering']} after {out['ivf_ready_s']:.1f} s "
              f"(inverted file built in {out['ivf_build_s']} s); RSS {out['memory_loaded']['rss_gb']:.2f} GB; "
              f"load {load()}", flush=True)
        if args.training != "none":
            trainer, _ = start([sys.executable, __file__, "_train" if args.training == "local" else "_cluster"],
                               nice=args.training_nice)
            time.sleep(args.settle)
        before = get_json(url + "v1/stats")
        before_m = scrape(url)
        common = {"duration": args.duration, "warmup": 1.0, "max_requests": args.max_requests, "vocab": n - 200}
        out["runs"] = {}
        for c in [int(c) for c in args.concurrency.split(",") if c.strip()]:
            out["runs"][f"c{c}"] = measure({**common, "base": url, "path": "/v1/similar", "mode": "closed",
                                            "concurrency": c})
            print(f"  /v1/similar c={c:<4}        {fmt(out['runs'][f'c{c}'])}", flush=True)
        for rate in args.rates:
            e = measure({**common, "base": empty_url, "path": "/empty", "mode": "open", "rate": rate})
            cpu0, wall0 = cpu_seconds(frontend.pid), time.monotonic()
            r = measure({**common, "base": url, "path": "/v1/similar", "mode": "open", "rate": rate})
            r["frontend_cpu"] = (cpu_seconds(frontend.pid) - cpu0) / (time.monotonic() - wall0)
            out["runs"][f"empty {rate:g}"], out["runs"][f"similar {rate:g}"] = e, r
            print(f"  empty handler {rate:5.0f}/s   {fmt(e)}", flush=True)
            print(f"  /v1/similar   {rate:5.0f}/s   {fmt(r)}   front end CPU {r['frontend_cpu']:.2f} s/s "
                  f"(load {load()})", flush=True)
        after = get_json(url + "v1/stats")
        after_m = scrape(url)
        out["memory"] = memory(frontend.pid)
        search = after["search"]
        procs = search.get("search_processes")
        if procs:                  # LIVEVEC_SEARCH_PROCESSES: what each process adds (its private pages)
            from online.search.search_processes import memory_of

            out["frontend_smaps"] = memory_of(frontend.pid)
            out["search_processes"] = procs["processes"]
            out["search_process_calls"] = {k: procs[k] for k in ("calls", "fallbacks", "restarts")}
            for p in procs["processes"]:
                print(f"  search process {p['pid']}: private {p['private'] / 1e6:.0f} MB "
                      f"({100 * p['private'] / out['frontend_smaps']['rss']:.1f} % of the front end's RSS "
                      f"{out['frontend_smaps']['rss'] / 1e9:.2f} GB), shared {p['shared'] / 1e9:.2f} GB, "
                      f"PSS {p['pss'] / 1e9:.2f} GB", flush=True)
        out["recall_online"] = search["recall_at_10"]
        out["recall_samples"] = search["recall_samples"]
        out["nprobe_served"] = search["nprobe_served"]
        out["answered"] = {m: search["answered"][m] - before["search"]["answered"][m] for m in search["answered"]}
        out["shed"] = {r: search["shed"][r] - before["search"]["shed"][r] for r in search["shed"]}
        d0, d1 = before["sync"]["apply"]["delta"], after["sync"]["apply"]["delta"]
        count = d1["count"] - d0["count"]
        out["delta_mean_ms"] = (d1["mean_ms"] * d1["count"] - d0["mean_ms"] * d0["count"]) / max(count, 1)
        out["delta_max_ms"] = d1["max_ms"]
        rows = after_m["livevec_frontend_synced_rows_total"] - before_m["livevec_frontend_synced_rows_total"]
        syncs = after_m["livevec_frontend_syncs_total"] - before_m["livevec_frontend_syncs_total"]
        out["rows_per_sync"] = rows / max(syncs, 1)
        batches = (after_m["livevec_frontend_query_batch_size_count"]
                   - before_m["livevec_frontend_query_batch_size_count"])
        queries = after_m["livevec_frontend_query_batch_size_sum"] - before_m["livevec_frontend_query_batch_size_sum"]
        compute = (after_m["livevec_frontend_query_compute_seconds_sum"]
                   - before_m["livevec_frontend_query_compute_seconds_sum"])
        out["mean_batch"], out["ms_per_query"] = queries / max(batches, 1), 1e3 * compute / max(queries, 1)
        out["ivf"] = search["ivf"]
        out["buffers"] = search.get("buffers")
        out["pool"] = search.get("pool")
        out["breakdown"] = {**search["memory"], "whats_new": after.get("whats_new_bytes")}
        if trainer is not None:
            line = stop(trainer).strip().splitlines()
            trainer = None
            out["training_wps"] = json.loads(line[-1])["words_per_second"] if line else None
        print(f"  RSS {out['memory']['rss_gb']:.2f} GB (peak {out['memory']['peak_gb']:.2f}); delta syncs: "
              f"{out['rows_per_sync']:.0f} rows, mean {out['delta_mean_ms']:.1f} ms, max {out['delta_max_ms']:.1f} ms;"
              f" {out['ms_per_query']:.3f} ms per query in batches of {out['mean_batch']:.1f}; answered "
              f"{out['answered']}, shed {sum(out['shed'].values())}; recall@10 (monitor) {out['recall_online']} "
              f"over {out['recall_samples']} queries at {out['nprobe_served']} lists a query; training "
              f"{out.get('training_wps') or 0:.0f} words/s",
              flush=True)
        print("  memory by structure (capacity, MB): " + ", ".join(
            f"{k} {v / 1e6:.0f}" for k, v in out["breakdown"].items() if v is not None), flush=True)
    finally:
        if trainer is not None:
            stop(trainer)
        stop(frontend)
    if n <= args.offline_recall_max and args.recall_queries:
        out["recall_offline"] = offline_recall(n, args.dim, args.recall_queries, env, out.get("nprobe_served"))
        print(f"  offline recall@10 {out['recall_offline']}", flush=True)
    out["load_after"] = load()
    return out


def table(args, results: list[dict]) -> None:
    print(f"\n| words | RSS (peak) | ready / full load / snapshot | IVF build | delta sync: rows, mean / max "
          f"| recall@10 "
          + "".join(f"| {r:g} req/s p50 / p99 (empty p99) " for r in args.rates) + "| load |")
    print("| --- " * (6 + len(args.rates) + 1) + "|")
    for o in results:
        rec = o.get("recall_offline", {}).get("recall_at_10")
        recall = (f"{rec:.4f} offline, " if rec is not None else "") + (
            f"{o['recall_online']:.3f} monitor ({o['recall_samples']})" if o["recall_online"] is not None
            else "exact")
        cells = "".join(f"| {o['runs'][f'similar {r:g}']['p50_ms']:.2f} / {o['runs'][f'similar {r:g}']['p99_ms']:.2f}"
                        f" ({o['runs'][f'empty {r:g}']['p99_ms']:.2f})"
                        f"{' 503x' + str(o['runs'][f'similar {r:g}']['shed']) if o['runs'][f'similar {r:g}']['shed'] else ''} "
                        for r in args.rates)
        print(f"| {o['words']:,} | {o['memory']['rss_gb']:.2f} ({o['memory']['peak_gb']:.2f}) GB "
              f"| {o['ready_s']:.1f} / {o['full_sync_ms'] / 1e3:.1f} / {o['full_ms'] / 1e3:.1f} s "
              f"| {o['ivf_build_s'] or '-'} s "
              f"| {o['rows_per_sync']:.0f}, {o['delta_mean_ms']:.1f} / {o['delta_max_ms']:.1f} ms | {recall} {cells}"
              f"| {o['load_before']} -> {o['load_after']} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", default="100000,1000000,10000000", help="vocabulary sizes, comma-separated")
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--logs", default=None, metavar="DIR",
                        help="keep each child process's log lines (the front end's among them) in files in DIR")
    parser.add_argument("--updates", type=float, default=20_000.0, help="model rows changed per second (20000)")
    parser.add_argument("--training", choices=("local", "cluster", "none"), default="local",
                        help="meanwhile train with the in-process learner in another process (local), or run "
                             "the real pipeline Kafka -> 2 workers -> 1 server on the sample corpus (cluster)")
    parser.add_argument("--training-nice", type=int, default=0,
                        help="run the training processes (and everything they start) at this niceness")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds of training before measuring")
    parser.add_argument("--query-batch", type=int, default=64, help="the front end's --query-batch (64)")
    parser.add_argument("--query-thread", action=argparse.BooleanOptionalAction, default=True,
                        help="the front end's --query-thread (compute thread, or on the event loop)")
    parser.add_argument("--rates", default="100,500", help="open-loop offered rates, comma-separated (100,500)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement (10)")
    parser.add_argument("--max-requests", type=int, default=100_000)
    parser.add_argument("--concurrency", default="", help="closed-loop concurrencies, e.g. 16,64 ('' = none)")
    parser.add_argument("--recall-queries", type=int, default=1000, help="offline recall@10 queries (1000)")
    parser.add_argument("--offline-recall-max", type=int, default=1_000_000,
                        help="largest size whose recall is also checked offline (it builds the model again here)")
    parser.add_argument("--frontend-cpus", default="",
                        help="pin the front end and the empty handler to these CPUs (e.g. 0) and the training and "
                             "the load generator to the others: the front end on its own core")
    parser.add_argument("--json", help="write the figures to this file too")
    parser.add_argument("--record", metavar="FILE",
                        help="write the 1M and 10M rows (500 req/s) to this result file (bench/results/); with "
                             "--training none the 10M row of a front end with its defaults")
    args = parser.parse_args()
    global LOGS
    LOGS = Path(args.logs) if args.logs else None
    record = result_record.start(args.record, "query_load")
    if args.frontend_cpus:
        try:
            CPUS["frontend"] = {int(c) for c in args.frontend_cpus.split(",") if c.strip()}
        except ValueError:
            parser.error(f"--frontend-cpus {args.frontend_cpus!r}: give CPU numbers, e.g. 0 or 0,1")
        CPUS["others"] = os.sched_getaffinity(0) - CPUS["frontend"]
        if not CPUS["frontend"] <= os.sched_getaffinity(0) or not CPUS["others"]:
            parser.error(f"--frontend-cpus {args.frontend_cpus!r}: must leave at least one of the CPUs "
                         f"{sorted(os.sched_getaffinity(0))} to the training and the load generator")
    args.rates = [float(r) for r in args.rates.split(",") if r.strip()]
    sizes = [int(w) for w in args.words.split(",") if w.strip()]
    short = [n for n in sizes if memory_needed(n, args.dim) > memory_available()]
    if short:                # fail now, not after the smaller sizes have run for half an hour
        n = max(short)
        print(f"not enough memory for {n:,} words x {args.dim}: it needs about {memory_needed(n, args.dim) / 1e9:.1f} GB"
              f" and this machine has {memory_available() / 1e9:.1f} GB available (MemAvailable); leave it out of "
              f"--words or free memory", file=sys.stderr)
        return 2
    print(f"{os.cpu_count()} cores, load average {load()} (other jobs on this machine skew every number below); "
          f"training: {args.training}; {args.updates:.0f} rows/s changing; query batch {args.query_batch}; "
          + (f"front end on CPUs {sorted(CPUS['frontend'])}, training and load generator on {sorted(CPUS['others'])}"
             if CPUS["frontend"] else "no pinning"))
    empty, empty_url = start([sys.executable, __file__, "_empty"], cpus="frontend")
    results = []
    try:
        for n in sizes:
            results.append(run_size(args, n, empty_url))
    finally:
        stop(empty)
    table(args, results)
    for o in results:
        r = o["runs"].get("similar 500")
        if r is not None:
            verdict = "meets" if r["p99_ms"] <= 10.0 and r["rps"] >= 0.95 * 500 and not r["shed"] else "MISSES"
            print(f"{o['words']:,} words at 500 req/s: {r['rps']:.0f} answered, p99 {r['p99_ms']:.2f} ms, "
                  f"{r['shed']} shed -> {verdict} the target (p99 <= 10 ms at 500 req/s)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    result_record.write(record, headline_rows(results) if args.training != "none" else defaults_rows(results))
    return 0


# The headline rows' targets at 500 req/s, one core, training alongside: (p99 ms, RSS GB, whether the peak counts).
SERVING_TARGETS = {1_000_000: ("serving_1m", 7.0, 1.0, False), 10_000_000: ("serving_10m", 10.0, 8.0, True)}
# A 10M-word front end with its default settings, nothing else running: full load s, RSS GB (steady and peak),
# p99 ms at 500 req/s with 0 shed, longest delta sync s (an inverted file's install included).
DEFAULTS_TARGETS = {"full_load_s": 30.0, "rss_gb": 8.0, "p99_ms": 10.0, "delta_s": 2.0}


def defaults_rows(results: list[dict]) -> list[dict]:
    """The result file's row for 10M words without training (``frontend_10m``): what a front end started with its
    defaults costs and answers."""
    rows = []
    for o in results:
        if o["words"] != 10_000_000 or "similar 500" not in o["runs"]:
            continue
        t, r, mem = DEFAULTS_TARGETS, o["runs"]["similar 500"], o["memory"]
        checks = [("full load", o["full_sync_ms"] / 1e3 <= t["full_load_s"]),
                  ("RSS", mem["rss_gb"] <= t["rss_gb"]), ("peak RSS", mem["peak_gb"] <= t["rss_gb"]),
                  ("latency", r["p99_ms"] <= t["p99_ms"] and not r["shed"] and r["rps"] >= 0.95 * 500),
                  ("delta sync", o["delta_max_ms"] / 1e3 <= t["delta_s"])]
        status = "met" if all(ok for _, ok in checks) else "; ".join(f"{k} {result_record.met(ok)}" for k, ok in checks)
        value = (f"full load {o['full_sync_ms'] / 1e3:.1f} s; RSS {mem['rss_gb']:.2f} GB, peak "
                 f"{mem['peak_gb']:.2f} GB; p99 {r['p99_ms']:.2f} ms at 500 req/s offered, {r['shed']} shed; "
                 f"longest delta sync {o['delta_max_ms'] / 1e3:.2f} s ({o['rows_per_sync']:.0f} rows a sync, "
                 f"mean {o['delta_mean_ms']:.0f} ms)")
        target = (f"full load ≤ {t['full_load_s']:g} s; RSS ≤ {t['rss_gb']:g} GB, peak included; p99 ≤ "
                  f"{t['p99_ms']:g} ms at 500 req/s, 0 shed; longest delta sync ≤ {t['delta_s']:g} s")
        rows.append(result_record.row("frontend_10m", value, target, status))
    return rows


def headline_rows(results: list[dict]) -> list[dict]:
    """The result file's rows for the sizes that have one (1M and 10M words), from the 500 req/s open loop."""
    rows = []
    for o in results:
        if o["words"] not in SERVING_TARGETS or "similar 500" not in o["runs"]:
            continue
        key, p99_max, rss_max, peak_counts = SERVING_TARGETS[o["words"]]
        r, e, mem = o["runs"]["similar 500"], o["runs"]["empty 500"], o["memory"]
        offline = o.get("recall_offline", {}).get("recall_at_10")
        recall = offline if offline is not None else o["recall_online"]
        checks = [("latency", r["p99_ms"] <= p99_max and not r["shed"] and r["rps"] >= 0.95 * 500),
                  ("peak RSS" if peak_counts else "RSS", (mem["peak_gb"] if peak_counts else mem["rss_gb"]) <= rss_max),
                  ("recall", recall is not None and recall >= 0.99)]
        status = "met" if all(ok for _, ok in checks) else "; ".join(f"{n} {result_record.met(ok)}" for n, ok in checks)
        rows.append(result_record.row(
            key, f"p99 {r['p99_ms']:.2f} ms, p50 {r['p50_ms']:.2f} ms at 500 req/s offered, {r['shed']} shed (empty "
                 f"handler p99 {e['p99_ms']:.2f} ms), front end {r['frontend_cpu']:.2f} CPU-s/s; RSS "
                 f"{mem['rss_gb']:.2f} GB, peak {mem['peak_gb']:.2f} GB; recall@10 "
                 + ("n/a" if recall is None else f"{recall:.4f} {'offline' if offline is not None else '(monitor)'}"),
            f"p99 ≤ {p99_max:g} ms at 500 req/s, 0 shed; RSS ≤ {rss_max:g} GB{', peak included' if peak_counts else ''};"
            f" recall@10 ≥ 0.99", status))
    return rows


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_loadgen":
        print(json.dumps(loadgen(json.loads(sys.stdin.read()))))
    elif len(sys.argv) > 1 and sys.argv[1] == "_empty":
        empty_server()
    elif len(sys.argv) > 1 and sys.argv[1] == "_train":
        training_load()
    elif len(sys.argv) > 1 and sys.argv[1] == "_cluster":
        cluster_training()
    else:
        sys.exit(main())
