"""The committed Marathon group across the hosts of a network-namespace lab.

What changes from one host (``local_runner``): every task is placed on an agent the way Mesos
would place it (``lab_placement``: the group's constraints honoured, checked, and a group that
does not fit refused), runs inside that host's namespace with ``$HOST`` set to the host's
address, and finds the other apps by their Mesos-DNS names through the host's own
``/etc/hosts``. Fixed ports stay the ports the group declares, since each host has its ports to
itself. The supervision, health checks and restarts are the local runner's.

Kafka stays in the root namespace, listening on the bridge, as a Kafka cluster next to the
Mesos agents would.

The agents' /dev/shm is one directory of this machine for every lab host (the namespaces share its
file systems); the workers of one host still share a host replica of their own, since its file is
named by ``DMLC_NODE_HOST``, which the group's cmd sets to ``$HOST``: the host's address.
"""
from __future__ import annotations

import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

from online.deployment.lab_placement import Agent, check_placement, place_tasks
from online.deployment.local_runner import LocalRunner, ProcessLauncher
from online.deployment.marathon import render_group
from online.deployment.marathon_group import flatten_group, start_order
from online.deployment.netns_lab import NetnsLab
from online.deployment.orphans import spawn
from online.deployment.topology import mesos_dns_name

# Every lab host offers what the group's attribute constraints ask of an agent (the shared volume).
AGENT_ATTRIBUTES = {"moosefs": "true"}


class NetnsLauncher(ProcessLauncher):
    """Each task as a process of its host's namespace (``ip netns exec`` execs it: same pid, so
    the process group and signals work as for a local process, and the parent-death signal of
    ``online.deployment.orphans`` is kept)."""

    def __init__(self, lab: NetnsLab, bin_dirs: Iterable[str | Path] | None = None):
        super().__init__(bin_dirs)
        self.lab = lab

    def prepare(self, volume_dirs: Mapping[str, Path], sandboxes: Path) -> None:
        # A volume on the hosts' own mounts (the lab's MooseFS) is made there, not under the empty mount point.
        super().prepare({c: d for c, d in volume_dirs.items()
                         if not any(Path(d).is_relative_to(m) for m in self.lab.shared_mounts)}, sandboxes)

    def start(self, task, spec: Mapping, env: dict[str, str], log) -> subprocess.Popen:
        argv = ["/bin/sh", "-c", spec["cmd"]] if "cmd" in spec else list(spec["args"])
        return spawn([*self.lab.exec_prefix(task.host), *argv], cwd=task.sandbox, env=env,
                     stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def plan(group: Mapping, lab: NetnsLab, instances: Mapping[str, int] | None = None,
         agents: int | None = None) -> dict[tuple[str, int], str]:
    """(app id, index) -> host address for every task the group runs, instance overrides applied, over the
    lab's first ``agents`` hosts (default all; the rest stay free for clients such as a stats probe)."""
    apps = {a["id"]: a for a in flatten_group(group)}
    counts = dict(instances or {})
    order = []
    for app_id in start_order(apps.values()):
        n = counts.get(app_id, counts.get(app_id.rsplit("/", 1)[-1], apps[app_id].get("instances", 1)))
        order.append((app_id, int(n), apps[app_id].get("constraints") or []))
    placed = place_tasks(order, [Agent(h.address, dict(AGENT_ATTRIBUTES)) for h in lab.hosts[:agents]])
    problems = check_placement(placed, {a: c for a, _, c in order})
    if problems:   # place_tasks honours them; this guards the guard
        raise AssertionError("; ".join(problems))
    return {key: agent.hostname for key, agent in placed.items()}


def lab_cluster(lab: NetnsLab, topology, *, work_dir: Path, env: Mapping[str, str] | None = None,
                app_env: Mapping[str, Mapping[str, str]] | None = None,
                instances: Mapping[str, int] | None = None, volumes: Mapping[str, str | Path] | None = None,
                agents: int | None = None, **kwargs) -> LocalRunner:
    """A LocalRunner for the topology's group over the lab's hosts; the hosts files are written now."""
    group = render_group(topology)
    hosts = plan(group, lab, instances, agents)
    names: dict[str, str] = {}
    for (app_id, index), address in sorted(hosts.items()):
        names.setdefault(mesos_dns_name(app_id), address)   # Mesos-DNS: the app's name -> its task's agent
    lab.write_hosts_files(names)
    runner = LocalRunner(group, work_dir=work_dir, env=env, app_env=app_env, instances=instances,
                         volumes=volumes, host=lab.bridge_address, launcher=NetnsLauncher(lab),
                         task_hosts=lambda app_id, index: hosts[(app_id, index)], **kwargs)
    runner.placement = hosts
    return runner
