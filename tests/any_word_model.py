"""A model whose vocabulary holds hostile words, and a front-end source plug-in that serves it.

Why a plug-in rather than ``--model``: a word2vec file cannot hold a word with a space, and
the live model can (a JSON record's token list), so the real process is started with
``LIVEVEC_MODEL_SOURCE=tests.any_word_model:source`` on an ``.npz`` of words, vectors and
counts (the path in ``ANY_WORD_MODEL``), the way a deployment names its own source.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from online.search.delta import ModelDelta
from online.learner.keys import word_keys

HOSTILE = ["a,b", "x/y", "what?", "#tag", "100%", "C++", '"q"', "🙂", "分散", "שלום", "two words"]


def hostile_model(seed: int = 27, filler: int = 3000, dim: int = 24):
    """Planted pairs and an analogy, the hostile words (each near one planted word, so they have
    meaningful neighbours), filler words; counts descending, so row order is the export's order."""
    rng = np.random.default_rng(seed)
    words, vectors = [], []
    for a, b in [("paris", "france"), ("berlin", "germany"), ("tokyo", "japan")]:
        c = rng.standard_normal(dim)
        words += [a, b]
        vectors += [c + 0.1 * rng.standard_normal(dim), c + 0.1 * rng.standard_normal(dim)]
    royal, male, female = rng.standard_normal((3, dim))
    words += ["king", "queen", "man", "woman"]
    vectors += [royal + male, royal + female, male, female]
    for i, word in enumerate(HOSTILE):
        words.append(word)
        vectors.append(vectors[i % 10] + 0.5 * rng.standard_normal(dim))
    words += [f"w{i}" for i in range(filler)]
    vectors += list(rng.standard_normal((filler, dim)))
    vectors = np.asarray(vectors, dtype=np.float32)
    counts = np.arange(len(words), 0, -1, dtype=np.int64) * 10
    return words, vectors, counts


def save(path, words, vectors, counts) -> None:
    np.savez(path, words=np.array(words, dtype=object), vectors=vectors, counts=counts)


class NpzSource:
    """The whole model once (version 1), then "unchanged"."""

    def __init__(self, path: str):
        data = np.load(path, allow_pickle=True)
        words = [str(w) for w in data["words"]]
        self._delta = ModelDelta(word_keys(words), words, data["vectors"].astype(np.float32),
                                 data["counts"].astype(np.int64), 1, full=True)

    async def changes_since(self, version: int) -> ModelDelta:
        if version == 1:
            return ModelDelta.unchanged(1, self._delta.dim)
        return self._delta

    async def stats(self) -> dict:
        return {"source": "any-word-test", "vocab_size": len(self._delta)}


def source(settings, env: Mapping[str, str]) -> NpzSource:
    return NpzSource(env["ANY_WORD_MODEL"])
