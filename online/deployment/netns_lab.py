"""Hosts of a lab cluster on this one machine: Linux network namespaces on a bridge.

On a Mesos or Kubernetes cluster every node has an address of its own, finds the scheduler by a
DNS name, shares a link of finite bandwidth and can be cut off without dying. A network namespace
gives a process all of that here: its own interfaces and address, its own ``/etc/hosts`` (``ip
netns exec`` bind-mounts ``/etc/netns/NAME/hosts``, as Mesos-DNS or cluster DNS would answer), a
veth link that ``tc``'s token bucket shapes, and a link that can be taken down while every
process behind it keeps running: a real partition, which a kill never produces.

Addresses come from 198.18.0.0/15, the range RFC 2544 sets aside for network benchmarks, so no
traffic can leave for a real network. The bridge holds ``.254`` in the root namespace; a process
there (the Kafka broker, the test, a browser) reaches every host through it.

Everything made is removed by ``close()``, also after a failed start, and a lab left by a killed
run is removed by the next one with the same name.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

NETNS_ETC = Path("/etc/netns")
_RATE = re.compile(r"^\d+(\.\d+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps)$")


class LabUnavailable(RuntimeError):
    """This machine cannot build the lab (not root, no ``ip``, no netns support): nothing was changed."""


def check_rate(rate: str | None) -> str | None:
    """A tc rate such as ``1gbit`` or ``100mbit`` (None: unshaped)."""
    if rate is None or rate == "":
        return None
    if not _RATE.match(rate):
        raise ValueError(f"link rate must look like 1gbit, 100mbit or 10mbps, got {rate!r}")
    return rate


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def lab_support_problem() -> str | None:
    """Why the lab cannot run here, or None. Checked before anything is created."""
    if os.geteuid() != 0:
        return "the multi-host lab needs root (network namespaces, veth pairs and a bridge)"
    if shutil.which("ip") is None:
        return "the multi-host lab needs iproute2's `ip` command"
    if shutil.which("tc") is None:
        return "the multi-host lab needs iproute2's `tc` command (link shaping)"
    probe = f"lvprobe{os.getpid() % 100000}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"network namespaces are not available here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True)
class LabHost:
    name: str        # the namespace, e.g. lv0h1
    address: str     # its address on the bridge, e.g. 198.18.0.1
    veth: str        # the bridge-side end of its link (the namespace side is eth0)


class NetnsLab:
    """``hosts`` namespaces on one bridge. ``lab_id`` (0 - 255) picks the /24 (198.18.<lab_id>.0) and
    the names, so that two labs can coexist and a stale one is recognised."""

    def __init__(self, hosts: int, *, lab_id: int = 0, link: str | None = None):
        if not 1 <= hosts <= 250:
            raise ValueError(f"a lab has 1 - 250 hosts, got {hosts}")
        if not 0 <= lab_id <= 255:
            raise ValueError(f"lab_id must be 0 - 255, got {lab_id}")
        self.link = check_rate(link)
        self.prefix = f"lv{lab_id}"
        self.subnet = f"198.18.{lab_id}"
        self.bridge = f"{self.prefix}br"
        self.bridge_address = f"{self.subnet}.254"
        self.hosts = [LabHost(f"{self.prefix}h{i}", f"{self.subnet}.{i}", f"{self.prefix}v{i}")
                      for i in range(1, hosts + 1)]
        self._up = False
        # A host's own mounts (``online.deployment.moosefs_lab``): host name -> the file keeping its mount
        # namespace, which ``exec_prefix`` enters; and the mount points only the hosts see.
        self.mount_namespaces: dict[str, Path] = {}
        self.shared_mounts: list[Path] = []

    # -- life cycle
    def start(self) -> "NetnsLab":
        problem = lab_support_problem()
        if problem:
            raise LabUnavailable(problem)
        self.close(quiet=True)   # what a killed run left behind
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for host in self.hosts:
                _ip("netns", "add", host.name)
                _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.name)
                _ip("link", "set", host.veth, "master", self.bridge)
                _ip("link", "set", host.veth, "up")
                _ip("-n", host.name, "addr", "add", f"{host.address}/24", "dev", "eth0")
                _ip("-n", host.name, "link", "set", "eth0", "up")
                _ip("-n", host.name, "link", "set", "lo", "up")
                if self.link:
                    self.shape(host.name, self.link)
            self._up = True
        except BaseException:
            self.close(quiet=True)
            raise
        return self

    def close(self, quiet: bool = False) -> None:
        for host in self.hosts:
            _ip("netns", "del", host.name, check=False)      # takes eth0 and so the veth pair with it
            _ip("link", "del", host.veth, check=False)
            shutil.rmtree(NETNS_ETC / host.name, ignore_errors=True)
        _ip("link", "del", self.bridge, check=False)
        self._up = False

    def __enter__(self) -> "NetnsLab":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what a host sees
    def host(self, name_or_index: str | int) -> LabHost:
        if isinstance(name_or_index, int):
            return self.hosts[name_or_index]
        for host in self.hosts:
            if name_or_index in (host.name, host.address):
                return host
        raise KeyError(f"no lab host {name_or_index!r} (have {[h.name for h in self.hosts]})")

    def write_hosts_files(self, names: dict[str, str]) -> None:
        """Every host resolves these names (name -> address), as Mesos-DNS or cluster DNS would."""
        lines = ["127.0.0.1 localhost"] + [f"{address} {name}" for name, address in sorted(names.items())]
        for host in self.hosts:
            directory = NETNS_ETC / host.name
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "hosts").write_text("\n".join(lines + [f"{host.address} {host.name}"]) + "\n")

    def exec_prefix(self, host: str | int) -> list[str]:
        """argv prefix that runs a command on the host (its network, its /etc/hosts, its own mounts)."""
        name = self.host(host).name
        mounts = self.mount_namespaces.get(name)
        return [*(["nsenter", f"--mount={mounts}"] if mounts else []), "ip", "netns", "exec", name]

    # -- failures
    def partition(self, host: str | int) -> None:
        """The host's link goes down; its processes keep running and keep their sockets."""
        _ip("-n", self.host(host).name, "link", "set", "eth0", "down")

    def heal(self, host: str | int) -> None:
        h = self.host(host)
        _ip("-n", h.name, "link", "set", "eth0", "up")
        # the address's route goes with the link; put it back if the kernel did not
        _ip("-n", h.name, "route", "replace", f"{self.subnet}.0/24", "dev", "eth0", check=False)

    def shape(self, host: str | int, rate: str | None) -> None:
        """Both directions of the host's link at ``rate`` (a token bucket), or unshaped with None."""
        h = self.host(host)
        rate = check_rate(rate)
        for where in (["-n", h.name, "eth0"], [h.veth]):
            netns = ["ip", "netns", "exec", h.name] if where[0] == "-n" else []
            dev = where[-1]
            if rate is None:
                subprocess.run([*netns, "tc", "qdisc", "del", "dev", dev, "root"], capture_output=True)
                continue
            done = subprocess.run([*netns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                                   "burst", "256kb", "latency", "50ms"], capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"tc on {h.name}/{dev}: {done.stderr.strip()}")
