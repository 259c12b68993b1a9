"""Queries that mix words and raw vectors, with gensim's arithmetic, on one model snapshot.

Why gensim's arithmetic exactly: the clients mirror ``KeyedVectors`` and are tested against
it, and a user who moves code from a downloaded model to the live one must get the same
words. So a query is a list of terms, each a word or a raw vector with a weight (+1 for
positive, -1 for negative unless given), and:

``add`` (``most_similar``, 3CosAdd)
    the direction is the weighted sum of the words' *unit* rows and the vectors *as given*
    (gensim's ``get_mean_vector(pre_normalize=True)`` normalises keys, never arrays),
    normalised; the answer is the top k rows by cosine to it, the query's words left out.
    This reduces to the batched search every other query uses (``ModelIndex.search``).
``mul`` (``most_similar_cosmul``, 3CosMul of Levy and Goldberg)
    each row's score is prod((1 + u.t) / 2 over positive terms) / (prod(... negative) + 1e-6),
    u the row's unit vector and t a word's unit row or a vector as given. It needs every
    term's similarity to every row, so it is its own full scan, exact.
``closer``
    the rows whose cosine to a word is above that of a second word (``closer_than``), in
    the export's row order (most frequent first), which is ``index_to_key``'s order.

Terms are resolved against the snapshot the answer is computed on, so "unknown word" and
"wrong dimension" are verdicts about the version that answered.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from online.search.model_index import ModelIndex, Neighbour

KINDS = ("add", "mul", "closer")
COSMUL_EPSILON = 1e-6                # gensim's


@dataclass(frozen=True)
class Term:
    item: str | np.ndarray           # a word, or a raw float32 vector
    weight: float                    # its sign says positive (> 0) or negative (< 0)

    @property
    def is_word(self) -> bool:
        return isinstance(self.item, str)


class QueryRejected(ValueError):
    """The query cannot be answered on this snapshot as asked (a 400): ``code`` and message."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class Resolved:
    rows: list[int]                  # per term: its row, or -1 for a vector
    unknown: list[str]
    words: list[str | None]          # per term: the vocabulary word it matched, None for a vector


def resolve(index: ModelIndex, terms: list[Term]) -> Resolved:
    """Rows of the word terms (unknown ones listed), after checking each vector against the dimension."""
    rows, unknown, words = [], [], []
    for term in terms:
        if term.is_word:
            r = index.row(term.item)
            rows.append(r)
            words.append(index.words[r] if r >= 0 else None)
            if r < 0:
                unknown.append(term.item)
        else:
            if term.item.shape != (index.dim,):
                raise QueryRejected("bad_vector", f"a vector must have the model's {index.dim} dimensions, "
                                                  f"got {term.item.shape[0]}")
            rows.append(-1)
            words.append(None)
    return Resolved(rows, unknown, words)


def direction(index: ModelIndex, terms: list[Term], rows: list[int]) -> np.ndarray:
    """The unit direction of the weighted sum (3CosAdd). A sum of zero has none: it is returned as
    it is, so every score is 0 (gensim's ``unitvec`` leaves a zero vector unchanged too)."""
    total = np.zeros(index.dim, np.float64)
    for term, row in zip(terms, rows):
        total += term.weight * (index.unit_row(row) if row >= 0 else term.item)
    norm = float(np.linalg.norm(total))
    return (total / norm if norm > 0 else total).astype(np.float32)


def cosmul_top_k(index: ModelIndex, terms: list[Term], rows: list[int], k: int) -> list[Neighbour]:
    """3CosMul's top ``k`` over every row, the query's words left out (exact; gensim's formula). The
    similarities are one float32 product against the rows (no float64 copy of the model); their
    product is taken in float64, so that a few large vectors do not overflow where gensim's would."""
    positive = [index.unit_row(r) if r >= 0 else t.item for t, r in zip(terms, rows) if t.weight > 0]
    negative = [index.unit_row(r) if r >= 0 else t.item for t, r in zip(terms, rows) if t.weight < 0]
    if not positive:
        raise QueryRejected("bad_positive", "3CosMul needs at least one positive term")
    with np.errstate(over="ignore", invalid="ignore"):
        scores = np.prod((1 + index.scores_against(np.asarray(positive, np.float32).T).astype(np.float64)) / 2, axis=1)
        below = np.prod((1 + index.scores_against(np.asarray(negative, np.float32).T).astype(np.float64)) / 2, axis=1) \
            if negative else 1.0
        scores = scores / (below + COSMUL_EPSILON)
    if not np.all(np.isfinite(scores)):
        raise QueryRejected("bad_vector", "the query's vectors are too large for 3CosMul: the product of the "
                                          "similarities overflows")
    scores[[r for r in rows if r >= 0]] = -np.inf
    k = min(k, index.n)
    best = np.argpartition(-scores, k - 1)[:k] if k < index.n else np.arange(index.n)
    best = best[np.lexsort((best, -scores[best]))]            # best first; ties: lower row first
    return [Neighbour(index.words[r], round(float(scores[r]), 6)) for r in best.tolist() if scores[r] != -np.inf]


def export_order(index: ModelIndex, rows: np.ndarray) -> np.ndarray:
    """``rows`` in the export's order: most frequent first, ties by row (``export.exportable_rows``)."""
    return rows[np.lexsort((rows, -index.counts[rows]))]


def closer_than(index: ModelIndex, row1: int, row2: int) -> list[Neighbour]:
    """Rows more similar to ``row1`` than ``row2`` is (``row1`` itself left out), as gensim's
    ``closer_than``: its distances are ``1 - cosine`` in float32, compared strictly."""
    distances = np.float32(1) - index.scores_against(index.unit_row(row1))
    closer = np.flatnonzero(distances < distances[row2])
    closer = export_order(index, closer[closer != row1])
    return [Neighbour(index.words[r], round(float(1 - distances[r]), 6)) for r in closer.tolist()]
