"""The in-place kernel's noise table of output rows: the draw, the -1 entries, and the
trainer's cached row table, which must follow evictions, new rows and new layouts of the noise table."""
from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from online.learner.keys import output_rows
from online.learner.gradient_kernel import plan_pairs
from online.learner.sgns_kernel import (NO_CURVATURE, NO_LOSS, OPT_ROW_ADAGRAD, OPT_SGD, _draw, _lcg, noise_rows_of,
                                        train_inplace, train_inplace_rows)
from online.learner.trainer import LearnerConfig, Trainer


@njit
def _draws(seed, n, count):
    """``count`` successive draws from a table of ``n`` entries, the generator stepped as in the kernels."""
    state = np.uint64(seed) * np.uint64(2654435761) + np.uint64(1)
    out = np.empty(count, dtype=np.int64)
    for k in range(count):
        state = _lcg(state)
        out[k] = _draw(state, n)
    return out


@pytest.mark.parametrize("n", [1, 2, 7, 1009, 524_287, (1 << 32) - 1])
def test_the_draw_is_uniform_over_any_table_length(n):
    hits = _draws(3, n, 200_000)
    assert hits.min() >= 0 and hits.max() < n
    if n <= 1009:
        counts = np.bincount(hits, minlength=n)
        expected = len(hits) / n
        chi2 = ((counts - expected) ** 2 / expected).sum()
        assert chi2 < n + 6 * np.sqrt(2 * n), (n, chi2)       # within a uniform's spread
    else:                                                       # both halves and the ends are reached
        assert hits.min() < n // 1000 and hits.max() > n - n // 1000 and abs(np.mean(hits < n // 2) - 0.5) < 0.01


def _batch(seed=0, n_words=9, n_tokens=60):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, n_words, n_tokens).astype(np.int64)
    starts = np.array([0, 20, 21, n_tokens], dtype=np.int64)
    noise_slots = rng.integers(0, n_words, 101).astype(np.int32)
    slot_out_row = np.arange(n_words, 2 * n_words, dtype=np.int64)
    vectors = rng.normal(0, 0.3, (2 * n_words + 3, 8)).astype(np.float32)    # 3 spare rows, never used
    return n_words, tokens, starts, noise_slots, slot_out_row, vectors


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_the_row_kernel_is_the_slot_kernel_on_the_mapped_table(dtype):
    n_words, tokens, starts, noise_slots, slot_out_row, vectors = _batch()
    slot_out_row[[2, 5]] = -1                                # two noise words without a row: skipped
    rows = slot_out_row[noise_slots].astype(dtype)
    assert (noise_rows_of(noise_slots, slot_out_row) == rows).all()
    out = []
    for kernel, table in ((train_inplace, None), (train_inplace_rows, rows)):
        vec, acc = vectors.copy(), np.full((len(vectors), 1), 1e-8, np.float32)
        touched = np.zeros(len(vec), np.uint8)
        args = (noise_slots, slot_out_row) if table is None else (table,)
        # the row kernel also measures (contraction, sampled loss): that must not change what it trains
        measures = () if table is None else (np.zeros(len(vec), np.float32), np.zeros(2, np.float64))
        pairs = kernel(vec, vec, acc, acc, tokens, tokens + n_words, starts, *args, 3, 4, 0.1, OPT_ROW_ADAGRAD, 7,
                       touched, *measures)
        out.append((pairs, vec, acc, touched))
    (p0, v0, a0, t0), (p1, v1, a1, t1) = out
    assert p0 == p1 > 0
    curv, loss = measures
    assert (curv[t1 == 1] > 0).all() and not curv[t1 == 0].any(), "every row trained has a contraction"
    assert 0 < loss[1] <= p1 // 32 + 1 and 0 < loss[0] / loss[1] < 10 * 4, "a sampled loss per pair"
    np.testing.assert_array_equal(v0, v1)
    np.testing.assert_array_equal(a0, a1)
    np.testing.assert_array_equal(t0, t1)
    # only the batch's own rows and the rows of the table are written; -1 entries draw nothing
    allowed = set(tokens.tolist()) | set((tokens + n_words).tolist()) | set(rows[rows >= 0].tolist())
    assert set(np.flatnonzero(t1).tolist()) <= allowed
    for slot in (2, 5):
        if slot not in set(tokens.tolist()):
            assert not t1[n_words + slot], "a word without a row is never a negative"


