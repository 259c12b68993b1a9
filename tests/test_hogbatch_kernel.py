"""The HogBatch kernel (``online.learner.hogbatch_kernel``) against its maths written out in numpy, its side
outputs, what it learns through the Trainer, and the LIVEVEC_KERNEL setting that selects it."""
from __future__ import annotations

import argparse

import numpy as np
import pytest
from gensim.models import KeyedVectors

from online.learner.hogbatch_kernel import train_hogbatch_rows
from online.learner.settings import LEARNER, WORKER_MODEL, learner_config_from_args
from online.learner.sgns_kernel import NO_CURVATURE, NO_LOSS, OPT_ADAGRAD, OPT_ROW_ADAGRAD, OPT_SGD, \
    train_inplace_rows
from online.learner.trainer import LearnerConfig, Trainer
from ps_bridge.settings import SettingError
from tests.test_learner_end_to_end import _assert_pairs_are_nearest_neighbours, planted_corpus
from tests.test_learner_kernel import _table_sigmoid

MASK = (1 << 64) - 1
OPTIMIZERS = {"sgd": OPT_SGD, "rowadagrad": OPT_ROW_ADAGRAD, "adagrad": OPT_ADAGRAD}


def _lcg(state: int) -> int:
    return (state * 25214903917 + 11) & MASK


def _reference_hogbatch(vectors, acc, in_rows, out_rows, starts, noise_rows, window, negative, eta, optimizer, seed):
    """HogBatch in numpy (float64), written from the module docstring: per centre word, word2vec.c's window and
    draws (the first context's ``negative`` draws are the window's negatives, -1 and the positive skipped; the
    other contexts' draws are made and unused), then F = U V^T from the old rows, G = Y - s(F), each target
    stepped once along G^T U, then each context along G V. Returns (pairs, x, a, curv, loss[2])."""
    x, a = vectors.astype(np.float64), acc.astype(np.float64)
    curv = np.zeros(len(x))
    loss = np.zeros(2)
    dim = x.shape[1]
    state = (seed * 2654435761 + 1) & MASK
    pairs = windows = 0

    def step(row, grad):
        if optimizer == OPT_ROW_ADAGRAD:
            a[row, 0] += grad @ grad / dim
            rate = eta / np.sqrt(a[row, 0])
            x[row] += rate * grad
        elif optimizer == OPT_ADAGRAD:
            a[row] += grad ** 2
            x[row] += eta * grad / np.sqrt(a[row])
            rate = eta / np.sqrt(a[row, 0])
        else:
            rate = eta
            x[row] += eta * grad
        return rate

    for s in range(len(starts) - 1):
        lo, hi = starts[s], starts[s + 1]
        for i in range(lo, hi):
            state = _lcg(state)
            reach = window - state % window
            contexts = [in_rows[j] for j in range(max(lo, i - reach), min(hi, i + reach + 1)) if j != i]
            targets = [out_rows[i]]
            if contexts and len(noise_rows):
                for draw in range(len(contexts) * negative):
                    state = _lcg(state)
                    t = int(noise_rows[(state >> 16) % len(noise_rows)])
                    if draw < negative and t >= 0 and t != out_rows[i]:
                        targets.append(t)
            if not contexts:
                continue
            u, v = x[contexts].copy(), x[targets].copy()
            f = u @ v.T
            sig = np.vectorize(_table_sigmoid)(f)
            labels = np.zeros(len(targets))
            labels[0] = 1.0
            g = labels - sig
            if windows % 32 == 0:
                loss[0] += np.log1p(np.exp(-f[:, 0])).sum() + np.log1p(np.exp(f[:, 1:])).sum()
                loss[1] += len(contexts)
            windows += 1
            ds = sig * (1 - sig)
            for t, row in enumerate(targets):
                curv[row] += step(row, g[:, t] @ u) * (ds[:, t] @ (u * u).sum(1))
            for c, row in enumerate(contexts):
                curv[row] += step(row, g[c] @ v) * (ds[c] @ (v * v).sum(1))
            pairs += len(contexts)
    return pairs, x, a, curv, loss


def _batch(seed=5, dim=8):
    """Tokens of words 0..8 in several sentences (one of one word); a noise table of words 0..10 with holes
    (-1); 12 words, so the input rows of words 9..11 and the output row of word 11 must stay untouched."""
    rng = np.random.default_rng(seed)
    n_words = 12
    tokens = rng.integers(0, 9, 60).astype(np.int64)
    starts = np.array([0, 15, 16, 40, 60], dtype=np.int64)
    noise_rows = (n_words + rng.integers(0, 11, 80)).astype(np.int32)
    noise_rows[rng.random(80) < 0.1] = -1
    vectors = rng.normal(0, 1.2 * (8 / dim) ** 0.5, (2 * n_words, dim)).astype(np.float32)   # |f| up to about 4:
    return n_words, tokens, starts, noise_rows, vectors                                      # no clipping at 6


