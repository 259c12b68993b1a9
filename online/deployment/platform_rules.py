"""Rules Marathon and Kubernetes enforce (or that make a deployment hang) which no JSON
schema expresses. Each function returns a list of human-readable problems; empty means
the documents pass. The tests run them on the committed files, and on broken copies to
prove each rule can fail; ``livevec deploy check`` runs them for operators.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

from online.deployment.marathon_group import flatten_group
from online.deployment.topology import mesos_dns_name

# Plain Mesos agents offer ports [31000-32000] unless started with --resources=ports:[...]
# (docs/docs/host-port.md); a fixed port outside it is never offered.
MESOS_OFFERED_PORTS = range(31000, 32001)
_DNS_NAME = re.compile(r"(?<![\w.-])[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.marathon\.mesos(?![\w.-])")


def _fixed_ports(app: Mapping) -> list[int]:
    if not app.get("requirePorts"):
        return []
    return [int(d.get("port", 0)) for d in app.get("portDefinitions", [])]


def _port_names(app: Mapping) -> list[str | None]:
    defs = app.get("portDefinitions")
    if defs is None:
        defs = (app.get("container") or {}).get("portMappings", [])
    return [d.get("name") for d in defs]


def marathon_problems(group: Mapping) -> list[str]:
    apps = flatten_group(group)
    problems: list[str] = []
    dns_names = {mesos_dns_name(a["id"]) for a in apps}
    role_totals = {"server": 0, "worker": 0}
    for app in apps:
        role = app.get("env", {}).get("DMLC_ROLE")
        if role in role_totals:
            role_totals[role] += int(app.get("instances", 1))
    for app in apps:
        aid = app["id"]
        modes = [n.get("mode", "container") for n in app.get("networks", [{"mode": "host"}])]
        mappings = (app.get("container") or {}).get("portMappings")
        if "host" in modes:
            if mappings:
                problems.append(f"{aid}: host networking takes portDefinitions, not container.portMappings")
        elif "portDefinitions" in app and app["portDefinitions"]:
            problems.append(f"{aid}: {modes} networking takes container.portMappings, not portDefinitions")
        if app.get("requirePorts"):
            zero = [d for d in app.get("portDefinitions", []) if not d.get("port")]
            if zero or not app.get("portDefinitions"):
                problems.append(f"{aid}: requirePorts with port 0 never launches (marathon#2520)")
        fixed = [p for p in _fixed_ports(app) if p]
        instances = int(app.get("instances", 1))
        if fixed and instances > 1 and ["hostname", "UNIQUE"] not in app.get("constraints", []):
            problems.append(f"{aid}: fixed host port(s) {fixed} with {instances} instances need "
                            f'["hostname","UNIQUE"]')
        if fixed and instances == 1:
            over = (app.get("upgradeStrategy") or {}).get("maximumOverCapacity", 1.0)
            if over != 0:
                problems.append(f"{aid}: a fixed-port singleton needs upgradeStrategy.maximumOverCapacity 0 "
                                f"(the old task holds the port: marathon#3287), got {over}")
        for p in fixed:
            if p not in MESOS_OFFERED_PORTS:
                problems.append(f"{aid}: fixed port {p} is outside the [31000-32000] plain Mesos agents offer")
        names = _port_names(app)
        for rc in app.get("readinessChecks", []):
            if rc.get("portName") not in names:
                problems.append(f"{aid}: readiness check portName {rc.get('portName')!r} names no port "
                                f"(have {names})")
        checks = app.get("healthChecks", [])
        kinds = {hc.get("protocol", "HTTP").startswith("MESOS_") or hc.get("protocol") == "COMMAND"
                 for hc in checks}
        if len(kinds) > 1:
            problems.append(f"{aid}: Mesos and Marathon health checks cannot be mixed on one app")
        for hc in checks:
            idx = hc.get("portIndex", 0)
            if hc.get("protocol") != "COMMAND" and "port" not in hc and idx >= len(names):
                problems.append(f"{aid}: health check portIndex {idx} is out of range ({len(names)} ports)")
        if "maxLaunchDelaySeconds" not in app:
            problems.append(f"{aid}: set maxLaunchDelaySeconds explicitly (marathon#1456: a 1 h default)")
        env = app.get("env", {})
        for var, role in (("DMLC_NUM_SERVER", "server"), ("DMLC_NUM_WORKER", "worker")):
            if var in env and env[var] != str(role_totals[role]):
                problems.append(f"{aid}: {var}={env[var]} but the group runs {role_totals[role]} {role} "
                                f"instance(s); ps-lite rendezvous would never complete")
        for key, value in env.items():
            for name in _DNS_NAME.findall(value) if isinstance(value, str) else []:
                if name not in dns_names:
                    problems.append(f"{aid}: env {key} names {name}, which no app of the group publishes")
        problems += _host_replica_volume_problems(app)
        cmd = app.get("cmd", "")
        if cmd and "exec " not in cmd:
            problems.append(f"{aid}: cmd should `exec` the program so SIGTERM reaches it, not /bin/sh")
    return problems


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _host_replica_volume_problems(app: Mapping) -> list[str]:
    """A containerised task's /dev/shm is its own (64 MB on Docker): the workers of an agent share a host
    replica only through a directory of the agent mounted read-write."""
    path = app.get("env", {}).get("LIVEVEC_HOST_REPLICA")
    if not path or not isinstance(path, str) or not app.get("container"):
        return []
    volumes = [v for v in app["container"].get("volumes", []) if v.get("hostPath")
               and _under(path, v.get("containerPath", "")) and v.get("mode", "RW") == "RW"]
    if volumes:
        return []
    return [f"{app['id']}: LIVEVEC_HOST_REPLICA={path} is on no read-write host volume; the container's own "
            f"directory is private to it, so the agent's workers would not share a replica"]


def metronome_problems(job: Mapping) -> list[str]:
    problems = []
    jid = job.get("id", "?")
    if "/" in jid:
        problems.append(f"{jid}: Metronome job ids use dots, not slashes")
    if job.get("schedules") and job.get("dependencies"):
        problems.append(f"{jid}: schedules and dependencies are mutually exclusive (metronome#389)")
    for sched in job.get("schedules", []):
        if len(str(sched.get("cron", "")).split()) != 5:
            problems.append(f"{jid}: schedule {sched.get('id')} cron must have 5 fields")
    return problems


def _index(objects: Iterable[Mapping]) -> dict[tuple[str, str], Mapping]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def _selects(selector: Mapping, labels: Mapping) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def k8s_problems(objects: list[Mapping]) -> list[str]:
    problems: list[str] = []
    by_key = _index(objects)
    workloads = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]
    configmaps = {o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"}
    claims = {o["metadata"]["name"] for o in objects if o["kind"] == "PersistentVolumeClaim"}
    claim_modes = {o["metadata"]["name"]: o.get("spec", {}).get("accessModes") or []
                   for o in objects if o["kind"] == "PersistentVolumeClaim"}
    claim_users: dict[str, set[str]] = {}

    def pod_specs():
        for o in workloads:
            yield o, o["spec"]["template"]
        for o in objects:
            if o["kind"] == "CronJob":
                yield o, o["spec"]["jobTemplate"]["spec"]["template"]

    for o in workloads:
        name = f"{o['kind']}/{o['metadata']['name']}"
        selector = o["spec"]["selector"].get("matchLabels", {})
        if not _selects(selector, o["spec"]["template"]["metadata"].get("labels", {})):
            problems.append(f"{name}: selector {selector} does not match the pod template labels")
        if o["kind"] == "StatefulSet":
            svc = by_key.get(("Service", o["spec"].get("serviceName", "")))
            if svc is None or svc["spec"].get("clusterIP") != "None":
                problems.append(f"{name}: serviceName {o['spec'].get('serviceName')!r} is not a headless Service")
    for owner, template in pod_specs():
        name = f"{owner['kind']}/{owner['metadata']['name']}"
        for c in template["spec"]["containers"]:
            ports = {p.get("name") for p in c.get("ports", [])}
            for probe_name in ("startupProbe", "livenessProbe", "readinessProbe"):
                probe = c.get(probe_name) or {}
                action = probe.get("httpGet") or probe.get("tcpSocket") or {}
                port = action.get("port")
                if isinstance(port, str) and port not in ports:
                    problems.append(f"{name}: {probe_name} uses port {port!r}, which the container does not name")
            for ref in c.get("envFrom", []):
                cm = (ref.get("configMapRef") or {}).get("name")
                if cm is not None and cm not in configmaps:
                    problems.append(f"{name}: envFrom ConfigMap {cm!r} is not defined")
        for vol in template["spec"].get("volumes", []):
            claim = (vol.get("persistentVolumeClaim") or {}).get("claimName")
            if claim is not None and claim not in claims:
                problems.append(f"{name}: volume claim {claim!r} is not defined")
            if claim is not None:
                claim_users.setdefault(claim, set()).add(name)
        problems += _pod_problems(name, template["spec"])
        problems += _pod_security_problems(name, template["spec"], _pod_security_level(objects, owner))
    # the shared checkpoint volume: every role mounts it from its own node, which only ReadWriteMany allows
    for claim, users in sorted(claim_users.items()):
        if len(users) > 1 and claim in claim_modes and "ReadWriteMany" not in claim_modes[claim]:
            problems.append(f"PersistentVolumeClaim/{claim}: mounted by {len(users)} workloads on different nodes "
                            f"but not ReadWriteMany ({', '.join(claim_modes[claim]) or 'no accessModes'})")
    for o in objects:
        name = f"{o['kind']}/{o['metadata']['name']}"
        if o["kind"] == "PodDisruptionBudget":
            sel = o["spec"]["selector"].get("matchLabels", {})
            if not any(_selects(sel, w["spec"]["template"]["metadata"].get("labels", {})) for w in workloads):
                problems.append(f"{name}: selects no workload")
        if o["kind"] == "Service":
            sel = o["spec"].get("selector", {})
            targets = [w for w in workloads if _selects(sel, w["spec"]["template"]["metadata"].get("labels", {}))]
            if not targets:
                problems.append(f"{name}: selects no workload")
            for p in o["spec"].get("ports", []):
                tp = p.get("targetPort")
                if isinstance(tp, str) and not any(
                        tp in {cp.get("name") for c in w["spec"]["template"]["spec"]["containers"]
                               for cp in c.get("ports", [])} for w in targets):
                    problems.append(f"{name}: targetPort {tp!r} is not a named container port")
        if o["kind"] in ("HorizontalPodAutoscaler", "ScaledObject"):
            ref = o["spec"]["scaleTargetRef"]
            if (ref.get("kind", "Deployment"), ref["name"]) not in by_key:
                problems.append(f"{name}: scales {ref.get('kind', 'Deployment')}/{ref['name']}, which is not defined")
    scaled = {o["spec"]["scaleTargetRef"]["name"] for o in objects if o["kind"] == "ScaledObject"}
    for o in objects:
        if o["kind"] == "HorizontalPodAutoscaler" and o["spec"]["scaleTargetRef"]["name"] in scaled:
            problems.append(f"HorizontalPodAutoscaler/{o['metadata']['name']}: KEDA already creates an HPA "
                            f"for {o['spec']['scaleTargetRef']['name']}; two autoscalers fight")
    problems += _ps_lite_consistency(objects, configmaps)
    return problems


_MIB = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 ** 2}


def _mib(quantity: str | None) -> float | None:
    """A binary-suffixed Kubernetes quantity in MiB (None: not one of those)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti)", str(quantity or ""))
    return float(match.group(1)) * _MIB[match.group(2)] if match else None