def test_the_kernel_draws_the_negatives_plan_pairs_draws():
    """Same generator and draw: with SGD at a tiny rate, the output rows the kernel writes beyond the
    positives are exactly the rows of plan_pairs' negatives."""
    n_words, _, _, noise_slots, slot_out_row, vectors = _batch(1)
    tokens = np.random.default_rng(2).integers(0, 3, 12).astype(np.int64)     # centre words: slots 0..2
    starts = np.array([0, len(tokens)], dtype=np.int64)
    partial = 0
    for seed in range(1, 30):
        _, pair_out, negs = plan_pairs(tokens, starts, noise_slots, 1, 1, seed)
        vec = vectors.copy()
        touched = np.zeros(len(vec), np.uint8)
        in_rows = np.full(len(tokens), 2 * n_words, np.int64)    # a spare row: no overlap with output rows
        train_inplace_rows(vec, vec, np.zeros((0, 1), np.float32), np.zeros((0, 1), np.float32), in_rows,
                           tokens + n_words, starts, noise_rows_of(noise_slots, slot_out_row), 1, 1, 1e-3, OPT_SGD,
                           seed, touched, NO_CURVATURE, NO_LOSS)
        drawn = set(np.flatnonzero(touched[n_words:2 * n_words]).tolist())
        assert drawn == set(pair_out.tolist()) | set(negs[negs >= 0].tolist())
        partial += len(drawn) < n_words
    assert partial > 5, "in some batches some noise words were not drawn: the sets say something"


def _name(prefix: str, i: int) -> str:
    """A word of letters only (the text8 tokenizer spells digits out)."""
    letters = ""
    while True:
        letters += chr(97 + i % 26)
        i //= 26
        if not i:
            return prefix + letters


