"""One source of truth: the committed deploy files are exactly what `livevec deploy render`
produces from the topology, and the topology keeps ps-lite's counts consistent."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from online.cli.main import main
from online.deployment import k8s, marathon
from online.deployment.marathon import task_command
from online.deployment.topology import (
    EXPORT_COMMAND,
    SCHEDULER_HOST_PORT,
    default_topology,
    mesos_dns_name,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("target", ["marathon", "k8s"])
def test_committed_files_equal_the_rendering(target, tmp_path):
    assert main(["deploy", "render", "--target", target, "--out", str(tmp_path)]) == 0
    committed = REPO / "deploy" / target
    rendered = {p.name: p.read_text() for p in tmp_path.iterdir()}
    on_disk = {p.name: p.read_text() for p in committed.iterdir() if p.suffix in (".json", ".yaml")}
    assert sorted(rendered) == sorted(on_disk), "files added or removed: re-run livevec deploy render"
    for name, text in rendered.items():
        assert on_disk[name] == text, f"deploy/{target}/{name} drifted: run `livevec deploy render " \
                                      f"--target {target} --out deploy/{target}`"


def test_render_to_stdout(capsys):
    assert main(["deploy", "render", "--target", "marathon", "--servers", "4"]) == 0
    group = json.loads(capsys.readouterr().out)[marathon.GROUP_FILE]
    server = next(a for a in group["apps"] if a["id"] == "/livevec/server")
    assert server["instances"] == 4 and server["env"]["DMLC_NUM_SERVER"] == "4"
    assert main(["deploy", "render", "--target", "marathon", "--servers", "0"]) == 2  # named setting error


@pytest.mark.parametrize("servers,workers", [(1, 1), (2, 2), (7, 3)])
def test_dmlc_counts_follow_instances_everywhere(servers, workers):
    topology = default_topology().with_instances(server=servers, worker=workers)
    apps = {a["id"]: a for a in marathon.render_group(topology)["apps"]}
    for app in apps.values():
        assert app["env"]["DMLC_NUM_SERVER"] == str(apps["/livevec/server"]["instances"]) == str(servers)
        assert app["env"]["DMLC_NUM_WORKER"] == str(apps["/livevec/worker"]["instances"]) == str(workers)
    objects = k8s.render_objects(topology)
    config = next(o for o in objects if o["kind"] == "ConfigMap")["data"]
    sts = next(o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "livevec-server")
    assert config["DMLC_NUM_SERVER"] == str(sts["spec"]["replicas"]) == str(servers)
    scaled = next(o for o in objects if o["kind"] == "ScaledObject")
    assert scaled["spec"]["minReplicaCount"] == workers == int(config["DMLC_NUM_WORKER"])
    # Server memory is re-derived from the shard size.
    assert topology.role("server").resources.mem_mib <= default_topology(servers=1).role("server").resources.mem_mib


def test_topology_refuses_impossible_counts():
    with pytest.raises(ValueError, match="exactly one scheduler"):
        default_topology().with_instances(scheduler=2)
    with pytest.raises(ValueError, match="at least one server"):
        default_topology().with_instances(server=0)
    with pytest.raises(KeyError):
        default_topology().with_instances(servers=3)


@pytest.mark.parametrize("app_id,name", [
    ("/livevec/scheduler", "scheduler-livevec.marathon.mesos"),
    ("/w2v/scheduler", "scheduler-w2v.marathon.mesos"),
    ("/a/b_c/D.e", "d-e-b-c-a.marathon.mesos"),
    ("/" + "x" * 70, "x" * 63 + ".marathon.mesos"),
])
def test_mesos_dns_names(app_id, name):
    assert mesos_dns_name(app_id) == name


def _apps() -> dict[str, dict]:
    group = json.loads((REPO / "deploy" / "marathon" / marathon.GROUP_FILE).read_text())
    return {a["id"].rsplit("/", 1)[-1]: a for a in group["apps"]}


def test_scheduler_app_follows_the_conventions():
    s = _apps()["scheduler"]
    assert s["instances"] == 1 and s["networks"] == [{"mode": "host"}]
    assert s["requirePorts"] is True
    assert s["portDefinitions"] == [{"port": SCHEDULER_HOST_PORT, "name": "ps", "protocol": "tcp"},
                                    {"port": SCHEDULER_HOST_PORT + 1, "name": "metrics", "protocol": "tcp"}]
    assert 'LIVEVEC_METRICS_PORT="$PORT_METRICS"' in s["cmd"]
    assert 31000 <= SCHEDULER_HOST_PORT <= 32000  # plain Mesos agents offer [31000-32000]
    assert s["upgradeStrategy"] == {"minimumHealthCapacity": 0.0, "maximumOverCapacity": 0.0}
    assert s["healthChecks"][0]["protocol"] == "MESOS_TCP"
    assert s["unreachableStrategy"]["inactiveAfterSeconds"] >= 300
    for app in _apps().values():
        assert app["env"]["DMLC_PS_ROOT_URI"] == "scheduler-livevec.marathon.mesos"
        assert app["env"]["DMLC_PS_ROOT_PORT"] == str(SCHEDULER_HOST_PORT)


@pytest.mark.parametrize("role", ["server", "worker"])
def test_servers_and_workers_bind_what_marathon_assigns(role):
    app = _apps()[role]
    assert app["cmd"] == (f'DMLC_NODE_HOST="$HOST" PORT="$PORT_PS" LIVEVEC_METRICS_PORT="$PORT_METRICS" '
                          f"exec livevec {role}")
    assert [(p["name"], p["port"]) for p in app["portDefinitions"]] == [("ps", 0), ("metrics", 0)]
    assert app["requirePorts"] is False
    hc = app["healthChecks"][0]
    assert (hc["protocol"], hc["path"], hc["portIndex"]) == ("MESOS_HTTP", "/health", 1)
    assert hc["gracePeriodSeconds"] >= 120 and hc["maxConsecutiveFailures"] >= 1
    volume = app["container"]["volumes"][0]
    assert volume == {"containerPath": "/mnt/mfs/livevec", "hostPath": "/mnt/mfs/livevec", "mode": "RW"}
    assert ["moosefs", "IS", "true"] in app["constraints"]
    assert app["env"]["LIVEVEC_CHECKPOINT_DIR"].startswith("/mnt/mfs/livevec/")
    assert app["env"]["DMLC_ROLE"] == role
    assert app["dependencies"] == ["/livevec/scheduler"]
    assert app["maxLaunchDelaySeconds"] <= 300
    # Memory is derived from measured baselines and the model size, and says how.
    assert app["mem"] >= 256 and "headroom" in app["labels"]["livevec.mem-basis"]


def test_workers_are_elastic_and_frontend_has_a_readiness_check():
    apps = _apps()
    assert apps["worker"]["env"]["LIVEVEC_ELASTIC_WORKERS"] == "1"
    fe = apps["frontend"]
    assert fe["readinessChecks"][0]["path"] == "/ready"
    assert fe["readinessChecks"][0]["portName"] == "http"
    # It joins the ps-lite cluster as an elastic worker node to read the model.
    assert fe["cmd"] == 'DMLC_NODE_HOST="$HOST" LIVEVEC_HTTP_PORT="$PORT_HTTP" PORT="$PORT_PS" exec livevec frontend'
    assert [p["name"] for p in fe["portDefinitions"]] == ["http", "ps"]
    assert fe["env"]["LIVEVEC_HTTP_HOST"] == "0.0.0.0"
    assert apps["producer-example"]["instances"] == 0


def test_metronome_job_runs_the_export_command():
    job = json.loads((REPO / "deploy" / "marathon" / marathon.METRONOME_FILE).read_text())
    assert job["id"] == "livevec.export-vectors"
    assert job["run"]["cmd"].startswith(f"exec {EXPORT_COMMAND} --out /mnt/mfs/livevec/exports")
    assert job["run"]["placement"]["constraints"] == [{"attribute": "moosefs", "operator": "IS", "value": "true"}]
    assert job["schedules"][0]["concurrencyPolicy"] == "FORBID"


def test_k8s_layout():
    objects = [d for f in sorted((REPO / "deploy" / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())
               if d]
    by = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    for kind, name in [("Namespace", "livevec"), ("ConfigMap", "livevec-config"),
                       ("StatefulSet", "livevec-scheduler"), ("Service", "livevec-scheduler"),
                       ("StatefulSet", "livevec-server"), ("Service", "livevec-server"),
                       ("Deployment", "livevec-worker"), ("ScaledObject", "livevec-worker"),
                       ("Deployment", "livevec-frontend"), ("Service", "livevec-frontend"),
                       ("HorizontalPodAutoscaler", "livevec-frontend"),
                       ("PodDisruptionBudget", "livevec-server"), ("PodDisruptionBudget", "livevec-worker"),
                       ("PodDisruptionBudget", "livevec-frontend"), ("CronJob", "livevec-export-vectors")]:
        assert (kind, name) in by, (kind, name)
    assert not any(o["kind"] == "HorizontalPodAutoscaler" and o["spec"]["scaleTargetRef"]["name"] == "livevec-worker"
                   for o in objects)
    for svc in ("livevec-scheduler", "livevec-server"):
        assert by[("Service", svc)]["spec"]["clusterIP"] == "None"
        assert by[("Service", svc)]["spec"]["publishNotReadyAddresses"] is True
    assert by[("StatefulSet", "livevec-server")]["spec"]["podManagementPolicy"] == "Parallel"
    assert by[("ConfigMap", "livevec-config")]["data"]["DMLC_PS_ROOT_URI"] == \
        "livevec-scheduler-0.livevec-scheduler.livevec.svc.cluster.local"
    server = by[("StatefulSet", "livevec-server")]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "DMLC_NODE_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in server["env"]
    assert server["args"] == ["server"]
    assert "cpu" not in server["resources"]["limits"]
    cron = by[("CronJob", "livevec-export-vectors")]["spec"]
    assert cron["concurrencyPolicy"] == "Forbid"
    assert cron["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"][:2] == ["checkpoint", "export"]


def test_task_command_quotes_every_expansion():
    role = default_topology().role("server")
    assert task_command(role).count('"$') == 3 and task_command(role).endswith("exec livevec server")