def _pod_problems(name: str, spec: Mapping) -> list[str]:
    """What the containers of one pod share: its network namespace (so no port twice) and its
    memory-backed volumes (charged to the memory of the container that writes them)."""
    problems = []
    owners: dict[int, str] = {}
    for c in spec["containers"]:
        for p in c.get("ports", []):
            port = p.get("containerPort")
            if port in owners:
                problems.append(f"{name}: containerPort {port} is declared by containers {owners[port]} and "
                                f"{c['name']}, which share the pod's network: one of them cannot bind it")
            owners.setdefault(port, c["name"])
    memory = {v["name"]: v["emptyDir"] for v in spec.get("volumes", [])
              if (v.get("emptyDir") or {}).get("medium") == "Memory"}
    for vol, empty_dir in memory.items():
        if _mib(empty_dir.get("sizeLimit")) is None:
            problems.append(f"{name}: memory-backed emptyDir {vol!r} needs a sizeLimit (else it may grow to "
                            f"the node's memory)")
    for c in spec["containers"]:
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        limit = _mib((c.get("resources") or {}).get("limits", {}).get("memory"))
        for path, vol in mounts.items():
            size = _mib(memory.get(vol, {}).get("sizeLimit"))
            if size is not None and (limit is None or limit < size):
                problems.append(f"{name}: container {c['name']} mounts memory-backed {vol!r} ({size:.0f} MiB), "
                                f"which its memory limit ({limit} MiB) must hold")
        env = {e.get("name"): e.get("value") for e in c.get("env", [])}
        replica = env.get("LIVEVEC_HOST_REPLICA")
        if replica and not any(_under(replica, path) and vol in memory for path, vol in mounts.items()):
            problems.append(f"{name}: container {c['name']} has LIVEVEC_HOST_REPLICA={replica}, where no "
                            f"memory-backed emptyDir is mounted: its containers would not share a replica there")
    return problems


# Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards): what each level forbids
# that these pods could plausibly use.
_RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret"}


def _pod_security_level(objects: list[Mapping], owner: Mapping) -> str:
    ns = owner["metadata"].get("namespace", "default")
    for o in objects:
        if o["kind"] == "Namespace" and o["metadata"]["name"] == ns:
            return (o["metadata"].get("labels") or {}).get("pod-security.kubernetes.io/enforce", "privileged")
    return "privileged"


def _pod_security_problems(name: str, spec: Mapping, level: str) -> list[str]:
    if level not in ("baseline", "restricted"):
        return []
    problems = []
    for vol in spec.get("volumes", []):
        kind = next((k for k in vol if k != "name"), None)
        if kind == "hostPath" or (level == "restricted" and kind not in _RESTRICTED_VOLUMES):
            problems.append(f"{name}: volume {vol['name']!r} ({kind}) is forbidden by the namespace's Pod "
                            f"Security level {level!r}")
    if level == "restricted":
        pod = spec.get("securityContext") or {}
        for c in spec["containers"]:
            ctx = c.get("securityContext") or {}
            if not ctx.get("runAsNonRoot", pod.get("runAsNonRoot")):
                problems.append(f"{name}: container {c['name']} must set runAsNonRoot (Pod Security restricted)")
            if ctx.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{name}: container {c['name']} must set allowPrivilegeEscalation false "
                                f"(Pod Security restricted)")
            if "ALL" not in (ctx.get("capabilities") or {}).get("drop", []):
                problems.append(f"{name}: container {c['name']} must drop ALL capabilities (Pod Security restricted)")
            seccomp = (ctx.get("seccompProfile") or pod.get("seccompProfile") or {}).get("type")
            if seccomp not in ("RuntimeDefault", "Localhost"):
                problems.append(f"{name}: container {c['name']} needs a RuntimeDefault seccomp profile "
                                f"(Pod Security restricted)")
    return problems


