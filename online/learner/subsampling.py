"""Online subsampling of frequent words (Mikolov et al. 2013), from the current counts.

word2vec.c and gensim keep an occurrence of a word with frequency ``f = count / T`` with
probability ``(sqrt(f / s) + 1) * s / f`` (capped at 1), where ``s`` is ``sample`` and
``T`` the total count of the vocabulary that is trained (gensim's ``retain_total``). A
stream has no final T, so livevec uses the counts seen so far: ``T`` is the sum of the
counts of the currently trainable words. The formula depends only on the ratio
``count / T``, which converges as the stream goes on, so the early part of a stream is
subsampled from early estimates and the rest exactly as gensim would.
"""
from __future__ import annotations

import numpy as np


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
