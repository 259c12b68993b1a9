"""The platform rules no schema expresses (../shared/schemas/README.md, deploy-notes §3/§5):
the committed files pass them, and each rule fires on a file broken in that one way."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from online.cli.main import main
from online.deployment.k8s import render_objects
from online.deployment.marathon import GROUP_FILE, METRONOME_FILE, render_group
from online.deployment.platform_rules import k8s_problems, marathon_problems, metronome_problems
from online.deployment.topology import default_topology

REPO = Path(__file__).resolve().parents[1]


def _group() -> dict:
    return json.loads((REPO / "deploy" / "marathon" / GROUP_FILE).read_text())


def _app(group: dict, name: str) -> dict:
    return next(a for a in group["apps"] if a["id"].endswith("/" + name))


def _objects() -> list[dict]:
    return [d for f in sorted((REPO / "deploy" / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())
            if d]


def _obj(objects: list[dict], kind: str, name: str) -> dict:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def test_committed_files_pass_every_rule(capsys):
    assert marathon_problems(_group()) == []
    assert metronome_problems(json.loads((REPO / "deploy" / "marathon" / METRONOME_FILE).read_text())) == []
    assert k8s_problems(_objects()) == []
    assert main(["deploy", "check", "--dir", str(REPO / "deploy" / "marathon"), "--target", "marathon"]) == 0
    assert main(["deploy", "check", "--dir", str(REPO / "deploy" / "k8s"), "--target", "k8s"]) == 0
    assert "0 problem(s)" in capsys.readouterr().out


def _set(app: str, **fields):
    return lambda g: _app(g, app).update(**fields)


MARATHON_BREAKAGES = {
    "host networking takes portDefinitions":
        lambda g: _app(g, "server")["container"].update(portMappings=[{"containerPort": 9092}]),
    "container.portMappings, not portDefinitions": _set("server", networks=[{"mode": "container/bridge"}]),
    "requirePorts with port 0": _set("worker", requirePorts=True),
    'need ["hostname","UNIQUE"]':
        lambda g: (_app(g, "scheduler").update(instances=2, constraints=[]),
                   _app(g, "scheduler")["upgradeStrategy"].update(maximumOverCapacity=0.0)),
    "maximumOverCapacity 0": lambda g: _app(g, "scheduler")["upgradeStrategy"].update(maximumOverCapacity=1.0),
    "outside the [31000-32000]": lambda g: _app(g, "scheduler")["portDefinitions"][0].update(port=9091),
    "names no port": lambda g: _app(g, "frontend")["readinessChecks"][0].update(portName="web"),
    "DMLC_NUM_SERVER=2 but the group runs 3": _set("server", instances=3),
    "DMLC_NUM_WORKER=2 but the group runs 1": _set("worker", instances=1),
    "which no app of the group publishes":
        lambda g: _app(g, "worker")["env"].update(DMLC_PS_ROOT_URI="livevec-scheduler.marathon.mesos"),
    "portIndex 2 is out of range": lambda g: _app(g, "server")["healthChecks"][0].update(portIndex=2),
    "cannot be mixed": lambda g: _app(g, "server")["healthChecks"].append({"protocol": "HTTP", "portIndex": 1}),
    "maxLaunchDelaySeconds explicitly": lambda g: _app(g, "worker").pop("maxLaunchDelaySeconds"),
    "`exec` the program": _set("server", cmd="livevec server"),
    # without the agent's /dev/shm mounted, each worker's container has its own
    "LIVEVEC_HOST_REPLICA=/dev/shm is on no read-write host volume":
        lambda g: _app(g, "worker")["container"].update(volumes=[
            v for v in _app(g, "worker")["container"]["volumes"] if v["containerPath"] != "/dev/shm"]),
    "LIVEVEC_HOST_REPLICA=/dev/shm/x is on no read-write host volume": lambda g: (
        _app(g, "worker")["env"].update(LIVEVEC_HOST_REPLICA="/dev/shm/x"),
        next(v for v in _app(g, "worker")["container"]["volumes"] if v["containerPath"] == "/dev/shm").update(
            mode="RO")),
}


@pytest.mark.parametrize("expected", sorted(MARATHON_BREAKAGES))
def test_each_marathon_rule_fires(expected):
    group = _group()
    MARATHON_BREAKAGES[expected](group)
    problems = marathon_problems(group)
    assert any(expected in p for p in problems), problems


def test_metronome_rules_fire():
    job = json.loads((REPO / "deploy" / "marathon" / METRONOME_FILE).read_text())
    broken = copy.deepcopy(job)
    broken["id"] = "livevec/export"
    broken["dependencies"] = [{"id": "livevec.other"}]
    broken["schedules"][0]["cron"] = "hourly"
    problems = metronome_problems(broken)
    assert len(problems) == 3, problems


K8S_BREAKAGES = {
    "does not match the pod template labels":
        lambda o: _obj(o, "Deployment", "livevec-worker")["spec"]["selector"]["matchLabels"].update(
            {"app.kubernetes.io/component": "workers"}),
    "is not a headless Service":
        lambda o: _obj(o, "Service", "livevec-server")["spec"].pop("clusterIP"),
    "which the container does not name":
        lambda o: _obj(o, "StatefulSet", "livevec-server")["spec"]["template"]["spec"]["containers"][0][
            "livenessProbe"]["httpGet"].update(port="health"),
    "PodDisruptionBudget/livevec-frontend: selects no workload":
        lambda o: _obj(o, "PodDisruptionBudget", "livevec-frontend")["spec"]["selector"]["matchLabels"].update(
            {"app.kubernetes.io/component": "ui"}),
    "DMLC_NUM_SERVER=2 but the server workloads run 3":
        lambda o: _obj(o, "StatefulSet", "livevec-server")["spec"].update(replicas=3),
    "minReplicaCount below":
        lambda o: _obj(o, "ScaledObject", "livevec-worker")["spec"].update(minReplicaCount=0),
    "not the scheduler pod's stable name":
        lambda o: _obj(o, "ConfigMap", "livevec-config")["data"].update(DMLC_PS_ROOT_URI="livevec-scheduler"),
    "is not a scheduler container port":
        lambda o: _obj(o, "ConfigMap", "livevec-config")["data"].update(DMLC_PS_ROOT_PORT="31091"),
    "two autoscalers fight":
        lambda o: o.append({**copy.deepcopy(_obj(o, "HorizontalPodAutoscaler", "livevec-frontend")),
                            "spec": {**_obj(o, "HorizontalPodAutoscaler", "livevec-frontend")["spec"],
                                     "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                                        "name": "livevec-worker"}}}),
    "envFrom ConfigMap": lambda o: o.remove(_obj(o, "ConfigMap", "livevec-config")),
    "volume claim": lambda o: o.remove(_obj(o, "PersistentVolumeClaim", "livevec-shared")),
    "but not ReadWriteMany (ReadWriteOnce)":
        lambda o: _obj(o, "PersistentVolumeClaim", "livevec-shared")["spec"].update(accessModes=["ReadWriteOnce"]),
    "targetPort 'web'":
        lambda o: _obj(o, "Service", "livevec-frontend")["spec"]["ports"][0].update(targetPort="web"),
    # the worker pod: its containers share one network namespace and one memory volume
    "containerPort 9092 is declared by containers worker-0 and worker-1":
        lambda o: _worker_pod(o)["containers"][1]["ports"][0].update(containerPort=9092),
    "needs a sizeLimit": lambda o: _host_replica_volume(o)["emptyDir"].pop("sizeLimit"),
    "which its memory limit (256.0 MiB) must hold":
        lambda o: _worker_pod(o)["containers"][0]["resources"]["limits"].update(memory="256Mi"),
    "where no memory-backed emptyDir is mounted": lambda o: _host_replica_volume(o)["emptyDir"].pop("medium"),
    "LIVEVEC_HOST_REPLICA=/dev/shm, where no":
        lambda o: next(e for e in _worker_pod(o)["containers"][1]["env"]
                       if e["name"] == "LIVEVEC_HOST_REPLICA").update(value="/dev/shm"),
    "DMLC_NUM_WORKER=2 but the worker workloads run 1":
        lambda o: _worker_pod(o)["containers"].pop(),
    "DMLC_NUM_WORKER=2 but the worker workloads run 4":
        lambda o: _obj(o, "Deployment", "livevec-worker")["spec"].update(replicas=2),
    # Pod Security restricted (the namespace): hostPath, which would be the other way to share memory, and
    # what the level asks of every container
    "volume 'shm' (hostPath) is forbidden":
        lambda o: _worker_pod(o)["volumes"].append({"name": "shm", "hostPath": {"path": "/dev/shm"}}),
    "must drop ALL capabilities":
        lambda o: _worker_pod(o)["containers"][1]["securityContext"].pop("capabilities"),
    "must set allowPrivilegeEscalation false":
        lambda o: _obj(o, "CronJob", "livevec-export-vectors")["spec"]["jobTemplate"]["spec"]["template"]["spec"][
            "containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
}


def _worker_pod(objects: list[dict]) -> dict:
    return _obj(objects, "Deployment", "livevec-worker")["spec"]["template"]["spec"]


def _host_replica_volume(objects: list[dict]) -> dict:
    return next(v for v in _worker_pod(objects)["volumes"] if v["name"] == "host-replica")


@pytest.mark.parametrize("expected", sorted(K8S_BREAKAGES))
def test_each_k8s_rule_fires(expected):
    objects = copy.deepcopy(_objects())
    K8S_BREAKAGES[expected](objects)
    problems = k8s_problems(objects)
    assert any(expected in p for p in problems), problems


def test_pod_security_applies_only_where_the_namespace_enforces_it():
    objects = copy.deepcopy(_objects())
    _worker_pod(objects)["volumes"].append({"name": "shm", "hostPath": {"path": "/dev/shm"}})
    labels = _obj(objects, "Namespace", "livevec")["metadata"]["labels"]
    labels["pod-security.kubernetes.io/enforce"] = "baseline"
    assert any("forbidden" in p for p in k8s_problems(objects))
    labels["pod-security.kubernetes.io/enforce"] = "privileged"
    assert not any("forbidden" in p for p in k8s_problems(objects))


@pytest.mark.parametrize("servers,workers,per_pod", [(1, 1, 1), (1, 1, 2), (3, 7, 2), (2, 8, 4), (2, 5, 8)])
def test_other_topologies_pass_every_rule(servers, workers, per_pod):
    topology = default_topology(servers=servers, workers=workers, frontends=1, workers_per_pod=per_pod)
    assert marathon_problems(render_group(topology)) == []
    assert k8s_problems(render_objects(topology)) == []
