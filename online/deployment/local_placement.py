"""Placing a Marathon group on this one machine, before any task starts.

On a cluster, Mesos-DNS resolves ``<name>.marathon.mesos``, agents own the fixed ports and
the volumes are host paths. Here all of it is 127.0.0.1, other tests may hold the real
ports and the host paths are not ours, so the app definitions are rewritten once, up front:

- caller overrides of instance counts; ``DMLC_NUM_SERVER``/``DMLC_NUM_WORKER`` follow an
  overridden server or worker count, and an inconsistent group is rejected when nothing
  was overridden, because ps-lite rendezvous would never complete;
- fixed ports (``requirePorts``) stay stable across restarts but, by default, move to a
  local port the runner's agent ports give now (``online.deployment.agent_ports``); env values
  equal to the fixed port, or ``<dns-name>:<port>``, follow;
- ``container.volumes`` map to local directories (``volumes=`` or a directory under
  ``work_dir``) and env values under a container path follow (unless the tasks run in
  containers, which see each volume at its container path: ``rewrite_volume_paths=False``);
  a volume of the agent's shared memory (hostPath under ``/dev/shm``: the workers' host
  replica) maps to a directory of this machine's ``/dev/shm`` instead, since its point is
  memory, one per runner, which the runner removes when it stops;
- every ``<name>.marathon.mesos`` in an env value or the cmd becomes the host (the whole
  machine is one agent); a name that matches no app of the group is an error, as it would
  never resolve on the cluster either;
- env overrides (all apps, or per app) are merged last, unrewritten.

Doing this before launching means every such mistake is reported before a process runs,
and the supervisor only ever sees ordinary, already-local app definitions.
"""
from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from online.deployment.marathon_group import flatten_group, port_definitions, start_order
from online.deployment.topology import mesos_dns_name

# The agent's tmpfs. A hostPath there is memory the agent's tasks share (a host replica's segment, reserved with
# posix_fallocate and mapped): under work_dir it would be a disk file under constant writeback, and it is
# reserved per run so that what killed tasks leave behind goes when the run does.
AGENT_SHARED_MEMORY = Path("/dev/shm")
_DNS_NAME = re.compile(r"(?<![\w.-])([a-z0-9](?:[a-z0-9-]*[a-z0-9])?)\.marathon\.mesos(?![\w.-])")


def for_app(mapping: Mapping, app_id: str):
    """A caller's per-app value, keyed by the app's full id or by its name."""
    name = app_id.rsplit("/", 1)[-1]
    if app_id in mapping:
        return mapping[app_id]
    return mapping.get(name)


@dataclass
class Placement:
    order: list[str]                            # app ids, dependencies first
    specs: dict[str, dict]                      # app id -> resolved app definition
    fixed_ports: dict[str, list[int | None]]    # app id -> per port definition: local port, or None (dynamic)
    volume_dirs: dict[str, Path]                # containerPath -> local directory
    memory_dir: Path | None = None              # this run's directory in /dev/shm: the runner removes it


def place_group(group: Mapping, *, host: str | None, work_dir: Path,
                env: Mapping[str, str] | None = None,
                app_env: Mapping[str, Mapping[str, str]] | None = None,
                instances: Mapping[str, int] | None = None,
                volumes: Mapping[str, str | Path] | None = None,
                remap_fixed_ports: bool = True, rewrite_volume_paths: bool = True,
                take_port: Callable[[Collection[int]], int] | None = None) -> Placement:
    """``take_port(avoid)``: a local port for a fixed one (``AgentPorts.take``), needed when fixed ports are
    remapped on a ``host``."""
    if remap_fixed_ports and host is not None and take_port is None:
        raise ValueError("remapping the fixed ports needs take_port (online.deployment.agent_ports)")
    apps = flatten_group(group)
    order = start_order(apps)
    specs = {a["id"]: a for a in apps}
    _apply_instances(specs, dict(instances or {}))
    fixed_ports = _remap_fixed_ports(specs, take_port if remap_fixed_ports and host is not None else None)
    memory_dir = AGENT_SHARED_MEMORY / f"livevec-local-{uuid.uuid4().hex[:12]}" \
        if AGENT_SHARED_MEMORY.is_dir() and os.access(AGENT_SHARED_MEMORY, os.W_OK) else None
    volume_dirs = _map_volumes(specs, dict(volumes or {}), work_dir, memory_dir)
    dns = {mesos_dns_name(app_id): app_id for app_id in specs}
    unknown = set(app_env or {}) - {a.rsplit("/", 1)[-1] for a in specs} - set(specs)
    if unknown:
        raise KeyError(f"app_env for unknown apps {sorted(unknown)}")
    for app_id, spec in specs.items():
        _resolve(spec, dns, host, volume_dirs if rewrite_volume_paths else {})
        overrides = {**dict(env or {}), **dict(for_app(app_env or {}, app_id) or {})}
        spec["env"] = {**spec.get("env", {}), **overrides}
    in_memory = memory_dir is not None and any(d.is_relative_to(memory_dir) for d in volume_dirs.values())
    return Placement(order, specs, fixed_ports, volume_dirs, memory_dir if in_memory else None)


