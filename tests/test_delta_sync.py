"""Worker replicas with delta sync, and the cluster's word counts on the servers.

The pure parts (the count table, the shard's merge, the replica's collect/apply arithmetic)
are unit-tested; the rest runs against real scheduler and server processes, with the
test's own ps-lite worker nodes, or with real worker processes reading a real Kafka topic.
"""
from __future__ import annotations

import threading

import numpy as np
import orjson
import pytest

from online.cluster import delta_wire
from online.cluster import ps_commands as pc
from online.cluster.replica import ReplicaShard, ReplicaStore
from online.learner.embedding_shard import EmbeddingShard
from online.learner.keys import output_rows, word_key, word_rows
from online.learner.param_store import LocalParamStore
from online.learner.trainer import LearnerConfig, Trainer
from online.learner.vocab import OnlineVocab
from online.learner.word_counts import WordCounts
from online.stream.producer import produce
from online.stream.sample_corpus import generate_lines
from ps_bridge.roles import start_worker
from ps_bridge.settings import NodeSettings
from tests.cluster_harness import Cluster, read_model, wait_until


# ----------------------------------------------------------------------------- the count table

def test_word_counts_are_exact_until_the_table_fills():
    wc = WordCounts(capacity=100, min_count=3)
    keys = np.arange(1, 51, dtype=np.uint64)
    totals, evicted = wc.add(keys, np.full(50, 2))
    assert (totals == 2).all() and not len(evicted)
    totals, _ = wc.add(keys[:10], np.ones(10))
    assert (totals == 3).all()
    assert (wc.totals(keys[10:]) == 2).all() and wc.totals(np.array([999], np.uint64))[0] == 0


def test_a_full_table_evicts_the_rarest_and_reports_only_trainable_words():
    wc = WordCounts(capacity=10, min_count=5)
    frequent = np.arange(1, 6, dtype=np.uint64)
    rare = np.arange(6, 11, dtype=np.uint64)
    wc.add(frequent, np.full(5, 100))
    wc.add(rare, np.full(5, 1))
    newcomers = np.arange(11, 16, dtype=np.uint64)
    totals, evicted = wc.add(newcomers, np.full(5, 1))
    assert len(wc) <= 10
    assert (wc.totals(frequent) >= 99).all(), "frequent words survive with at most the decrement lost"
    assert not len(evicted), "the evicted words were below min_count"
    # a batch of frequent newcomers now pushes trainable words out, and says which
    wc2 = WordCounts(capacity=4, min_count=5)
    wc2.add(np.array([1, 2, 3, 4], np.uint64), np.array([6, 6, 6, 50]))
    _, evicted = wc2.add(np.array([7, 8, 9], np.uint64), np.array([9, 9, 9]))
    assert set(evicted.tolist()) <= {1, 2, 3} and len(evicted) >= 3 - (4 - len(wc2) + 3 - 3)
    assert wc2.totals(np.array([4], np.uint64))[0] > 0


def test_word_counts_survive_a_checkpoint_round_trip():
    wc = WordCounts(capacity=1000, min_count=5)
    keys = np.array([5, 9, 1 << 60], dtype=np.uint64)
    wc.add(keys, np.array([3, 7, 11]))
    back = WordCounts(capacity=1000, min_count=5)
    back.load(*wc.state())
    assert back.totals(keys).tolist() == [3, 7, 11]


def test_the_shard_gives_rows_at_the_cluster_min_count_and_frees_what_its_table_evicts():
    shard = EmbeddingShard(4, min_count=3, word_capacity=3)
    a, b = word_key("alpha"), word_key("beta")
    shard.count_words(np.array([a], np.uint64), np.array([2]))          # one worker: 2
    assert shard.rows_for(word_rows(np.array([a], np.uint64)), create=False).max() < 0
    shard.count_words(np.array([a], np.uint64), np.array([1]))          # another worker: 1 -> 3
    rows = shard.rows_for(np.array([a], np.uint64), create=False)
    assert rows[0] >= 0 and shard.counts_for(np.array([a], np.uint64))[0] == 3
    shard.count_words(np.array([b], np.uint64), np.array([1]))
    newcomers = np.array(sorted(word_key(w) for w in ("c1", "c2", "c3")), np.uint64)
    shard.count_words(newcomers, np.full(3, 5))                          # the table (3) overflows
    assert shard.rows_for(np.array([a], np.uint64), create=False)[0] < 0, "the owner freed the evicted word's row"


