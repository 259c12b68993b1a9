"""Versions: ``livevec --version``, the version each format carries, and readers refusing a newer one.

The release is named once (``online.__version__``) and everything that prints or packages it agrees. Each persisted or
shared format (the checkpoint's manifest and shards, the host replica's segment, the export) is written with its
version, and a reader that meets a newer one refuses it with both versions named instead of misreading it. A worker
whose host replica is held by workers it cannot share it with stops at start, before it joins ps-lite or Kafka,
with exit 2 and the cause named (never a setting that agrees). Across two real releases: ``tests/test_upgrade.py``.
"""
from __future__ import annotations

import asyncio
import fcntl
import json
import os
import re
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from online.checkpoint.store import (FORMAT, MANIFEST, SHARD_FORMAT, CheckpointError, CheckpointStore, ShardState,
                                     read_shard_file, write_shard_file, _manifest_digest)
from online.client.errors import LiveVecError
from online.client.word2vec_stream import BinaryReader
from online.cluster.host_replica import HostSegment, segment_path
from online.cluster.ps_commands import EXCHANGE_VERSION
from online.cluster.segment_check import HostReplicaError, check_before_joining, other_layouts, release_number
from online.cluster.segment_layout import H_LAYOUT, H_RELEASE, LAYOUT
from online.frontend.export import EXPORT_FORMAT
from online import __version__
from online.cli.main import formats

REPO = Path(__file__).resolve().parents[1]


def _cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "online.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=env)


# ----------------------------------------------------------------------------- the release

def test_livevec_version_names_the_release_and_each_formats_version():
    out = _cli("--version")
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert first == f"livevec {__version__}"
    assert second == (f"checkpoint manifest {FORMAT}, checkpoint shard {SHARD_FORMAT}, host replica layout {LAYOUT}, "
                      f"exchange {EXCHANGE_VERSION}, export {EXPORT_FORMAT}")


