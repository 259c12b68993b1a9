"""Writing embeddings in word2vec.c's text and binary formats.

Both start with a header line ``"<count> <dim>\\n"``. Text: one line per word, the word
then its values separated by spaces. Binary: the word, a space, ``dim`` little-endian
float32, then a newline (word2vec.c's layout; gensim's ``load_word2vec_format`` reads
both with or without that newline). Words are written in the order given; livevec
writes the most frequent first, which is what ``restrict_vocab`` in gensim's evaluations
assumes. Files are written to a temporary name and renamed, so a reader never sees half
a file.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def _check(words: list[str], vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(words):
        raise ValueError(f"{len(words)} words but vectors of shape {vectors.shape}")
    for w in words:
        if not w or any(c.isspace() for c in w):
            raise ValueError(f"word {w!r} cannot be written in word2vec format (empty or contains whitespace)")
    return vectors


def write_text(path: str | os.PathLike, words: list[str], vectors: np.ndarray) -> None:
    vectors = _check(words, vectors)
    tmp = Path(f"{path}.tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(f"{len(words)} {vectors.shape[1]}\n")
        for word, row in zip(words, vectors):
            out.write(word + " " + " ".join(f"{x:.6g}" for x in row.tolist()) + "\n")
    os.replace(tmp, path)


def write_binary(path: str | os.PathLike, words: list[str], vectors: np.ndarray) -> None:
    vectors = _check(words, vectors).astype("<f4", copy=False)
    tmp = Path(f"{path}.tmp")
    with open(tmp, "wb") as out:
        out.write(f"{len(words)} {vectors.shape[1]}\n".encode())
        for word, row in zip(words, vectors):
            out.write(word.encode("utf-8") + b" " + row.tobytes() + b"\n")
    os.replace(tmp, path)
