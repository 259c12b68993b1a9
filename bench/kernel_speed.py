"""The in-place SGNS kernel alone: pairs/s of ``train_inplace_rows`` against a reference copy, same batches.

    flock /tmp/livevec-bench.lock .venv/bin/python bench/kernel_speed.py [--corpus ../shared/data/wiki17m.txt.xz]
        [--warm-tokens 3000000] [--batches 60] [--threads 2] [--reps 6] [--kernels reference,current]

``--kernels current,hogbatch`` times the HogBatch kernel (``LIVEVEC_KERNEL=hogbatch``) against the current one
instead, in the same way; the first kernel named is the one the others are compared with. (Both kernels draw
the same windows, so they train the same pairs and their pairs/s are words/s in the same proportion.)

Trains the first ``--warm-tokens`` tokens of the corpus with the product's ``Trainer`` (defaults of
``livevec train``: d=100, window 5, negative 5, row-wise AdaGrad, 10,000-word batches), so that the
vocabulary, noise table, rows and accumulators are in a realistic state, then prepares the next
``--batches`` mini-batches (vocabulary updated, subsampled, rows resolved: exactly what ``Trainer.run``
hands the kernel) and keeps them with a copy of the shard's matrices. Each repetition restores the
matrices and trains all those batches with ``--threads`` threads sharing the matrices (hogwild, each
thread its own ``touched`` mask, batches handed out in order as ``livevec train`` does). The reference
kernel (``reference_kernel`` below: an earlier ``train_inplace_rows``, kept verbatim as a fixed baseline,
with an exact sigmoid, separate loops and no prefetch) and the current one alternate, the order swapped every
repetition, so that both meet the same load; prints each one's median pairs/s, the ratio, the
load average before and after, and how far the two kernels' results are apart.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
from numba import njit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DEFAULT_CORPUS = REPO.parent / "shared" / "data" / "wiki17m.txt.xz"

from online.learner import sgns_kernel as K  # noqa: E402
from online.learner.hogbatch_kernel import train_hogbatch_rows  # noqa: E402
from online.learner.sgns_kernel import _draw, _lcg, _update_input  # noqa: E402


@njit(inline="always")
def _ref_sigmoid(f):
    if f > K.MAX_EXP:
        return 1.0
    if f < -K.MAX_EXP:
        return 0.0
    return 1.0 / (1.0 + np.exp(-f))


@njit(nogil=True, fastmath=True, cache=True)
def reference_kernel(syn0, syn1, acc0, acc1, in_rows, out_rows, starts, noise_rows,
                     window, negative, eta, optimizer, seed, touched):
    """An earlier ``train_inplace_rows``, verbatim: the benchmark's fixed baseline."""
    dim = syn0.shape[1]
    neu1e = np.zeros(dim, dtype=np.float32)
    state = np.uint64(seed) * np.uint64(2654435761) + np.uint64(1)
    n_noise = noise_rows.shape[0]
    pairs = 0
    eta32 = np.float32(eta)
    inv_dim = np.float32(1.0 / dim)
    uu = np.float32(-1.0)
    for s in range(starts.shape[0] - 1):
        lo = starts[s]
        hi = starts[s + 1]
        for i in range(lo, hi):
            word_out = out_rows[i]
            state = _lcg(state)
            b = np.int64(state % np.uint64(window))
            reach = window - b
            j0 = max(lo, i - reach)
            j1 = min(hi, i + reach + 1)
            for j in range(j0, j1):
                if j == i:
                    continue
                l1 = in_rows[j]
                uu = np.float32(-1.0)
                for d in range(dim):
                    neu1e[d] = 0.0
                for k in range(negative + 1):
                    if k == 0:
                        target = word_out
                        label = 1.0
                    else:
                        if n_noise == 0:
                            break
                        state = _lcg(state)
                        target = np.int64(noise_rows[_draw(state, n_noise)])
                        if target < 0 or target == word_out:
                            continue
                        label = 0.0
                    f = np.float32(0.0)
                    for d in range(dim):
                        f += syn0[l1, d] * syn1[target, d]
                    g = np.float32(label - _ref_sigmoid(f))
                    for d in range(dim):
                        neu1e[d] += g * syn1[target, d]
                    touched[target] = 1
                    if optimizer == K.OPT_ROW_ADAGRAD:
                        if uu < 0:
                            uu = np.float32(0.0)
                            for d in range(dim):
                                uu += syn0[l1, d] * syn0[l1, d]
                        h = acc1[target, 0] + g * g * uu * inv_dim
                        acc1[target, 0] = h
                        step = eta32 * g / np.sqrt(h)
                        for d in range(dim):
                            syn1[target, d] += step * syn0[l1, d]
                    elif optimizer == K.OPT_ADAGRAD:
                        for d in range(dim):
                            gd = g * syn0[l1, d]
                            h = acc1[target, d] + gd * gd
                            acc1[target, d] = h
                            syn1[target, d] += eta32 * gd / np.sqrt(h)
                    else:
                        for d in range(dim):
                            syn1[target, d] += eta32 * g * syn0[l1, d]
                touched[l1] = 1
                _update_input(syn0, acc0, l1, neu1e, eta32, inv_dim, optimizer)   # the product kernel's input step
                pairs += 1
    return pairs