def test_deltas_from_two_workers_merge_on_the_shard():
    server = EmbeddingShard(3, optimizer="rowadagrad")
    keys = np.array([7, 8], dtype=np.uint64)
    start = server.pull(keys).copy()
    d1 = np.ones((2, 3), np.float32)
    d2 = np.full((2, 3), 2.0, np.float32)
    server.add_deltas(keys, d1, np.array([0.5, 0.5], np.float32))
    merged = server.add_deltas(keys, d2, np.array([0.25, 0.25], np.float32))
    vectors, acc = merged[:, :-1], merged[:, -1]
    np.testing.assert_allclose(vectors, start + 3.0, rtol=1e-6)
    np.testing.assert_allclose(acc, 0.75 + server.adagrad_init, rtol=1e-5)


@pytest.mark.parametrize("optimizer", ["rowadagrad", "adagrad", "sgd"])
def test_a_shards_answer_to_deltas_is_each_row_then_its_mean_accumulator(optimizer):
    """The compiled passes (``online.learner.shard_passes``) against the plain reading: rows += deltas, every
    accumulator column += its increment, the answer [values, mean accumulator], and only moved rows stamped."""
    server = EmbeddingShard(5, optimizer=optimizer)
    keys = np.array([3, 9, 4, 12], dtype=np.uint64)
    before = server.pull(keys).copy()
    acc0 = server.accum[server.rows_for(keys)].copy() if server.accum.shape[0] else None
    rng = np.random.default_rng(1)
    deltas = rng.standard_normal((4, 5)).astype(np.float32)
    deltas[1] = 0.0                                               # a refresh: no change
    acc = np.array([0.5, 0.0, 0.0, 2.0], np.float32)              # row 2 moves by its values only
    version = server.version
    answer = server.add_deltas(keys, deltas, acc)
    assert answer.shape == (4, 6) and answer.dtype == np.float32
    np.testing.assert_allclose(answer[:, :5], before + deltas, rtol=1e-6)
    np.testing.assert_array_equal(server.pull(keys), answer[:, :5])
    if acc0 is None:
        assert not answer[:, 5].any()
    else:
        np.testing.assert_allclose(answer[:, 5], (acc0 + acc[:, None]).mean(axis=1), rtol=1e-6)
    assert sorted(server.changed_keys_since(version)[1].tolist()) == [3, 4, 12]
    np.testing.assert_array_equal(server.read_rows(keys), answer)


def _sync_by_hand(replica: ReplicaShard, server: EmbeddingShard) -> None:
    keys, deltas, fresh = replica.collect()
    for pick in (~fresh, fresh):
        merged = server.add_deltas(keys[pick], deltas[pick, :replica.dim], deltas[pick, replica.dim], fresh=pick is fresh)
        replica.apply(keys[pick], merged)


def test_replicas_converge_to_the_sum_of_their_changes_and_keep_local_work_made_during_a_sync():
    server = EmbeddingShard(4, optimizer="rowadagrad", seed=5)
    r1, r2 = ReplicaShard(4, seed=5), ReplicaShard(4, seed=5)
    keys = np.array([11, 12, 13], dtype=np.uint64)
    init = server.pull(keys).copy()
    rows1, rows2 = r1.rows_for(keys), r2.rows_for(keys)
    np.testing.assert_array_equal(r1.vectors[rows1], init)      # every node agrees on a row it never saw
    _sync_by_hand(r1, server)              # the first sync confirms the rows (nothing trained yet)
    _sync_by_hand(r2, server)
    assert r1.confirmed[rows1].all() and r2.confirmed[rows2].all()
    r1.vectors[rows1] += 1.0
    r1.mark_changed(rows1)
    r2.vectors[rows2[:2]] += 10.0
    r2.mark_changed(rows2[:2])
    _sync_by_hand(r1, server)
    keys2, deltas2, fresh2 = r2.collect()
    assert not fresh2.any()
    r2.vectors[rows2[0]] += 100.0          # trained while the pushpull is on the wire
    r2.mark_changed(rows2[:1])
    r2.apply(keys2, server.add_deltas(keys2, deltas2[:, :4], deltas2[:, 4]))
    _sync_by_hand(r2, server)              # sends the +100 made during its first sync
    _sync_by_hand(r1, server)              # nothing changed in r1: its rows are refreshed with r2's work
    expected = init + np.array([[111.0], [11.0], [1.0]], np.float32)
    np.testing.assert_allclose(server.pull(keys), expected, rtol=1e-6)
    np.testing.assert_allclose(r2.vectors[rows2], expected, rtol=1e-6)
    np.testing.assert_allclose(r1.vectors[rows1], expected, rtol=1e-6)


