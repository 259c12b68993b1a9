"""Checkpoint files: round trips, atomicity, damaged/partial checkpoints and fallback, the ledger, the CLI."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import orjson

from online.checkpoint.participants import BatchLedger, ServerCheckpointing
from online.checkpoint.settings import CoordinatorSettings
from online.cluster import ps_commands as pc
from online.cluster.server import ShardService
from ps_bridge.metrics import Registry
from ps_bridge.simple_app import SimpleData
from online.checkpoint.store import (MANIFEST, CheckpointError, CheckpointStore, atomic_write, offsets_from_json,
                                     offsets_to_json, read_shard_file, restore_shard, snapshot_shard,
                                     write_shard_file)
from online.learner.embedding_shard import EmbeddingShard
from ps_bridge.settings import SettingError
from ps_bridge.structured_logging import KeyValueFormatter
from online.learner.keys import output_rows, word_key, word_keys, word_rows

REPO = Path(__file__).resolve().parents[1]
HALF = (2**64 - 1) // 2


def _trained_shard(optimizer="adagrad", words=("king", "queen", "paris", "france", "über"), dim=8, seed=3):
    shard = EmbeddingShard(dim, optimizer=optimizer, seed=seed)
    keys = np.unique(word_rows(word_keys(words)))
    rng = np.random.default_rng(0)
    for _ in range(3):
        shard.push(keys, rng.normal(size=(len(keys), dim)).astype(np.float32))
    in_keys = np.array([word_key(w) for w in words], dtype=np.uint64)
    shard.add_counts(in_keys, np.arange(1, len(words) + 1))
    shard.set_words(in_keys, list(words))
    shard.free(output_rows(word_keys(words[-1:])))   # a freed row must not come back
    return shard


def _assert_same(a: EmbeddingShard, b: EmbeddingShard):
    ka, kb = np.sort(a.keys()), np.sort(b.keys())
    assert np.array_equal(ka, kb)
    ra, rb = a.rows_for(ka, create=False), b.rows_for(kb, create=False)
    assert np.array_equal(a.vectors[ra], b.vectors[rb])
    assert np.array_equal(a.counts[ra], b.counts[rb])
    if a.accum.shape[0]:
        assert np.array_equal(a.accum[ra], b.accum[rb])
    assert a.words == b.words


@pytest.mark.parametrize("optimizer", ["adagrad", "rowadagrad", "sgd"])
def test_shard_round_trip_keeps_vectors_optimizer_state_counts_and_words(tmp_path, optimizer):
    shard = _trained_shard(optimizer)
    meta = {"rank": 0, "tokens_counted": 15, "ledger": {"records": 7}}
    entry = write_shard_file(tmp_path / "server-0.npz", snapshot_shard(shard, meta))
    assert entry["rows"] == len(shard) and entry["words"] == len(shard.words)
    state = read_shard_file(tmp_path / "server-0.npz")
    assert state.meta["tokens_counted"] == 15 and state.meta["ledger"] == {"records": 7}
    back = restore_shard([state], dim=8, optimizer=optimizer, eta=shard.eta, seed=3)
    _assert_same(shard, back)
    # the restored shard keeps training like the original
    keys = np.sort(shard.keys())[:3]
    g = np.ones((3, 8), np.float32)
    shard.push(keys, g)
    back.push(keys, g)
    assert np.allclose(shard.pull(keys), back.pull(keys))


def test_checkpoint_of_two_servers_loads_into_one_and_back_into_two(tmp_path):
    words = [f"w{i}" for i in range(200)]
    whole = _trained_shard("adagrad", words)
    keys = np.sort(whole.keys())
    files = []
    for rank, (lo, hi) in enumerate([(0, HALF), (HALF, 2**64 - 1)]):
        part = restore_shard([snapshot_shard(whole)], dim=8, optimizer="adagrad", eta=None, seed=3, key_range=(lo, hi))
        assert len(part) == int(((keys >= lo) & (keys < hi)).sum()) > 0
        write_shard_file(tmp_path / f"server-{rank}.npz", snapshot_shard(part))
        files.append(read_shard_file(tmp_path / f"server-{rank}.npz"))
    merged = restore_shard(files, dim=8, optimizer="adagrad", eta=None, seed=3)
    _assert_same(whole, merged)
    with pytest.raises(CheckpointError, match="dim"):
        restore_shard(files, dim=16, optimizer="adagrad", eta=None, seed=3)


def _complete(store: CheckpointStore, ckpt_id: int, shard: EmbeddingShard, offsets=None):
    path = store.prepare(ckpt_id)
    entry = write_shard_file(path / "server-0.npz", snapshot_shard(shard))
    return store.write_manifest(ckpt_id, {"num_servers": 1, "files": {"server-0.npz": entry},
                                          "offsets": offsets or {"t": {"0": ckpt_id * 10}}})


def test_latest_complete_skips_damaged_and_partial_checkpoints_with_a_clear_log_line(tmp_path, caplog):
    store = CheckpointStore(tmp_path)
    shard = _trained_shard()
    assert store.latest_complete() is None and store.next_id() == 1
    for i in (1, 2, 3, 4):
        _complete(store, i, shard)
    (store.path_of(5)).mkdir()                                  # partial: the writer died before the manifest
    write_shard_file(store.path_of(5) / "server-0.npz", snapshot_shard(shard))
    assert store.latest_complete().id == 4
    # 4: one flipped byte in the shard data
    f = store.path_of(4) / "server-0.npz"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    # 3: a truncated shard file
    g = store.path_of(3) / "server-0.npz"
    g.write_bytes(g.read_bytes()[:-100])
    # 2: an edited manifest (offsets changed by hand)
    m = store.path_of(2) / MANIFEST
    body = json.loads(m.read_text())
    body["offsets"]["t"]["0"] = 999
    m.write_text(json.dumps(body))
    caplog.set_level(logging.WARNING, logger="livevec.checkpoint")
    latest = store.latest_complete()
    assert latest.id == 1 and offsets_from_json(latest.offsets) == {("t", 0): 10}
    fmt = KeyValueFormatter()
    reasons = " | ".join(fmt.format(r) for r in caplog.records if r.getMessage() == "checkpoint_skipped")
    assert "no manifest" in reasons and "checksum mismatch (corrupt data)" in reasons
    assert "bytes, manifest says" in reasons and "manifest checksum mismatch" in reasons
    assert "falling back to the previous checkpoint" in reasons
    # sizes-only verification (list) still catches truncation, not the flipped byte
    assert store.verify(4, check_data=False).id == 4
    with pytest.raises(CheckpointError):
        store.verify(3, check_data=False)
    assert store.next_id() == 6


def test_atomic_write_never_leaves_a_partial_file(tmp_path):
    target = tmp_path / "f.bin"
    atomic_write(target, lambda fh: fh.write(b"old"))

    def failing(fh):
        fh.write(b"new but half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic_write(target, failing)
    assert target.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["f.bin"]


def test_prune_keeps_the_newest_complete_checkpoints(tmp_path):
    store = CheckpointStore(tmp_path)
    shard = _trained_shard()
    for i in (1, 2, 3, 4):
        _complete(store, i, shard)
    store.prepare(5)   # in progress: never pruned
    assert store.prune(2) == [1, 2]
    assert store.ids() == [3, 4, 5]


def test_offsets_json_round_trip():
    offsets = {("a", 0): 5, ("a", 3): 7, ("b", 1): 0}
    assert offsets_from_json(offsets_to_json(offsets)) == offsets


def test_ledger_counts_duplicates_and_gaps_and_survives_json():
    ledger = BatchLedger()
    ledger.apply([["t", 0, 0, 10], ["t", 1, 0, 5]], records=15, tokens=150)
    ledger.apply([["t", 0, 10, 20]], records=10, tokens=100)
    assert (ledger.overlaps, ledger.gaps, ledger.offsets) == (0, 0, 25)
    copy = BatchLedger(json.loads(json.dumps(ledger.to_json())))
    copy.apply([["t", 0, 15, 25]], records=10, tokens=100)   # 15..20 again
    copy.apply([["t", 1, 8, 9]], records=1, tokens=10)        # 5..8 skipped
    assert (copy.overlaps, copy.gaps, copy.frontier) == (5, 3, {"t/0": 25, "t/1": 9})
    assert (copy.records, copy.tokens, copy.batches) == (36, 360, 4)
    with pytest.raises(ValueError):
        copy.apply([["t", 0, 9, 3]], records=1, tokens=1)


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "online.cli", "checkpoint", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def test_cli_list_verify_export(tmp_path):
    from gensim.models import KeyedVectors

    store = CheckpointStore(tmp_path / "ck")
    shard = _trained_shard("adagrad", ("king", "queen", "paris", "france", "rome"))
    _complete(store, 1, shard)
    _complete(store, 2, shard)
    (store.path_of(2) / "server-0.npz").write_bytes(b"garbage")
    res = _cli("list", env={"LIVEVEC_CHECKPOINT_DIR": str(store.root)})
    assert res.returncode == 0, res.stderr
    assert "complete" in res.stdout and "DAMAGED" in res.stdout
    res = _cli("--dir", str(store.root), "verify")
    assert res.returncode == 1 and "latest complete: 1" in res.stdout
    assert _cli("--dir", str(store.root), "verify", "1").returncode == 0
    res = _cli("--dir", str(store.root), "export", "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    kv = KeyedVectors.load_word2vec_format(str(tmp_path / "out" / "vectors.bin"), binary=True)
    kt = KeyedVectors.load_word2vec_format(str(tmp_path / "out" / "vectors.txt"))
    assert list(kv.index_to_key) == ["rome", "france", "paris", "queen", "king"]   # most frequent first
    for w in kv.index_to_key:
        row = shard.pull(np.array([word_key(w)], np.uint64))[0]
        assert np.array_equal(kv[w], row) and np.allclose(kt[w], row, atol=1e-6)
    vocab = (tmp_path / "out" / "vocab.txt").read_text().split("\n")
    assert vocab[0] == "rome 5"
    res = _cli("list")
    assert res.returncode == 2 and "LIVEVEC_CHECKPOINT_DIR" in res.stderr
    res = _cli("--dir", str(tmp_path / "none"), "now", "--timeout", "1")
    assert res.returncode == 1


class _Node:
    """The little of a server's Postoffice that its checkpoint side asks for."""
    rank, num_servers = 0, 1
    registry = Registry()

    def ready(self) -> bool:
        return False

    def server_key_ranges(self):
        return [(0, 2**64 - 1)]


