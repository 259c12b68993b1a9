"""How the local runner launches a task: as a process (the default), or as a container of
the livevec image, as Marathon's Docker containerizer would.

The runner's supervision (ports, checks, backoff, relaunch, stop order) is the same for
both; a launcher only starts a task, signals it and says where its sandbox is. A container
task is ``podman run`` (attached, ``--rm``) of the image with:

- host networking, so the ports the runner assigned are the ports the roles bind;
- the task's Marathon environment (``HOST``, ``PORT*``, ``MARATHON_*``, ``MESOS_*`` and the
  app's ``env``) and nothing of the runner's own; values are passed by name (``-e KEY``),
  so they are not on any command line;
- ``cmd`` through ``/bin/sh -c`` instead of the entrypoint (marathon#2373), in the sandbox,
  which is mounted at ``/mnt/mesos/sandbox`` as Mesos does;
- the app's ``container.volumes`` mounted at their ``containerPath`` (RO stays read-only);
- uid:gid 10001, a read-only root file system and a writable tmpfs on /tmp only, as the
  Kubernetes securityContext (``readOnlyRootFilesystem``, an emptyDir on /tmp);
- the container's output in the task's log file (``--log-driver passthrough``).

The ``podman run`` client lives as long as the container does, so the runner sees a dead
container as an exited process and relaunches it. Signals go through ``podman kill``. A runner
that dies, even by SIGKILL, stops its containers: the client gets SIGTERM from the kernel and
passes it on (``online.deployment.orphans``).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Protocol

from online.deployment.image_build import RUN_FLAGS, Engine, podman
from online.deployment.orphans import spawn

SANDBOX = "/mnt/mesos/sandbox"  # where Mesos mounts a Docker task's sandbox
RUN_AS = 10001                  # the image's user, and the Kubernetes pods' runAsUser/fsGroup
_CLIENT_ENV = ("PATH", "HOME", "LANG", "TMPDIR", "XDG_RUNTIME_DIR", "CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF")


class TaskLauncher(Protocol):
    rewrites_volume_paths: bool

    def prepare(self, volume_dirs: Mapping[str, Path], sandboxes: Path) -> None: ...
    def sandbox_path(self, task) -> str: ...
    def task_env(self, marathon_env: dict[str, str]) -> dict[str, str]: ...
    def start(self, task, spec: Mapping, env: dict[str, str], log: IO[bytes]) -> subprocess.Popen: ...
    def signal(self, task, sig: int) -> None: ...
    def main_pid(self, task) -> int | None: ...
    def cleanup(self, task) -> None: ...
    def close(self) -> None: ...


class ContainerLauncher:
    """Each task as a container of ``image`` (see the module docstring)."""

    rewrites_volume_paths = False  # the container sees each volume at its containerPath

    def __init__(self, image: str, *, engine: Engine | None = None, user: int = RUN_AS,
                 tmp_size: str = "512m", client_env: Mapping[str, str] | None = None):
        self.image = image
        self.engine = engine or podman()
        self.user = user
        self.tmp_size = tmp_size
        self.run_id = uuid.uuid4().hex[:8]
        self._client_env = {k: v for k, v in (client_env or {}).items() if k in _CLIENT_ENV}
        self._client_env.setdefault("PATH", os.defpath + ":/usr/sbin:/sbin")
        self._volume_dirs: dict[str, Path] = {}
        if not self.engine.image_exists(image):
            raise ValueError(f"no container image {image!r}: build it with `make image` "
                             f"(livevec deploy image --tag {image})")

    # -- the TaskLauncher protocol --------------------------------------------------------
    def prepare(self, volume_dirs: Mapping[str, Path], sandboxes: Path) -> None:
        """The task user must be able to write its volumes and sandboxes (as fsGroup does on
        Kubernetes; on Marathon the operator gives the MooseFS directory to uid 10001)."""
        self._volume_dirs = dict(volume_dirs)
        for path in [*self._volume_dirs.values(), sandboxes]:
            path.mkdir(parents=True, exist_ok=True)
            self._give_to_user(path)

    def sandbox_path(self, task) -> str:
        return SANDBOX

    def task_env(self, marathon_env: dict[str, str]) -> dict[str, str]:
        return dict(marathon_env)  # nothing of the runner's own environment

    def container_name(self, task) -> str:
        app = task.app_id.strip("/").replace("/", "-")
        return f"{app}-{task.index}-{self.run_id}-{task.launches}"

    def start(self, task, spec: Mapping, env: dict[str, str], log: IO[bytes]) -> subprocess.Popen:
        self._give_to_user(task.sandbox)
        argv = self.run_argv(task, spec, env)
        task.container = self.container_name(task)
        task.main_pid = None
        # SIGTERM to the client when the runner dies, which it passes to the container (online.deployment.orphans)
        return spawn(argv, signal.SIGTERM, env={**self._client_env, **env}, stdin=subprocess.DEVNULL, stdout=log,
                     stderr=subprocess.STDOUT, start_new_session=True)

    def run_argv(self, task, spec: Mapping, env: Mapping[str, str]) -> list[str]:
        args = ["run", "--rm", "--name", self.container_name(task), *RUN_FLAGS,
                "--user", f"{self.user}:{self.user}", "--read-only", "--read-only-tmpfs=false",
                "--tmpfs", f"/tmp:rw,mode=1777,size={self.tmp_size}", "--log-driver", "passthrough",
                "--label", f"org.livevec.local-runner={self.run_id}",
                "-v", f"{task.sandbox}:{SANDBOX}:rw", "-w", SANDBOX]
        for vol in (spec.get("container") or {}).get("volumes", []):
            cpath = vol.get("containerPath")
            if cpath in self._volume_dirs:
                mode = "ro" if str(vol.get("mode", "RW")).upper() == "RO" else "rw"
                args += ["-v", f"{self._volume_dirs[cpath]}:{cpath}:{mode}"]
        for key in sorted(env):
            args += ["-e", key]
        if "cmd" in spec:
            args += ["--entrypoint", "/bin/sh", self.image, "-c", spec["cmd"]]
        else:  # "args": the image's entrypoint runs them, as on Marathon
            args += [self.image, *spec["args"]]
        return self.engine.argv(*args)

    def signal(self, task, sig: int) -> None:
        name = getattr(task, "container", None)
        if task.proc is None or name is None:
            return
        # The container may not exist yet while `podman run` is still creating it.
        deadline = time.monotonic() + 5.0
        while task.proc.poll() is None:
            done = self.engine.run("kill", "--signal", str(int(sig)), name, check=False, timeout=30)
            if done.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if sig == signal.SIGKILL and task.proc.poll() is None:
            try:
                task.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:  # the client lost its container: end both
                self.engine.run("rm", "--force", "--time", "0", name, check=False, timeout=60)
                task.proc.kill()

    def main_pid(self, task) -> int | None:
        """The host pid of the container's first process (the role, after ``exec``)."""
        if getattr(task, "main_pid", None) is None and getattr(task, "container", None):
            done = self.engine.run("inspect", "--format", "{{.State.Pid}}", task.container, check=False)
            pid = int(done.stdout.strip() or 0) if done.returncode == 0 else 0
            task.main_pid = pid or None
        return task.main_pid

    def cleanup(self, task) -> None:
        task.main_pid = None

    def close(self) -> None:
        """Remove any container of this runner left behind (a client killed from outside)."""
        done = self.engine.run("ps", "-a", "-q", "--filter", f"label=org.livevec.local-runner={self.run_id}",
                               check=False)
        ids = done.stdout.split()
        if ids:
            self.engine.run("rm", "--force", "--time", "0", *ids, check=False, timeout=120)

    # -- helpers ----------------------------------------------------------------------------
    def _give_to_user(self, path: Path) -> None:
        if os.geteuid() != 0:
            return  # rootless: the user namespace maps the task user; nothing to change
        for root, dirs, files in os.walk(path):
            for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                try:
                    os.lchown(name, self.user, self.user)
                except FileNotFoundError:
                    pass


def podman_available() -> bool:
    return shutil.which("podman") is not None
