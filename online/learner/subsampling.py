"""Online subsampling of frequent words (Mikolov et al. 2013), from the current counts.

word2vec.c and gensim keep an occurrence of a word with frequency ``f = count / T`` with
probability ``(sqrt(f / s) + 1) * s / f`` (capped at 1), where ``s`` is ``sample`` and
``T`` the total count of the vocabulary that is trained (gensim's ``retain_total``). A
stream has no final T, so livevec uses the counts seen so far: ``T`` is the sum of the
counts of the currently trainable words. The formula depends only on the ratio
``count / T``, which converges as the stream goes on, so the early part of a stream is
subsampled from early estimates and the rest exactly as gensim would.

``keep_tokens`` is the trainer's path: the same formula and a draw per occurrence, compiled,
in one pass that also drops untrainable tokens and renumbers the sentences of a mini-batch.
"""
from __future__ import annotations

import numpy as np
from numba import njit


def keep_probability(counts, total: float, sample: float) -> np.ndarray:
    """Probability of keeping one occurrence of words with ``counts`` (word2vec.c's formula)."""
    counts = np.asarray(counts, dtype=np.float64)
    if sample <= 0 or total <= 0:
        return np.ones_like(counts)
    threshold = sample * float(total)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = (np.sqrt(counts / threshold) + 1.0) * threshold / counts
    p[~np.isfinite(p)] = 1.0
    return np.minimum(p, 1.0)


def keep_mask(slots: np.ndarray, counts: np.ndarray, total: float, sample: float,
              rng: np.random.Generator) -> np.ndarray:
    """Bernoulli draw per occurrence: True where the occurrence at ``slots`` is kept."""
    if sample <= 0:
        return np.ones(len(slots), dtype=bool)
    p = keep_probability(counts[slots], total, sample)
    return rng.random(len(slots)) < p


@njit(inline="always")
def _splitmix(state):
    state += np.uint64(0x9E3779B97F4A7C15)
    z = state
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return state, z ^ (z >> np.uint64(31))


@njit(nogil=True, cache=True)
def _keep(slots, sentences, trainable, counts, total, sample, seed, in_row, out_row, use_rows,
          kept_a, kept_b, starts):
    threshold = sample * total
    state = np.uint64(seed)
    k = 0
    for s in range(sentences.shape[0] - 1):
        starts[s] = k
        for i in range(sentences[s], sentences[s + 1]):
            w = slots[i]
            if w < 0 or not trainable[w]:
                continue
            if threshold > 0:
                c = counts[w]
                if c > 0:
                    p = (np.sqrt(c / threshold) + 1.0) * threshold / c
                    if p < 1.0:
                        state, z = _splitmix(state)
                        if (z >> np.uint64(11)) * (1.0 / 9007199254740992.0) >= p:
                            continue
            if use_rows:
                if in_row[w] < 0 or out_row[w] < 0:   # no room for its rows (a full shared replica)
                    continue
                kept_a[k] = in_row[w]
                kept_b[k] = out_row[w]
            else:
                kept_a[k] = w
            k += 1
    starts[sentences.shape[0] - 1] = k
    return k


def keep_tokens(slots: np.ndarray, sentences: np.ndarray, trainable: np.ndarray, counts: np.ndarray, total: float,
                sample: float, seed: int, in_row: np.ndarray | None = None, out_row: np.ndarray | None = None):
    """One compiled pass over a mini-batch: drop unknown and untrainable tokens, subsample the
    rest (``keep_probability``, one draw per occurrence from ``seed``) and renumber the sentence
    starts. ``slots``: int64 per token (-1 unknown); ``sentences``: int64 first token of each
    sentence, then the token count. Returns ``(kept slots, starts)``, or with ``in_row`` /
    ``out_row`` (int64 per slot) ``(their in rows, their out rows, starts)``; ``starts`` has one
    entry per sentence, then the kept count."""
    n = slots.shape[0]
    use_rows = in_row is not None
    kept_a = np.empty(n, dtype=np.int64)
    kept_b = np.empty(n if use_rows else 0, dtype=np.int64)
    starts = np.empty(sentences.shape[0], dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    k = _keep(slots, sentences, trainable, counts, float(total), float(sample if total > 0 else 0.0), np.uint64(seed),
              in_row if use_rows else empty, out_row if use_rows else empty, use_rows, kept_a, kept_b, starts)
    if use_rows:
        return kept_a[:k], kept_b[:k], starts
    return kept_a[:k], starts