@pytest.mark.parametrize("kernel, width", [("pairs", 4 + 2), ("hogbatch", 4 + 1)])
def test_a_replica_sends_a_contraction_only_for_the_kernel_whose_deltas_merge_by_it(kernel, width):
    """A pairs replica sends each row's contraction, and the servers merge its deltas by it; a hogbatch replica
    sends none (dim + 1 floats per key: online.cluster.server), and the servers merge its deltas by alignment."""
    from online.cluster.replica import MERGE_BY_CONTRACTION
    r = ReplicaShard(4, seed=5)
    r.tracks_contraction = MERGE_BY_CONTRACTION[kernel]
    rows = r.rows_for(np.array([11, 12], dtype=np.uint64))
    r.collect()
    r.vectors[rows] += 1.0
    r.add_contraction(rows, np.full(2, 0.5, np.float32))
    r.mark_changed(rows)
    _, deltas, _ = r.collect()
    assert deltas.shape == (2, width)
    np.testing.assert_allclose(deltas[:, :4], 1.0)
    assert Trainer(LearnerConfig(dim=4, kernel=kernel), inplace=True)._curvature(r).shape[0] == \
        (r.capacity if width == 6 else 0)   # the kernel measures the contraction only when it is sent


def test_the_refresh_turn_reaches_every_held_row_while_the_replica_keeps_growing(monkeypatch):
    """Rows held but not trained here learn the others' work only through the refresh turn; with a
    vocabulary that grows between syncs, a turn that restarted at the new rows would leave the old
    ones for ever (in an 8-replica simulation, up to 3.9 off the servers' value)."""
    monkeypatch.setattr(ReplicaShard, "REFRESH_MIN", 8)
    r = ReplicaShard(4, refresh_share=0.0, seed=5)
    r.rows_for(np.arange(1, 21, dtype=np.uint64))
    r.mark_changed(np.arange(20))
    r.collect()                                          # every row changed: all sent, the turn moves on
    seen = set()
    for step in range(6):
        r.rows_for(np.array([100 + step], dtype=np.uint64))   # one new word per sync
        keys, deltas, _ = r.collect()
        assert len(keys) <= 8 + 1
        seen.update(keys.tolist())
    assert set(range(1, 21)) <= seen, f"rows never refreshed: {sorted(set(range(1, 21)) - seen)}"


def test_workers_that_discover_a_new_word_together_all_count():
    """Two replicas create a row the cluster has never trained and train it from the initial value
    before any answer: both deltas start from the same value, so both are added."""
    server = EmbeddingShard(4, optimizer="rowadagrad", seed=5)
    r1, r2 = ReplicaShard(4, seed=5), ReplicaShard(4, seed=5)
    key = np.array([21], dtype=np.uint64)
    init = server.pull(key).copy()
    for replica, step in ((r1, 1.0), (r2, 2.0)):
        rows = replica.rows_for(key)
        replica.vectors[rows] += step
        replica.accum[rows] += step
        replica.mark_changed(rows)
    _sync_by_hand(r1, server)
    _sync_by_hand(r2, server)
    np.testing.assert_allclose(server.pull(key), init + 3.0, rtol=1e-6)
    np.testing.assert_allclose(r2.vectors[r2.rows_for(key)], init + 3.0, rtol=1e-6)
    np.testing.assert_allclose(server.accum[server.rows_for(key), 0], server.adagrad_init + 3.0, rtol=1e-6)


def test_a_worker_new_to_an_established_word_adopts_the_cluster_row_and_its_optimizer_state():
    """A replica that starts a row the cluster has trained for a while trained it from the
    initial value with an empty accumulator: that delta is dropped, and the replica takes the
    servers' row and accumulator, so its next steps are the size the row's history says."""
    server = EmbeddingShard(4, optimizer="rowadagrad", seed=5)
    old, late = ReplicaShard(4, seed=5), ReplicaShard(4, seed=5)
    key = np.array([31], dtype=np.uint64)
    init = server.pull(key).copy()
    rows = old.rows_for(key)
    for step in (1.0, 1.0):                # two syncs: the second, ordinary, establishes the row
        old.vectors[rows] += step
        old.accum[rows] += 4.0
        old.mark_changed(rows)
        _sync_by_hand(old, server)
    trained = server.pull(key).copy()
    np.testing.assert_allclose(trained, init + 2.0, rtol=1e-6)
    late_rows = late.rows_for(key)
    late.vectors[late_rows] += 50.0        # a big first step from the wrong point
    late.mark_changed(late_rows)
    _sync_by_hand(late, server)
    np.testing.assert_allclose(server.pull(key), trained, rtol=1e-6)
    np.testing.assert_allclose(late.vectors[late_rows], trained, rtol=1e-6)
    np.testing.assert_allclose(late.accum[late_rows, 0], server.adagrad_init + 8.0, rtol=1e-6)
    late.vectors[late_rows] += 0.5         # from now on its work counts
    late.mark_changed(late_rows)
    _sync_by_hand(late, server)
    np.testing.assert_allclose(server.pull(key), trained + 0.5, rtol=1e-6)


# ------------------------------------------------------------------ against real servers

