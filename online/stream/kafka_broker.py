"""A real, single-node Apache Kafka broker (KRaft mode) for development, tests, benchmarks and ``livevec up``.

Why not a container or a tarball: the project must come up on a fresh machine that has only Java, Maven and
Python. Maven Central serves the broker itself (``org.apache.kafka:kafka_2.13``) with all of its runtime
dependencies, so a tiny pom in ``online/stream/resources/kafka-pom.xml`` names it and ``mvn dependency:copy-dependencies``
drops the jars into a cache outside the work tree (``$LIVEVEC_CACHE_DIR`` or ``~/.cache/livevec``, one folder per
version). The broker then runs straight from that class path: ``kafka.tools.StorageTool format`` once per data
directory, then ``kafka.Kafka`` with a generated ``server.properties`` that makes one process both the KRaft
controller and the broker, bound to 127.0.0.1 on free ports.

Python API::

    with KafkaBroker() as broker:           # fetches jars if needed, starts, waits until ready
        broker.bootstrap                     # "127.0.0.1:PORT"
    # stopped (SIGTERM, then SIGKILL after a grace period) and its temporary data removed

Command line (``livevec kafka ...``)::

    livevec kafka fetch     # resolve the jars into the cache (make's kafka-jars target)
    livevec kafka start     # daemonised broker; prints 127.0.0.1:PORT; records pid/port/data dir in a state file
    livevec kafka status    # exit 0 and the address when it runs and answers, 1 otherwise
    livevec kafka stop      # stop the broker recorded in the state file and delete its temporary data

The version defaults to ``DEFAULT_KAFKA_VERSION`` (see the README's Kafka section for why); another one is a
setting away (``LIVEVEC_KAFKA_VERSION``) because production users will want to test against what they run.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from importlib import resources
from pathlib import Path

from online.stream.settings import KafkaBrokerSettings, Secret, read_users_file
from ps_bridge.structured_logging import log_event

logger = logging.getLogger("livevec.kafka")

# Kafka 4.1: aiokafka 0.14 negotiates every request version with the broker (ApiVersions), so it sends none
# of the pre-2.1 request versions that Kafka 4 removed (KIP-896). Checked end to end in tests/test_kafka_*.
# Java 17 runs every Kafka this module starts (Kafka 4 brokers need 17; 3.x runs on 11+).
MIN_JAVA = 17
INSTALL_JAVA = "install Java 17: apt-get install openjdk-17-jre-headless (or set JAVA_HOME)"
INSTALL_MAVEN = "install Maven: apt-get install maven"
POM_RESOURCE = "kafka-pom.xml"


class KafkaBrokerError(RuntimeError):
    """The broker cannot be fetched, started or stopped; the message says what to do about it."""


# ----------------------------------------------------------------------------- prerequisites

def find_java(java_home: str | None = None) -> str:
    """The java executable (``$JAVA_HOME/bin/java`` first), checked to be Java >= 17."""
    candidates = [str(Path(java_home) / "bin" / "java")] if java_home else []
    found = shutil.which("java")
    if found:
        candidates.append(found)
    for java in candidates:
        if not os.access(java, os.X_OK):
            continue
        try:
            out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
        if not match:
            continue
        major = int(match.group(1))
        if major == 1 and match.group(2):  # "1.8.0_x" style
            major = int(match.group(2))
        if major >= MIN_JAVA:
            return java
        raise KafkaBrokerError(f"{java} is Java {major}; the Kafka broker needs Java {MIN_JAVA}+: {INSTALL_JAVA}")
    raise KafkaBrokerError(f"no java executable found: {INSTALL_JAVA}")


def find_maven() -> str:
    mvn = shutil.which("mvn")
    if not mvn:
        raise KafkaBrokerError(f"no mvn executable found (needed once, to fetch the Kafka jars): {INSTALL_MAVEN}")
    return mvn


# ----------------------------------------------------------------------------- jars

_COMPLETE_MARKER = ".complete"


def cached_classpath(settings: KafkaBrokerSettings) -> list[Path] | None:
    """The jars of a completed fetch, or None when the cache lacks them (or was half written)."""
    marker = settings.jars_dir / _COMPLETE_MARKER
    if not marker.is_file():
        return None
    jars = sorted((settings.jars_dir / "libs").glob("*.jar"))
    names = {j.name for j in jars}
    expected = [line for line in marker.read_text().splitlines() if line]
    if not jars or any(name not in names for name in expected):
        return None
    return jars


def fetch_jars(settings: KafkaBrokerSettings | None = None) -> list[Path]:
    """Resolve the broker's jars with Maven into the cache, once; return the class path.

    Concurrent callers (pytest sessions of several engineers, ``make`` and a test) serialise on a lock file,
    and a fetch lands in a temporary folder that is renamed into place only when Maven succeeded, so a killed
    fetch never leaves a cache that looks complete.
    """
    settings = settings or KafkaBrokerSettings.from_env()
    jars = cached_classpath(settings)
    if jars:
        return jars
    settings.cache_dir.mkdir(parents=True, exist_ok=True)
    lock_path = settings.cache_dir / f"kafka-{settings.version}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        jars = cached_classpath(settings)
        if jars:
            return jars
        mvn = find_maven()
        started = time.monotonic()
        staging = Path(tempfile.mkdtemp(prefix=f".kafka-{settings.version}-", dir=settings.cache_dir))
        try:
            with resources.as_file(resources.files("online.stream") / "resources" / POM_RESOURCE) as pom:
                cmd = [mvn, "-q", "-B", "-f", str(pom), f"-Dkafka.version={settings.version}",
                       "dependency:copy-dependencies", f"-DoutputDirectory={staging / 'libs'}"]
                log_event(logger, "kafka_jars_fetch", version=settings.version, into=str(settings.jars_dir))
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=staging)
            if proc.returncode != 0:
                tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
                raise KafkaBrokerError(f"mvn could not resolve org.apache.kafka:kafka_2.13:{settings.version} "
                                       f"from Maven Central (exit {proc.returncode}):\n{tail}")
            fetched = sorted((staging / "libs").glob("*.jar"))
            if not any(j.name.startswith(f"kafka_2.13-{settings.version}") for j in fetched):
                raise KafkaBrokerError(f"mvn finished but kafka_2.13-{settings.version}.jar is missing in {staging}")
            (staging / _COMPLETE_MARKER).write_text("\n".join(j.name for j in fetched) + "\n")
            if settings.jars_dir.exists():
                shutil.rmtree(settings.jars_dir)
            staging.rename(settings.jars_dir)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        log_event(logger, "kafka_jars_fetched", version=settings.version, jars=len(fetched),
                  seconds=round(time.monotonic() - started, 1), path=str(settings.jars_dir))
    return cached_classpath(settings) or []


# ----------------------------------------------------------------------------- broker process

def _free_port(host: str = "127.0.0.1") -> int:
    """A port free now, which another process may take before the broker binds it: ``start`` then tries again."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _new_cluster_id() -> str:
    # Kafka's Uuid.toString: URL-safe base64 of 16 bytes without padding (22 characters). Like Kafka's own
    # Uuid.randomUuid, never start with "-": the storage tool would read the id as an option.
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


