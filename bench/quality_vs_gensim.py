"""livevec's learner against gensim on the same corpus: quality and words/s, in one run.

    .venv/bin/python bench/quality_vs_gensim.py [--corpus ../shared/data/wiki17m.txt.xz]
        [--max-tokens N] [--epochs 1,5] [--workers 1] [--rounds N] [--kernel pairs,hogbatch]
        [--record bench/results/train_vs_gensim.json]

``--kernel`` names livevec's in-place kernel (``LIVEVEC_KERNEL``); with two or more (``pairs,hogbatch``)
each is a system of its own, ``livevec-pairs``, ``livevec-hogbatch``, trained in the same alternation and
compared with gensim.

Both systems see the same text (the corpus is decompressed once, cut at ``--max-tokens``,
into a temporary plain file), the same hyper-parameters (skip-gram, d=100, window 5,
negative 5, min_count 5, sample 1e-3) and the same number of passes and worker threads.
Both are evaluated with gensim's own code on the sets bundled in its wheel:
``questions-words.txt`` (restrict_vocab=30000), ``wordsim353.tsv`` and ``simlex999.txt``;
livevec's vectors are read back from the ``vectors.bin`` file ``livevec train`` writes.

Throughput: gensim's rate is its ``train()`` calls alone (vocabulary scan excluded), while
livevec's covers everything (it counts the vocabulary while it trains), so the ratio is
conservative. The two systems alternate pass by pass, so that both see the same load from
other jobs on a shared machine; CPU seconds are reported too (words per CPU-second are
less sensitive to that load than words per wall-clock second). "raw" rates count every token read, "effective" rates the tokens that were
trained after min_count and subsampling (what gensim logs as effective words/s).
Prints a table, then one JSON line; ``--record`` writes the headline rows for ``bench/README.md``'s table
(``result_record.py``).
"""
from __future__ import annotations

import argparse
import json
import lzma
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
DEFAULT_CORPUS = REPO.parent / "shared" / "data" / "wiki17m.txt.xz"

import result_record  # noqa: E402

HYPER = dict(dim=100, window=5, negative=5, min_count=5, sample=1e-3)


def prepare_corpus(corpus: Path, max_tokens: int, dest: Path) -> int:
    """Plain-text copy of the corpus (one document per line), cut at max_tokens; returns tokens."""
    opener = lzma.open if str(corpus).endswith(".xz") else open
    n = 0
    with opener(corpus, "rt", encoding="utf-8") as src, open(dest, "w", encoding="utf-8") as out:
        for line in src:
            toks = line.split()
            if max_tokens and n + len(toks) > max_tokens:
                toks = toks[:max_tokens - n]
            if toks:
                out.write(" ".join(toks) + "\n")
            n += len(toks)
            if max_tokens and n >= max_tokens:
                break
    return n


def evaluate(kv) -> dict:
    from gensim.test.utils import datapath
    acc, _ = kv.evaluate_word_analogies(datapath("questions-words.txt"), restrict_vocab=30000)
    ws = kv.evaluate_word_pairs(datapath("wordsim353.tsv"))
    sl = kv.evaluate_word_pairs(datapath("simlex999.txt"))
    return {"analogy": round(float(acc), 4), "ws353": round(float(ws[1][0]), 4), "simlex": round(float(sl[1][0]), 4),
            "vocabulary": len(kv.index_to_key)}


