"""Checkpoints on a real MooseFS, and the storage faults a cluster meets.

A 2-host lab (``online.deployment.netns_lab``) runs a MooseFS master on its bridge, one chunkserver
on the first host and a FUSE mount on each host at /mnt/mfs, where the Marathon group's hostPath
(/mnt/mfs/livevec) puts the checkpoints (``online.deployment.moosefs_lab``). A small cluster (one
server, one worker, a front end) trains a stream and checkpoints every 2 s onto it. Then, in turn:

* the chunkserver is killed (writes hang in mfsmount: the store's deadline must end them), then restarted;
* the mount of every host is lost (mfsmount killed: ENOTCONN, then an empty mount point), then mounted again;
* the master is killed with SIGKILL (every metadata call hangs in every mount, the operator's too), then
  restarted from its data directory: the mounts and the chunkserver reconnect by themselves;
* the mount of every host turns read-only (``mount -o remount,ro`` of the FUSE superblock: EROFS), then
  writable again;
* the checkpoint directory is full (a MooseFS hard quota below one checkpoint: EDQUOT), then freed.

Each time: training goes on and the front end answers without a 5xx; no checkpoint is completed
during the outage and none is left half-written as the latest; the failure is on /metrics
(``livevec_checkpoint_storage_ok`` 0, errors counted) and in one ``checkpoint_storage_unavailable``
line per process, the only ERROR line of the outage; checkpoints resume by themselves once storage is back. Last, the server is
killed: its restore reads the newest checkpoint, which ``livevec checkpoint verify`` accepts.

Needs root, Debian's moosefs-* packages (``make moosefs`` installs them; this test installs them as
root when they are missing) and /dev/fuse: without /dev/fuse it fails, saying so.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from online.checkpoint.store import CheckpointError, CheckpointStore
from online.deployment.lab_runner import lab_cluster
from online.deployment.local_runner import describe
from online.deployment.moosefs_lab import PACKAGES, MooseFSLab, moosefs_support_problem
from online.deployment.topology import default_topology
from online.stream.kafka_broker import KafkaBroker
from online.stream.sample_corpus import generate_lines
from online.stream.settings import KafkaBrokerSettings
from tests.cluster_harness import netns_lab, runner_metric, scraped_metric, wait_until
from tests.test_checkpoint_recovery import Producer, Watcher

pytestmark = [pytest.mark.root, pytest.mark.slow]   # a network-namespace lab, MooseFS mounts, apt
REPO = Path(__file__).resolve().parents[1]
IO_TIMEOUT = 4.0
OUTAGE = 8.0   # seconds each fault lasts (several checkpoint attempts at a 2 s interval)


def _ensure_moosefs() -> None:
    """What ``make moosefs`` does, for a run of this file alone: Debian's packages, as root."""
    if not Path("/dev/fuse").exists():
        pytest.fail("/dev/fuse is missing: MooseFS's mfsmount needs FUSE (load the fuse module, or run the "
                    "container with --device /dev/fuse); this test does not skip")
    if moosefs_support_problem() and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-qq", *PACKAGES], capture_output=True, timeout=600,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    problem = moosefs_support_problem()
    assert problem is None, problem


@pytest.fixture(scope="module")
def lab():
    _ensure_moosefs()
    with netns_lab(2, range(200, 250)) as lab:
        yield lab


@pytest.fixture(scope="module")
def mfs(lab, tmp_path_factory):
    fs = MooseFSLab(lab, tmp_path_factory.mktemp("mfs"), chunkservers=1)
    fs.start()
    try:
        yield fs
    finally:
        fs.close()
        mounts = Path("/proc/self/mountinfo").read_text()
        assert "mfs#" not in mounts and str(fs.admin_path) not in mounts, "a MooseFS mount was left behind"
        assert not fs.state_dir.exists()


