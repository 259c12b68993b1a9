"""How a worker cuts a Kafka batch into pull/push mini-batches (pure logic)."""
import random

import pytest

from online.cluster.worker import mini_batches


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
