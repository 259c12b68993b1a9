"""One replica shared by the worker processes of a host (``online.cluster.host_replica``).

Real OS processes attach to a real tmpfs file; the syncs go to a real scheduler and server.
The cluster-level check (kill -9 of a worker sharing the replica, exactly once) is in
``test_checkpoint_recovery.py``.
"""
from __future__ import annotations

import multiprocessing
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from online.cluster.host_replica import HostReplicaError, SharedReplicaShard
from online.cluster.replica import ReplicaStore
from online.learner.trainer import LearnerConfig, Trainer
from online.stream.sample_corpus import generate_lines
from tests.test_delta_sync import ps_cluster  # noqa: F401  (the fixture)

# float32 rows both ways and every delta sent at once: these tests compare values exactly
EXACT_WIRE = {"delta_wire": "float32", "send_threshold": 0.0}

DIM = 8


def _shard(path, rows: int = 256, dim: int = DIM, seed: int = 3) -> SharedReplicaShard:
    return SharedReplicaShard(dim, path, rows, optimizer="rowadagrad", seed=seed)


def _other_process(path, keys, queue):
    """Attach, create rows (some the parent made, some new), train one of them, report what it saw."""
    shard = _shard(path)
    rows = shard.rows_for(np.array(keys, dtype=np.uint64))
    seen = shard.vectors[rows].copy()
    with shard.training():
        shard.vectors[rows[-1]] += 2.0
        shard.mark_changed(rows[-1:])
    queue.put((shard.segment.created, rows.tolist(), seen.tolist(), len(shard)))


def _in_another_process(target, *args):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    try:
        return queue.get(timeout=60)
    finally:
        proc.join(timeout=30)
        assert proc.exitcode == 0


def _count_members(path, queue):
    queue.put(_shard(path).members())


def test_a_shared_replica_counts_the_processes_attached_to_it(segment_path):
    """The sync interval is a replica's, split over the processes that train it (``online.cluster.sync_interval``),
    so the count follows processes that attach and exit."""
    here = _shard(segment_path)
    assert here.members() == 1
    assert _in_another_process(_count_members, segment_path) == 2   # that process and this one
    assert here.members() == 1                                        # it exited: its slot is free again


@pytest.fixture
def segment_path(tmp_path):
    path = f"/dev/shm/livevec-test-{tmp_path.name}"
    yield path
    for f in Path("/dev/shm").glob(Path(path).name + "*"):
        f.unlink(missing_ok=True)


def test_processes_of_a_host_train_the_same_rows(segment_path):
    here = _shard(segment_path)
    assert here.segment.created
    mine = here.rows_for(np.array([11, 12], dtype=np.uint64))
    here.vectors[mine] += 1.0
    here.mark_changed(mine)
    created, rows, seen, size = _in_another_process(_other_process, segment_path, [11, 12, 13])
    assert not created                                  # it attached to this segment
    assert rows[:2] == mine.tolist() and size == 3      # same key -> same row, one index for both
    np.testing.assert_array_equal(np.array(seen[:2], np.float32), here.vectors[mine])
    assert len(here) == 3 and sorted(here.keys().tolist()) == [11, 12, 13]
    theirs = here.rows_for(np.array([13], dtype=np.uint64), create=False)
    assert theirs[0] == rows[2]
    # its training is in this process's view, and the next collect sends it (here: fresh rows, from init)
    keys, deltas, fresh = here.collect()
    assert keys.tolist() == [11, 12, 13] and fresh.all()
    np.testing.assert_allclose(deltas[2, :DIM], 2.0)
    np.testing.assert_allclose(deltas[:2, :DIM], 1.0)


def test_a_segment_nobody_is_attached_to_starts_afresh(segment_path):
    _in_another_process(_other_process, segment_path, [21, 22])   # made it, then exited
    again = _shard(segment_path)
    assert again.segment.created and len(again) == 0 and again.version == 0


def test_workers_with_other_settings_are_refused_and_told_which(segment_path):
    _shard(segment_path, rows=256)
    with pytest.raises(HostReplicaError, match="^LIVEVEC_HOST_REPLICA_ROWS: .* rows 256, this worker has 512"):
        _shard(segment_path, rows=512)
    with pytest.raises(HostReplicaError, match="^LIVEVEC_SEED: .* seed 3, this worker has 4"):
        _shard(segment_path, rows=256, seed=4)