@pytest.mark.parametrize("optimizer", ["sgd", "rowadagrad", "adagrad"])
@pytest.mark.parametrize("case", ["default", "empty sentences", "no noise", "no negatives"])
def test_the_kernel_is_hogbatch_written_out(optimizer, case):
    """Against the numpy reference: the rows, the accumulators, the contraction and the sampled loss; ``touched``
    is exactly the rows that changed; the pair count is the pairs kernel's."""
    _check_against_the_reference(optimizer, case, dim=8, negative=4)


@pytest.mark.parametrize("optimizer", ["sgd", "rowadagrad", "adagrad"])
@pytest.mark.parametrize("dim, negative", [(100, 4), (100, 7), (8, 7), (100, 0)])
def test_the_compiled_d_and_several_target_blocks_follow_the_maths(optimizer, dim, negative):
    """d = 100 runs as a compiled constant, and more than 5 negatives take two blocks of the dots (the second
    padded): the same maths as the reference either way."""
    _check_against_the_reference(optimizer, "default", dim=dim, negative=negative)


@pytest.mark.parametrize("optimizer", ["sgd", "rowadagrad", "adagrad"])
@pytest.mark.parametrize("dim, negative", [(100, 5), (8, 5), (100, 4), (100, 7)])
def test_without_the_side_outputs_the_rows_still_follow_the_maths(optimizer, dim, negative):
    """Without the contraction and the loss (a worker's hogbatch replica, ``livevec train``) the kernel takes two
    contexts a pass where the targets fill one block: the rows and accumulators are still the reference's."""
    opt = OPTIMIZERS[optimizer]
    n_words, tokens, starts, noise_rows, vectors = _batch(dim=dim)
    window, seed, eta = 3, 17, 0.05
    acc = np.full((len(vectors), dim if opt == OPT_ADAGRAD else 1), 1e-3, np.float32)
    in_rows, out_rows = tokens, tokens + n_words
    want_pairs, want_x, want_a, _, _ = _reference_hogbatch(
        vectors, acc, in_rows, out_rows, starts, noise_rows, window, negative, eta, opt, seed)
    got_x, got_a = vectors.copy(), acc.copy()
    touched = np.zeros(len(vectors), np.uint8)
    pairs = train_hogbatch_rows(got_x, got_x, got_a, got_a, in_rows, out_rows, starts, noise_rows, window,
                                negative, eta, opt, seed, touched, NO_CURVATURE, NO_LOSS)
    assert pairs == want_pairs > 80
    moved = np.abs(want_x - vectors).max()
    np.testing.assert_allclose(got_x, want_x, rtol=0, atol=5e-4 * moved)
    if opt != OPT_SGD:
        np.testing.assert_allclose(got_a, want_a, rtol=2e-3)
    assert np.flatnonzero(touched).tolist() == np.flatnonzero(np.any(got_x != vectors, axis=1)).tolist()


def _check_against_the_reference(optimizer, case, dim, negative):
    opt = OPTIMIZERS[optimizer]
    n_words, tokens, starts, noise_rows, vectors = _batch(dim=dim)
    window, seed, eta = 3, 17, 0.05
    if case == "empty sentences":
        starts = np.array([0, 0, 15, 15, 16, 40, 60, 60], dtype=np.int64)
    elif case == "no noise":
        noise_rows = noise_rows[:0]
    elif case == "no negatives":
        negative = 0
    acc = np.full((len(vectors), dim if opt == OPT_ADAGRAD else 1), 1e-3, np.float32)
    in_rows, out_rows = tokens, tokens + n_words
    want_pairs, want_x, want_a, want_curv, want_loss = _reference_hogbatch(
        vectors, acc, in_rows, out_rows, starts, noise_rows, window, negative, eta, opt, seed)
    got_x, got_a = vectors.copy(), acc.copy()
    touched = np.zeros(len(vectors), np.uint8)
    curv = np.zeros(len(vectors), np.float32)
    loss = np.zeros(2)
    pairs = train_hogbatch_rows(got_x, got_x, got_a, got_a, in_rows, out_rows, starts, noise_rows, window,
                                negative, eta, opt, seed, touched, curv, loss)
    assert pairs == want_pairs > 80
    moved = np.abs(want_x - vectors).max()
    assert moved > 0.05
    np.testing.assert_allclose(got_x, want_x, rtol=0, atol=5e-4 * moved)
    if opt != OPT_SGD:
        np.testing.assert_allclose(got_a, want_a, rtol=2e-3)
    changed = np.flatnonzero(np.any(got_x != vectors, axis=1))
    assert np.flatnonzero(touched).tolist() == changed.tolist()
    assert not touched[[9, 10, 11, 2 * n_words - 1]].any()            # rows no window reaches
    np.testing.assert_allclose(curv, want_curv, rtol=2e-3, atol=1e-6)
    assert (curv >= 0).all() and (curv[touched == 1] > 0).all() and (curv[touched == 0] == 0).all()
    np.testing.assert_allclose(loss, want_loss, rtol=1e-4)
    assert np.isfinite(loss[0]) and loss[0] > 0 and loss[1] >= 3
    v2 = vectors.copy()
    a2 = acc.copy()
    assert pairs == train_inplace_rows(v2, v2, a2, a2, in_rows, out_rows, starts, noise_rows, window, negative,
                                       eta, opt, seed, np.zeros(len(v2), np.uint8), NO_CURVATURE, NO_LOSS)


