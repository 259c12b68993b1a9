"""How a worker cuts a Kafka batch into pull/push mini-batches (pure logic)."""
import random

import numpy as np
import pytest

from online.cluster import ps_commands as pc
from online.cluster.replica import ReplicaStore
from online.cluster.worker import WorkerSettings, mini_batches, records_per_batch


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
    share of a round to the batch (issue #26: 16 workers synced every 5,000 tokens instead of 625)."""
    sync = WorkerSettings.default_sync_tokens(16)
    assert sync == 625
    assert records_per_batch(500, 100.0, 10_000, sync) == 6          # 600 tokens, not 5,000
    assert records_per_batch(500, 100.0, 10_000) == 50               # no replica: batch_words / 2
    assert records_per_batch(500, 100.0, 10_000, WorkerSettings.default_sync_tokens(2)) == 50   # 40,000: no cap
    assert records_per_batch(500, 1000.0, 10_000, sync) == 1         # never empty
    assert records_per_batch(20, 1.0, 10_000, sync) == 20            # the stream's own cap still holds
    assert records_per_batch(500, 0.0, 10_000, sync) == 64           # records' size unknown yet


def test_many_replicas_train_at_most_half_an_interval_while_a_sync_is_in_flight():
    """A whole interval trained while a sync is in flight collapses 8 and 16 replicas in the simulation
    (issue #26, session 19); 2 - 4 replicas keep the looser bound."""
    assert WorkerSettings.unsynced_bound(2) == WorkerSettings.unsynced_bound(4) == 2.0
    assert WorkerSettings.unsynced_bound(8) == WorkerSettings.unsynced_bound(64) == 1.5


def test_a_sync_pulls_the_rows_it_only_refreshes_and_pushes_only_real_deltas():
    """A held row not trained since the last sync has a zero delta: it goes out as a pull with no values, and its
    contraction column (zero) must not make it look changed."""
    dim = 4
    keys = np.array([1, 2, 3, 4], np.uint64)
    deltas = np.zeros((4, dim + 2), np.float32)
    deltas[0, 0] = 0.5                    # trained here
    deltas[1, dim] = 0.25                 # only its accumulator moved: still a delta
    fresh = np.array([False, False, False, True])
    parts = {(cmd, data is None): k.tolist() for cmd, k, data in ReplicaStore._parts(keys, deltas, fresh)}
    assert parts == {(pc.CMD_DELTA, False): [1, 2], (pc.CMD_DELTA_FRESH, False): [4], (pc.CMD_DELTA, True): [3]}
