"""Upgrading from the previous release, with both releases' real processes, a real broker and the production group.

The previous release (``PREVIOUS``, 0.1.0) is built from its commit into a venv of its own under
``~/.cache/livevec/`` (its source from ``git archive``, installed with ``pip install --no-deps``; its dependencies
are this venv's, through a ``.pth``), once per commit, with its kernels compiled there. Tasks run it by the
group's own command (``livevec <role>``) with that venv first on their ``PATH``: the local Marathon-like runner
replaces an app's version as Marathon does, by relaunching its tasks with the new definition.

* The previous release trains part of a topic and checkpoints; it stops, and this release starts on the same
  checkpoint directory, restores that checkpoint and trains the rest: every record exactly once (the batch
  ledger's check, ``cluster_harness.assert_trained_exactly_once``).
* A rolling upgrade in the order Marathon deploys the group (``docs/operations.md#compatibility``): the scheduler
  (kill first), then the servers one at a time and the workers beside them (a new worker starts before an old one
  is killed, so both releases train on one agent at once, each with its own host replica segment), then the front
  ends (a new one ready before the old one goes). Meanwhile the front end answers every query, none with a 5xx,
  and at the end every record was trained exactly once.
* A roll back with nothing pinned: one server of this release's cluster, whose workers speak exchange 3 (packed
  deltas, which 0.1.0 does not know), replaced by the previous release. The workers ask the servers' exchange
  again after the rollback that follows and speak exchange 1 to every server; the 0.1.0 server rejects no packed
  delta, and every record is trained exactly once.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import uuid
from pathlib import Path

import pytest

from online import __version__
from online.cluster.ps_commands import EXCHANGE_VERSION, ROWS_BACK
from online.checkpoint.store import CheckpointStore
from online.cli.up import local_cluster
from online.learner.tokenizers import Tokenizer
from online.stream.sample_corpus import generate_lines
from tests.cluster_harness import assert_trained_exactly_once, coordinator_idle, runner_metric, wait_until
from tests.support.http import get
from tests.test_checkpoint_recovery import ClusterProbe, Producer

REPO = Path(__file__).resolve().parents[1]
PREVIOUS = ("0.1.0", "468551e")   # the previous release and its commit
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "livevec"
DIM = 16   # the kernels the session's fixture compiles for this release (tests/conftest.py)

pytestmark = [pytest.mark.slow]


# ----------------------------------------------------------------------------- the previous release

def _build(home: Path, commit: str) -> None:
    """``home``/src from git, ``home``/venv with it installed and its kernels compiled; ``home``/complete last."""
    shutil.rmtree(home, ignore_errors=True)
    (home / "src").mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(home / "src")], input=archive.stdout, check=True)
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip",
                    str(home / "venv")], check=True)
    _link_dependencies(home)
    python = home / "venv" / "bin" / "python"
    installed = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-input", "--quiet",
                                str(home / "src")], capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, f"pip install of {commit} failed:\n{installed.stdout}\n{installed.stderr}"
    warm = ("from online.learner.trainer import LearnerConfig, warm_up\n"
            f"for kernel in ('hogbatch', 'pairs'): warm_up(LearnerConfig(kernel=kernel, dim={DIM}))\n")
    subprocess.run([str(python), "-c", warm], cwd=home, check=True, timeout=900)
    (home / "complete").write_text(commit)


def _link_dependencies(home: Path) -> None:
    """This venv's site-packages after the old venv's own (numpy, numba, aiokafka...); written at every use, since
    the venv running the tests may have moved (a fresh clone)."""
    site = next((home / "venv" / "lib").glob("python*/site-packages"))
    (site / "zz-livevec-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")


@pytest.fixture(scope="session")
def previous_release() -> Path:
    """The ``bin`` directory of the previous release's venv (its ``livevec``), built once per commit."""
    version, commit = PREVIOUS
    found = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    assert found.returncode == 0, f"commit {commit} (livevec {version}) is not in this clone: fetch its history"
    home = CACHE / f"release-{commit}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"release-{commit}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # one build, whichever pytest process comes first
        if (home / "complete").read_text() != commit if (home / "complete").exists() else True:
            _build(home, commit)
        _link_dependencies(home)
    bin_dir = home / "venv" / "bin"
    out = subprocess.run([str(bin_dir / "python"), "-c", "import online; print(online.__version__, online.__file__)"],
                         capture_output=True, text=True, check=True, cwd=home)
    assert out.stdout.split()[0] == version and out.stdout.split()[1].startswith(str(home)), out.stdout
    return bin_dir


