"""The rendered deploy files validate against the official schemas in ../shared/schemas.

These are the only deployment tests that skip when ../shared is absent (the schemas are
third-party files the repository must not copy); CI always has them.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from urllib.parse import urljoin

import jsonschema
import pytest
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4, DRAFT202012

from online.deployment import k8s, marathon
from online.deployment.topology import default_topology

REPO = Path(__file__).resolve().parents[1]
SCHEMAS = REPO.parent / "shared" / "schemas"
pytestmark = pytest.mark.skipif(not SCHEMAS.is_dir(), reason="../shared/schemas is not present")

K8S_DIR = SCHEMAS / "kubernetes" / "v1.31.0-local-strict"
K8S_SCHEMA_FILES = {
    ("v1", "Namespace"): "namespace-v1.json",
    ("v1", "ConfigMap"): "configmap-v1.json",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaim-v1.json",
    ("v1", "Service"): "service-v1.json",
    ("apps/v1", "StatefulSet"): "statefulset-apps-v1.json",
    ("apps/v1", "Deployment"): "deployment-apps-v1.json",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudget-policy-v1.json",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "horizontalpodautoscaler-autoscaling-v2.json",
    ("batch/v1", "CronJob"): "cronjob-batch-v1.json",
}
COMMITTED = REPO / "deploy"


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def marathon_validators():
    app_schema = _load(SCHEMAS / "marathon" / "AppDefinition.json")
    group_schema = _load(SCHEMAS / "marathon" / "Group.json")
    app_uri = urljoin(group_schema["id"], "./AppDefinition.json")
    registry = Registry().with_resource(app_uri, Resource.from_contents(app_schema, default_specification=DRAFT4))
    return (jsonschema.Draft4Validator(group_schema, registry=registry),
            jsonschema.Draft4Validator(app_schema))


@pytest.fixture(scope="module")
def metronome_validator():
    return jsonschema.Draft4Validator(_load(SCHEMAS / "metronome" / "jobspec.schema.json"))


@pytest.fixture(scope="module")
def k8s_validators():
    definitions = _load(K8S_DIR / "_definitions.json")
    registry = Registry().with_resource(
        definitions["$id"], Resource.from_contents(definitions, default_specification=DRAFT202012))
    validators = {key: jsonschema.Draft202012Validator(_load(K8S_DIR / name), registry=registry)
                  for key, name in K8S_SCHEMA_FILES.items()}
    keda = _load(SCHEMAS / "kubernetes" / "crds" / "keda.sh_scaledobject_v1alpha1.json")
    # The CRDs-catalog schemas carry no $schema; they are written for draft-07.
    validators[("keda.sh/v1alpha1", "ScaledObject")] = jsonschema.Draft7Validator(keda)
    return validators


def _errors(validator, doc) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def _committed_k8s_objects() -> list[dict]:
    return [d for f in sorted((COMMITTED / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def test_committed_marathon_group_and_each_app_validate(marathon_validators):
    group_validator, app_validator = marathon_validators
    group = _load(COMMITTED / "marathon" / marathon.GROUP_FILE)
    assert _errors(group_validator, group) == []
    assert {a["id"] for a in group["apps"]} >= {"/livevec/scheduler", "/livevec/server", "/livevec/worker",
                                                 "/livevec/frontend"}
    for app in group["apps"]:
        assert _errors(app_validator, app) == [], app["id"]


def test_marathon_schema_rejects_what_marathon_rejects(marathon_validators):
    """The validator is live: unknown keys, cmd with args and non-string env fail."""
    group_validator, app_validator = marathon_validators
    app = copy.deepcopy(marathon.render_group(default_topology())["apps"][1])
    for mutate in (lambda a: a.update(args=["server"]),
                   lambda a: a.update(healthcheck={}),
                   lambda a: a["env"].update(DMLC_NUM_SERVER=2),
                   lambda a: a.update(id="/livevec/Server"),
                   lambda a: a["constraints"].append(["hostname", "SPREAD"])):
        broken = copy.deepcopy(app)
        mutate(broken)
        assert _errors(app_validator, broken), broken
        assert _errors(group_validator, {"id": "/livevec", "apps": [broken]})


def test_committed_metronome_job_validates(metronome_validator):
    job = _load(COMMITTED / "marathon" / marathon.METRONOME_FILE)
    assert _errors(metronome_validator, job) == []
    broken = copy.deepcopy(job)
    broken["run"]["restart"]["policy"] = "ALWAYS"
    assert _errors(metronome_validator, broken)


def test_committed_k8s_objects_validate(k8s_validators):
    objects = _committed_k8s_objects()
    kinds = [o["kind"] for o in objects]
    for kind in ("ConfigMap", "StatefulSet", "Deployment", "ScaledObject", "HorizontalPodAutoscaler",
                 "PodDisruptionBudget", "CronJob", "Service"):
        assert kind in kinds
    for obj in objects:
        validator = k8s_validators[(obj["apiVersion"], obj["kind"])]
        assert _errors(validator, obj) == [], f"{obj['kind']}/{obj['metadata']['name']}"


def test_k8s_schemas_reject_misspelled_and_misplaced_fields(k8s_validators):
    objects = k8s.render_objects(default_topology())
    sts = next(o for o in objects if o["kind"] == "StatefulSet")
    broken = copy.deepcopy(sts)
    container = broken["spec"]["template"]["spec"]["containers"][0]
    container["readinessprobe"] = container.pop("readinessProbe")
    assert _errors(k8s_validators[("apps/v1", "StatefulSet")], broken)
    scaled = copy.deepcopy(next(o for o in objects if o["kind"] == "ScaledObject"))
    scaled["spec"]["maxReplicas"] = 4  # HPA vocabulary in a ScaledObject
    assert _errors(k8s_validators[("keda.sh/v1alpha1", "ScaledObject")], scaled)


def test_k8s_schemas_check_the_worker_pods_shared_memory(k8s_validators):
    """The strict schema sees the new fields: a misspelled emptyDir field or a mount of no name fails."""
    validator = k8s_validators[("apps/v1", "Deployment")]
    worker = next(o for o in k8s.render_objects(default_topology())
                  if o["kind"] == "Deployment" and o["metadata"]["name"] == "livevec-worker")
    assert _errors(validator, worker) == []
    broken = copy.deepcopy(worker)
    volume = next(v for v in broken["spec"]["template"]["spec"]["volumes"] if v["name"] == "host-replica")
    volume["emptyDir"]["sizelimit"] = volume["emptyDir"].pop("sizeLimit")
    assert _errors(validator, broken)
    broken = copy.deepcopy(worker)
    del broken["spec"]["template"]["spec"]["containers"][1]["volumeMounts"][-1]["name"]
    assert _errors(validator, broken)


@pytest.mark.parametrize("servers,workers,per_pod", [(1, 1, 2), (5, 12, 2), (2, 3, 1), (2, 8, 4), (1, 5, 8)])
def test_other_topologies_render_valid_documents(marathon_validators, metronome_validator, k8s_validators,
                                                 servers, workers, per_pod):
    topology = default_topology(servers=servers, workers=workers, frontends=1, workers_per_pod=per_pod)
    group_validator, _ = marathon_validators
    assert _errors(group_validator, marathon.render_group(topology)) == []
    assert _errors(metronome_validator, marathon.render_metronome_job(topology)) == []
    for obj in k8s.render_objects(topology):
        assert _errors(k8s_validators[(obj["apiVersion"], obj["kind"])], obj) == []


def test_the_secured_render_validates_on_both_platforms(marathon_validators, k8s_validators):
    """``--secure all`` adds secret volumes, mounts, variables and HTTPS probes: still valid objects."""
    from online.deployment.secrets import parse_secure

    secured = default_topology().with_secure(parse_secure("all"))
    group_validator, app_validator = marathon_validators
    group = marathon.render_group(secured)
    assert _errors(group_validator, group) == []
    for app in group["apps"]:
        assert _errors(app_validator, app) == [], app["id"]
    objects = k8s.render_objects(secured)
    assert any(v.get("secret", {}).get("secretName") == "livevec-ps-curve"
               for o in objects if o["kind"] in ("Deployment", "StatefulSet")
               for v in o["spec"]["template"]["spec"]["volumes"])
    for obj in objects:
        validator = k8s_validators[(obj["apiVersion"], obj["kind"])]
        assert _errors(validator, obj) == [], f"{obj['kind']}/{obj['metadata']['name']}"
