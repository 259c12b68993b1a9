"""The mini-batch SGNS driver: records -> sentences -> vocabulary -> subsample -> pairs -> update.

One ``Trainer`` is the learning side of a worker. Per mini-batch of records it:

1. tokenises them into sentences (``online.learner.tokenizers``);
2. counts the tokens in the online vocabulary (``online.learner.vocab``); words reaching
   ``min_count`` become trainable, evicted words have their rows freed in the store;
3. updates the adaptive noise table (``online.learner.noise``) with the count changes;
4. subsamples frequent words from the current counts (``online.learner.subsampling``) and drops
   words that are not trainable (yet);
5. trains, in one of two ways over the same vocabulary, noise and sampling:

   * **in place** when the store has a local shard (``livevec train``'s ``EmbeddingShard``, a worker's
     replica, ``online.cluster.replica``): ``sgns_kernel.train_inplace_rows`` updates the shard's rows after
     every pair, hogwild-style, as word2vec.c and gensim do (``LIVEVEC_KERNEL=hogbatch``:
     ``hogbatch_kernel.train_hogbatch_rows``, once per window, negatives shared by the window).
     Several threads may call ``train_*`` concurrently; the GIL-bound preparation is serialised by a lock and the
     compiled kernels run in parallel without the GIL. The kernel draws its negatives from
     the noise table mapped to output rows (``_current_noise_rows``), rebuilt only when the table is
     laid out again or a word in it gets or loses its row;
   * **pull / push** otherwise (``LIVEVEC_EXCHANGE=pullpush``): ``plan_pairs`` draws the windows and
     negatives, the batch's distinct input and output keys are pulled in ONE call,
     ``walk_gradients`` sums the gradients met while walking the pairs on a private copy
     at ``local_rate`` (0: all against the pulled snapshot), they are pushed in ONE
     call, and the server's optimizer (AdaGrad) applies them.

Entry points for a Kafka worker: ``Trainer(config, store).train_records(values)`` per
polled batch of record values (str or bytes), returning ``BatchStats``; the store's
``free`` / ``add_counts`` / ``set_words`` are called from inside as needed.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np

from online.learner.keys import output_rows, word_rows
from online.learner.noise import DEFAULT_TABLE_SIZE, NoiseTable
from online.learner.param_store import LocalParamStore, ParamStore
from online.learner.gradient_kernel import batch_gradients, plan_pairs, walk_gradients
from online.learner.hogbatch_kernel import train_hogbatch_rows
from online.learner.sgns_kernel import (NO_CURVATURE, OPT_ADAGRAD, OPT_ROW_ADAGRAD, OPT_SGD, noise_rows_of,
                                        patched_noise_rows, take_touched, train_inplace_rows)
from online.learner.spans import spans_of_sentences
from online.learner.subsampling import keep_tokens
from online.learner.tokenizers import Tokenizer
from online.learner.vocab import OnlineVocab

# The in-place kernels ``LIVEVEC_KERNEL`` chooses between (same arguments and results): ``pairs`` is word2vec.c's
# order, each (context, centre) pair with negatives of its own; ``hogbatch`` shares one set of negatives among a
# centre's context words and steps each row once per window (``online.learner.hogbatch_kernel``).
KERNELS = {"pairs": train_inplace_rows, "hogbatch": train_hogbatch_rows}
# A kernel's rate when ``LIVEVEC_ETA`` is not set, as a multiple of the AdaGrads' default. Under AdaGrad a row's
# travel over a pass grows about as the square root of its number of steps, and hogbatch steps a row once a window
# (a summed gradient) where pairs steps it once a pair, so it needs about twice the rate.
# SGD's constant rate is word2vec.c's for both: a summed gradient already steps as far as its pairs would.
# Design: docs/design/0002-kernels.md
KERNEL_ETA_SCALE = {"pairs": 1.0, "hogbatch": 2.0}
# ``LIVEVEC_KERNEL=auto`` (the default) picks a kernel by how many replicas may exchange deltas. As one model
# (``livevec train``, or the workers of one host sharing its replica) hogbatch learns more and faster. Across
# replicas its deltas (merged by alignment, ``online.cluster.replica``) combine as well as pairs' up to 2 replicas
# and worse beyond, so a worker takes hogbatch where its cluster declares at most 2 workers, pairs beyond.
# Design: docs/design/0002-kernels.md
HOGBATCH_MAX_REPLICAS = 2
KERNEL_CHOICES = ("auto", *KERNELS)


def kernel_for(choice: str, replicas: int) -> str:
    """The in-place kernel that ``choice`` (``LIVEVEC_KERNEL``) means for a model trained as ``replicas`` replicas
    that exchange deltas (1: one model)."""
    if choice != "auto":
        return choice
    return "hogbatch" if replicas <= HOGBATCH_MAX_REPLICAS else "pairs"


@dataclass
class LearnerConfig:
    """Hyper-parameters of the learner (word2vec names; defaults are gensim's/yskip's)."""

    dim: int = 100
    window: int = 5
    negative: int = 5
    min_count: int = 5
    sample: float = 1e-3
    vocab_capacity: int = 1_000_000
    noise_table_size: int = DEFAULT_TABLE_SIZE
    optimizer: str = "rowadagrad"       # "rowadagrad", "adagrad" (per coordinate) or "sgd" (comparisons)
    kernel: str = "auto"                # the in-place kernel: "pairs" (word2vec.c's order), "hogbatch" or "auto"
    eta: float | None = None            # None: 0.1 for the AdaGrads (0.2 with hogbatch), 0.025 for SGD
    adagrad_init: float = 1e-8          # initial accumulator (yskip: 1e-8)
    sgd_decay_words: int = 0            # SGD only: decay eta linearly to 0 over this many tokens (needs a corpus length)
    local_rate: float = 0.002           # pull/push path: SGD rate of the walk over a batch (0: one snapshot step)
    tokenizer: str = "text8"
    language: str = "auto"              # unicode: how CJK runs are segmented (auto, zh, ja)
    max_sentence_length: int = 10_000
    seed: int = 1

    def validate(self) -> None:
        for name in ("dim", "window", "min_count", "vocab_capacity", "noise_table_size", "max_sentence_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.negative < 0:
            raise ValueError("negative must be >= 0")
        if self.sample < 0:
            raise ValueError("sample must be >= 0")
        if self.optimizer not in ("adagrad", "rowadagrad", "sgd"):
            raise ValueError("optimizer must be adagrad, rowadagrad or sgd")
        if self.kernel not in KERNEL_CHOICES:
            raise ValueError(f"kernel must be one of {', '.join(KERNEL_CHOICES)}")
        if self.eta is not None and self.eta <= 0:
            raise ValueError("eta must be > 0")
        if not 0 <= self.local_rate <= 1:
            raise ValueError("local_rate must be in [0, 1]")


@dataclass
class BatchStats:
    sentences: int = 0
    tokens: int = 0          # tokens read (raw words)
    kept: int = 0            # trainable tokens kept after subsampling (gensim's "effective words")
    pairs: int = 0           # (context, centre) pairs trained
    loss: float | None = None  # summed SGNS loss (pull/push path only)
    evicted: int = 0         # trainable words evicted from the vocabulary
    seconds: float = 0.0
    loss_sampled: float = 0.0  # in place: the SGNS loss summed over a sample of the pairs (every 32nd) ...
    loss_pairs: int = 0        # ... and how many pairs that sample holds: their ratio is the live training signal
    cpu_prepare: float = 0.0   # CPU seconds of the calling thread: tokenising and preparing (under the GIL) ...
    cpu_kernel: float = 0.0    # ... and training the prepared batch (the kernel, without the GIL)

    def add(self, other: "BatchStats") -> None:
        """Accumulate another batch's counts (the loss is per batch and is not summed)."""
        self.sentences += other.sentences
        self.tokens += other.tokens
        self.kept += other.kept
        self.pairs += other.pairs
        self.evicted += other.evicted
        self.seconds += other.seconds
        self.loss_sampled += other.loss_sampled
        self.loss_pairs += other.loss_pairs
        self.cpu_prepare += other.cpu_prepare
        self.cpu_kernel += other.cpu_kernel