@pytest.fixture(scope="module")
def cluster(lab, mfs, tmp_path_factory):
    work = tmp_path_factory.mktemp("mfs-cluster")
    settings = dataclasses.replace(KafkaBrokerSettings.from_env(), host=lab.bridge_address, port=0,
                                   data_dir=work / "kafka", state_file=None)
    broker = KafkaBroker(settings)
    broker.start()
    topic = "mfs-text"
    from online.stream.producer import produce
    produce([], bootstrap=broker.bootstrap, topic=topic, partitions=4, create_topic=True)
    producer = Producer(broker.bootstrap, topic, generate_lines(40000, seed=5), rate=25.0)
    env = {"LIVEVEC_KAFKA_BOOTSTRAP": broker.bootstrap, "LIVEVEC_KAFKA_TOPICS": topic,
           "PS_HEARTBEAT_INTERVAL": "0.5", "PS_HEARTBEAT_TIMEOUT": "5", "LIVEVEC_CHECKPOINT_INTERVAL": "2",
           "LIVEVEC_CHECKPOINT_IO_TIMEOUT": str(IO_TIMEOUT), "LIVEVEC_DIM": "16", "LIVEVEC_MIN_COUNT": "2",
           "LIVEVEC_KAFKA_BATCH_RECORDS": "10", "LIVEVEC_SYNC_INTERVAL": "0.3", "LIVEVEC_LOG_LEVEL": "INFO"}
    runner = lab_cluster(lab, default_topology(servers=1, workers=1, frontends=1), work_dir=work / "run", env=env,
                         app_env={"frontend": {"LIVEVEC_HTTP_HOST": "0.0.0.0", "LIVEVEC_MODEL_SOURCE": "ps"}},
                         instances={"server": 1, "worker": 1, "frontend": 1, "producer-example": 0},
                         volumes=mfs.volumes())
    assert runner.app("scheduler")["env"]["LIVEVEC_CHECKPOINT_DIR"] == "/mnt/mfs/livevec/checkpoints"
    watcher = Watcher(lambda: runner.url("frontend", "http"))
    try:
        runner.start()
        assert runner.wait_healthy(timeout=150), describe(runner.status())
        producer.start()
        watcher.start()
        ctx = _Ctx(runner, mfs, work / "run" / "logs", watcher)
        wait_until(lambda: ctx.latest() is not None and ctx.trained() > 50, 120,
                   message="training and a first checkpoint on MooseFS")
        yield ctx
        watcher.stop.set()
        watcher.join(timeout=10)
        assert not watcher.errors_5xx, watcher.errors_5xx[:5]
        assert watcher.codes.get(200, 0) > 20, watcher.codes
    finally:
        watcher.stop.set()
        runner.stop()
        broker.stop()


