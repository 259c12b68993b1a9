"""The local runner starts Marathon groups like Marathon: real processes, real ports, real
HTTP/TCP health checks. The committed group runs here with a stand-in `livevec` program
that records its environment and serves the role's health port, so these tests do not
depend on the real roles (tests/test_deploy_e2e.py runs those)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from online.deployment.containers import ContainerLauncher
from online.deployment.image_build import Engine
from online.deployment.local_runner import LocalRunner
from online.deployment.marathon_group import flatten_group, launch_delay, start_order
from online.deployment.marathon import GROUP_FILE
from online.deployment.topology import default_topology
from tests.cluster_harness import process_alive

REPO = Path(__file__).resolve().parents[1]
GROUP = REPO / "deploy" / "marathon" / GROUP_FILE

STAND_IN = """#!{python}
import json, os, socket, sys, time
sys.path.insert(0, {repo!r})
from ps_bridge.metrics import Registry, serve_http
with open(os.path.join(os.environ["MESOS_SANDBOX"], "env.json"), "w") as f:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ), "pid": os.getpid()}}, f)
role = sys.argv[1] if len(sys.argv) > 1 else ""
if role == "scheduler":
    # like ps-lite with DMLC_USE_KUBERNETES=1: bind all interfaces on the root port
    s = socket.socket()
    s.bind(("0.0.0.0", int(os.environ["DMLC_PS_ROOT_PORT"])))
    s.listen()
elif os.environ.get("LIVEVEC_METRICS_PORT"):   # on its agent's address, where the runner probes it
    serve_http(Registry(), os.environ["HOST"], int(os.environ["LIVEVEC_METRICS_PORT"]))
elif os.environ.get("LIVEVEC_HTTP_PORT"):
    serve_http(Registry(), os.environ["HOST"], int(os.environ["LIVEVEC_HTTP_PORT"]))