@dataclass
class _Prepared:
    stats: BatchStats
    seed: int
    eta: float
    # in place
    in_rows: np.ndarray | None = None
    out_rows: np.ndarray | None = None
    starts: np.ndarray | None = None
    noise: np.ndarray | None = None          # the noise table as output rows (``Trainer._noise_rows``)
    # pull / push
    keys: np.ndarray | None = None
    n_in: int = 0
    pair_in: np.ndarray | None = None
    pair_out: np.ndarray | None = None
    negs: np.ndarray | None = None
    t0: float = field(default_factory=time.perf_counter)


class Trainer:
    """SGNS over a stream of records; see the module docstring."""

    def __init__(self, config: LearnerConfig | None = None, store: ParamStore | None = None, *,
                 inplace: bool | None = None):
        self.config = config = config or LearnerConfig()
        config.validate()
        if store is None:
            store = LocalParamStore(dim=config.dim, optimizer=config.optimizer, eta=config.eta,
                                    adagrad_init=config.adagrad_init, seed=config.seed)
        if store.dim != config.dim:
            raise ValueError(f"store dim {store.dim} != config dim {config.dim}")
        self.store = store
        shard = store.local_shard()
        if inplace and shard is None:
            raise ValueError("in-place training needs a store with one local shard")
        self.shard = shard if inplace in (None, True) else None
        self.tokenizer = Tokenizer(config.tokenizer, config.max_sentence_length, language=config.language)
        self.vocab = OnlineVocab(config.vocab_capacity, config.min_count)
        self.noise = NoiseTable(config.noise_table_size, seed=config.seed)
        self._rng = np.random.default_rng(config.seed)
        self._lock = threading.Lock()
        self._local = threading.local()
        # "auto" here is one model; a worker resolves it for its cluster first (``WorkerSettings``).
        self.kernel = kernel_for(config.kernel, replicas=1)
        if self.shard is not None:
            self.eta = config.eta if config.eta is not None else self.shard.eta * (
                1.0 if self.shard.optimizer == "sgd" else KERNEL_ETA_SCALE[self.kernel])
            self._opt = {"adagrad": OPT_ADAGRAD, "rowadagrad": OPT_ROW_ADAGRAD, "sgd": OPT_SGD}[self.shard.optimizer]
            self._kernel = KERNELS[self.kernel]
            self.slot_in_row = np.full(config.vocab_capacity, -1, dtype=np.int64)
            self.slot_out_row = np.full(config.vocab_capacity, -1, dtype=np.int64)
            # The noise table as output rows, ``slot_out_row[noise.active()]``, for the kernel (one load per
            # negative instead of two). Built for the layout ``_noise_rows_layout`` of the noise table;
            # a row change of a slot outside that layout (a word becoming trainable between layouts, the
            # common case) costs nothing. A slot inside it whose row changes (an eviction, or a row given to a
            # word the table already holds; rare: no such patch in a profiled 2-worker run, whose 377 maps in
            # 811 batches were all new layouts) is queued in ``_noise_dirty`` and patched into a copy
            # (``patched_noise_rows``), not mapped again in full. Each array is never written once built:
            # a batch prepared earlier keeps its own.
            self._noise_rows = np.zeros(0, dtype=np.int32)
            self._noise_rows_layout = -1
            self._noise_dirty: list[np.ndarray] = []
            self.noise_rows_builds = 0
            self.noise_rows_patches = 0
        self.tokens_seen = 0
        self.totals = BatchStats()

    # ------------------------------------------------------------------ API
    def reseed(self, stream: int) -> None:
        """Draw windows, negatives and subsampling from sampling stream ``stream`` of the seed.

        Why: every worker of a cluster has the same ``LIVEVEC_SEED`` (the rows' initial values
        must agree), so without this they would all draw the same negatives in the same order,
        and their deltas to the noise words would be correlated rather than independent."""
        with self._lock:
            self._rng = np.random.default_rng([self.config.seed, int(stream)])

    def train_records(self, records, update_vocab: bool = True) -> BatchStats:
        """Train on a batch of text records (str or UTF-8 bytes), e.g. one Kafka poll."""
        c0 = time.thread_time()
        prepared = self.prepare(self.tokenizer.spans(records), update_vocab)
        return self._timed_run(prepared, c0)

    def train_sentences(self, sentences: list[list[str]], update_vocab: bool = True) -> BatchStats:
        """Train on tokenised sentences. ``update_vocab=False`` trains without counting
        (re-reading text already counted, e.g. the later passes of ``livevec train``)."""
        c0 = time.thread_time()
        prepared = self.prepare(sentences, update_vocab)
        return self._timed_run(prepared, c0)

    def _timed_run(self, prepared: _Prepared, c0: float) -> BatchStats:
        """``run``, with the thread's CPU split between the preparation (since ``c0``) and the run: where a
        worker's CPU per token goes, stage by stage (``livevec_worker_cpu_seconds_total``)."""
        c1 = time.thread_time()
        stats = self.run(prepared)
        stats.cpu_prepare, stats.cpu_kernel = c1 - c0, time.thread_time() - c1
        return stats

    def export(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(words, input vectors, counts) of the trainable vocabulary, most frequent first."""
        with self._lock:
            slots = self.vocab.trainable_slots()
            words = [self.vocab.words[s] for s in slots.tolist()]
            keys = self.vocab.keys[slots].copy()
            counts = self.vocab.counts[slots].copy()
        vectors = self.store.pull(keys) if len(keys) else np.zeros((0, self.config.dim), np.float32)
        return words, vectors, counts

    def _thread_buffer(self, name: str, capacity: int, dtype) -> np.ndarray:
        """This thread's zeroed array ``name`` of at least ``capacity`` entries, kept between batches (the kernel's
        per-row outputs: writing shared arrays from two threads costs throughput, see ``train_inplace``)."""
        buf = getattr(self._local, name, None)
        if buf is None or len(buf) < capacity:
            buf = np.zeros(capacity, dtype=dtype)
            setattr(self._local, name, buf)
        return buf

    def _touched_mask(self, capacity: int) -> np.ndarray:
        """This thread's uint8 mask of rows written by its kernel (see ``train_inplace``)."""
        return self._thread_buffer("touched", capacity, np.uint8)

    def _curvature(self, shard) -> np.ndarray:
        """This thread's float32 contraction buffer when the shard keeps the rows' contraction (a worker's
        replica, for the delta merge; ``sgns_kernel.train_inplace_rows``), else an empty one (not measured)."""
        if not getattr(shard, "tracks_contraction", False):
            return NO_CURVATURE
        return self._thread_buffer("curv", shard.capacity, np.float32)

    # -------------------------------------------------------------- stages
    def prepare(self, sentences: list[list[str]], update_vocab: bool = True) -> _Prepared:
        """The GIL-bound part: vocabulary, noise, subsampling, row/key resolution.

        ``sentences``: ``list[list[str]]``, or the ``TokenSpans`` of ``Tokenizer.spans`` (no
        string per token). Look-ups, counting and subsampling are compiled passes over the batch."""
        cfg = self.config
        spans = spans_of_sentences(sentences)
        stats = BatchStats(sentences=spans.num_sentences, tokens=spans.num_tokens)
        with self._lock:
            vocab = self.vocab
            if update_vocab:
                upd = vocab.update_spans(spans)
                slots = upd.slots
                stats.evicted = self._apply_vocab_update(upd)
            else:
                slots = vocab.lookup_spans(spans)
            keep_seed = int(self._rng.integers(1, 1 << 62))
            if self.shard is not None:
                in_rows, out_rows, starts = keep_tokens(slots, spans.sentences, vocab.trainable, vocab.counts,
                                                        vocab.trainable_total, cfg.sample, keep_seed,
                                                        self.slot_in_row, self.slot_out_row)
                kept = in_rows
            else:
                kept, starts = keep_tokens(slots, spans.sentences, vocab.trainable, vocab.counts,
                                           vocab.trainable_total, cfg.sample, keep_seed)
            stats.kept = len(kept)
            seed = int(self._rng.integers(1, 1 << 62))
            eta = self._eta()
            self.tokens_seen += stats.tokens
            prepared = _Prepared(stats, seed, eta)
            if self.shard is not None:
                prepared.in_rows = in_rows
                prepared.out_rows = out_rows
                prepared.starts = starts
                prepared.noise = self._current_noise_rows()
            elif len(kept):
                pair_in, pair_out, negs = plan_pairs(kept, starts, self.noise.active(), cfg.window, cfg.negative,
                                                     seed)
                in_u, in_local = np.unique(pair_in, return_inverse=True)
                outs = np.concatenate([pair_out, negs.ravel()])
                valid = outs >= 0
                out_u, out_inv = np.unique(outs[valid], return_inverse=True)
                out_local = np.full(len(outs), -1, dtype=np.int64)
                out_local[valid] = out_inv
                n_pairs = len(pair_in)
                prepared.keys = np.concatenate([vocab.keys[in_u], output_rows(vocab.keys[out_u])])
                prepared.n_in = len(in_u)
                prepared.pair_in = in_local.astype(np.int64)
                prepared.pair_out = out_local[:n_pairs]
                prepared.negs = out_local[n_pairs:].reshape(n_pairs, cfg.negative)
        return prepared

    def _current_noise_rows(self) -> np.ndarray:
        """The noise table as output rows (-1: no row), rebuilt if stale; call with the lock held."""
        if self._noise_rows_layout != self.noise.layouts:
            self._noise_rows_layout = self.noise.layouts
            self._noise_rows = noise_rows_of(self.noise.active(), self.slot_out_row)   # a new array
            self._noise_dirty = []
            self.noise_rows_builds += 1
        elif self._noise_dirty:
            dirty = np.unique(np.concatenate(self._noise_dirty))
            self._noise_dirty = []
            self._noise_rows = patched_noise_rows(self._noise_rows, self.noise.active(), dirty, self.slot_out_row)
            self.noise_rows_patches += 1
        return self._noise_rows

    def _set_out_rows(self, slots: np.ndarray, rows) -> None:
        """``slot_out_row[slots] = rows``, queueing the slots the noise table holds for the next patch."""
        self.slot_out_row[slots] = rows
        table = self.noise.active()
        if len(slots) and len(table):
            # the table is in slot order (``noise._layout``): a binary search tells who is in it. If it was
            # laid out again since the rows were mapped, the next batch maps it in full and drops the queue.
            # (slots in the table's dtype: a mixed search would convert the whole table, 0.08 ms a call)
            at = np.minimum(np.searchsorted(table, slots.astype(table.dtype, copy=False)), len(table) - 1)
            in_table = slots[table[at] == slots]
            if len(in_table):
                self._noise_dirty.append(in_table)

    def _eta(self) -> float:
        cfg = self.config
        eta = self.eta if self.shard is not None else (cfg.eta or 0.0)
        if cfg.optimizer == "sgd" and cfg.sgd_decay_words > 0:
            eta *= max(1e-4, 1.0 - self.tokens_seen / cfg.sgd_decay_words)
        return eta

    def _apply_vocab_update(self, upd) -> int:
        """Propagate a vocabulary update to the noise table and the store; returns evictions."""
        vocab, store = self.vocab, self.store
        if len(upd.evicted_slots) and self.shard is not None:
            self.slot_in_row[upd.evicted_slots] = -1
            self._set_out_rows(upd.evicted_slots, -1)
        if len(upd.evicted_keys):
            store.free(word_rows(upd.evicted_keys))
        if upd.counts_rescaled:
            live = np.flatnonzero(vocab.trainable)
            self.noise.rebuild(live, vocab.counts[live])
        else:
            self.noise.add(upd.touched, upd.new_counts, vocab.min_count, vocab.trainable[upd.touched])
        new = upd.newly_trainable
        if len(new):
            keys = vocab.keys[new]
            store.set_words(keys, [vocab.words[s] for s in new.tolist()])
            if self.shard is not None:
                rows = self.shard.rows_for(word_rows(keys), create=True)
                self.slot_in_row[new] = rows[:len(new)]
                self._set_out_rows(new, rows[len(new):])
        if getattr(store, "counts_every_word", False):
            # The store (a worker's replica) sends every word's increments to the servers, which own the
            # cluster's counts and answer with totals (``apply_cluster_counts``).
            store.count_words(upd.touched, vocab.keys[upd.touched], upd.new_counts - upd.old_counts)
            return len(upd.evicted_keys)
        counted = upd.new_counts >= vocab.min_count
        if counted.any():
            deltas = np.where(upd.old_counts >= vocab.min_count, upd.new_counts - upd.old_counts, upd.new_counts)
            store.add_counts(vocab.keys[upd.touched[counted]], deltas[counted])
        return len(upd.evicted_keys)

    def run(self, p: _Prepared) -> BatchStats:
        """The compiled part: train the prepared batch (no GIL held in the kernels)."""
        cfg, stats = self.config, p.stats
        if self.shard is not None:
            if len(p.in_rows) > 1:
                shard = self.shard
                with shard.training():
                    touched = self._touched_mask(shard.capacity)
                    curv = self._curvature(shard)
                    loss = np.zeros(2, dtype=np.float64)
                    stats.pairs = self._kernel(shard.vectors, shard.vectors, shard.accum, shard.accum,
                                               p.in_rows, p.out_rows, p.starts, p.noise, cfg.window,
                                               cfg.negative, p.eta, self._opt, p.seed, touched, curv, loss)
                    stats.loss_sampled, stats.loss_pairs = float(loss[0]), int(loss[1])
                    rows = take_touched(touched, shard.rows_in_use)   # no kernel writes above it
                    if len(curv):
                        shard.add_contraction(rows, curv[rows])
                        curv[rows] = 0.0
                    shard.mark_changed(rows)
        elif p.keys is not None and len(p.pair_in):
            values = self.store.pull(p.keys)
            in_vecs, out_vecs = values[:p.n_in], values[p.n_in:]
            grads = np.zeros_like(values)
            if cfg.local_rate > 0:
                stats.loss = float(walk_gradients(in_vecs, out_vecs, p.pair_in, p.pair_out, p.negs, cfg.local_rate,
                                                  grads[:p.n_in], grads[p.n_in:]))
            else:
                stats.loss = float(batch_gradients(in_vecs, out_vecs, p.pair_in, p.pair_out, p.negs,
                                                   grads[:p.n_in], grads[p.n_in:]))
            self.store.push(p.keys, grads)
            stats.pairs = len(p.pair_in)
        stats.seconds = time.perf_counter() - p.t0
        with self._lock:
            self.totals.add(stats)
        return stats


    def apply_cluster_counts(self, slots: np.ndarray, keys: np.ndarray, totals: np.ndarray) -> int:
        """The servers' totals of words this trainer counted (``slots`` as reported, -1 unknown): words
        whose cluster count reaches ``min_count`` become trainable here even if this worker saw them
        less often. Returns how many became trainable."""
        with self._lock:
            vocab = self.vocab
            slots = np.asarray(slots, dtype=np.int64)
            ok = slots >= 0
            ok[ok] = vocab.keys[slots[ok]] == keys[ok]    # the slot still holds that word
            return self._made_trainable(vocab.mark_trainable(slots[ok], totals[ok] >= vocab.min_count))

    def learn_cluster_trainable(self, known: np.ndarray, new_keys: np.ndarray) -> int:
        """The servers' journals: ``known`` (sorted) are every key the cluster trains, ``new_keys`` those
        this worker had not heard of. Words in the vocabulary among them become trainable now, and a word
        admitted later is trainable from its first occurrence if it is known. Returns how many became
        trainable now."""
        with self._lock:
            return self._made_trainable(self.vocab.learn_trainable(known, new_keys))

    def _made_trainable(self, new: np.ndarray) -> int:
        """Rows and strings for slots the cluster made trainable, and their place in the noise table from
        their first local count on (``online.learner.noise``). Call with the lock held."""
        if len(new):
            vocab = self.vocab
            self.noise.add(new, vocab.counts[new], 1)      # from their first local count
            new_keys = vocab.keys[new]
            self.store.set_words(new_keys, [vocab.words[s] for s in new.tolist()])
            if self.shard is not None:
                rows = self.shard.rows_for(word_rows(new_keys), create=True)
                self.slot_in_row[new] = rows[:len(new)]
                self._set_out_rows(new, rows[len(new):])
        return int(len(new))


def default_threads() -> int:
    return max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 8))


def warm_up(config: LearnerConfig) -> float:
    """Compile (or load from numba's cache) what training ``config`` runs, on a toy batch through a throwaway
    in-place trainer, so with the very argument types a real batch has; returns the seconds it took.

    Why: a cold compile holds the GIL, for about 15 s for the hogbatch kernel at one d (its window is unrolled for
    the compiler, ``hogbatch_kernel``), and a worker that compiled at its first batch would let its Kafka session
    and its ps-lite heartbeats lapse meanwhile. So a worker calls this before it joins either."""
    t0 = time.perf_counter()
    toy = replace(config, min_count=1, sample=0.0, vocab_capacity=64, kernel=kernel_for(config.kernel, 1))
    trainer = Trainer(toy, inplace=True)
    trainer.train_sentences([["warm", "up", "the", "window", "of", "words"]] * 4)
    trainer.train_records(["warm up the window of words"] * 4)   # a stream's path: the records' own buffers
    return time.perf_counter() - t0
