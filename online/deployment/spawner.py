"""Starting processes from a helper process, for a process whose own forks can hang on a FUSE mount.

A forked child closes the descriptors it inherited before it runs its program (``close_fds``, and
``O_CLOEXEC`` at ``exec``), and closing a descriptor of a FUSE mount waits for the file system daemon's
answer to its FLUSH. When a thread of the parent is stuck in a read that the daemon cannot answer (a MooseFS
mount whose chunkserver or master is dead), that answer comes after the read's, and so the child never gets to
its program: ``Popen`` waits with it. Nothing the parent forks starts until the file system is back, not even
the daemon that would bring it back.

A ``Spawner`` is a small helper process, started while its parent holds no descriptor of any mount; it starts
the programs it is asked to and reports their ids and exits over a pipe. Its own descriptors are the pipe's, so
its forks never wait on a mount. ``SpawnedProcess`` is the parent's handle on such a program: signals go
straight to it by id, its exit is read through the helper (which reaps it).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

_HELPER = r"""
import json, subprocess, sys
running, exited = {}, {}
for line in sys.stdin:
    req = json.loads(line)
    try:
        if req["op"] == "spawn":
            with open(req["log"], "ab") as out:
                proc = subprocess.Popen(req["argv"], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
            running[proc.pid] = proc
            reply = {"pid": proc.pid}
        elif req["op"] == "run":
            done = subprocess.run(req["argv"], capture_output=True, text=True, timeout=req["timeout"])
            reply = {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
        else:
            proc = running.get(req["pid"])
            if proc is not None and proc.poll() is not None:
                exited[proc.pid] = running.pop(proc.pid).returncode
            reply = {"returncode": exited.get(req["pid"])}
    except subprocess.TimeoutExpired:
        reply = {"timeout": True}
    except Exception as exc:
        reply = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(reply), flush=True)
"""


class Spawner:
    """The helper process. Start it before any descriptor of a FUSE mount is open in this process."""

    def __init__(self):
        self._helper = subprocess.Popen([sys.executable, "-c", _HELPER], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, cwd="/")
        self._lock = threading.Lock()

    def _ask(self, **request) -> dict:
        with self._lock:
            if self._helper.poll() is not None:
                raise RuntimeError(f"the spawner helper exited with {self._helper.returncode}")
            self._helper.stdin.write(json.dumps(request) + "\n")
            self._helper.stdin.flush()
            line = self._helper.stdout.readline()
        if not line:
            raise RuntimeError("the spawner helper exited")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"{request.get('argv', request)}: {reply['error']}")
        return reply

    def spawn(self, argv: list[str], log: os.PathLike | str) -> SpawnedProcess:
        """``argv`` in a session of its own, stdout and stderr appended to ``log``."""
        return SpawnedProcess(self, self._ask(op="spawn", argv=argv, log=str(log))["pid"], argv)

    def run(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        """``argv`` to its end, its output captured (``subprocess.run``'s ``TimeoutExpired`` after ``timeout``)."""
        reply = self._ask(op="run", argv=argv, timeout=timeout)
        if reply.get("timeout"):
            raise subprocess.TimeoutExpired(argv, timeout)
        return subprocess.CompletedProcess(argv, reply["returncode"], reply["stdout"], reply["stderr"])

    def returncode(self, pid: int) -> int | None:
        return self._ask(op="poll", pid=pid)["returncode"]

    def close(self) -> None:
        """The helper ends (the programs it started go on: they are stopped by their ids)."""
        if self._helper.poll() is None:
            self._helper.stdin.close()
            try:
                self._helper.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._helper.kill()
                self._helper.wait()
        self._helper.stdout.close()


class SpawnedProcess:
    """``Popen``'s ``pid``, ``args``, ``returncode``, ``poll``, ``wait``, ``send_signal`` and ``kill``, for a
    program the spawner started. A signal goes only to a program not yet seen to exit: until the helper reaps
    it, its id cannot be another process's."""

    def __init__(self, spawner: Spawner, pid: int, args: list[str]):
        self._spawner, self.pid, self.args = spawner, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._spawner.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
