"""What a trained token costs at 1 - 16 replicas, and the words/s of H hosts x C cores with S servers.

    .venv/bin/python bench/scaling_model.py --run 1=pipeline.out --run 2=r2.out --run 4=r4.out \\
        --run 8=r8.out --run 16=r16.out --sim 16=r16.log --sim 32=r32.log --sim 64=r64.log \\
        [--cores 16] [--hosts 1,2,4,8,16,32,64] [--links 1,10,25] [--rtt-us 100] [--record FILE]

Pure computation: no cluster runs here. ``--run K=PATH`` is the stdout of a ``bench/cluster_learning.py`` run
with K replicas (its JSON lines; several lines are several rounds, whose medians are taken), or a
``bench/results/*.json`` file that run recorded (totals only: no stages, no words/s). ``--sim K=PATH`` is the
output of ``bench/replica_simulation.py`` with K replicas at the production interval (its "per kept token"
line). The script prints

(a) the measured costs per token: worker CPU by stage, server, scheduler and Kafka CPU, ps-lite bytes each way,
    words/s, cores busy, the share of worker time held at the unsynced bound, load average;
(b) the model (docs/scaling.md gives the formulas): the words/s of H hosts of C cores, each host one replica
    shared by its C worker processes (``LIVEVEC_HOST_REPLICA``), so k = H replicas, with S servers each on a
    core of its own, on links of 1, 10 and 25 Gbit/s, and which resource runs out first;
(c) the sizing rule: the servers per worker host at which the servers never run out first;
(d) the acceptance figures: 16 hosts x 16 cores on 10 Gbit/s against one such host (>= 12x), and 64 hosts
    (>= 40x), each with the servers the rule names.

How the measured costs become the model's: on a machine with fewer cores than worker processes, the kernel's
CPU per token is inflated by the processes' sharing of the cores (caches, switches), so the parallel part of a
worker's token (prepare, kernel, and the 1-replica run's event loop and rest) is the 1-replica run's, and the
exchange's part is what the k-replica run spends beyond it: its sync stage (which runs one at a time per host:
a host replica syncs once at a time), its event loop and rest beyond the 1-replica run's, and the server's CPU.
Each sync also has a fixed cost (its requests to every server, its round trips): a non-negative least-squares
fit over the runs splits the server's and the sync stage's CPU per token into a floor, a part per byte and a
part per sync, using the tokens a run's syncs carried (the interval, or what a replica trains in
``LIVEVEC_SYNC_MS`` when that is less). Beyond the largest measured k the per-token parts are scaled by the
simulation's rows per kept token (an extrapolation; for a k the simulation has not reached, by its rows as a
power of k through the two largest simulated k), and the per-sync parts by the interval the code gives H hosts
of C processes. The same figures are also printed with the exchange's CPU divided by the kernel's inflation in
its run (a bound from the other side). ``--record`` keeps the costs in the result file; ``--costs FILE`` runs
the model on them again.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from online.cluster.sync_interval import default_sync_tokens, unsynced_bound  # noqa: E402

import result_record  # noqa: E402

STAGES = ("prepare", "kernel", "sync", "event loop", "other")
GBIT = 1e9 / 8 / 1e6          # bytes per µs of 1 Gbit/s
SYNC_MS = 250                 # LIVEVEC_SYNC_MS's default: the clock that also starts a sync
ROUND_TRIPS_PER_SYNC = 2      # HEAD_CHANGED_ROWS, then the deltas' pushpull (online/cluster/replica.py)
MAX_SERVERS = 1024
TARGETS = ((16, 16, 10.0, 12.0), (64, 16, 10.0, 40.0))   # hosts, cores, Gbit/s, at least this many times one host


# --- measured costs ------------------------------------------------------------------------------------------

@dataclass
class Measured:
    """One k's costs per trained token, µs of CPU and ps-lite bytes (medians over a file's runs)."""
    k: int
    source: str
    worker: float
    server: float
    scheduler: float = 0.0
    kafka: float | None = None
    stages: dict[str, float] | None = None
    bytes_out: float = 0.0
    bytes_in: float = 0.0
    words_per_second: float | None = None
    workers: int | None = None
    cores_busy: float | None = None
    held_share: float | None = None
    load: str | None = None
    date: str | None = None
    runs: int = 1

    def tokens_per_sync(self, sync_ms: int = SYNC_MS) -> float | None:
        """What one sync of a replica carried: its interval, or what it trains in ``sync_ms`` if less (the
        sync loop's clock then starts the sync first)."""
        if not self.words_per_second or not self.workers:
            return None
        interval = default_sync_tokens(self.workers, max(self.workers // self.k, 1)) * max(self.workers // self.k, 1)
        return min(interval, self.words_per_second / self.k * sync_ms / 1000.0)


def _json_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and obj.get("bench") == "cluster_learning" and "livevec" in obj:
                out.append(obj)
    return out


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def from_runs(k: int, source: str, runs: list[dict]) -> Measured:
    """Medians over the JSON lines of cluster_learning runs with k replicas."""
    lv = [r["livevec"] for r in runs]
    med = _median
    cpu = lambda role: med(p["cpu_us_per_token"].get(role) for p in lv)   # noqa: E731
    stages = {s: med(p.get("worker_cpu_us_per_token_by_stage", {}).get(s) for p in lv) for s in STAGES}
    ps = [p["ps_bytes_per_token"] for p in lv]
    held = [p["worker_bound_wait_seconds"] / (p["seconds"] * r["workers"])
            for r, p in zip(runs, lv) if p.get("worker_bound_wait_seconds") is not None and p.get("seconds")]
    window = lv[0].get("loadavg_window") or []
    load = (f"{window[0].split()[0]} - {window[-1].split()[0]}" if window
            else runs[0].get("loadavg_start", "").split(" ")[0])
    return Measured(k=k, source=source, worker=cpu("worker"), server=cpu("server"), scheduler=cpu("scheduler") or 0.0,
                    kafka=cpu("kafka"), stages=stages if all(v is not None for v in stages.values()) else None,
                    bytes_out=med(p["workers_to_servers"]["sent_by_workers"] for p in ps),
                    bytes_in=med(p["servers_to_workers"]["sent_by_servers"] for p in ps),
                    words_per_second=med(p.get("words_per_second") for p in lv), workers=runs[0]["workers"],
                    cores_busy=med(p.get("cores_busy") for p in lv), held_share=med(held), load=load,
                    date=runs[0].get("date") or lv[0].get("date"), runs=len(runs))


_NUM = r"([\d,]+(?:\.\d+)?)"


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def from_result_file(k: int, source: str, body: dict) -> Measured:
    """A bench/results/*.json of cluster_learning: the totals its row states (no stages, no words/s)."""
    worker = server = scheduler = b_out = b_in = None
    for row in body.get("rows", []):
        value = row.get("value", "")
        m = re.search(rf"worker {_NUM} \+ server {_NUM}(?: \+ scheduler {_NUM})?", value)
        if m and worker is None:
            worker, server = _num(m.group(1)), _num(m.group(2))
            scheduler = _num(m.group(3)) if m.group(3) else 0.0
        m = re.search(rf"{_NUM} / {_NUM} B per token out / in", value)
        if m:
            b_out, b_in = _num(m.group(1)), _num(m.group(2))
        m = re.search(rf"{_NUM} - {_NUM} out, {_NUM} - {_NUM} in", value)
        if m and b_out is None:
            b_out = (_num(m.group(1)) + _num(m.group(2))) / 2
            b_in = (_num(m.group(3)) + _num(m.group(4))) / 2
    if worker is None or b_out is None:
        raise SystemExit(f"{source}: no 'worker .. + server ..' CPU or 'B per token' bytes in its rows")
    load = body.get("load")
    return Measured(k=k, source=source, worker=worker, server=server, scheduler=scheduler, bytes_out=b_out,
                    bytes_in=b_in, load=f"{load[0]:.2f}" if isinstance(load, list) else None, date=body.get("date"))


def load_run(k: int, path: str) -> Measured:
    """One or more files (comma-separated) of k replicas: cluster_learning's JSON lines (the medians over all
    their runs), or one bench/results file of it."""
    paths = path.split(",")
    runs = [run for p in paths for run in _json_lines(Path(p).read_text(encoding="utf-8"))]
    if runs:
        return from_runs(k, path, runs)
    try:
        body = json.loads(Path(paths[0]).read_text(encoding="utf-8")) if len(paths) == 1 else None
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("bench") == "cluster_learning":
        return from_result_file(k, path, body)
    raise SystemExit(f"{path}: neither cluster_learning JSON lines nor a bench/results file of it")


@dataclass
class Simulated:
    k: int
    rows_out: float
    rows_in: float
    bytes_out: float
    bytes_in: float
    source: str = ""

    @property
    def rows(self) -> float:
        return self.rows_out + self.rows_in


_SIM = re.compile(rf"per kept token: {_NUM} rows out.*?{_NUM} rows in.*?about {_NUM} / {_NUM} B out / in")


def parse_simulation(k: int, text: str, source: str = "") -> Simulated | None:
    found = _SIM.findall(text)
    if not found:
        return None
    out, inn, b_out, b_in = map(_num, found[-1])
    return Simulated(k, out, inn, b_out, b_in, source)


# --- the model -------------------------------------------------------------------------------------------------

@dataclass
class Costs:
    """The model's costs per trained token at k replicas (µs of CPU, bytes), split into the part that runs on
    every core of a host in parallel, the host's sync (one at a time), the servers' part per byte, and the
    fixed CPU per sync of a worker and of each server."""
    k: int
    parallel: float            # worker CPU that any core of the host runs: prepare, kernel, event loop, rest
    sync: float                # the sync stage's per-token part, on the host's one sync at a time
    server: float              # all servers' CPU per token, the part that divides over the servers
    bytes_out: float
    bytes_in: float
    sync_fixed_us: float = 0.0     # a worker's CPU per sync beyond the per-token part
    server_fixed_us: float = 0.0   # each server's CPU per sync it answers (its requests), whatever it carries
    interval: float = 160_000      # tokens per sync of a replica (the interval)
    bound: float = 8.0             # the unsynced bound, in intervals
    how: str = "measured"


@dataclass
class Link:
    gbit: float
    rtt_us: float = 100.0
    overhead: float = 1.06     # Ethernet and TCP/IP framing at MTU 1500
    imbalance: float = 1.0     # the busiest server's share over the mean

    @property
    def bytes_per_us(self) -> float:
        return self.gbit * GBIT


RESOURCES = ("worker cores", "host syncs", "worker links", "server cores", "server links")


def bounds(c: Costs, hosts: int, cores: int, servers: int, link: Link) -> dict[str, float]:
    """Cluster words/s each resource allows (docs/scaling.md#the-model)."""
    i, f, L, T = link.imbalance, link.overhead, link.bytes_per_us, c.interval
    big = max(c.bytes_out, c.bytes_in)
    per_token_worker = c.parallel + c.sync + c.sync_fixed_us / T
    per_sync = c.sync_fixed_us + c.server_fixed_us + ROUND_TRIPS_PER_SYNC * link.rtt_us
    host_sync = (c.sync + per_sync / (c.bound * T) + (c.bytes_out + c.bytes_in) * f / L
                 + c.server * i / servers)
    server_cpu = c.server * i + servers * c.server_fixed_us / T
    out = {"worker cores": hosts * cores / per_token_worker,
           "host syncs": hosts / host_sync,
           "worker links": hosts * L / (big * f) if big else math.inf,
           "server cores": servers / server_cpu if server_cpu else math.inf,
           "server links": servers * L / (big * f * i) if big else math.inf}
    return {name: rate * 1e6 for name, rate in out.items()}


def cluster(c: Costs, hosts: int, cores: int, servers: int, link: Link) -> tuple[float, str, dict[str, float]]:
    """Words/s, the resource that runs out first, and every bound."""
    b = bounds(c, hosts, cores, servers, link)
    first = min(RESOURCES, key=lambda r: b[r])
    return b[first], first, b


def servers_needed(c: Costs, hosts: int, cores: int, link: Link, limit: int = MAX_SERVERS) -> tuple[int, bool]:
    """The sizing rule: the fewest servers from which on no server resource runs out first (True). Where the
    servers' fixed cost per sync caps them below the hosts' bounds whatever their number, the fewest that carry
    95 % of the most they can (False)."""
    servers_first = [True] + [cluster(c, hosts, cores, s, link)[1] in ("server cores", "server links")
                              for s in range(1, limit + 1)]
    if not servers_first[limit]:
        s = limit
        while s > 1 and not servers_first[s - 1]:
            s -= 1
        return s, True
    rates = [0.0] + [cluster(c, hosts, cores, s, link)[0] for s in range(1, limit + 1)]
    return next(s for s in range(1, limit + 1) if rates[s] >= 0.95 * max(rates)), False


def nnls(rows: list[tuple[float, ...]], ys: list[float]) -> tuple[float, ...]:
    """Non-negative least squares for a few columns: the best fit over every subset of them (closed form)."""
    import itertools

    import numpy as np

    a, y = np.asarray(rows, float), np.asarray(ys, float)
    n = a.shape[1]
    best, best_sse = (0.0,) * n, float(np.sum(y * y))
    for size in range(1, n + 1):
        for cols in itertools.combinations(range(n), size):
            sub = a[:, cols]
            coef, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if np.any(coef < 0):
                continue
            sse = float(np.sum((y - sub @ coef) ** 2))
            if sse < best_sse - 1e-15:
                full = [0.0] * n
                for c, v in zip(cols, coef):
                    full[c] = float(v)
                best, best_sse = tuple(full), sse
    return best


def fit_per_sync(points: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    """y = c0 + a * bytes + b / tokens_per_sync over (bytes, y, tokens_per_sync), all >= 0: (c0, a, b), b in µs
    per sync. Fewer than 3 points fit a and b only."""
    pts = [(x, y, t) for x, y, t in points if None not in (x, y, t) and t > 0]
    if len(pts) < 2:
        return 0.0, 0.0, 0.0
    if len(pts) < 3:
        a, b = nnls([(x, 1.0 / t) for x, _, t in pts], [y for _, y, _ in pts])
        return 0.0, a, b
    return nnls([(1.0, x, 1.0 / t) for x, _, t in pts], [y for _, y, _ in pts])


def replica_interval(k: int, cores: int) -> int:
    """Tokens per sync of one of k replicas, each trained by ``cores`` processes of a host
    (``LIVEVEC_SYNC_TOKENS`` 0: ``sync_interval.default_sync_tokens``'s split undone)."""
    return default_sync_tokens(k * cores, cores) * cores


def inflation(m: Measured, one: Measured) -> float:
    """How much more CPU a token's prepare and kernel took in run ``m`` than in the 1-replica run (processes
    sharing too few cores), at least 1; 1 without stages."""
    if not (m.stages and one.stages) or m.k == 1:
        return 1.0
    return max(1.0, (m.stages["prepare"] + m.stages["kernel"]) / (one.stages["prepare"] + one.stages["kernel"]))


def deflated(m: Measured, one: Measured) -> Measured:
    """``m`` with its exchange's CPU (sync, event loop, rest, server) divided by the kernel's inflation."""
    f = inflation(m, one)
    if f == 1.0:
        return m
    stages = {s: (v / f if s in ("sync", "event loop", "other") else v) for s, v in m.stages.items()}
    return replace(m, stages=stages, worker=sum(stages.values()), server=m.server / f)


@dataclass
class Model:
    measured: dict[int, Measured]
    sims: dict[int, Simulated] = field(default_factory=dict)
    sync_ms: int = SYNC_MS
    server_per_sync_us: float | None = None   # None: fitted over the runs
    worker_per_sync_us: float | None = None
    notes: list[str] = field(default_factory=list)
    server_fit: tuple[float, float, float] | None = None
    worker_fit: tuple[float, float, float] | None = None
    deflate: bool = False   # divide the exchange's CPU by the kernel's inflation in the same run
    cores: int = 16         # worker processes per host: the interval depends on the workers the cluster declares
    raw: dict[int, Measured] = field(default_factory=dict)

    def __post_init__(self):
        if 1 not in self.measured:
            raise SystemExit("the model needs a 1-replica run (--run 1=PATH): its kernel is the one not inflated")
        self.raw = dict(self.measured)
        if self.deflate:
            self.measured = {k: deflated(m, self.measured[1]) for k, m in self.measured.items()}
        timed = [m for m in self.measured.values() if m.tokens_per_sync(self.sync_ms)]
        if self.server_per_sync_us is None:
            pts = [(m.bytes_out + m.bytes_in, m.server, m.tokens_per_sync(self.sync_ms)) for m in timed]
            self.server_fit = fit_per_sync(pts)
            self.server_per_sync_us = self.server_fit[2]
        if self.worker_per_sync_us is None:
            pts = [(m.bytes_out + m.bytes_in, m.stages["sync"], m.tokens_per_sync(self.sync_ms))
                   for m in timed if m.stages]
            self.worker_fit = fit_per_sync(pts)
            self.worker_per_sync_us = self.worker_fit[2]
        if len(timed) < 2:
            self.notes.append("fewer than 2 runs with words/s: no fixed cost per sync fitted (taken as 0)")
        if any(m.stages is None for m in self.measured.values()):
            self.notes.append("a run without stages (a bench/results file): its worker CPU beyond the 1-replica "
                              "run's is all counted as the host's sync, the harshest reading")

    def _split(self, m: Measured) -> Costs:
        base = self.measured[1]
        tps = m.tokens_per_sync(self.sync_ms)
        if base.stages and m.stages:
            parallel_base = sum(base.stages[s] for s in ("prepare", "kernel", "event loop", "other"))
            exch = max(0.0, m.stages["event loop"] + m.stages["other"]
                       - base.stages["event loop"] - base.stages["other"])
            sync = m.stages["sync"]
        else:   # totals only: the worker's CPU beyond the 1-replica run's counts as its sync
            parallel_base, exch = base.worker, 0.0
            sync = max(0.0, m.worker - base.worker) if m.k > 1 else 0.0
        sync_rows = max(0.0, sync - (self.worker_per_sync_us / tps if tps else 0.0))
        server_rows = max(0.0, m.server - (self.server_per_sync_us / tps if tps else 0.0))
        return Costs(k=m.k, parallel=parallel_base + exch, sync=sync_rows, server=server_rows,
                     bytes_out=m.bytes_out, bytes_in=m.bytes_in, sync_fixed_us=self.worker_per_sync_us,
                     server_fixed_us=self.server_per_sync_us, how="measured")

    def costs(self, k: int) -> Costs | None:
        """The model's costs at k replicas: a measured k's; between measured ones the next larger one's; beyond
        the largest, that one's scaled by the simulation's rows per kept token (an extrapolation)."""
        known = sorted(self.measured)
        interval, bound = replica_interval(k, self.cores), unsynced_bound(k)
        if k in self.measured or k < known[-1]:
            at = min(x for x in known if x >= k)
            c = self._split(self.measured[at])
            return replace(c, k=k, interval=interval, bound=bound,
                           how="measured" if at == k else f"the {at}-replica run's")
        top = known[-1]
        s0, s1 = self.sims.get(top), self.sims.get(k) or self.power_law(k)
        if s0 is None or s1 is None:
            return None
        c = self._split(self.measured[top])
        rows = s1.rows / s0.rows
        exch = c.parallel - self._split(self.measured[1]).parallel
        return replace(c, k=k, interval=interval, bound=bound,
                       parallel=c.parallel + exch * (rows - 1), sync=c.sync * rows, server=c.server * rows,
                       bytes_out=c.bytes_out * s1.rows_out / s0.rows_out,
                       bytes_in=c.bytes_in * s1.rows_in / s0.rows_in,
                       how=f"extrapolated from {top} by the simulation's rows per kept token (x{rows:.2f})"
                           + (f", {s1.source}" if s1.source.startswith("as a power") else ""))

    def power_law(self, k: int) -> Simulated | None:
        """Rows per kept token at k from the two largest simulated k below it, as a power of k (each direction):
        for a k the simulation has not reached."""
        below = sorted(x for x in self.sims if 1 < x < k)
        if len(below) < 2:
            return None
        a, b = self.sims[below[-2]], self.sims[below[-1]]
        grow = math.log(k / b.k) / math.log(b.k / a.k)
        return Simulated(k, b.rows_out * (b.rows_out / a.rows_out) ** grow, b.rows_in * (b.rows_in / a.rows_in) ** grow,
                         0.0, 0.0, f"as a power of k through {a.k} and {b.k} (no simulation at {k})")


# --- printing --------------------------------------------------------------------------------------------------

def _f(x, digits=2):
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def _rate(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:,.1f}M"
    return f"{x / 1e3:,.0f}k"


def measured_table(model: Model) -> list[str]:
    head = ("| replicas | worker: prepare | kernel | sync | event loop | other | worker | server | scheduler | "
            "all roles | Kafka | B out | B in | words/s | cores busy | held at bound | tokens per sync | load | "
            "run at (UTC) |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for k in sorted(model.measured):
        m = model.measured[k]
        st = m.stages or {}
        tps = m.tokens_per_sync(model.sync_ms)
        lines.append(
            f"| {k} | {_f(st.get('prepare'))} | {_f(st.get('kernel'))} | {_f(st.get('sync'))} | "
            f"{_f(st.get('event loop'))} | {_f(st.get('other'))} | {_f(m.worker)} | {_f(m.server)} | "
            f"{_f(m.scheduler)} | {_f(m.worker + m.server + m.scheduler)} | {_f(m.kafka)} | "
            f"{_f(m.bytes_out, 0)} | {_f(m.bytes_in, 0)} | {_f(m.words_per_second, 0)} | {_f(m.cores_busy)} | "
            f"{'-' if m.held_share is None else f'{100 * m.held_share:.0f} %'} | {_f(tps, 0)} | {m.load or '-'} | "
            f"{(m.date or '-')[:16].replace('T', ' ')} |")
    return lines


def costs_table(model: Model, ks: list[int]) -> list[str]:
    lines = ["| replicas | interval (tokens) | parallel µs | sync µs | server µs | B out | B in | from |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for k in ks:
        c = model.costs(k)
        if c is None:
            lines.append(f"| {k} | {replica_interval(k, model.cores):,} | - | - | - | - | - | no figures (no run, no "
                         f"simulation) |")
            continue
        lines.append(f"| {k} | {c.interval:,} | {c.parallel:.2f} | {c.sync:.2f} | {c.server:.2f} | "
                     f"{c.bytes_out:,.0f} | {c.bytes_in:,.0f} | {c.how} |")
    return lines


def model_table(model: Model, hosts: list[int], cores: int, links: list[float], rtt_us: float) -> list[str]:
    lines = ["| hosts | " + " | ".join(f"{g:g} Gbit/s: servers, words/s, x one host, runs out first" for g in links)
             + " |", "| --- |" + " --- |" * len(links)]
    for h in hosts:
        c = model.costs(h)
        cells = []
        for g in links:
            if c is None:
                cells.append("no figures")
                continue
            link = Link(g, rtt_us)
            s, _ = servers_needed(c, h, cores, link)
            rate, first, _ = cluster(c, h, cores, s, link)
            one = reference(model, cores, link)
            cells.append(f"{s}, {_rate(rate)}, {rate / one:.1f}x, {first}")
        lines.append(f"| {h} | " + " | ".join(cells) + " |")
    return lines


def chain_table(model: Model, hosts: list[int], cores: int, rtt_us: float, gbit: float = 10.0) -> list[str]:
    """A host's sync chain per token at k = H replicas, with the servers the rule names."""
    lines = [f"| k | sync stage | fixed per sync and round trips | wire, {gbit:g} Gbit/s | wire, 1 Gbit/s | "
             f"servers' share "
             f"| a host's syncs carry at most | its {cores} cores train |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for h in hosts:
        c = model.costs(h)
        if c is None:
            continue
        link = Link(gbit, rtt_us)
        s, _ = servers_needed(c, h, cores, link)
        fixed = (c.sync_fixed_us + c.server_fixed_us + ROUND_TRIPS_PER_SYNC * rtt_us) / (c.bound * c.interval)
        wire = (c.bytes_out + c.bytes_in) * link.overhead / link.bytes_per_us
        share = c.server * link.imbalance / s
        b = bounds(c, h, cores, s, link)
        lines.append(f"| {h} | {c.sync:.2f} µs | {fixed:.2f} µs | {wire:.2f} µs | {wire * gbit:.2f} µs | "
                     f"{share:.2f} µs ({s} server{'s' * (s > 1)}) | {_rate(b['host syncs'] / h)} | "
                     f"{_rate(b['worker cores'] / h)} |")
    return lines


def reference(model: Model, cores: int, link: Link) -> float:
    """One host of ``cores`` cores: k = 1, with the servers the rule names."""
    c = model.costs(1)
    s, _ = servers_needed(c, 1, cores, link)
    return cluster(c, 1, cores, s, link)[0]


def acceptance(model: Model, rtt_us: float) -> list[dict]:
    out = []
    for hosts, cores, gbit, target in TARGETS:
        link = Link(gbit, rtt_us)
        c = model.costs(hosts)
        one = reference(model, cores, link)
        one_cores = cluster(model.costs(1), 1, cores, MAX_SERVERS, link)[2]["worker cores"]
        if c is None:
            out.append({"hosts": hosts, "cores": cores, "gbit": gbit, "target": target, "ratio": None})
            continue
        s, clears = servers_needed(c, hosts, cores, link)
        rate, first, b = cluster(c, hosts, cores, s, link)
        out.append({"hosts": hosts, "cores": cores, "gbit": gbit, "target": target, "servers": s,
                    "servers_clear": clears, "words_per_second": rate, "runs_out_first": first, "bounds": b,
                    "one_host": one, "one_host_cores": one_cores, "ratio": rate / one,
                    "ratio_to_cores": rate / one_cores, "costs": c})
    return out


def report(model: Model, args) -> list[dict]:
    print("(a) measured costs per trained token (µs of CPU; ps-lite bytes each way; medians over a file's runs)\n")
    for line in measured_table(model):
        print(line)
    print("\n- sources: " + "; ".join(f"{k} = {m.source} ({m.runs} run{'s' * (m.runs > 1)})"
                                    for k, m in sorted(model.measured.items())))
    if model.sims:
        print("- simulation, rows per kept token out / in: " + "; ".join(
            f"{k}: {s.rows_out:.2f} / {s.rows_in:.2f}" for k, s in sorted(model.sims.items())))
    for name, fit, value in (("server", model.server_fit, model.server_per_sync_us),
                             ("worker sync stage", model.worker_fit, model.worker_per_sync_us)):
        if fit is None:
            print(f"- {name}: {value:,.0f} µs per sync (given)")
        else:
            print(f"- {name}: fitted µs per token = {fit[0]:.3f} + {fit[1] * 1000:.3f} ns x bytes per token + "
                  f"{fit[2]:,.0f} µs / tokens per sync")
    for note in model.notes:
        print("- note: " + note)

    ks = sorted(set(args.hosts) | set(model.measured))
    print("\n(b) the model's costs per token at k replicas (k = hosts)\n")
    for line in costs_table(model, ks):
        print(line)
    print(f"\nwords/s of H hosts x {args.cores} cores (k = H), servers by the sizing rule, "
          f"round trip {args.rtt_us:g} µs\n")
    for line in model_table(model, args.hosts, args.cores, args.links, args.rtt_us):
        print(line)

    print(f"\na host's sync chain per token (one sync at a time per host), servers by the sizing rule\n")
    for line in chain_table(model, args.hosts, args.cores, args.rtt_us):
        print(line)

    print("\n(c) sizing rule: servers per worker host so that no server resource runs out first\n")
    print("| hosts | " + " | ".join(f"{g:g} Gbit/s" for g in args.links) + " |")
    print("| --- |" + " --- |" * len(args.links))
    for h in args.hosts:
        c = model.costs(h)
        cells = []
        for g in args.links:
            if c is None:
                cells.append("-")
                continue
            s, clears = servers_needed(c, h, args.cores, Link(g, args.rtt_us))
            cells.append(f"{s} ({s / h:.2f} per host)" + ("" if clears else ", servers still run out first"))
        print(f"| {h} | " + " | ".join(cells) + " |")

    print("\n(d) acceptance\n")
    results = acceptance(model, args.rtt_us)
    print_acceptance(results)
    soft = Model(model.raw, model.sims, sync_ms=model.sync_ms, deflate=True, cores=model.cores,
                 server_per_sync_us=args.server_sync_us, worker_per_sync_us=args.worker_sync_us)
    factors = ", ".join(f"{k}: x{inflation(m, model.raw[1]):.2f}" for k, m in sorted(model.raw.items()) if k > 1)
    print(f"\nthe same with the exchange's CPU divided by the kernel's inflation in its run ({factors}):\n")
    soft_results = acceptance(soft, args.rtt_us)
    print_acceptance(soft_results)
    return results, soft_results


def print_acceptance(results: list[dict]) -> None:
    for r in results:
        if r["ratio"] is None:
            print(f"{r['hosts']} hosts x {r['cores']} cores, {r['gbit']:g} Gbit/s: no figures at k = {r['hosts']} "
                  f"(no run and no simulation for it)")
            continue
        b = r["bounds"]
        ok = r["ratio"] >= r["target"]
        print(f"{r['hosts']} hosts x {r['cores']} cores, {r['gbit']:g} Gbit/s, {r['servers']} servers: "
              f"{_rate(r['words_per_second'])} words/s, {r['ratio']:.1f}x one such host "
              f"({_rate(r['one_host'])}; {r['ratio_to_cores']:.1f}x its cores' bound "
              f"{_rate(r['one_host_cores'])}), target >= {r['target']:g}x: {'met' if ok else 'missed'}; "
              f"runs out first: {r['runs_out_first']}")
        print("    bounds: " + ", ".join(f"{name} {_rate(b[name])}" for name in RESOURCES))


def record_rows(results: list[dict], soft: list[dict]) -> list[dict]:
    """The headline row: each target's ratio on the measured costs (which the status judges), and with the
    exchange's CPU deflated by the kernel's inflation."""
    parts, status = [], []
    for r, d in zip(results, soft):
        if r["ratio"] is None:
            parts.append(f"{r['hosts']} hosts: no figures")
            status.append(f"{r['hosts']} hosts missed (no figures)")
            continue
        parts.append(f"{r['hosts']} hosts x {r['cores']} cores on {r['gbit']:g} Gbit/s, {r['servers']} servers: "
                     f"{r['ratio']:.1f}x one host ({_rate(r['words_per_second'])} against {_rate(r['one_host'])} "
                     f"words/s), limited by {r['runs_out_first']}"
                     + (f" ({d['ratio']:.1f}x with the exchange's CPU deflated)" if d["ratio"] is not None else ""))
        status.append(f"{r['hosts']} hosts {result_record.met(r['ratio'] >= r['target'])}")
    target = "; ".join(f"{h} hosts x {c} cores on {g:g} Gbit/s >= {t:g}x one such host" for h, c, g, t in TARGETS)
    return [result_record.row("scaling_model", "; ".join(parts) + " (the model on the measured costs per token, "
                              "docs/scaling.md)", target + ", servers by the sizing rule", "; ".join(status))]


def _pairs(values: list[str], what: str) -> dict[int, str]:
    out = {}
    for v in values:
        k, sep, path = v.partition("=")
        if not sep or not k.isdigit():
            raise SystemExit(f"{what} takes K=PATH, not {v!r}")
        out[int(k)] = path
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="append", default=[], metavar="K=PATH",
                    help="cluster_learning with K replicas: its stdout (PATH,PATH,...: several runs, their medians), "
                         "or its bench/results file")
    ap.add_argument("--sim", action="append", default=[], metavar="K=PATH",
                    help="replica_simulation's output with K replicas (its 'per kept token' line)")
    ap.add_argument("--cores", type=int, default=16, help="cores (worker processes) per host")
    ap.add_argument("--hosts", default="1,2,4,8,16,32,64")
    ap.add_argument("--links", default="1,10,25", help="Gbit/s")
    ap.add_argument("--rtt-us", type=float, default=100.0, help="round trip between hosts, µs")
    ap.add_argument("--sync-ms", type=int, default=SYNC_MS, help="the runs' LIVEVEC_SYNC_MS")
    ap.add_argument("--server-sync-us", type=float, default=None,
                    help="a server's CPU per sync it answers, µs (default: fitted over the runs)")
    ap.add_argument("--worker-sync-us", type=float, default=None,
                    help="a worker's CPU per sync beyond its per-token part, µs (default: fitted over the runs)")
    ap.add_argument("--costs", metavar="FILE",
                    help="take the measured and simulated costs a --record of this script kept (bench/results/"
                         "scaling_model.json); --run and --sim add to them")
    ap.add_argument("--record", metavar="FILE",
                    help="write the acceptance row, and the costs it came from, to this result file")
    args = ap.parse_args(argv)
    args.hosts = [int(x) for x in args.hosts.split(",")]
    args.links = [float(x) for x in args.links.split(",")]
    record = result_record.start(args.record, "scaling_model")
    measured, sims = load_costs(args.costs) if args.costs else ({}, {})
    measured.update({k: load_run(k, p) for k, p in _pairs(args.run, "--run").items()})
    for k, p in _pairs(args.sim, "--sim").items():
        s = parse_simulation(k, Path(p).read_text(encoding="utf-8", errors="replace"), p)
        if s is None:
            print(f"note: {p} has no 'per kept token' line yet; k = {k} left out", file=sys.stderr)
        else:
            sims[k] = s
    model = Model(measured, sims, sync_ms=args.sync_ms, cores=args.cores, server_per_sync_us=args.server_sync_us,
                  worker_per_sync_us=args.worker_sync_us)
    results, soft = report(model, args)
    result_record.write(record, record_rows(results, soft))
    if record is not None:   # the costs the row came from, so that --costs re-runs the model on them
        body = json.loads(record.path.read_text(encoding="utf-8"))
        loads = ", ".join(f"k = {k}: {m.load}" for k, m in sorted(measured.items()) if m.load)
        body["note"] = (f"arithmetic on the runs' costs: the load is this script's; each run's is in "
                        f"docs/scaling.md's table (1-minute load at the window's ends, {loads})")
        body["measured"] = {str(k): asdict(m) for k, m in sorted(measured.items())}
        body["simulated"] = {str(k): asdict(m) for k, m in sorted(sims.items())}
        record.path.write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


def load_costs(path: str) -> tuple[dict[int, Measured], dict[int, Simulated]]:
    body = json.loads(Path(path).read_text(encoding="utf-8"))
    if "measured" not in body:
        raise SystemExit(f"{path}: no 'measured' costs (written by this script's --record)")
    return ({int(k): Measured(**m) for k, m in body["measured"].items()},
            {int(k): Simulated(**m) for k, m in body.get("simulated", {}).items()})


if __name__ == "__main__":
    sys.exit(main())
