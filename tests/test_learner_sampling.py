"""The adaptive noise table against exact unigram^0.75, and online subsampling."""
from __future__ import annotations

import numpy as np
from scipy import stats

from online.learner.noise import NoiseTable
from online.learner.subsampling import keep_mask, keep_probability
from online.learner.vocab import OnlineVocab


def _zipf_stream(n_tokens: int, n_types: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    ranks = rng.zipf(1.2, size=3 * n_tokens)
    ranks = ranks[ranks <= n_types][:n_tokens]
    return [f"w{r}" for r in ranks.tolist()]


def _stream_into_table(tokens: list[str], table_size: int, min_count: int, batch: int = 1000):
    vocab = OnlineVocab(capacity=100_000, min_count=min_count)
    table = NoiseTable(table_size, seed=7)
    for i in range(0, len(tokens), batch):
        upd = vocab.update(tokens[i:i + batch])
        table.add(upd.touched, upd.new_counts, vocab.min_count)
    return vocab, table


def _chi_square_against_exact(vocab: OnlineVocab, observed_slots: np.ndarray):
    """Chi-square of observed slot frequencies against count^0.75 of the trainable words."""
    slots = np.flatnonzero(vocab.trainable)
    p = vocab.counts[slots].astype(float) ** 0.75
    p /= p.sum()
    n = len(observed_slots)
    lookup = np.full(vocab.capacity, -1)
    lookup[slots] = np.arange(len(slots))
    idx = lookup[observed_slots]
    assert (idx >= 0).all(), "the table holds a word that is not trainable"
    observed = np.bincount(idx, minlength=len(slots)).astype(float)
    expected = n * p
    # merge the tail so that every cell expects >= 5 draws
    order = np.argsort(-expected)
    observed, expected = observed[order], expected[order]
    big = expected >= 5
    obs, exp = observed[big], expected[big]
    if (~big).any():
        obs = np.append(obs, observed[~big].sum())
        exp = np.append(exp, expected[~big].sum())
    return stats.chisquare(obs, exp), len(obs)


def test_table_matches_exact_unigram_075_along_a_stream():
    tokens = _zipf_stream(60_000, 400, seed=1)
    vocab, table = _stream_into_table(tokens, table_size=1 << 20, min_count=5)
    assert table.filled == table.size and table.layouts > 1
    draws = table.sample(40_000, np.random.default_rng(3))
    result, cells = _chi_square_against_exact(vocab, draws)
    assert cells > 30
    assert result.pvalue > 1e-3, result


def test_a_small_table_matches_exact_unigram_075_when_the_weights_far_exceed_its_size():
    tokens = _zipf_stream(200_000, 300, seed=2)
    vocab, table = _stream_into_table(tokens, table_size=4096, min_count=5)
    assert table.filled == table.size and table.z > 4 * table.size
    result, cells = _chi_square_against_exact(vocab, table.active())
    assert cells > 30
    assert result.pvalue > 1e-3, result
    # and the test can fail: the plain unigram (power 1) is rejected
    p1 = vocab.counts[np.flatnonzero(vocab.trainable)].astype(float)
    wrong = NoiseTable(4096, power=1.0, seed=7)
    wrong.rebuild(np.flatnonzero(vocab.trainable), p1)
    bad, _ = _chi_square_against_exact(vocab, wrong.active())
    assert bad.pvalue < 1e-6


def test_words_below_min_count_are_never_negatives_and_rebuild_is_exact():
    vocab, table = _stream_into_table(["a"] * 50 + ["b"] * 4 + ["c"] * 10, table_size=1000, min_count=5)
    present = set(table.active().tolist())
    assert vocab.slot("b") not in present and {vocab.slot("a"), vocab.slot("c")} <= present
    table.rebuild(np.array([vocab.slot("a"), vocab.slot("c")]), np.array([16, 1]))
    share = np.mean(table.active() == vocab.slot("a"))
    assert abs(share - 8 / 9) < 0.1


def test_each_word_holds_its_share_of_the_table_to_within_one_entry():
    vocab, table = _stream_into_table(_zipf_stream(100_000, 2000, seed=4), table_size=100_003, min_count=3,
                                      batch=500)
    table.rebuild(np.flatnonzero(vocab.trainable), vocab.counts[np.flatnonzero(vocab.trainable)])
    slots = np.flatnonzero(vocab.trainable)
    w = vocab.counts[slots].astype(float) ** 0.75
    held = np.bincount(table.active(), minlength=vocab.capacity)[slots]
    assert held.sum() == table.size
    assert np.abs(held - w / w.sum() * table.size).max() <= 1.0 + 1e-9


def test_the_table_is_laid_out_again_once_the_weights_moved_by_refresh_and_old_layouts_stay_intact():
    table = NoiseTable(1000, refresh=0.1)
    table.add(np.array([0, 1]), np.array([100, 100]), 5)
    first = table.active()
    snapshot = first.copy()
    assert table.layouts == 1 and set(first.tolist()) == {0, 1}
    table.add(np.array([2]), np.array([5]), 5)      # 5^0.75 = 3.3: under 10 % of z
    assert table.layouts == 1 and 2 not in set(table.active().tolist())
    table.add(np.array([2]), np.array([100]), 5)
    assert table.layouts == 2 and abs(np.mean(table.active() == 2) - 1 / 3) < 0.01
    assert (first == snapshot).all()      # a kernel still sampling the previous layout is not disturbed


def test_keep_probability_is_word2vec_formula():
    total, sample = 1_000_000, 1e-3
    counts = np.array([1, 100, 1000, 10_000, 100_000])
    p = keep_probability(counts, total, sample)
    t = sample * total
    expected = np.minimum(1.0, (np.sqrt(counts / t) + 1) * t / counts)
    np.testing.assert_allclose(p, expected)
    assert p[0] == 1.0 and p[1] == 1.0 and p[-1] < 0.15
    assert (np.diff(p) <= 0).all()
    assert (keep_probability(counts, total, 0.0) == 1).all()


def test_keep_mask_draws_at_those_rates():
    counts = np.array([0, 5_000, 50_000, 500_000])
    total = counts.sum()
    slots = np.repeat(np.arange(4), 20_000)
    kept = keep_mask(slots, counts, total, 1e-3, np.random.default_rng(5))
    p = keep_probability(counts, total, 1e-3)
    for s in (1, 2, 3):
        rate = kept[slots == s].mean()
        sd = np.sqrt(p[s] * (1 - p[s]) / 20_000)
        assert abs(rate - p[s]) < 5 * sd + 1e-9, (s, rate, p[s])


def test_a_word_the_cluster_trains_is_a_negative_from_its_first_local_count():
    """With many workers a word the cluster trains is locally rare everywhere: at 64 workers a word
    counted 300 times is seen about 5 times by each. If each worker's noise table admitted it only at
    a local min_count, most workers would never draw it as a negative (64 replicas lost 1.7 points of
    analogy to that in the simulation); it joins at its local count instead."""
    from online.learner.keys import word_key
    from online.learner.trainer import LearnerConfig, Trainer
    trainer = Trainer(LearnerConfig(dim=8, min_count=5, vocab_capacity=1000, noise_table_size=10_007),
                      inplace=True)
    sentence = ["common"] * 6 + ["rare", "rare"]
    trainer.run(trainer.prepare([sentence]))
    rare = trainer.vocab.slot("rare")
    assert rare not in set(trainer.noise.active().tolist())          # locally below min_count
    assert trainer.apply_cluster_counts(np.array([rare]), np.array([word_key("rare")], np.uint64),
                                        np.array([300])) == 1
    share = np.mean(trainer.noise.active() == rare)
    common = trainer.vocab.counts[trainer.vocab.slot("common")]
    expected = 2 ** 0.75 / (2 ** 0.75 + common ** 0.75)               # its local count's weight
    assert abs(share - expected) < 0.01, (share, expected)


def test_the_table_lays_out_exactly_the_words_of_positive_weight_as_they_join():
    """The layout reads the slots in the table from a list kept as words join (not a scan of every slot's weight):
    after any sequence of counts it is the layout of every positive weight, in slot order."""
    from online.learner.noise import _layout
    rng = np.random.default_rng(4)
    table = NoiseTable(size=10_007, refresh=0.0)            # laid out after every change
    counts = np.zeros(5_000, np.int64)
    for _ in range(40):
        slots = np.unique(rng.integers(0, 5_000, 300))
        counts[slots] += rng.integers(1, 4, len(slots))
        early = rng.random(len(slots)) < 0.1
        table.add(slots, counts[slots], 5, early)
        expected = np.empty(table.size, np.int32)
        z = _layout(table._weights, np.flatnonzero(table._weights > 0), expected)
        np.testing.assert_array_equal(table.active(), expected)
        assert table.z == z
    table.rebuild(np.arange(0, 5_000, 7), counts[::7] + 1)
    expected = np.empty(table.size, np.int32)
    _layout(table._weights, np.arange(0, 5_000, 7), expected)
    np.testing.assert_array_equal(table.active(), expected)