@pytest.fixture
def ps_cluster(tmp_path):
    """A real scheduler and one server; the test joins as elastic worker nodes."""
    cluster = Cluster(tmp_path, servers=1, workers=1, env={"LIVEVEC_DIM": "16", "LIVEVEC_MIN_COUNT": "3"})
    cluster.start("scheduler", "scheduler")
    cluster.start("server0", "server")
    nodes = []

    def join():
        kv = start_worker(NodeSettings(role="worker", root_uri="127.0.0.1", root_port=cluster.root_port,
                                       num_server=1, num_worker=1, elastic_workers=True,
                                       heartbeat_interval=0.5), timeout=60)
        nodes.append(kv)
        return kv
    try:
        yield cluster, join
    finally:
        for kv in nodes:
            kv.po.leave()
        cluster.stop()


def _config(**changes) -> LearnerConfig:
    return LearnerConfig(dim=16, min_count=3, window=3, negative=3, seed=1, **changes)


def _batches(n_lines: int, seed: int, per_batch: int = 40) -> list[list[str]]:
    lines = generate_lines(n_lines, seed=seed)
    return [lines[i:i + per_batch] for i in range(0, len(lines), per_batch)]


def test_one_worker_through_delta_sync_learns_the_same_vectors_as_the_in_process_kernel(ps_cluster):
    """Tolerance 1e-4 absolute: the server holds init + sum of deltas, the replica the same sum
    taken in another order, so only float32 rounding may differ (float32 rows both ways, every delta sent)."""
    _, join = ps_cluster
    batches = _batches(1200, seed=3)
    local = Trainer(_config(), LocalParamStore(dim=16, seed=1))
    store = ReplicaStore(join(), 16, seed=1, timeout=20, delta_wire="float32", send_threshold=0.0)
    remote = Trainer(_config(), store)
    store.on_totals = remote.apply_cluster_counts
    for i, batch in enumerate(batches):
        local.train_records(batch)
        remote.train_records(batch)
        if i % 3 == 2:
            store.sync()
    store.sync()
    words, vectors, _ = local.export()
    keys = np.array([word_key(w) for w in words], dtype=np.uint64)
    order = np.argsort(keys)
    kv = store.worker
    pulled = kv.pull_sync(keys[order], timeout=20).reshape(len(keys), 16)
    assert len(words) > 150
    np.testing.assert_allclose(pulled, vectors[order], atol=1e-4)
    out = np.sort(output_rows(keys))
    np.testing.assert_allclose(kv.pull_sync(out, timeout=20).reshape(len(keys), 16),
                               local.shard.pull(out), atol=1e-4)


@pytest.mark.parametrize("wire, command", [("auto", pc.CMD_DELTA_PACKED_I8), ("float16", pc.CMD_DELTA_PACKED)])
def test_packed_deltas_held_back_lose_nothing_once_flushed(ps_cluster, wire, command):
    """The default wire: int8 deltas (error feedback), int8 rows back (float16 where pinned), small deltas waiting
    to grow. After a flush (float32 both ways) the servers hold exactly what the replica has, and the model is the
    in-process kernel's within the drift of training from the packed answers in between."""
    _, join = ps_cluster
    batches = _batches(1200, seed=3)
    local = Trainer(_config(), LocalParamStore(dim=16, seed=1))
    store = ReplicaStore(join(), 16, seed=1, timeout=20, delta_wire=wire)
    remote = Trainer(_config(), store)
    store.on_totals = remote.apply_cluster_counts
    for i, batch in enumerate(batches):
        local.train_records(batch)
        remote.train_records(batch)
        if i % 3 == 2:
            store.sync()
    assert store.exchange == 3 and store._packed() == command and store.shard.waiting > 0, \
        "packed deltas, some waiting to grow"
    store.sync(flush=True, remainders=True)   # every waiting delta and every int8 remainder, in float32
    assert store.shard.waiting == 0
    words, vectors, _ = local.export()
    keys = np.sort(np.array([word_key(w) for w in words], dtype=np.uint64))
    both = np.unique(np.concatenate([keys, output_rows(keys)]))
    pulled = store.worker.pull_sync(both, timeout=20).reshape(len(both), 16)
    replica = store.shard.pull(both)
    np.testing.assert_allclose(pulled, replica, atol=1e-6)   # the flush's float32 answer: the replica is the servers'
    reference = local.shard.pull(both)
    assert np.abs(pulled - reference).mean() < 5e-3


