"""The seed's shared file system in the lab: a MooseFS master, chunkservers, and a mount on every host.

Why: the Marathon group keeps its checkpoints (and the corpora it reads) under a ``hostPath``
volume, ``/mnt/mfs/livevec``, which the seed's agents all mount from one MooseFS. A local
directory shared by every test process is the one thing that never fails the ways a network
file system does (a chunkserver or master gone, a mount lost or read-only, a quota or disk
full); this module runs the real one, from Debian's ``moosefs-*`` packages, so those faults can
be caused and the cluster's answer to them tested.

How, on one machine (``online.deployment.netns_lab`` gives the hosts):

* the **master** listens on the lab's bridge address, in the root namespace next to Kafka (a
  chunkserver refuses a loopback master);
* each **chunkserver** runs in its host's network namespace on that host's address, with a data
  directory of its own under the work directory (one per host unless told otherwise);
* each host gets a **mount namespace** of its own (kept in a file, as ``ip netns`` keeps network
  namespaces), where ``mfsmount`` - itself in the host's network namespace, so a partition cuts
  it off - mounts the file system at the parent of the group's hostPath (``/mnt/mfs``). The lab
  tells ``NetnsLab.exec_prefix`` to enter it, so every task of the host sees its host's mount at
  the path the group names; the root namespace sees an empty directory there. The mounts are
  shared with the tasks (a task started before a remount sees the remount, and an unmount);
* an **operator mount** in the root namespace (``admin_path``, under the work directory) is how
  ``livevec up`` and the tests look at the file system (``livevec checkpoint verify --dir``).

Every daemon runs in the foreground, started by a helper process (``online.deployment.spawner``)
that the lab starts before it mounts anything: a fork of this process can hang on a read of a
mount stuck in one of its threads, the faults' reads among them, and the restart that would end
the fault is a fork. Every other command the lab runs goes through the helper too. The daemons are
stopped, killed and restarted by their process ids; the ids are kept in
``/run/livevec-moosefs/<lab>/`` so that a run that was killed has them ended by the next run of
the same lab. ``close()`` unmounts every mount, ends every daemon and removes the namespaces'
files, also after a failed start.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from online.deployment.netns_lab import NetnsLab
from online.deployment.spawner import SpawnedProcess, Spawner

PACKAGES = ("moosefs-master", "moosefs-chunkserver", "moosefs-client")
EMPTY_METADATA = Path("/var/lib/mfs/metadata.mfs.empty")
STATE_ROOT = Path("/run/livevec-moosefs")
MOUNT_POINT = "/mnt/mfs"      # where every agent mounts the cluster's MooseFS (the group's hostPath is under it)


class MooseFSUnavailable(RuntimeError):
    """MooseFS cannot run here (packages or /dev/fuse missing); the message says what to install."""


def moosefs_support_problem() -> str | None:
    """Why the lab's MooseFS cannot run on this machine, or None."""
    missing = [exe for exe in ("mfsmaster", "mfschunkserver", "mfsmount", "mfssetquota", "mfsdelquota")
               if shutil.which(exe) is None]
    if missing or not EMPTY_METADATA.is_file():
        return (f"MooseFS is not installed ({', '.join(missing) or EMPTY_METADATA} missing): install Debian's "
                f"{' '.join(PACKAGES)} (make moosefs)")
    if not Path("/dev/fuse").exists():
        return "/dev/fuse is missing: mfsmount needs FUSE (load the fuse module, or give the container /dev/fuse)"
    for exe in ("nsenter", "unshare", "mount", "umount"):
        if shutil.which(exe) is None:
            return f"the lab's MooseFS mounts need util-linux's `{exe}`"
    if os.geteuid() != 0:
        return "the lab's MooseFS needs root (FUSE mounts in mount namespaces)"
    return None


def _end(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``: for this lab's own daemons, by id."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:   # not our child (a killed run's): poll for it to go
                done = 0
                if not Path(f"/proc/{pid}").exists():
                    return
            if done == pid:
                return
            time.sleep(0.05)


@dataclass
class _Daemon:
    name: str                   # master, cs1, mount-lv0h1, admin
    argv: list[str]
    log: Path
    proc: SpawnedProcess | None = None


