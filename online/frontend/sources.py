"""Model sources: where the front end gets the vectors it answers from.

The front end depends on nothing but this small interface, so that it can serve an
exported file, an in-process trainer or a parameter-server cluster the same way::

    class ModelSource(Protocol):
        async def changes_since(self, version: int) -> ModelDelta: ...
        async def stats(self) -> dict: ...
        async def close(self) -> None: ...          # optional

``changes_since(v)``
    Everything the caller needs to go from the model it got with version ``v`` to the
    source's current model. ``v == 0`` means "I have nothing": the answer is the whole
    model with ``full=True``. Otherwise the answer holds the rows (INPUT vectors, syn0)
    of the words added or changed after ``v`` and the keys removed after ``v``, with
    ``full=False``; if the source cannot answer incrementally for that ``v`` (it
    restarted, or ``v`` is too old) it returns the whole model with ``full=True`` and
    the caller replaces its copy. Nothing changed: an empty delta with ``version == v``.
    The caller passes the returned ``version`` to the next call. Versions are the
    source's own numbers, > 0, only compared for equality by the caller.
    Raising any exception means "unreachable now": the caller keeps its last copy,
    counts the error and tries again later.
``stats()``
    Training statistics shown on ``/v1/stats`` and the page. Conventional keys (all
    optional; anything else is passed through): ``words_trained`` (int),
    ``words_per_second`` (float), ``vocab_size`` (int), ``kafka_lag`` (int, records),
    ``updated_at`` (unix seconds of the last model change), ``workers``, ``servers``,
    ``training`` (the workers' training signal: ``online.cluster.training_signal.summarise_reports``).

A source used from the CLI is named by ``--source``: a short name from ``SOURCES`` or
``module:function``; the function is called as ``function(settings, env)`` with the
front end's ``FrontendSettings`` and the environment, and returns a ``ModelSource``.
"""
from __future__ import annotations

import asyncio
import importlib
import os
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

import numpy as np

from online.learner.word2vec_format import read_vocab_counts, read_word2vec
from online.learner.keys import is_input_row, word_keys
from online.search.delta import ModelDelta

if TYPE_CHECKING:  # pragma: no cover
    from online.learner.embedding_shard import EmbeddingShard
    from online.frontend.settings import FrontendSettings

_EMPTY_U64 = np.zeros(0, dtype=np.uint64)


@runtime_checkable
class ModelSource(Protocol):
    async def changes_since(self, version: int) -> ModelDelta: ...

    async def stats(self) -> dict[str, Any]: ...