def test_a_draw_equal_to_the_positive_is_skipped():
    """One word repeated. A noise table of that word's output row alone (every draw is the positive) must train
    exactly what a table of holes (-1, every draw skipped) trains: the same draws, none of them kept. A table of
    another word's row (a real negative) trains that row and moves the others differently."""
    rng = np.random.default_rng(2)
    vectors = rng.normal(0, 0.5, (3, 8)).astype(np.float32)   # row 0: the input row, 1: its output row, 2: another
    rows, starts = np.zeros(12, np.int64), np.array([0, 12], np.int64)
    results = []
    for entry in (1, -1, 2):
        x, a = vectors.copy(), np.full((3, 1), 1e-3, np.float32)
        touched = np.zeros(3, np.uint8)
        pairs = train_hogbatch_rows(x, x, a, a, rows, rows + 1, starts, np.full(3, entry, np.int32), 3, 5, 0.05,
                                    OPT_ROW_ADAGRAD, 7, touched, NO_CURVATURE, NO_LOSS)
        results.append((pairs, x, a, touched.tolist()))
    (p1, x1, a1, t1), (p0, x0, a0, t0), (p2, x2, _, t2) = results
    assert p1 == p0 == p2 > 12
    np.testing.assert_array_equal(x1, x0)
    np.testing.assert_array_equal(a1, a0)
    assert t1 == t0 == [1, 1, 0] and t2 == [1, 1, 1]
    assert np.abs(x1 - vectors).max() > 0.01 and np.abs(x2[:2] - x1[:2]).max() > 0.01


@pytest.mark.parametrize("optimizer", ["rowadagrad", "adagrad", "sgd"])
def test_the_trainer_with_hogbatch_learns_the_planted_pairs(optimizer):
    """Through the Trainer, as ``livevec train`` runs it: each planted pair's words are each other's nearest
    neighbour (the pairs kernel's test of the same corpus, tests/test_learner_end_to_end.py)."""
    config = LearnerConfig(dim=32, min_count=5, optimizer=optimizer, kernel="hogbatch")
    trainer = Trainer(config, inplace=True)
    lines = planted_corpus(8000, seed=3)
    losses = []
    for _ in range(3):
        for i in range(0, len(lines), 200):
            stats = trainer.train_records(lines[i:i + 200])
            if stats.loss_pairs:
                losses.append(stats.loss_sampled / stats.loss_pairs)
    # the sampled loss per pair: 2.8 on the first batches (4.1 with SGD), 2.54 at the end, as the pairs kernel's
    assert np.mean(losses[-20:]) < 0.95 * np.mean(losses[:3])
    words, vectors, _ = trainer.export()
    kv = KeyedVectors(32)
    kv.add_vectors(words, vectors)
    _assert_pairs_are_nearest_neighbours(kv)


def test_the_trainer_runs_the_kernel_the_config_names():
    """Same records, same seed: the two kernels draw the same windows (same pair count) but train differently."""
    lines = planted_corpus(300, seed=1)
    results = {}
    for kernel in ("pairs", "hogbatch"):
        trainer = Trainer(LearnerConfig(dim=16, min_count=2, kernel=kernel), inplace=True)
        stats = trainer.train_records(lines)
        words, vectors, _ = trainer.export()
        results[kernel] = (stats.pairs, words, vectors)
    (pp, wp, vp), (ph, wh, vh) = results["pairs"], results["hogbatch"]
    assert pp == ph > 1000 and wp == wh
    assert np.abs(vp - vh).max() > 1e-3


