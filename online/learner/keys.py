"""The model's key layout: which ps-lite key holds which row of which word.

A word's key is BLAKE2b-64 of its UTF-8 bytes (the first 8 bytes of the digest, read
little-endian) with bit 0 cleared. Its INPUT row (syn0) lives at that key and its OUTPUT
row (syn1neg) at ``key | 1``; an odd key is therefore always an output row, and nothing
else may be stored at one. Every process that reads or writes the model (workers,
servers, the front end, checkpoints, a C++ ps-lite node) agrees on this layout, so it is
written here once.

Why this layout:

* **Both rows of a word sit side by side**, on one server. ps-lite gives each server a
  contiguous key range, so ``k`` and ``k | 1`` share a server (unless a range starts
  at an odd key, which splits exactly one of the 2^63 possible words), and a word's
  rows move together when a checkpoint is loaded by another number of servers.
* **Hash keys spread evenly over key ranges.** BLAKE2b output is uniform over
  [0, 2^64), so ps-lite's even split of the key space balances the servers whatever
  the vocabulary looks like, with no table to ship when a word appears.
* **No shared state.** BLAKE2b is in every Python's ``hashlib`` and in libsodium and
  every language's standard crypto, so a restarted worker, the front end and a C++
  node compute the same key on their own (Python's ``hash`` is salted per process).

Collisions: with 63 effective bits, n distinct words collide with probability about
n^2 / 2^64 (3e-6 for 10 million words); two words that do share a key share both rows
(see ``online.learner.vocab``).
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

OUTPUT_BIT = np.uint64(1)     # set on a word's output row; also usable inside numba kernels
_WORD_MASK = (1 << 64) - 2    # a word key never has OUTPUT_BIT


def word_key(token: str) -> int:
    """Stable 64-bit key of ``token`` (see the module docstring)."""
    digest = hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _WORD_MASK


def word_keys(tokens: Sequence[str]) -> np.ndarray:
    """``word_key`` of each token, as a uint64 array (``word_key`` inlined: a third faster on 10M words)."""
    blake, frombytes = hashlib.blake2b, int.from_bytes
    keys = np.fromiter((frombytes(blake(t.encode("utf-8"), digest_size=8).digest(), "little") for t in tokens),
                       dtype=np.uint64, count=len(tokens))
    return keys & np.uint64(_WORD_MASK)


def input_rows(keys: np.ndarray) -> np.ndarray:
    """Keys of the input rows of words with these ``keys``: the word keys themselves."""
    return np.asarray(keys, dtype=np.uint64)


def output_rows(keys: np.ndarray) -> np.ndarray:
    """Keys of the output rows of words with these ``keys``."""
    return np.asarray(keys, dtype=np.uint64) | OUTPUT_BIT


def word_rows(keys: np.ndarray) -> np.ndarray:
    """Both rows of each word: all the input rows, then all the output rows."""
    keys = np.asarray(keys, dtype=np.uint64)
    return np.concatenate([keys, keys | OUTPUT_BIT])


def is_input_row(keys: np.ndarray) -> np.ndarray:
    """Which of these row keys are input rows (the ones that name a word and carry its vector)."""
    return (np.asarray(keys, dtype=np.uint64) & OUTPUT_BIT) == 0
