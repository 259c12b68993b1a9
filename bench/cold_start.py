"""Restarts from the image: a worker's time from its start to its first trained batch, and a front end's to ready.

    .venv/bin/python bench/cold_start.py [--rounds 3] [--dim 100] [--image livevec:0.1.0] [--compare]
        [--record FILE]

Every process starts as a fresh container of the image (``podman run --rm``, uid 10001, read-only root, a new
tmpfs on /tmp, so ``NUMBA_CACHE_DIR=/tmp/numba-cache`` is empty), launched by the local Marathon-like runner from
the committed topology, as Marathon would relaunch a task. ``--compare`` also runs each round with the image's
kernel cache hidden (an empty tmpfs over it): the processes then compile their kernels, as before the image
carried them.
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
    events = _events(log, offset) if log.exists() else []
    first = min((_at(e) for e in events), default=None)
    compiles = [e for e in events if e.get("event") == "kernel_compile"]
    cache = next((e for e in events if e.get("event") == "kernel_cache"), {})
    return {"seconds": seconds, "python_s": None if first is None else first - wall0,
            "compiles": len(compiles), "compile_s": sum(float(e.get("seconds", 0)) for e in compiles),
            "copied": cache.get("copied", "-"), "events": events, "wall0": wall0}


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
                        print(f"{mode:11s} round {r + 1} {app:8s} {got['seconds']:6.2f} s (first log line "
                              f"{got['python_s'] or float('nan'):.2f} s; {got['compiles']} kernels compiled in "
                              f"{got['compile_s']:.1f} s; {got['copied']} cache files copied{extra}) "
                              f"load {' '.join(map(str, loadavg()))}", flush=True)
    finally:
        producer.stop.set()
        broker.stop()
    return {"results": results, "load_start": load_start, "load_end": loadavg()}


def summary(out: dict, args) -> list[dict]:
    rows = []
    med = {mode: {app: statistics.median(r["seconds"] for r in runs) for app, runs in apps.items() if runs}
           for mode, apps in out["results"].items()}
    print(f"\nload average {out['load_start']} at the start, {out['load_end']} at the end; dim {args.dim}; "
          f"medians of {args.rounds} rounds")
    for mode, apps in med.items():
        compiled = {app: max(r["compiles"] for r in out["results"][mode][app]) for app in apps}
        print(f"  {mode:11s} worker start to first trained batch {apps['worker']:.2f} s, front end start to ready "
              f"{apps['frontend']:.2f} s (kernels compiled: worker {compiled['worker']}, front end "
              f"{compiled['frontend']})")
    if "image cache" in med:
        m = med["image cache"]
        base = med.get("no cache")
        value = (f"worker {m['worker']:.2f} s from its start to its first trained batch, front end {m['frontend']:.2f} s "
                 f"to ready (medians of {args.rounds} cold starts of the image, empty NUMBA_CACHE_DIR, d = {args.dim})")
        if base:
            value += f"; with the image's kernel cache hidden {base['worker']:.2f} s and {base['frontend']:.2f} s"
        rows.append(result_record.row("cold_start", value, f"worker <= {TARGET_S:.0f} s",
                                      result_record.met(m["worker"] <= TARGET_S)))
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