def _churn(n_batches: int, seed: int = 0) -> list[list[str]]:
    """Batches whose vocabulary keeps changing: frequent words, a drifting middle and one-off words,
    so that a small vocabulary evicts trainable words and new words keep becoming trainable."""
    rng = np.random.default_rng(seed)
    batches = []
    for b in range(n_batches):
        lines = []
        for _ in range(30):
            words = [_name("common", int(rng.integers(0, 8))) for _ in range(6)]
            words += [_name("mid", 12 * (b // 3) + int(rng.integers(0, 12))) for _ in range(6)]
            words += [_name("rare", int(rng.integers(0, 10 ** 6))) for _ in range(2)]
            rng.shuffle(words)
            lines.append(" ".join(words))
        batches.append(lines)
    return batches


def _live_noise_rows(trainer: Trainer) -> set[int]:
    """Output rows, in the shard now, of the trainable words that the noise table holds now."""
    slots = np.unique(trainer.noise.active()).astype(np.int64)
    slots = slots[trainer.vocab.trainable[slots]]
    rows = trainer.shard.rows_for(output_rows(trainer.vocab.keys[slots]), create=False)
    return set(rows[rows >= 0].tolist())


def test_the_row_table_follows_evictions_new_rows_and_layouts():
    config = LearnerConfig(dim=8, min_count=3, window=3, negative=5, vocab_capacity=120, noise_table_size=2003,
                           sample=0.0)
    trainer = Trainer(config, inplace=True)
    shard = trainer.shard
    evicted = prepares = 0
    kept_tables = []
    for batch in _churn(40):
        p = trainer.prepare(trainer.tokenizer.sentences_of(batch))
        prepares += 1
        evicted += p.stats.evicted
        fresh = trainer.slot_out_row[trainer.noise.active()]
        np.testing.assert_array_equal(p.noise, fresh)                # not stale
        live = _live_noise_rows(trainer)
        assert set(p.noise[p.noise >= 0].tolist()) == live           # only rows of live noise words
        kept_tables.append((p.noise, p.noise.copy()))
        reread = trainer.prepare(trainer.tokenizer.sentences_of(batch), update_vocab=False)
        prepares += 1
        assert reread.noise is p.noise, "nothing changed: the same table, not a rebuild"
        before = shard.vectors.copy()
        if len(p.in_rows) > 1:
            trainer.run(p)
            changed = set(np.flatnonzero(np.any(shard.vectors[:len(before)] != before, axis=1)).tolist())
            assert changed, "the batch trained"
            assert changed <= set(p.in_rows.tolist()) | set(p.out_rows.tolist()) | live
    assert evicted > 0 and trainer.noise.layouts > 3
    assert 1 < trainer.noise_rows_builds <= trainer.noise.layouts < prepares, "the table is rebuilt on change only"
    for table, copy in kept_tables:                                  # a published table is never written
        np.testing.assert_array_equal(table, copy)


def test_a_row_change_of_a_word_in_the_table_patches_a_copy_without_a_new_layout():
    config = LearnerConfig(dim=8, min_count=2, vocab_capacity=1000, noise_table_size=1009)
    trainer = Trainer(config, inplace=True)
    batch = ["the cat sat on the mat the dog sat on the log"] * 20
    first = trainer.prepare(trainer.tokenizer.sentences_of(batch))
    layouts, builds = trainer.noise.layouts, trainer.noise_rows_builds
    again = trainer.prepare(trainer.tokenizer.sentences_of(batch), update_vocab=False)
    assert again.noise is first.noise and trainer.noise_rows_builds == builds      # cached
    cat = trainer.vocab.slot("cat")
    assert cat in set(trainer.noise.active().tolist())
    with trainer._lock:
        trainer._set_out_rows(np.array([cat]), -1)                   # e.g. the word lost its row
    later = trainer.prepare(trainer.tokenizer.sentences_of(batch), update_vocab=False)
    assert trainer.noise.layouts == layouts and trainer.noise_rows_builds == builds and trainer.noise_rows_patches == 1
    assert later.noise is not first.noise
    assert (later.noise[trainer.noise.active() == cat] == -1).all()
    assert (later.noise == trainer.slot_out_row[trainer.noise.active()]).all()
    assert (first.noise[trainer.noise.active() == cat] >= 0).all(), "the earlier batch keeps its table"
    trainer.run(later)


def test_patching_the_row_table_equals_mapping_it_again():
    """``patched_noise_rows`` must give exactly ``noise_rows_of`` for any set of changed slots: present in
    the table or not, first or last, with runs of any length, and into a copy."""
    from online.learner.noise import NoiseTable
    from online.learner.sgns_kernel import noise_rows_of, patched_noise_rows

    rng = np.random.default_rng(4)
    for trial in range(30):
        n = int(rng.integers(2, 400))
        table = NoiseTable(size=int(rng.integers(50, 3000)), seed=trial)
        slots = np.flatnonzero(rng.random(n) < 0.7)
        if not len(slots):
            continue
        table.rebuild(slots, rng.integers(1, 10_000, len(slots)))
        slot_out_row = rng.integers(-1, 5000, n)
        before = noise_rows_of(table.active(), slot_out_row)
        frozen = before.copy()
        changed = np.unique(rng.choice(n, int(rng.integers(1, n + 1))))
        slot_out_row[changed] = rng.integers(-1, 5000, len(changed))
        patched = patched_noise_rows(before, table.active(), changed, slot_out_row)
        np.testing.assert_array_equal(patched, noise_rows_of(table.active(), slot_out_row))
        assert patched.dtype == before.dtype
        np.testing.assert_array_equal(before, frozen)      # the published array is not written
