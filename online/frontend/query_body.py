"""The JSON bodies of ``POST /v1/similar`` and ``POST /v1/analogy``, checked and turned into terms.

Why JSON bodies: a word may contain any character, commas included, so a list of words
cannot travel as a comma-joined query string; and a vector is a list of numbers. Every
item of ``positive``/``negative`` is one of

- ``"word"`` (weight +1 in ``positive``, -1 in ``negative``, as gensim's defaults);
- ``[0.1, -0.3, ...]``, a raw vector (gensim accepts numpy arrays in the same lists);
- ``{"word": "w", "weight": 0.5}`` or ``{"vector": [...], "weight": 0.5}``, gensim's
  ``(key, weight)`` tuples.

``{"vector": [...]}`` alone is ``similar_by_vector``. With ``"method": "mul"`` (3CosMul)
weights are ignored: the list a term is in says which side it is on, as in gensim's
``most_similar_cosmul``. ``positive`` may not be empty: the OpenAPI document says so, and
schemathesis checks that what the document refuses the server refuses too.

Everything that can be checked without the model is checked here and refused with a
``BodyError`` (a 400 naming the parameter); the vector's dimension is checked against the
snapshot that answers (``vector_queries.resolve``). Bounds (coordinates and weights at most
1e6 in size, 50 terms a list) keep every weighted sum finite in float32.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from online.frontend.vector_queries import Term

MAX_LIST_TERMS = 50             # in each of positive and negative
MAX_VECTOR_DIM = 10_000
MAX_COORDINATE = 1e6             # embeddings are O(1); bounded so that no weighted sum overflows float32
MAX_WEIGHT = 1e6
METHODS = {"add": "add", "mul": "mul"}          # 3CosAdd (most_similar), 3CosMul (most_similar_cosmul)


class BodyError(ValueError):
    def __init__(self, code: str, message: str, parameter: str):
        super().__init__(message)
        self.code, self.message, self.parameter = code, message, parameter


@dataclass
class TermQuery:
    terms: list[Term]
    n_positive: int
    k: int
    kind: str


def parse_k(data: dict, max_k: int) -> int:
    k = data.get("k", 10)
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= max_k:
        raise BodyError("bad_k", f'"k" must be an integer from 1 to {max_k}, got {str(k)[:40]!r}', "k")
    return k


def parse_word(value: Any, name: str, max_length: int) -> str:
    if not isinstance(value, str) or not value or len(value) > max_length:
        raise BodyError(f"bad_{name}", f"a word must be a string of 1 to {max_length} characters, "
                                       f"got {str(value)[:40]!r}", name)
    return value


def parse_vector(value: Any, name: str) -> np.ndarray:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_VECTOR_DIM \
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
        raise BodyError("bad_vector", f"{name}: a vector must be a list of 1 to {MAX_VECTOR_DIM} numbers", name)
    vector = np.asarray(value, dtype=np.float64)
    if not np.all(np.abs(vector) <= MAX_COORDINATE):
        raise BodyError("bad_vector", f"{name}: every number of a vector must be at most {MAX_COORDINATE:g} "
                                      "in size", name)
    return vector.astype(np.float32)


def _weight(value: Any, name: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
            or abs(value) > MAX_WEIGHT:
        raise BodyError("bad_weight", f"{name}: a weight must be a number of at most {MAX_WEIGHT:g} in size, "
                                      f"got {str(value)[:40]!r}", name)
    return float(value)


def _term(item: Any, name: str, sign: float, max_word_length: int) -> Term:
    if isinstance(item, str):
        return Term(parse_word(item, name, max_word_length), sign)
    if isinstance(item, list):
        return Term(parse_vector(item, name), sign)
    if isinstance(item, dict) and set(item) in ({"word"}, {"vector"}, {"word", "weight"}, {"vector", "weight"}):
        weight = _weight(item["weight"], name) if "weight" in item else sign
        if "word" in item:
            return Term(parse_word(item["word"], name, max_word_length), weight)
        return Term(parse_vector(item["vector"], name), weight)
    raise BodyError(f"bad_{name}", f'every item of "{name}" must be a word, a list of numbers, or an object '
                                   f'with "word" or "vector" and optionally "weight" (nothing else); '
                                   f'got {str(item)[:60]!r}', name)


def parse_terms(data: dict, max_k: int, max_word_length: int) -> TermQuery:
    """The query of a body with ``positive`` (and ``negative``, ``method``), or with ``vector``.
    ``positive`` may not be empty (a negative-only query is a positive term of weight -1)."""
    if "vector" in data:
        extra = {"positive", "negative", "words"} & set(data)
        if extra:
            raise BodyError("bad_body", f'"vector" cannot be combined with {", ".join(sorted(extra))}: put it '
                                        'in "positive" instead', "vector")
        terms = [Term(parse_vector(data["vector"], "vector"), 1.0)]
        return TermQuery(terms, 1, parse_k(data, max_k), "add")
    lists = {}
    for name in ("positive", "negative"):
        items = data.get(name, [])
        if not isinstance(items, list) or len(items) > MAX_LIST_TERMS:
            raise BodyError(f"bad_{name}", f'"{name}" must be a list of at most {MAX_LIST_TERMS} words or '
                                           "vectors", name)
        lists[name] = items
    if not lists["positive"]:
        raise BodyError("bad_positive", '"positive" must name at least one word or vector (a query of negative '
                                        'terms only: give them in "positive" with a negative "weight")', "positive")
    method = data.get("method", "add")
    if not isinstance(method, str) or method not in METHODS:
        raise BodyError("bad_method", f'"method" must be one of {", ".join(METHODS)}, got {str(method)[:40]!r}',
                        "method")
    terms = [_term(item, "positive", 1.0, max_word_length) for item in lists["positive"]]
    terms += [_term(item, "negative", -1.0, max_word_length) for item in lists["negative"]]
    n_positive = len(lists["positive"])
    if method == "mul":            # 3CosMul has no weights: the list a term is in says which side it is on
        terms = [Term(t.item, 1.0 if i < n_positive else -1.0) for i, t in enumerate(terms)]
    return TermQuery(terms, n_positive, parse_k(data, max_k), METHODS[method])
