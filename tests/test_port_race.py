"""A port picked for a child process, lost before the child binds it, and the three ways the tests avoid it.

Picking a port by binding port 0, reading it and closing the socket leaves it free only at that moment. Until the
child binds it, the kernel may give it to any outgoing connection on the machine as its source port (the pick
and those connections draw from the same ephemeral range), and the child dies with
``OSError: [Errno 98] Address already in use``. Here the connection is opened on purpose, between the pick and
the child's start, where elsewhere it comes by chance.

The ways out, each checked against the same thief:

* the child binds port 0 and reports the port it got (``tests.support.ports.reported_port``): there is no moment
  at which the port is free and promised;
* a port that must be known before the child starts is held (``reserved_port``) until the child binds it;
* the local runner, which must tell Marathon tasks their ports, hands out ports below the kernel's ephemeral
  range, as a Mesos agent does (``online.deployment.agent_ports``).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from online.deployment.agent_ports import AgentPorts, agent_port_range
from tests.cluster_harness import REPO, Cluster
from tests.support.http import get
from tests.support.ports import reserved_port


@pytest.fixture
def server():
    """Somewhere for the thief's connection to go."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()


def _picked_port() -> int:
    """The pattern shown losing: bind port 0, read the port, close the socket."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _steal(port: int, server) -> socket.socket:
    """An outgoing connection from ``port``, what any process's connection may be given (raises when held)."""
    return socket.create_connection(server, timeout=5, source_address=("127.0.0.1", port))


def _scheduler_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "LIVEVEC_", "PS_", "PORT"))}
    return {**env, "DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "0",
            "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1", **extra}


def test_a_port_picked_for_a_child_is_lost_to_a_connection_made_before_the_child_binds_it(server):
    port = _picked_port()
    with _steal(port, server):
        done = subprocess.run([sys.executable, "-m", "online.cli", "scheduler"], cwd=REPO, capture_output=True,
                              text=True, timeout=60, env=_scheduler_env(LIVEVEC_METRICS_PORT=str(port)))
    assert done.returncode != 0, done.stderr[-2000:]
    assert "[Errno 98] Address already in use" in done.stderr, done.stderr[-2000:]


def test_a_child_that_binds_port_0_and_reports_it_holds_it_from_the_start(tmp_path, server):
    cluster = Cluster(tmp_path, servers=1, workers=1, env={})
    try:
        cluster.start("scheduler", "scheduler")   # returns once the scheduler reported its root port
        ports = {"root": cluster.root_port, "metrics": cluster.metrics_ports["scheduler"]}
        for name, port in ports.items():
            with pytest.raises(OSError) as taken:
                _steal(port, server).close()
            assert taken.value.errno == 98, name
        assert get(f"http://127.0.0.1:{ports['metrics']}/health").ok
        with socket.create_connection(("127.0.0.1", ports["root"]), timeout=5):
            pass
        cluster.assert_alive()
    finally:
        cluster.stop()


def test_a_reserved_port_is_taken_by_nothing_else_and_bound_by_the_server_told_it(server):
    with reserved_port() as port:
        with pytest.raises(OSError) as taken:
            _steal(port, server).close()
        assert taken.value.errno == 98
        assert not get(f"http://127.0.0.1:{port}/").status   # refused until the server listens
        # a server binds it (SO_REUSEADDR, as aiohttp, zmq, http.server and the JVM set it) and answers there
        child = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                                 cwd=Path(__file__).parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 30
            while not (answer := get(f"http://127.0.0.1:{port}/")).ok:
                assert child.poll() is None, child.stderr.read()
                assert time.monotonic() < deadline, answer
                time.sleep(0.1)
        finally:
            child.terminate()
            child.wait(timeout=10)


def test_the_runner_hands_out_ports_the_kernel_never_picks_and_no_two_runners_share(server):
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = agent_port_range()
    assert ports and ports.stop == low   # just below the range every bind(0) and connection draws from
    one, two = AgentPorts(), AgentPorts()   # as two runners on the machine
    try:
        a, b = one.take(), one.take()
        assert a != b and {a, b} <= set(ports)
        one.release(b)
        assert AgentPorts([a, b]).take() == b   # a stays the first runner's until it releases it
        assert two.take(avoid={b}) not in (a, b)
        with _steal(b, server), pytest.raises(RuntimeError):   # used by a connection, though nobody claims it
            AgentPorts([b]).take()
    finally:
        one.close()
        two.close()