def test_a_word_evicted_from_one_workers_table_keeps_its_rows_while_the_cluster_counts_it(ps_cluster):
    _, join = ps_cluster
    small = ReplicaStore(join(), 16, seed=1, timeout=20)
    forgetful = Trainer(_config(vocab_capacity=60), small)
    small.on_totals = forgetful.apply_cluster_counts
    forgetful.train_records(["zebra lion zebra lion zebra lion zebra lion"] * 3)
    small.sync()
    zebra = np.array([word_key("zebra")], dtype=np.uint64)
    before = small.worker.pull_sync(zebra, timeout=20)
    # flood the small table with new words until zebra is evicted there
    rng = np.random.default_rng(0)
    evicted = 0
    for _ in range(20):
        words = ("".join(chr(97 + c) for c in rng.integers(0, 26, 9)) for _ in range(200))
        stats = forgetful.train_records([" ".join(words)])
        evicted += stats.evicted
    small.sync()
    assert "zebra" not in forgetful.vocab and evicted > 0
    model, _ = read_model(ps_cluster[0])
    assert "zebra" in model.words, "the servers still hold the word another worker forgot"
    after = small.worker.pull_sync(zebra, timeout=20)
    np.testing.assert_allclose(after, before, atol=1e-6)


def test_the_trainable_journal_lists_each_crossing_once_and_restarts_after_churn():
    counts = WordCounts(capacity=4, min_count=2)
    counts.add(np.array([1, 2, 3], np.uint64), np.array([1, 2, 5]))
    generation, at, keys = counts.trainable_since(0, 0)          # another generation: the whole log
    assert sorted(keys.tolist()) == [2, 3]
    counts.add(np.array([1, 2], np.uint64), np.array([1, 1]))     # 1 crosses, 2 was trainable already
    assert counts.trainable_since(generation, at)[2].tolist() == [1]
    assert counts.trainable_since(generation, at + 1)[2].tolist() == []
    # churn: keys cross, leave and cross again until the log outgrows 2 x capacity
    for k in range(10, 40):
        counts.add(np.array([k], np.uint64), np.array([3]))
    g2, at2, keys2 = counts.trainable_since(generation, at + 1)
    assert g2 != generation, "the log should have restarted"
    assert sorted(keys2.tolist()) == sorted(counts.trainable_keys().tolist()) and at2 <= 2 * counts.capacity


def test_a_word_the_cluster_trains_is_trainable_at_its_first_occurrence_here():
    vocab = OnlineVocab(capacity=100, min_count=5)
    vocab.update(["apple", "pear"])
    assert not vocab.trainable[vocab.slot("apple")]
    known = np.sort(np.array([word_key("apple"), word_key("kiwi")], np.uint64))
    made = vocab.learn_trainable(known, known)
    assert made.tolist() == [vocab.slot("apple")]                     # held here: trainable now
    upd = vocab.update(["kiwi", "plum"])                             # first occurrence here
    assert vocab.trainable[vocab.slot("kiwi")] and vocab.slot("kiwi") in upd.newly_trainable.tolist()
    assert not vocab.trainable[vocab.slot("plum")] and not vocab.trainable[vocab.slot("pear")]


def _replica_workers(ps_cluster, n: int) -> list[tuple[ReplicaStore, Trainer]]:
    """``n`` workers of the real cluster, each a ReplicaStore wired to its Trainer as the worker role wires them."""
    _, join = ps_cluster
    workers = []
    for _ in range(n):
        store = ReplicaStore(join(), 16, seed=1, timeout=20)
        trainer = Trainer(_config(sample=0.0), store)
        store.on_totals = trainer.apply_cluster_counts
        store.on_trainable = trainer.learn_cluster_trainable
        workers.append((store, trainer))
    return workers


def test_a_worker_trains_a_word_from_its_first_occurrence_once_another_worker_made_it_trainable(ps_cluster):
    """Through a real server: worker A reads "zebra" min_count times and syncs; worker B, which never
    reported it, learns from the journal at its next sync and trains its very first "zebra"."""
    (a, ta), (b, tb) = _replica_workers(ps_cluster, 2)
    ta.train_records(["zebra lion"] * 3)       # 3 = min_count: trainable on A (and counted on the server)
    a.sync()
    b.sync()                                    # B has never read either word: it only hears the news
    assert "zebra" not in tb.vocab
    stats = tb.train_records(["zebra lion"])
    assert stats.kept == 2, "B's first occurrences were not trained"
    assert tb.vocab.trainable[tb.vocab.slot("zebra")]


