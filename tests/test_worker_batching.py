"""How a worker cuts a Kafka batch into pull/push mini-batches (pure logic)."""
import random

import numpy as np
import pytest

from online.cluster import ps_commands as pc
from online.cluster.replica import ReplicaStore
from online.cluster.replica_shard import ReplicaShard
from online.cluster.sync_interval import SyncInterval, default_sync_tokens, unsynced_bound
from online.cluster.worker import mini_batches, records_per_batch


@pytest.mark.parametrize("seed", range(20))
def test_mini_batches_keep_every_record_in_order_and_respect_the_word_cap(seed):
    rng = random.Random(seed)
    texts = [" ".join("w" * rng.randint(1, 3) for _ in range(rng.randint(1, 40))) for _ in range(rng.randint(0, 60))]
    cap = rng.randint(1, 100)
    chunks = list(mini_batches(texts, cap))
    assert [t for c in chunks for t in c] == texts
    for chunk in chunks:
        assert chunk, "no empty mini-batch"
        words = sum(len(t.split()) for t in chunk)
        assert words <= cap or len(chunk) == 1, (words, cap, len(chunk))
    # greedy: a chunk is only closed when the next record would not fit
    for a, b in zip(chunks, chunks[1:]):
        assert sum(len(t.split()) for t in a) + len(b[0].split()) > cap


def test_a_record_longer_than_the_cap_is_a_mini_batch_of_its_own():
    long = " ".join(["w"] * 50)
    assert list(mini_batches(["a b", long, "c"], 10)) == [["a b"], [long], ["c"]]


def test_a_replicas_batch_is_no_longer_than_its_sync_interval():
    """A sync carries whole batches, so a batch longer than LIVEVEC_SYNC_TOKENS would stretch every replica's
    share of a round to the batch (16 workers would sync every 5,000 tokens instead of 2,500:
    docs/design/0003-sync-interval.md)."""
    sync = default_sync_tokens(16)
    assert sync == 2_500
    assert records_per_batch(500, 100.0, 10_000, sync) == 25         # 2,500 tokens, not 5,000
    assert records_per_batch(500, 100.0, 10_000) == 50               # no replica: batch_words / 2
    assert records_per_batch(500, 100.0, 10_000, default_sync_tokens(2)) == 50   # 40,000: no cap
    assert records_per_batch(500, 10_000.0, 10_000, sync) == 1       # never empty
    assert records_per_batch(20, 1.0, 10_000, sync) == 20            # the stream's own cap still holds
    assert records_per_batch(500, 0.0, 10_000, sync) == 64           # records' size unknown yet


def test_many_replicas_train_at_most_half_an_interval_while_a_sync_is_in_flight():
    """A whole interval trained while a sync is in flight collapses 8 and 16 replicas in the simulation
    (docs/design/0003-sync-interval.md); 2 - 4 replicas keep the looser bound."""
    assert unsynced_bound(1) == 8.0 and unsynced_bound(2) == unsynced_bound(4) == 2.0
    assert unsynced_bound(8) == unsynced_bound(64) == 1.5


def test_the_interval_is_a_replicas_not_a_process_s():
    """Processes that share a host's replica train one replica: its interval is one replica's share of a round,
    split over them (with 40,000 tokens each, 2 workers on one host's replica stand still a fifth of the time:
    docs/design/0004-host-replica.md)."""
    assert default_sync_tokens(2, sharing=2) == 80_000          # one replica: 160,000, half each
    assert default_sync_tokens(8, sharing=8) == 20_000          # one replica of 8 processes
    assert default_sync_tokens(8, sharing=2) == 5_000           # 4 merged replicas: 10,000 each, 2 processes each
    assert default_sync_tokens(16, sharing=2) == 5_000          # 8 replicas: 10,000 each
    assert default_sync_tokens(3, sharing=2) == 5_000           # 2 merged replicas (one host short of a pair)
    assert default_sync_tokens(12, sharing=4) == 2_500          # 3 merged replicas: 10,000 each, not 71,111
    assert default_sync_tokens(2, sharing=1) == 40_000          # 2 workers: the servers add without the merge
    assert default_sync_tokens(16, sharing=1) == 2_500
    assert default_sync_tokens(32, sharing=1) == 156            # beyond 16 replicas: 160,000 / k^2
    assert default_sync_tokens(64, sharing=1) == 100            # the floor
    members = [1]
    interval = SyncInterval(4, 0, members=lambda: members[0])
    assert interval.tokens() == 10_000 and interval.limit() == 20_000       # 4 merged replicas: 2 intervals
    members[0], interval.RECOUNT = 2, 0.0                          # the host's second process attached
    assert interval.tokens() == 5_000 and interval.limit() == 10_000        # 2 merged replicas, 2 processes each
    members[0] = 4
    assert interval.tokens() == 40_000 and interval.limit() == 320_000      # one replica: 8 intervals
    assert SyncInterval(2, 7_000, members=lambda: 2).tokens() == 7_000   # LIVEVEC_SYNC_TOKENS wins


def test_a_sync_pushes_what_changed_here_and_pulls_what_it_only_refreshes():
    """Rows stamped since the last collect push their deltas (an accumulator's move alone counts), rows no answer
    reached yet go as fresh, and rows only refreshed are pulled with their base untouched: what a running kernel
    wrote to them unstamped goes with the sync after its stamp. Each request is a slice of one payload."""
    dim = 4
    shard = ReplicaShard(dim, seed=1)
    keys = np.array([10, 20, 30, 40, 50], np.uint64)
    rows = shard.rows_for(keys)
    shard.collect_parts()
    shard.apply(keys[:4], np.hstack([shard.vectors[rows[:4]], shard.accum[rows[:4]]]))   # answered: all but 50
    shard.vectors[rows[0]] += 0.5
    shard.accum[rows[1]] += 0.25
    shard.vectors[rows[2]] += 1.0                                   # a kernel still running: not stamped yet
    shard.mark_changed(rows[:2])
    payload = shard.collect_parts()
    got, got_rows, deltas, pushed, fresh = payload
    assert (pushed, fresh) == (2, 1) and got.tolist() == [10, 20, 50, 30, 40]
    np.testing.assert_array_equal(got_rows, shard.rows_for(got, create=False))
    assert deltas.shape == (3, dim + 2)
    np.testing.assert_allclose(deltas[0, :dim], 0.5)
    np.testing.assert_allclose(deltas[1, dim], 0.25)
    parts = {(cmd, data is None): k.tolist() for cmd, k, data, _ in ReplicaStore._parts(*payload)}
    assert parts == {(pc.CMD_DELTA, False): [10, 20], (pc.CMD_DELTA_FRESH, False): [50], (pc.CMD_DELTA, True): [30, 40]}
    np.testing.assert_allclose(shard.vectors[rows[2]] - shard.base[rows[2]], 1.0)   # still to send
    shard.mark_changed(rows[2:3])
    got, _, deltas, pushed, _ = shard.collect_parts()
    assert got[:pushed].tolist() == [30] and np.allclose(deltas[0, :dim], 1.0)
