"""Render a ``Topology`` as a Marathon group (``POST /v2/groups``) and a Metronome job.

Every app uses host networking with ``portDefinitions``: the processes bind the ports
Marathon assigns (named ports, exported as ``$PORT_<NAME>``), and host networking keeps
Mesos-DNS usable from inside the task (Docker bridge containers often bypass it:
marathon#4151, mesos-dns#527). ``cmd`` is used rather than ``args`` because the ports are
only known at launch and ``args`` does not expand variables (marathon#3416); it ends in
``exec`` so that SIGTERM reaches Python rather than /bin/sh.
"""
from __future__ import annotations

import json

from online.deployment.topology import Check, Role, Topology

GROUP_FILE = "livevec-group.json"
METRONOME_FILE = "metronome-export-job.json"


def task_command(role: Role) -> str:
    """``VAR="$HOST" PORT="$PORT_PS" ... exec livevec <role>``.

    Assignments in front of the special built-in ``exec`` are exported to the new program
    by both dash and bash, so no ``export`` line is needed.
    """
    assignments = [f'{var}="$HOST"' for var in role.host_env]
    assignments += [f'{var}="$PORT_{port.upper().replace("-", "_")}"' for var, port in role.port_env.items()]
    return " ".join([*assignments, "exec", role.command])


def _health_check(role: Role, check: Check, https: bool = False) -> dict:
    hc: dict = {
        "protocol": ("MESOS_HTTPS" if https else "MESOS_HTTP") if check.kind == "http" else "MESOS_TCP",
        "portIndex": role.port_index(check.port_name),
        "gracePeriodSeconds": check.grace_period_seconds,
        "intervalSeconds": check.interval_seconds,
        "timeoutSeconds": check.timeout_seconds,
        # For Mesos checks 0 would mean "kill on the first failure", unlike Marathon checks.
        "maxConsecutiveFailures": check.max_consecutive_failures,
        "delaySeconds": check.delay_seconds,
    }
    if check.kind == "http":
        hc["path"] = check.path
    return hc


def render_app(topology: Topology, role: Role) -> dict:
    fixed = any(p.host_port for p in role.ports)
    app: dict = {
        "id": topology.marathon_app_id(role.name),
        "cmd": task_command(role),
        "instances": role.instances,
        "cpus": role.resources.cpus,
        "mem": role.resources.mem_mib,
        "disk": role.resources.disk_mib,
        "container": {
            "type": "DOCKER",
            "docker": {"image": topology.image, "forcePullImage": False},
            "volumes": ([{
                "containerPath": topology.shared.container_path,
                "hostPath": topology.shared.host_path,
                "mode": "RO" if role.shared_read_only else "RW",
            }] if role.mounts_shared else []) + [{
                # A secret directory on every agent (online.deployment.secrets)
                "containerPath": secret.mount_path,
                "hostPath": secret.host_path,
                "mode": "RO",
            } for secret in topology.secrets(role)] + ([{
                # The agent's shared memory over the container's private one: the workers of one agent share
                # a replica there (HostReplica)
                "containerPath": role.host_replica.host_path,
                "hostPath": role.host_replica.host_path,
                "mode": "RW",
            }] if role.host_replica is not None else []),
        },
        "networks": [{"mode": "host"}],
        "portDefinitions": [
            {"port": p.host_port if fixed else p.service_port, "name": p.name, "protocol": "tcp",
             **({"labels": dict(p.labels)} if p.labels else {})}
            for p in role.ports
        ],
        "requirePorts": fixed,
        "env": topology.env(role.name, "marathon"),
        "constraints": [list(c) for c in role.constraints],
        "labels": {**dict(role.labels), "livevec.mem-basis": role.resources.basis},
        "upgradeStrategy": {
            "minimumHealthCapacity": role.upgrade.minimum_health_capacity,
            "maximumOverCapacity": role.upgrade.maximum_over_capacity,
        },
        "backoffSeconds": role.backoff.seconds,
        "backoffFactor": role.backoff.factor,
        "maxLaunchDelaySeconds": role.backoff.max_launch_delay_seconds,
        "taskKillGracePeriodSeconds": role.kill_grace_seconds,
        "killSelection": "YOUNGEST_FIRST",
    }
    if role.health is not None:
        app["healthChecks"] = [_health_check(role, role.health, topology.https(role))]
    if role.readiness is not None:
        app["readinessChecks"] = [{
            "name": "model-loaded",
            "protocol": "HTTPS" if topology.https(role) else "HTTP",
            "path": role.readiness.path,
            "portName": role.readiness.port_name,
            "intervalSeconds": role.readiness.interval_seconds,
            "timeoutSeconds": role.readiness.timeout_seconds,
            "httpStatusCodesForReady": [200],
            "preserveLastResponse": False,
        }]
    if role.unreachable is not None:
        app["unreachableStrategy"] = {
            "inactiveAfterSeconds": role.unreachable.inactive_after_seconds,
            "expungeAfterSeconds": role.unreachable.expunge_after_seconds,
        }
    if role.depends_on:
        app["dependencies"] = [topology.marathon_app_id(d) for d in role.depends_on]
    return app


def render_group(topology: Topology) -> dict:
    return {"id": f"/{topology.group}", "apps": [render_app(topology, r) for r in topology.roles]}


def render_metronome_job(topology: Topology) -> dict:
    """The periodic export. Metronome ids use dots, not slashes; since metronome#389
    ``schedules`` and ``dependencies`` are mutually exclusive, so only schedules."""
    job = topology.export
    attr, value = topology.shared.agent_attribute
    env = topology.cluster_env("marathon")
    return {
        "id": f"{topology.group}.{job.name}",
        "description": "Export the latest complete checkpoint's vectors to the shared file system",
        "labels": {"livevec.role": "export"},
        "run": {
            "cmd": f"exec {job.command}",
            "cpus": job.resources.cpus,
            "mem": job.resources.mem_mib,
            "disk": job.resources.disk_mib,
            "docker": {"image": topology.image, "forcePullImage": False},
            "env": env,
            "volumes": [{"containerPath": topology.shared.container_path,
                         "hostPath": topology.shared.host_path, "mode": "RW"}],
            "placement": {"constraints": [{"attribute": attr, "operator": "IS", "value": value}]},
            "restart": {"policy": "ON_FAILURE", "activeDeadlineSeconds": job.deadline_seconds},
            "maxLaunchDelay": 300,
            "taskKillGracePeriodSeconds": 30,
        },
        "schedules": [{
            "id": "periodic",
            "cron": job.cron,
            "timezone": job.timezone,
            "concurrencyPolicy": "FORBID",
            "startingDeadlineSeconds": 900,
            "enabled": True,
        }],
    }


def to_json(document: dict) -> str:
    return json.dumps(document, indent=2) + "\n"


def render_files(topology: Topology) -> dict[str, str]:
    """File name -> content, as committed under deploy/marathon/."""
    return {
        GROUP_FILE: to_json(render_group(topology)),
        METRONOME_FILE: to_json(render_metronome_job(topology)),
    }