def test_the_package_changelog_and_compatibility_table_name_this_release():
    """pyproject reads the version from ``online.__version__``; the changelog's newest release and the runbook's
    compatibility table are this one, and the table gives every format's current version."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" in project["project"]["dynamic"] and "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "online.__version__"}
    changelog = (REPO / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", changelog, re.M)
    assert releases and releases[0] == __version__, releases
    assert re.search(r"^### Upgrading", changelog, re.M)
    runbook = (REPO / "docs" / "operations.md").read_text()
    section = runbook[runbook.index('<a id="compatibility"></a>'):]
    section = section[:section.index("\n## ", 1)]
    for name, version in formats().items():
        row = next((line for line in section.splitlines() if line.startswith(f"| {name} |")), None)
        assert row is not None, f"no row for {name} in the compatibility table"
        assert f"| {version} |" in row.replace("**", ""), (name, version, row)


# ----------------------------------------------------------------------------- checkpoints

def _state(meta: dict | None = None) -> ShardState:
    keys = np.array([3, 7, 11], dtype=np.uint64)
    return ShardState(keys, np.ones((3, 4), np.float32), np.zeros((0, 4), np.float32), np.array([1, 2, 3]),
                      keys[:1], ["paris"], {"dim": 4, "rank": 0, **(meta or {})})


def _checkpoint(store: CheckpointStore, ckpt_id: int = 1):
    _path, entry = store.write_shard(ckpt_id, 0, _state())
    return store.write_manifest(ckpt_id, {"num_servers": 1, "files": {"server-0.npz": entry}, "offsets": {}})


def _rewrite_manifest(store: CheckpointStore, ckpt_id: int, **changes) -> None:
    path = store.path_of(ckpt_id) / MANIFEST
    body = {**json.loads(path.read_text()), **changes}
    body["sha256"] = _manifest_digest(body)
    path.write_text(json.dumps(body))


def test_a_checkpoint_carries_its_formats_and_the_release_that_wrote_it(tmp_path):
    store = CheckpointStore(tmp_path)
    ckpt = _checkpoint(store)
    assert ckpt.manifest["format"] == FORMAT and ckpt.manifest["release"] == __version__
    assert ckpt.manifest["files"]["server-0.npz"]["format"] == SHARD_FORMAT
    meta = read_shard_file(ckpt.shard_path(0)).meta
    assert meta["format"] == SHARD_FORMAT and meta["release"] == __version__
    assert store.verify(1).id == 1


def test_a_newer_manifest_format_is_refused_with_both_versions_named(tmp_path):
    store = CheckpointStore(tmp_path)
    _checkpoint(store)
    _rewrite_manifest(store, 1, format=FORMAT + 1, release="9.1.0", layout_of_the_future={"x": 1})
    with pytest.raises(CheckpointError) as refused:
        store.verify(1)
    message = str(refused.value)
    assert f"checkpoint manifest format {FORMAT + 1}, written by livevec 9.1.0, is newer" in message
    assert f"livevec {__version__} reads checkpoint manifest format {FORMAT}" in message
    assert "checksum" not in message
    assert store.latest_complete() is None   # skipped (with the reason logged), never misread


def test_a_newer_shard_format_is_refused_from_the_manifest_and_from_the_file(tmp_path):
    store = CheckpointStore(tmp_path)
    ckpt = _checkpoint(store)
    entry = {**ckpt.manifest["files"]["server-0.npz"], "format": SHARD_FORMAT + 1}
    _rewrite_manifest(store, 1, files={"server-0.npz": entry}, release="9.1.0")
    with pytest.raises(CheckpointError, match=f"server-0.npz: checkpoint shard format {SHARD_FORMAT + 1}, written "
                                              f"by livevec 9.1.0, is newer than this release reads: livevec "
                                              f"{re.escape(__version__)} reads checkpoint shard format {SHARD_FORMAT}"):
        store.verify(1)
    # the shard file on its own says so too (``livevec checkpoint export`` reads files directly)
    path = tmp_path / "future.npz"
    state = _state()
    write_shard_file(path, state)
    with np.load(path) as z:
        arrays = dict(z)
    meta = {**json.loads(bytes(arrays["meta"]).decode()), "format": SHARD_FORMAT + 1, "release": "9.1.0"}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(path, **arrays)
    with pytest.raises(CheckpointError, match=f"checkpoint shard format {SHARD_FORMAT + 1}, written by livevec "
                                              "9.1.0, is newer"):
        read_shard_file(path)


def test_a_shard_without_a_format_is_format_1_as_the_first_release_wrote_it(tmp_path):
    path = tmp_path / "server-0.npz"
    write_shard_file(path, _state())
    with np.load(path) as z:
        arrays = dict(z)
    meta = json.loads(bytes(arrays["meta"]).decode())
    del meta["format"], meta["release"]
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(path, **arrays)
    assert read_shard_file(path).words == ["paris"]


# ----------------------------------------------------------------------------- the export

def test_the_export_names_its_format_and_the_client_refuses_a_newer_one(tmp_path):
    from aiohttp.test_utils import TestServer

    from online.frontend.app import create_app
    from online.frontend.settings import FrontendSettings
    from online.frontend.sources import Word2VecFileSource
    from online.learner.word2vec_format import write_binary

    path = tmp_path / "vectors.bin"
    write_binary(path, ["paris", "france"], np.eye(2, 4, dtype=np.float32))

    async def exported():
        settings = FrontendSettings(source="word2vec", model_file=str(path), sync_interval=0.05).validate()
        server = TestServer(create_app(settings, Word2VecFileSource(path)), host="127.0.0.1")
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as session:
                for _ in range(200):
                    async with session.get(server.make_url("/v1/export?format=binary")) as r:
                        if r.status == 200:
                            return dict(r.headers), await r.read()
                    await asyncio.sleep(0.05)
        finally:
            await server.close()
        raise AssertionError("the front end never answered the export")

    headers, body = asyncio.run(exported())
    assert headers["X-Export-Format"] == str(EXPORT_FORMAT)
    lower = {k.lower(): v for k, v in headers.items()}
    reader = BinaryReader(lower)
    reader.feed(body)
    assert reader.finish().words == ["paris", "france"]
    with pytest.raises(LiveVecError, match=f"format {EXPORT_FORMAT + 1} .*this client reads format {EXPORT_FORMAT}"):
        BinaryReader({**lower, "x-export-format": str(EXPORT_FORMAT + 1)})


# ----------------------------------------------------------------------------- the host replica

_HOLDER = """
import sys, time
sys.path.insert(0, {repo!r})
from online.cluster.host_replica import HostSegment
from online.cluster.segment_check import release_number
from online.cluster.segment_layout import H_LAYOUT, H_RELEASE
seg = HostSegment(sys.argv[1], dim=int(sys.argv[2]), rows=64, optimizer="rowadagrad", seed=1)
if sys.argv[3] != "-":   # what another release's workers would have written
    seg.header[H_LAYOUT] = int(sys.argv[3])
    seg.header[H_RELEASE] = release_number(sys.argv[4])
print("attached", flush=True)
time.sleep(120)
"""


def _holder(path: Path, dim: int = 8, layout: str = "-", release: str = "-") -> subprocess.Popen:
    """A process attached to a segment at ``path`` (its header rewritten to another layout and release)."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER.format(repo=str(REPO)), str(path), str(dim), layout,
                             release], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "attached"
    return proc


