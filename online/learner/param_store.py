"""The parameter store the trainer talks to: one pull and one push per mini-batch.

``ParamStore`` is the whole contract between the learner and wherever the rows live.
``LocalParamStore`` keeps them in this process in one or more ``EmbeddingShard`` s; the
ps_bridge-backed store implements the same methods over KVWorker (ps-lite ZPull/ZPush).

Contract (keys are uint64 row keys of the model's key layout, ``online.learner.keys``;
values are float32 [len(keys), dim]):

``pull(keys) -> values``
    Current rows, created with the deterministic init on first touch. Keys may repeat.
``push(keys, grads)``
    Gradients dL/d(row) of the SGNS loss for these keys (distinct, as produced by the
    trainer), applied by the store's optimizer (AdaGrad on the server). Gradients, not
    deltas: the optimizer state lives beside the rows, so any number of workers can
    push without sharing learning-rate state.
``free(keys)``
    Rows of evicted words (the trainer passes both rows of each, ``keys.word_rows``).
``add_counts(keys, deltas)`` / ``set_words(keys, words)``
    Word occurrence counts (increments) and strings, keyed by input key, for the front
    end and the output files. Called once per batch with arrays.
``local_shard()``
    The single in-process ``EmbeddingShard`` if there is exactly one, else None. The
    in-process trainer uses it to update rows in place (hogwild, like word2vec.c) rather
    than pull/push; remote stores return None.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from online.learner.embedding_shard import EmbeddingShard

KEY_SPACE = 1 << 64


@runtime_checkable
class ParamStore(Protocol):
    dim: int

    def pull(self, keys: np.ndarray) -> np.ndarray: ...

    def push(self, keys: np.ndarray, grads: np.ndarray) -> None: ...

    def free(self, keys: np.ndarray) -> None: ...

    def add_counts(self, keys: np.ndarray, deltas: np.ndarray) -> None: ...

    def set_words(self, keys: np.ndarray, words: list[str]) -> None: ...

    def local_shard(self) -> EmbeddingShard | None: ...


def server_range_starts(num_servers: int) -> np.ndarray:
    """First key of each server's range, as ps-lite splits them: (2^64-1) / n * i."""
    step = (KEY_SPACE - 1) // num_servers
    return np.array([step * i for i in range(num_servers)], dtype=np.uint64)


class LocalParamStore:
    """In-process store over ``EmbeddingShard`` s split by key range, as ps-lite servers are."""

    def __init__(self, shards: list[EmbeddingShard] | None = None, *, num_shards: int = 1, dim: int = 100,
                 **shard_options):
        self.shards = list(shards) if shards else [EmbeddingShard(dim, **shard_options) for _ in range(num_shards)]
        dims = {s.dim for s in self.shards}
        if len(dims) != 1:
            raise ValueError("all shards must have the same dim")
        self.dim = dims.pop()
        self._starts = server_range_starts(len(self.shards))

    def _route(self, keys: np.ndarray) -> list[np.ndarray]:
        """Positions of ``keys`` that belong to each shard."""
        if len(self.shards) == 1:
            return [np.arange(len(keys))]
        owner = np.searchsorted(self._starts, keys, side="right") - 1
        order = np.argsort(owner, kind="stable")
        cuts = np.searchsorted(owner[order], np.arange(1, len(self.shards)))
        return np.split(order, cuts)

    def pull(self, keys: np.ndarray) -> np.ndarray:
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        if len(self.shards) == 1:
            return self.shards[0].pull(keys)
        out = np.empty((len(keys), self.dim), dtype=np.float32)
        for shard, pos in zip(self.shards, self._route(keys)):
            if len(pos):
                out[pos] = shard.pull(keys[pos])
        return out

    def push(self, keys: np.ndarray, grads: np.ndarray) -> None:
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        grads = np.asarray(grads, dtype=np.float32).reshape(len(keys), self.dim)
        for shard, pos in zip(self.shards, self._route(keys)):
            if len(pos):
                shard.push(keys[pos], grads[pos])

    def free(self, keys: np.ndarray) -> None:
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        for shard, pos in zip(self.shards, self._route(keys)):
            if len(pos):
                shard.free(keys[pos])

    def add_counts(self, keys: np.ndarray, deltas: np.ndarray) -> None:
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        deltas = np.asarray(deltas, dtype=np.int64)
        for shard, pos in zip(self.shards, self._route(keys)):
            if len(pos):
                shard.add_counts(keys[pos], deltas[pos])

    def set_words(self, keys: np.ndarray, words: list[str]) -> None:
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        for shard, pos in zip(self.shards, self._route(keys)):
            if len(pos):
                shard.set_words(keys[pos], [words[i] for i in pos.tolist()])

    def local_shard(self) -> EmbeddingShard | None:
        return self.shards[0] if len(self.shards) == 1 else None
