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
  (its link shaped to 1 mbit/s for 10 - 20 s); and, with the checkpoints on the MooseFS every host
  mounts (``online.deployment.moosefs_lab``: a master on the bridge, a chunkserver on each group
  host, ``LIVEVEC_CHECKPOINT_IO_TIMEOUT=10``), also: the Kafka broker killed with SIGKILL and started
  again from its data directory 10 - 30 s later; one chunkserver killed for 10 - 30 s; the master
  killed for 10 - 25 s (restarted from its data directory); the checkpoint directory full for
  15 - 40 s (a hard quota of 1 byte: every write fails with EDQUOT). ``--faults`` names the kinds
  drawn from (default: all of them). The kinds are drawn from one seeded sequence with fixed
  weights (kill and partition twice each), so a seed with the same ``--faults`` replays the same
  faults; ``--faults kill,partition,host_loss,trickle`` draws the sequence of a soak without the
  broker and storage faults. A fault whose target is already down (the broker, that chunkserver, the master; a quota
  while the master is down or a quota is set) is recorded as skipped.

After ``--duration`` seconds the producer stops, the cluster drains the backlog, and the script
reports what ``main``'s docstring lists.

    .venv/bin/python bench/soak.py --duration 600 --hosts 4 [--faults kill,kafka_restart,...] [--storage local]
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recovery_cluster import (Cluster, Producer, RestartableBroker, new_topic, planted_quality,  # noqa: E402
                              start_broker)

from online.deployment.moosefs_lab import MooseFSLab, moosefs_support_problem  # noqa: E402
from online.deployment.netns_lab import NetnsLab, lab_support_problem  # noqa: E402
from online.stream.sample_corpus import iter_sentences  # noqa: E402

ROLES = [("worker", 0), ("worker", 1), ("server", 0), ("server", 1), ("scheduler", 0), ("frontend", 0)]
ENV = {"LIVEVEC_CHECKPOINT_INTERVAL": "10", "LIVEVEC_DIM": "50", "LIVEVEC_KAFKA_BATCH_RECORDS": "50"}
MALFORMED = b"\xff\xfe not utf-8 \xc3\x28"
LAB_ID = 70
# The seeded draw: one entry per weight, in this order (the first six are the kinds without the broker and storage
# faults: --faults with only those kinds draws the same sequence as a soak without them).
DRAW = ["kill", "kill", "partition", "partition", "host_loss", "trickle",
        "kafka_restart", "chunkserver_kill", "master_kill", "fs_full"]
STORAGE_KINDS = {"chunkserver_kill", "master_kill", "fs_full"}
FAULT_KINDS = list(dict.fromkeys(DRAW))
MFS_ENV = {"LIVEVEC_CHECKPOINT_IO_TIMEOUT": "10"}
OUTAGE_GRACE = 30.0     # a fault's window for the log counts: from its injection to this long after it was undone
LOUD = ("warning", "error", "critical")
_QUOTA = {"on": False}   # the soak's quota on the checkpoint directory is set
_LINE = re.compile(r"^ts=(\S+) level=(\w+) (?:.*? )?event=(\S+)")


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


class Fault:
    """One fault drawn: what it was, when (monotonic and wall clock), and when it was undone."""

    def __init__(self, kind: str, what: str, t: float, skipped: str | None = None):
        self.kind, self.what, self.skipped = kind, what, skipped
        self.start = self.end = t
        self.t0 = time.monotonic() - t
        self.background = False   # its undo ends it later, from a thread
        self.wall_start = self.wall_end = time.time()
        self.undo_errors: list[str] = []

    def ended(self, t: float) -> None:
        self.end, self.wall_end = t, time.time()


def inject(rng: random.Random, cluster: Cluster, lab: NetnsLab | None, hosts: int, t: float,
           kinds: list[str] | None = None, broker: RestartableBroker | None = None,
           mfs: MooseFSLab | None = None) -> tuple[Fault, list]:
    """One failure; returns it and what to undo later as (when, action)."""
    if lab is None:
        app, index = rng.choice(ROLES)
        cluster.runner.kill_task(app, index)
        return Fault("kill", f"kill -9 {app}#{index}", t), []
    kind = rng.choice([k for k in DRAW if k in (kinds or FAULT_KINDS)])
    host = lab.hosts[rng.randrange(hosts)]
    if kind in ("kafka_restart", "chunkserver_kill", "master_kill", "fs_full"):
        return inject_service(rng, kind, t, broker, mfs)
    fault, later = inject_lab(rng, kind, host, cluster, lab, t)
    return fault, later