class GensimRun:
    """gensim Word2Vec trained one epoch per call, with its linear alpha decay split across calls
    (alpha from 0.025 to 0.0001 over all passes, exactly as ``epochs=N`` does in one call)."""

    name = "gensim"

    def __init__(self, path: Path, passes: int, workers: int, seed: int):
        from gensim.models import Word2Vec
        from gensim.models.word2vec import LineSentence
        self.passes = passes
        self.model = Word2Vec(vector_size=HYPER["dim"], window=HYPER["window"], negative=HYPER["negative"], sg=1,
                              hs=0, min_count=HYPER["min_count"], sample=HYPER["sample"], workers=workers, seed=seed)
        self.sentences = LineSentence(str(path))
        self.model.build_vocab(self.sentences)
        self.alpha, self.min_alpha = self.model.alpha, self.model.min_alpha
        self.seconds = self.cpu = 0.0
        self.raw = self.effective = 0

    def train_pass(self, index: int) -> None:
        span = self.alpha - self.min_alpha
        start = self.alpha - span * index / self.passes
        end = self.alpha - span * (index + 1) / self.passes
        t0, c0 = time.perf_counter(), time.process_time()
        effective, raw = self.model.train(self.sentences, total_examples=self.model.corpus_count, epochs=1,
                                          start_alpha=start, end_alpha=end)
        self.seconds += time.perf_counter() - t0
        self.cpu += time.process_time() - c0
        self.raw += raw
        self.effective += effective

    def finish(self) -> dict:
        return {**self._rates(), **evaluate(self.model.wv)}

    def _rates(self) -> dict:
        return {"seconds": round(self.seconds, 2), "cpu_seconds": round(self.cpu, 2),
                "raw_words_per_s": round(self.raw / self.seconds), "raw_words_per_cpu_s": round(self.raw / self.cpu),
                "effective_words_per_s": round(self.effective / self.seconds),
                "effective_words_per_cpu_s": round(self.effective / self.cpu)}