def _apply_instances(specs: dict[str, dict], counts: dict[str, int]) -> None:
    names = {a.rsplit("/", 1)[-1] for a in specs} | set(specs)
    unknown = set(counts) - names
    if unknown:
        raise KeyError(f"instances for unknown apps {sorted(unknown)}")
    overridden_roles = set()
    for app_id, spec in specs.items():
        n = for_app(counts, app_id)
        if n is not None:
            spec["instances"] = int(n)
            overridden_roles.add(spec.get("env", {}).get("DMLC_ROLE"))
    totals = {"server": 0, "worker": 0}
    for spec in specs.values():
        role = spec.get("env", {}).get("DMLC_ROLE")
        if role in totals:
            totals[role] += int(spec.get("instances", 1))
    for role, var in (("server", "DMLC_NUM_SERVER"), ("worker", "DMLC_NUM_WORKER")):
        for app_id, spec in specs.items():
            env = spec.get("env", {})
            if var not in env:
                continue
            if role in overridden_roles:
                env[var] = str(totals[role])
            elif env[var] != str(totals[role]):
                raise ValueError(f"{app_id}: {var}={env[var]} but the group runs {totals[role]} "
                                 f"{role} instance(s); ps-lite rendezvous would never complete")


def _remap_fixed_ports(specs: dict[str, dict], take_port: Callable[[Collection[int]], int] | None
                       ) -> dict[str, list[int | None]]:
    """Each app's fixed ports, moved to ``take_port``'s (None: kept). Never to a fixed port of the group: the
    cluster's own agent may hold those."""
    fixed: dict[str, list[int | None]] = {}
    rewrites: dict[int, tuple[str, int]] = {}
    originals = {int(d["port"]) for spec in specs.values() if spec.get("requirePorts")
                 for d in port_definitions(spec) if d.get("port", 0)}
    for app_id, spec in specs.items():
        row: list[int | None] = []
        for d in port_definitions(spec):
            if spec.get("requirePorts") and d.get("port", 0):
                local = take_port(originals) if take_port is not None else int(d["port"])
                rewrites[int(d["port"])] = (app_id, local)
                row.append(local)
            else:
                row.append(None)
        fixed[app_id] = row
    if rewrites:
        for spec in specs.values():
            env = spec.get("env", {})
            for key, value in list(env.items()):
                if not isinstance(value, str):
                    continue
                for original, (owner, local) in rewrites.items():
                    if value == str(original):
                        value = str(local)
                    value = value.replace(f"{mesos_dns_name(owner)}:{original}",
                                          f"{mesos_dns_name(owner)}:{local}")
                env[key] = value
    return fixed


def _in_shared_memory(host_path: str | None) -> bool:
    return bool(host_path) and Path(host_path).is_relative_to(AGENT_SHARED_MEMORY)


def _map_volumes(specs: dict[str, dict], volumes: dict[str, str | Path], work_dir: Path,
                 memory_dir: Path | None) -> dict[str, Path]:
    """containerPath -> local directory. A ``volumes`` key may be the container path or
    a parent of it ({"/mnt/mfs": d} maps /mnt/mfs/livevec to d/livevec). Unmapped, a volume of the
    agent's shared memory goes under ``memory_dir`` (None: this machine has no /dev/shm to use), others
    under ``work_dir``."""
    mapping: dict[str, Path] = {}
    used: set[str] = set()
    for spec in specs.values():
        for vol in (spec.get("container") or {}).get("volumes", []):
            cpath = vol.get("containerPath")
            if not cpath or cpath in mapping:
                continue
            parents = [k for k in volumes if cpath == k.rstrip("/") or cpath.startswith(k.rstrip("/") + "/")]
            if parents:
                key = max(parents, key=len)
                used.add(key)
                mapping[cpath] = Path(volumes[key]) / cpath[len(key.rstrip("/")):].lstrip("/")
            else:
                name = cpath.strip("/").replace("/", "_")
                in_memory = memory_dir is not None and _in_shared_memory(vol.get("hostPath"))
                mapping[cpath] = memory_dir / name if in_memory else work_dir / "volumes" / name
    unused = set(volumes) - used
    if unused:
        raise ValueError(f"volumes {sorted(unused)} match no containerPath of the group "
                         f"(have {sorted(mapping)})")
    return mapping


def _resolve(spec: dict, dns: Mapping[str, str], host: str | None, volume_dirs: Mapping[str, Path]) -> None:
    """Mesos-DNS names and container paths in the env and cmd, made local."""
    def resolve(text: str, where: str) -> str:
        def sub(m: re.Match) -> str:
            name = m.group(0)
            if name not in dns:
                raise ValueError(f"{spec['id']}: {where} refers to {name}, but no app of the group has "
                                 f"that Mesos-DNS name (have {sorted(dns)})")
            return host if host is not None else name   # None: the hosts resolve the names themselves
        text = _DNS_NAME.sub(sub, text)
        for cpath, local in volume_dirs.items():
            if text == cpath or text.startswith(cpath + "/"):
                text = str(local) + text[len(cpath):]
            else:
                text = re.sub(rf"(?<![\w/.-]){re.escape(cpath)}(?=/|\s|$|\")", str(local), text)
        return text

    spec["env"] = {k: resolve(v, f"env {k}") if isinstance(v, str) else v
                   for k, v in spec.get("env", {}).items()}
    if "cmd" in spec:
        spec["cmd"] = resolve(spec["cmd"], "cmd")
