"""The container image, built (``make image``: podman from a debootstrapped Debian base here)
and run: the committed Marathon group as containers of that image, with host networking.

The image is built by the ``image`` fixture through the same function as ``make image``;
``make test`` builds it first, so here it is the cached build (inputs unchanged: well
under a second). No part of podman is mocked. Then one containerised group (scheduler,
2 servers, 2 workers, 1 front end, the group's own env, ports, volumes and checks) serves
the tests below in order: every role reports ready; the image's HEALTHCHECK passes on a
healthy task and fails on a hung one; it trains from Kafka while a server's container is
killed with SIGKILL, which the runner relaunches, and the batch ledger shows every record
trained exactly once; the front end serves the planted neighbours; every process ran
as uid 10001 and wrote nothing outside /tmp and the volume. The volume is a real MooseFS
(``MachineMooseFS``, what ``livevec deploy run-local --containers`` starts): a master and a
chunkserver, mounted on this machine and bind-mounted into the containers; its chunkserver is
killed while they train, and checkpoints abort and then resume.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from online.checkpoint.store import CheckpointStore
from online.deployment.containers import RUN_AS, SANDBOX
from online.deployment.image_build import DEFAULT_TAG, RUN_FLAGS, build_image, podman
from online.deployment.local_runner import LocalRunner, describe
from online.deployment.marathon import GROUP_FILE
from online.deployment.moosefs_lab import MachineMooseFS, moosefs_support_problem
from online.learner.tokenizers import Tokenizer
from online.stream.producer import ensure_topic
from online.stream.sample_corpus import generate_lines, planted_groups
from tests.cluster_harness import scraped_metric, wait_until
from tests.support.http import get
from tests.test_checkpoint_recovery import ClusterProbe, Producer, _ledger

pytestmark = [pytest.mark.slow, pytest.mark.root]   # podman, as root
REPO = Path(__file__).resolve().parents[1]
VOLUME = "/mnt/mfs/livevec"


@pytest.fixture(scope="module")
def engine():
    return podman()


@pytest.fixture(scope="module")
def image(engine):
    result = build_image(DEFAULT_TAG, engine=engine)
    print(result.summary())
    return result.tag


def _run(engine, image, *args, entrypoint="/bin/sh", timeout=120):
    argv = engine.argv("run", "--rm", *RUN_FLAGS, "--read-only", "--read-only-tmpfs=false", "--tmpfs", "/tmp",
                       "--entrypoint", entrypoint, image, *args)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------------ the image itself
def test_the_image_has_no_compiler_no_pip_cache_and_runs_as_10001(engine, image):
    done = _run(engine, image, "-c",
                "id -u; id -g; for c in gcc cc c++ clang; do command -v $c && echo COMPILER $c; done; "
                "find / -xdev \\( -path '*/.cache/pip' -o -path '*/pip/http*' -o -path '/root/.cache' \\) -print; "
                "ls /var/lib/apt/lists | grep -v '^lock$\\|^partial$\\|^auxfiles$' || true")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split()
    assert lines[:2] == [str(RUN_AS), str(RUN_AS)], done.stdout
    assert lines[2:] == [], f"compiler, pip cache or apt lists in the runtime image: {lines[2:]}"
    config = json.loads(engine.run("image", "inspect", image).stdout)[0]["Config"]
    assert config["User"] == f"{RUN_AS}:{RUN_AS}" and config["Entrypoint"] == ["livevec"]


def test_every_module_and_the_int8_kernel_are_installed(engine, image):
    # the installed copy, not the repository: the list of modules it has, and the compiled kernel
    done = _run(engine, image, "-c", "import online, ps_bridge, pathlib; "
                "from online.search import _int8_scan, int8_prefilter; print(int8_prefilter.SCAN); "
                "[print(p.relative_to(pathlib.Path(m.__file__).parent.parent)) for m in (online, ps_bridge) "
                "for p in pathlib.Path(m.__file__).parent.rglob('*.py')]", entrypoint="python")
    assert done.returncode == 0, done.stderr
    scan, *installed = done.stdout.split()
    assert scan in ("vnni", "avx2", "portable")
    wanted = {str(p.relative_to(REPO)) for pkg in ("online", "ps_bridge") for p in (REPO / pkg).rglob("*.py")
              if "__pycache__" not in p.parts}
    assert wanted - set(installed) == set(), "modules the image lacks"


def test_the_entrypoint_renders_the_committed_deploy_files(engine, image):
    done = _run(engine, image, "deploy", "render", "--target", "marathon", entrypoint="livevec")
    assert done.returncode == 0, done.stderr
    rendered = json.loads(done.stdout)
    for f in (REPO / "deploy" / "marathon").glob("*.json"):
        assert rendered[f.name] == json.loads(f.read_text()), f.name


def test_the_image_s_kernel_cache_leaves_nothing_to_compile_in_a_fresh_container(engine, image):
    # an empty NUMBA_CACHE_DIR (a new tmpfs on /tmp): a worker's warm-up at d = 100 and another d, both kernels,
    # and the front end's, as the roles run them after copying the image's cache in; numba's own count of compiles
    done = _run(engine, image, "-c", "from ps_bridge.structured_logging import configure_logging; configure_logging(); "
                "from online.learner import kernel_cache; seeded = kernel_cache.prepare('test'); "
                "from online.learner.trainer import LearnerConfig, warm_up; "
                "from online.search.model_index import warm_up as search_warm_up; "
                "[warm_up(LearnerConfig(dim=d, kernel=k)) for d in (100, 24) for k in ('hogbatch', 'pairs')]; "
                "search_warm_up(); print(seeded.copied, *kernel_cache.WATCH.totals())", entrypoint="python")
    assert done.returncode == 0, done.stderr
    copied, compiles, seconds = done.stdout.split()
    assert int(copied) > 0 and "event=kernel_cache" in done.stderr
    assert int(compiles) == 0, f"compiled {compiles} kernels in {seconds} s:\n{done.stderr[-3000:]}"


# ------------------------------------------------------------ the group, in containers
@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    """The group's volume on MooseFS, mounted on this machine as on the seed's agents (what ``livevec deploy
    run-local --containers`` starts): the containers bind-mount the FUSE mount."""
    problem = moosefs_support_problem()
    assert problem is None, problem
    with MachineMooseFS(tmp_path_factory.mktemp("mfs"), lab_id=random.randrange(250, 254)) as mfs:
        yield mfs
    assert "mfs#" not in Path("/proc/self/mountinfo").read_text(), "a MooseFS mount was left behind"


@pytest.fixture(scope="module")
def group(image, kafka_bootstrap, storage, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("containers")
    topic = f"containers-{uuid.uuid4().hex[:10]}"
    asyncio.run(ensure_topic(kafka_bootstrap, topic, 4))
    env = {"LIVEVEC_KAFKA_BOOTSTRAP": kafka_bootstrap, "LIVEVEC_KAFKA_TOPICS": topic,
           "LIVEVEC_KAFKA_GROUP": f"g-{topic}", "PS_HEARTBEAT_INTERVAL": "0.5", "PS_HEARTBEAT_TIMEOUT": "3",
           "LIVEVEC_CHECKPOINT_INTERVAL": "2", "LIVEVEC_DIM": "24", "LIVEVEC_MIN_COUNT": "3",
           "LIVEVEC_KAFKA_BATCH_RECORDS": "15", "LIVEVEC_KAFKA_SESSION_TIMEOUT_MS": "6000",
           "LIVEVEC_REQUEST_TIMEOUT": "4", "LIVEVEC_SYNC_INTERVAL": "0.3", "LIVEVEC_CHECKPOINT_IO_TIMEOUT": "4"}
    runner = LocalRunner.from_file(
        REPO / "deploy" / "marathon" / GROUP_FILE, work_dir=tmp / "run", containers=image,
        instances={"server": 2, "worker": 2, "frontend": 1}, env=env,
        app_env={"frontend": {"LIVEVEC_HTTP_HOST": "127.0.0.1", "LIVEVEC_MODEL_SOURCE": "ps"}},
        volumes=storage.volumes(), dependency_timeout=120)
    t0 = time.monotonic()
    try:
        runner.start()
        runner.started_in = time.monotonic() - t0
        runner.topic, runner.mfs, runner.bootstrap = topic, storage.host_dir, kafka_bootstrap
        yield runner
    finally:
        runner.stop()
        leftover = podman().run("ps", "-a", "-q", "--filter", "label=org.livevec.local-runner", check=False)
        assert not [c for c in leftover.stdout.split()
                    if c in {s.container for s in runner.status()}], "containers left after stop()"


def _task(runner, app, index=0):
    return next(s for s in runner.status() if s.app == app and s.index == index)


def test_every_role_starts_in_its_container_and_reports_ready(group, engine):
    assert group.wait_healthy(timeout=180), describe(group.status())
    running = {c.split()[0] for c in engine.run("ps", "--format", "{{.Names}}").stdout.splitlines()}
    for s in group.status():
        assert s.container in running, f"{s.app}#{s.index} is not a container: {s}"
        assert s.up_after_s is not None and s.launches == 1, s
    for app, n in (("server", 2), ("worker", 2)):
        for i in range(n):
            assert get(group.url(app, "metrics", "/ready", i)).json() == {"ready": True}
    assert get(group.url("frontend", "http", "/ready")).json()["ready"] is True
    # the role really runs inside: its host pid is in the container's cgroup/pid namespace
    server = _task(group, "server")
    inside = engine.run("exec", server.container, "cat", "/proc/1/cmdline").stdout.replace("\0", " ")
    assert "livevec server" in inside
    assert os.readlink(f"/proc/{server.pid}/ns/pid") != os.readlink("/proc/self/ns/pid")


def _healthcheck(engine, container: str) -> subprocess.CompletedProcess:
    return engine.run("healthcheck", "run", container, check=False, timeout=60)


def test_the_image_healthcheck_passes_on_a_healthy_task_and_fails_on_an_unhealthy_one(group, engine):
    assert group.wait_healthy(timeout=60)
    for app in ("scheduler", "server", "worker", "frontend"):
        done = _healthcheck(engine, _task(group, app).container)
        assert done.returncode == 0 and "unhealthy" not in done.stdout, (app, done.stdout, done.stderr)
    # A hung front end (SIGSTOP): its /health no longer answers, so the image's check fails.
    frontend = _task(group, "frontend")
    os.kill(frontend.pid, signal.SIGSTOP)
    try:
        done = _healthcheck(engine, frontend.container)
    finally:
        os.kill(frontend.pid, signal.SIGCONT)
    assert done.returncode != 0 and "unhealthy" in done.stdout + done.stderr, (done.stdout, done.stderr)
    assert _healthcheck(engine, frontend.container).returncode == 0


def test_the_group_trains_from_kafka_through_a_server_container_killed_with_sigkill(group):
    """The batch ledger: every produced record trained exactly once although a server's container
    was killed (kill -9 of its process from the host) and relaunched by the runner."""
    assert group.wait_healthy(timeout=60)
    lines = generate_lines(3600, seed=11)
    producer = Producer(group.bootstrap, group.topic, lines, rate=40.0)   # 900 records over ~22 s
    tokens_expected = sum(len(s) for s in Tokenizer("text8").sentences_of(producer.records))
    store = CheckpointStore(group.mfs / "checkpoints")
    probe = ClusterProbe(group.port("scheduler", "ps"), servers=2)
    try:
        producer.start()
        wait_until(lambda: (_ledger(probe.stats()) or {}).get("records", 0) > 60, 90, interval=0.25,
                   message="training to start")
        wait_until(lambda: store.latest_complete(check_data=False), 60, interval=0.25, message="a first checkpoint")
        epochs = [s["epoch"] for s in wait_until(probe.stats, 30, interval=0.25, message="servers answering")]
        victim = _task(group, "server", 1)
        os.kill(victim.pid, signal.SIGKILL)

        def relaunched_and_recovered():
            s = _task(group, "server", 1)
            stats = probe.stats()
            return (s.launches == 2 and s.state == "running" and s.container != victim.container and stats
                    and not any(x.get("recovering") for x in stats)
                    and all(x["epoch"] != e for x, e in zip(stats, epochs)))

        wait_until(relaunched_and_recovered, 120, interval=0.25, message="the server's container to be "
                   "relaunched and the cluster to recover")
        assert _task(group, "server", 1).last_exit_code == 137   # SIGKILL, seen through podman
        producer.join(timeout=120)
        assert producer.error is None and producer.sent == len(producer.records)
        ends = {f"{group.topic}/{p}": len(range(p, len(producer.records), 4)) for p in range(4)}
        wait_until(lambda: (_ledger(probe.stats()) or {}).get("frontier") == ends, 120, interval=0.25,
                   message="every produced record to be trained")
        time.sleep(1.0)
        ledger = _ledger(wait_until(probe.stats, 10, interval=0.25, message="stats"))
        assert ledger["overlaps"] == 0 and ledger["gaps"] == 0, ledger   # 0 trained twice, 0 skipped
        assert ledger["offsets"] == ledger["records"] == len(producer.records), ledger
        assert ledger["tokens"] == tokens_expected, ledger
    finally:
        probe.close()
    assert all(s.launches == 1 for s in group.status() if s.app != "server"), describe(group.status())

    # the planted neighbours, served by the front end's container
    assert group.wait_healthy(["frontend"], timeout=60)
    frontend = group.url("frontend", "http")
    seen = {}

    def neighbours_found():
        found = 0
        for words in planted_groups():
            answer = get(f"{frontend}/v1/similar?word={words[0]}&k=4")
            if answer.status and not answer.ok:
                seen[words[0]] = answer.status
                continue
            seen[words[0]] = [n["word"] for n in answer.json()["neighbours"]]
            found += bool(set(seen[words[0]]) & set(words))
        return found >= 6

    wait_until(neighbours_found, 60, interval=1.0, message=f"the planted neighbours ({seen})")


def test_no_role_compiled_a_kernel_after_training(group):
    """Each role's log since its launch, the relaunched server's too, after the training above (its syncs, merges
    and front-end syncs, at LIVEVEC_DIM=24): the image's cache copied in, and not one ``kernel_compile``."""
    assert group.wait_healthy(timeout=60)
    for s in group.status():
        if s.app in ("worker", "server", "frontend"):
            lines = Path(s.log_path).read_text(errors="replace").splitlines()
            cache = [ln for ln in lines if "event=kernel_cache " in ln]
            assert cache and all("level=info" in ln for ln in cache), (s.app, cache)
            assert [ln for ln in lines if "event=kernel_compile " in ln] == [], s.app