class LivevecRun(GensimRun):
    """livevec's in-process trainer (``livevec train``), one pass per call; evaluated from vectors.bin."""

    name = "livevec"

    def __init__(self, path: Path, passes: int, workers: int, seed: int, out_dir: Path, options: dict,
                 name: str = "livevec"):
        from online.cli.train import TrainSettings, make_trainer
        self.name = name
        from online.learner.trainer import LearnerConfig
        learner = LearnerConfig(**HYPER, seed=seed, **options.get("learner", {}))
        self.settings = TrainSettings(input=str(path), out=str(out_dir), epochs=passes, workers=workers,
                                      batch_words=options.get("batch_words", 10_000), shards=options.get("shards", 1),
                                      progress=False, learner=learner)
        self.settings.validate()
        self.trainer = make_trainer(self.settings)
        self.passes = passes
        self.seconds = self.cpu = 0.0
        self.raw = self.effective = 0

    def train_pass(self, index: int) -> None:
        from online.cli.train import train_pass
        t0, c0 = time.perf_counter(), time.process_time()
        train_pass(self.settings, self.trainer, index + 1)
        self.seconds += time.perf_counter() - t0
        self.cpu += time.process_time() - c0
        self.raw, self.effective = self.trainer.totals.tokens, self.trainer.totals.kept

    def finish(self) -> dict:
        from gensim.models import KeyedVectors
        from online.cli.train import write_outputs
        result = write_outputs(self.settings, self.trainer, self.seconds)
        kv = KeyedVectors.load_word2vec_format(result.files["binary"], binary=True)
        return {**self._rates(), **evaluate(kv)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--max-tokens", type=int, default=0, help="0 = whole corpus")
    ap.add_argument("--epochs", default="1,5", help="comma list of pass counts to compare")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--systems", default="gensim,livevec")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat each comparison with fresh models, the other system first each time; the ratios "
                         "are reported per round and as their median (the machine's speed drifts by the minute)")
    ap.add_argument("--optimizer", default="rowadagrad")
    ap.add_argument("--shards", type=int, default=1, help=">1: livevec's pull/push path over that many shards")
    ap.add_argument("--eta", type=float, default=None)
    ap.add_argument("--adagrad-init", type=float, default=None)
    ap.add_argument("--batch-words", type=int, default=10_000)
    ap.add_argument("--local-rate", type=float, default=None,
                    help="pull/push path: SGD rate of the walk over each batch (default the learner's, 0.002)")
    ap.add_argument("--kernel", default="auto",
                    help="livevec's in-place kernel (LIVEVEC_KERNEL): auto (the default; hogbatch as one model), "
                         "pairs or hogbatch; a comma list runs each")
    ap.add_argument("--sgd-decay", action="store_true",
                    help="livevec with SGD and gensim's linear decay over the known corpus length (diagnostic)")
    ap.add_argument("--record", metavar="FILE",
                    help="write the headline rows (one pass, five passes) to this result file (bench/results/)")
    args = ap.parse_args(argv)
    record = result_record.start(args.record, "quality_vs_gensim", None if argv is None else [__file__, *argv])
    systems = args.systems.split(",")
    passes = [int(x) for x in args.epochs.split(",")]
    learner = {"optimizer": args.optimizer}
    kernels = args.kernel.split(",")
    livevecs = ["livevec"] if len(kernels) == 1 else [f"livevec-{k}" for k in kernels]
    if len(kernels) == 1:
        learner["kernel"] = kernels[0]
    if args.eta is not None:
        learner["eta"] = args.eta
    if args.adagrad_init is not None:
        learner["adagrad_init"] = args.adagrad_init
    if args.local_rate is not None:
        learner["local_rate"] = args.local_rate
    rows = []
    with tempfile.TemporaryDirectory(prefix="livevec-bench-") as tmp:
        corpus = Path(tmp) / "corpus.txt"
        tokens = prepare_corpus(Path(args.corpus), args.max_tokens, corpus)
        print(f"corpus: {args.corpus}, {tokens:,} tokens, workers {args.workers}", file=sys.stderr)
        for epochs, round_no in [(e, r) for e in passes for r in range(args.rounds)]:
            # The systems alternate pass by pass (and which goes first; rounds swap it too), so
            # that both see the same load from the other jobs on this shared machine.
            runs = []
            if "gensim" in systems:
                runs.append(GensimRun(corpus, epochs, args.workers, args.seed))
            if "livevec" in systems:
                for kernel, name in zip(kernels, livevecs):
                    opts = {"learner": {**learner, "kernel": kernel}, "batch_words": args.batch_words,
                            "shards": args.shards}
                    if args.sgd_decay:
                        opts["learner"].update(optimizer="sgd", sgd_decay_words=tokens * epochs)
                    runs.append(LivevecRun(corpus, epochs, args.workers, args.seed,
                                           Path(tmp) / f"lv{epochs}-{kernel}-{round_no}", opts, name))
            for index in range(epochs):
                k = (index + round_no) % len(runs)
                for run in runs[k:] + runs[:k]:      # each system first in turn (two: the order swapped)
                    run.train_pass(index)
                    print(f"{run.name} pass {index + 1}/{epochs}: {run.seconds:.1f}s", file=sys.stderr, flush=True)
            row = {"passes": epochs, "round": round_no + 1}
            for run in runs:
                row[run.name] = run.finish()
                print(f"{run.name} passes={epochs}: {row[run.name]}", file=sys.stderr, flush=True)
            for name in livevecs:
                if "gensim" not in row or name not in row:
                    continue
                g, lv = row["gensim"], row[name]
                row["ratios" if name == "livevec" else f"ratios-{name}"] = {
                    "raw_words_per_s": round(lv["raw_words_per_s"] / g["raw_words_per_s"], 3),
                    "raw_words_per_cpu_s": round(lv["raw_words_per_cpu_s"] / g["raw_words_per_cpu_s"], 3),
                    "effective_words_per_s": round(lv["effective_words_per_s"] / g["effective_words_per_s"], 3),
                    "effective_words_per_cpu_s": round(lv["effective_words_per_cpu_s"] / g["effective_words_per_cpu_s"], 3),
                    "analogy_points": round(100 * (lv["analogy"] - g["analogy"]), 2),
                    "ws353_diff": round(lv["ws353"] - g["ws353"], 4),
                }
            rows.append(row)
    print(f"\n{'passes':>6} {'system':>16} {'analogy':>8} {'ws353':>7} {'simlex':>7} {'raw w/s':>9} {'raw w/cpu-s':>11} "
          f"{'eff w/s':>9} {'vocab':>7}")
    for row in rows:
        for name in ("gensim", *livevecs):
            if name in row:
                r = row[name]
                print(f"{row['passes']:>6} {name:>16} {100 * r['analogy']:>7.2f}% {r['ws353']:>7.3f} {r['simlex']:>7.3f} "
                      f"{r['raw_words_per_s']:>9,} {r['raw_words_per_cpu_s']:>11,} {r['effective_words_per_s']:>9,} "
                      f"{r['vocabulary']:>7,}")
        for key in [k for k in row if k.startswith("ratios")]:
            print(f"{row['passes']:>6} {'ratio':>8} {key[7:] or 'livevec'} {row[key]}")
    medians = {}
    for epochs in passes:
        for key in ["ratios"] if len(kernels) == 1 else [f"ratios-{name}" for name in livevecs]:
            ratios = [row[key] for row in rows if row["passes"] == epochs and key in row]
            if len(ratios) > 1:
                label = f"{epochs}{key[6:]}"
                medians[label] = {k: round(statistics.median(r[k] for r in ratios), 3) for k in ratios[0]}
                print(f"{epochs:>6} {'median':>8} {key[7:] or 'livevec'} {medians[label]} over {len(ratios)} rounds")
    print(json.dumps({"corpus": os.path.basename(args.corpus), "tokens": tokens, "workers": args.workers,
                      "learner": learner, "kernels": kernels, "batch_words": args.batch_words, "shards": args.shards,
                      "rounds": args.rounds, "results": rows, "median_ratios": medians}))
    if record is not None:
        corpus = (f"{tokens:,} tokens of {os.path.basename(args.corpus)}, {args.workers} worker "
                  f"thread{'s' * (args.workers != 1)}")
        result_record.write(record, headline_rows(rows, dict(zip(livevecs, kernels)), corpus))
    return 0