def test_a_worker_holds_the_clusters_row_of_a_new_word_before_it_meets_it(ps_cluster):
    """Through a real server: the cluster trained "zebra" on A for a while; B only hears from the journal
    that it is trainable. B's sync then holds zebra's rows at the servers' values with their accumulators,
    so B's first "zebra" takes a step the size of the row's history, not the full-size first step of a row
    started from the initial value (summed over every replica that met the word late, such steps cost
    analogy accuracy at 32 replicas: docs/design/0001-replica-exchange.md)."""
    (a, ta), (b, tb) = _replica_workers(ps_cluster, 2)
    for _ in range(4):
        ta.train_records(["zebra lion tiger"] * 5)
        a.sync()
    a.sync(flush=True, remainders=True)         # A's copy is now the servers' value (nothing trained since)
    keys = word_rows(np.array([word_key("zebra")], dtype=np.uint64))
    rows_a = a.shard.rows_for(keys, create=False)
    assert b.shard.rows_for(keys, create=False).tolist() == [-1, -1]
    b.sync()                                    # B hears the news and fetches the rows in the same sync
    assert "zebra" not in tb.vocab
    rows_b = b.shard.rows_for(keys, create=False)
    assert (rows_b >= 0).all()
    # the values come in int8 (exchange 3: within half a step, 1/254 of the row's largest value), the accumulators
    # in float32
    step = np.abs(a.shard.vectors[rows_a]).max(axis=1, keepdims=True) / 127
    assert (np.abs(b.shard.vectors[rows_b] - a.shard.vectors[rows_a]) <= step / 2 + 1e-6).all()
    np.testing.assert_allclose(b.shard.accum[rows_b], a.shard.accum[rows_a], rtol=1e-5)
    assert (b.shard.accum[rows_b, 0] > b.shard.adagrad_init).all()   # the history's accumulator, not an empty one
    assert b.m_prefetched.value >= 2


# -------------------------------------------------------------- real workers on a real topic

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_word_whose_occurrences_are_spread_over_eight_workers_becomes_trainable(tmp_path, kafka_bootstrap,
                                                                                    kafka_topic):
    topic = kafka_topic(8)
    cluster = Cluster(tmp_path, servers=1, workers=8, env={
        "LIVEVEC_KAFKA_BOOTSTRAP": kafka_bootstrap, "LIVEVEC_KAFKA_TOPICS": topic, "LIVEVEC_KAFKA_GROUP": "g-spread",
        "LIVEVEC_DIM": "8", "LIVEVEC_MIN_COUNT": "5", "LIVEVEC_KAFKA_BATCH_RECORDS": "5"})
    try:
        cluster.start("scheduler", "scheduler")
        cluster.start("server0", "server")
        for i in range(8):
            cluster.start(f"worker{i}", "worker")
        # A steady stream, round-robin over the partitions, until every worker has a partition and trains
        # (the group rebalances as the workers join; a worker that joins late finds records to read).
        stop = threading.Event()

        def background():
            lines = generate_lines(20_000, seed=5)
            for i in range(0, len(lines), 200):
                if stop.is_set():
                    return
                produce(lines[i:i + 200], bootstrap=kafka_bootstrap, topic=topic, lines_per_record=5, rate=200,
                        create_topic=False)
        feeder = threading.Thread(target=background, daemon=True)
        feeder.start()
        try:
            wait_until(lambda: all(cluster.metric(f"worker{i}", "livevec_worker_records_total") > 0
                                   for i in range(8)), 180, message="all 8 workers own a partition and train")
        finally:
            stop.set()
            feeder.join(timeout=30)
        # 8 records, one per partition: each worker reads 'quokka' once or twice, below min_count 5
        produce([f"the quokka number {i} sat on the mat" for i in range(8)], bootstrap=kafka_bootstrap, topic=topic,
                partitions=8, create_topic=False)

        def quokka():
            model, _ = read_model(cluster)
            return "quokka" in model.words
        wait_until(quokka, 60, message="quokka trainable on the servers")
        cluster.assert_alive()
    finally:
        cluster.stop()


def test_workers_draw_their_own_negatives_from_one_seed():
    """Every worker has the same LIVEVEC_SEED; ``reseed`` with the node id gives each its own draws
    (the same stream gives the same draws, so a run stays reproducible)."""
    from online.learner.trainer import LearnerConfig, Trainer
    text = ["alpha beta gamma delta " * 20] * 5

    def negatives(stream):
        trainer = Trainer(LearnerConfig(dim=8, min_count=1))
        trainer.reseed(stream)
        return trainer.prepare(trainer.tokenizer.spans(text)).seed

    assert negatives(9) == negatives(9)
    assert negatives(9) != negatives(11)


