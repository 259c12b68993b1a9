"""The platform rules no schema expresses (../shared/schemas/README.md, deploy-notes §3/§5):
the committed files pass them, and each rule fires on a file broken in that one way."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from online.cli.main import main
from online.deployment.marathon import GROUP_FILE, METRONOME_FILE
from online.deployment.platform_rules import k8s_problems, marathon_problems, metronome_problems

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
    "targetPort 'web'":
        lambda o: _obj(o, "Service", "livevec-frontend")["spec"]["ports"][0].update(targetPort="web"),
}


@pytest.mark.parametrize("expected", sorted(K8S_BREAKAGES))
def test_each_k8s_rule_fires(expected):
    objects = copy.deepcopy(_objects())
    K8S_BREAKAGES[expected](objects)
    problems = k8s_problems(objects)
    assert any(expected in p for p in problems), problems
