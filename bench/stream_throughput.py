"""Words/s through the whole pipeline (Kafka -> 2 workers -> 1 server) against gensim, in one run.

    python bench/stream_throughput.py [--corpus ../shared/data/wiki17m.txt.xz] [--max-tokens 2000000]

1. A real Kafka broker; the corpus (its first ``--max-tokens`` tokens) is produced into a
   4-partition topic BEFORE the clock starts.
2. The production Marathon group runs through the local runner (``livevec up``'s path) with
   1 server and 2 workers (no front end). Throughput is measured from the first acknowledged
   batch (the consumer group has formed and the kernels are compiled) until the workers have
   trained every produced token; the start-up time before that is reported separately.
3. gensim Word2Vec (skip-gram, same hyper-parameters, workers=2, one epoch) trains on the
   same text in this process, after the cluster is stopped, so they do not share the cores.
4. Prints words/s of both, the ratio, the CPU seconds each role used (from /proc), and where
   a worker's batch time goes (pull and push round trips vs the rest, from its metrics).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from online.stream.kafka_broker import KafkaBroker  # noqa: E402
from online.stream.settings import KafkaBrokerSettings  # noqa: E402
from online.stream.producer import TextSource, produce  # noqa: E402
from online.learner.tokenizers import text8_tokens  # noqa: E402
from online.cli.up import local_cluster  # noqa: E402

DEFAULT_CORPUS = REPO.parent / "shared" / "data" / "wiki17m.txt.xz"


def read_prefix(path: Path, max_tokens: int, words_per_line: int = 1000) -> list[str]:
    """The corpus's first ``max_tokens`` tokens as lines of ``words_per_line`` words (Kafka records)."""
    lines, n = [], 0
    source = TextSource(str(path))
    try:
        while n < max_tokens and (chunk := source.read_chunk()):
            for raw in chunk:
                toks = text8_tokens(raw.decode("utf-8", "replace"))
                for i in range(0, len(toks), words_per_line):
                    piece = toks[i:i + words_per_line][:max_tokens - n]
                    if piece:
                        lines.append(" ".join(piece))
                        n += len(piece)
                if n >= max_tokens:
                    break
    finally:
        source.close()
    return lines


