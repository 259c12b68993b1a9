"""The whole pipeline on each record format and tokenizer against ``text8``, in one run.

    .venv/bin/python bench/record_pipeline.py [--tokens 3000000] [--rounds 3] [--streams ids,text]

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
batch's preparation, the exchange). The ``text`` streams (``record_formats``' English sample corpus, 10 lines a
record, and its Chinese and Japanese records) compare ``unicode`` on English, JSON records of English text
(field ``text``, ``text8``), and ``unicode`` on Chinese and on Japanese with ``text8`` on the English records.
Rounds run a stream's cases in turn, in rotating order; a figure is the median.
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

from record_formats import CHINESE, JAPANESE, cjk, english, letters, sessions  # noqa: E402
from stream_throughput import run_pipeline  # noqa: E402

from online.learner.tokenizers import Tokenizer  # noqa: E402
from online.stream.batches import decode_records  # noqa: E402
from online.stream.records import RecordFormat  # noqa: E402

JSON_ITEMS = {"LIVEVEC_RECORD_FORMAT": "json", "LIVEVEC_RECORD_FIELD": "items"}
JSON_TEXT = {"LIVEVEC_RECORD_FORMAT": "json", "LIVEVEC_RECORD_FIELD": "text"}


def id_cases(tokens: int) -> dict[str, tuple[str, dict, list[str]]]:
    """name -> (tokenizer, more settings, records): the same sessions spelt three ways."""
    ids = sessions(tokens)
    return {"text8 ID text (letters)": ("text8", {}, [" ".join(map(letters, s["items"])) for s in ids]),
            "tokens ID text": ("tokens", {}, [" ".join(s["items"]) for s in ids]),
            "JSON ID sessions (tokens)": ("tokens", JSON_ITEMS, [json.dumps(s) for s in ids])}


def text_cases(tokens: int) -> dict[str, tuple[str, dict, list[str]]]:
    en = english(tokens)
    per_char = {}
    for name, pool in (("zh", CHINESE), ("ja", JAPANESE)):
        sample = cjk(pool, 20_000, seed=1)
        per_char[name] = sum(len(s) for s in sample) / Tokenizer("unicode").spans(sample).num_tokens
    return {"text8 English": ("text8", {}, en),
            "unicode English": ("unicode", {}, en),
            "JSON English text (text8)": ("text8", JSON_TEXT,
                                          [json.dumps({"user": i, "text": r}) for i, r in enumerate(en)]),
            "unicode Chinese": ("unicode", {}, cjk(CHINESE, int(tokens * per_char["zh"]), seed=2)),
            "unicode Japanese": ("unicode", {}, cjk(JAPANESE, int(tokens * per_char["ja"]), seed=2))}


STREAMS = {"ids": (id_cases, "text8 ID text (letters)"), "text": (text_cases, "text8 English")}


def tokens_of(tokenizer: str, settings: dict, records: list[str]) -> int:
    """Tokens the workers will count: the records read as the stream reads them, then tokenised."""
    fmt = RecordFormat(settings.get("LIVEVEC_RECORD_FORMAT", "text"), settings.get("LIVEVEC_RECORD_FIELD", ""))
    texts = [t for t, reason in decode_records([r.encode() for r in records], 1 << 20, fmt) if reason is None]
    return Tokenizer(tokenizer).spans(texts).num_tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=3_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", default="ids,text", help="ids, text or both (ids,text)")
    parser.add_argument("--batch-records", type=int, default=500,
                        help="LIVEVEC_KAFKA_BATCH_RECORDS (the default: 500 records)")
    parser.add_argument("--work-dir", default=None)
    args = parser.parse_args()
    streams = [s for s in args.streams.split(",") if s]
    unknown = [s for s in streams if s not in STREAMS]
    if unknown or not streams:
        raise SystemExit(f"--streams: expected some of {', '.join(STREAMS)}, got {args.streams!r}")
    print(f"load average at the start {os.getloadavg()}", flush=True)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="livevec-bench-records-"))
    summary = {}
    for stream in streams:
        make, reference = STREAMS[stream]
        cases = make(args.tokens)
        names = list(cases)
        counted = {name: tokens_of(*cases[name]) for name in names}
        print(f"{stream}: " + ", ".join(f"{name} {counted[name]:,} tokens in {len(cases[name][2]):,} records"
                                        for name in names), file=sys.stderr, flush=True)
        results: dict[str, list[dict]] = {name: [] for name in names}
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                tokenizer, settings, records = cases[name]
                env = {"LIVEVEC_TOKENIZER": tokenizer, **settings}
                run = run_pipeline(records, counted[name], work / f"{stream}-r{r}-{names.index(name)}",
                                   args.batch_records, 10_000, env)
                worker_cpu = sum(v for k, v in run["cpu_seconds"].items() if k.startswith("worker"))
                run["worker_cpu_per_token_us"] = worker_cpu / counted[name] * 1e6
                results[name].append(run)
                print(f"  round {r + 1} {name}: {run['words_per_second']:,.0f} words/s, "
                      f"worker CPU {run['worker_cpu_per_token_us']:.2f} us/token", file=sys.stderr, flush=True)
        ref = statistics.median(x["words_per_second"] for x in results[reference])
        ref_cpu = statistics.median(x["worker_cpu_per_token_us"] for x in results[reference])
        print(f"\n{'case':<28}{'tokens':>11}{'words/s':>12}{'ratio':>8}{'worker us/token':>17}{'ratio (CPU)':>13}"
              f"   rounds' ratios (reference: {reference})")
        for name in names:
            wps = statistics.median(x["words_per_second"] for x in results[name])
            cpu = statistics.median(x["worker_cpu_per_token_us"] for x in results[name])
            per_round = [x["words_per_second"] / y["words_per_second"]
                         for x, y in zip(results[name], results[reference])]
            summary[name] = {"tokens": counted[name], "words_per_second": wps, "ratio": wps / ref,
                             "worker_cpu_per_token_us": cpu, "cpu_ratio": ref_cpu / cpu, "round_ratios": per_round,
                             "reference": reference}
            print(f"{name:<28}{counted[name]:>11,}{wps:>12,.0f}{wps / ref:>7.2f}x{cpu:>17.2f}{ref_cpu / cpu:>12.2f}x   "
                  + " ".join(f"{x:.2f}" for x in per_round))
    print(f"load average at the end {os.getloadavg()}")
    print(json.dumps({"bench": "record_pipeline", "summary": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