def test_processes_run_as_10001_and_write_nothing_outside_tmp_and_the_volume(group, engine):
    assert group.wait_healthy(timeout=60)
    for s in group.status():
        top = engine.run("top", s.container, "hpid", "huser", "args").stdout.splitlines()[1:]
        assert top, s
        for line in top:
            hpid, _user, args = line.split(None, 2)
            with open(f"/proc/{hpid}/status") as f:
                uids = next(x for x in f if x.startswith("Uid:")).split()[1:]
            assert uids == [str(RUN_AS)] * 4, f"{s.app}: {args} runs as {uids}"
        # the container's own file system is unchanged (read-only), apart from the mount points
        # (and their parents): the group's volumes, the sandbox, /tmp, and podman's /etc/hosts,
        # /etc/resolv.conf, /etc/hostname and /run/.containerenv
        volumes = [v["containerPath"] for v in group.app(s.app)["container"].get("volumes", [])]
        mounts = {str(p) for m in (*volumes, SANDBOX, "/tmp", "/etc/hosts", "/etc/resolv.conf", "/etc/hostname",
                                   "/run/.containerenv") for p in (Path(m), *Path(m).parents)}
        diff = engine.run("diff", s.container).stdout.split("\n")
        changed = [d for d in diff if d.strip() and d.split()[-1] not in mounts]
        assert changed == [], f"{s.app}: {changed}"
        denied = engine.run("exec", s.container, "touch", "/opt/livevec/probe", check=False)
        assert denied.returncode != 0 and "Read-only file system" in denied.stderr
        # and the sandbox (the working directory, as on Mesos) holds nothing the role wrote
        sandbox = group.work_dir / "sandboxes" / f"livevec-{s.app}-{s.index}"
        assert sorted(p.name for p in sandbox.iterdir()) == [], f"{s.app} wrote into its sandbox"
        # the volume each container sees is the machine's MooseFS mount, not a directory of the host's disk
        mountinfo = engine.run("exec", s.container, "cat", "/proc/self/mountinfo").stdout.splitlines()
        for volume in [v for v in volumes if v.startswith("/mnt/mfs/")]:
            line = next((m for m in mountinfo if m.split()[4] == volume), None)
            assert line is not None and " - fuse" in line and "mfs" in line, (volume, line)
    # what the roles wrote to the volume (the checkpoints) is theirs: uid 10001
    written = [p for p in group.mfs.rglob("*")]
    assert any(p.name for p in written if "checkpoints" in p.parts)
    assert {p.stat().st_uid for p in written} == {RUN_AS}


