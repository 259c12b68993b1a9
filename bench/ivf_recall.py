"""Recall@10 and cost of the front end's inverted file on real word2vec vectors.

    .venv/bin/python bench/ivf_recall.py [--corpus ../shared/data/wiki17m.txt.xz] [--cache DIR]
        [--queries 2000] [--batch 16] [--settings 32:0,32:0.55,...]

Why: the synthetic benchmark model (``query_load.py``) is made of tight Gaussian clusters, on
which the lists hit recall 0.9996. Real vectors are not like that: in a one-epoch model most
words are rare and undertrained, their vectors near-random directions whose top 10 is a
near-tie spread over many lists. This measures the front end on such a model.

1. gensim skip-gram, one epoch over the corpus, min_count 1, dim 100, workers 2 (cached in
   ``--cache``, outside the repository: vectors, words by frequency, counts);
2. the front end's own index on those vectors, built and installed as the front end does
   (``IvfMaintainer.build_now``, then a sync);
3. ``--queries`` random words of the whole vocabulary and as many of the ``--top`` most
   frequent, their exact top 10 (int8 full scan + exact re-rank), then per setting
   ``nprobe:exact_below`` recall@10 against it, the share redone exactly, and ms per query
   (``auto``: the floor the front end's recall monitor would set, from 512 other words)
   in process on one thread, in batches of ``--batch`` queries of one frequency band (the
   compute thread batches whatever is waiting);
4. a certified stop for rare words, measured here, not built into the front end: with
   r_l the largest angle between a row of list l and its centroid, no row of l can score
   more than cos(max(0, angle(q, c_l) - r_l)) (triangle inequality on the sphere). It
   prints how many rows a query would still have to scan after its nprobe lists before
   that bound certifies its top 10, per list and with a radius per row (the best any
   radius bound could do).

The load average is printed before and after; run it under ``flock /tmp/livevec-bench.lock``.
"""
from __future__ import annotations

import argparse
import dataclasses
import lzma
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from online.frontend.blas_threads import set_blas_threads  # noqa: E402
from online.search.ivf_build import IvfMaintainer, RecallMonitor  # noqa: E402
from online.search.model_index import ModelHolder, SearchConfig, warm_up  # noqa: E402
from online.frontend.sources import ModelDelta  # noqa: E402
from online.learner.keys import word_keys  # noqa: E402

BANDS = ((1, 1), (2, 4), (5, 19), (20, 99), (100, 1 << 62))     # corpus count of the query word


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def train_or_load(corpus: str, cache: Path, sg: int = 1) -> tuple[np.ndarray, list[str], np.ndarray]:
    vec, words, counts = cache / "vectors.npy", cache / "words.txt", cache / "counts.npy"
    if vec.exists() and words.exists() and counts.exists():
        return np.load(vec), words.read_text().split("\n"), np.load(counts)
    from gensim.models import Word2Vec

    class Lines:
        def __iter__(self):
            with lzma.open(corpus, "rt") as f:
                for line in f:
                    tokens = line.split()
                    for lo in range(0, len(tokens), 10000):      # gensim's own sentence limit
                        yield tokens[lo:lo + 10000]

    started = time.perf_counter()
    model = Word2Vec(Lines(), vector_size=100, window=5, negative=5, sg=sg, hs=0, min_count=1, sample=1e-3,
                     workers=2, epochs=1, seed=1)
    print(f"trained {'skip-gram' if sg else 'CBOW'} on {corpus} in {time.perf_counter() - started:.0f} s: "
          f"{len(model.wv)} words", flush=True)
    cache.mkdir(parents=True, exist_ok=True)
    out = model.wv.vectors.astype(np.float32)
    cnt = np.array([model.wv.get_vecattr(w, "count") for w in model.wv.index_to_key], np.int64)
    np.save(vec, out)
    np.save(counts, cnt)
    words.write_text("\n".join(model.wv.index_to_key))
    return out, list(model.wv.index_to_key), cnt