def scrape(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in urllib.request.urlopen(url, timeout=5).read().decode().splitlines():
        if line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            name = re.sub(r"\{.*\}", "", name_labels)
            if "_bucket" in name:
                continue
            out[name] = out.get(name, 0.0) + float(value)
    return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_pipeline(lines: list[str], tokens: int, work: Path, batch_records: int, batch_words: int,
                 env: dict[str, str] | None = None) -> dict:
    """``env``: more settings of every task (a record format, a tokenizer)."""
    with KafkaBroker(KafkaBrokerSettings.from_env()) as broker:
        t = time.perf_counter()
        produce(lines, bootstrap=broker.bootstrap, topic="bench", partitions=4, create_topic=True)
        produce_s = time.perf_counter() - t
        runner = local_cluster(work, broker.bootstrap, "bench", servers=1, workers=2, frontend=False,
                               env={"LIVEVEC_KAFKA_GROUP": "bench", "LIVEVEC_KAFKA_BATCH_RECORDS": str(batch_records),
                                    "LIVEVEC_BATCH_WORDS": str(batch_words), **(env or {})})
        runner.start()
        try:
            if not runner.wait_healthy(timeout=180):
                raise SystemExit(f"cluster did not come up; logs in {runner.log_dir}")
            tasks = {f"{s.app}{s.index}": s for s in runner.status()}
            cpu0 = {name: cpu_seconds(s.pid) for name, s in tasks.items() if s.pid}
            worker_metrics = [runner.url("worker", "metrics", "/metrics", index=i) for i in range(2)]
            t0 = time.perf_counter()
            last_print = t0
            first = None   # (time, tokens) when the first batches were acknowledged: the group has formed
            while True:
                # Every token read is counted by the worker that trained it (the servers count
                # only words that reached min_count).
                counted = sum(scrape(u).get("livevec_worker_tokens_total", 0.0) for u in worker_metrics)
                now = time.perf_counter()
                if first is None and counted > 0:
                    first = (now, counted)
                if counted >= tokens:
                    break
                if now - last_print > 5:
                    print(f"  pipeline: {counted / tokens:6.1%} of {tokens:,} tokens, "
                          f"{counted / (now - t0):,.0f} words/s", file=sys.stderr, flush=True)
                    last_print = now
                if now - t0 > 1800:
                    raise SystemExit("pipeline did not finish within 30 min")
                time.sleep(0.2)
            end = time.perf_counter()
            elapsed = end - t0
            steady = (tokens - first[1]) / max(end - first[0], 1e-9)
            cpu = {name: cpu_seconds(s.pid) - cpu0.get(name, 0.0) for name, s in tasks.items() if s.pid}
            workers = [scrape(runner.url("worker", "metrics", "/metrics", index=i)) for i in range(2)]
        finally:
            runner.stop()
    kept = sum(w.get("livevec_worker_words_trained_total", 0) for w in workers)
    batch_s = sum(w.get("livevec_worker_batch_seconds_sum", 0) for w in workers)
    pull_s = sum(w.get("livevec_worker_pull_seconds_sum", 0) for w in workers)
    push_s = sum(w.get("livevec_worker_push_seconds_sum", 0) for w in workers)
    return {"seconds": elapsed, "startup_seconds": first[0] - t0, "words_per_second": steady,
            "words_per_second_including_startup": tokens / elapsed,
            "effective_words_per_second": steady * kept / tokens,
            "produce_seconds": produce_s, "cpu_seconds": cpu,
            "batch_time_split": {"pull_round_trip": pull_s / batch_s if batch_s else 0.0,
                                 "push_round_trip": push_s / batch_s if batch_s else 0.0,
                                 "tokenise_vocab_sample_kernel": 1 - (pull_s + push_s) / batch_s if batch_s else 0.0}}


def run_gensim(lines: list[str]) -> dict:
    from gensim.models import Word2Vec
    sentences = [line.split() for line in lines]
    model = Word2Vec(vector_size=100, window=5, negative=5, min_count=5, sample=1e-3, sg=1, workers=2, seed=1)
    model.build_vocab(sentences)
    t0 = time.perf_counter()
    effective, raw = model.train(sentences, total_examples=model.corpus_count, epochs=1)
    elapsed = time.perf_counter() - t0
    return {"seconds": elapsed, "words_per_second": raw / elapsed, "effective_words_per_second": effective / elapsed}


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # run the finally blocks: stop the cluster
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--max-tokens", type=int, default=2_000_000)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--batch-records", type=int, default=10,
                        help="records (of <= 1000 words) per Kafka batch of a worker (10 = about 10k words)")
    parser.add_argument("--batch-words", type=int, default=10_000,
                        help="LIVEVEC_BATCH_WORDS of the workers: most tokens per pull/push mini-batch")
    args = parser.parse_args()
    if not Path(args.corpus).is_file():
        raise SystemExit(f"no corpus at {args.corpus} (pass --corpus)")
    lines = read_prefix(Path(args.corpus), args.max_tokens)
    tokens = sum(len(line.split()) for line in lines)
    print(f"corpus: {tokens:,} tokens in {len(lines):,} records of <= 1000 words", file=sys.stderr)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="livevec-bench-stream-"))
    pipe = run_pipeline(lines, tokens, work, args.batch_records, args.batch_words)
    gens = run_gensim(lines)
    ratio = pipe["words_per_second"] / gens["words_per_second"]
    eff_ratio = pipe["effective_words_per_second"] / gens["effective_words_per_second"]
    print(f"\n{'system':<34}{'seconds':>9}{'words/s':>12}{'effective/s':>13}")
    print(f"{'livevec pipeline (1 srv, 2 wrk)':<34}{pipe['seconds']:>9.1f}{pipe['words_per_second']:>12,.0f}"
          f"{pipe['effective_words_per_second']:>13,.0f}")
    print(f"{'gensim workers=2':<34}{gens['seconds']:>9.1f}{gens['words_per_second']:>12,.0f}"
          f"{gens['effective_words_per_second']:>13,.0f}")
    print(f"ratio livevec/gensim: {ratio:.2f}x words/s, {eff_ratio:.2f}x effective words/s "
          f"(pipeline start-up before the first acknowledged batch: {pipe['startup_seconds']:.1f} s)")
    print("CPU seconds per role during the run:", {k: round(v, 1) for k, v in pipe["cpu_seconds"].items()})
    print("worker batch time:", {k: f"{v:.0%}" for k, v in pipe["batch_time_split"].items()})
    print(json.dumps({"bench": "stream_throughput", "tokens": tokens, "livevec": pipe, "gensim": gens,
                      "ratio_words_per_second": ratio, "ratio_effective_words_per_second": eff_ratio}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