def _path(bin_dir: Path | None) -> str:
    """A task's PATH: the previous release's venv first, or this one's (``None``)."""
    first = bin_dir if bin_dir is not None else Path(sys.executable).parent
    return f"{first}{os.pathsep}{os.environ.get('PATH', os.defpath)}"


def _upgrade(runner, app: str) -> None:
    """A new version of ``app`` (as ``PUT /v2/apps``): tasks launched from now on run this release."""
    runner.app(app)["env"]["PATH"] = _path(None)


# ----------------------------------------------------------------------------- the cluster

def _env(release: Path, group: str) -> dict[str, str]:
    return {"PATH": _path(release), "PS_HEARTBEAT_INTERVAL": "0.5", "PS_HEARTBEAT_TIMEOUT": "3",
            "LIVEVEC_CHECKPOINT_INTERVAL": "2", "LIVEVEC_DIM": str(DIM), "LIVEVEC_MIN_COUNT": "3",
            "LIVEVEC_KAFKA_BATCH_RECORDS": "15", "LIVEVEC_KAFKA_SESSION_TIMEOUT_MS": "6000",
            "LIVEVEC_REQUEST_TIMEOUT": "4", "LIVEVEC_KAFKA_GROUP": group, "LIVEVEC_SYNC_MS": "250",
            "LIVEVEC_HOST_REPLICA_ROWS": "20000", "LIVEVEC_LOG_LEVEL": "INFO"}


def _tokens(records: list[str]) -> int:
    return sum(len(s) for s in Tokenizer("text8").sentences_of(records))


def _task(runner, app: str, index: int = 0):
    return next(s for s in runner.status() if s.app == app and s.index == index)


def _release_of(runner, app: str, index: int = 0) -> str:
    """The release a running task runs: the first line of ``livevec --version``, from its own PATH."""
    pid = _task(runner, app, index).pid
    env = dict(line.split("=", 1) for line in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in line)
    # (0.1.0 has no --version: its `online` package says which it is)
    exe = shutil.which("python", path=env["PATH"])
    return subprocess.run([exe, "-c", "import online; print(online.__version__)"], capture_output=True, text=True,
                          check=True, cwd="/").stdout.strip()


def _wait_stats(probe: ClusterProbe, timeout: float = 60):
    return wait_until(lambda: (lambda s: s if s and not any(x.get("recovering") for x in s) else None)(probe.stats()),
                      timeout, interval=0.25, message="every server answering, none recovering")


def _replaced(runner, app: str, index: int, probe: ClusterProbe, *, servers: bool) -> None:
    """SIGTERM one task (Marathon's kill), wait for its relaunch to be healthy and, for a server, for the rollback
    that follows to be over (every server in a new epoch)."""
    epochs = [s["epoch"] for s in _wait_stats(probe)]
    launches = _task(runner, app, index).launches
    assert runner.kill_task(app, index, signal.SIGTERM) is not None, f"{app}#{index} was not running"
    wait_until(lambda: _task(runner, app, index).launches > launches and runner.wait_healthy([app], timeout=0.5),
               120, interval=0.25, message=f"{app}#{index} relaunched and healthy")
    if servers:
        wait_until(lambda: (lambda s: s and not any(x.get("recovering") for x in s)
                            and all(x["epoch"] != e for x, e in zip(s, epochs)))(probe.stats()),
                   90, interval=0.25, message=f"the rollback after {app}#{index}'s replacement")