def test_a_full_replica_trains_what_fits_names_the_setting_and_frees_nothing(segment_path, caplog):
    shard = _shard(segment_path, rows=16)
    shard.rows_for(np.arange(14, dtype=np.uint64))
    with caplog.at_level("ERROR", logger="livevec.worker"):
        rows = shard.rows_for(np.array([3, 100, 101, 102, 103], dtype=np.uint64))
    assert rows[0] == shard.rows_for(np.array([3], np.uint64), create=False)[0]
    assert (rows[1:3] >= 0).all() and (rows[3:] == -1).all() and shard.rows_refused == 2
    full = [r for r in caplog.records if r.getMessage() == "host_replica_full"]
    assert full and full[0].setting == "LIVEVEC_HOST_REPLICA_ROWS" and full[0].refused == 2
    shard.free(np.arange(4, dtype=np.uint64))      # one process's eviction: others may train these
    shard.release_freed()
    assert len(shard) == 16


def test_a_trainer_on_a_full_replica_trains_the_words_that_have_rows(segment_path):
    class Store:   # the replica store's local side only: no servers in this test
        counts_every_word = False
        dim = DIM

        def __init__(self, shard):
            self.shard = shard

        def local_shard(self):
            return self.shard

        def free(self, keys):
            self.shard.free(keys)

        def set_words(self, keys, words):
            pass

        def add_counts(self, keys, deltas):
            pass

    shard = _shard(segment_path, rows=40)
    trainer = Trainer(LearnerConfig(dim=DIM, min_count=2, window=3, negative=3, seed=1), Store(shard))
    stats = trainer.train_records(generate_lines(400, seed=2))
    assert shard.rows_refused > 0 and len(shard) == 40      # the vocabulary needed more than 20 words' rows
    assert 0 < stats.kept < stats.tokens
    assert np.isfinite(shard.vectors).all()


@pytest.mark.root   # mounts a tmpfs
def test_a_tmpfs_too_small_fails_at_start_naming_the_rows(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True)
    try:
        with pytest.raises(HostReplicaError, match="LIVEVEC_HOST_REPLICA_ROWS: .* do not fit"):
            _shard(mount / "replica", rows=100_000, dim=100)
        assert (mount / "replica").stat().st_size == 0   # nothing half-made left behind
    finally:
        subprocess.run(["umount", str(mount)], check=True)
    with pytest.raises(HostReplicaError, match="LIVEVEC_HOST_REPLICA: cannot open"):
        _shard(tmp_path / "no" / "such" / "dir")


