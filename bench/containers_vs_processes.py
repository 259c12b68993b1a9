"""The committed Marathon group in containers (podman, host networking) against the same group
as bare processes, in the same run: each role's start-to-ready time and the group's words/s.

    .venv/bin/python bench/containers_vs_processes.py [--lines 20000] [--rounds 2] [--image livevec:0.1.0]

One broker; every round is a fresh group reading a fresh topic, into which the same corpus
(the generated sample corpus) is produced once the group is healthy, so that training
starts from an idle, ready group in both modes. Rounds alternate: process, container, container, process, ...
so that drift in the machine's load hits both alike. Start-to-ready is the runner's
``up_after_s``: from a task's launch to its first passing health and readiness checks (the
scheduler's TCP check, the servers' and workers' /health, the front end's /ready). Words/s
is the tokens the workers count (``livevec_worker_tokens_total``) from the first counted
token to the last. The load average is printed before and after: on a shared machine it
says how much the figures may be disturbed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recovery_cluster import new_topic, start_broker  # noqa: E402
from online.deployment.image_build import DEFAULT_TAG, build_image, podman  # noqa: E402
from online.deployment.local_runner import LocalRunner, describe  # noqa: E402
from online.deployment.marathon import GROUP_FILE  # noqa: E402
from online.stream.producer import produce  # noqa: E402
from online.stream.sample_corpus import generate_lines  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ROLES = ("scheduler", "server", "worker", "frontend")


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def tokens(runner: LocalRunner, workers: int) -> float:
    total = 0.0
    for i in range(workers):
        try:
            text = urllib.request.urlopen(runner.url("worker", "metrics", "/metrics", i), timeout=5).read().decode()
        except OSError:
            continue
        total += sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                     if line.startswith("livevec_worker_tokens_total"))
    return total


def one_round(mode: str, image: str, bootstrap: str, lines: list[str], expected: int, args, work: Path) -> dict:
    topic = new_topic(bootstrap, 4)
    env = {"LIVEVEC_KAFKA_BOOTSTRAP": bootstrap, "LIVEVEC_KAFKA_TOPICS": topic,
           "LIVEVEC_KAFKA_GROUP": f"g-{uuid.uuid4().hex[:8]}", "LIVEVEC_DIM": str(args.dim),
           "LIVEVEC_MIN_COUNT": "3", "PS_HEARTBEAT_INTERVAL": "1", "PS_HEARTBEAT_TIMEOUT": "10"}
    runner = LocalRunner.from_file(
        REPO / "deploy" / "marathon" / GROUP_FILE, work_dir=work / f"{mode}-{uuid.uuid4().hex[:6]}",
        containers=image if mode == "container" else None,
        instances={"server": args.servers, "worker": args.workers, "frontend": 1}, env=env,
        app_env={"frontend": {"LIVEVEC_HTTP_HOST": "127.0.0.1", "LIVEVEC_MODEL_SOURCE": "ps"}},
        volumes={"/mnt/mfs/livevec": work / f"mfs-{mode}-{uuid.uuid4().hex[:6]}"}, dependency_timeout=180)
    with runner:
        if not runner.wait_healthy(timeout=300):
            raise RuntimeError(f"{mode}: the group did not become healthy\n{describe(runner.status())}")
        up = {role: [s.up_after_s for s in runner.status() if s.app == role] for role in ROLES}
        produce(lines, bootstrap=bootstrap, topic=topic, lines_per_record=20, create_topic=False)
        first = last = None
        seen = 0.0
        deadline = time.monotonic() + args.timeout
        while seen < expected and time.monotonic() < deadline:
            now, seen = time.monotonic(), tokens(runner, args.workers)
            if seen > 0 and first is None:
                first = (now, seen)
            last = (now, seen)
            time.sleep(0.1)
        if seen < expected:
            raise RuntimeError(f"{mode}: {seen:.0f} of {expected} tokens trained in {args.timeout} s")
    rate = (last[1] - first[1]) / max(last[0] - first[0], 1e-9)
    return {"mode": mode, "up": up, "words_per_s": rate}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=20000, help="sample-corpus lines produced once")
    p.add_argument("--rounds", type=int, default=2, help="rounds of each mode, alternating")
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--image", default=DEFAULT_TAG)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a round may take to train everything")
    args = p.parse_args(argv)
    print(f"load average before: {loadavg()}", flush=True)
    print(build_image(args.image, engine=podman(), say=lambda line: print(line, flush=True)).summary(), flush=True)
    broker = start_broker()
    results = []
    try:
        lines = generate_lines(args.lines, seed=3)
        expected = sum(len(line.split()) for line in lines)
        order = [m for r in range(args.rounds) for m in (("process", "container") if r % 2 == 0
                                                          else ("container", "process"))]
        with tempfile.TemporaryDirectory(prefix="bench-containers-") as tmp:
            for mode in order:
                res = one_round(mode, args.image, broker.bootstrap, lines, expected, args, Path(tmp))
                results.append(res)
                ups = "  ".join(f"{r}={max(v):.2f}s" for r, v in res["up"].items())
                print(f"round {len(results)} {mode:<9} words/s={res['words_per_s']:,.0f}  start-to-ready: {ups}  "
                      f"load {loadavg()}", flush=True)
    finally:
        broker.stop()
    print(f"\n{expected:,} tokens per round, {args.servers} servers, {args.workers} workers, dim {args.dim}")
    print(f"{'role':<10} {'process s':>10} {'container s':>12}   (median over rounds of the slowest instance)")
    for role in ROLES:
        med = {m: statistics.median(max(r["up"][role]) for r in results if r["mode"] == m)
               for m in ("process", "container")}
        print(f"{role:<10} {med['process']:>10.2f} {med['container']:>12.2f}")
    wps = {m: statistics.median(r["words_per_s"] for r in results if r["mode"] == m) for m in ("process", "container")}
    print(f"words/s    {wps['process']:>10,.0f} {wps['container']:>12,.0f}")
    print(f"ratio container/process words/s: {wps['container'] / wps['process']:.2f}")
    print(f"load average after: {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