class Balancer(threading.Thread):
    """What a load balancer in front of the front ends does (Marathon-LB): send each query to a ready front end
    that is not being drained, in turn. Records every answer; a 5xx, or no answer from a front end it chose, is a
    failure, as is a moment with no front end to choose."""

    def __init__(self, runner):
        super().__init__(name="test-balancer", daemon=True)
        self.runner = runner
        self.draining: set[int] = set()   # task pids the balancer no longer sends to (their kill is coming)
        self.codes: dict[int, int] = {}
        self.failures: list[str] = []
        self.stop = threading.Event()
        self._turn = 0

    def _targets(self) -> list[str]:
        return [f"http://{s.host}:{s.ports['http']}" for s in self.runner.status()
                if s.app == "frontend" and s.state == "running" and s.ready and s.healthy is not False
                and s.pid not in self.draining]

    def drain(self, index: int) -> None:
        self.draining.add(_task(self.runner, "frontend", index).pid)
        time.sleep(1.0)   # queries already sent to it finish

    def run(self) -> None:
        while not self.stop.wait(0.1):
            targets = self._targets()
            if not targets:
                self.failures.append(f"{time.strftime('%T')}: no ready front end")
                continue
            self._turn += 1
            base = targets[self._turn % len(targets)]
            for path in ("/v1/stats", "/v1/similar?word=paris&k=5"):
                answer = get(base + path)
                self.codes[answer.status] = self.codes.get(answer.status, 0) + 1
                if answer.status == 0 or answer.status >= 500:
                    self.failures.append(f"{base}{path}: {answer.status} {answer.body[:200]!r} {answer.error or ''}")


def _segments(runner) -> list[str]:
    shm = Path(runner.app("worker")["env"]["LIVEVEC_HOST_REPLICA"])
    return sorted(p.name for p in shm.glob("livevec-*.replica")) if shm.is_dir() else []


# ----------------------------------------------------------------------------- the tests

@pytest.mark.timeout(420)
def test_this_release_restores_the_previous_releases_checkpoint_and_trains_on_exactly_once(
        previous_release, kafka_bootstrap, kafka_topic, tmp_path):
    topic = kafka_topic(partitions=4, prefix="upgrade-restore")
    producer = Producer(kafka_bootstrap, topic, generate_lines(2400, seed=5), rate=200.0)
    half = len(producer.records) // 2
    shared = tmp_path / "shared"
    store = CheckpointStore(shared / "livevec" / "checkpoints")
    env = _env(previous_release, f"g-{uuid.uuid4().hex[:8]}")
    old = local_cluster(tmp_path / "old", kafka_bootstrap, topic, servers=1, workers=1, frontend=False, env=env,
                        volumes={"/mnt/mfs": shared})
    probe = None
    try:
        old.start()
        assert old.wait_healthy(timeout=120), "the previous release's cluster did not become healthy"
        assert _release_of(old, "server") == PREVIOUS[0]
        probe = ClusterProbe(old.port("scheduler", "ps"), servers=1)
        first = Producer(kafka_bootstrap, topic, [], rate=200.0)
        first.records = producer.records[:half]
        first.run()
        assert first.error is None
        wait_until(lambda: ((probe.stats() or [{}])[0].get("ledger") or {}).get("records") == half, 120,
                   interval=0.25, message="the previous release trained the first half")
        done = subprocess.run([str(previous_release / "livevec"), "checkpoint", "--dir", str(store.root), "now",
                               "--timeout", "60"], capture_output=True, text=True, timeout=90)
        assert done.returncode == 0, done.stdout + done.stderr
        probe.close()
        probe = None
    finally:
        if probe is not None:
            probe.close()
        old.stop()
    written = store.latest_complete()   # what this release will restore
    assert written is not None and "release" not in written.manifest, "not written by the previous release"

    env["PATH"] = _path(None)
    new = local_cluster(tmp_path / "new", kafka_bootstrap, topic, servers=1, workers=1, frontend=False, env=env,
                        volumes={"/mnt/mfs": shared})
    try:
        new.start()
        assert new.wait_healthy(timeout=120), "this release's cluster did not become healthy"
        assert _release_of(new, "server") == __version__
        probe = ClusterProbe(new.port("scheduler", "ps"), servers=1)
        rest = Producer(kafka_bootstrap, topic, [], rate=200.0)
        rest.records = producer.records[half:]   # (half is a multiple of the 4 partitions: the round goes on)
        rest.run()
        assert rest.error is None
        assert_trained_exactly_once(probe.stats, topic, len(producer.records), _tokens(producer.records),
                                    idle=lambda: coordinator_idle(new))
        server_log = (tmp_path / "new" / "logs" / "livevec-server-0.log").read_text()
        loaded = [int(m) for m in re.findall(r"event=checkpoint_loaded id=(\d+)", server_log)]
        assert loaded and loaded[0] == written.id, loaded
    finally:
        if probe is not None:
            probe.close()
        new.stop()


