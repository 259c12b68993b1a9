"""Ports for the processes a test starts, without the pick-then-bind race.

A port picked by binding port 0 and closing the socket is free only at that moment: until the child binds it,
any outgoing connection on the machine may get it as its ephemeral source port, and any ``bind(0)`` may get it
too. The child then dies with ``OSError: [Errno 98] Address already in use``. So:

* a child that can bind port 0 does, and reports the port it got in a log line: ``reported_port`` reads it
  (``VAN_BOUND``, ``METRICS_LISTENING``, ``FRONTEND_LISTENING`` are livevec's lines);
* a port the test must know before the child starts (a client that is to retry until a server appears there, a
  bootstrap address where nothing may answer) is held by ``reserved_port`` for as long as it is needed.
"""
from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

# The structured log lines in which livevec's processes report what they bound (ps_bridge.structured_logging).
VAN_BOUND = r"event=van_bound .*advertised=\S+:(\d+)"          # a ps-lite node's socket (the scheduler's: the root)
METRICS_LISTENING = r"event=metrics_listening port=(\d+)"      # LIVEVEC_METRICS_PORT=0
FRONTEND_LISTENING = r"event=frontend_listening url=\S+:(\d+)/"  # LIVEVEC_HTTP_PORT=0 (--port 0)


@contextlib.contextmanager
def reserved_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A port that nothing else can take while the block runs, and on which nothing answers until a child of the
    test listens there.

    The port is held by a socket bound with ``SO_REUSEADDR`` and never listening. The kernel hands a bound port
    to no ``bind(0)`` and to no outgoing connection, and refuses it to any other bind, except one that also sets
    ``SO_REUSEADDR`` and names the port: which is what a server does (aiohttp, zmq, ``http.server`` and the JVM
    all set it), so a child told the port binds it and listens there. Connections are refused until it does.
    """
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind((host, 0))
        yield holder.getsockname()[1]
    finally:
        holder.close()


def reported_port(log: str | Path, pattern: str, *, offset: int = 0, proc: subprocess.Popen | None = None,
                  timeout: float = 60.0) -> int:
    """The port a child reported in ``log`` after byte ``offset``: group 1 of the first line matching
    ``pattern``. Waits up to ``timeout`` seconds; fails at once when ``proc`` exits first."""
    line = re.compile(pattern.encode())
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(log, "rb") as f:
                f.seek(offset)
                found = line.search(f.read())
        except FileNotFoundError:
            found = None
        if found:
            return int(found.group(1))
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{proc.args!r} exited with {proc.returncode} before reporting its port "
                                 f"({pattern}) in {log}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no port reported ({pattern}) in {log} within {timeout:.0f} s")
        time.sleep(0.05)