def _config(argv, env):
    parser = argparse.ArgumentParser()
    WORKER_MODEL.add_arguments(parser)
    LEARNER.add_arguments(parser)
    return learner_config_from_args(parser.parse_args(argv), env)


def test_the_kernel_setting():
    assert _config([], {}).kernel == "auto"
    assert _config([], {"LIVEVEC_KERNEL": "hogbatch"}).kernel == "hogbatch"
    assert _config(["--kernel", "pairs"], {"LIVEVEC_KERNEL": "hogbatch"}).kernel == "pairs"
    with pytest.raises(SettingError) as err:
        _config([], {"LIVEVEC_KERNEL": "hogwild"})
    assert err.value.setting == "LIVEVEC_KERNEL"
    with pytest.raises(ValueError, match="kernel"):
        LearnerConfig(kernel="batch").validate()


@pytest.mark.parametrize("optimizer, kernel, eta, expected", [
    ("rowadagrad", "pairs", None, 0.1), ("rowadagrad", "hogbatch", None, 0.2), ("adagrad", "hogbatch", None, 0.2),
    ("sgd", "hogbatch", None, 0.025), ("sgd", "pairs", None, 0.025), ("rowadagrad", "hogbatch", 0.05, 0.05)])
def test_the_rate_without_livevec_eta_is_the_kernels(optimizer, kernel, eta, expected):
    """hogbatch steps a row once a window, so under the AdaGrads its default rate is twice the pairs kernel's;
    a rate the operator sets is used as it is, and SGD's is word2vec.c's for both."""
    trainer = Trainer(LearnerConfig(dim=8, optimizer=optimizer, kernel=kernel, eta=eta), inplace=True)
    assert trainer._eta() == pytest.approx(expected)


def test_auto_trains_one_model_with_hogbatch():
    """``livevec train`` is one model: auto is hogbatch, at hogbatch's rate."""
    trainer = Trainer(LearnerConfig(dim=8), inplace=True)
    assert trainer.kernel == "hogbatch" and trainer._kernel is train_hogbatch_rows
    assert trainer._eta() == pytest.approx(0.2)


@pytest.mark.parametrize("workers, choice, expected", [
    (1, None, "hogbatch"), (2, None, "hogbatch"), (3, None, "pairs"), (8, None, "pairs"),
    (8, "hogbatch", "hogbatch"), (1, "pairs", "pairs")])
def test_a_worker_resolves_auto_by_the_workers_its_cluster_declares(workers, choice, expected):
    """hogbatch's deltas combine worse than the pairs kernel's across more than 2 replicas, so auto is hogbatch up
    to HOGBATCH_MAX_REPLICAS declared workers; a named kernel is kept."""
    from online.cluster.worker import WorkerSettings
    env = {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9091",
           "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": str(workers), "LIVEVEC_ELASTIC_WORKERS": "1",
           "LIVEVEC_KAFKA_BOOTSTRAP": "127.0.0.1:9092", "LIVEVEC_KAFKA_TOPICS": "t",
           **({"LIVEVEC_KERNEL": choice} if choice else {})}
    assert WorkerSettings.from_args(None, env).learner.kernel == expected


def test_the_rows_a_kernel_touched_are_taken_in_order_and_their_marks_cleared():
    from online.learner.sgns_kernel import take_touched
    touched = np.zeros(50, np.uint8)
    touched[[3, 7, 8, 41, 49]] = 1
    assert take_touched(touched, 45).tolist() == [3, 7, 8, 41]     # none above the rows in use
    assert touched.tolist().count(1) == 1 and touched[49] == 1
    assert take_touched(touched, 0).tolist() == []


def test_the_warm_up_compiles_what_a_real_batch_runs():
    """``trainer.warm_up`` (a worker calls it before joining Kafka and the cluster) must compile the very
    specialization a real batch then runs: a batch that compiled another would hold the GIL for a cold compile
    in the middle of training."""
    from online.learner.hogbatch_kernel import _train_d100
    from online.learner.trainer import warm_up

    config = LearnerConfig(kernel="hogbatch", min_count=1, sample=0.0)
    assert warm_up(config) >= 0
    compiled = list(_train_d100.signatures)
    assert len(compiled) == 1
    trainer = Trainer(config, inplace=True)
    stats = trainer.train_sentences([["a", "b", "c", "d", "e", "f", "g"]] * 50)
    assert stats.pairs > 0
    assert list(_train_d100.signatures) == compiled
