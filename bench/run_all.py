"""Every benchmark in bench/, one after the other, then each one's ratio lines together.

    .venv/bin/python bench/run_all.py [--full] [--only ps_throughput,query_load] [--list]

By default each benchmark runs with small arguments, so the whole set finishes in a few
minutes (about 3 on this 2-core machine). That is a smoke run: it shows every
benchmark still starts, runs and prints its comparison, and gives ratios that are right
in kind but noisy. The figures in bench/README.md's table come from the commands in its rows;
``--full`` runs every script's own defaults (hours, mostly the 17M-token corpus and the 10-minute soak).

Benchmarks that read the corpus expect it where the scripts do, at ``../shared/data``
next to the repository; without it they are skipped with a message, not failed. Each
benchmark runs in its own process group, so a timeout stops everything it started
(Kafka, the local cluster). The exit status is non-zero if any benchmark failed.
"""
from __future__ import annotations

import argparse
import lzma
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
CORPUS = REPO.parent / "shared" / "data" / "wiki17m.txt.xz"
# Modules in bench/ that other benchmarks import; they are not benchmarks themselves.
LIBRARIES = {"recovery_cluster.py", "result_record.py", "results_table.py", "link_delay.py", Path(__file__).name}
SMALL_CORPUS_BYTES = 2_000_000   # about 330k words of the corpus: kafka_produce has no token limit


@dataclass(frozen=True)
class Bench:
    name: str
    quick: tuple[str, ...]          # small arguments; "{small_corpus}" is a cut of the corpus, "{tmp}" a scratch dir
    ratio_lines: str                # regex: the lines that compare against the same-run reference
    needs_corpus: bool = False
    timeout_s: float = 1200.0       # quick run only; --full has none


BENCHES = [
    Bench("ps_throughput", ("--min-time", "0.2"), r"x raw pyzmq"),
    Bench("checkpoint_numbers", ("--words", "20000", "--skip-cluster"), r"^\[.*\] \d+ words|checkpoints while|kill -9"),
    Bench("quality_vs_gensim", ("--max-tokens", "300000", "--epochs", "1", "--workers", "1"),
          r"^\s*\d+\s+(gensim|livevec|ratio)\s", needs_corpus=True),
    Bench("kafka_tls", ("--mb", "5", "--rounds", "1"), r"plaintext .*SASL_SSL|ratio", needs_corpus=True),
    Bench("kafka_produce", ("--starts", "1", "--corpus", "{small_corpus}"),
          r"^(compressed|plain text):|ratio to bare aiokafka|kafka start to ready", needs_corpus=True),
    Bench("query_load", ("--words", "20000", "--updates", "2000", "--duration", "2", "--concurrency", "16",
                         "--training", "local"), r"^ratio |req/s offered"),
    Bench("stream_throughput", ("--max-tokens", "200000"), r"^ratio livevec/gensim", needs_corpus=True),
    Bench("freshness", ("--trials", "3", "--warmup", "10"), r"^(visible|planted neighbour|top-1|target p99)"),
    Bench("frontend_fanout", ("--frontends", "0,1", "--warmup", "30", "--window", "10"),
          r"^per added front end|^\| \d+ \|"),
    Bench("soak", ("--duration", "30", "--kill-every", "10", "--skip-reference"),
          r'"(produced|trained_offsets|trained_twice|skipped|exactly_once|quality\w*)"'),
    Bench("containers_vs_processes", ("--lines", "5000", "--rounds", "1"), r"^ratio container/process|^words/s"),
    Bench("scaling", ("--quick",), r"^ratio shaped|workers on \d+ hosts:", timeout_s=900.0),
    Bench("cluster_links", ("--quick",), r"^\s+(RTT ms|direct|\d+(\.\d+)?)\s", needs_corpus=True, timeout_s=900.0),
    Bench("record_formats", ("--tokens", "100000", "--rounds", "1"), r"^(text8|tokens|unicode|JSON) .*x |MB/s per core"),
    Bench("record_pipeline", ("--tokens", "200000", "--rounds", "1"), r"^(text8|tokens|unicode|JSON) .*x "),
    Bench("cluster_learning", ("--max-tokens", "300000", "--workers", "2"),
          r"^livevec / gensim words/s|^(livevec pipeline|gensim workers=2) ", needs_corpus=True),
    Bench("replica_simulation", ("--workers", "4", "--sync-tokens", "10000", "--max-tokens", "200000", "--seeds"),
          r"^analogy ", needs_corpus=True),
    Bench("kernel_speed", ("--warm-tokens", "300000", "--batches", "10", "--reps", "2"),
          r"^ratio current / reference", needs_corpus=True),
    Bench("ivf_recall", ("--corpus", "{small_corpus}", "--cache", "{tmp}/ivf-recall", "--queries", "200",
                         "--top", "2000", "--settings", "32:0"), r"^\| 32 \|", needs_corpus=True),
    Bench("search_processes", ("--words", "200000", "--processes", "2", "--queries", "200"),
          r"queries one at a time|^search process"),
]