def _scheduler_checkpoints(group, result: str) -> float:
    return scraped_metric(group.url("scheduler", "metrics", "/metrics"), "livevec_checkpoints_total", result=result)


def test_checkpoints_abort_while_the_chunkserver_is_down_and_resume_after(group, storage):
    """A storage fault under the containers: kill -9 of the chunkserver. Checkpoints that cannot be written
    are aborted (and none completes), training goes on, and checkpoints resume once it is back."""
    assert group.wait_healthy(timeout=60)
    producer = Producer(group.bootstrap, group.topic, generate_lines(1600, seed=12), rate=10.0)   # ~40 s
    producer.start()         # checkpoints are taken while the model changes
    store = CheckpointStore(group.mfs / "checkpoints", io_timeout=10.0)
    trained0 = _scheduler_checkpoints(group, "done")
    wait_until(lambda: _scheduler_checkpoints(group, "done") > trained0, 60, interval=0.25,
               message="a checkpoint of the new records")
    before = store.latest_complete(check_data=False)
    failed0, done0 = _scheduler_checkpoints(group, "failed") + _scheduler_checkpoints(group, "aborted"), \
        _scheduler_checkpoints(group, "done")
    storage.fs.kill_chunkserver(1)
    done_during = 0.0
    try:
        wait_until(lambda: _scheduler_checkpoints(group, "failed") + _scheduler_checkpoints(group, "aborted")
                   > failed0, 40, interval=0.25, message="a checkpoint to be aborted while the chunkserver is down")
        done_during = _scheduler_checkpoints(group, "done") - done0
        assert done_during <= 1, f"{done_during} checkpoints completed while the chunkserver was down"
        assert group.wait_healthy(["frontend"], timeout=10)
    finally:
        storage.fs.start_chunkserver(1)
    wait_until(lambda: _scheduler_checkpoints(group, "done") > done0 + done_during
               and (store.latest_complete(check_data=True) or before).id > before.id, 90, interval=0.5,
               message="checkpoints to resume once the chunkserver is back")
    producer.join(timeout=90)
    assert producer.error is None
    scheduler_log = (group.log_dir / "livevec-scheduler-0.log").read_text(errors="replace")
    assert "event=checkpoint_storage_unavailable" in scheduler_log and "event=checkpoint_storage_back" in scheduler_log