def inject_service(rng: random.Random, kind: str, t: float, broker: RestartableBroker | None,
                   mfs: MooseFSLab | None) -> tuple[Fault, list]:
    """The broker and storage faults. Every number is drawn before anything is checked, so that a skipped
    fault leaves the seeded sequence where a fired one would."""
    if kind == "kafka_restart":
        seconds = rng.uniform(10, 30)
        if broker is None or not broker.running() or (broker.restarting and broker.restarting.is_alive()):
            return Fault(kind, "kafka broker kill -9 (skipped: not running)", t, skipped="already down"), []
        broker.kill()
        fault = Fault(kind, f"kafka broker kill -9, restarted from its data directory after {seconds:.0f}s", t)
        fault.background = True

        def restart():   # in a thread: the other faults' undos keep their times while the JVM starts
            def run():
                try:
                    broker.start()
                except Exception as exc:   # noqa: BLE001 - reported; tried again by the next undo pass
                    fault.undo_errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                fault.ended(time.monotonic() - fault.t0)
                print(f"[{fault.end:6.1f}s] kafka broker back", flush=True)
            broker.restarting = threading.Thread(target=run, name="broker-restart", daemon=True)
            broker.restarting.start()
        return fault, [(t + seconds, restart, fault)]
    if kind == "chunkserver_kill":
        i = rng.randrange(len(mfs.chunkserver_hosts)) + 1
        seconds = rng.uniform(10, 30)
        where = mfs.chunkserver_hosts[i - 1].address
        if not mfs.running(f"cs{i}"):
            return Fault(kind, f"chunkserver {i} ({where}) kill -9 (skipped: not running)", t,
                         skipped="already down"), []
        mfs.kill_chunkserver(i)
        fault = Fault(kind, f"chunkserver {i} ({where}) kill -9 for {seconds:.0f}s", t)
        return fault, [(t + seconds, lambda: mfs.running(f"cs{i}") or mfs.start_chunkserver(i), fault)]
    if kind == "master_kill":
        seconds = rng.uniform(10, 25)
        if not mfs.running("master"):
            return Fault(kind, "MooseFS master kill -9 (skipped: not running)", t, skipped="already down"), []
        mfs.kill_master()
        fault = Fault(kind, f"MooseFS master kill -9 for {seconds:.0f}s", t)
        return fault, [(t + seconds, lambda: mfs.running("master") or mfs.start_master(), fault)]
    seconds = rng.uniform(15, 40)
    if not mfs.running("master") or _QUOTA["on"]:
        return Fault(kind, "checkpoint directory full (skipped: master down or quota set)", t,
                     skipped="master down or quota set"), []
    mfs.set_quota("checkpoints", 1)
    _QUOTA["on"] = True

    def free():
        # Not while the master is down: mfsdelquota then waits in a FUSE request, which its timeout cannot end
        # until the mount gives the request up (130 s in one run), holding the soak's loop and the master's
        # restart due next. Tried again 5 s later.
        if not mfs.running("master"):
            raise RuntimeError("the MooseFS master is down")
        mfs.set_quota("checkpoints", None)
        _QUOTA["on"] = False
    fault = Fault(kind, f"checkpoint directory full (hard quota 1 byte) for {seconds:.0f}s", t)
    return fault, [(t + seconds, free, fault)]


def inject_lab(rng: random.Random, kind: str, host, cluster: Cluster, lab: NetnsLab, t: float) -> tuple[Fault, list]:
    on_host = sorted(k for k, h in cluster.runner.placement.items() if h == host.address)
    if kind == "kill":
        app, index = rng.choice(ROLES)
        cluster.runner.kill_task(app, index)
        return Fault(kind, f"kill -9 {app}#{index}", t), []
    if kind == "host_loss":
        for app_id, index in on_host:
            cluster.runner.kill_task(app_id, index)
        names = ", ".join(f"{app_id.rsplit('/', 1)[-1]}#{index}" for app_id, index in on_host)
        return Fault(kind, f"host loss {host.address} ({names})", t), []
    if kind == "partition":
        seconds = rng.uniform(5, 15)
        lab.partition(host.name)
        fault = Fault(kind, f"partition {host.address} for {seconds:.0f}s", t)
        return fault, [(t + seconds, lambda: lab.heal(host.name), fault)]
    seconds = rng.uniform(10, 20)
    lab.shape(host.name, "1mbit")
    fault = Fault(kind, f"trickle {host.address} (1mbit) for {seconds:.0f}s", t)
    return fault, [(t + seconds, lambda: lab.shape(host.name, lab.link), fault)]