class _Ctx:
    def __init__(self, runner, mfs: MooseFSLab, logs: Path, watcher: Watcher):
        self.runner, self.mfs, self.logs, self.watcher = runner, mfs, logs, watcher
        # the operator's view, root namespace; bounded, as the tasks' calls are, since its mount hangs too
        # while the master is down
        self.store = CheckpointStore(mfs.admin_dir / "checkpoints", io_timeout=IO_TIMEOUT)

    def view(self, io_timeout: float = IO_TIMEOUT) -> CheckpointStore:
        """A store of its own per look: calls left hanging by one look do not fail the next ones."""
        return CheckpointStore(self.store.root, io_timeout=io_timeout, create=False)

    def latest(self):
        try:
            return self.view().latest_complete(check_data=False)
        except OSError:
            return None

    def trained(self) -> float:
        try:
            return runner_metric(self.runner, "worker", "livevec_worker_records_total")
        except OSError:
            return 0.0

    def metric(self, app: str, name: str, **labels: str) -> float:
        """Sum of the series of ``name`` on the app's task whose labels include ``labels``."""
        return scraped_metric(self.runner.url(app, "metrics", "/metrics"), name, **labels)

    def done_checkpoints(self) -> float:
        return self.metric("scheduler", "livevec_checkpoints_total", result="done")

    def failed_checkpoints(self) -> float:
        return self.metric("scheduler", "livevec_checkpoints_total", result="failed") + \
            self.metric("scheduler", "livevec_checkpoints_total", result="aborted")

    def log(self, app: str) -> str:
        return (self.logs / f"livevec-{app}-0.log").read_text(errors="replace")

    def outage(self, name: str, fault, restore, *, seen_by: tuple[str, ...]) -> dict:
        """Cause ``fault``, hold it OUTAGE s, ``restore``; assert what every storage fault must show."""
        before = self.latest()
        assert before is not None
        marks = {app: len(self.log(app)) for app in ("scheduler", "server")}
        failed0, done0 = self.failed_checkpoints(), self.done_checkpoints()
        trained0 = self.trained()
        t_fault = time.monotonic()
        fault()
        in_effect = time.time()   # the fault reaches the hosts one by one: from here it holds on all
        try:
            wait_until(lambda: all("event=checkpoint_storage_unavailable" in self.log(app)[marks[app]:]
                                   for app in seen_by), 30, interval=0.25,
                       message=f"{name}: the storage failure to be logged by {seen_by}")
            detected = time.monotonic() - t_fault
            for app in seen_by:   # on /metrics too
                assert self.metric(app, "livevec_checkpoint_storage_ok") == 0.0, app
            time.sleep(max(0.0, OUTAGE - detected))
            # a checkpoint was attempted and aborted meanwhile (the first failure may be another call, listing
            # the requests, and a hanging call takes IO_TIMEOUT before it fails: the scheduler must not hang)
            wait_until(lambda: self.failed_checkpoints() > failed0, 3 * IO_TIMEOUT, interval=0.25,
                       message=f"{name}: a checkpoint to be aborted")
            # no checkpoint completed while storage was failing (the scheduler's count, and the operator's
            # view when its own mount answers: not while the master is down). One whose manifest was written
            # before the fault reached every host is complete, and counts once its prune has failed
            # (on a slow machine ``fault()`` can take longer than a checkpoint interval, so more than one may
            # have completed before it held everywhere: each is walked, newest first)
            seen, last_before = self.latest(), None
            while seen is not None and seen.id > before.id:
                assert seen.manifest["created"] < in_effect, f"{name}: a checkpoint completed during the outage"
                last_before, done0 = last_before or seen, done0 + 1
                seen = self.view().latest_complete(check_data=False, before=seen.id)
            before = last_before or before
            assert self.done_checkpoints() == done0, f"{name}: a checkpoint completed during the outage"
        finally:
            restore()
        t_back = time.monotonic()
        wait_until(lambda: (self.latest() or before).id > before.id, 60, interval=0.25,
                   message=f"{name}: checkpoints to resume by themselves")
        resumed = time.monotonic() - t_back
        trained = self.trained() - trained0
        assert trained > 0, f"{name}: training stopped"
        after = {app: self.log(app)[marks[app]:] for app in ("scheduler", "server")}
        for app, text in after.items():   # one line per outage per process, not one per attempt
            assert text.count("event=checkpoint_storage_unavailable") <= 1, (app, text[-2000:])
            assert text.count("event=checkpoint_storage_still_unavailable") <= 1, app
        for app in seen_by:
            assert "event=checkpoint_storage_back" in after[app], (app, after[app][-2000:])
            wait_until(lambda: self.metric(app, "livevec_checkpoint_storage_ok") == 1.0, 10,
                       message=f"{app}'s storage gauge back at 1")
        errors = {app: sum(1 for line in text.splitlines() if "level=error" in line.lower())
                  for app, text in after.items()}
        for app, n in errors.items():   # the outage's one line, nothing else at ERROR
            assert n <= 1, (name, app, [line for line in after[app].splitlines() if "level=error" in line][:5])
        # nothing half-written is taken as the latest: the newest checkpoint, written after the fault, is the
        # one a restore takes, and it verifies in full; every other directory with a manifest verifies too,
        # or is refused as damaged (what a restore skips), never taken for complete without its data
        store = self.view(30.0)
        newest = store.latest_complete(check_data=True)
        assert newest is not None and newest.id > before.id, (name, newest, before.id)
        assert newest.id == max(store.ids()), (name, newest.id, store.ids())
        older = {}
        for ckpt_id in store.ids():
            if ckpt_id == newest.id or not (store.path_of(ckpt_id) / "manifest.json").exists():
                continue
            try:
                self.view(10.0).verify(ckpt_id)
                older[ckpt_id] = "ok"
            except CheckpointError as exc:
                older[ckpt_id] = f"damaged: {exc}"
            except OSError as exc:   # reads that hang: a restore would wait on them, not take them
                older[ckpt_id] = f"unreadable: {exc}"
        lines = [line for text in after.values() for line in text.splitlines() if "checkpoint_storage" in line]
        report = {"fault": name, "detected_s": round(detected, 1), "resumed_s": round(resumed, 1),
                  "records_trained": int(trained), "error_lines": errors, "older_checkpoints": older,
                  "lines": lines[:4]}
        print(report)
        return report


def _grep(text: str, event: str) -> list[str]:
    return [line for line in text.splitlines() if f"event={event}" in line]


class _Call(threading.Thread):
    """``fn()`` in a thread of its own, so that the test can see whether it returns."""

    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn, self.error, self.done = fn, None, threading.Event()
        self.start()

    def run(self) -> None:
        try:
            self.fn()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        self.done.set()


@pytest.mark.timeout(330)
def test_a_restart_does_not_wait_on_a_read_stuck_in_the_dead_mount(mfs):
    """A read of the operator's mount that waits on a dead chunkserver holds its descriptor (the checkpoint
    store's bounded calls leave such reads behind). A process forked from here closes every descriptor before
    it runs its program, and closing one of a FUSE mount waits for mfsmount's answer, which comes only after the
    read's: so nothing forked from here starts before the chunkserver is back, and its restart must not be forked
    from here. The lab starts its daemons from a helper process that holds no descriptor of any mount."""
    probe = mfs.admin_dir / "stuck-read.bin"
    probe.write_bytes(os.urandom(1 << 20))
    fd = os.open(probe, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)   # the read goes to the chunkserver, not the page cache
    mfs.kill_chunkserver(1)
    reader = _Call(lambda: os.pread(fd, 1 << 20, 0))
    time.sleep(1.0)   # the read waits in mfsmount
    forked = _Call(lambda: subprocess.run(["true"], check=True))
    # the hazard: a fork from this process does not get to run its program while the read waits
    assert not forked.done.wait(5.0), "the read did not hold the mount: a process forked from here started"
    restart = _Call(lambda: mfs.start_chunkserver(1))
    assert restart.done.wait(30.0), "the chunkserver's restart waits on the read stuck in this process"
    assert restart.error is None, restart.error
    # with the chunkserver back, the read gets its answer and the fork its close
    # (mfsmount retries a read with growing pauses, so the answer may come a minute or more after the restart)
    assert reader.done.wait(240.0) and forked.done.wait(30.0), (reader.error, forked.error)
    assert forked.error is None, forked.error
    os.close(fd)
    probe.unlink()