def unregistered() -> list[str]:
    """Scripts in bench/ that this runner does not know: a new benchmark must be added above."""
    known = {f"{b.name}.py" for b in BENCHES} | LIBRARIES
    return sorted(p.name for p in BENCH.glob("*.py") if p.name not in known)


def cut_corpus(corpus: Path, size: int, out: Path) -> Path:
    with lzma.open(corpus, "rb") as src:
        data = src.read(size)
    data = data[:max(data.rfind(b" "), data.rfind(b"\n"), 0)] + b"\n"   # whole words only
    with lzma.open(out, "wb") as dst:
        dst.write(data)
    return out


def run(bench: Bench, argv: list[str], timeout: float | None) -> tuple[int | None, list[str]]:
    """Run one benchmark, echoing its output as it comes; (exit code or None on timeout, lines)."""
    proc = subprocess.Popen([sys.executable, str(BENCH / f"{bench.name}.py"), *argv], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    timed_out = False

    def stop(sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def watchdog() -> None:
        nonlocal timed_out
        while proc.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                stop(signal.SIGTERM)       # the benchmarks stop their clusters on SIGTERM
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    stop(signal.SIGKILL)
                return
            time.sleep(0.5)

    threading.Thread(target=watchdog, daemon=True).start()
    try:
        for line in proc.stdout:
            print(f"  {line}", end="", flush=True)
            lines.append(line.rstrip("\n"))
        proc.wait()
    except KeyboardInterrupt:
        stop(signal.SIGTERM)
        proc.wait()
        raise
    return (None if timed_out else proc.returncode), lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="each benchmark's own defaults (the README's figures; hours)")
    ap.add_argument("--only", default="", help="comma list of benchmark names (default: all)")
    ap.add_argument("--list", action="store_true", help="print the benchmarks and their quick arguments")
    args = ap.parse_args()
    missing = unregistered()
    if missing:
        print(f"bench/run_all.py does not know {missing}: add them to BENCHES", file=sys.stderr)
        return 2
    chosen = [b for b in BENCHES if not args.only or b.name in args.only.split(",")]
    unknown = set(filter(None, args.only.split(","))) - {b.name for b in BENCHES}
    if unknown:
        print(f"unknown benchmarks {sorted(unknown)}; have {[b.name for b in BENCHES]}", file=sys.stderr)
        return 2
    if args.list:
        for b in chosen:
            print(f"{b.name:<20} {' '.join(b.quick)}{'  (needs ' + str(CORPUS) + ')' if b.needs_corpus else ''}")
        return 0

    outcomes: list[tuple[Bench, str, list[str]]] = []
    with tempfile.TemporaryDirectory(prefix="livevec-bench-all-") as tmp:
        small_corpus = None
        for i, bench in enumerate(chosen, 1):
            print(f"\n=== [{i}/{len(chosen)}] {bench.name}", flush=True)
            if bench.needs_corpus and not CORPUS.is_file():
                print(f"  skipped: needs the corpus at {CORPUS} (not found)", flush=True)
                outcomes.append((bench, "skipped (no corpus)", []))
                continue
            argv = []
            if not args.full:
                if "{small_corpus}" in bench.quick and small_corpus is None:
                    small_corpus = cut_corpus(CORPUS, SMALL_CORPUS_BYTES, Path(tmp) / "corpus-head.txt.xz")
                argv = [a.replace("{small_corpus}", str(small_corpus)).replace("{tmp}", tmp) for a in bench.quick]
            print(f"  $ python bench/{bench.name}.py {' '.join(argv)}", flush=True)
            t0 = time.monotonic()
            code, lines = run(bench, argv, None if args.full else bench.timeout_s)
            took = time.monotonic() - t0
            status = (f"timed out after {took:.0f} s" if code is None
                      else f"ok in {took:.0f} s" if code == 0 else f"failed (exit {code}) after {took:.0f} s")
            pattern = re.compile(bench.ratio_lines)
            outcomes.append((bench, status, [line for line in lines if pattern.search(line)]))

    print("\n=== ratios" + ("" if args.full else " (quick arguments: right in kind, noisy in value)"))
    for bench, status, ratio_lines in outcomes:
        print(f"{bench.name}: {status}")
        for line in ratio_lines or (["  (no ratio lines)"] if status.startswith("ok") else []):
            print(f"    {line.strip()}")
    failed = [b.name for b, status, _ in outcomes if not status.startswith(("ok", "skipped"))]
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
