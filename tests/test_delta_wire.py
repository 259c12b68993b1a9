"""The packed exchange's pure parts: int8 deltas with error feedback, float16 answers, the servers' listing of
changed rows, and a replica's deltas that wait until they grow."""
from __future__ import annotations

import numpy as np
import pytest

from online.cluster import delta_wire
from online.cluster.change_listing import ChangeListing
from online.cluster.replica_shard import ReplicaShard

DIM = 100


def _deltas(n: int, seed: int = 0, contraction: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros((n, DIM + (2 if contraction else 1)), dtype=np.float32)
    out[:, :DIM] = rng.normal(scale=0.01, size=(n, DIM))
    out[:, DIM] = rng.uniform(0, 1, n)
    if contraction:
        out[:, DIM + 1] = rng.uniform(0, 1, n)
    return out


@pytest.mark.parametrize("contraction", [False, True])
def test_int8_deltas_decode_within_half_a_step_and_the_base_keeps_the_remainder(contraction):
    n = 7
    d = _deltas(n, contraction=contraction)
    rows = np.arange(n, dtype=np.int64) * 2
    base = np.zeros((2 * n, DIM), np.float32)          # base already moved to the row (take_deltas' effect)
    base[rows] = 1.0 + d[:, :DIM]
    wire, head, codes = delta_wire.packed_buffer(n, DIM, contraction)
    delta_wire.pack_deltas(d, base, rows, head, codes)
    assert wire.shape == (n, delta_wire.packed_width(DIM, contraction))
    decoded, acc, con = delta_wire.unpack_deltas(wire.reshape(-1), n, DIM)
    step = np.abs(d[:, :DIM]).max(axis=1, keepdims=True) / 127
    assert (np.abs(decoded - d[:, :DIM]) <= step / 2 + 1e-7).all()
    np.testing.assert_array_equal(acc, d[:, DIM])
    if contraction:
        np.testing.assert_array_equal(con, d[:, DIM + 1])
    else:
        assert con is None
    # error feedback: the base moved by what was decoded, so row - base is the remainder still to send
    np.testing.assert_allclose(base[rows] - 1.0, decoded, atol=1e-6)


def test_a_packed_row_is_a_quarter_of_the_float32_one_out_and_a_quarter_or_half_back():
    assert delta_wire.packed_width(DIM, False) * 4 == 108            # against 404 bytes
    assert delta_wire.answer_width(DIM, delta_wire.I8) * 4 == 108    # accumulator, scale, 100 codes
    assert delta_wire.answer_width(DIM) * 4 == 204                   # float16: against 404 bytes


def test_each_packed_command_names_a_layout_of_the_wire():
    from online.cluster import ps_commands as pc
    assert pc.ROWS_BACK == {pc.CMD_DELTA_PACKED: delta_wire.F16, pc.CMD_DELTA_PACKED_I8: delta_wire.I8}


def test_int8_answers_decode_within_half_a_step_of_each_rows_largest_value():
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(6, DIM + 1)).astype(np.float32)
    rows[2, :DIM] = 0.0                                              # a zero row: scale 1, codes 0
    back = delta_wire.unpack_answer(delta_wire.pack_answer(rows, DIM, delta_wire.I8), 6, DIM, delta_wire.I8)
    np.testing.assert_array_equal(back[:, DIM], rows[:, DIM])        # the accumulator stays float32
    step = np.abs(rows[:, :DIM]).max(axis=1, keepdims=True) / 127
    assert (np.abs(back[:, :DIM] - rows[:, :DIM]) <= step / 2 + 1e-6).all()
    np.testing.assert_array_equal(back[2, :DIM], 0.0)
    full = np.array([True, False, True, True, False, False])
    vals, lens = delta_wire.pack_answer_sparse(rows, full, DIM, delta_wire.I8)
    assert len(vals) == 3 * delta_wire.answer_width(DIM, delta_wire.I8) + 3
    base = rng.normal(size=(6, DIM)).astype(np.float32)
    out = delta_wire.unpack_answer_sparse(vals, lens, 6, DIM, base, delta_wire.I8)
    np.testing.assert_array_equal(out[:, DIM], rows[:, DIM])
    np.testing.assert_array_equal(out[~full, :DIM], base[~full])
    np.testing.assert_array_equal(out[full, :DIM], back[full, :DIM])
    bad = delta_wire.pack_answer(rows[:1], DIM, delta_wire.I8)
    bad[1] = np.inf
    with pytest.raises(ValueError, match="scale"):
        delta_wire.unpack_answer(bad, 1, DIM, delta_wire.I8)