# ----------------------------------------------------------------------------- the SASL_SSL listener

SASL_SSL_HOST = "localhost"   # advertised name of the SASL_SSL listener: the broker certificate must hold it
SCRAM_ITERATIONS = 8192
_SCRAM = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


def scram_credentials(users: dict[str, Secret]) -> list[str]:
    """``kafka-storage format --add-scram`` values, salted here: the passwords never reach a command line."""
    out = []
    for name, password in users.items():
        for mechanism, digest in _SCRAM.items():
            salt = os.urandom(16)
            salted = hashlib.pbkdf2_hmac(digest, password.reveal().encode(), salt, SCRAM_ITERATIONS)
            out.append(f'{mechanism}=[name={name},iterations={SCRAM_ITERATIONS},'
                       f'salt="{base64.b64encode(salt).decode()}",saltedpassword="{base64.b64encode(salted).decode()}"]')
    return out


def _properties_value(text: str) -> str:
    # java.util.Properties reads ISO-8859-1 with backslash escapes: escape what is not plain ASCII
    return "".join(c if 32 <= ord(c) < 127 and c != "\\" else f"\\u{ord(c):04x}" for c in text)


def _sasl_ssl_properties(port: int, keystore: Path, users: dict[str, Secret], client_ca: Path | None = None,
                         client_auth: str = "required") -> dict[str, str]:
    plain_users = " ".join(f'user_{name}="{secret.reveal()}"' for name, secret in users.items())
    prefix = "listener.name.sasl_ssl."
    mutual = {prefix + "ssl.client.auth": client_auth, prefix + "ssl.truststore.type": "PEM",
              prefix + "ssl.truststore.location": str(client_ca)} if client_ca else {}
    return {
        **mutual,
        "sasl.enabled.mechanisms": ",".join(("PLAIN", *_SCRAM)),
        prefix + "ssl.keystore.type": "PEM",
        prefix + "ssl.keystore.location": str(keystore),
        prefix + "plain.sasl.jaas.config":
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};",
        **{prefix + f"{m.lower()}.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required;"
           for m in _SCRAM},
        "_port": str(port),
    }


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii", errors="strict") as f:
        f.write(text)


