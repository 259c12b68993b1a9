"""Restarts from the image: a worker's time from its start to its first trained batch, and a front end's to ready.

    .venv/bin/python bench/cold_start.py [--rounds 3] [--dim 100] [--image TAG] [--compare] [--record FILE]

Every process starts as a fresh container of the image (``podman run --rm``, uid 10001, read-only root, a new
tmpfs on /tmp, so ``NUMBA_CACHE_DIR=/tmp/numba-cache`` is empty), relaunched by the local Marathon-like runner in a
running group from the committed topology (a scheduler, a server, a worker and a front end), as Marathon relaunches
a task, while a producer streams. Each round stops the worker and starts it again, then the front end. A worker's
time runs to its first batch trained and acknowledged by the servers (``livevec_worker_batches_total`` above 0), a
front end's to ``/ready``; both from the container's launch and from its process's start (podman's ``StartedAt``).
``--compare`` also runs every round with the image's kernel cache hidden (an empty tmpfs over it): the processes
then compile their kernels, as before the image carried them.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import result_record  # noqa: E402
from recovery_cluster import Producer, new_topic, start_broker  # noqa: E402

from online.deployment.containers import ContainerLauncher  # noqa: E402
from online.deployment.image_build import DEFAULT_TAG, build_image, podman  # noqa: E402
from online.deployment.local_runner import LocalRunner, describe  # noqa: E402
from online.deployment.topology import default_topology  # noqa: E402
from online.learner.kernel_cache import SEED  # noqa: E402
from online.stream.sample_corpus import iter_sentences  # noqa: E402

IMAGE_SEED = Path("/opt/livevec") / SEED.relative_to(sys.prefix)   # the seed's place in the image's virtualenv
TARGET_S = 5.0   # a worker's start to its first trained batch


class SeedHidden(ContainerLauncher):
    """Containers of the image with an empty tmpfs over its kernel cache: every kernel compiles at start."""

    def run_argv(self, task, spec, env):
        argv = super().run_argv(task, spec, env)
        at = argv.index("run") + 1
        return [*argv[:at], "--tmpfs", f"{IMAGE_SEED}:rw,size=16m,notmpcopyup", *argv[at:]]


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _metric(url: str, name: str) -> float | None:
    """The sum of a metric's samples, None while the process does not answer."""
    try:
        text = urllib.request.urlopen(url, timeout=2).read().decode()
    except OSError:
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def _ready(url: str) -> bool:
    try:
        return b'"ready":true' in urllib.request.urlopen(url, timeout=2).read().replace(b" ", b"")
    except OSError:
        return False