def _roles_of(workload: Mapping) -> list[str | None]:
    """Each container's DMLC_ROLE: a pod may run several nodes of one role (the workers)."""
    roles = []
    for c in workload["spec"]["template"]["spec"]["containers"]:
        roles.append(next((e.get("value") for e in c.get("env", []) if e.get("name") == "DMLC_ROLE"), None))
    return roles


def _role_of(workload: Mapping) -> str | None:
    return next((r for r in _roles_of(workload) if r), None)


def _nodes(workload: Mapping, role: str, replicas: int | None = None) -> int:
    """The ps-lite nodes of ``role`` that ``replicas`` pods of the workload run (default: its replicas)."""
    per_pod = _roles_of(workload).count(role)
    return per_pod * int(workload["spec"].get("replicas", 1) if replicas is None else replicas)


def _ps_lite_consistency(objects: list[Mapping], configmaps: Mapping[str, Mapping]) -> list[str]:
    problems = []
    workloads = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]
    by_role: dict[str, list[Mapping]] = {}
    for w in workloads:
        by_role.setdefault(_role_of(w) or "", []).append(w)
    for cm_name, data in configmaps.items():
        for var, role in (("DMLC_NUM_SERVER", "server"), ("DMLC_NUM_WORKER", "worker")):
            if var not in data:
                continue
            nodes = sum(_nodes(w, role) for w in by_role.get(role, []))
            if data[var] != str(nodes):
                problems.append(f"ConfigMap/{cm_name}: {var}={data[var]} but the {role} workloads run {nodes}")
            if role == "worker":
                for so in (o for o in objects if o["kind"] == "ScaledObject"):
                    for w in by_role.get("worker", []):
                        if w["metadata"]["name"] != so["spec"]["scaleTargetRef"]["name"]:
                            continue
                        least = _nodes(w, role, int(so["spec"].get("minReplicaCount", 0)))
                        if least < int(data[var]):
                            problems.append(f"ScaledObject/{so['metadata']['name']}: minReplicaCount below "
                                            f"{var}={data[var]} ({least} workers) would starve the ps-lite "
                                            f"rendezvous")
        uri = data.get("DMLC_PS_ROOT_URI")
        if uri is None:
            continue
        schedulers = [w for w in by_role.get("scheduler", []) if w["kind"] == "StatefulSet"]
        if len(schedulers) != 1:
            problems.append(f"ConfigMap/{cm_name}: expected one scheduler StatefulSet, found {len(schedulers)}")
            continue
        sts = schedulers[0]
        ns = sts["metadata"].get("namespace", "default")
        expected = f"{sts['metadata']['name']}-0.{sts['spec']['serviceName']}.{ns}.svc"
        if not (uri == expected or uri.startswith(expected + ".")):
            problems.append(f"ConfigMap/{cm_name}: DMLC_PS_ROOT_URI={uri} is not the scheduler pod's stable "
                            f"name {expected}[.<cluster domain>]")
        ports = [p["containerPort"] for c in sts["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]
        if data.get("DMLC_PS_ROOT_PORT") not in {str(p) for p in ports}:
            problems.append(f"ConfigMap/{cm_name}: DMLC_PS_ROOT_PORT={data.get('DMLC_PS_ROOT_PORT')} is not a "
                            f"scheduler container port {ports}")
    return problems


def check_files(target: str, files: Mapping[str, str]) -> list[str]:
    """Parse rendered files (name -> text) and run the rules for ``target``."""
    if target == "marathon":
        problems = []
        for name, text in files.items():
            doc = json.loads(text)
            found = metronome_problems(doc) if "run" in doc else marathon_problems(doc)
            problems += [f"{name}: {p}" for p in found]
        return problems
    import yaml

    objects = [doc for text in files.values() for doc in yaml.safe_load_all(text) if doc]
    return k8s_problems(objects)
