"""How well a model places the sample corpus's planted groups (``online.stream.sample_corpus.planted_groups``)."""
from __future__ import annotations

import numpy as np

from online.stream.sample_corpus import planted_groups


def planted_hits(words: list[str], vectors: np.ndarray) -> float:
    """Share of planted group members found among each member's nearest neighbours (cosine, the word left out)."""
    v = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9)
    index = {w: i for i, w in enumerate(words)}
    hits = total = 0
    for group in planted_groups():
        for w in group:
            total += len(group) - 1
            if w not in index:
                continue
            sims = v @ v[index[w]]
            sims[index[w]] = -np.inf
            top = {words[j] for j in np.argsort(-sims)[:len(group) - 1]}
            hits += len(top & set(group))
    return hits / total