def capture(corpus: str, warm_tokens: int, n_batches: int, optimizer: str):
    """Train ``warm_tokens`` tokens with the product's Trainer, then prepare ``n_batches`` more batches."""
    from online.cli.train import BLOCK_BYTES, DEFAULT_BATCH_WORDS, _Source
    from online.learner.spans import TokenSpans, batch_ends
    from online.learner.trainer import LearnerConfig, Trainer

    trainer = Trainer(LearnerConfig(dim=100, window=5, negative=5, min_count=5, sample=1e-3, optimizer=optimizer),
                      inplace=True)
    source = _Source(corpus)
    batches, pending, seen = [], None, 0
    try:
        for block in source.blocks(BLOCK_BYTES):
            spans = trainer.tokenizer.text_spans(block)
            if pending is not None:
                spans = TokenSpans.concat([pending, spans])
            first = 0
            for end in batch_ends(spans.sentences, 0, DEFAULT_BATCH_WORDS).tolist():
                batch = spans.sentence_slice(first, end)
                first = end
                p = trainer.prepare(batch, True)
                seen += p.stats.tokens
                if seen <= warm_tokens:
                    trainer.run(p)
                else:
                    batches.append(p)
                    trainer.run(p)       # the vocabulary moves on as in a pass; the state is restored below
                    if len(batches) >= n_batches:
                        break
            if len(batches) >= n_batches:
                break
            pending = spans.sentence_slice(first, spans.num_sentences).compact() if first < spans.num_sentences \
                else None
    finally:
        source.close()
    shard = trainer.shard
    return trainer, shard.vectors.copy(), shard.accum.copy(), batches