def _wall(ts: str) -> float:
    return datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def read_logs(log_dir: Path) -> dict[str, list[tuple[float, str, str]]]:
    """Task (``worker-0``) -> its warning and error lines as (wall time, level, event); a line that is not a
    ``key=value`` line (a stray print or traceback) counts as a warning at the time of the line before it."""
    out: dict[str, list] = {}
    for path in sorted(log_dir.glob("livevec-*-*.log")):
        task = path.stem[len("livevec-"):]
        lines = out.setdefault(task, [])
        last = 0.0
        for line in path.read_text(errors="replace").splitlines():
            m = _LINE.match(line)
            if m:
                try:
                    last = _wall(m.group(1))
                except ValueError:
                    pass
                if m.group(2) in LOUD:
                    lines.append((last, m.group(2), m.group(3)))
            elif line.startswith(("ts=", "--- ")):   # "--- launch N": the runner's own line
                continue
            elif line.strip() and last:
                lines.append((last, "unstructured", line.strip()[:60]))
    return out


def _union(windows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(windows):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _inside(t: float, windows: list[tuple[float, float]]) -> bool:
    return any(a <= t <= b for a, b in windows)


def log_rates(loud: dict[str, list], run: tuple[float, float], faults: list[Fault]) -> dict:
    """Per role: warning/error lines per minute of the run and per minute of outage (every fault's window, from its
    injection to OUTAGE_GRACE s after it was undone, merged), summed over its tasks and for its loudest task; the
    loudest events; and per fault kind, lines per minute of that kind's windows."""
    fired = [f for f in faults if not f.skipped]
    windows = _union([(f.wall_start, min(f.wall_end + OUTAGE_GRACE, run[1])) for f in fired])
    outage_min = sum(b - a for a, b in windows) / 60.0
    run_min = (run[1] - run[0]) / 60.0
    by_kind = {k: _union([(f.wall_start, min(f.wall_end + OUTAGE_GRACE, run[1])) for f in fired if f.kind == k])
               for k in dict.fromkeys(f.kind for f in fired)}
    roles: dict[str, dict] = {}
    for task, lines in loud.items():
        role = task.rsplit("-", 1)[0]
        r = roles.setdefault(role, {"tasks": 0, "lines": 0, "errors": 0, "outage_lines": 0, "max_task_per_min": 0.0,
                                    "max_task_per_outage_min": 0.0, "events": collections.Counter(),
                                    "by_kind": collections.Counter()})
        in_run = [x for x in lines if run[0] <= x[0] <= run[1]]
        in_outage = [x for x in in_run if _inside(x[0], windows)]
        r["tasks"] += 1
        r["lines"] += len(in_run)
        r["errors"] += sum(1 for x in in_run if x[1] in ("error", "critical"))
        r["outage_lines"] += len(in_outage)
        r["max_task_per_min"] = max(r["max_task_per_min"], round(len(in_run) / max(run_min, 1e-9), 1))
        r["max_task_per_outage_min"] = max(r["max_task_per_outage_min"],
                                           round(len(in_outage) / outage_min, 1) if outage_min else 0.0)
        r["events"].update(f"{x[1]}:{x[2]}" for x in in_run)
        for kind, kw in by_kind.items():
            r["by_kind"][kind] += sum(1 for x in in_run if _inside(x[0], kw))
    out = {"run_minutes": round(run_min, 2), "outage_minutes": round(outage_min, 2), "roles": {}}
    for role, r in sorted(roles.items()):
        out["roles"][role] = {
            "tasks": r["tasks"], "warning_error_lines": r["lines"], "error_lines": r["errors"],
            "per_minute": round(r["lines"] / max(run_min, 1e-9), 1),
            "per_outage_minute": round(r["outage_lines"] / outage_min, 1) if outage_min else None,
            "max_task_per_minute": r["max_task_per_min"], "max_task_per_outage_minute": r["max_task_per_outage_min"],
            "per_minute_of_kind": {k: round(r["by_kind"][k] / (sum(b - a for a, b in kw) / 60.0), 1)
                                   for k, kw in by_kind.items()},
            "loudest": dict(r["events"].most_common(4))}
    return out


def recovery(faults: list[Fault], timeline: list[tuple[float, int]], checkpoints: list[float],
             storage_lines: list[float], kafka_lines: dict[str, list[float]]) -> dict:
    """Per fault kind: fired, skipped, recovered, and for each fired fault the seconds from its end until training
    went on (the ledger's offsets grew) and, for the broker and storage, until a checkpoint completed."""
    out: dict[str, dict] = {}
    for f in faults:
        k = out.setdefault(f.kind, {"fired": 0, "skipped": 0, "recovered": 0, "training_after_s": [],
                                    "checkpoint_after_s": []})
        if f.skipped:
            k["skipped"] += 1
            continue
        k["fired"] += 1
        before = [o for t, o in timeline if t <= f.wall_end]
        base = before[-1] if before else 0
        trained = next((t - f.wall_end for t, o in timeline if t > f.wall_end and o > base), None)
        k["training_after_s"].append(None if trained is None else round(trained, 1))
        ok = trained is not None
        if f.kind in STORAGE_KINDS or f.kind == "kafka_restart":
            ckpt = next((t - f.wall_end for t in checkpoints if t > f.wall_end), None)
            k["checkpoint_after_s"].append(None if ckpt is None else round(ckpt, 1))
            ok = ok and ckpt is not None
        if f.kind in STORAGE_KINDS:
            k.setdefault("storage_unavailable_lines", []).append(
                sum(1 for t in storage_lines if f.wall_start <= t <= f.wall_end + OUTAGE_GRACE))
        if f.kind == "kafka_restart":
            for event, times in kafka_lines.items():
                k.setdefault(f"{event}_lines", []).append(
                    sum(1 for t in times if f.wall_start <= t <= f.wall_end + OUTAGE_GRACE))
        if f.undo_errors:
            k.setdefault("undo_errors", []).extend(f.undo_errors)
        k["recovered"] += int(ok)
    for k in out.values():
        if not k["checkpoint_after_s"]:
            del k["checkpoint_after_s"]
    return out


def _event_times(log_dir: Path, pattern: str, events: tuple[str, ...]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {e: [] for e in events}
    for path in sorted(log_dir.glob(pattern)):
        for line in path.read_text(errors="replace").splitlines():
            m = _LINE.match(line)
            if m and m.group(3) in out:
                with contextlib.suppress(ValueError):
                    out[m.group(3)].append(_wall(m.group(1)))
    return out


def soak(args, work: Path, bootstrap: str, topic: str, recs: list, lab: NetnsLab | None,
         broker: RestartableBroker | None = None, mfs: MooseFSLab | None = None) -> dict:
    rng = random.Random(args.seed)
    cluster = Cluster(work / "soak", bootstrap, topic, env={**ENV, **(MFS_ENV if mfs else {})}, lab=lab,
                      agents=args.hosts or None, volumes=mfs.volumes() if mfs else None,
                      store_root=mfs.admin_dir / "checkpoints" if mfs else None,
                      store_io_timeout=60.0 if mfs else None)
    producer = Producer(bootstrap, topic, recs, rate=args.rate)
    faults: list[Fault] = []
    undo: list = []
    down = 0.0
    memory = MemoryWatch(cluster.runner)
    timeline: list[tuple[float, int]] = []

    def run_undo(item) -> None:
        when, action, fault = item
        undo.remove(item)
        try:
            action()
            if not fault.background:
                fault.ended(time.monotonic() - t0)
                print(f"[{fault.end:6.1f}s] undone: {fault.what}", flush=True)
        except Exception as exc:   # noqa: BLE001 - tried again: a quota cannot be removed while the master is down
            fault.undo_errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            print(f"[{time.monotonic() - t0:6.1f}s] undoing {fault.what} failed ({exc}); again in 5 s", flush=True)
            if len(fault.undo_errors) < 60:
                undo.append((time.monotonic() + 5.0, action, fault))
    try:
        cluster.start()
        stats = cluster.probe.stats

        def recording(*a, **kw):
            out = stats(*a, **kw)
            ledger = out[0].get("ledger") if out else None
            if ledger is not None:
                timeline.append((time.time(), ledger["offsets"]))
            return out
        cluster.probe.stats = recording
        memory.start()
        producer.start()
        t0 = time.monotonic()
        wall_t0 = time.time()
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
            for item in sorted((u for u in undo if u[0] <= now), key=lambda u: u[0]):
                run_undo(item)
            if now >= next_kill:
                fault, later = inject(rng, cluster, lab, args.hosts, now - t0, args.faults, broker, mfs)
                undo += [(t0 + when, action, f) for when, action, f in later]
                faults.append(fault)
                print(f"[{now - t0:6.1f}s] {fault.what}  (trained {last[1]} / produced {producer.sent})", flush=True)
                next_kill = now + rng.uniform(0.5, 1.5) * args.kill_every
        while undo:   # every fault undone before the drain (again, for what fails)
            item = min(undo, key=lambda u: u[0])
            time.sleep(max(0.0, min(item[0] - time.monotonic(), 5.0)))
            run_undo(item)
        if broker is not None and broker.restarting is not None:
            broker.restarting.join(timeout=300)
        producer.stop.set()
        producer.join(timeout=60)
        if producer.error is not None:
            print(f"producer: {producer.error!r}", flush=True)
        produced = producer.sent
        ledger = drain(cluster, produced, timeout=900)
        memory.stop.set()
        cluster.checkpoint_now()
        wall_end = time.time()
        quality = planted_quality(cluster.store)
        rollbacks = len(cluster.log_events("scheduler", "rollback_done"))
        checkpoints = len(cluster.log_events("scheduler", "checkpoint_done"))
        malformed = sum(1 for r in recs[:produced] if isinstance(r, bytes))
        log_dir = cluster.runner.log_dir
        ckpt_times = _event_times(log_dir, "livevec-scheduler-*.log", ("checkpoint_done",))["checkpoint_done"]
        storage = _event_times(log_dir, "livevec-*-*.log", ("checkpoint_storage_unavailable",))
        kafka = _event_times(log_dir, "livevec-worker-*.log", ("kafka_unreachable", "kafka_reachable"))
        return {"hosts": args.hosts or 1, "storage": "moosefs" if mfs else "local", "seed": args.seed,
                "fault_kinds": args.faults if lab is not None else ["kill"],
                "produced": produced, "malformed_produced": malformed,
                "trained_offsets": ledger["offsets"], "trained_records": ledger["records"],
                "trained_twice": ledger["overlaps"], "skipped": ledger["gaps"], "downtime_s": round(down, 1),
                "failures": [f"{f.start:.1f}s {f.what}" + (f" (undone at {f.end:.1f}s)" if f.end > f.start else "")
                             for f in faults],
                "faults": recovery(faults, timeline, ckpt_times,
                                   storage["checkpoint_storage_unavailable"], kafka),
                "rollbacks_logged": rollbacks, "checkpoints_logged": checkpoints,
                "memory": memory.report(), "quality": round(quality, 3),
                "log_lines": log_rates(read_logs(log_dir), (wall_t0, wall_end), faults)}
    finally:
        memory.stop.set()
        for _, action, _fault in undo:
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
    """After ``--duration`` seconds the producer stops, the cluster drains the backlog, and the script
    reports:

    * records produced against records trained (server 0's ledger: trained once, twice, or skipped),
      and the malformed records produced (counted and skipped by the workers, never lost or trained);
    * downtime: seconds during which the backlog was not empty and nothing was trained;
    * every failure injected, rollbacks, checkpoints;
    * each role's RSS at start and at end, and the largest growth of one process over its life
      (a leak shows as growth; a relaunched process starts again);
    * final quality (planted-neighbour score of the final checkpoint) against an uninterrupted run
      over the same records (a second consumer group on the same topic, no failures, on one host);
    * per fault kind: fired, skipped, recovered (training went on after the fault ended, and for the
      broker and storage faults a checkpoint completed after it), with the seconds each took;
    * per role (its tasks' logs summed, and its loudest task): warning and error lines per minute of
      the run and per minute of outage (the union of every fault's window, from its injection to 30 s
      after it was undone), the loudest events, and the same per fault kind.
    """
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of failures (600)")
    ap.add_argument("--kill-every", type=float, default=20.0, help="mean seconds between failures (20)")
    ap.add_argument("--rate", type=float, default=60.0, help="records per second produced (60; 10 lines each)")
    ap.add_argument("--hosts", type=int, default=0, help="network-namespace hosts (root; 0: one machine)")
    ap.add_argument("--link", default=None, help="with --hosts: every link's rate, e.g. 1gbit (default unshaped)")
    ap.add_argument("--faults", default=",".join(FAULT_KINDS),
                    help=f"with --hosts: the fault kinds drawn from, comma-separated (default: all: "
                         f"{','.join(FAULT_KINDS)}; kill,partition,host_loss,trickle draws the sequence of a soak "
                         f"without the broker and storage faults)")
    ap.add_argument("--storage", choices=("moosefs", "local"), default=None,
                    help="with --hosts: the checkpoints on the lab's MooseFS (default when a storage fault is drawn "
                         "or MooseFS can run here) or a local directory")
    ap.add_argument("--malformed-every", type=int, default=1000, help="one malformed record in every N (1000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--skip-reference", action="store_true", help="no uninterrupted run for the quality ratio")
    ap.add_argument("--json", type=Path, help="also write the result here")
    ap.add_argument("--work", type=Path, help="keep every process's log and the checkpoints here (default: a "
                    "temporary directory, removed)")
    args = ap.parse_args()
    import logging   # the soak's own producer: its Kafka client's retries during a broker restart are not news
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    args.faults = [k.strip() for k in args.faults.split(",") if k.strip()]
    unknown = sorted(set(args.faults) - set(FAULT_KINDS))
    if unknown or not args.faults:
        print(f"soak --faults: unknown kinds {unknown} (known: {', '.join(FAULT_KINDS)})", file=sys.stderr)
        return 2
    storage = args.storage
    if args.hosts:
        problem = lab_support_problem()
        if problem:
            print(f"soak --hosts: {problem}", file=sys.stderr)
            return 2
        mfs_problem = moosefs_support_problem()
        if storage is None:
            storage = "moosefs" if not mfs_problem else "local"
        if storage == "moosefs" and mfs_problem:
            print(f"soak --storage moosefs: {mfs_problem}", file=sys.stderr)
            return 2
        if storage == "local" and STORAGE_KINDS & set(args.faults):
            if args.storage == "local" or "--faults" in " ".join(sys.argv):
                print(f"soak: the storage faults ({', '.join(sorted(STORAGE_KINDS & set(args.faults)))}) need "
                      f"--storage moosefs", file=sys.stderr)
                return 2
            print(f"soak: no MooseFS ({mfs_problem}); checkpoints in a local directory, no storage faults",
                  file=sys.stderr)
            args.faults = [k for k in args.faults if k not in STORAGE_KINDS]
    recs = records(int(args.duration * args.rate) + 1, malformed_every=args.malformed_every)
    lab = NetnsLab(args.hosts + 1, lab_id=LAB_ID, link=args.link).start() if args.hosts else None
    result = None
    print(f"load average before: {open('/proc/loadavg').read().split()[:3]}", flush=True)
    load_before = open("/proc/loadavg").read().split()[:3]
    kafka_dir = Path(tempfile.mkdtemp(prefix="livevec-soak-kafka-"))
    mfs = None
    try:
        if lab is not None and storage == "moosefs":
            # a chunkserver on each group host, the mounts on every host (the probe's too)
            mfs = MooseFSLab(lab, kafka_dir.with_name(kafka_dir.name + "-mfs"), chunkservers=args.hosts).start()
            print(f"MooseFS: master {mfs.master_address}, {len(mfs.chunkserver_hosts)} chunkservers, checkpoints in "
                  f"{mfs.host_path}/checkpoints on every host", flush=True)
        broker = RestartableBroker(kafka_dir, lab.bridge_address if lab else "127.0.0.1")
        broker.start()
        try:
            topic = new_topic(broker.bootstrap)
            with (contextlib.nullcontext(str(args.work)) if args.work
                  else tempfile.TemporaryDirectory(prefix="livevec-soak-")) as tmp:
                result = soak(args, Path(tmp), broker.bootstrap, topic, recs, lab, broker, mfs)
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
            if broker.restarting is not None:
                broker.restarting.join(timeout=180)
            broker.stop()
    finally:
        if mfs is not None:
            mfs.close()
            shutil.rmtree(mfs.work.parent, ignore_errors=True)
        shutil.rmtree(kafka_dir, ignore_errors=True)
        if lab is not None:
            lab.close()
    result["load_average_before"] = load_before
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
