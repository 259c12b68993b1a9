"""The whole pipeline on an ID stream: JSON sessions and ``tokens`` text against ``text8``, in one run.

    .venv/bin/python bench/record_pipeline.py [--tokens 3000000] [--rounds 3]

``record_formats.py`` times what a worker's thread does with records; this one runs what users run
(``stream_throughput.run_pipeline``: a real Kafka broker, the topic filled before the clock starts, 1 server and
2 workers through ``livevec up``'s local runner, words/s from the first acknowledged batch to the last token) on
three spellings of the same generated shopping sessions (``online.stream.sample_sessions``, one session a
record, about 5 IDs each):

- ``text8`` on the IDs spelt in letters (``sku-10417`` -> ``skubaebh``, so that ``text8`` keeps each one
  token): the reference;
- ``tokens`` on the IDs as sent (``sku-10417 sku-tent-2p ...``);
- JSON sessions (``{"user": ..., "items": [...]}``, ``LIVEVEC_RECORD_FORMAT=json``, field ``items``): what
  ``livevec up --demo sessions`` streams.

The three carry the same tokens, sentences and vocabulary distribution, so the kernel's work is the same and a
ratio is what the record format and the tokenizer cost through the whole pipeline (Kafka's fetch and decode, the
batch's preparation, the exchange). Rounds run the cases in turn, in rotating order; a figure is the median.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_formats import letters, sessions  # noqa: E402
from stream_throughput import run_pipeline  # noqa: E402

CASES = {
    "text8 ID text (letters)": ({"LIVEVEC_TOKENIZER": "text8"}, lambda s: " ".join(map(letters, s["items"]))),
    "tokens ID text": ({"LIVEVEC_TOKENIZER": "tokens"}, lambda s: " ".join(s["items"])),
    "JSON ID sessions (tokens)": ({"LIVEVEC_TOKENIZER": "tokens", "LIVEVEC_RECORD_FORMAT": "json",
                                   "LIVEVEC_RECORD_FIELD": "items"}, json.dumps),
}
REFERENCE = "text8 ID text (letters)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=3_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-records", type=int, default=500,
                        help="LIVEVEC_KAFKA_BATCH_RECORDS (the default: 500 sessions, about 2,500 tokens)")
    parser.add_argument("--work-dir", default=None)
    args = parser.parse_args()
    ids = sessions(args.tokens)
    tokens = sum(len(s["items"]) for s in ids)
    print(f"{len(ids):,} sessions, {tokens:,} tokens; load average {os.getloadavg()}", file=sys.stderr, flush=True)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="livevec-bench-records-"))
    names = list(CASES)
    results: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            env, spell = CASES[name]
            lines = [spell(s) for s in ids]
            run = run_pipeline(lines, tokens, work / f"r{r}-{names.index(name)}", args.batch_records, 10_000, env)
            worker_cpu = sum(v for k, v in run["cpu_seconds"].items() if k.startswith("worker"))
            run["worker_cpu_per_token_us"] = worker_cpu / tokens * 1e6
            results[name].append(run)
            print(f"  round {r + 1} {name}: {run['words_per_second']:,.0f} words/s, "
                  f"worker CPU {run['worker_cpu_per_token_us']:.2f} us/token", file=sys.stderr, flush=True)
    ref = statistics.median(x["words_per_second"] for x in results[REFERENCE])
    ref_cpu = statistics.median(x["worker_cpu_per_token_us"] for x in results[REFERENCE])
    print(f"\nload average at the end {os.getloadavg()}")
    print(f"{'case':<28}{'words/s':>12}{'ratio':>8}{'worker us/token':>17}{'ratio (CPU)':>13}   rounds' ratios")
    summary = {}
    for name in names:
        wps = statistics.median(x["words_per_second"] for x in results[name])
        cpu = statistics.median(x["worker_cpu_per_token_us"] for x in results[name])
        per_round = [x["words_per_second"] / y["words_per_second"] for x, y in zip(results[name], results[REFERENCE])]
        summary[name] = {"words_per_second": wps, "ratio": wps / ref, "worker_cpu_per_token_us": cpu,
                         "cpu_ratio": ref_cpu / cpu, "round_ratios": per_round}
        print(f"{name:<28}{wps:>12,.0f}{wps / ref:>7.2f}x{cpu:>17.2f}{ref_cpu / cpu:>12.2f}x   "
              + " ".join(f"{x:.2f}" for x in per_round))
    print(json.dumps({"bench": "record_pipeline", "tokens": tokens, "sessions": len(ids), "summary": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