@pytest.mark.timeout(600)
def test_a_rolling_upgrade_in_the_groups_order_loses_nothing_trains_nothing_twice_and_answers_throughout(
        previous_release, kafka_bootstrap, kafka_topic, tmp_path):
    topic = kafka_topic(partitions=4, prefix="upgrade-roll")
    # 900 records over about 45 s; the last 100 trickle until the roll is done, so every step meets training
    producer = Producer(kafka_bootstrap, topic, generate_lines(3600, seed=9), rate=20.0, reserve=100)
    runner = local_cluster(tmp_path / "run", kafka_bootstrap, topic, servers=2, workers=2, frontends=1,
                           env=_env(previous_release, f"g-{uuid.uuid4().hex[:8]}"))
    store = CheckpointStore(tmp_path / "run" / "shared" / "livevec" / "checkpoints")
    probe = balancer = None
    steps: list[tuple[str, float]] = []
    t0 = time.monotonic()

    def step(name: str) -> None:
        steps.append((name, round(time.monotonic() - t0, 1)))

    try:
        runner.start()
        assert runner.wait_healthy(timeout=120), "the previous release's group did not become healthy"
        assert {_release_of(runner, app, i) for app, i in [("scheduler", 0), ("server", 0), ("server", 1),
                                                           ("worker", 0), ("worker", 1), ("frontend", 0)]} \
            == {PREVIOUS[0]}
        old_segment = wait_until(lambda: _segments(runner), 30, interval=0.2, message="the workers' segment")
        assert len(old_segment) == 1 and "-layout" not in old_segment[0], old_segment   # 0.1.0's name
        probe = ClusterProbe(runner.port("scheduler", "ps"), servers=2)
        balancer = Balancer(runner)
        balancer.start()
        producer.start()
        wait_until(lambda: ((probe.stats() or [{}])[0].get("ledger") or {}).get("records", 0) > 60, 90,
                   interval=0.25, message="the previous release training")
        wait_until(lambda: store.latest_complete(check_data=False), 60, interval=0.25,
                   message="a checkpoint of the previous release")
        step("0.1.0 trained and checkpointed")

        # 1. the scheduler, kill first (upgradeStrategy {0, 0})
        _upgrade(runner, "scheduler")
        _replaced(runner, "scheduler", 0, probe, servers=False)
        _wait_stats(probe)
        step("scheduler replaced")

        # 2. the workers ({0.75, 0.25}: one new started before an old one goes) beside the servers ({0.5, 0}: one
        # at a time). A new worker first, while both servers are old; then the servers; then the other worker.
        _upgrade(runner, "worker")
        runner.scale("worker", 3)
        wait_until(lambda: runner.wait_healthy(["worker"], timeout=0.5), 90, message="a new worker beside the old")
        assert _release_of(runner, "worker", 2) == __version__ and _release_of(runner, "worker", 0) == PREVIOUS[0]
        # on one agent, each release trains a segment of its own: 0.1.0's name, and layout 3's
        wait_until(lambda: len(_segments(runner)) == 2, 30, interval=0.2, message="a segment of each layout")
        new_segment = next(name for name in _segments(runner) if name not in old_segment)
        assert new_segment.endswith("-layout3.replica"), new_segment
        wait_until(lambda: _worker_metric(runner, 2, "livevec_worker_tokens_total") > 0, 60, interval=0.25,
                   message="the new worker training")
        # the 0.1.0 servers answer no exchange version: it speaks version 1 (float32 CMD_DELTA) to them (asked at its
        # first sync, which may come after its first trained batch)
        assert wait_until(lambda: _worker_metric(runner, 2, "livevec_worker_exchange_version"), 30, interval=0.1,
                          message="the new worker's first sync") == 1
        step("a 0.2.0 worker trains beside the 0.1.0 workers, on its own segment, with exchange 1")
        _replaced(runner, "worker", 0, probe, servers=False)
        step("worker 0 replaced")

        _upgrade(runner, "server")
        for index in (0, 1):
            _replaced(runner, "server", index, probe, servers=True)
            step(f"server {index} replaced")

        _replaced(runner, "worker", 1, probe, servers=False)
        wait_until(lambda: _worker_metric(runner, 1, "livevec_worker_exchange_version") == EXCHANGE_VERSION, 60,
                   interval=0.25, message=f"a worker started beside 0.2.0 servers speaking exchange {EXCHANGE_VERSION}")
        runner.scale("worker", 2)   # the surplus task goes (Marathon: the roll is done)
        # the last 0.1.0 worker of the agent removed its segment as it stopped
        wait_until(lambda: _segments(runner) == [new_segment], 30, interval=0.2, message="the old segment gone")
        step("workers replaced")

        # 3. the front end ({1, 0.5}): a new one ready before the old one goes
        _upgrade(runner, "frontend")
        runner.scale("frontend", 2)
        wait_until(lambda: runner.wait_healthy(["frontend"], timeout=0.5), 120, message="a new front end ready")
        balancer.drain(0)
        _replaced(runner, "frontend", 0, probe, servers=False)
        balancer.drain(1)
        runner.scale("frontend", 1)
        step("front ends replaced")

        for app, indices in [("scheduler", [0]), ("server", [0, 1]), ("worker", [0, 1]), ("frontend", [0])]:
            assert all(_release_of(runner, app, i) == __version__ for i in indices), app
        producer.release.set()
        producer.join(timeout=120)
        assert producer.error is None and producer.sent == len(producer.records)
        assert_trained_exactly_once(probe.stats, topic, len(producer.records), _tokens(producer.records),
                                    idle=lambda: coordinator_idle(runner))
        step("every record trained exactly once")
        time.sleep(1.0)
        balancer.stop.set()
        balancer.join(timeout=10)
        print("steps (s from the group's start):", steps, "answers:", balancer.codes)
        assert not balancer.failures, balancer.failures[:5]
        assert balancer.codes.get(200, 0) > 100, balancer.codes
    finally:
        if balancer is not None:
            balancer.stop.set()
        if probe is not None:
            probe.close()
        runner.stop()