def _server_properties(port: int, controller_port: int, log_dir: Path, sasl_ssl: dict[str, str] | None = None,
                       host: str = "127.0.0.1", node_id: int = 1, voters: str | None = None,
                       replicas: int = 1) -> str:
    # One process is controller and broker. Thread counts are cut to fit a 2-core machine shared with the
    # workers; replication factors are the node count (1 alone; ``KafkaCluster``'s nodes pass theirs, with
    # ``voters`` naming every controller); group.initial.rebalance.delay.ms=0 lets a consumer group form at once
    # instead of waiting 3 s for more members. With ``sasl_ssl`` a SASL_SSL listener runs next to the plaintext
    # one (which the broker itself and the readiness probe keep using).
    min_isr = str(2 if replicas >= 3 else 1)
    sasl_ssl = dict(sasl_ssl or {})
    extra_port = sasl_ssl.pop("_port", None)
    listeners = f"PLAINTEXT://{host}:{port},CONTROLLER://127.0.0.1:{controller_port}"
    advertised = f"PLAINTEXT://{host}:{port}"
    protocols = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    if extra_port:
        listeners += f",SASL_SSL://127.0.0.1:{extra_port}"
        advertised += f",SASL_SSL://{SASL_SSL_HOST}:{extra_port}"
        protocols += ",SASL_SSL:SASL_SSL"
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": voters or f"{node_id}@127.0.0.1:{controller_port}",
        "listeners": listeners,
        "advertised.listeners": advertised,
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": protocols,
        "log.dirs": str(log_dir),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": str(replicas),
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": min_isr,
        "min.insync.replicas": min_isr,
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "2",
        "num.io.threads": "2",
        "background.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
        "num.replica.fetchers": "1",
        "log.cleaner.threads": "1",
        "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
        "socket.request.max.bytes": str(100 * 1024 * 1024),
        **sasl_ssl,
    }
    return "".join(f"{k}={_properties_value(v)}\n" for k, v in props.items())


