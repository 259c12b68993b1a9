"""Shared fixtures. The session-wide real Kafka broker lives here (see online.stream.kafka_broker)."""

import asyncio
import dataclasses
import threading
import uuid

import pytest


def _run_coroutine_blocking(make_coro):
    """Run a coroutine to completion from sync code, even when the calling test already runs an event loop."""
    box = {}

    def target():
        try:
            box["result"] = asyncio.run(make_coro())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("result")


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels():
    """The in-place kernels compiled once, into numba's cache beside the code, before any test starts a worker:
    a cold compile of hogbatch takes about 15 s per d (d = 100, and any other), and every worker process of the
    first cluster test would otherwise compile it at once on the same two cores."""
    from online.learner.trainer import LearnerConfig, warm_up
    for config in (LearnerConfig(kernel="hogbatch"), LearnerConfig(kernel="hogbatch", dim=16),
                   LearnerConfig(kernel="pairs", dim=16)):
        warm_up(config)


@pytest.fixture(scope="session")
def kafka_tls(tmp_path_factory):
    """Throw-away TLS material made at the start of the session (``tests.kafka_tls.TlsMaterial``): a CA, the
    broker's certificate for ``localhost``, a client certificate, an untrusted second CA, a SASL user."""
    from tests.kafka_tls import make_tls_material

    return make_tls_material(tmp_path_factory.mktemp("kafka-tls"))


@pytest.fixture(scope="session")
def kafka_broker(kafka_tls):
    """ONE real single-node KRaft broker for the whole session (jars fetched with Maven on first use): a
    plaintext listener (``bootstrap``) and, next to it, a SASL_SSL one (``sasl_ssl_bootstrap``) with the
    session's throw-away certificate and SCRAM/PLAIN user (``kafka_tls``).

    Never skipped: if Java, Maven or the broker is missing, every Kafka test fails with the reason.
    """
    from online.stream.kafka_broker import KafkaBroker
    from online.stream.settings import KafkaBrokerSettings

    settings = dataclasses.replace(KafkaBrokerSettings.from_env(), port=0, data_dir=None, state_file=None,
                                   sasl_ssl_port=0, tls_cert_file=kafka_tls.broker_cert,
                                   tls_key_file=kafka_tls.broker_key, users_file=kafka_tls.users_file,
                                   client_ca_file=kafka_tls.ca_file, client_auth="requested")
    broker = KafkaBroker(settings)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker) -> str:
    """``127.0.0.1:PORT`` of the session's broker."""
    return kafka_broker.bootstrap


@pytest.fixture(scope="session")
def kafka_sasl_ssl(kafka_broker, kafka_tls) -> dict[str, str]:
    """The ``LIVEVEC_KAFKA_*`` environment of a client of the session broker's SASL_SSL listener (SCRAM-SHA-512,
    the password in a file, the throw-away CA)."""
    from tests.kafka_tls import client_env

    return client_env(kafka_tls, kafka_broker.sasl_ssl_bootstrap)


@pytest.fixture
def kafka_topic(kafka_bootstrap):
    """Factory: ``kafka_topic(partitions=1, prefix="t") -> name`` creates a fresh, uniquely named topic."""
    from online.stream.producer import ensure_topic

    def make(partitions: int = 1, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        _run_coroutine_blocking(lambda: ensure_topic(kafka_bootstrap, name, partitions))
        return name

    return make


# Files whose tests change the machine (network namespaces and links, mounts, MooseFS, containers): under
# ``make test``'s two pytest-xdist processes they form one scope, so they never run beside each other.
MACHINE_LANE = {"test_link_delay.py", "test_lab_hosts.py", "test_moosefs_storage.py", "test_deploy_containers.py"}


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (each file's tests in one process, so its module fixtures start once) with the
    machine-changing files in one scope. ``xdist_group`` markers with ``--dist loadgroup`` would say the same, but
    pytest-xdist 3.8 writes the groups to an attribute pytest 9 no longer reads, and every test is then sent
    alone."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class MachineLane(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "machine" if path.rsplit("/", 1)[-1] in MACHINE_LANE else path

    return MachineLane(config, log)


def pytest_collection_modifyitems(config, items):
    # Tests that use the broker carry the `kafka` marker (`pytest -m kafka` runs just them).
    for item in items:
        if {"kafka_bootstrap", "kafka_broker", "kafka_sasl_ssl"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.kafka)
