"""Marathon's health and readiness checks, as the local runner applies them to a task.

The deploy files' checks decide when a dependency counts as up and when a task is killed,
so the local runner must judge them as Marathon does, or ``livevec up`` and the tests
would pass on timings the cluster rejects. A health check's failures are ignored until its
grace period ends or it first passes, then ``maxConsecutiveFailures`` of them kill the task
(0 never kills, except for the ``MESOS_*`` protocols). Readiness is consulted only until the
task is ready. Until a check first passes it is probed every ``FAST_PROBE_SECONDS``
instead of ``intervalSeconds``, so waiting for health is quick.
"""
from __future__ import annotations

import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

FAST_PROBE_SECONDS = 0.5


@dataclass
class CheckState:
    """One task's view of one check; a new one per launch."""
    spec: dict
    kind: str  # "health" | "readiness"
    passed_once: bool = False
    consecutive_failures: int = 0
    next_at: float = 0.0
    in_flight: bool = False
    ok: bool | None = None

    @property
    def timeout(self) -> float:
        return float(self.spec.get("timeoutSeconds", 20 if self.kind == "health" else 10))

    def due(self, now: float) -> bool:
        if self.in_flight or now < self.next_at:
            return False
        return not (self.kind == "readiness" and self.ok)

    def record(self, ok: bool, now: float, task_started_at: float) -> bool:
        """Take one probe's result; True when the task has now failed too often and must be killed."""
        hc = self.spec
        interval = float(hc.get("intervalSeconds", 60 if self.kind == "health" else 30))
        if ok:
            self.ok, self.passed_once, self.consecutive_failures = True, True, 0
            self.next_at = now + interval
            return False
        if self.kind == "readiness":
            self.ok, self.next_at = False, now + FAST_PROBE_SECONDS
            return False
        # Failures are ignored until the grace period ends or the first success
        # (marathon PR #293); meanwhile probe fast so the first success is seen soon.
        in_grace = (not self.passed_once
                    and now - task_started_at < float(hc.get("gracePeriodSeconds", 300)))
        if in_grace:
            self.next_at = now + FAST_PROBE_SECONDS
            return False
        self.next_at = now + interval
        self.ok = False
        self.consecutive_failures += 1
        limit = int(hc.get("maxConsecutiveFailures", 3))
        protocol = hc.get("protocol", "HTTP")
        if limit == 0 and not protocol.startswith("MESOS_"):
            return False  # Marathon checks: 0 means never kill
        return self.consecutive_failures >= max(limit, 1)


def probe(hc: Mapping, *, host: str, ports: Sequence[int], port_names: Sequence[str | None],
          command_env: Callable[[], dict[str, str]], cwd: Path, timeout: float) -> bool:
    """Run one check against a task: HTTP, TCP, or COMMAND through the shell in its sandbox."""
    protocol = hc.get("protocol", "HTTP")
    try:
        if protocol == "COMMAND":
            cmd = (hc.get("command") or {}).get("value", "exit 1")
            return subprocess.run(["/bin/sh", "-c", cmd], env=command_env(), cwd=cwd, timeout=timeout,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
        if "portName" in hc:
            port = ports[list(port_names).index(hc["portName"])]
        elif hc.get("port"):
            port = int(hc["port"])
        else:
            port = ports[int(hc.get("portIndex", 0))]
        if protocol.endswith("TCP"):
            with socket.create_connection((host, port), timeout=timeout):
                return True
        if "HTTPS" in protocol:   # like Mesos and Marathon, HTTPS checks do not verify the certificate
            url, context = f"https://{host}:{port}{hc.get('path', '/')}", ssl._create_unverified_context()
        else:
            url, context = f"http://{host}:{port}{hc.get('path', '/')}", None
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:
            codes = hc.get("httpStatusCodesForReady")
            return resp.status in codes if codes else 200 <= resp.status < 400
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired, urllib.error.URLError):
        return False
