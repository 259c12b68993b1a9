"""How a server combines deltas of several workers to one row (online.learner.concurrent_merge)."""
import numpy as np
import pytest

from online.learner.concurrent_merge import ConcurrentMerge
from online.learner.embedding_shard import EmbeddingShard

W = [9, 11, 13, 15, 17, 19, 21, 23]   # ps-lite worker ids


def _send(merge, delta, sender, now, acc=1.0):
    out, out_acc = merge.combine(np.array([0]), np.asarray([delta], np.float32), np.array([acc], np.float32),
                                 sender, now)
    return out[0], out_acc[0]


def _round(merge, deltas, now=0.0):
    total, total_acc = np.zeros(len(deltas[0]), np.float32), 0.0
    for delta, sender in zip(deltas, W):
        out, acc = _send(merge, delta, sender, now)
        total += out
        total_acc += acc
    return total, total_acc


def test_one_delta_counts_once():
    total, acc = _round(ConcurrentMerge(3, 1.0), [[1.0, 2.0, 3.0]])
    np.testing.assert_allclose(total, [1.0, 2.0, 3.0], rtol=1e-6)
    assert acc == pytest.approx(1.0)


def test_equal_deltas_of_many_workers_are_averaged_and_orthogonal_ones_summed():
    """Eight replicas that each walked a hot row to the same place: the row moves there once, not
    eight times (floor 1 = the pure rule). Eight independent steps in orthogonal directions all count."""
    same = [[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]] * 8
    total, acc = _round(ConcurrentMerge(8, 1.0, floor=1.0), same)
    np.testing.assert_allclose(total, same[0], rtol=1e-5)
    assert acc == pytest.approx(1.0, rel=1e-5)        # the accumulator of one trajectory, not eight
    orthogonal = np.eye(8, dtype=np.float32).tolist()
    total, _ = _round(ConcurrentMerge(8, 1.0, floor=1.0), orthogonal)
    weight = (1 + 7 * (1 - 1 / 8)) / 8                  # n_eff / n with rho = 1/8
    np.testing.assert_allclose(total, np.full(8, weight), rtol=1e-5)
    assert weight > 0.89


def test_the_default_floor_keeps_two_workers_summed_and_caps_many_at_two():
    two, _ = _round(ConcurrentMerge(2, 1.0), [[1.0, 1.0]] * 2)
    np.testing.assert_allclose(two, [2.0, 2.0], rtol=1e-6)
    eight, _ = _round(ConcurrentMerge(2, 1.0), [[1.0, 1.0]] * 8)
    np.testing.assert_allclose(eight, [2.0, 2.0], rtol=1e-5)


def test_a_worker_that_sends_again_or_a_late_delta_starts_a_new_round():
    merge = ConcurrentMerge(2, 1.0, floor=1.0)
    _send(merge, [1.0, 0.0], W[0], 0.0)
    out, _ = _send(merge, [1.0, 0.0], W[0], 0.1)       # built on the first: added in full
    np.testing.assert_allclose(out, [1.0, 0.0], rtol=1e-6)
    _send(merge, [1.0, 0.0], W[1], 0.2)                # concurrent with W[0]'s second: averaged
    out, _ = _send(merge, [1.0, 0.0], W[2], 5.0)       # the window (1 s) is over: a round of its own
    np.testing.assert_allclose(out, [1.0, 0.0], rtol=1e-6)


def test_zero_deltas_take_no_part():
    merge = ConcurrentMerge(2, 1.0, floor=1.0)
    _send(merge, [1.0, 0.0], W[0], 0.0)
    out, acc = _send(merge, [0.0, 0.0], W[1], 0.0, acc=0.0)   # a refresh
    assert not out.any() and acc == 0.0
    out, _ = _send(merge, [0.0, 1.0], W[2], 0.0)               # orthogonal: still nearly summed
    assert out[1] > 0.7


def test_the_shard_merges_only_when_a_window_is_set_and_forgets_freed_rows():
    shard = EmbeddingShard(2, optimizer="rowadagrad")
    keys = np.array([5], np.uint64)
    start = shard.pull(keys).copy()
    for sender in W[:4]:
        shard.add_deltas(keys, np.ones((1, 2), np.float32), np.ones(1, np.float32), sender=sender)
    np.testing.assert_allclose(shard.pull(keys), start + 4.0, rtol=1e-6)     # no window: plain sum
    shard.merge_window = 1.0
    shard._merge.floor = 1.0
    other = np.array([6], np.uint64)
    shard.add_deltas(other, np.ones((1, 2), np.float32), np.ones(1, np.float32), sender=W[5])   # not alone now
    before = shard.pull(keys).copy()
    for sender in W[:4]:
        shard.add_deltas(keys, np.ones((1, 2), np.float32), np.ones(1, np.float32), sender=sender)
    np.testing.assert_allclose(shard.pull(keys), before + 1.0, rtol=1e-5)    # four equal deltas: once
    shard.free(keys)
    again = shard.pull(keys).copy()
    shard.add_deltas(keys, np.ones((1, 2), np.float32), np.ones(1, np.float32), sender=W[4])
    np.testing.assert_allclose(shard.pull(keys), again + 1.0, rtol=1e-6)     # a new row: a new round


