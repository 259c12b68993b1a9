"""The livevec cluster, described once: roles, counts, environment, ports, resources,
checks, volumes and placement.

Marathon JSON (``marathon.py``), Kubernetes YAML (``k8s.py``) and the local runner all
derive from a ``Topology``, so they cannot disagree. In particular ``DMLC_NUM_SERVER``
and ``DMLC_NUM_WORKER`` are never written by hand: ``Topology.env`` computes them from the
server and worker ``instances``, and ``with_instances`` is the only way to change a count.

Platform differences are confined to four places: how a process learns its host
(Marathon's ``$HOST`` vs the pod IP), which port it binds (Marathon's named ports vs a
fixed container port, every pod having its own IP), how the scheduler is named
(Mesos-DNS vs a StatefulSet pod's stable DNS name), and what "processes placed together"
means for the workers' shared replica (``HostReplica``: the tasks of one agent vs the
containers of one pod, ``Role.per_pod``).
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from online import __version__
from online.deployment.sizing import Capacity, Resources, round_up, size_resources
from online.deployment.secrets import SECRETS, SecretFiles

Platform = Literal["marathon", "k8s"]
Workload = Literal["singleton", "shards", "elastic", "replicated", "example"]

# The ps-lite scheduler's fixed host port on Marathon. Agents only offer ports from their
# `ports` resource: plain Mesos offers [31000-32000] and DC/OS agents 1025-32000 minus
# system ports, so ps-lite's customary 9091 would never be offered on plain Mesos and the
# app would sit in "Waiting" forever. 31091 is inside both ranges and keeps the "91" that
# operators recognise.
SCHEDULER_HOST_PORT = 31091

# The command the periodic export runs (Metronome job / CronJob). The checkpoint engineer
# owns its implementation (online/cli/checkpoint.py); this is its agreed name and flags:
# it reads the latest complete checkpoint under LIVEVEC_CHECKPOINT_DIR and writes the
# input vectors in word2vec formats under --out.
EXPORT_COMMAND = "livevec checkpoint export"


@dataclass(frozen=True)
class Port:
    """A port a role listens on.

    ``host_port`` is what Marathon reserves on the agent: 0 lets Marathon pick one from
    the offer (exported as ``$PORT_<NAME>``), non-zero pins it (with ``requirePorts``).
    ``container_port`` is the fixed port inside a Kubernetes pod.
    """

    name: str
    container_port: int
    host_port: int = 0
    service_port: int = 0  # Marathon service port (marathon-lb binds it on the LB nodes)
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Check:
    """A health or readiness probe. ``kind`` 'http' probes ``path``; 'tcp' connects."""

    kind: Literal["http", "tcp"]
    port_name: str
    path: str = "/health"
    grace_period_seconds: int = 300
    interval_seconds: int = 30
    timeout_seconds: int = 10
    max_consecutive_failures: int = 3
    delay_seconds: int = 15


@dataclass(frozen=True)
class SharedStorage:
    """The shared file system (MooseFS or NFS) holding checkpoints and exports.

    Marathon mounts ``host_path`` with a hostPath volume and places tasks only on agents
    tagged ``agent_attribute`` (e.g. started with ``--attributes=moosefs:true``); the state
    then follows the file system, not the agent. Kubernetes mounts an RWX claim instead.
    """

    host_path: str = "/mnt/mfs/livevec"
    container_path: str = "/mnt/mfs/livevec"
    agent_attribute: tuple[str, str] = ("moosefs", "true")
    claim_name: str = "livevec-shared"
    storage_class: str = "moosefs"
    size: str = "50Gi"

    @property
    def checkpoint_dir(self) -> str:
        return f"{self.container_path}/checkpoints"

    @property
    def export_dir(self) -> str:
        return f"{self.container_path}/exports"


@dataclass(frozen=True)
class HostReplica:
    """The workers placed together share one replica in shared memory (``LIVEVEC_HOST_REPLICA``,
    ``online.cluster.host_replica``): 8 workers with a replica each learn badly, 8 sharing one learn like 2.
    They share a file named by the scheduler's address and ``DMLC_NODE_HOST``, in a tmpfs they all see.

    Marathon: the tasks of one agent. Each Docker container has a private /dev/shm (64 MB), so the agent's
    ``host_path`` is mounted over it, and ``$HOST`` (the agent) names the file. Kubernetes: the worker
    containers of one pod (``Role.per_pod``). Pods share no /dev/shm and hostPath volumes are what Pod
    Security's baseline level forbids; a pod's containers share its IP (so its file) and a memory-backed
    emptyDir at ``pod_path``, limited to ``size_limit_mib``: the segment reserves its size at start, so a
    tmpfs too small fails then, naming LIVEVEC_HOST_REPLICA_ROWS, rather than with SIGBUS later.

    The rows are LIVEVEC_HOST_REPLICA_ROWS' default (twice LIVEVEC_VOCAB_CAPACITY), so a changed vocabulary
    capacity moves them too; ``size_mib`` is what ``Capacity`` derives from the same numbers.
    """

    size_mib: float
    host_path: str = "/dev/shm"
    pod_path: str = "/livevec/shm"
    volume: str = "host-replica"

    def path(self, platform: Platform) -> str:
        return self.host_path if platform == "marathon" else self.pod_path

    @property
    def size_limit_mib(self) -> int:
        """The pod's tmpfs: the segment, plus room for its two lock files and tmpfs's own rounding."""
        return round_up(self.size_mib + 32)


@dataclass(frozen=True)
class Upgrade:
    minimum_health_capacity: float
    maximum_over_capacity: float


@dataclass(frozen=True)
class Backoff:
    """Marathon's launch backoff: delay = seconds * factor**(failures-1), capped.

    The cap is set explicitly: early Marathon defaulted to one hour (marathon#1456: an app
    started 70 minutes late after a cluster reboot).
    """

    seconds: int = 1
    factor: float = 1.5
    max_launch_delay_seconds: int = 60


@dataclass(frozen=True)
class Unreachable:
    inactive_after_seconds: int
    expunge_after_seconds: int


@dataclass(frozen=True)
class Autoscale:
    """Kubernetes autoscaling bounds: KEDA on Kafka lag for workers, an HPA on CPU for the
    front end. Marathon has no autoscaler; operators scale by hand (see the runbook). Counted
    in processes, like ``instances``; the Kubernetes objects scale pods of ``Role.per_pod``."""

    min_replicas: int
    max_replicas: int
    cpu_utilization: int = 70  # HPA target, percent of the CPU request
    lag_threshold: int = 5000  # KEDA: records of lag per worker process before adding one
    activation_lag_threshold: int = 10


@dataclass(frozen=True)
class Role:
    name: str
    command: str  # run with `exec` so SIGTERM reaches Python, not /bin/sh
    instances: int
    workload: Workload
    resources: Resources
    ports: tuple[Port, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    # env var -> port name: bound to Marathon's $PORT_<NAME> or the pod's fixed port
    port_env: Mapping[str, str] = field(default_factory=dict)
    # env vars set to the address other nodes reach this task at ($HOST / the pod IP)
    host_env: tuple[str, ...] = ()
    health: Check | None = None
    readiness: Check | None = None
    mounts_shared: bool = False
    shared_read_only: bool = False
    constraints: tuple[tuple[str, ...], ...] = ()
    upgrade: Upgrade = Upgrade(1.0, 1.0)
    backoff: Backoff = Backoff()
    unreachable: Unreachable | None = None
    depends_on: tuple[str, ...] = ()
    kill_grace_seconds: int = 30
    autoscale: Autoscale | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    host_replica: HostReplica | None = None
    # Kubernetes: processes of this role in one pod, each its own container (and ps-lite node and Kafka
    # consumer) on its own ports: what shares a host replica there. Counts stay in processes.
    per_pod: int = 1

    def port(self, name: str) -> Port:
        for p in self.ports:
            if p.name == name:
                return p
        raise KeyError(f"role {self.name} has no port named {name!r}")

    def port_index(self, name: str) -> int:
        return [p.name for p in self.ports].index(name)


@dataclass(frozen=True)
class ExportJob:
    name: str = "export-vectors"
    command: str = f"{EXPORT_COMMAND} --out {SharedStorage().export_dir}"
    cron: str = "0 * * * *"  # hourly: downstream consumers get at most hour-old vectors
    timezone: str = "UTC"
    resources: Resources = Resources(0.5, 1024, 256, "reads one checkpoint shard at a time")
    deadline_seconds: int = 1800
    retries: int = 2


@dataclass(frozen=True)
class Topology:
    roles: tuple[Role, ...]
    common_env: Mapping[str, str]
    image: str = f"livevec:{__version__}"   # the release's image
    group: str = "livevec"  # Marathon group id, Kubernetes namespace and name prefix
    shared: SharedStorage = SharedStorage()
    export: ExportJob = ExportJob()
    capacity: Capacity = Capacity()
    # The optional secrets rendered (online.deployment.secrets: "curve", "token", "tls"); Kafka's always are.
    secure: frozenset[str] = frozenset()
    kafka_partitions: int = 8
    cluster_domain: str = "cluster.local"
    # Values that differ by platform, e.g. the Kafka bootstrap address of each cluster.
    platform_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    # -- lookups ---------------------------------------------------------------------
    def role(self, name: str) -> Role:
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(f"no role named {name!r} (have {', '.join(r.name for r in self.roles)})")

    def instances(self, name: str) -> int:
        return self.role(name).instances

    def pods(self, name: str) -> int:
        """Kubernetes: the role's pods, each ``per_pod`` processes; a count that does not fill whole pods is
        rounded up (elastic workers admit the extra ones)."""
        role = self.role(name)
        return math.ceil(role.instances / role.per_pod)

    def nodes(self, name: str, platform: Platform) -> int:
        """The role's processes, so its ps-lite nodes, on a platform (DMLC_NUM_*)."""
        return self.instances(name) if platform == "marathon" else self.pods(name) * self.role(name).per_pod

    # -- naming ----------------------------------------------------------------------
    def marathon_app_id(self, role: str) -> str:
        return f"/{self.group}/{role}"

    def k8s_name(self, role: str) -> str:
        return f"{self.group}-{role}"

    def scheduler_host(self, platform: Platform) -> str:
        if platform == "marathon":
            return mesos_dns_name(self.marathon_app_id("scheduler"))
        sts = self.k8s_name("scheduler")
        return f"{sts}-0.{sts}.{self.group}.svc.{self.cluster_domain}"

    def scheduler_port(self, platform: Platform) -> int:
        port = self.role("scheduler").port("ps")
        return port.host_port if platform == "marathon" else port.container_port

    # -- environment -----------------------------------------------------------------
    def cluster_env(self, platform: Platform) -> dict[str, str]:
        """What every role shares: the scheduler's address, the node counts, the model
        hyper-parameters, Kafka and the checkpoint directory. On Kubernetes this is the
        ConfigMap."""
        env = dict(self.common_env)
        env.update(self.platform_env.get(platform, {}))
        env["DMLC_PS_ROOT_URI"] = self.scheduler_host(platform)
        env["DMLC_PS_ROOT_PORT"] = str(self.scheduler_port(platform))
        env["DMLC_NUM_SERVER"] = str(self.nodes("server", platform))
        env["DMLC_NUM_WORKER"] = str(self.nodes("worker", platform))
        return dict(sorted(env.items()))

    def role_env(self, r: Role, platform: Platform) -> dict[str, str]:
        """What one role adds to the cluster's environment (on Kubernetes, the container's own env)."""
        env: dict[str, str] = {}
        for secret in self.secrets(r):
            env.update(secret.role_env(r.name))
        if r.host_replica is not None:
            env["LIVEVEC_HOST_REPLICA"] = r.host_replica.path(platform)
        env.update(r.env)
        return dict(sorted(env.items()))

    def secrets(self, r: Role) -> list[SecretFiles]:
        """The secret directories mounted into role ``r`` (online.deployment.secrets)."""
        return [secret for key, secret in SECRETS.items()
                if r.name in secret.roles and (secret.always or key in self.secure)]

    def https(self, r: Role) -> bool:
        """Whether the role's HTTP port speaks HTTPS only (its probes must too)."""
        return any(secret.https for secret in self.secrets(r))

    def env(self, role: str, platform: Platform) -> dict[str, str]:
        """The static environment of one role (without the per-task host and ports)."""
        return dict(sorted({**self.cluster_env(platform), **self.role_env(self.role(role), platform)}.items()))

    # -- changes ---------------------------------------------------------------------
    def with_instances(self, **counts: int) -> Topology:
        """Rescale roles. Server memory is re-derived, and DMLC_NUM_* follow because
        they are computed from the counts."""
        known = {r.name for r in self.roles}
        unknown = set(counts) - known
        if unknown:
            raise KeyError(f"unknown roles {sorted(unknown)} (have {sorted(known)})")
        for name, n in counts.items():
            if n < 0:
                raise ValueError(f"{name}: instances must be >= 0, got {n}")
            if name in ("scheduler",) and n != 1:
                raise ValueError("scheduler: ps-lite has exactly one scheduler")
            if name == "server" and n < 1:
                raise ValueError("server: at least one server holds the model")
        servers = counts.get("server", self.instances("server"))
        roles = []
        for r in self.roles:
            n = counts.get(r.name, r.instances)
            changes: dict[str, object] = {"instances": n}
            if r.name == "server":
                changes["resources"] = size_resources("server", self.capacity, servers)
            if r.autoscale is not None and r.workload == "elastic":
                changes["autoscale"] = dataclasses.replace(
                    r.autoscale, min_replicas=n, max_replicas=max(r.autoscale.max_replicas, n))
            roles.append(dataclasses.replace(r, **changes))
        return dataclasses.replace(self, roles=tuple(roles))

    def with_secure(self, secure: frozenset[str]) -> Topology:
        """Render the optional secrets in ``secure`` ("curve", "token", "tls"): their mounts and variables."""
        unknown = set(secure) - (set(SECRETS) - {key for key, s in SECRETS.items() if s.always})
        if unknown:
            raise ValueError(f"no optional secret named {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, secure=frozenset(secure))

    def with_per_pod(self, role: str, n: int) -> Topology:
        """Kubernetes: put ``n`` of the role's processes in each pod (they share its host replica)."""
        if n < 1:
            raise ValueError(f"{role}: at least one process per pod, got {n}")
        r = self.role(role)
        if n > 1 and r.workload != "elastic":
            raise ValueError(f"{role}: only elastic roles run several processes per pod (a StatefulSet's "
                             f"ordinal names one process)")
        ports = [p.container_port + i for p in r.ports for i in range(n)]   # the i-th container's (k8s.py)
        if len(set(ports)) != len(ports):   # one network namespace: of two binds of one port, one fails
            raise ValueError(f"{role}: with {n} processes per pod two would bind one port (the i-th binds "
                             f"the role's ports + i); at most {self._most_per_pod(r)} fit")
        return dataclasses.replace(self, roles=tuple(dataclasses.replace(x, per_pod=n) if x is r else x
                                                     for x in self.roles))

    @staticmethod
    def _most_per_pod(r: Role) -> int:
        starts = sorted(p.container_port for p in r.ports)
        return min((b - a for a, b in zip(starts, starts[1:])), default=1 << 16)

    def with_env(self, **env: str) -> Topology:
        return dataclasses.replace(self, common_env={**self.common_env, **env})

    def with_image(self, image: str) -> Topology:
        return dataclasses.replace(self, image=image)


_LABEL_DROP = re.compile(r"[^a-z0-9-]")


def mesos_dns_name(app_id: str, framework: str = "marathon", domain: str = "mesos") -> str:
    """The A record Mesos-DNS publishes for a Marathon app.

    Marathon names a task after its app path reversed and joined with dots
    (``PathId.toHostname``: /livevec/scheduler -> scheduler.livevec); Mesos-DNS then
    mangles that into one RFC 1123 label: lower case, '.' and '_' become '-', other
    characters dropped, at most 63 characters, no leading or trailing '-'.
    """
    segments = [s for s in app_id.strip("/").split("/") if s]
    task = ".".join(reversed(segments)).lower().replace(".", "-").replace("_", "-")
    label = _LABEL_DROP.sub("", task)[:63].strip("-")
    return f"{label}.{framework}.{domain}"


def default_topology(*, servers: int = 2, workers: int = 2, frontends: int = 2,
                     image: str = f"livevec:{__version__}",
                     kafka_bootstrap: str = "broker.kafka.l4lb.thisdcos.directory:9092",
                     k8s_kafka_bootstrap: str = "kafka-bootstrap.kafka.svc.cluster.local:9092",
                     kafka_topic: str = "livevec-text", kafka_group: str = "livevec-workers",
                     kafka_partitions: int = 8, capacity: Capacity = Capacity(),
                     workers_per_pod: int = 2) -> Topology:
    """The production layout. ``kafka_bootstrap`` defaults to the DC/OS Kafka package's VIP,
    ``k8s_kafka_bootstrap`` to a Strimzi-style bootstrap Service; both are placeholders to
    replace with your brokers (``livevec deploy render --kafka-bootstrap``).

    ``workers_per_pod`` (Kubernetes): 2, the most workers Marathon puts on one agent, so that a replica
    is shared by as many workers on both platforms. More would mean fewer replicas still, but a coarser
    autoscaling step (the partitions allow 8 workers: 4 pods of 2, or 2 of 4), a pod that needs 1.5 CPU per
    worker on one node, and more workers lost with one pod."""
    shared = SharedStorage()
    moosefs = (shared.agent_attribute[0], "IS", shared.agent_attribute[1])
    common_env = {
        "LIVEVEC_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "LIVEVEC_KAFKA_TOPICS": kafka_topic,
        "LIVEVEC_KAFKA_GROUP": kafka_group,
        # Kafka's TLS and SASL: SASL_SSL turns on what the workers' mounted credentials hold (secrets.KAFKA);
        # the mechanism and user are read only then.
        "LIVEVEC_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT",
        "LIVEVEC_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "LIVEVEC_KAFKA_SASL_USERNAME": "livevec",
        "LIVEVEC_DIM": str(capacity.dim),
        "LIVEVEC_WINDOW": "5",
        "LIVEVEC_NEGATIVE": "5",
        "LIVEVEC_MIN_COUNT": "5",
        "LIVEVEC_SAMPLE": "1e-3",
        # Workers train a local replica and send the servers its deltas at least every 250 ms.
        "LIVEVEC_EXCHANGE": "replica",
        "LIVEVEC_SYNC_MS": "250",
        "LIVEVEC_CHECKPOINT_DIR": shared.checkpoint_dir,
        "LIVEVEC_LOG_LEVEL": "INFO",
        # The ps_bridge extension that admits workers joining and leaving at run time; the
        # scheduler and servers must agree with the workers on it, so every role gets it.
        "LIVEVEC_ELASTIC_WORKERS": "1",
        # Dead-node detection, needed by ps-lite's recovery path (a restarted task comes
        # back with a new host and port and takes over the dead node's id).
        "PS_HEARTBEAT_INTERVAL": "5",
        "PS_HEARTBEAT_TIMEOUT": "30",
        "PYTHONUNBUFFERED": "1",
    }
    # Marathon: the old task holds the fixed port, so kill it first (marathon#3287).
    kill_first = Upgrade(0.0, 0.0)
    # Short network partitions must not produce a second scheduler or a second server
    # with the same ps-lite id ("2 of 1" when the partition heals).
    patient = Unreachable(300, 600)
    scheduler = Role(
        name="scheduler", command="livevec scheduler", instances=1, workload="singleton",
        resources=size_resources("scheduler", capacity, servers),
        # metrics: the checkpoint, rollback and dead-node series of the dashboard and alerts
        # (deploy/grafana, deploy/prometheus) come from the scheduler alone.
        ports=(Port("ps", container_port=9091, host_port=SCHEDULER_HOST_PORT),
               Port("metrics", container_port=9100, host_port=SCHEDULER_HOST_PORT + 1)),
        env={"DMLC_ROLE": "scheduler"},
        port_env={"LIVEVEC_METRICS_PORT": "metrics"},
        # zmq cannot bind a DNS name: the scheduler binds all interfaces while the others
        # connect to DMLC_PS_ROOT_URI (ps-lite does the same with DMLC_USE_KUBERNETES=1).
        health=Check("tcp", "ps", path="", grace_period_seconds=120, interval_seconds=20,
                     timeout_seconds=5, max_consecutive_failures=3, delay_seconds=5),
        # The scheduler coordinates checkpoints and writes their manifest next to the shards.
        mounts_shared=True, constraints=(moosefs,),
        upgrade=kill_first, unreachable=patient, kill_grace_seconds=10,
        backoff=Backoff(1, 1.5, 30),
        labels={"livevec.role": "scheduler"},
    )
    server = Role(
        name="server", command="livevec server", instances=servers, workload="shards",
        resources=size_resources("server", capacity, servers),
        ports=(Port("ps", container_port=9092), Port("metrics", container_port=9100)),
        env={"DMLC_ROLE": "server"},
        port_env={"PORT": "ps", "LIVEVEC_METRICS_PORT": "metrics"},
        host_env=("DMLC_NODE_HOST",),
        health=Check("http", "metrics", "/health", grace_period_seconds=300, interval_seconds=30,
                     timeout_seconds=10, max_consecutive_failures=3, delay_seconds=15),
        readiness=None,
        mounts_shared=True,
        constraints=(("hostname", "UNIQUE"), moosefs),
        upgrade=Upgrade(0.5, 0.0), unreachable=patient,
        depends_on=("scheduler",),
        kill_grace_seconds=60,  # time for a final shard snapshot
        labels={"livevec.role": "server"},
    )
    worker = Role(
        name="worker", command="livevec worker", instances=workers, workload="elastic",
        resources=size_resources("worker", capacity, servers),
        ports=(Port("ps", container_port=9092), Port("metrics", container_port=9100)),
        # LIVEVEC_HOST_REPLICA_ROWS is left to its default, twice the vocabulary capacity (what Capacity sizes).
        env={"DMLC_ROLE": "worker", "LIVEVEC_VOCAB_CAPACITY": str(capacity.worker_vocab_words)},
        port_env={"PORT": "ps", "LIVEVEC_METRICS_PORT": "metrics"},
        host_env=("DMLC_NODE_HOST",),
        health=Check("http", "metrics", "/health", grace_period_seconds=300, interval_seconds=30,
                     timeout_seconds=10, max_consecutive_failures=3, delay_seconds=15),
        mounts_shared=True,  # the worker reads checkpointed offsets on recovery
        # Two per agent share one replica (host_replica); more would put more consumers in one failure domain.
        constraints=(("hostname", "MAX_PER", "2"), moosefs),
        upgrade=Upgrade(0.75, 0.25),
        unreachable=Unreachable(60, 120),
        depends_on=("scheduler",),
        kill_grace_seconds=30,  # finish in-flight batches and commit offsets
        autoscale=Autoscale(min_replicas=workers, max_replicas=max(kafka_partitions, workers)),
        labels={"livevec.role": "worker"},
        host_replica=HostReplica(capacity.host_replica_mib),
    )
    frontend = Role(
        name="frontend", command="livevec frontend", instances=frontends, workload="replicated",
        resources=size_resources("frontend", capacity, servers),
        # The front end reads the model by joining the ps-lite cluster as an (elastic)
        # worker node (online.frontend.ps_source), so it needs a ps port and an address the
        # servers can reach, like a worker.
        ports=(Port("http", container_port=8080, service_port=10080,
                    labels={"VIP_0": "/livevec-frontend:8080"}),
               Port("ps", container_port=9092)),
        env={"LIVEVEC_HTTP_HOST": "0.0.0.0"},
        port_env={"LIVEVEC_HTTP_PORT": "http", "PORT": "ps"},
        host_env=("DMLC_NODE_HOST",),
        health=Check("http", "http", "/health", grace_period_seconds=300, interval_seconds=20,
                     timeout_seconds=5, max_consecutive_failures=3, delay_seconds=10),
        readiness=Check("http", "http", "/ready", interval_seconds=10, timeout_seconds=5),
        mounts_shared=True, shared_read_only=True,
        constraints=(("hostname", "MAX_PER", "1"), moosefs),
        upgrade=Upgrade(1.0, 0.5),
        unreachable=Unreachable(60, 120),
        depends_on=("scheduler", "server"),
        kill_grace_seconds=15,
        autoscale=Autoscale(min_replicas=frontends, max_replicas=max(8, frontends)),
        labels={"livevec.role": "frontend", "HAPROXY_GROUP": "external",
                "HAPROXY_0_MODE": "http", "HAPROXY_0_VHOST": "livevec.example.com"},
    )
    producer = Role(
        # A traffic generator for trying the group out: streams a corpus from the shared
        # file system into the topic, then exits and is relaunched (after the backoff),
        # so it loops. Scale it to 1 to use it; production traffic comes from your own
        # producers.
        name="producer-example", instances=0, workload="example",
        command=(f'livevec produce --bootstrap "$LIVEVEC_KAFKA_BOOTSTRAP" --topic "$LIVEVEC_KAFKA_TOPICS" '
                 f"--partitions {kafka_partitions} --rate 2000 {shared.container_path}/corpus/sample.txt.xz"),
        resources=Resources(0.5, 256, 256, "a file reader and a Kafka producer"),
        mounts_shared=True, shared_read_only=True,
        constraints=(moosefs,),
        backoff=Backoff(10, 1.0, 10),
        labels={"livevec.role": "producer-example"},
    )
    return Topology(
        roles=(scheduler, server, worker, frontend, producer),
        common_env=common_env, image=image, shared=shared, capacity=capacity,
        kafka_partitions=kafka_partitions,
        # Both platforms run the replica exchange: KEDA's 8 workers are 4 pods, so 4 replicas, not 8.
        platform_env={"k8s": {"LIVEVEC_KAFKA_BOOTSTRAP": k8s_kafka_bootstrap}},
    ).with_per_pod("worker", workers_per_pod)