class Word2VecFileSource:
    """Serves a word2vec text/binary file, and reloads it when it is replaced on disk.

    A periodic export job (Metronome / CronJob) can overwrite the file: write it to a
    temporary name and rename it over the old one, so the source never reads a
    half-written file; if it does (a copy in place), the parse fails, the front end keeps
    the previous model and the next sync reads the finished file. Every reload is a full
    delta with the next version number.
    """

    def __init__(self, path: str | os.PathLike, fmt: str = "auto", counts_path: str | os.PathLike | None = None):
        self.path = os.fspath(path)
        self.fmt = fmt
        self.counts_path = os.fspath(counts_path) if counts_path else None
        self._version = 0
        self._signature: tuple | None = None
        self._loaded_at: float | None = None
        self._lock = asyncio.Lock()

    def _file_signature(self) -> tuple:
        sig = []
        for p in (self.path, self.counts_path):
            if p:
                st = os.stat(p)
                sig.append((st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(sig)

    def _load(self) -> ModelDelta:
        wv = read_word2vec(self.path, self.fmt)
        counts = wv.counts
        if self.counts_path:
            table = read_vocab_counts(self.counts_path)
            counts = np.fromiter((table.get(w, 0) for w in wv.words), dtype=np.int64, count=len(wv.words))
        return ModelDelta(word_keys(wv.words), wv.words, wv.vectors, counts, 0, full=True)

    async def changes_since(self, version: int) -> ModelDelta:
        async with self._lock:
            signature = await asyncio.to_thread(self._file_signature)
            if signature != self._signature or self._version == 0:
                delta = await asyncio.to_thread(self._load)
                self._version += 1
                self._signature = signature
                self._loaded_at = time.time()
                delta.version = self._version
                self._last_full = delta
                return delta
            if version == self._version:
                return ModelDelta.unchanged(version, self._last_full.dim)
            full = self._last_full
            return ModelDelta(full.keys, full.words, full.vectors, full.counts, self._version, full=True)

    async def stats(self) -> dict[str, Any]:
        vocab = len(self._last_full) if self._version else 0
        return {"source": "word2vec-file", "path": self.path, "vocab_size": vocab,
                "updated_at": self._loaded_at}


class EmbeddingShardSource:
    """The INPUT rows of in-process ``EmbeddingShard`` objects (the in-process trainer).

    Each shard has its own version counter; this source hands out its own version numbers
    and remembers which shard versions each one stands for (the last ``history`` of them),
    so a caller's next ``changes_since`` asks every shard only for what changed since.
    Only even keys (input rows) whose word string is known are served.
    """

    def __init__(self, shards: Sequence["EmbeddingShard"], stats_fn: Callable[[], dict] | None = None,
                 history: int = 256):
        self.shards = list(shards)
        self.stats_fn = stats_fn
        self._issued: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        self._next_version = 1
        self._history = history
        self._lock = asyncio.Lock()

    async def changes_since(self, version: int) -> ModelDelta:
        async with self._lock:
            return await asyncio.to_thread(self._changes_since, version)

    def _changes_since(self, version: int) -> ModelDelta:
        since = self._issued.get(version) if version else None
        full = since is None
        if full:
            since = (0,) * len(self.shards)
        parts, removed, now = [], [], []
        for shard, v in zip(self.shards, since):
            changes = shard.changes_since(v)
            if changes.full_resync and not full:
                return self._changes_since(0)
            now.append(changes.version)
            keys = changes.changed[is_input_row(changes.changed)]
            parts.append(shard.named_input_rows(keys))
            removed.append(changes.removed[is_input_row(changes.removed)])
        now_t = tuple(now)
        if not full and now_t == since:
            return ModelDelta.unchanged(version, self.shards[0].dim if self.shards else 0)
        new_version = self._next_version
        self._next_version += 1
        self._issued[new_version] = now_t
        while len(self._issued) > self._history:
            self._issued.popitem(last=False)
        dim = self.shards[0].dim if self.shards else 0
        keys = np.concatenate([p[0] for p in parts]) if parts else _EMPTY_U64
        words = [w for p in parts for w in p[1]]
        vectors = np.concatenate([p[2] for p in parts]) if parts else np.zeros((0, dim), np.float32)
        counts = np.concatenate([p[3] for p in parts]) if parts else np.zeros(0, np.int64)
        gone = np.concatenate(removed) if removed else _EMPTY_U64
        return ModelDelta(keys, words, vectors, counts, new_version, full=full, removed=gone)

    async def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": "in-process", "shards": len(self.shards)}
        if self.stats_fn is not None:
            out.update(self.stats_fn())
        return out


def trainer_source(trainer) -> EmbeddingShardSource:
    """A source over an in-process ``online.learner.trainer.Trainer`` (its ``LocalParamStore`` shards)."""
    started = time.monotonic()

    def stats() -> dict[str, Any]:
        totals = trainer.totals
        elapsed = max(time.monotonic() - started, 1e-9)
        return {"words_trained": int(totals.tokens), "effective_words": int(totals.kept),
                "vocab_size": int(trainer.vocab.num_trainable()), "average_words_per_second": totals.tokens / elapsed}

    return EmbeddingShardSource(trainer.store.shards, stats_fn=stats)


# short name -> "module:function"; "ps" is written by the streaming engineer against this interface.
SOURCES: dict[str, str] = {
    "word2vec": "online.frontend.sources:word2vec_source_from_settings",
    "ps": "online.frontend.ps_source:create_source",
}


def word2vec_source_from_settings(settings: "FrontendSettings", env: Mapping[str, str]) -> Word2VecFileSource:
    return Word2VecFileSource(settings.model_file, settings.model_format, settings.vocab_counts_file)


def resolve_source_factory(spec: str) -> Callable[..., ModelSource]:
    """The factory named by ``spec`` (a short name or ``module:function``); raises ImportError/AttributeError."""
    target = SOURCES.get(spec, spec)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected one of {', '.join(SOURCES)} or module:function, got {spec!r}")
    return getattr(importlib.import_module(module_name), attr)