def test_a_sender_alone_adds_its_deltas_as_they_are_and_keeps_no_rounds():
    """One sender within two windows (a host's shared replica, or a single worker): every round would hold one
    delta, counted once, so the rounds' bookkeeping is skipped; a second sender brings it back."""
    shard = EmbeddingShard(2, optimizer="rowadagrad")
    shard.merge_window = 1.0
    keys = np.array([5, 7], np.uint64)
    start = shard.pull(keys).copy()
    for t in (0.0, 0.1, 0.2):
        shard.add_deltas(keys, np.ones((2, 2), np.float32), np.ones(2, np.float32), sender=W[0], now=t)
    np.testing.assert_allclose(shard.pull(keys), start + 3.0, rtol=1e-6)
    assert not np.isfinite(shard._merge.t0).any()                            # no round was opened
    shard.add_deltas(keys[:1], np.ones((1, 2), np.float32), np.ones(1, np.float32), sender=W[1], now=0.3)
    assert np.isfinite(shard._merge.t0).sum() == 1                           # two senders: rounds again
    assert shard._merge.alone(W[0], 2.4) and not shard._merge.alone(W[1], 2.5)   # W[1] left, then came back


def _round_with_contraction(merge, deltas, contraction, now=0.0):
    total = np.zeros(len(deltas[0]), np.float32)
    for delta, sender in zip(deltas, W):
        out, _ = merge.combine(np.array([0]), np.asarray([delta], np.float32), np.array([1.0], np.float32), sender,
                               now, np.array([contraction], np.float32))
        total += out[0]
    return total


@pytest.mark.parametrize("k", [2, 4, 8])
def test_the_contraction_rule_sums_steps_that_did_not_saturate_and_averages_ones_that_did(k):
    """The same delta from k replicas: barely contracted (a few independent steps) it counts k times, as one
    process taking all of them would have moved the row; fully contracted (each replica reached the optimum of
    its data) it counts once; in between, 1 - e^-C of the way, C the round's summed contraction."""
    delta = [[1.0, -2.0, 0.5]] * k
    merge = ConcurrentMerge(3, 1.0, contraction_scale=1.0)
    np.testing.assert_allclose(_round_with_contraction(merge, delta, 1e-4), np.multiply(delta[0], k), rtol=1e-3)
    merge = ConcurrentMerge(3, 1.0, contraction_scale=1.0)
    np.testing.assert_allclose(_round_with_contraction(merge, delta, 40.0), delta[0], rtol=1e-4)
    c = 0.5     # each replica went 1 - e^-0.5 of the way; all k of them together: 1 - e^-(k c)
    merge = ConcurrentMerge(3, 1.0, contraction_scale=1.0)
    want = np.multiply(delta[0], (1 - np.exp(-k * c)) / (1 - np.exp(-c)))
    np.testing.assert_allclose(_round_with_contraction(merge, delta, c), want, rtol=1e-4)


def test_the_contraction_scale_weighs_the_measured_contraction():
    """The scale multiplies what the kernel measured before the rule sees it: 0.3 of 10 is 3."""
    delta = [[1.0, 0.0]] * 4
    got = _round_with_contraction(ConcurrentMerge(2, 1.0, contraction_scale=0.3), delta, 10.0)
    want = (1 - np.exp(-4 * 3.0)) / (1 - np.exp(-3.0))
    np.testing.assert_allclose(got, [want, 0.0], rtol=1e-4)


def test_a_zero_delta_refresh_changes_and_stamps_nothing():
    """A replica refreshing a row it did not train sends nothing to combine and must not mark the row changed:
    every other replica reads the changed rows and refreshes them (a stamped refresh fed more refreshes)."""
    shard = EmbeddingShard(4, optimizer="rowadagrad", seed=3)
    shard.merge_window = 1.0
    keys = np.array([5, 7], dtype=np.uint64)
    shard.add_deltas(keys, np.ones((2, 4), np.float32), np.ones(2, np.float32), sender=9, now=0.0,
                     contraction=np.zeros(2, np.float32))
    version, changed = shard.changed_keys_since(0)
    assert sorted(changed.tolist()) == [5, 7]
    before = shard.pull(keys).copy()
    shard.add_deltas(keys, np.zeros((2, 4), np.float32), np.zeros(2, np.float32), sender=11, now=0.1,
                     contraction=np.zeros(2, np.float32))
    np.testing.assert_array_equal(shard.read_rows(keys)[:, :4], before)
    assert shard.changed_keys_since(version)[1].tolist() == []
    shard.add_deltas(keys[:1], np.ones((1, 4), np.float32), np.zeros(1, np.float32), sender=11, now=0.2)
    assert shard.changed_keys_since(version)[1].tolist() == [5]


def test_the_changed_rows_leave_out_the_ones_the_asker_moved_last():
    """A replica's own sync already brought back the merged row: listing it again would refresh it for nothing
    (with one host replica, every synced row twice)."""
    shard = EmbeddingShard(4, optimizer="rowadagrad", seed=3)
    keys = np.array([5, 7, 9], dtype=np.uint64)
    shard.add_deltas(keys[:2], np.ones((2, 4), np.float32), np.zeros(2, np.float32), sender=9)
    shard.add_deltas(keys[1:], np.ones((2, 4), np.float32), np.zeros(2, np.float32), sender=11)
    assert sorted(shard.changed_keys_since(0, asker=9)[1].tolist()) == [7, 9]   # 7: 11 moved it after 9
    assert shard.changed_keys_since(0, asker=11)[1].tolist() == [5]
    assert sorted(shard.changed_keys_since(0)[1].tolist()) == [5, 7, 9]