def headline_rows(rows: list[dict], kernel_of: dict[str, str], corpus: str) -> list[dict]:
    """The result file's rows: one pass and five passes of the kernel ``livevec train`` runs by default, against
    gensim, as medians over the rounds."""
    from online.learner.trainer import kernel_for

    default = kernel_for("auto", 1)
    name = next((n for n, k in kernel_of.items() if kernel_for(k, 1) == default), next(iter(kernel_of)))
    med = statistics.median
    out = []
    for passes, key in ((1, "train_vs_gensim"), (5, "train_five_passes")):
        mine = [r for r in rows if r["passes"] == passes and name in r and "gensim" in r]
        if not mine:
            continue
        ratios = [r[name]["raw_words_per_cpu_s"] / r["gensim"]["raw_words_per_cpu_s"] for r in mine]
        points = med(100 * (r[name]["analogy"] - r["gensim"]["analogy"]) for r in mine)
        ws = med(r[name]["ws353"] - r["gensim"]["ws353"] for r in mine)
        lv = {m: med(r[name][m] for r in mine) for m in ("analogy", "ws353", "simlex")}
        gs = {m: med(r["gensim"][m] for r in mine) for m in ("analogy", "ws353", "simlex")}
        rounds = f"medians of {len(mine)} rounds, " if len(mine) > 1 else ""
        kernel = kernel_for(kernel_of[name], 1)
        if passes == 1:
            out.append(result_record.row(
                key, f"{med(ratios):.2f}x gensim's raw words per CPU-second ("
                     + (f"rounds {', '.join(f'{x:.2f}' for x in ratios)}" if len(ratios) > 1 else "one round")
                     + f"); analogy {100 * lv['analogy']:.2f} % against "
                     f"{100 * gs['analogy']:.2f} % ({points:+.2f} points), WS353 {ws:+.3f}; {rounds}{corpus}, {kernel}",
                "≥ 3.0x; analogy ≥ gensim + 5 points, WS353 ≥ gensim's",
                result_record.met(med(ratios) >= 3.0 and points >= 5 and ws >= 0)))
        else:
            out.append(result_record.row(
                key, f"analogy {100 * lv['analogy']:.2f} % / WS353 {lv['ws353']:.3f} / SimLex {lv['simlex']:.3f} against "
                     f"gensim's {100 * gs['analogy']:.2f} % / {gs['ws353']:.3f} / {gs['simlex']:.3f} ({points:+.2f} points), "
                     f"at {med(ratios):.2f}x gensim's raw words per CPU-second; {rounds}{corpus}, {kernel}",
                "analogy within 1 point of gensim's five passes", result_record.met(points >= -1)))
    return out


if __name__ == "__main__":
    sys.exit(main())