def test_workers_sharing_a_replica_send_each_change_once(ps_cluster, segment_path):  # noqa: F811
    """Three ps-lite worker nodes, one shared replica, each with its own vocabulary. Whichever syncs sends
    what the others trained; the servers add each change once, and merge the nodes' successive syncs as
    one worker's (each sync follows the last within the merge window, with deltas to the same frequent
    rows: merged as concurrent deltas of three workers they would be scaled down)."""
    _, join = ps_cluster
    config = LearnerConfig(dim=16, min_count=3, window=3, negative=3, seed=1)
    stores = [ReplicaStore(join(), 16, seed=1, timeout=20, host_replica=segment_path, host_rows=4096,
                         **EXACT_WIRE)
              for _ in range(3)]
    trainers = [Trainer(config, store) for store in stores]
    for store, trainer in zip(stores, trainers):
        store.on_totals = trainer.apply_cluster_counts
        store.on_trainable = trainer.learn_cluster_trainable
    lines = generate_lines(1600, seed=5)
    for i in range(0, len(lines), 40):
        who = (i // 40) % 3
        trainers[who].train_records(lines[i:i + 40])
        stores[(who + 1) % 3].sync()        # another process syncs this one's training
    for store in stores:
        store.sync()
    assert stores[0].shard.group and stores[0].shard.group == stores[2].shard.group
    shard = stores[0].shard
    keys = np.sort(shard.keys())
    assert len(keys) > 100
    rows = shard.rows_for(keys, create=False)
    served = stores[0].worker.pull_sync(keys, timeout=20).reshape(len(keys), 16)
    np.testing.assert_allclose(served, shard.vectors[rows], atol=1e-4)
    assert all(t.totals.kept > 1000 for t in trainers)   # both trained into it


def test_the_servers_merge_a_hosts_successive_syncs_as_one_workers(ps_cluster, segment_path):  # noqa: F811
    """Three nodes of one host each add the same change to a row and sync in turn, within the servers'
    merge window. In one model the row moved three times; merged as three workers' concurrent deltas
    (equal ones count once, never less than two: ``concurrent_merge``) it would move twice."""
    _, join = ps_cluster
    stores = [ReplicaStore(join(), 16, seed=1, timeout=20, host_replica=segment_path, host_rows=64,
                         **EXACT_WIRE)
              for _ in range(3)]
    shard = stores[0].shard
    key = np.array([12345], dtype=np.uint64)
    row = shard.rows_for(key)
    stores[0].sync()                           # the row is now the servers' (confirmed)
    start = shard.vectors[row].copy()
    step = np.linspace(0.01, 0.02, 16, dtype=np.float32)
    for store in stores:
        with shard.training():
            shard.vectors[row] += step
            shard.mark_changed(row)
        store.sync()
    served = stores[1].worker.pull_sync(key, timeout=20).reshape(1, 16)
    np.testing.assert_allclose(served, start + 3 * step, atol=1e-5)


def _hold_and_die(path, queue):
    shard = SharedReplicaShard(16, path, 64, optimizer="rowadagrad", seed=1)
    shard.hold(True)
    queue.put(shard.member)
    queue.close()
    queue.join_thread()   # the answer is out
    os._exit(0)   # as kill -9 would: no clean-up, the held flag stays in the segment


def test_a_sync_carries_other_processes_batches_and_a_checkpoint_hold_stops_the_hosts_syncs(
        ps_cluster, segment_path):  # noqa: F811
    _, join = ps_cluster
    a, b = (ReplicaStore(join(), 16, seed=1, timeout=20, host_replica=segment_path, host_rows=64,
                         **EXACT_WIRE) for _ in range(2))
    assert a.shard.member != b.shard.member
    a.add_counts(np.array([5], np.uint64), np.array([3], np.int64))   # a's two batches counted a word
    a.shard.batch_finished()
    a.shard.batch_finished()
    assert b.sync() is not None
    # b's sync carried a's rows, not a's counts: committed now, a's batches would lose them with a's process
    assert a.shard.covered_batches() == 0
    assert a.sync(min_gap=1e9) is None   # skipped for b's, but a's counts go out
    assert a.shard.covered_batches() == 2 and b.shard.covered_batches() == 0   # a may commit both
    a.shard.batch_finished()
    a.shard.hold(True)                         # a checkpoint holds a's syncs: so every sync of the host
    assert b.sync() is None and a.shard.covered_batches() == 2
    a.shard.hold(False)
    assert b.sync() is not None and a.sync(min_gap=1e9) is None and a.shard.covered_batches() == 3
    # a holder that dies holding does not stop the host for good
    dead = _in_another_process(_hold_and_die, segment_path)
    assert a.shard._held[dead] == 1
    assert b.sync() is not None and a.shard._held[dead] == 0


def test_a_trainable_word_without_both_rows_is_not_trained():
    """Row -1 would index the last row of the arrays: the subsampler must drop such tokens."""
    from online.learner.subsampling import keep_tokens
    slots = np.array([0, 1, 2, 1, 0], dtype=np.int64)
    sentences = np.array([0, 5], dtype=np.int64)
    trainable = np.ones(3, dtype=bool)
    in_row, out_row = np.array([10, -1, 12]), np.array([20, 21, -1])
    kept_in, kept_out, starts = keep_tokens(slots, sentences, trainable, np.ones(3, np.int64), 0.0, 0.0, 1,
                                            in_row, out_row)
    assert kept_in.tolist() == [10, 10] and kept_out.tolist() == [20, 20] and starts.tolist() == [0, 2]


def test_a_paced_out_process_still_sends_its_new_words_and_counts(
        ps_cluster, segment_path):  # noqa: F811
    """Pacing lets one process's sync stand for the host's, but only a process's own sync sends the strings
    of the words that became trainable in it: without them on the servers, the front end cannot show the
    word (the freshness bench's p99 went from 0.5 to 1.0 s). So a paced-out process still sends its words."""
    _, join = ps_cluster
    a, b = (ReplicaStore(join(), 16, seed=1, timeout=20, host_replica=segment_path, host_rows=64,
                         **EXACT_WIRE) for _ in range(2))
    key = np.array([4242], dtype=np.uint64)
    with a.shard.training():
        row = a.shard.rows_for(key)
        a.shard.vectors[row] += 0.5
        a.shard.mark_changed(row)
    assert b.sync() is not None and a.sync() is not None
    with a.shard.training():
        a.shard.vectors[row] += 0.5
        a.shard.mark_changed(row)
    assert b.sync(min_gap=60.0) is None, "another process of the host synced within the interval"
    b.set_words(np.array([777], dtype=np.uint64), ["freshword"])
    totals = []
    b.on_totals = lambda slots, keys, counted: totals.append((keys.tolist(), counted.tolist()))
    b.count_words(np.array([0]), np.array([777], dtype=np.uint64), np.array([3]))
    assert b.sync(min_gap=60.0) is None, "still paced: the deltas wait for the host's next sync"
    assert not b._words, "but the new words went out at once"
    assert not b._counts and totals == [([777], [3])], "and its counts, answered with the cluster's totals"
