"""Real livevec processes on 127.0.0.1 for integration tests: scheduler, servers, workers.

Each role is started as ``python -m online.cli <role>`` with the ``DMLC_*``/``LIVEVEC_*``
environment a deployment would give it, logs to a file in the test's tmp dir, and can be
killed with SIGKILL. Every process binds port 0 and the harness reads the port it got from its
log (``tests.support.ports``): the scheduler's root port, which the others are then given, and
each process's metrics port. ``read_model()`` joins the cluster as an extra (elastic) node and
reads the whole model back from the servers through the same path the front end uses.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.http import get
from tests.support.ports import METRICS_LISTENING, VAN_BOUND, reported_port

REPO = Path(__file__).resolve().parents[1]


def process_alive(pid: int) -> bool:
    """The process exists and is not a zombie (a child that exited but was not reaped counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class BoundPorts(dict):
    """Each process's metrics port, read from its ``metrics_listening`` log line.

    The processes bind port 0 (a port picked for them could be taken before they bound it). A name is looked up
    in the lines its log got since its last start; reading one waits for the line.
    """

    _LINE = re.compile(METRICS_LISTENING.encode())

    def __init__(self, procs: dict[str, subprocess.Popen]):
        super().__init__()
        self._procs = procs
        self._logs: dict[str, tuple[Path, int]] = {}

    def started(self, name: str, log: Path, offset: int) -> None:
        self._logs[name] = (log, offset)
        self.pop(name, None)

    def bound(self, name: str) -> int | None:
        """The port, or None while the process has not logged it yet."""
        if name not in self and name in self._logs:
            path, offset = self._logs[name]
            with open(path, "rb") as f:
                f.seek(offset)
                found = self._LINE.search(f.read())
            if found:
                super().__setitem__(name, int(found.group(1)))
        return self.get(name)

    def __getitem__(self, name: str) -> int:
        deadline = time.monotonic() + 60
        while (port := self.bound(name)) is None:
            proc = self._procs.get(name)
            if name not in self._logs or time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
                raise KeyError(f"{name} has not logged its metrics port")
            time.sleep(0.1)
        return port

    def __delitem__(self, name: str) -> None:
        self._logs.pop(name, None)
        self.pop(name, None)

    def items(self):
        return [(name, self[name]) for name in {*self.keys(), *self._logs}]


class Cluster:
    """Start the ``scheduler`` role first: ``start`` returns once it has bound its root port (``root_port``),
    which every process started after it is given."""

    def __init__(self, tmp: Path, *, servers: int, workers: int, env: dict[str, str]):
        self.tmp = Path(tmp)
        self.root_port: int | None = None
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "LIVEVEC_", "PS_", "PORT"))},
            "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "0",
            "DMLC_NUM_SERVER": str(servers), "DMLC_NUM_WORKER": str(workers), "DMLC_NODE_HOST": "127.0.0.1",
            "LIVEVEC_ELASTIC_WORKERS": "1", "PS_HEARTBEAT_INTERVAL": "0.5", "PS_HEARTBEAT_TIMEOUT": "4",
            "LIVEVEC_KAFKA_SESSION_TIMEOUT_MS": "6000", "PYTHONUNBUFFERED": "1", **env}
        self.procs: dict[str, subprocess.Popen] = {}
        self.metrics_ports = BoundPorts(self.procs)
        self._offsets: dict[str, int] = {}   # where each process's log begins for its current run

    def start(self, name: str, role: str, **extra: str) -> subprocess.Popen:
        env = {**self.env, "DMLC_ROLE": role, "LIVEVEC_METRICS_PORT": "0", **extra}
        path = self.tmp / f"{name}.log"
        log = open(path, "ab")
        self._offsets[name] = log.tell()
        self.metrics_ports.started(name, path, self._offsets[name])
        proc = subprocess.Popen([sys.executable, "-m", "online.cli", role], env=env, cwd=REPO,
                                stdout=log, stderr=subprocess.STDOUT)
        self.procs[name] = proc
        if role == "scheduler":
            self.root_port = self.reported(name, VAN_BOUND)
            self.env["DMLC_PS_ROOT_PORT"] = str(self.root_port)
        return proc

    def reported(self, name: str, pattern: str) -> int:
        """The port process ``name`` reported (``tests.support.ports``) since its last start."""
        return reported_port(self.tmp / f"{name}.log", pattern, offset=self._offsets[name], proc=self.procs[name])

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[name]
        proc.send_signal(sig)
        proc.wait(timeout=30)

    def metric(self, name: str, metric: str, **labels: str) -> float:
        """Sum of a metric's samples on a process's /metrics whose labels include ``labels`` (0 when absent)."""
        port = self.metrics_ports.bound(name)
        if port is None:   # not listening yet; a dead process is an error
            self.assert_alive()
            return 0.0
        answer = get(f"http://127.0.0.1:{port}/metrics")
        if not answer.ok:   # not listening yet (still starting); a dead process is an error
            proc = self.procs[name]
            assert proc.poll() is None, f"{name} exited with {proc.returncode}:\n{self.log(name)[-3000:]}"
            return 0.0
        text = answer.body.decode()
        total = 0.0
        for line in text.splitlines():
            if (line.startswith(metric + " ") or line.startswith(metric + "{")) \
                    and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def assert_alive(self) -> None:
        dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
        assert not dead, f"processes exited: {dead}\n" + "\n".join(
            f"--- {n}\n{self.log(n)[-3000:]}" for n in dead)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def read_model(cluster: Cluster, timeout: float = 30.0):
    """The whole model as the servers hold it: a ``ModelDelta`` (keys, words, vectors, counts)."""
    from online.cluster.node_settings import node_settings
    from online.frontend.ps_source import ParameterServerSource

    async def fetch():
        source = ParameterServerSource(node_settings(None, cluster.env, "worker"))
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    return await source.changes_since(0), await source.stats()
                except ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
        finally:
            await source.close()

    return asyncio.run(fetch())