def test_float16_answers_round_to_three_significant_digits():
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(5, DIM + 1)).astype(np.float32)
    back = delta_wire.unpack_answer(delta_wire.pack_answer(rows, DIM), 5, DIM)
    np.testing.assert_array_equal(back[:, DIM], rows[:, DIM])        # the accumulator stays float32
    np.testing.assert_allclose(back[:, :DIM], rows[:, :DIM], rtol=1e-3, atol=1e-4)


def test_a_malformed_packed_delta_is_an_error_not_a_crash():
    with pytest.raises(ValueError, match="packed delta of 5 words"):
        delta_wire.unpack_deltas(np.zeros(5, np.float32), 1, DIM)
    bad = np.zeros((1, delta_wire.packed_width(DIM, False)), np.float32)
    bad[0, 0] = np.inf
    with pytest.raises(ValueError, match="finite"):
        delta_wire.unpack_deltas(bad.reshape(-1), 1, DIM)
    with pytest.raises(ValueError, match="packed answer"):
        delta_wire.unpack_answer(np.zeros(3, np.float32), 1, DIM)


def test_the_servers_list_a_row_once_its_merged_deltas_reach_the_threshold():
    listing = ChangeListing(0.2)
    row = np.ones((1, DIM), np.float32)                   # |row| = 10
    small = np.full((1, DIM), 0.05, np.float32)           # |delta| = 0.5: 5 % of the row
    for version in range(1, 4):
        listing.merged(np.array([3]), small, row, version)
        assert not len(listing.listed_since(0, 10)), "15 % moved: not listed yet"
    listing.merged(np.array([3]), small, row, 4)          # 20 %
    assert listing.listed_since(0, 10).tolist() == [3]
    assert not len(listing.listed_since(4, 10))
    listing.merged(np.array([3]), small, row, 5)          # the count starts again after a listing
    assert not len(listing.listed_since(4, 10))
    every = ChangeListing(0.0)
    every.merged(np.array([1]), small * 1e-6, row, 7)
    assert every.listed_since(6, 10).tolist() == [1]


def test_a_small_delta_waits_and_grows_until_it_goes_and_a_flush_sends_it():
    shard = ReplicaShard(8, optimizer="sgd", seed=1)
    shard.send_share, shard.flush_every = 0.05, 1000
    keys = np.array([10, 20], dtype=np.uint64)
    rows = shard.rows_for(keys)
    shard.confirmed[rows] = True
    shard.vectors[rows] = 1.0
    shard.base[rows] = 1.0
    shard.collect_parts()                                  # nothing changed yet
    shard.vectors[rows[0]] += 0.01                          # 1 % of the row: waits
    shard.vectors[rows[1]] += 0.5                           # 50 %: goes
    shard.mark_changed(rows)
    k, r, out, pushed, fresh = shard.collect_parts()
    assert k[:pushed].tolist() == [20] and shard.waiting == 1
    np.testing.assert_allclose(out[0, :8], 0.5)
    shard.vectors[rows[0]] += 0.05                          # 6 % in all: goes, whole
    shard.mark_changed(rows[:1])
    k, r, out, pushed, fresh = shard.collect_parts()
    assert k[:pushed].tolist() == [10] and shard.waiting == 0
    np.testing.assert_allclose(out[0, :8], 0.06, rtol=1e-5)
    shard.vectors[rows[1]] += 0.001                         # small again: waits, until a flush
    shard.mark_changed(rows[1:])
    assert shard.collect_parts()[3] == 0 and shard.waiting == 1
    shard.flush = True
    k, r, out, pushed, fresh = shard.collect_parts()
    assert k[:pushed].tolist() == [20]
    np.testing.assert_allclose(out[0, :8], 0.001, rtol=1e-3)


def test_rows_the_sender_moved_last_come_back_as_their_accumulator_alone():
    rng = np.random.default_rng(2)
    rows = rng.normal(size=(6, DIM + 1)).astype(np.float32)
    full = np.array([True, False, True, False, False, True])
    vals, lens = delta_wire.pack_answer_sparse(rows, full, DIM)
    assert len(vals) == 3 * delta_wire.answer_width(DIM) + 3
    base = rng.normal(size=(6, DIM)).astype(np.float32)
    out = delta_wire.unpack_answer_sparse(vals, lens, 6, DIM, base)
    np.testing.assert_array_equal(out[:, DIM], rows[:, DIM])
    np.testing.assert_array_equal(out[~full, :DIM], base[~full])          # apply() leaves those rows as they are
    np.testing.assert_allclose(out[full, :DIM], rows[full, :DIM], rtol=1e-3, atol=1e-4)
    with pytest.raises(ValueError, match="lengths"):
        delta_wire.unpack_answer_sparse(vals, np.full(6, 7, np.int32), 6, DIM, base)
