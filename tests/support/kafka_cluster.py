"""Several KRaft brokers on 127.0.0.1, as a production Kafka cluster, for the tests of a rolling restart.

A production cluster is three brokers or more, and every upgrade restarts them one at a time. Each
restart moves the leadership of the partitions the broker led, and of the consumer group's coordinator,
to another broker; producers with ``acks=all`` and consumers ride it out without an outage. That is the
fault a single broker cannot show. Each node here is a ``KafkaBroker`` that is both broker and
controller (the combined mode), with every controller in ``controller.quorum.voters``, one cluster id
formatted into every data directory, replication factor 3 for the internal topics and
``min.insync.replicas`` 2, so one node may be down at any time.

    with KafkaCluster(3) as cluster:
        cluster.bootstrap              # "127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3"
        cluster.restart(0)             # SIGTERM (a clean shutdown), then the same node from its data
"""
from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

from online.stream.kafka_broker import KafkaBroker, _new_cluster_id
from online.stream.settings import KafkaBrokerSettings
from tests.support.ports import reserved_port


class KafkaCluster:
    """``brokers`` nodes, each broker and controller, with fixed ports so a restarted node comes back where
    the clients and the other nodes look for it. Every node's configuration names every controller's port, so
    no node can bind port 0 and report it: the ports are held for the cluster's life (``reserved_port``: the
    JVM binds a held port, nothing else can), and a restarted node finds its own free."""

    def __init__(self, brokers: int = 3, settings: KafkaBrokerSettings | None = None):
        if brokers < 1:
            raise ValueError(f"a cluster needs a broker, got {brokers}")
        base = settings or KafkaBrokerSettings.from_env()
        self.root = Path(tempfile.mkdtemp(prefix="livevec-kafka-cluster-"))
        self._held = contextlib.ExitStack()
        ports = [self._held.enter_context(reserved_port()) for _ in range(2 * brokers)]
        voters = ",".join(f"{i + 1}@127.0.0.1:{ports[brokers + i]}" for i in range(brokers))
        cluster_id = _new_cluster_id()
        self.brokers = [
            KafkaBroker(dataclasses.replace(base, port=ports[i], data_dir=self.root / f"node-{i + 1}",
                                            tls_cert_file=None, tls_key_file=None),
                        node_id=i + 1, controller_port=ports[brokers + i], voters=voters, cluster_id=cluster_id,
                        replicas=min(3, brokers))
            for i in range(brokers)]

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers)

    def start(self) -> str:
        for broker in self.brokers:
            broker.launch()
        for broker in self.brokers:
            broker.wait_ready()
        return self.bootstrap

    def restart(self, index: int, down_seconds: float = 0.0) -> float:
        """Node ``index`` stopped as an upgrade stops it (SIGTERM: it hands its leaderships over) and started
        again from its data directory; returns the seconds until it answered again."""
        broker = self.brokers[index]
        broker.stop()
        time.sleep(down_seconds)
        t0 = time.monotonic()
        broker.launch()
        broker.wait_ready()
        return time.monotonic() - t0

    def stop(self) -> None:
        for broker in self.brokers:
            broker.stop()
        self._held.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "KafkaCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