@pytest.mark.timeout(120)
def test_the_group_checkpoints_onto_the_moosefs_mount_of_its_hosts(cluster, lab):
    latest = cluster.latest()
    # written by the tasks through their hosts' mounts, read here through the operator's mount
    assert latest is not None and cluster.store.verify(latest.id)
    assert set(cluster.runner.placement.values()) == {h.address for h in lab.hosts}
    # the root namespace sees only the empty mount point: the hosts' mounts are their own
    assert not Path("/mnt/mfs/livevec").exists()
    done = subprocess.run([sys.executable, "-m", "online.cli", "checkpoint", "--dir", str(cluster.store.root),
                           "verify", str(latest.id)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(150)
def test_chunkserver_killed_then_restarted(cluster):
    # mfsmount retries a write to a missing chunkserver for minutes: the store's deadline ends the wait
    report = cluster.outage("chunkserver killed", lambda: cluster.mfs.kill_chunkserver(1),
                            lambda: cluster.mfs.start_chunkserver(1), seen_by=("scheduler",))
    assert any("ETIMEDOUT" in line or "EIO" in line or "ENOSPC" in line for line in report["lines"]), report


@pytest.mark.timeout(150)
def test_mount_lost_on_every_host_then_mounted_again(cluster, lab):
    def lose():
        for host in lab.hosts:
            cluster.mfs.unmount(host.name)

    def back():
        for host in lab.hosts:
            cluster.mfs.mount(host.name)
    report = cluster.outage("mount lost", lose, back, seen_by=("scheduler",))
    assert any("ENOTCONN" in line or "ENOENT" in line for line in report["lines"]), report


@pytest.mark.timeout(150)
def test_master_killed_then_restarted(cluster):
    # kill -9 of the master: every mount's metadata calls hang (mfsmount retries), the store's deadline ends
    # them; restarted from its data directory (-a: metadata rebuilt from the change logs), the mounts and the
    # chunkserver reconnect by themselves
    report = cluster.outage("master killed", cluster.mfs.kill_master, cluster.mfs.start_master,
                            seen_by=("scheduler",))
    assert any("ETIMEDOUT" in line or "EIO" in line or "ENOTCONN" in line for line in report["lines"]), report


@pytest.mark.timeout(150)
def test_mount_read_only_on_every_host_then_writable(cluster, lab):
    def read_only():
        for host in lab.hosts:
            cluster.mfs.set_read_only(host.name)

    def writable():
        for host in lab.hosts:
            cluster.mfs.set_read_only(host.name, False)
    report = cluster.outage("mount read-only", read_only, writable, seen_by=("scheduler",))
    assert any("EROFS" in line for line in report["lines"]), report


@pytest.mark.timeout(150)
def test_full_file_system_then_space_again(cluster):
    size = cluster.latest().bytes
    used = sum(f.stat().st_size for f in cluster.store.root.rglob("*") if f.is_file())
    # a hard quota just above what is there: the next shard does not fit (EDQUOT on the servers' writes)
    report = cluster.outage("file system full", lambda: cluster.mfs.set_quota("checkpoints", used + size // 4),
                            lambda: cluster.mfs.set_quota("checkpoints", None), seen_by=("scheduler", "server"))
    assert any("EDQUOT" in line or "ENOSPC" in line for line in report["lines"]), report


@pytest.mark.timeout(150)
def test_a_restore_reads_only_a_verified_checkpoint(cluster):
    mark = len(cluster.log("server"))
    cluster.runner.kill_task("/livevec/server", 0)
    wait_until(lambda: _grep(cluster.log("server")[mark:], "checkpoint_loaded"), 90, interval=0.25,
               message="the relaunched server to load a checkpoint")
    loaded = int(re.search(r"\bid=(\d+)", _grep(cluster.log("server")[mark:], "checkpoint_loaded")[-1]).group(1))
    done = subprocess.run([sys.executable, "-m", "online.cli", "checkpoint", "--dir", str(cluster.store.root),
                           "verify", str(loaded)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    before = cluster.trained()
    wait_until(lambda: cluster.trained() > before, 60, message="training after the restore")
