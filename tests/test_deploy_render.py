"""One source of truth: the committed deploy files are exactly what `livevec deploy render`
produces from the topology, and the topology keeps ps-lite's counts consistent."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from online.cli.main import main
from online.cluster.host_replica import HostSegment
from online.cluster.replica import HOST_REPLICA_ROWS
from online.deployment import k8s, marathon
from online.deployment.marathon import task_command
from online.deployment.sizing import Capacity, host_replica_bytes, size_resources
from online.deployment.topology import (
    EXPORT_COMMAND,
    SCHEDULER_HOST_PORT,
    default_topology,
    mesos_dns_name,
)
from online.learner.settings import MODEL

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
    # Kubernetes runs whole pods of workers_per_pod workers: the count is rounded up, and the ConfigMap says so.
    per_pod = topology.role("worker").per_pod
    pods = -(-workers // per_pod)
    deployment = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "livevec-worker")
    assert deployment["spec"]["replicas"] == pods
    assert len(deployment["spec"]["template"]["spec"]["containers"]) == per_pod
    assert int(config["DMLC_NUM_WORKER"]) == pods * per_pod >= workers
    scaled = next(o for o in objects if o["kind"] == "ScaledObject")
    assert scaled["spec"]["minReplicaCount"] == pods
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


# ----------------------------------------------------------------------------- the host replica

def _k8s_objects(topology) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in k8s.render_objects(topology)}


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _mib(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity[:-2])


@pytest.mark.parametrize("dim,rows,optimizer", [(100, 400_000, "rowadagrad"), (24, 20_000, "rowadagrad"),
                                                (32, 3, "sgd"), (7, 1234, "adagrad"), (1, 1, "rowadagrad")])
def test_the_sized_segment_is_the_one_the_workers_reserve(dim, rows, optimizer, tmp_path):
    """The renderer sizes the segment without numba; the size is that of the file a worker really reserves."""
    accum = {"sgd": 0, "rowadagrad": 1, "adagrad": dim}[optimizer]
    path = Path("/dev/shm") / f"livevec-test-sizing-{tmp_path.name}"
    try:
        HostSegment(path, dim=dim, rows=rows, optimizer=optimizer, seed=1)
        assert host_replica_bytes(dim, rows, accum) == path.stat().st_size
    finally:
        for f in Path("/dev/shm").glob(path.name + "*"):
            f.unlink(missing_ok=True)


def test_both_platforms_run_the_replica_exchange_with_a_host_replica():
    topology = default_topology()
    for platform in ("marathon", "k8s"):
        assert topology.cluster_env(platform)["LIVEVEC_EXCHANGE"] == "replica"
    group = marathon.render_group(topology)
    assert all(a["env"]["LIVEVEC_EXCHANGE"] == "replica" for a in group["apps"])
    config = _k8s_objects(topology)[("ConfigMap", "livevec-config")]["data"]
    assert config["LIVEVEC_EXCHANGE"] == "replica" and "LIVEVEC_HOST_REPLICA" not in config  # workers only
    # Only workers train a replica; the front end is a ps-lite worker node too, but reads rows only.
    apps = {a["id"].rsplit("/", 1)[-1]: a for a in group["apps"]}
    assert [n for n, a in apps.items() if "LIVEVEC_HOST_REPLICA" in a["env"]] == ["worker"]


def test_marathon_workers_of_one_agent_share_its_shared_memory():
    worker = _apps()["worker"]
    # A Docker container's /dev/shm is its own (64 MB): the agent's is mounted over it.
    assert worker["container"]["type"] == "DOCKER"
    assert {"containerPath": "/dev/shm", "hostPath": "/dev/shm", "mode": "RW"} in worker["container"]["volumes"]
    assert worker["env"]["LIVEVEC_HOST_REPLICA"] == "/dev/shm"
    # the file is named by $HOST, the agent: the same for the (at most two) workers there
    assert 'DMLC_NODE_HOST="$HOST"' in worker["cmd"] and ["hostname", "MAX_PER", "2"] in worker["constraints"]
    for name, app in _apps().items():
        if name != "worker":
            assert all(v["containerPath"] != "/dev/shm" for v in app["container"]["volumes"]), name


def test_worker_memory_holds_the_segment_once_per_process_and_a_pod_requests_it_once():
    capacity = Capacity()
    rows = 2 * capacity.worker_vocab_words
    segment_mib = host_replica_bytes(capacity.dim, rows, 1) / 2**20
    assert MODEL["optimizer"].default == "rowadagrad"   # one accumulator per row: accum width 1
    assert HOST_REPLICA_ROWS.default == 0               # 0: twice LIVEVEC_VOCAB_CAPACITY, which the files set
    worker = _apps()["worker"]
    assert "LIVEVEC_HOST_REPLICA_ROWS" not in worker["env"]
    assert worker["env"]["LIVEVEC_VOCAB_CAPACITY"] == str(rows // 2)
    resources = size_resources("worker", capacity, servers=2)
    # a process's own memory: baseline, working set and vocabulary, with headroom (the segment has none: its
    # size is fixed when it is made)
    needed = (capacity.baseline_mib["worker"] + capacity.worker_working_set_mib
              + capacity.worker_vocab_words * capacity.worker_vocab_entry_bytes / 2**20) * capacity.headroom
    own = resources.mem_mib - resources.shared_mib
    assert resources.shared_mib == math.ceil(segment_mib) and own >= needed
    assert worker["mem"] == resources.mem_mib and f"{segment_mib:.0f} MiB" in worker["labels"]["livevec.mem-basis"]
    # Without the replica's 2x growth and one copy per process, a worker needs less than before (1664 MiB).
    assert worker["mem"] < 1664
    for per_pod in (1, 2, 4):
        pod = _k8s_objects(default_topology(workers=4, workers_per_pod=per_pod))[
            ("Deployment", "livevec-worker")]["spec"]["template"]["spec"]
        limits = [_mib(c["resources"]["limits"]["memory"]) for c in pod["containers"]]
        requests = [_mib(c["resources"]["requests"]["memory"]) for c in pod["containers"]]
        # any container may create the segment and be charged for all of it
        assert all(limit == resources.mem_mib >= needed + segment_mib for limit in limits)
        # the pod requests every container's own memory and the segment once
        assert sum(requests) - per_pod * own == pytest.approx(segment_mib, abs=per_pod)
        volume = next(v for v in pod["volumes"] if v["name"] == "host-replica")["emptyDir"]
        assert volume["medium"] == "Memory"
        assert segment_mib < _mib(volume["sizeLimit"]) <= segment_mib + 128 < min(limits)


@pytest.mark.parametrize("per_pod", [1, 2, 3, 4])
def test_a_k8s_worker_pod_runs_workers_that_share_its_replica_on_their_own_ports(per_pod):
    topology = default_topology(workers=2 * per_pod, workers_per_pod=per_pod)
    objects = _k8s_objects(topology)
    pod = objects[("Deployment", "livevec-worker")]["spec"]["template"]["spec"]
    containers = pod["containers"]
    assert len(containers) == per_pod and len({c["name"] for c in containers}) == per_pod
    mounts = {v["name"] for v in pod["volumes"] if (v.get("emptyDir") or {}).get("medium") == "Memory"}
    bound, names = [], []
    for n, c in enumerate(containers):
        env = _env(c)
        assert env["DMLC_NODE_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}   # one pod, one IP: one file
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        suffix = f"-{n}" if n else ""
        assert (int(env["PORT"]), int(env["LIVEVEC_METRICS_PORT"])) == (ports["ps" + suffix],
                                                                        ports["metrics" + suffix])
        bound += ports.values()
        names += ports
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert c[probe]["httpGet"]["port"] == "metrics" + suffix   # each probes its own container's port
        replica = env["LIVEVEC_HOST_REPLICA"]
        assert any(m["mountPath"] == replica and m["name"] in mounts for m in c["volumeMounts"])
        assert c["args"] == ["worker"]
    assert len(set(bound)) == len(bound) == 2 * per_pod     # one network namespace
    assert len(set(names)) == len(names) and all(len(name) <= 15 for name in names)   # unique in the pod
    assert objects[("ConfigMap", "livevec-config")]["data"]["DMLC_NUM_WORKER"] == str(2 * per_pod)


@pytest.mark.parametrize("partitions,per_pod", [(8, 2), (16, 2), (5, 2), (8, 4), (8, 1)])
def test_keda_scales_pods_and_never_past_a_consumer_per_partition(partitions, per_pod):
    topology = default_topology(workers=2, kafka_partitions=partitions, workers_per_pod=per_pod)
    scaled = _k8s_objects(topology)[("ScaledObject", "livevec-worker")]["spec"]
    assert scaled["maxReplicaCount"] * per_pod <= partitions < (scaled["maxReplicaCount"] + 1) * per_pod
    assert scaled["minReplicaCount"] == -(-2 // per_pod)
    # KEDA divides the lag by the threshold to count pods: a pod consumes for per_pod workers
    assert scaled["triggers"][0]["metadata"]["lagThreshold"] == str(5000 * per_pod)


def test_the_committed_workers_are_pods_of_two():
    docs = [d for d in yaml.safe_load_all((REPO / "deploy" / "k8s" / "30-worker.yaml").read_text()) if d]
    scaled = next(d for d in docs if d["kind"] == "ScaledObject")["spec"]
    deployment = next(d for d in docs if d["kind"] == "Deployment")["spec"]
    # 8 partitions: up to 4 pods of 2 workers, so 4 replicas where there were 8
    assert (deployment["replicas"], scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (1, 1, 4)
    assert [c["name"] for c in deployment["template"]["spec"]["containers"]] == ["worker-0", "worker-1"]


def test_workers_per_pod_is_checked():
    with pytest.raises(ValueError, match="at most 8 fit"):   # ps 9092 + i would reach metrics 9100
        default_topology(workers_per_pod=9)
    with pytest.raises(ValueError, match="at least one"):
        default_topology(workers_per_pod=0)
    with pytest.raises(ValueError, match="only elastic roles"):   # a StatefulSet ordinal is one shard
        default_topology().with_per_pod("server", 2)
    assert main(["deploy", "render", "--target", "k8s", "--workers-per-pod", "9"]) == 2   # a named setting error
    # Marathon has no pods: one task per process, whatever the pod size
    group = marathon.render_group(default_topology(workers=3, workers_per_pod=4))
    worker = next(a for a in group["apps"] if a["id"] == "/livevec/worker")
    assert worker["instances"] == 3 and worker["env"]["DMLC_NUM_WORKER"] == "3"


def test_the_namespace_enforces_pod_security_restricted():
    """The level forbids hostPath volumes, so Kubernetes shares the replica through a pod's emptyDir."""
    namespace = yaml.safe_load_all((REPO / "deploy" / "k8s" / "00-namespace.yaml").read_text())
    labels = next(d for d in namespace if d)["metadata"]["labels"]
    assert {labels[f"pod-security.kubernetes.io/{m}"] for m in ("enforce", "warn", "audit")} == {"restricted"}