class _Listener:
    """A TCP port that records whether anything connected (the scheduler's and the broker's stand-in)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]

    def connected(self) -> bool:
        try:
            conn, _ = self.sock.accept()
        except BlockingIOError:
            return False
        conn.close()
        return True

    def close(self) -> None:
        self.sock.close()


def _worker(shm: Path, scheduler: _Listener, broker: _Listener, dim: int = 8) -> tuple[subprocess.Popen, float]:
    env = {"PATH": "/usr/bin:/bin", "DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1",
           "DMLC_PS_ROOT_PORT": str(scheduler.port), "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1",
           "DMLC_NODE_HOST": "127.0.0.1", "LIVEVEC_KAFKA_BOOTSTRAP": f"127.0.0.1:{broker.port}",
           "LIVEVEC_KAFKA_TOPICS": "t", "LIVEVEC_KAFKA_GROUP": "g", "LIVEVEC_HOST_REPLICA": str(shm),
           "LIVEVEC_HOST_REPLICA_ROWS": "64", "LIVEVEC_DIM": str(dim), "LIVEVEC_SEED": "1"}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "online.cli", "worker"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    return proc, time.monotonic() - t0


@pytest.mark.parametrize("case", ["another-layout", "another-dim"])
def test_a_worker_that_cannot_share_the_hosts_replica_stops_before_joining_and_names_the_cause(tmp_path, case):
    shm = tmp_path / "shm"
    shm.mkdir()
    scheduler, broker = _Listener(), _Listener()
    path = segment_path(shm, "127.0.0.1", scheduler.port, "127.0.0.1")
    holder = _holder(path, layout=str(LAYOUT + 1), release="0.3.0") if case == "another-layout" \
        else _holder(path, dim=16)
    try:
        proc, took = _worker(shm, scheduler, broker)
        print(f"{case}: refused in {took:.2f} s from the process's start")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        message = proc.stderr.strip().splitlines()[-1]
        if case == "another-layout":
            assert message.startswith("livevec worker: configuration error: LIVEVEC_HOST_REPLICA: "), message
            assert f"layout {LAYOUT + 1} (livevec 0.3.0)" in message and f"layout {LAYOUT}" in message
            assert f"(livevec {__version__})" in message and "stop the other workers of this host" in message
            assert not re.search(r"\bdim\b|optimizer|seed|LIVEVEC_DIM|_ROWS", message), message
        else:
            assert message.startswith("livevec worker: configuration error: LIVEVEC_DIM: "), message
            assert "dim 16, this worker has 8" in message
            assert not re.search(r"optimizer|seed|_ROWS|layout \d+ \(", message), message
        assert "Traceback" not in proc.stderr
        # it joined neither the cluster nor Kafka, nor compiled anything first
        assert not scheduler.connected() and not broker.connected()
        assert "kernel_compiled" not in proc.stderr and "worker_ready" not in proc.stderr
        assert holder.poll() is None   # the workers already there go on
    finally:
        holder.kill()
        holder.wait()
        scheduler.close()
        broker.close()


def test_a_segment_nobody_holds_or_of_another_layout_is_no_reason_to_refuse(tmp_path):
    """A dead segment of another layout is started afresh by the attach; another layout's name beside this one's
    (the previous release's workers during an upgrade) is listed, not refused; live and agreeing, it is taken."""
    path = segment_path(tmp_path, "sched", 7, "h")
    assert path.name == f"livevec-sched-7-h-layout{LAYOUT}.replica"
    dead = HostSegment(path, dim=8, rows=64, optimizer="rowadagrad", seed=1)
    dead.header[H_LAYOUT] = LAYOUT + 1
    dead.detach()   # removed: this process was its last member
    holder = _holder(path, layout=str(LAYOUT + 1), release="0.3.0")
    holder.kill()
    holder.wait()   # dead, its files left behind
    previous = tmp_path / "livevec-sched-7-h.replica"   # the name the previous release's workers use
    previous.write_bytes(b"")
    fd = os.open(previous, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)   # as its attached workers hold it
    assert check_before_joining(path, dim=8, rows=64, optimizer="rowadagrad", seed=1) == [previous]
    assert other_layouts(path) == [previous]
    live = _holder(path)   # its attach reclaims what is dead, never a segment held
    try:
        assert check_before_joining(path, dim=8, rows=64, optimizer="rowadagrad", seed=1) == [previous]
        with pytest.raises(HostReplicaError, match="^LIVEVEC_OPTIMIZER: .* optimizer rowadagrad, this worker has "
                                                   "adagrad"):
            check_before_joining(path, dim=8, rows=64, optimizer="adagrad", seed=1)
        with pytest.raises(HostReplicaError, match="^LIVEVEC_HOST_REPLICA_ROWS: .* rows 64, this worker has 128"):
            check_before_joining(path, dim=8, rows=128, optimizer="rowadagrad", seed=1)
    finally:
        live.kill()
        live.wait()
        os.close(fd)


def test_a_segment_names_the_release_that_made_it(tmp_path):
    seg = HostSegment(tmp_path / "s.replica", dim=4, rows=16, optimizer="sgd", seed=1)
    try:
        assert int(seg.header[H_RELEASE]) == release_number(__version__) and int(seg.header[H_LAYOUT]) == LAYOUT
    finally:
        seg.detach()