def run_all(kernel, vectors, accum, batches, threads: int, window: int, negative: int, opt: int):
    """Train every batch once with ``threads`` threads sharing ``vectors``/``accum``; (pairs, seconds)."""
    nxt = iter(range(len(batches)))
    lock = threading.Lock()
    counts = [0] * threads
    masks = [np.zeros(len(vectors), np.uint8) for _ in range(threads)]
    start = threading.Barrier(threads + 1)

    def work(t):
        start.wait()
        while True:
            with lock:
                b = next(nxt, None)
            if b is None:
                return
            p = batches[b]
            counts[t] += kernel(vectors, vectors, accum, accum, p.in_rows, p.out_rows, p.starts, p.noise,
                                window, negative, p.eta, opt, p.seed, masks[t])

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return sum(counts), time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--warm-tokens", type=int, default=3_000_000)
    ap.add_argument("--batches", type=int, default=60, help="10,000-word batches timed per repetition")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--optimizer", default="rowadagrad")
    ap.add_argument("--kernels", default="reference,current",
                    help="comma list of reference, current (train_inplace_rows), tracked (the same with the contraction "
                         "and the loss measured, as in a worker's replica) and hogbatch; the first is the base")
    args = ap.parse_args(argv)
    print(f"load average before: {os.getloadavg()}", flush=True)
    trainer, vectors0, accum0, batches = capture(args.corpus, args.warm_tokens, args.batches, args.optimizer)
    cfg = trainer.config
    opt = trainer._opt
    print(f"captured {len(batches)} batches after {args.warm_tokens:,} tokens; vocabulary "
          f"{int(trainer.vocab.trainable.sum()):,} trainable words, matrix {vectors0.shape}, noise table "
          f"{len(batches[0].noise):,} entries", flush=True)
    def current(*args):
        return K.train_inplace_rows(*args, K.NO_CURVATURE, K.NO_LOSS)

    def hogbatch(*args):
        return train_hogbatch_rows(*args, K.NO_CURVATURE, K.NO_LOSS)

    local = threading.local()

    def tracked(*args):
        """As a worker's replica runs it: each row's contraction measured and the loss sampled (per-thread
        buffers, kept between batches, as the Trainer's)."""
        curv = getattr(local, "curv", None)
        if curv is None or len(curv) < len(args[0]):
            curv = local.curv = np.zeros(len(args[0]), np.float32)
        return K.train_inplace_rows(*args, curv, np.zeros(2))
    known = {"reference": reference_kernel, "current": current, "hogbatch": hogbatch, "tracked": tracked}
    names = args.kernels.split(",")
    if len(names) < 2 or any(n not in known for n in names):
        ap.error(f"--kernels: two or more of {', '.join(known)}")
    kernels = {name: known[name] for name in names}
    base = names[0]
    vec, acc = vectors0.copy(), accum0.copy()
    results = {}
    for name, kernel in kernels.items():     # compile, and check how far the kernels agree on one thread
        np.copyto(vec, vectors0)
        np.copyto(acc, accum0)
        pairs = sum(kernel(vec, vec, acc, acc, p.in_rows, p.out_rows, p.starts, p.noise, cfg.window, cfg.negative,
                           p.eta, opt, p.seed, np.zeros(len(vec), np.uint8)) for p in batches[:3])
        results[name] = (pairs, vec.copy(), acc.copy())
    pr, vr, ar = results[base]
    for name in names[1:]:
        pc, vc, ac = results[name]
        delta = np.abs(vc - vr)
        accum = f"{(np.abs(ac - ar) / np.maximum(ar, 1e-12)).max():.3g}" if ar.size else "none (SGD)"
        print(f"one thread, 3 batches, {base} / {name}: pairs {pr:,} / {pc:,}; max |delta vectors| {delta.max():.3g} "
              f"(mean {delta.mean():.3g}, rows moved {np.abs(vr - vectors0).max():.3g}); max rel |delta accum| "
              f"{accum}", flush=True)
    rates = {name: [] for name in kernels}
    for rep in range(args.reps):
        k = rep % len(names)
        order = names[k:] + names[:k]        # each kernel first in turn, so that all meet the same load
        for name in order:
            np.copyto(vec, vectors0)
            np.copyto(acc, accum0)
            pairs, seconds = run_all(kernels[name], vec, acc, batches, args.threads, cfg.window, cfg.negative, opt)
            rates[name].append(pairs / seconds)
            print(f"  rep {rep + 1} {name:9s} {pairs:,} pairs in {seconds:.3f} s: {pairs / seconds / 1e6:.3f}M pairs/s",
                  flush=True)
    med = {name: statistics.median(r) for name, r in rates.items()}
    for name in names:
        print(f"{name:9s} median {med[name] / 1e6:.3f}M pairs/s  (runs: "
              f"{', '.join(f'{r / 1e6:.3f}' for r in rates[name])})")
    for name in names[1:]:
        paired = [c / r for c, r in zip(rates[name], rates[base])]
        print(f"ratio {name} / {base}: {med[name] / med[base]:.3f}x of the medians; per repetition "
              f"{', '.join(f'{x:.3f}' for x in paired)} (median {statistics.median(paired):.3f}x)")
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