def _worker_metric(runner, index: int, name: str) -> float:
    """A worker task's metric; 0 while it has no metrics port."""
    with contextlib.suppress(OSError, KeyError, StopIteration):
        return runner_metric(runner, "worker", name, index)
    return 0.0


@pytest.mark.timeout(600)
def test_a_server_rolled_back_to_the_previous_release_gets_exchange_1_from_workers_that_spoke_3_and_trains_on(
        previous_release, kafka_bootstrap, kafka_topic, tmp_path):
    """No pin: 0.2.0 workers speaking exchange 3 (packed deltas) meet a server replaced by 0.1.0, which knows no
    packed command. The rollback that follows the replacement reloads them, and a reload asks the servers'
    exchange again: they speak version 1 to every server from then on, and training goes on exactly once."""
    topic = kafka_topic(partitions=4, prefix="upgrade-back")
    producer = Producer(kafka_bootstrap, topic, generate_lines(2400, seed=11), rate=20.0, reserve=100)
    env = _env(previous_release, f"g-{uuid.uuid4().hex[:8]}")
    env["PATH"] = _path(None)
    runner = local_cluster(tmp_path / "run", kafka_bootstrap, topic, servers=2, workers=2, frontend=False, env=env)
    store = CheckpointStore(tmp_path / "run" / "shared" / "livevec" / "checkpoints")
    server_log = tmp_path / "run" / "logs" / "livevec-server-0.log"
    probe = None
    try:
        runner.start()
        assert runner.wait_healthy(timeout=120), "this release's cluster did not become healthy"
        assert {_release_of(runner, app, i) for app, i in [("scheduler", 0), ("server", 0), ("server", 1),
                                                           ("worker", 0), ("worker", 1)]} == {__version__}
        probe = ClusterProbe(runner.port("scheduler", "ps"), servers=2)
        producer.start()
        for index in (0, 1):
            wait_until(lambda: _worker_metric(runner, index, "livevec_worker_exchange_version") == EXCHANGE_VERSION,
                       90, interval=0.25,
                       message=f"worker {index} speaking exchange {EXCHANGE_VERSION} to 0.2.0 servers")
        synced = sum(_worker_metric(runner, i, "livevec_worker_rows_synced_total") for i in (0, 1))
        wait_until(lambda: sum(_worker_metric(runner, i, "livevec_worker_rows_synced_total") for i in (0, 1)) > synced,
                   60, interval=0.25, message="the workers sending packed deltas")
        wait_until(lambda: store.latest_complete(check_data=False), 60, interval=0.25,
                   message="a checkpoint of this release")
        trained = ((probe.stats() or [{}])[0].get("ledger") or {}).get("records", 0)

        # the previous release's image for the servers (no LIVEVEC_DELTA_WIRE pin anywhere); one server relaunched
        runner.app("server")["env"]["PATH"] = _path(previous_release)
        before = server_log.stat().st_size
        _replaced(runner, "server", 0, probe, servers=True)
        assert _release_of(runner, "server", 0) == PREVIOUS[0] and _release_of(runner, "server", 1) == __version__
        for index in (0, 1):
            assert "LIVEVEC_DELTA_WIRE" not in Path(f"/proc/{_task(runner, 'worker', index).pid}/environ").read_text()
            wait_until(lambda: _worker_metric(runner, index, "livevec_worker_exchange_version") == 1, 90,
                       interval=0.25, message=f"worker {index} speaking exchange 1 once a server is 0.1.0")
        # training goes on beside the 0.1.0 server
        wait_until(lambda: ((probe.stats() or [{}])[0].get("ledger") or {}).get("records", 0) > trained + 20, 120,
                   interval=0.25, message="training after the roll back")

        producer.release.set()
        producer.join(timeout=180)
        assert producer.error is None and producer.sent == len(producer.records)
        assert_trained_exactly_once(probe.stats, topic, len(producer.records), _tokens(producer.records),
                                    idle=lambda: coordinator_idle(runner))
        assert all(_worker_metric(runner, i, "livevec_worker_exchange_version") == 1 for i in (0, 1))
        with open(server_log, "rb") as log:
            log.seek(before)
            old_server = log.read().decode(errors="replace")
        rejected = [line for line in old_server.splitlines() if "request_rejected" in line]
        print("0.1.0 server's rejections:", len(rejected), rejected[:3])
        # the packed commands, which 0.1.0 does not know
        assert not [line for line in rejected if (cmd := re.search(r"\bcmd=(\d+)", line)) and
                    int(cmd.group(1)) in ROWS_BACK], rejected[:5]
    finally:
        if probe is not None:
            probe.close()
        runner.stop()
