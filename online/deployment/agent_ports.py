"""The ports a local runner gives its tasks, as a Mesos agent offers them.

Marathon tells a task its ports (``PORT0``, ``PORT_<NAME>``) before it starts, so the task cannot bind port 0
and report what it got. A Mesos agent can promise them because its ``ports`` resource lies outside the kernel's
ephemeral range (``net.ipv4.ip_local_port_range``), from which the kernel draws every ``bind(0)`` and the source
port of every outgoing connection. A port found free with ``bind(0)`` lies inside that range, and any connection
on the machine may take it before the task binds it: the task then dies with ``Address already in use``. The
ports here lie just below the range, where the kernel never picks one by itself.

Runners on one machine (two test runs, a ``livevec up``) must not hand out the same port either: each port handed
out is claimed with an abstract Unix socket named after it, which the kernel frees when the claim is closed or
its runner dies, and a port is handed out only if nothing on the machine holds it.
"""
from __future__ import annotations

import random
import socket
from collections.abc import Collection, Sequence
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
SPAN = 2768   # 30000 - 32767 below Linux's default range (32768 - 60999); it holds Mesos's own 31000 - 32000
_CLAIM = "\0livevec-agent-port-{}"


def agent_port_range(ephemeral: Path = EPHEMERAL_RANGE) -> range:
    """The ports below the kernel's ephemeral range (empty when the range starts too low to leave room)."""
    try:
        low = int(ephemeral.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(max(1024, low - SPAN), low)


def _claim(port: int) -> socket.socket | None:
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        claim.bind(_CLAIM.format(port))
    except OSError:
        claim.close()
        return None
    return claim


def _unused(port: int) -> bool:
    """Nothing on this machine holds the port: a bind to every address without SO_REUSEADDR, which any socket
    bound to the port, listening or not, and any connection from or to it refuses."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


class AgentPorts:
    """Ports handed out for this runner's tasks, each claimed until ``release`` (or ``close``)."""

    def __init__(self, ports: Sequence[int] | None = None):
        self.ports = agent_port_range() if ports is None else ports
        self._claims: dict[int, socket.socket] = {}

    def take(self, avoid: Collection[int] = ()) -> int:
        """A port free on this machine and claimed for this runner, other than ``avoid``."""
        if not self.ports:   # the kernel may use every port: take what bind(0) gives, as the only choice left
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("0.0.0.0", 0))
                return s.getsockname()[1]
        start = random.randrange(len(self.ports))
        for i in range(len(self.ports)):
            port = self.ports[(start + i) % len(self.ports)]
            if port in avoid or port in self._claims:
                continue
            claim = _claim(port)
            if claim is None:
                continue
            if _unused(port):
                self._claims[port] = claim
                return port
            claim.close()
        raise RuntimeError(f"no free port in {min(self.ports)} - {max(self.ports)} for a task")

    def release(self, port: int) -> None:
        claim = self._claims.pop(port, None)
        if claim is not None:
            claim.close()

    def close(self) -> None:
        for port in list(self._claims):
            self.release(port)