def _events(path: Path, offset: int) -> list[dict]:
    """The ``key=value`` fields of every log line written since ``offset``."""
    with open(path, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    return [dict(re.findall(r'(\w+)=("[^"]*"|\S+)', line)) for line in text.splitlines() if "event=" in line]


def _at(event: dict) -> float:
    return datetime.strptime(event["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def _restart(runner: LocalRunner, app: str, wait, timeout: float) -> dict:
    """Scale ``app`` to 0 and back to 1; the seconds from the launch to ``wait(runner)``, and the new task's log."""
    runner.scale(app, 0)
    log = runner.log_dir / f"livevec-{app}-0.log"
    offset = log.stat().st_size if log.exists() else 0
    t0, wall0 = time.monotonic(), time.time()
    runner.scale(app, 1)
    deadline = t0 + timeout
    while not wait(runner):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{app}: not there in {timeout:.0f} s\n{describe(runner.status())}")
        time.sleep(0.02)
    seconds = time.monotonic() - t0
    started = _started_at(runner, app)
    events = _events(log, offset) if log.exists() else []
    first = min((_at(e) for e in events), default=None)
    compiles = [e for e in events if e.get("event") == "kernel_compile"]
    cache = next((e for e in events if e.get("event") == "kernel_cache"), {})
    return {"seconds": seconds, "from_process_s": None if started is None else wall0 + seconds - started,
            "python_s": None if first is None else first - wall0,
            "compiles": len(compiles), "compile_s": sum(float(e.get("seconds", 0)) for e in compiles),
            "copied": cache.get("copied", "-"), "events": events, "wall0": wall0}


def _started_at(runner: LocalRunner, app: str) -> float | None:
    """When the task's container started its process (podman's ``State.StartedAt``), as a Unix time."""
    name = next((s.container for s in runner.status() if s.app == app and s.container), None)
    done = podman().run("inspect", "--format", "{{.State.StartedAt.UnixNano}}", name, check=False) if name else None
    text = done.stdout.strip() if done is not None and done.returncode == 0 else ""
    return int(text) / 1e9 if text.isdigit() else None


def _worker_trained(runner: LocalRunner) -> bool:
    batches = _metric(runner.url("worker", "metrics", "/metrics"), "livevec_worker_batches_total")
    return bool(batches)


def _frontend_ready(runner: LocalRunner) -> bool:
    return _ready(runner.url("frontend", "http", "/ready"))


def _worker_steps(result: dict) -> str:
    """When the worker's own log says it got to each step, from its container's launch."""
    steps = []
    for name in ("kernel_cache", "kernel_compiled", "worker_ready"):
        event = next((e for e in result["events"] if e.get("event") == name), None)
        if event is not None:
            steps.append(f"{name} {_at(event) - result['wall0']:.2f}")
    return ", ".join(steps)


def run(args) -> dict:
    image = args.image
    if not args.no_build:
        print(build_image(image, engine=podman()).summary(), flush=True)
    work = Path(tempfile.mkdtemp(prefix="livevec-cold-"))
    broker = start_broker()
    topic = new_topic(broker.bootstrap, 4)
    producer = Producer(broker.bootstrap, topic, iter_sentences(7), rate=args.rate)
    producer.start()
    env = {"LIVEVEC_KAFKA_BOOTSTRAP": broker.bootstrap, "LIVEVEC_KAFKA_TOPICS": topic,
           "LIVEVEC_KAFKA_GROUP": f"g-{uuid.uuid4().hex[:8]}", "LIVEVEC_DIM": str(args.dim),
           "PS_HEARTBEAT_INTERVAL": "0.5", "PS_HEARTBEAT_TIMEOUT": "3", "LIVEVEC_KAFKA_SESSION_TIMEOUT_MS": "6000"}
    modes = ["image cache", "no cache"] if args.compare else ["image cache"]
    results: dict[str, dict[str, list[dict]]] = {m: {"worker": [], "frontend": []} for m in modes}
    load_start = loadavg()
    try:
        for mode in modes:
            launcher = (SeedHidden if mode == "no cache" else ContainerLauncher)(image, client_env=os.environ)
            runner = LocalRunner.from_topology(
                default_topology(servers=1, workers=1, frontends=1), work_dir=work / mode.replace(" ", "-"),
                env=env, app_env={"frontend": {"LIVEVEC_HTTP_HOST": "127.0.0.1", "LIVEVEC_MODEL_SOURCE": "ps"}},
                instances={"server": 1, "worker": 1, "frontend": 1, "producer-example": 0},
                volumes={"/mnt/mfs": work / f"shared-{mode.replace(' ', '-')}"}, launcher=launcher,
                dependency_timeout=300)
            with runner:
                if not runner.wait_healthy(timeout=600):
                    raise RuntimeError(f"the group did not become healthy\n{describe(runner.status())}")
                for r in range(args.rounds):
                    for app, wait in (("worker", _worker_trained), ("frontend", _frontend_ready)):
                        got = _restart(runner, app, wait, args.timeout)
                        results[mode][app].append(got)
                        extra = f"; {_worker_steps(got)}" if app == "worker" else ""
                        print(f"{mode:11s} round {r + 1} {app:8s} {got['seconds']:6.2f} s from its launch, "
                              f"{got['from_process_s'] or float('nan'):.2f} s from its process's start (first log line "
                              f"{got['python_s'] or float('nan'):.2f} s; {got['compiles']} kernels compiled in "
                              f"{got['compile_s']:.1f} s; {got['copied']} cache files copied{extra}) "
                              f"load {' '.join(map(str, loadavg()))}", flush=True)
    finally:
        producer.stop.set()
        broker.stop()
    return {"results": results, "load_start": load_start, "load_end": loadavg()}


def _median(runs: list[dict], key: str) -> float:
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.median(values) if values else float("nan")


def summary(out: dict, args) -> list[dict]:
    """Medians per mode and role, printed; the result row (``result_record``) of the image as built."""
    rows = []
    med = {mode: {app: {key: _median(runs, key) for key in ("seconds", "from_process_s")}
                  for app, runs in apps.items() if runs} for mode, apps in out["results"].items()}
    print(f"\nload average {out['load_start']} at the start, {out['load_end']} at the end; dim {args.dim}; "
          f"medians of {args.rounds} rounds, from the container's launch (from the process's start)")
    for mode, apps in med.items():
        compiled = {app: max(r["compiles"] for r in out["results"][mode][app]) for app in apps}
        print(f"  {mode:11s} worker start to first trained batch {apps['worker']['seconds']:.2f} s "
              f"({apps['worker']['from_process_s']:.2f} s), front end start to ready {apps['frontend']['seconds']:.2f} s "
              f"({apps['frontend']['from_process_s']:.2f} s); kernels compiled: worker {compiled['worker']}, "
              f"front end {compiled['frontend']}")
    if "image cache" in med:
        m, base = med["image cache"], med.get("no cache")
        value = (f"worker {m['worker']['seconds']:.2f} s from its container's launch to its first trained batch "
                 f"({m['worker']['from_process_s']:.2f} s from its process's start), front end "
                 f"{m['frontend']['seconds']:.2f} s to ready ({m['frontend']['from_process_s']:.2f} s); medians of "
                 f"{args.rounds} cold starts of the image, empty NUMBA_CACHE_DIR, d = {args.dim}")
        if base:
            value += (f"; with the image's kernel cache hidden {base['worker']['seconds']:.2f} s and "
                      f"{base['frontend']['seconds']:.2f} s")
        rows.append(result_record.row("cold_start", value, f"worker <= {TARGET_S:.0f} s from its start",
                                      result_record.met(m["worker"]["seconds"] <= TARGET_S)))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", default=DEFAULT_TAG)
    p.add_argument("--no-build", action="store_true", help="use the tagged image as it is (default: make image first)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--rate", type=float, default=300.0, help="lines per second produced while the bench runs")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds a restarted role may take")
    p.add_argument("--compare", action="store_true", help="also run with the image's kernel cache hidden")
    p.add_argument("--record", default=None, help="write the result file (bench/result_record.py)")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # the broker and the containers are stopped then
    record = result_record.start(args.record, "cold_start")
    out = run(args)
    result_record.write(record, summary(out, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
