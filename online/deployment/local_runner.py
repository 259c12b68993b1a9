"""Run a Marathon group on this machine the way Marathon would, so that the deploy files
themselves are what ``livevec up`` and the tests start.

The group is first placed on this host (``local_placement``: ports, volumes, Mesos-DNS and
caller overrides resolved up front); this module supervises the tasks that result. For
every app and instance the runner:
- maps the group's volumes to local directories, the agent's /dev/shm to one of this machine's
  (so the workers, all on one host here, share one host replica, as on one agent);
- assigns ports like Marathon: a fresh port per ``portDefinition`` on every launch, from the
  ports a Mesos agent would offer (``agent_ports``: none the kernel picks for anything else),
  exported as ``PORT0..N``, ``PORT`` (= PORT0), ``PORTS`` and ``PORT_<NAME>``, with
  ``HOST=127.0.0.1`` and the other ``MARATHON_APP_*``/``MESOS_*`` variables;
- runs ``cmd`` through ``/bin/sh -c`` in a per-instance sandbox (``MESOS_SANDBOX``, also
  the working directory) with stdout and stderr appended to ``<work_dir>/logs/<app>-<i>.log``;
- probes the health and readiness checks as Marathon does (``task_checks``) and kills
  unhealthy tasks;
- relaunches tasks that exit, whatever their exit code, after the app's launch delay:
  ``backoffSeconds``, multiplied by ``backoffFactor`` on each further failure, capped at
  ``maxLaunchDelaySeconds``, and reset once a task has stayed up for 60 s (Marathon's
  ``--minimum_viable_task_execution_duration``);
- starts apps in ``dependencies`` order, waiting until the dependencies' tasks are healthy
  and ready, as a Marathon group deployment does, and stops them in reverse order with
  SIGTERM, then SIGKILL after ``taskKillGracePeriodSeconds``.

On one host, constraints (``hostname:UNIQUE``, agent attributes) cannot be honoured and are
ignored; over several (``task_hosts``, ``online.deployment.lab_runner``) the placement honours
them and every task gets its own host's ``$HOST``. ``args`` apps run their argv directly (there is no image entrypoint locally).

With ``containers=IMAGE`` each task runs as a container of that image instead, as Marathon's
Docker containerizer would (``online.deployment.containers``): host networking, the same
ports and Marathon environment, the group's volumes at their container paths, uid 10001
and a read-only root. Only how a task is started and signalled differs; the supervision
above is the same.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from online.deployment.containers import ContainerLauncher, TaskLauncher
from online.deployment.agent_ports import AgentPorts
from online.deployment.local_placement import place_group
from online.deployment.marathon_group import launch_delay, port_definitions, port_env_name
from online.deployment.orphans import hold_run_dir, reclaim_dead_runs, spawn
from online.deployment.task_checks import CheckState, probe
from ps_bridge.structured_logging import log_event

logger = logging.getLogger("livevec.local_runner")

VIABLE_TASK_SECONDS = 60.0  # Marathon's --minimum_viable_task_execution_duration
TICK_SECONDS = 0.1
_INHERITED_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TERM", "TMPDIR", "VIRTUAL_ENV", "JAVA_HOME")
_INHERITED_PREFIXES = ("LC_", "PYTHON", "NUMBA_", "OMP_", "COVERAGE_")


@dataclass
class TaskStatus:
    app: str  # the app's name: the last segment of its id
    app_id: str
    index: int
    task_id: str
    state: str  # waiting | running | backoff | killing | stopped
    pid: int | None
    host: str
    ports: dict[str, int]  # port name (or "port<i>" when unnamed) -> port
    healthy: bool | None  # None: no health check, or not probed yet
    ready: bool | None  # None: no readiness check
    launches: int
    last_exit_code: int | None
    log_path: Path
    container: str | None = None  # the container's name, in container mode
    up_after_s: float | None = None  # launch to first healthy and ready (None: not yet, or no checks)


@dataclass
class _Task:
    app_id: str
    index: int
    sandbox: Path
    log_path: Path
    state: str = "waiting"
    proc: subprocess.Popen | None = None
    task_id: str = ""
    ports: list[int] = field(default_factory=list)
    launches: int = 0
    started_at: float = 0.0
    last_exit_code: int | None = None
    health: CheckState | None = None
    readiness: CheckState | None = None
    kill_deadline: float | None = None
    next_launch_at: float = 0.0
    container: str | None = None
    main_pid: int | None = None
    up_at: float | None = None
    host: str = "127.0.0.1"      # the agent's address: $HOST, where its ports are and where it is probed


class ProcessLauncher:
    """Tasks as processes of this machine: ``cmd`` through ``/bin/sh -c`` in the sandbox, in
    a session of their own (signals go to the whole process group), with the runner's
    ``PATH`` (``bin_dirs`` first) and a few of its variables passed on. They die with the runner,
    even a runner killed with SIGKILL (``online.deployment.orphans``)."""

    rewrites_volume_paths = True  # there is no container path: env values point at the local directory

    def __init__(self, bin_dirs: Iterable[str | Path] | None = None):
        self._bin_dirs = [str(p) for p in (bin_dirs if bin_dirs is not None else [Path(sys.executable).parent])]

    def prepare(self, volume_dirs: Mapping[str, Path], sandboxes: Path) -> None:
        for local in volume_dirs.values():
            local.mkdir(parents=True, exist_ok=True)

    def sandbox_path(self, task: _Task) -> str:
        return str(task.sandbox)

    def task_env(self, marathon_env: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in _INHERITED_ENV or k.startswith(_INHERITED_PREFIXES)}
        env["PATH"] = os.pathsep.join([*self._bin_dirs, env.get("PATH", os.defpath)])
        return {**env, **marathon_env}

    def start(self, task: _Task, spec: Mapping, env: dict[str, str], log) -> subprocess.Popen:
        argv = ["/bin/sh", "-c", spec["cmd"]] if "cmd" in spec else list(spec["args"])
        return spawn(argv, cwd=task.sandbox, env=env, stdin=subprocess.DEVNULL,
                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def signal(self, task: _Task, sig: int) -> None:
        try:
            os.killpg(task.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def main_pid(self, task: _Task) -> int | None:
        return task.proc.pid if task.proc is not None else None

    def cleanup(self, task: _Task) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class _AppState:
    spec: dict
    failures: int = 0
    deadline: float = 0.0
    launched_since_failure_at: float | None = None


class LocalRunner:
    """Start, supervise and stop a Marathon group's tasks on 127.0.0.1.

    ``start()`` returns once every app has been launched (after its dependencies became
    healthy). ``stop()`` is idempotent and is also registered with ``atexit``.
    """

    def __init__(self, group: Mapping, *, work_dir: str | Path,
                 env: Mapping[str, str] | None = None,
                 app_env: Mapping[str, Mapping[str, str]] | None = None,
                 instances: Mapping[str, int] | None = None,
                 volumes: Mapping[str, str | Path] | None = None,
                 host: str = "127.0.0.1",
                 remap_fixed_ports: bool = True,
                 dependency_timeout: float = 120.0,
                 bin_dirs: Iterable[str | Path] | None = None,
                 containers: str | None = None,
                 launcher: TaskLauncher | None = None,
                 task_hosts: Callable[[str, int], str] | None = None):
        # task_hosts(app_id, index) -> agent address, for a group placed over several hosts
        # (online.deployment.lab_runner); their Mesos-DNS names are then left to the hosts' resolvers.
        self.host = host
        self._task_hosts = task_hosts
        self._next_port: dict[str, int] = {}
        self._agent_ports = AgentPorts()   # this machine's ports for the tasks, claimed until stop()
        self.work_dir = Path(work_dir)
        self.log_dir = self.work_dir / "logs"
        self.dependency_timeout = dependency_timeout
        if launcher is None:
            # os.environ is passed on as the podman client's own environment (PATH, storage).
            launcher = ContainerLauncher(containers, client_env=os.environ) if containers \
                else ProcessLauncher(bin_dirs)
        self._launcher = launcher
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._stopped = False
        self._run_lock: int | None = None   # held on this run's /dev/shm directory while it lives
        self.group_id = group.get("id", "/")
        placement = place_group(group, host=None if task_hosts else host, work_dir=self.work_dir, env=env, app_env=app_env,
                                instances=instances, volumes=volumes, remap_fixed_ports=remap_fixed_ports,
                                rewrite_volume_paths=launcher.rewrites_volume_paths,
                                take_port=self._agent_ports.take)
        self._order = placement.order
        self._fixed_ports = placement.fixed_ports
        self._volume_dirs = placement.volume_dirs
        self.memory_dir = placement.memory_dir   # the agent's /dev/shm, here: removed by stop()
        specs = placement.specs
        self._apps = {app_id: _AppState(spec) for app_id, spec in specs.items()}
        self._tasks: dict[str, list[_Task]] = {app_id: [] for app_id in specs}

    # -- construction helpers -------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path, **kwargs) -> LocalRunner:
        return cls(json.loads(Path(path).read_text()), **kwargs)

    @classmethod
    def from_topology(cls, topology, **kwargs) -> LocalRunner:
        from online.deployment.marathon import render_group
        return cls(render_group(topology), **kwargs)

    # -- public API ---------------------------------------------------------------------
    def app(self, name: str) -> dict:
        """The resolved app definition (env rewritten and overridden) by name or id."""
        return self._apps[self._app_id(name)].spec

    def start(self) -> None:
        if self._started:
            raise RuntimeError("LocalRunner.start() called twice")
        self._started = True
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.memory_dir is not None:   # what killed runs left in /dev/shm (online.deployment.orphans)
            reclaim_dead_runs(self.memory_dir.parent, keep=self.memory_dir)
            self._run_lock = hold_run_dir(self.memory_dir)
        self._launcher.prepare(self._volume_dirs, self.work_dir / "sandboxes")
        atexit.register(self.stop)
        self._thread = threading.Thread(target=self._supervise, name="local-runner", daemon=True)
        self._thread.start()
        for app_id in self._order:
            if self._stopping.is_set():
                return
            spec = self._apps[app_id].spec
            if int(spec.get("instances", 1)) == 0:
                continue
            for dep in spec.get("dependencies", []):
                if not self.wait_healthy([dep], timeout=self.dependency_timeout):
                    log_event(logger, "dependency_not_healthy", logging.WARNING, app=app_id, dependency=dep,
                              waited_s=self.dependency_timeout)
            with self._lock:
                for i in range(int(spec.get("instances", 1))):
                    self._add_task(app_id, i)

    def stop(self, timeout: float | None = None) -> None:
        """Stop every task, dependents first: SIGTERM, then SIGKILL after the app's
        ``taskKillGracePeriodSeconds`` (or ``timeout``)."""
        if self._stopped:
            return
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for app_id in reversed(self._order):
            spec = self._apps[app_id].spec
            grace = float(timeout if timeout is not None else spec.get("taskKillGracePeriodSeconds", 3))
            tasks = [t for t in self._tasks[app_id] if t.proc is not None and t.proc.poll() is None]
            for t in tasks:
                self._signal(t, signal.SIGTERM)
            deadline = time.monotonic() + grace
            for t in tasks:
                try:
                    t.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self._signal(t, signal.SIGKILL)
                    t.proc.wait()
            for t in self._tasks[app_id]:
                if t.proc is not None:
                    t.last_exit_code = t.proc.poll()
                    self._launcher.cleanup(t)
                t.state = "stopped"
            log_event(logger, "app_stopped", app=app_id, tasks=len(tasks))
        self._launcher.close()
        if self.memory_dir is not None:   # segments the killed tasks left would hold their memory
            shutil.rmtree(self.memory_dir, ignore_errors=True)
        if self._run_lock is not None:
            os.close(self._run_lock)
            self._run_lock = None
        self._agent_ports.close()
        self._stopped = True
        atexit.unregister(self.stop)

    def status(self) -> list[TaskStatus]:
        with self._lock:
            out = []
            for app_id in self._order:
                names = [d.get("name") or f"port{i}"
                         for i, d in enumerate(port_definitions(self._apps[app_id].spec))]
                for t in self._tasks[app_id]:
                    out.append(TaskStatus(
                        app=app_id.rsplit("/", 1)[-1], app_id=app_id, index=t.index, task_id=t.task_id,
                        state=t.state,
                        pid=self._launcher.main_pid(t) if t.proc is not None and t.state == "running" else None,
                        host=t.host, ports=dict(zip(names, t.ports)),
                        healthy=t.health.ok if t.health else None,
                        ready=t.readiness.ok if t.readiness else None,
                        launches=t.launches, last_exit_code=t.last_exit_code, log_path=t.log_path,
                        container=t.container,
                        up_after_s=None if t.up_at is None else round(t.up_at - t.started_at, 3)))
            return out

    def wait_healthy(self, apps: Iterable[str] | None = None, timeout: float = 60.0) -> bool:
        """Until every task of ``apps`` (default: all) runs, passes its health check and is
        ready: what a Marathon deployment step waits for."""
        ids = [self._app_id(a) for a in apps] if apps is not None else list(self._order)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._stopping.is_set():
            with self._lock:
                if all(self._app_up(i) for i in ids):
                    return True
            time.sleep(0.1)
        return False

    def port(self, app: str, name: str | int = 0, index: int = 0) -> int:
        """The current host port of a task: by port name or index."""
        app_id = self._app_id(app)
        with self._lock:
            task = self._tasks[app_id][index]
            if isinstance(name, int):
                return task.ports[name]
            names = [d.get("name") for d in port_definitions(self._apps[app_id].spec)]
            return task.ports[names.index(name)]

    def url(self, app: str, port_name: str | int = 0, path: str = "", index: int = 0) -> str:
        with self._lock:
            host = self._tasks[self._app_id(app)][index].host
        return f"http://{host}:{self.port(app, port_name, index)}{path}"

    def scale(self, app: str, instances: int) -> None:
        """Like ``PUT /v2/apps/<id> {"instances": n}``: launch more, or kill the youngest.
        The env (and so DMLC_NUM_*) is unchanged, as on Marathon."""
        app_id = self._app_id(app)
        with self._lock:
            tasks = self._tasks[app_id]
            while len(tasks) < instances:
                self._add_task(app_id, len(tasks))
            surplus = tasks[instances:]
            del tasks[instances:]
            self._apps[app_id].spec["instances"] = instances
        for t in sorted(surplus, key=lambda t: t.started_at, reverse=True):
            self._kill_now(t, float(self._apps[app_id].spec.get("taskKillGracePeriodSeconds", 3)))

    def kill_task(self, app: str, index: int = 0, sig: int = signal.SIGKILL) -> int | None:
        """Send ``sig`` to one task (it will be relaunched, as on Marathon). Returns the pid
        (in container mode: the host pid of the container's first process)."""
        with self._lock:
            task = self._tasks[self._app_id(app)][index]
            if task.proc is None or task.proc.poll() is not None:
                return None
            pid = self._launcher.main_pid(task)
            self._signal(task, sig)
            return pid

    def __enter__(self) -> LocalRunner:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- internals ----------------------------------------------------------------------
    def _app_id(self, name: str) -> str:
        if name in self._apps:
            return name
        matches = [a for a in self._apps if a.rsplit("/", 1)[-1] == name]
        if len(matches) != 1:
            raise KeyError(f"no single app named {name!r} (have {sorted(self._apps)})")
        return matches[0]

    def _app_up(self, app_id: str) -> bool:
        spec = self._apps[app_id].spec
        tasks = self._tasks[app_id]
        if len(tasks) < int(spec.get("instances", 1)):
            return False
        for t in tasks:
            if t.state != "running":
                return False
            if t.health is not None and not t.health.ok:
                return False
            if t.readiness is not None and not t.readiness.ok:
                return False
        return True

    def _add_task(self, app_id: str, index: int) -> None:
        """Registered before it is launched: a Ctrl-C that lands in between must not leave a process that
        ``stop()`` does not know."""
        name = app_id.strip("/").replace("/", "-")
        task = _Task(app_id=app_id, index=index, sandbox=self.work_dir / "sandboxes" / f"{name}-{index}",
                     log_path=self.log_dir / f"{name}-{index}.log",
                     host=self._task_hosts(app_id, index) if self._task_hosts else self.host)
        task.sandbox.mkdir(parents=True, exist_ok=True)
        task.next_launch_at = self._apps[app_id].deadline
        task.state = "backoff" if task.next_launch_at > time.monotonic() else "waiting"
        self._tasks[app_id].append(task)
        if task.state == "waiting":
            self._launch(task)

    def _dynamic_port(self, host: str) -> int:
        """A port for a dynamic portDefinition. Another host's ports cannot be tried from here; its
        namespace is new and holds only this group's tasks, so ports are handed out in turn."""
        if self._task_hosts is None:
            return self._agent_ports.take()
        port = self._next_port.get(host, 20000) + 1
        self._next_port[host] = port if port < 32000 else 20000
        return port

    def _task_env(self, task: _Task, spec: dict) -> dict[str, str]:
        return self._launcher.task_env(self._marathon_env(task, spec))

    def _marathon_env(self, task: _Task, spec: dict) -> dict[str, str]:
        """What Marathon and Mesos give the task: its ports, ids, resources and the app's env."""
        env: dict[str, str] = {}
        defs = port_definitions(spec)
        env.update({
            "HOST": task.host,
            "PORTS": ",".join(str(p) for p in task.ports),
            "MESOS_TASK_ID": task.task_id,
            "MESOS_SANDBOX": self._launcher.sandbox_path(task),
            "MARATHON_APP_ID": task.app_id,
            "MARATHON_APP_VERSION": spec.get("version", "1970-01-01T00:00:00.000Z"),
            "MARATHON_APP_RESOURCE_CPUS": str(float(spec.get("cpus", 1))),
            "MARATHON_APP_RESOURCE_MEM": str(float(spec.get("mem", 128))),
            "MARATHON_APP_RESOURCE_DISK": str(float(spec.get("disk", 0))),
            "MARATHON_APP_RESOURCE_GPUS": str(int(spec.get("gpus", 0))),
            "MARATHON_APP_LABELS": " ".join(spec.get("labels", {})),
        })
        image = ((spec.get("container") or {}).get("docker") or {}).get("image")
        if image:
            env["MARATHON_APP_DOCKER_IMAGE"] = image
        for key, value in spec.get("labels", {}).items():
            env["MARATHON_APP_LABEL_" + re.sub(r"[^A-Z0-9_]", "_", key.upper())] = value
        for i, (d, port) in enumerate(zip(defs, task.ports)):
            env[f"PORT{i}"] = str(port)
            if d.get("name"):
                env[port_env_name(d["name"])] = str(port)
        if task.ports:
            env["PORT"] = str(task.ports[0])
        for key, value in spec.get("env", {}).items():
            if isinstance(value, dict):  # {"secret": ...}: DC/OS Enterprise only
                raise ValueError(f"{task.app_id}: env {key} refers to a secret; override it with env=")
            env[key] = value
        return env

    def _launch(self, task: _Task) -> None:
        app = self._apps[task.app_id]
        spec = app.spec
        fixed = self._fixed_ports[task.app_id]
        previous = [p for p, f in zip(task.ports, fixed) if f is None]
        task.ports = [p if p is not None else self._dynamic_port(task.host) for p in fixed]
        for port in previous:   # the last launch's: the new ones were taken first, so they differ
            self._agent_ports.release(port)
        task.launches += 1
        task.task_id = f"{task.app_id.strip('/').replace('/', '_')}.instance-{uuid.uuid4()}._app.{task.launches}"
        env = self._task_env(task, spec)
        with open(task.log_path, "ab") as log:
            log.write(f"--- launch {task.launches} task={task.task_id} ports={task.ports} "
                      f"at={time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode())
            log.flush()
            task.proc = self._launcher.start(task, spec, env, log)
        task.started_at = time.monotonic()
        task.up_at = None
        task.state = "running"
        task.kill_deadline = None
        now = time.monotonic()
        hcs = spec.get("healthChecks") or []
        task.health = CheckState(hcs[0], "health", next_at=now) if hcs else None
        rcs = spec.get("readinessChecks") or []
        task.readiness = CheckState(rcs[0], "readiness", next_at=now) if rcs else None
        if app.launched_since_failure_at is None:
            app.launched_since_failure_at = now
        log_event(logger, "task_launched", app=task.app_id, index=task.index, task=task.task_id,
                  pid=task.proc.pid, ports=",".join(map(str, task.ports)), launch=task.launches)

    def _signal(self, task: _Task, sig: int) -> None:
        self._launcher.signal(task, sig)

    def _kill_now(self, task: _Task, grace: float) -> None:
        if task.proc is None or task.proc.poll() is not None:
            return
        self._signal(task, signal.SIGTERM)
        try:
            task.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self._signal(task, signal.SIGKILL)
            task.proc.wait()
        task.state = "stopped"

    def _supervise(self) -> None:
        while not self._stopping.wait(TICK_SECONDS):
            try:
                with self._lock:
                    self._tick(time.monotonic())
            except Exception:  # the supervisor must outlive any one bad task
                logger.exception("local_runner_tick_failed")

    def _tick(self, now: float) -> None:
        for app_id, tasks in self._tasks.items():
            app = self._apps[app_id]
            spec = app.spec
            if app.failures and app.launched_since_failure_at is not None and any(
                    t.state == "running" and t.started_at >= app.launched_since_failure_at
                    and now - t.started_at >= VIABLE_TASK_SECONDS for t in tasks):
                app.failures, app.deadline = 0, 0.0
            for task in tasks:
                if task.state in ("running", "killing"):
                    code = task.proc.poll()
                    if code is not None:
                        self._on_exit(app, task, code, now)
                    elif task.state == "killing" and task.kill_deadline is not None and now >= task.kill_deadline:
                        self._signal(task, signal.SIGKILL)
                    elif task.state == "running":
                        self._maybe_probe(task, spec, now)
                if task.state == "backoff" and now >= max(task.next_launch_at, app.deadline):
                    self._launch(task)

    def _on_exit(self, app: _AppState, task: _Task, code: int, now: float) -> None:
        task.last_exit_code = code
        self._launcher.cleanup(task)
        app.failures += 1
        delay = launch_delay(app.spec, app.failures)
        app.deadline = now + delay
        app.launched_since_failure_at = None
        task.next_launch_at = app.deadline
        task.state = "backoff"
        log_event(logger, "task_exited", logging.WARNING, app=task.app_id, index=task.index, task=task.task_id,
                  exit_code=code, relaunch_in_s=round(delay, 2), log=str(task.log_path))

    def _maybe_probe(self, task: _Task, spec: dict, now: float) -> None:
        for check in (task.health, task.readiness):
            if check is None or not check.due(now):
                continue
            check.in_flight = True
            threading.Thread(target=self._probe, args=(task, task.launches, check, spec),
                             daemon=True, name=f"probe-{task.app_id}-{task.index}").start()

    def _probe(self, task: _Task, launch: int, check: CheckState, spec: dict) -> None:
        names = [d.get("name") for d in port_definitions(spec)]
        ok = probe(check.spec, host=task.host, ports=task.ports, port_names=names,
                   command_env=lambda: self._task_env(task, spec), cwd=task.sandbox, timeout=check.timeout)
        now = time.monotonic()
        with self._lock:
            check.in_flight = False
            if task.launches != launch or task.state != "running":
                return
            killed = check.record(ok, now, task.started_at)
            if task.up_at is None and all(c is None or c.ok for c in (task.health, task.readiness)):
                task.up_at = now
            if killed:
                log_event(logger, "task_unhealthy_killed", logging.WARNING, app=task.app_id, index=task.index,
                          task=task.task_id, failures=check.consecutive_failures)
                task.state = "killing"
                task.kill_deadline = now + float(spec.get("taskKillGracePeriodSeconds", 3))
                self._signal(task, signal.SIGTERM)


def describe(statuses: Iterable[TaskStatus]) -> str:
    """A compact table for people: one line per task."""
    lines = []
    for s in statuses:
        health = {True: "healthy", False: "unhealthy", None: "-"}[s.healthy]
        ports = " ".join(f"{k}={v}" for k, v in s.ports.items()) or "-"
        lines.append(f"{s.app:<18} #{s.index:<2} {s.state:<8} {health:<9} pid={s.pid or '-':<7} "
                     f"launches={s.launches:<3} {ports}  log={s.log_path}")
    return "\n".join(lines)