@pytest.mark.parametrize("acc_cols", [1, 8, 0], ids=["rowadagrad", "adagrad", "sgd"])
def test_the_compiled_row_passes_equal_the_arithmetic_they_replace(acc_cols):
    """``take_deltas`` / ``merge_answer`` against numpy's fancy-indexed version of the same sums, for every
    optimizer's accumulator shape, on rows in any order."""
    from online.cluster.delta_rows import merge_answer, take_deltas

    rng = np.random.default_rng(11)
    n, dim = 50, 8
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    accum = rng.random((n if acc_cols else 0, acc_cols or dim)).astype(np.float32)
    base = rng.standard_normal((n, dim)).astype(np.float32)
    base_acc = rng.random((n, 1)).astype(np.float32)
    rows = rng.permutation(n)[:20].astype(np.int64)
    acc_mean = accum[rows].mean(axis=1) if acc_cols else np.zeros(len(rows), np.float32)
    contraction = rng.random(n).astype(np.float32)
    c0 = contraction.copy()
    want = np.concatenate([vectors[rows] - base[rows], (acc_mean - base_acc[rows, 0])[:, None],
                           c0[rows, None]], axis=1)
    out = np.empty((len(rows), dim + 2), dtype=np.float32)
    take_deltas(vectors, accum, base, base_acc, contraction, rows, out)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    assert not contraction[rows].any(), "the contraction restarts once sent"
    np.testing.assert_array_equal(base[rows], vectors[rows])            # the base is what was sent
    np.testing.assert_allclose(base_acc[rows, 0], acc_mean, rtol=1e-6)

    merged = rng.standard_normal((len(rows), dim + 1)).astype(np.float32)
    v0, a0, b0, ba0 = vectors.copy(), accum.copy(), base.copy(), base_acc.copy()
    merge_answer(vectors, accum, base, base_acc, rows, merged)
    np.testing.assert_allclose(vectors[rows], v0[rows] + merged[:, :dim] - b0[rows], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(base[rows], merged[:, :dim])
    np.testing.assert_array_equal(base_acc[rows, 0], merged[:, dim])
    if acc_cols:
        np.testing.assert_allclose(accum[rows], a0[rows] + (merged[:, dim] - ba0[rows, 0])[:, None], rtol=1e-6,
                                   atol=1e-6)
    untouched = np.setdiff1d(np.arange(n), rows)
    np.testing.assert_array_equal(vectors[untouched], v0[untouched])


def test_a_replica_refreshes_the_rows_the_servers_changed_before_it_trains_them_again():
    """r2 holds a row that r1 keeps training. Without the changed rows it waits for the refresh turn (and trains
    from an old value meanwhile); marked stale, its next collect brings the row to the servers' value."""
    server = EmbeddingShard(4, optimizer="rowadagrad", seed=5)
    r1, r2 = ReplicaShard(4, seed=5), ReplicaShard(4, seed=5)
    r2.REFRESH_MIN = 0          # no turn: only the changed rows can refresh it
    r2.refresh_share = 0.0
    keys = np.arange(100, 400, dtype=np.uint64)
    for r in (r1, r2):
        r.rows_for(keys)
        _sync_by_hand(r, server)
    version, _ = server.changed_keys_since(0)
    rows1 = r1.rows_for(keys[:3])
    r1.vectors[rows1] += 1.0
    r1.mark_changed(rows1)
    _sync_by_hand(r1, server)
    target = server.pull(keys[:3]).copy()
    _sync_by_hand(r2, server)                     # nothing changed in r2, nothing marked: still the old value
    rows2 = r2.rows_for(keys[:3], create=False)
    assert not np.allclose(r2.vectors[rows2], target)
    version, changed = server.changed_keys_since(version)
    assert sorted(changed.tolist()) == keys[:3].tolist()
    r2.mark_stale(changed)
    keys2, deltas2, _ = r2.collect()
    assert keys2.tolist() == keys[:3].tolist() and not deltas2[:, :4].any()   # a refresh: zero deltas
    r2.apply(keys2, server.read_rows(keys2))
    np.testing.assert_allclose(r2.vectors[rows2], target, rtol=1e-6)


def test_work_trained_on_new_rows_while_their_first_sync_is_in_flight_is_kept():
    """A row created here is sent fresh; what the replica trains on it before the answer arrives stays on top
    of the servers' value, whether the servers kept the fresh delta (a new word) or dropped it (their row had
    moved on). Adopting the answer lost it: a burst trained whole during a slow first sync left the servers'
    rows at their initial values."""
    for servers_row_moved in (False, True):
        server = EmbeddingShard(4, optimizer="rowadagrad", seed=5)
        replica = ReplicaShard(4, seed=5)
        keys = np.array([21, 22], dtype=np.uint64)
        rows = replica.rows_for(keys)
        replica.vectors[rows] += 0.5                      # trained before the collect
        replica.mark_changed(rows)
        if servers_row_moved:                             # another worker's delta reached the servers first
            server.add_deltas(keys, np.full((2, 4), 3.0, np.float32), np.zeros(2, np.float32))
        ckeys, deltas, fresh = replica.collect()
        assert fresh.all()
        replica.vectors[rows] += 0.25                     # trained while the sync is in flight
        merged = server.add_deltas(ckeys, deltas[:, :4], deltas[:, 4], fresh=True)
        replica.apply(ckeys, merged)
        np.testing.assert_allclose(replica.vectors[rows], merged[:, :4] + 0.25, rtol=1e-6)
        expected_server = server.pull(keys) if servers_row_moved else None
        if not servers_row_moved:                         # the fresh delta was taken: init + 0.5
            np.testing.assert_allclose(merged[:, :4], ReplicaShard(4, seed=5).pull(keys) + 0.5, rtol=1e-6)
        else:
            assert expected_server is not None and server.fresh_dropped == 2


def test_the_trainable_journal_lists_what_is_new_and_keeps_every_key_sorted():
    """Per server: the keys new to this worker, the rest remembered; ``known`` is sorted across servers whose key
    ranges do not follow their ranks; a new generation lists everything again."""
    from online.cluster.replica import TrainableJournal
    j = TrainableJournal(2)
    high, low = np.array([900, 950, 901], np.uint64), np.array([5, 3], np.uint64)
    assert j.answer(0, (1, 3, high)).tolist() == [900, 901, 950]
    assert j.answer(1, (1, 2, low)).tolist() == [3, 5]
    assert j.known().tolist() == [3, 5, 900, 901, 950] and j.changed
    j.changed = False
    assert j.answer(0, (1, 5, np.array([950, 920, 900], np.uint64))).tolist() == [920]
    assert j.known().tolist() == [3, 5, 900, 901, 920, 950]
    assert j.answer(1, (1, 2, np.zeros(0, np.uint64))).tolist() == []
    j.changed = False
    assert j.answer(1, (2, 1, np.array([4], np.uint64))).tolist() == [4]   # a new log: it is everything now
    assert j.known().tolist() == [4, 900, 901, 920, 950] and j.changed


def test_a_server_speaks_exchange_3_and_answers_a_malformed_packed_delta_with_an_error_it_counts(ps_cluster):
    """A real server: ``HEAD_EXCHANGE`` names version 3; a packed delta whose length fits no layout, or whose scale
    is not a number, is answered (empty rows, so the sender does not hang), counted and logged, and the shard is
    untouched; a well-formed one after it is merged, and answered in float16 or int8 as its command says, as are
    the refreshes."""
    cluster, join = ps_cluster
    kv = join()
    sid = kv.po.server_ids()[0]
    assert orjson.loads(kv.wait(kv.request(pc.HEAD_EXCHANGE, b"", sid), 20)[0].body) == {"exchange": 3}
    keys = np.array([word_key("zebra")], dtype=np.uint64)
    before = kv.pull_sync(keys, cmd=pc.CMD_DELTA, timeout=20)
    width = delta_wire.packed_width(16, False)
    bad_scale = np.zeros(width, np.float32)
    bad_scale[0] = np.nan
    for vals in (np.zeros(width + 2, np.float32), bad_scale):   # (width + 1 is the layout with a contraction)
        kv.wait(kv.pushpull(keys, vals, cmd=pc.CMD_DELTA_PACKED), 20)
    assert cluster.metric("server0", "livevec_server_rejected_total") == 2
    np.testing.assert_array_equal(kv.pull_sync(keys, cmd=pc.CMD_DELTA, timeout=20), before)
    d = np.zeros((1, 17), np.float32)
    d[0, :16] = 0.5
    wire, head, codes = delta_wire.packed_buffer(1, 16, False)
    delta_wire.pack_deltas(d, np.zeros((1, 16), np.float32), np.array([0]), head, codes)
    res = kv.wait(kv.pushpull(keys, wire.reshape(-1), cmd=pc.CMD_DELTA_PACKED), 20)
    merged = delta_wire.unpack_answer_sparse(res.vals, res.lens, 1, 16, np.zeros((1, 16), np.float32))
    np.testing.assert_allclose(merged[0, :16], before[:16] + 0.5, atol=2e-3)
    # exchange 3: the same delta again, its answer and a refresh in int8 (this sender moved the row last: the
    # answer is its accumulator alone, the sender holds the value)
    res = kv.wait(kv.pushpull(keys, wire.reshape(-1), cmd=pc.CMD_DELTA_PACKED_I8), 20)
    assert res.lens.tolist() == [1]
    exact = kv.pull_sync(keys, cmd=pc.CMD_DELTA, timeout=20)
    np.testing.assert_allclose(exact[:16], before[:16] + 1.0, atol=1e-6)
    refreshed = kv.wait(kv.pull(keys, cmd=pc.CMD_DELTA_PACKED_I8), 20)
    assert len(refreshed.vals) == delta_wire.answer_width(16, delta_wire.I8)
    row = delta_wire.unpack_answer(refreshed.vals, 1, 16, delta_wire.I8)
    step = np.abs(exact[:16]).max() / 127
    assert np.abs(row[0, :16] - exact[:16]).max() <= step / 2 + 1e-6
    assert row[0, 16] == exact[16]