class MooseFSLab:
    """MooseFS over ``lab``'s hosts. ``chunkservers``: how many (the first hosts; default one per host).
    ``subdir``: created on the file system at start (the group's hostPath below ``mount_point``)."""

    def __init__(self, lab: NetnsLab, work_dir: str | os.PathLike, *, chunkservers: int | None = None,
                 mount_point: str = MOUNT_POINT, subdir: str = "livevec"):
        n = len(lab.hosts) if chunkservers is None else chunkservers
        if not 1 <= n <= len(lab.hosts):
            raise ValueError(f"chunkservers must be 1 - {len(lab.hosts)} (one per host at most), got {n}")
        self.lab = lab
        self.work = Path(work_dir).resolve() / "moosefs"
        self.mount_point = Path(mount_point)
        self.subdir = subdir
        self.master_address = lab.bridge_address
        self.chunkserver_hosts = lab.hosts[:n]
        self.admin_path = self.work / "admin-mount"
        self.state_dir = STATE_ROOT / lab.prefix
        self._daemons: dict[str, _Daemon] = {}
        self._made_mount_point = False
        self._started = False
        self._spawner: Spawner | None = None

    # ------------------------------------------------------------------ life cycle
    def start(self) -> "MooseFSLab":
        problem = moosefs_support_problem()
        if problem:
            raise MooseFSUnavailable(problem)
        self._spawner = Spawner()   # before any mount: see the module's docstring
        try:
            self._end_leftovers()
            self._start()
        except BaseException:
            self.close()
            raise
        self._started = True
        return self

    def _start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # The namespaces' files live on a private mount of their own, as ``ip netns`` keeps /run/netns.
        self._run(["mount", "--bind", str(self.state_dir), str(self.state_dir)])
        self._run(["mount", "--make-private", str(self.state_dir)])
        if not self.mount_point.exists():
            self.mount_point.mkdir(parents=True)
            self._made_mount_point = True
        self._start_master(first=True)
        for i, host in enumerate(self.chunkserver_hosts, 1):
            self._configure_chunkserver(i, host)
            self.start_chunkserver(i)
        self.admin_path.mkdir(parents=True, exist_ok=True)
        self._mount("admin", self.admin_path, netns=None, mountns=None)
        self._wait(lambda: os.statvfs(self.admin_path).f_blocks > 0, 30, "a chunkserver to register with the master")
        (self.admin_path / self.subdir).mkdir(exist_ok=True)
        for host in self.lab.hosts:
            nsfile = self.state_dir / host.name
            nsfile.touch()
            self._run(["unshare", f"--mount={nsfile}", "--propagation", "private", "true"])
            # shared inside: what is mounted here later reaches the tasks' own namespaces (ip netns exec
            # makes each a slave of this one)
            self._run(["nsenter", f"--mount={nsfile}", "mount", "--make-rshared", "/"])
            self.lab.mount_namespaces[host.name] = nsfile
            self.mount(host.name)
        self.lab.shared_mounts.append(self.mount_point)

    def close(self) -> None:
        for host in self.lab.hosts:
            nsfile = self.lab.mount_namespaces.pop(host.name, None)
            self._stop(f"mount-{host.name}")
            if nsfile is not None:
                self._run(["nsenter", f"--mount={nsfile}", "umount", "-l", str(self.mount_point)], check=False)
        if self.mount_point in self.lab.shared_mounts:
            self.lab.shared_mounts.remove(self.mount_point)
        self._stop("admin")
        self._run(["umount", "-l", str(self.admin_path)], check=False)
        for name in [n for n in self._daemons if n.startswith("cs")]:
            self._stop(name)
        self._stop("master")
        for nsfile in self.state_dir.glob("*") if self.state_dir.is_dir() else []:
            if nsfile.suffix != ".pid":
                self._run(["umount", str(nsfile)], check=False)
                nsfile.unlink(missing_ok=True)
        self._run(["umount", str(self.state_dir)], check=False)
        shutil.rmtree(self.state_dir, ignore_errors=True)
        if self._made_mount_point:
            try:
                self.mount_point.rmdir()
            except OSError:
                pass
            self._made_mount_point = False
        self._started = False
        if self._spawner is not None:
            self._spawner.close()
            self._spawner = None

    def __enter__(self) -> "MooseFSLab":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ what the cluster is given
    @property
    def host_path(self) -> Path:
        """The directory the group's hostPath names, as every host sees it (its own mount)."""
        return self.mount_point / self.subdir

    @property
    def admin_dir(self) -> Path:
        """The same directory through the operator's mount in the root namespace."""
        return self.admin_path / self.subdir

    def volumes(self) -> dict[str, Path]:
        """The runner's ``volumes``: the group's volumes under the mount point stay at their paths."""
        return {str(self.mount_point): self.mount_point}

    # ------------------------------------------------------------------ daemons
    def _run(self, argv: list[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        done = self._spawner.run(argv, timeout) if self._spawner is not None else \
            subprocess.run(argv, capture_output=True, text=True, timeout=timeout)   # closed: nothing mounted
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
        return done

    def _spawn(self, name: str, argv: list[str], log: Path) -> SpawnedProcess:
        daemon = self._daemons.get(name) or _Daemon(name, argv, log)
        daemon.argv = argv
        daemon.proc = self._spawner.spawn(argv, log)
        self._daemons[name] = daemon
        (self.state_dir / f"{name}.pid").write_text(str(daemon.proc.pid))
        return daemon.proc

    def _stop(self, name: str, sig: int | None = None) -> None:
        daemon = self._daemons.get(name)
        if daemon is None or daemon.proc is None:
            return
        daemon.proc.send_signal(signal.SIGTERM if sig is None else sig)
        try:
            daemon.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.proc.kill()
            daemon.proc.wait(timeout=5)
        daemon.proc = None
        (self.state_dir / f"{name}.pid").unlink(missing_ok=True)

    def running(self, name: str) -> bool:
        """Whether this lab's daemon ``name`` (``master``, ``cs1``, ``mount-lv0h1``, ``admin``) is running."""
        daemon = self._daemons.get(name)
        return daemon is not None and daemon.proc is not None and daemon.proc.poll() is None

    def _end_leftovers(self) -> None:
        """The daemons and namespaces a killed run of this lab left (by the ids it recorded)."""
        if not self.state_dir.is_dir():
            return
        for pid_file in self.state_dir.glob("*.pid"):
            try:
                pid = int(pid_file.read_text())
                if "mfs" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                    _end(pid)
            except (OSError, ValueError):
                pass
        for host in self.lab.hosts:
            nsfile = self.state_dir / host.name
            if nsfile.exists():
                self._run(["nsenter", f"--mount={nsfile}", "umount", "-l", str(self.mount_point)], check=False)
                self._run(["umount", str(nsfile)], check=False)
        self._run(["umount", "-l", str(self.admin_path)], check=False)
        self._run(["umount", str(self.state_dir)], check=False)
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def _start_master(self, first: bool = False) -> None:
        d = self.work / "master"
        d.mkdir(parents=True, exist_ok=True)
        cfg = d / "mfsmaster.cfg"
        if first:
            cfg.write_text(f"WORKING_USER = root\nWORKING_GROUP = root\nDATA_PATH = {d}\n"
                           f"EXPORTS_FILENAME = {d}/mfsexports.cfg\nMATOCS_LISTEN_HOST = {self.master_address}\n"
                           f"MATOCL_LISTEN_HOST = {self.master_address}\nMATOML_LISTEN_HOST = {self.master_address}\n")
            (d / "mfsexports.cfg").write_text("* / rw,alldirs,admin,maproot=0:0\n")
            if not any(d.glob("metadata.mfs*")):
                shutil.copy(EMPTY_METADATA, d / "metadata.mfs")
        # -a: after a kill the metadata is rebuilt from the change logs, as an operator restarts it
        self._spawn("master", ["mfsmaster", "-f", "-a", "-c", str(cfg), "start"], d / "master.log")
        self._wait(lambda: self._listening(9421), 30, "the MooseFS master to listen")

    def _listening(self, port: int) -> bool:
        import socket
        try:
            with socket.create_connection((self.master_address, port), timeout=0.5):
                return True
        except OSError:
            return False

    def kill_master(self) -> None:
        """kill -9 of the master (its metadata stays on disk: ``start_master`` brings it back)."""
        self._stop("master", signal.SIGKILL)

    def start_master(self) -> None:
        self._start_master()

    def _configure_chunkserver(self, i: int, host) -> None:
        d = self.work / f"chunkserver-{i}"
        (d / "data").mkdir(parents=True, exist_ok=True)
        (d / "mfshdd.cfg").write_text(f"{d / 'data'}\n")
        (d / "mfschunkserver.cfg").write_text(
            f"WORKING_USER = root\nWORKING_GROUP = root\nDATA_PATH = {d}\nMASTER_HOST = {self.master_address}\n"
            f"CSSERV_LISTEN_HOST = {host.address}\nHDD_CONF_FILENAME = {d / 'mfshdd.cfg'}\n")

    def start_chunkserver(self, i: int = 1) -> None:
        """Chunkserver ``i`` (1-based) on its host, in the host's network namespace."""
        host = self.chunkserver_hosts[i - 1]
        d = self.work / f"chunkserver-{i}"
        self._spawn(f"cs{i}", [*self.lab.exec_prefix(host.name), "mfschunkserver", "-f", "-c",
                               str(d / "mfschunkserver.cfg"), "start"], d / "chunkserver.log")

    def kill_chunkserver(self, i: int = 1) -> None:
        self._stop(f"cs{i}", signal.SIGKILL)

    # ------------------------------------------------------------------ mounts
    def _mount(self, name: str, path: Path, *, netns: str | None, mountns: Path | None) -> None:
        prefix = ["nsenter"] if netns or mountns else []
        if mountns:
            prefix.append(f"--mount={mountns}")
        if netns:
            prefix.append(f"--net=/run/netns/{netns}")
        log = self.work / f"{name}.log"
        proc = self._spawn(name, [*prefix, "mfsmount", "-f", str(path), "-H", self.master_address], log)
        check = ["nsenter", f"--mount={mountns}"] if mountns else []

        def mounted() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"mfsmount of {path} ({name}) exited: {log.read_text(errors='replace')[-500:]}")
            return self._run([*check, "mountpoint", "-q", str(path)], check=False).returncode == 0
        self._wait(mounted, 30, f"mfsmount of {path} ({name})")

    def mount(self, host: str) -> None:
        """The host's mount of the file system at ``mount_point`` (again, after ``unmount``)."""
        h = self.lab.host(host)
        self._mount(f"mount-{h.name}", self.mount_point, netns=h.name, mountns=self.lab.mount_namespaces[h.name])

    def unmount(self, host: str, *, kill: bool = True) -> None:
        """The host loses its mount: its mfsmount is killed (``kill``: its tasks get ENOTCONN until
        the mount point is unmounted) and the mount point unmounted (then they see an empty directory)."""
        h = self.lab.host(host)
        self._stop(f"mount-{h.name}", signal.SIGKILL if kill else None)
        self._run(["nsenter", f"--mount={self.lab.mount_namespaces[h.name]}", "umount", "-l", str(self.mount_point)],
             check=False)

    def set_read_only(self, host: str, read_only: bool = True) -> None:
        """The host's mount turns read-only (``read_only``) or writable again, without unmounting:
        ``mount -o remount,ro`` of the FUSE superblock in the host's mount namespace, which every
        copy of the mount in its tasks' namespaces shares, so their writes fail with EROFS at once
        (as after an operator's or the kernel's remount, or an export turned ro). Checked by reading
        the mount's options back in the host's namespace."""
        h = self.lab.host(host)
        ns = ["nsenter", f"--mount={self.lab.mount_namespaces[h.name]}"]
        mode = "ro" if read_only else "rw"
        self._run([*ns, "mount", "-i", "-o", f"remount,{mode}", str(self.mount_point)])   # -i: no mount.fuse helper
        options = self._run([*ns, "findmnt", "-n", "-o", "VFS-OPTIONS,FS-OPTIONS", str(self.mount_point)]).stdout
        # the superblock's flag (FS-OPTIONS) is what the tasks' copies share
        fs_options = options.split()[-1].split(",") if options.split() else []
        if mode not in fs_options:
            raise RuntimeError(f"remount {mode} of {self.mount_point} on {h.name} did not take: {options.strip()}")

    # ------------------------------------------------------------------ a full file system
    def set_quota(self, path: str | os.PathLike, size_bytes: int | None) -> None:
        """A hard size quota on a directory of the file system (None removes it): writes past it fail
        with EDQUOT, as on a full file system. ``path`` is relative to the operator's mount's ``subdir``."""
        target = self.admin_dir / path
        if size_bytes is None:
            self._run(["mfsdelquota", "-L", str(target)])
        else:
            self._run(["mfssetquota", "-L", str(int(size_bytes)), str(target)])

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _wait(predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"MooseFS lab: timed out waiting for {what}")


class MachineMooseFS:
    """MooseFS for tasks in this machine's own namespaces, as on one Mesos agent: ``livevec deploy run-local``,
    whose processes or containers (which bind-mount it) use the volume at ``volumes()``.

    Why a lab at all: a chunkserver refuses a loopback master, so a one-host lab gives the master its bridge
    address and the chunkserver a host. The mount the tasks use is the lab's operator mount in the root
    namespace, where the runner and podman see it."""

    def __init__(self, work_dir: str | os.PathLike, *, lab_id: int = 254):
        self.work_dir = Path(work_dir)
        self.lab = NetnsLab(1, lab_id=lab_id)
        self.fs: MooseFSLab | None = None

    def start(self) -> "MachineMooseFS":
        problem = moosefs_support_problem()
        if problem:
            raise MooseFSUnavailable(problem)
        self.lab.start()
        try:
            self.fs = MooseFSLab(self.lab, self.work_dir, chunkservers=1).start()
        except BaseException:
            self.lab.close()
            raise
        return self

    def close(self) -> None:
        if self.fs is not None:
            self.fs.close()
            self.fs = None
        self.lab.close()

    def __enter__(self) -> "MachineMooseFS":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def volumes(self) -> dict[str, Path]:
        """The runner's ``volumes``: the group's volumes under ``/mnt/mfs`` on this machine's mount."""
        assert self.fs is not None, "not started"
        return {str(self.fs.mount_point): self.fs.admin_path}

    @property
    def host_dir(self) -> Path:
        """The group's hostPath directory (``/mnt/mfs/livevec``) as this machine sees it."""
        assert self.fs is not None, "not started"
        return self.fs.admin_dir