def wait_until(predicate, timeout: float, interval: float = 0.5, message: str = "condition"):
    """Poll ``predicate`` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {message} (last: {last!r})")


def runner_metric(runner, app: str, name: str, index: int = 0) -> float:
    """Sum of a metric's series on one task of a LocalRunner (its ``metrics`` port's /metrics)."""
    text = get(runner.url(app, "metrics", "/metrics", index)).text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def scraped_metric(url: str, name: str, **labels: str) -> float:
    """Sum of the series of exactly ``name`` at a /metrics ``url`` whose labels include ``labels``."""
    text = get(url).text()
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if m and m.group(1) == name and all(f'{k}="{v}"' in (m.group(2) or "") for k, v in labels.items()):
            total += float(m.group(3))
    return total


def coordinator_idle(runner) -> bool:
    """No rollback pending or running: the scheduler's ``livevec_recovering`` gauge is 0 (False while it
    cannot be read, e.g. the scheduler restarting)."""
    try:
        return runner_metric(runner, "scheduler", "livevec_recovering") == 0.0
    except OSError:
        return False


def assert_trained_exactly_once(stats, topic: str, records: int, tokens: int, partitions: int = 4,
                                timeout: float = 120.0, idle=None) -> dict:
    """The exactly-once check. ``stats()`` gives every server's statistics (None while one does not answer);
    ``records`` were produced round-robin over ``partitions``; ``idle()`` says that the coordinator has
    no rollback pending (``coordinator_idle``). Waits until server 0's batch ledger covers every offset
    with no rollback pending, and stays so for 3 s: a rollback seen late (a rebalance after the last
    record) sends the ledger back to a checkpoint and the rest is retrained, and a worker whose
    partitions moved after a rollback's seek may train a range twice until the rollback it then asks
    for. It then checks that every produced record and token was trained exactly once relative to the
    restored checkpoints."""
    ends = {f"{topic}/{p}": len(range(p, records, partitions)) for p in range(partitions)}

    def all_trained():
        s = stats()
        led = s[0].get("ledger") if s else None
        return led if led and led["frontier"] == ends and not any(x.get("recovering") for x in s) \
            and (idle is None or idle()) else False

    def stable():
        first = all_trained()
        if not first:
            return False
        time.sleep(3.0)
        second = all_trained()
        return second if second == first else False

    try:
        ledger = wait_until(stable, timeout, interval=0.25, message="every produced record trained, settled")
    except AssertionError as exc:   # say what was missing: the frontier, a rollback, or the coordinator
        s = stats()
        led = s[0].get("ledger") if s else None
        short = {k: (led or {}).get("frontier", {}).get(k) for k in ends} if led else None
        raise AssertionError(f"{exc}; produced {ends}, trained frontier {short}, "
                             f"recovering {[x.get('recovering') for x in s] if s else None}, "
                             f"idle {idle() if idle else None}") from None
    assert ledger["overlaps"] == 0 and ledger["gaps"] == 0, ledger
    assert ledger["offsets"] == ledger["records"] == records, ledger
    assert ledger["tokens"] == tokens, ledger
    return ledger


@contextlib.contextmanager
def netns_lab(hosts: int, lab_ids: range):
    """A lab of network-namespace hosts (``online.deployment.netns_lab``) with an id drawn from ``lab_ids``,
    so that two test modules' labs never collide. CI runs as root, so the lab must work there; it must leave no
    namespace behind."""
    from online.deployment.netns_lab import NetnsLab, lab_support_problem

    problem = lab_support_problem()
    assert problem is None, problem
    with NetnsLab(hosts, lab_id=random.randrange(lab_ids.start, lab_ids.stop)) as lab:
        yield lab
    for host in lab.hosts:
        assert not Path(f"/run/netns/{host.name}").exists()