def _jvm_options(settings: KafkaBrokerSettings) -> list[str]:
    # Small heap, the serial collector (no parallel GC threads) and two JIT threads keep the broker from
    # competing with the trainer for the two cores.
    return [f"-Xmx{settings.heap}", "-Xms64m", "-XX:+UseSerialGC", "-XX:CICompilerCount=2",
            "-XX:-UsePerfData", "-Djava.awt.headless=true", "-Dfile.encoding=UTF-8",
            f"-Dorg.slf4j.simpleLogger.defaultLogLevel={settings.log_level}",
            "-Dorg.slf4j.simpleLogger.showDateTime=true", "-Dlog4j2.level=warn"]


async def _probe_async(bootstrap: str, timeout: float) -> bool:
    """True when the broker answers a metadata request and lists itself (registered and unfenced)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000))
    try:
        await asyncio.wait_for(admin.start(), timeout)
        cluster = await asyncio.wait_for(admin.describe_cluster(), timeout)
        return bool(cluster.get("brokers"))
    except Exception:  # noqa: BLE001 - any failure means "not ready yet"
        return False
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


def _accepts_connections(bootstrap: str, timeout: float) -> bool:
    host, _, port = bootstrap.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def probe(bootstrap: str, timeout: float = 5.0) -> bool:
    """Synchronous readiness probe that also works when the caller already runs an event loop."""
    if not _accepts_connections(bootstrap, timeout):  # cheap, and keeps aiokafka's connect errors out of the log
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_probe_async(bootstrap, timeout))
    result: list[bool] = [False]
    thread = threading.Thread(target=lambda: result.__setitem__(0, asyncio.run(_probe_async(bootstrap, timeout))))
    thread.start()
    thread.join()
    return result[0]


def _set_parent_death_signal() -> None:  # runs in the child between fork and exec
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class KafkaBroker:
    """One single-node KRaft broker process on 127.0.0.1.

    ``start()`` fetches the jars if needed, formats a fresh data directory, launches ``kafka.Kafka`` and returns
    once the broker answers metadata requests (``start_seconds`` says how long that took). ``stop()`` sends
    SIGTERM (a clean KRaft shutdown), escalates to SIGKILL after ``grace`` seconds and removes the data directory
    if this object created it. ``die_with_parent=True`` (the default) makes the kernel stop the broker when the
    Python process dies, so a killed test run leaves no JVM behind (when ``start`` runs on the main thread);
    ``livevec kafka start`` turns it off.
    """

    def __init__(self, settings: KafkaBrokerSettings | None = None, *, die_with_parent: bool = True,
                 node_id: int = 1, controller_port: int | None = None, voters: str | None = None,
                 cluster_id: str | None = None, replicas: int = 1):
        self.settings = settings or KafkaBrokerSettings.from_env()
        self.die_with_parent = die_with_parent
        # a node of a ``KafkaCluster``: its id, its controller's port, every controller, the cluster's id
        self.node_id, self._controller_port, self.voters = node_id, controller_port, voters
        self.cluster_id, self.replicas = cluster_id, replicas
        self.port: int | None = None
        self.sasl_ssl_port: int | None = None
        self.controller_port: int | None = None
        self.data_dir: Path | None = None
        self.owns_data_dir = False
        self.process: subprocess.Popen | None = None
        self.start_seconds: float | None = None
        self._log_file = None

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise KafkaBrokerError("the broker is not started")
        return f"{self.settings.host}:{self.port}"

    @property
    def sasl_ssl_bootstrap(self) -> str | None:
        """``localhost:PORT`` of the SASL_SSL listener, when the settings turn it on."""
        return f"{SASL_SSL_HOST}:{self.sasl_ssl_port}" if self.sasl_ssl_port else None

    @property
    def log_path(self) -> Path | None:
        return self.data_dir / "broker.log" if self.data_dir else None

    def __enter__(self) -> "KafkaBroker":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> str:
        if self.process is not None:
            return self.bootstrap
        started = time.monotonic()
        java = find_java(self.settings.java_home)
        classpath = os.pathsep.join(str(j) for j in fetch_jars(self.settings))
        for attempt in range(3):
            try:
                self._launch(java, classpath)
                self._wait_ready()
                break
            except KafkaBrokerError as exc:
                log_event(logger, "kafka_broker_start_failed", level=logging.WARNING, attempt=attempt + 1,
                          error=str(exc))
                self._terminate(grace=5.0)
                self._remove_data()
                # a port of settings.port is tried again only when it was taken (see _launch); others are new
                if attempt == 2 or (self.settings.port and "Address already in use" not in str(exc)):
                    raise
        self.start_seconds = time.monotonic() - started
        log_event(logger, "kafka_broker_ready", bootstrap=self.bootstrap, sasl_ssl=self.sasl_ssl_bootstrap,
                  version=self.settings.version, pid=self.process.pid, seconds=round(self.start_seconds, 2),
                  data_dir=str(self.data_dir))
        return self.bootstrap

    def launch(self) -> None:
        """Start the process without waiting for it to answer: a cluster's nodes answer only once a majority
        of its controllers runs, so ``KafkaCluster`` launches them all, then waits (``wait_ready``)."""
        self._started = time.monotonic()
        self._launch(find_java(self.settings.java_home),
                     os.pathsep.join(str(j) for j in fetch_jars(self.settings)))

    def wait_ready(self) -> str:
        self._wait_ready()
        self.start_seconds = time.monotonic() - self._started
        log_event(logger, "kafka_broker_ready", bootstrap=self.bootstrap, node=self.node_id, pid=self.process.pid,
                  seconds=round(self.start_seconds, 2), data_dir=str(self.data_dir))
        return self.bootstrap

    def _launch(self, java: str, classpath: str) -> None:
        if self.settings.data_dir is not None:
            self.data_dir = self.settings.data_dir
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.owns_data_dir = False
        else:
            self.data_dir = Path(tempfile.mkdtemp(prefix="livevec-kafka-"))
            self.owns_data_dir = True
        # Kafka cannot bind port 0 and report: every port is in its configuration before it starts (the
        # controller's in the quorum voters, which every node must know). A port taken before it binds it makes
        # it exit with "Address already in use", and start() launches it again: on fresh ports, or on the port
        # that settings.port names (what held it, a connection's source port, is gone by then).
        self.port = self.settings.port or _free_port(self.settings.host)
        self.controller_port = self._controller_port or _free_port()
        while self.controller_port == self.port:
            self.controller_port = _free_port()
        log_dir = self.data_dir / "kraft-logs"
        config = self.data_dir / "server.properties"
        sasl_ssl, scram = None, []
        if self.settings.sasl_ssl:
            self.sasl_ssl_port = self.settings.sasl_ssl_port or _free_port()
            while self.sasl_ssl_port in (self.port, self.controller_port):
                self.sasl_ssl_port = _free_port()
            users = read_users_file(self.settings.users_file)
            keystore = self.data_dir / "sasl-ssl-keystore.pem"   # Kafka's PEM key store: the key, then the chain
            _write_private(keystore, self.settings.tls_key_file.read_text().strip() + "\n"
                           + self.settings.tls_cert_file.read_text().strip() + "\n")
            sasl_ssl = _sasl_ssl_properties(self.sasl_ssl_port, keystore, users, self.settings.client_ca_file,
                                            self.settings.client_auth)
            scram = [arg for credential in scram_credentials(users) for arg in ("--add-scram", credential)]
        # 0600: with a SASL_SSL listener it holds the PLAIN users' passwords
        _write_private(config, _server_properties(self.port, self.controller_port, log_dir, sasl_ssl,
                                                  self.settings.host, self.node_id, self.voters, self.replicas))
        base = [java, *_jvm_options(self.settings), "-cp", classpath]
        if not (log_dir / "meta.properties").exists():
            fmt = subprocess.run([*base, "kafka.tools.StorageTool", "format",
                                  "--cluster-id", self.cluster_id or _new_cluster_id(),
                                  "--config", str(config), "--ignore-formatted", *scram],
                                 capture_output=True, text=True, timeout=self.settings.start_timeout)
            if fmt.returncode != 0:
                raise KafkaBrokerError(f"kafka-storage format failed (exit {fmt.returncode}):\n"
                                       f"{(fmt.stdout + fmt.stderr).strip()[-2000:]}")
        self._log_file = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [*base, "kafka.Kafka", str(config)], stdin=subprocess.DEVNULL, stdout=self._log_file,
            stderr=subprocess.STDOUT, cwd=self.data_dir, start_new_session=True,
            # The kernel's parent-death signal fires when the *thread* that forked exits, so it is only safe
            # from the main thread (which lives as long as the process).
            preexec_fn=_set_parent_death_signal if self.die_with_parent and
            threading.current_thread() is threading.main_thread() else None)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.settings.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise KafkaBrokerError(f"the broker exited with code {self.process.returncode} while starting; "
                                       f"its log ({self.log_path}) ends with:\n{self.log_tail()}")
            if probe(self.bootstrap, timeout=2.0):
                return
            time.sleep(0.2)
        raise KafkaBrokerError(f"the broker did not answer on {self.bootstrap} within "
                               f"{self.settings.start_timeout:.0f} s (LIVEVEC_KAFKA_START_TIMEOUT); "
                               f"its log ends with:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace: float = 20.0) -> None:
        if self.process is None:
            return
        pid = self.process.pid
        code = self._terminate(grace)
        self._remove_data()
        log_event(logger, "kafka_broker_stopped", pid=pid, exit_code=code)

    def kill(self) -> None:
        """SIGKILL, as a crashed host or an operator's ``kill -9`` (the outage tests and the soak): the data
        directory stays, and ``start()`` brings the broker back from it, on the same port when
        ``settings.port`` names one."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            self.process.wait(timeout=30)
        self._terminate(grace=1.0)   # closes its log file

    def _terminate(self, grace: float) -> int | None:
        proc, self.process = self.process, None
        code = None
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(grace)
                except subprocess.TimeoutExpired:
                    log_event(logger, "kafka_broker_kill", level=logging.WARNING, pid=proc.pid, grace=grace)
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    proc.wait()
            code = proc.returncode
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return code

    def _remove_data(self) -> None:
        if self.owns_data_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def detach(self) -> dict:
        """Give up ownership (the process keeps running) and return the state ``livevec kafka stop`` needs."""
        if not self.is_running():
            raise KafkaBrokerError("the broker is not running")
        state = {"pid": self.process.pid, "bootstrap": self.bootstrap, "port": self.port,
                 "sasl_ssl_bootstrap": self.sasl_ssl_bootstrap,
                 "controller_port": self.controller_port, "data_dir": str(self.data_dir),
                 "owns_data_dir": self.owns_data_dir, "version": self.settings.version,
                 "log": str(self.log_path), "start_seconds": round(self.start_seconds or 0.0, 2),
                 "started_at": time.time()}
        self.process = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return state


# ----------------------------------------------------------------------------- daemon state (CLI)

def is_our_broker(pid: int, data_dir: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"kafka.Kafka" in cmdline and any(data_dir.encode() in part for part in cmdline)


def read_state(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def stop_daemon(state: dict, grace: float = 20.0) -> bool:
    """Stop a broker started by ``livevec kafka start``; False when it was not running any more."""
    pid, data_dir = int(state["pid"]), state["data_dir"]
    alive = is_our_broker(pid, data_dir)
    if alive:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and is_our_broker(pid, data_dir):
            time.sleep(0.1)
        if is_our_broker(pid, data_dir):
            log_event(logger, "kafka_broker_kill", level=logging.WARNING, pid=pid, grace=grace)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            while is_our_broker(pid, data_dir):
                time.sleep(0.05)
    if state.get("owns_data_dir"):
        shutil.rmtree(data_dir, ignore_errors=True)
    return alive