time.sleep(600)
"""


@pytest.fixture(scope="module")
def stand_in_bin(tmp_path_factory) -> Path:
    bin_dir = tmp_path_factory.mktemp("bin")
    script = bin_dir / "livevec"
    script.write_text(STAND_IN.format(python=sys.executable, repo=str(REPO)))
    script.chmod(0o755)
    return bin_dir


def _recorded(runner: LocalRunner, app: str, index: int = 0, timeout: float = 20.0) -> dict:
    path = runner.work_dir / "sandboxes" / f"livevec-{app}-{index}" / "env.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            time.sleep(0.1)
    raise AssertionError(f"{app}#{index} never wrote {path}")


def test_committed_group_runs_with_marathon_env(stand_in_bin, tmp_path):
    shared = tmp_path / "mfs"
    runner = LocalRunner.from_file(GROUP, work_dir=tmp_path / "run", bin_dirs=[stand_in_bin],
                                   instances={"server": 3, "worker": 1, "frontend": 1},
                                   volumes={"/mnt/mfs/livevec": shared},
                                   env={"LIVEVEC_KAFKA_BOOTSTRAP": "127.0.0.1:9"}, dependency_timeout=30)
    with runner:
        assert runner.wait_healthy(timeout=30), [(s.app, s.state, s.healthy) for s in runner.status()]
        sched = _recorded(runner, "scheduler")
        servers = [_recorded(runner, "server", i) for i in range(3)]
        worker = _recorded(runner, "worker")
        frontend = _recorded(runner, "frontend")
        assert [s.app for s in runner.status()].count("server") == 3
        assert not any(s.app == "producer-example" for s in runner.status())  # instances 0

        root_port = runner.port("scheduler", "ps")
        assert root_port != 31091  # remapped to a free port: the real one may be taken
        for rec in (sched, *servers, worker, frontend):
            env = rec["env"]
            # Mesos-DNS resolved, fixed port remapped, counts follow the overrides.
            assert env["DMLC_PS_ROOT_URI"] == "127.0.0.1"
            assert env["DMLC_PS_ROOT_PORT"] == str(root_port)
            assert env["DMLC_NUM_SERVER"] == "3" and env["DMLC_NUM_WORKER"] == "1"
            assert env["HOST"] == "127.0.0.1"
            assert env["LIVEVEC_KAFKA_BOOTSTRAP"] == "127.0.0.1:9"
            assert env["LIVEVEC_CHECKPOINT_DIR"] == str(shared / "checkpoints")
            assert env["MESOS_TASK_ID"].startswith(env["MARATHON_APP_ID"].strip("/").replace("/", "_") + ".")
        assert sched["argv"] == ["scheduler"] and sched["env"]["PORT_PS"] == str(root_port)
        ports_seen = set()
        for i, rec in enumerate(servers):
            env = rec["env"]
            assert rec["argv"] == ["server"]
            # What the cmd exports from Marathon's variables.
            assert env["DMLC_NODE_HOST"] == env["HOST"]
            assert env["PORT"] == env["PORT_PS"] == env["PORT0"] == str(runner.port("server", "ps", i))
            assert env["LIVEVEC_METRICS_PORT"] == env["PORT_METRICS"] == env["PORT1"]
            assert env["PORTS"] == f"{env['PORT0']},{env['PORT1']}"
            assert env["MARATHON_APP_ID"] == "/livevec/server"
            assert env["MARATHON_APP_RESOURCE_MEM"] == str(float(runner.app("server")["mem"]))
            assert env["MARATHON_APP_LABEL_LIVEVEC_ROLE"] == "server"
            assert env["DMLC_ROLE"] == "server"
            ports_seen |= {env["PORT0"], env["PORT1"]}
        assert len(ports_seen) == 6  # every task got its own ports
        assert worker["env"]["DMLC_ROLE"] == "worker" and worker["env"]["LIVEVEC_ELASTIC_WORKERS"] == "1"
        # The agent's /dev/shm is a directory of this machine's, for this run: memory, not work_dir's disk.
        memory = Path(worker["env"]["LIVEVEC_HOST_REPLICA"])
        assert memory.is_dir() and memory.is_relative_to(runner.memory_dir) and _on_tmpfs(memory)
        assert runner.memory_dir.parent == Path("/dev/shm")
        assert not any("LIVEVEC_HOST_REPLICA" in rec["env"] for rec in (sched, *servers, frontend))
        assert frontend["env"]["LIVEVEC_HTTP_PORT"] == frontend["env"]["PORT_HTTP"] == frontend["env"]["PORT0"]
        assert frontend["env"]["PORT"] == frontend["env"]["PORT_PS"] == frontend["env"]["PORT1"]
        assert (shared / "checkpoints").parent.is_dir()

        # A server that dies is relaunched after backoffSeconds, with new ports (a new task).
        old = [s for s in runner.status() if s.app == "server" and s.index == 1][0]
        (runner.work_dir / "sandboxes" / "livevec-server-1" / "env.json").unlink()
        runner.kill_task("server", 1, signal.SIGKILL)
        relaunched = _recorded(runner, "server", 1)
        assert relaunched["env"]["MESOS_TASK_ID"] != old.task_id
        assert relaunched["env"]["MESOS_TASK_ID"].endswith("._app.2")
        assert runner.wait_healthy(["server"], timeout=20)
        # The scheduler keeps its fixed port across a relaunch.
        (runner.work_dir / "sandboxes" / "livevec-scheduler-0" / "env.json").unlink()
        runner.kill_task("scheduler", 0, signal.SIGKILL)
        assert _recorded(runner, "scheduler")["env"]["PORT_PS"] == str(root_port)
        pids = [s.pid for s in runner.status() if s.pid]
    assert pids and not any(process_alive(p) for p in pids)
    assert all(s.state == "stopped" for s in runner.status())
    assert not runner.memory_dir.exists()   # with whatever segments killed tasks left in it


def _on_tmpfs(path: Path) -> bool:
    mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines()]
    point, fstype = max(((m, t) for m, t in mounts if path.is_relative_to(m)), key=lambda mt: len(mt[0]))
    return fstype == "tmpfs"


def test_workers_share_a_host_replica_per_host(stand_in_bin, tmp_path):
    """What `livevec up` runs: every worker on this machine names the same segment; placed over several hosts
    (the lab runner's ``task_hosts``), the workers of each host name their own, from their DMLC_NODE_HOST."""
    from online.cluster.host_replica import segment_path

    def segment(rec: dict) -> Path:
        env = rec["env"]
        return segment_path(env["LIVEVEC_HOST_REPLICA"], env["DMLC_PS_ROOT_URI"], int(env["DMLC_PS_ROOT_PORT"]),
                            env["DMLC_NODE_HOST"])

    only_workers = {"scheduler": 0, "server": 0, "worker": 3, "frontend": 0}
    hosts = {0: "127.0.0.2", 1: "127.0.0.2", 2: "127.0.0.3"}   # every 127/8 address is this machine's
    runners = [LocalRunner.from_file(GROUP, work_dir=tmp_path / "one", bin_dirs=[stand_in_bin], instances=only_workers),
               LocalRunner.from_file(GROUP, work_dir=tmp_path / "lab", bin_dirs=[stand_in_bin], instances=only_workers,
                                     task_hosts=lambda app_id, index: hosts[index])]
    for runner in runners:
        with runner:
            assert runner.wait_healthy(timeout=30), [(s.app, s.host, s.healthy) for s in runner.status()]
            recs = [_recorded(runner, "worker", i) for i in range(3)]
            assert [r["env"]["DMLC_NODE_HOST"] for r in recs] == [r["env"]["HOST"] for r in recs]
            segments = [segment(r) for r in recs]
            assert all(_on_tmpfs(p.parent) for p in segments)
            if runner.work_dir.name == "one":
                assert len(set(segments)) == 1
            else:
                assert segments[0] == segments[1] != segments[2]


def test_a_container_task_gets_the_runs_shared_memory_at_dev_shm(tmp_path):
    """In container mode (``livevec deploy run-local --containers``) the worker sees it where Marathon's would."""
    class Offline(Engine):   # no image, no podman: only the command lines are looked at
        def image_exists(self, ref: str) -> bool:
            return True

        def run(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
            return subprocess.CompletedProcess(self.argv(*args), 0, "", "")

    launcher = ContainerLauncher("livevec:test", engine=Offline("podman", ("podman",)))
    runner = LocalRunner.from_file(GROUP, work_dir=tmp_path, launcher=launcher)
    assert runner.app("worker")["env"]["LIVEVEC_HOST_REPLICA"] == "/dev/shm"   # the container path, unrewritten
    launcher.prepare(runner._volume_dirs, tmp_path / "sandboxes")
    try:
        task = SimpleNamespace(app_id="/livevec/worker", index=0, launches=1, sandbox=tmp_path / "sandboxes")
        mount = f"{runner.memory_dir / 'dev_shm'}:/dev/shm:rw"
        assert mount in launcher.run_argv(task, runner.app("worker"), {})
        assert mount not in launcher.run_argv(task, runner.app("server"), {})
    finally:
        runner.stop()
    assert not runner.memory_dir.exists()


def _group(*apps: dict) -> dict:
    return {"id": "/t", "apps": list(apps)}


def test_restarts_with_backoff_and_relaunches_unhealthy_tasks(tmp_path):
    starts = tmp_path / "starts"
    runner = LocalRunner(_group(
        {"id": "crasher", "cmd": f'echo "$MESOS_TASK_ID" >> {starts}; exit 3',
         "portDefinitions": [], "backoffSeconds": 0, "maxLaunchDelaySeconds": 1},
        {"id": "web", "cmd": 'echo ok > health && exec python3 -m http.server "$PORT_HTTP" --bind 127.0.0.1',
         "portDefinitions": [{"port": 0, "name": "http"}],
         "healthChecks": [{"protocol": "MESOS_HTTP", "path": "/health", "portIndex": 0, "gracePeriodSeconds": 30,
                           "intervalSeconds": 1, "timeoutSeconds": 5, "maxConsecutiveFailures": 2}],
         "backoffSeconds": 0, "taskKillGracePeriodSeconds": 1},
    ), work_dir=tmp_path / "run")
    with runner:
        assert runner.wait_healthy(["web"], timeout=20)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(starts.read_text().split()) < 3:
            time.sleep(0.1)
        ids = starts.read_text().split()
        assert len(ids) >= 3 and len(set(ids)) == len(ids)  # each launch is a new task
        crasher = [s for s in runner.status() if s.app == "crasher"][0]
        assert crasher.last_exit_code == 3
        # Break the health endpoint: after 2 failures Marathon kills and relaunches the task.
        first = [s for s in runner.status() if s.app == "web"][0]
        (runner.work_dir / "sandboxes" / "t-web-0" / "health").unlink()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            web = [s for s in runner.status() if s.app == "web"][0]
            if web.launches > first.launches and web.healthy:
                break
            time.sleep(0.1)
        assert web.launches == first.launches + 1 and web.healthy
        assert web.ports["http"] != first.ports["http"] or web.task_id != first.task_id


def test_stop_kills_tasks_that_ignore_sigterm(tmp_path):
    pid_file = tmp_path / "pid"
    runner = LocalRunner(_group(
        {"id": "stubborn", "cmd": f'trap "" TERM; echo $$ > {pid_file}; while true; do sleep 0.2; done',
         "portDefinitions": [], "taskKillGracePeriodSeconds": 1}), work_dir=tmp_path / "run")
    runner.start()
    deadline = time.monotonic() + 10
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    assert process_alive(pid)
    runner.stop()
    assert not process_alive(pid)
    runner.stop()  # idempotent


def test_cli_run_local_stops_cleanly_on_sigint(tmp_path):
    pid_file = tmp_path / "pid"
    group_file = tmp_path / "group.json"
    group_file.write_text(json.dumps(_group(
        {"id": "sleeper", "cmd": f"echo $$ > {pid_file}; exec sleep 60", "portDefinitions": [{"port": 0}]})))
    proc = subprocess.Popen([sys.executable, "-m", "online.cli", "deploy", "run-local", "--group", str(group_file),
                             "--work-dir", str(tmp_path / "run")], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = int(pid_file.read_text())
        assert process_alive(pid)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "sleeper" in out and "stopped" in out
    assert not process_alive(pid)


def test_group_errors_are_caught_before_anything_starts(tmp_path):
    base = json.loads(GROUP.read_text())
    with pytest.raises(ValueError, match="no app of the group"):
        broken = json.loads(GROUP.read_text())
        broken["apps"][1]["env"]["DMLC_PS_ROOT_URI"] = "sched-livevec.marathon.mesos"
        LocalRunner(broken, work_dir=tmp_path)
    with pytest.raises(ValueError, match="rendezvous"):
        broken = json.loads(GROUP.read_text())
        next(a for a in broken["apps"] if a["id"].endswith("/server"))["instances"] = 5
        LocalRunner(broken, work_dir=tmp_path)
    with pytest.raises(KeyError):
        LocalRunner(base, work_dir=tmp_path, instances={"servers": 2})
    with pytest.raises(KeyError):
        LocalRunner(base, work_dir=tmp_path, app_env={"front-end": {"LIVEVEC_HTTP_HOST": "127.0.0.1"}})
    # Overriding the count instead keeps DMLC_NUM_SERVER consistent in every app.
    runner = LocalRunner(base, work_dir=tmp_path, instances={"server": 5})
    for app in ("scheduler", "server", "worker", "frontend"):
        assert runner.app(app)["env"]["DMLC_NUM_SERVER"] == "5"
    # A volume may be mapped through a parent directory; a mapping that matches nothing is an error.
    runner = LocalRunner(base, work_dir=tmp_path, volumes={"/mnt/mfs": tmp_path / "mfs"})
    assert runner.app("server")["env"]["LIVEVEC_CHECKPOINT_DIR"] == str(tmp_path / "mfs" / "livevec" / "checkpoints")
    with pytest.raises(ValueError, match="match no containerPath"):
        LocalRunner(base, work_dir=tmp_path, volumes={"/data": tmp_path})
    # The same from the topology (what `livevec up` uses), with a per-app override.
    runner = LocalRunner.from_topology(default_topology().with_instances(server=3, worker=4), work_dir=tmp_path,
                                       app_env={"worker": {"LIVEVEC_BATCH_WORDS": "512"}})
    assert runner.app("worker")["env"]["DMLC_NUM_WORKER"] == "4"
    assert runner.app("/livevec/frontend")["env"]["DMLC_NUM_SERVER"] == "3"
    assert runner.app("worker")["env"]["LIVEVEC_BATCH_WORDS"] == "512"
    assert "LIVEVEC_BATCH_WORDS" not in runner.app("server")["env"]
    assert runner.app("server")["env"]["LIVEVEC_CHECKPOINT_DIR"] == str(tmp_path / "volumes" / "mnt_mfs_livevec"
                                                                          / "checkpoints")


def test_start_order_and_relative_dependencies():
    apps = flatten_group({"id": "/g", "apps": [
        {"id": "c", "dependencies": ["../b"]}, {"id": "b", "dependencies": ["/g/a"]}, {"id": "a"}],
        "groups": [{"id": "sub", "apps": [{"id": "d", "dependencies": ["/g/c"]}]}]})
    assert start_order(apps) == ["/g/a", "/g/b", "/g/c", "/g/sub/d"]
    with pytest.raises(ValueError, match="cycle"):
        start_order([{"id": "/x", "dependencies": ["/y"]}, {"id": "/y", "dependencies": ["/x"]}])
    with pytest.raises(ValueError, match="does not define"):
        start_order([{"id": "/x", "dependencies": ["/nope"]}])


def test_launch_delay_follows_marathon_backoff():
    app = {"backoffSeconds": 2, "backoffFactor": 1.5, "maxLaunchDelaySeconds": 5}
    assert [launch_delay(app, n) for n in range(5)] == [0.0, 2.0, 3.0, 4.5, 5.0]
    assert launch_delay({}, 1) == 1.0  # Marathon's defaults: 1 s, x1.15, 300 s cap
    assert launch_delay({}, 200) == 300.0