TERM_GROUP = {"id": "/t", "apps": [
    {"id": "term", "portDefinitions": [],
     "cmd": "trap 'echo stopped > got_term; exit 0' TERM; echo up > started; while :; do sleep 0.2; done"}]}


def test_a_runner_killed_with_sigkill_stops_its_containers(image, engine, tmp_path):
    """Killing the ``podman run`` client leaves its container running, so a runner killed with SIGKILL used
    to leave its whole cluster behind. Now the kernel sends the client SIGTERM, which it passes on: the
    task gets its graceful stop and the container is removed."""
    group = tmp_path / "group.json"
    group.write_text(json.dumps(TERM_GROUP))
    work = tmp_path / "run"
    runner = subprocess.Popen([sys.executable, "-c", (
        "import threading, time\n"
        "from online.deployment.local_runner import LocalRunner\n"
        f"r = LocalRunner.from_file({str(group)!r}, work_dir={str(work)!r}, containers={image!r})\n"
        "t = threading.Thread(target=r.start)\n"    # a thread that ends: the signal must follow the process
        "t.start(); t.join()\n"
        "time.sleep(600)\n")], cwd=REPO, stdout=open(tmp_path / "runner.log", "wb"), stderr=subprocess.STDOUT)
    sandbox = work / "sandboxes" / "t-term-0"

    def containers() -> list[str]:
        return engine.run("ps", "-a", "--filter", "name=t-term-0-", "--format", "{{.Names}}").stdout.split()
    try:
        wait_until(lambda: (sandbox / "started").exists(), 120, 0.2,
                   message=f"the task's container to start: {(tmp_path / 'runner.log').read_text()[-2000:]}")
        assert len(containers()) == 1
        runner.kill()
        runner.wait(timeout=10)
        t0 = time.monotonic()
        wait_until(lambda: not containers(), 30, 0.2, message="the container to be gone")
        print(f"container gone {time.monotonic() - t0:.2f} s after SIGKILL of the runner")
        assert (sandbox / "got_term").read_text().strip() == "stopped"   # stopped, not killed
    finally:
        if runner.poll() is None:
            runner.kill()
        for name in containers():
            engine.run("rm", "--force", "--time", "0", name, check=False)