class _App:
    def __init__(self):
        self.answers: list[tuple[int, bytes]] = []

    def response(self, req, body: bytes = b"") -> None:
        self.answers.append((req.head, body))


def test_the_server_hands_its_extension_the_heads_it_does_not_know_and_its_stats(tmp_path):
    checkpointing = ServerCheckpointing(str(tmp_path), _Node())
    service = ShardService(EmbeddingShard(4), Registry(), checkpointing)
    assert checkpointing.service is service
    app = _App()
    ledger = {"ranges": [["t", 0, 0, 10]], "records": 10, "tokens": 50}
    service.handle_simple(SimpleData(pc.HEAD_LEDGER, orjson.dumps(ledger), 9, 1, 0), app)
    service.handle_simple(SimpleData(pc.HEAD_STATS, b"", 9, 2, 0), app)
    service.handle_simple(SimpleData(999, b"", 9, 3, 0), app)
    (_, ack), (_, stats), (_, rejected) = app.answers
    assert ack == b"" and orjson.loads(stats)["ledger"]["records"] == 10
    assert orjson.loads(stats)["checkpoint_loaded"] is None
    assert "unknown head 999" in orjson.loads(rejected)["error"]


def test_checkpointing_is_switched_on_by_its_directory_alone():
    assert CoordinatorSettings.from_args(None, {}) is None
    s = CoordinatorSettings.from_args(None, {"LIVEVEC_CHECKPOINT_DIR": "/ckpt", "LIVEVEC_CHECKPOINT_KEEP": "5"})
    assert (s.checkpoint_dir, s.interval, s.records, s.keep, s.pause_timeout) == ("/ckpt", 60.0, 0, 5, 30.0)
    with pytest.raises(SettingError, match="LIVEVEC_CHECKPOINT_KEEP"):
        CoordinatorSettings.from_args(None, {"LIVEVEC_CHECKPOINT_DIR": "/ckpt", "LIVEVEC_CHECKPOINT_KEEP": "0"})
    # The roles do not know about checkpoints: importing them loads none of online.checkpoint.
    code = ("import sys, online.cluster.server, online.cluster.worker, online.cluster.scheduler; "
            "print(sorted(m for m in sys.modules if m.startswith('online.checkpoint')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