def front_end_index(vectors: np.ndarray, words: list[str], counts: np.ndarray):
    config = SearchConfig(ivf_min_rows=1000)
    holder = ModelHolder(config)
    holder.swap(holder.current.apply(ModelDelta(word_keys(words), words, vectors, counts, 1, full=True)))
    started = time.perf_counter()
    assert IvfMaintainer(holder, config).build_now("ivf_recall")
    holder.swap(holder.current.apply(ModelDelta.unchanged(2, vectors.shape[1])))
    index = holder.current
    assert index.search_mode() == "ivf"
    print(f"front end index: {index.n} words, {index.ivf.lists} lists, built and installed in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    return index


def run(index, rows: np.ndarray, batch: int, **kw) -> tuple[list, list, float]:
    """Answers, reasons and seconds per query for ``rows``, searched in batches of ``batch``."""
    answers, reasons, spent = [], [], 0.0
    for lo in range(0, len(rows), batch):
        part = rows[lo:lo + batch]
        q = index.unit[part].copy()
        ex = [[int(r)] for r in part]
        why: list[str] = []
        started = time.perf_counter()
        got, _ = index.search(q, ex, [10] * len(part), why=why, **kw)
        spent += time.perf_counter() - started
        answers += got
        reasons += why
    return answers, reasons, spent / max(len(rows), 1)


def recall_of(answers, truth) -> np.ndarray:
    return np.array([len({n.word for n in a} & {n.word for n in e}) / max(len(e), 1) for a, e in zip(answers, truth)])


def certificate(index, rows: np.ndarray, kth: np.ndarray, nprobe: int) -> dict:
    """Rows a radius-certified stop would still scan after ``nprobe`` lists (see the docstring)."""
    ivf = index.ivf
    assign = ivf.list_of_slots(index.row_slot)
    row_cos = np.einsum("ij,ij->i", index.unit, ivf.centroids[assign])
    list_cos = np.ones(ivf.lists)
    np.minimum.at(list_cos, assign, row_cos)
    sizes = np.bincount(assign, minlength=ivf.lists)

    def bound(a, m):           # cos(max(0, angle(q, c) - angle(x, c))) for cos angles a and m
        a, m = np.clip(a, -1, 1), np.clip(m, -1, 1)
        return np.where(a >= m, 1.0, a * m + np.sqrt(1 - a * a) * np.sqrt(1 - m * m))

    per_list, per_row, certified = [], [], 0
    for lo in range(0, len(rows), 256):
        q = index.unit[rows[lo:lo + 256]]
        a = q @ ivf.centroids.T
        probed = np.argsort(-a, axis=1)[:, :nprobe]
        for i in range(len(q)):
            s = kth[lo + i] - 1e-6
            open_lists = np.ones(ivf.lists, bool)
            open_lists[probed[i]] = False
            reach = open_lists & (bound(a[i], list_cos) >= s)
            per_list.append(sizes[reach].sum() / index.n)
            certified += not reach.any()
            unprobed_row = open_lists[assign]
            per_row.append(np.count_nonzero(unprobed_row & (bound(a[i][assign], row_cos) >= s)) / index.n)
    return {"certified_at_nprobe": certified / len(rows), "rows_left_per_list_radius": float(np.mean(per_list)),
            "rows_left_per_row_radius": float(np.mean(per_row)),
            "list_radius_deg_median": float(np.degrees(np.arccos(np.median(list_cos))))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(Path(__file__).resolve().parents[2] / "shared/data/wiki17m.txt.xz"))
    ap.add_argument("--cache", default="/tmp/livevec-ivf-recall-sg{sg}",
                    help="trained vectors (outside the repository)")
    ap.add_argument("--sg", type=int, default=1, choices=(0, 1),
                    help="1: skip-gram (default), 0: CBOW (gensim's default)")
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--top", type=int, default=30000, help="the frequent words: this many most frequent")
    ap.add_argument("--batch", type=int, default=16, help="queries per search call")
    ap.add_argument("--settings", default="16:0,32:0,64:0,128:0,32:0.55,32:auto,48:auto,64:auto",
                    help="nprobe:exact_below pairs (exact_below 0: the old behaviour)")
    ap.add_argument("--certificate", action="store_true", default=True)
    ap.add_argument("--no-certificate", dest="certificate", action="store_false")
    args = ap.parse_args()
    print(f"load average before: {load_avg()}", flush=True)
    set_blas_threads(1)
    warm_up()
    vectors, words, counts = train_or_load(args.corpus, Path(args.cache.format(sg=args.sg)), args.sg)
    index = front_end_index(vectors, words, counts)
    rng = np.random.default_rng(0)
    samples = {"all words": rng.choice(index.n, min(args.queries, index.n), replace=False),
               f"top {args.top // 1000}k": rng.choice(min(args.top, index.n), min(args.queries, args.top),
                                                        replace=False)}
    band_of = {name: np.searchsorted([lo for lo, _ in BANDS], counts[rows], side="right") - 1
               for name, rows in samples.items()}
    # group each sample by band, so a batch holds queries of one band and its time is that band's
    for name in samples:
        order = np.argsort(band_of[name], kind="stable")
        samples[name], band_of[name] = samples[name][order], band_of[name][order]
    truth, exact_ms = {}, {}
    for name, rows in samples.items():
        truth[name] = []
        exact_ms[name] = {}
        for b in range(len(BANDS)):
            sel = rows[band_of[name] == b]
            got, _, per = run(index, sel, args.batch, exact=True)
            truth[name] += got
            exact_ms[name][b] = (len(sel), 1e3 * per)
    base = index.config
    results = []
    floors = {}
    for setting in args.settings.split(","):
        nprobe, below = setting.split(":")
        index.config = dataclasses.replace(base, ivf_nprobe=int(nprobe), ivf_exact_below=0.0)
        if below == "auto":      # as the front end does: the monitor's 512 uniformly drawn words
            monitor = RecallMonitor()
            monitor.rng = np.random.default_rng(int(nprobe) + 7)
            for _ in range(monitor.samples.maxlen // 64):
                monitor.check(index, queries=64)
            floors[setting] = monitor.floor()
            below = floors[setting] or 0.0
            print(f"nprobe {nprobe}: calibrated floor {below:.4f} (monitor recall as served before: "
                  f"{monitor.recall():.4f})", flush=True)
        index.config = dataclasses.replace(index.config, ivf_exact_below=float(below))
        for name, rows in samples.items():
            answers, reasons, cost = [], [], {}
            for b in range(len(BANDS)):
                sel = rows[band_of[name] == b]
                got, why, per = run(index, sel, args.batch)
                answers += got
                reasons += why
                cost[b] = 1e3 * per
            rec = recall_of(answers, truth[name])
            reasons = np.array(reasons)
            results.append((setting, name, rec, reasons, cost))
    index.config = base
    print(f"\nrecall@10 against exact ({args.queries} queries per sample, batches of {args.batch}, one thread):\n")
    print("| nprobe | exact below | sample | recall@10 (p5) | redone exactly | ms per query |")
    print("| --- | --- | --- | --- | --- | --- |")
    for setting, name, rec, reasons, cost in results:
        nprobe, below = setting.split(":")
        if below == "auto":
            below = f"auto ({floors[setting] or 0:.3f})"
        n_band = np.bincount(band_of[name], minlength=len(BANDS))
        ms = sum(cost[b] * n_band[b] for b in range(len(BANDS))) / n_band.sum()
        print(f"| {nprobe} | {below} | {name} | {rec.mean():.4f} ({np.percentile(rec, 5):.1f}) "
              f"| {np.mean(reasons != 'ivf'):.3f} | {ms:.3f} |")
    print("\nby frequency band of the query word (corpus count): recall@10 / share redone exactly / ms per query\n")
    head = " | ".join(f"count {lo}" + (f"-{hi}" if hi != lo and hi < 1 << 60 else ("+" if hi >= 1 << 60 else ""))
                      for lo, hi in BANDS)
    print(f"| nprobe:exact below | sample | {head} |")
    print("| --- | --- |" + " --- |" * len(BANDS))
    for name in samples:
        cells = [f"{exact_ms[name][b][0]} words, exact {exact_ms[name][b][1]:.3f} ms" for b in range(len(BANDS))]
        print(f"| (exact search) | {name} | " + " | ".join(cells) + " |")
    for setting, name, rec, reasons, cost in results:
        cells = []
        for b in range(len(BANDS)):
            m = band_of[name] == b
            cells.append(f"{rec[m].mean():.3f} / {np.mean(reasons[m] != 'ivf'):.2f} / {cost[b]:.3f}" if m.any()
                         else "-")
        print(f"| {setting} | {name} | " + " | ".join(cells) + " |")
    if args.certificate:
        print("\nradius-certified stop (measured, not built): after nprobe lists, the share of rows whose bound "
              "still reaches the k-th exact score\n")
        print("| nprobe | sample | certified without more lists | rows left, radius per list | "
              "rows left, radius per row | median list radius |")
        print("| --- | --- | --- | --- | --- | --- |")
        for nprobe in (32, 128):
            index.config = dataclasses.replace(base, ivf_nprobe=nprobe, ivf_exact_below=0.0)
            for name, rows in samples.items():
                got, _, _ = run(index, rows, 256)
                kth = np.array([a[-1].score if a else -1.0 for a in got])
                c = certificate(index, rows, kth, nprobe)
                print(f"| {nprobe} | {name} | {c['certified_at_nprobe']:.3f} | {c['rows_left_per_list_radius']:.3f} "
                      f"| {c['rows_left_per_row_radius']:.3f} | {c['list_radius_deg_median']:.0f} deg |", flush=True)
        index.config = base
    print(f"\nload average after: {load_avg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
