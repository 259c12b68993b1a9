"""The stream's settings: where Kafka is, how workers consume it, and the local broker.

Declared once for ``livevec worker``, ``livevec produce``, ``livevec kafka`` and ``livevec
up``; the dataclasses below are what the stream's code takes, built only from these
declarations (flags over ``LIVEVEC_KAFKA_*`` over defaults).
"""
from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from online.stream.client_logs import KAFKA_CLIENT_LOGS, ClientLogSettings
from online.stream.records import RECORDS, RecordFormat
from ps_bridge.settings import Setting, SettingError, SettingGroup, namespace

DEFAULT_KAFKA_VERSION = "4.1.2"
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_HEAP_RE = re.compile(r"^\d+[kKmMgG]?$")
_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+([.-][A-Za-z0-9]+)*$")
KAFKA_LOG_LEVELS = ("trace", "debug", "info", "warn", "error", "off")


def validate_topic(topic: str, setting: str = "--topic") -> str:
    if not topic or not _TOPIC_RE.match(topic) or topic in (".", ".."):
        raise SettingError(setting, f"a Kafka topic name is 1-249 characters of [A-Za-z0-9._-], got {topic!r}")
    return topic


def validate_bootstrap(bootstrap: str, setting: str = "LIVEVEC_KAFKA_BOOTSTRAP") -> str:
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SettingError(setting, f"must be HOST:PORT[,HOST:PORT...], got {bootstrap!r}")
    return bootstrap


def parse_topics(raw: str | None, setting: str = "LIVEVEC_KAFKA_TOPICS") -> tuple[str, ...]:
    topics = tuple(t.strip() for t in (raw or "").split(",") if t.strip())
    for topic in topics:
        validate_topic(topic, setting)
    return topics


KAFKA = SettingGroup("Kafka", (
    Setting("bootstrap", "LIVEVEC_KAFKA_BOOTSTRAP", required=True, flags=("--kafka-bootstrap", "--bootstrap"),
            metavar="HOST:PORT", help="HOST:PORT[,HOST:PORT...] of the Kafka cluster"),
    Setting("topics", "LIVEVEC_KAFKA_TOPICS", required=True, flags=("--kafka-topics",),
            help="comma-separated topics the workers read"),
    Setting("client_id", "LIVEVEC_KAFKA_CLIENT_ID", default="livevec", flags=(),
            help="Kafka client id, shown in broker logs and quotas"),
))

CONSUMER = SettingGroup("Kafka consumer", (
    Setting("group", "LIVEVEC_KAFKA_GROUP", default="livevec", flags=("--kafka-group",),
            help="consumer group of the workers"),
    Setting("batch_records", "LIVEVEC_KAFKA_BATCH_RECORDS", int, 500, minimum=1, maximum=1_000_000,
            flags=("--kafka-batch-records",), help="most records in one batch handed to a worker"),
    Setting("max_record_bytes", "LIVEVEC_KAFKA_MAX_RECORD_BYTES", int, 1024 * 1024, minimum=1,
            flags=("--kafka-max-record-bytes",), help="larger records are skipped as malformed"),
    Setting("offset_reset", "LIVEVEC_KAFKA_OFFSET_RESET", default="earliest", choices=("earliest", "latest"),
            flags=("--kafka-offset-reset",), help="where a group without committed offsets starts"),
    # The broker accepts 6 s .. 30 min by default (group.min/max.session.timeout.ms).
    Setting("session_timeout_ms", "LIVEVEC_KAFKA_SESSION_TIMEOUT_MS", int, 10000, minimum=6000, maximum=1_800_000,
            flags=(), help="how long before the group gives a silent worker's partitions to another"),
    Setting("revoke_grace", "LIVEVEC_KAFKA_REVOKE_GRACE", float, 5.0, minimum=0.0, flags=(),
            help="seconds a rebalance waits for batches in flight before they are dropped (and redelivered)"),
))

# ----------------------------------------------------------------------------- TLS and SASL

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# Named after Kafka's client settings (security.protocol, sasl.mechanism, ssl.truststore.location,
# ssl.endpoint.identification.algorithm...). The password is read from the environment or a file, never a
# flag (a flag shows in `ps` and in shell history).
KAFKA_SECURITY = SettingGroup("Kafka security", (
    Setting("security_protocol", "LIVEVEC_KAFKA_SECURITY_PROTOCOL", default="PLAINTEXT", choices=SECURITY_PROTOCOLS,
            flags=("--kafka-security-protocol",), metavar="PROTOCOL",
            help="security.protocol: PLAINTEXT, SSL (TLS), or SASL over either: SASL_{PLAINTEXT,SSL}"),
    Setting("sasl_mechanism", "LIVEVEC_KAFKA_SASL_MECHANISM", choices=SASL_MECHANISMS,
            flags=("--kafka-sasl-mechanism",), help="sasl.mechanism, required with SASL_*"),
    Setting("sasl_username", "LIVEVEC_KAFKA_SASL_USERNAME", flags=("--kafka-sasl-username",),
            help="the SASL user, required with SASL_*"),
    Setting("sasl_password", "LIVEVEC_KAFKA_SASL_PASSWORD", flags=(),
            help="the SASL password (or LIVEVEC_KAFKA_SASL_PASSWORD_FILE; never logged)"),
    # No flag for the file either: argparse would take --kafka-sasl-password for an abbreviation of it.
    Setting("sasl_password_file", "LIVEVEC_KAFKA_SASL_PASSWORD_FILE", flags=(),
            help="file holding the SASL password (a mounted secret)"),
    Setting("ssl_ca_file", "LIVEVEC_KAFKA_SSL_CA_FILE", flags=("--kafka-ssl-ca-file",), metavar="FILE",
            help="PEM CA certificates that sign the brokers' certificates (default: the system's)"),
    Setting("ssl_cert_file", "LIVEVEC_KAFKA_SSL_CERT_FILE", flags=("--kafka-ssl-cert-file",), metavar="FILE",
            help="PEM client certificate chain, for mutual TLS"),
    Setting("ssl_key_file", "LIVEVEC_KAFKA_SSL_KEY_FILE", flags=("--kafka-ssl-key-file",), metavar="FILE",
            help="PEM private key of the client certificate (unencrypted)"),
    Setting("ssl_endpoint_identification", "LIVEVEC_KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM", default="https",
            choices=("https", "none"), flags=("--kafka-ssl-endpoint-identification-algorithm",),
            help="https: the broker's certificate must name the host connected to; none: do not check"),
))

STREAM = (KAFKA, KAFKA_SECURITY, CONSUMER, RECORDS, KAFKA_CLIENT_LOGS)


class Secret:
    """A value that never shows itself in repr, str, logs or JSON; ``reveal()`` hands it to the client."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret(***)"

    __str__ = __repr__

    def __eq__(self, other) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def _readable(setting: str, path: str | None) -> Path | None:
    if not path:
        return None
    found = Path(path).expanduser()
    try:
        found.read_bytes()
    except OSError as exc:
        raise SettingError(setting, f"cannot read {found}: {exc.strerror or exc}") from None
    return found


@dataclass(frozen=True)
class KafkaSecurity:
    """How a client authenticates to Kafka and checks it: read and checked once, used by every client
    (``online.stream.security`` turns it into aiokafka's options and checks it against the brokers)."""

    protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = field(default=None, repr=False)
    password_setting: str = "LIVEVEC_KAFKA_SASL_PASSWORD"   # where the password came from, for errors
    ssl_ca_file: Path | None = None
    ssl_cert_file: Path | None = None
    ssl_key_file: Path | None = None
    check_hostname: bool = True

    @property
    def uses_ssl(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def describe(self) -> str:
        """For logs: what is on, never the secret."""
        parts = [self.protocol]
        if self.uses_sasl:
            parts.append(f"{self.sasl_mechanism} user={self.sasl_username}")
        if self.uses_ssl:
            parts.append(f"ca={self.ssl_ca_file or 'system'}" + (" mtls" if self.ssl_cert_file else "")
                         + ("" if self.check_hostname else " no-hostname-check"))
        return " ".join(parts)

    @classmethod
    def from_args(cls, args: argparse.Namespace | None, env: Mapping[str, str] | None = None) -> "KafkaSecurity":
        env = os.environ if env is None else env
        return cls.build(KAFKA_SECURITY.read(args, env))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **flags) -> "KafkaSecurity":
        return cls.from_args(namespace(**flags), env)

    @classmethod
    def build(cls, v: Mapping[str, str | None]) -> "KafkaSecurity":
        """Cross-setting rules: what SASL needs, files that must be readable. As in Kafka's clients, the SASL
        settings are ignored unless the protocol is SASL_*, and the TLS files unless it is *SSL: deploy files
        can then point at mounted secrets while one setting, the protocol, turns them on."""
        protocol = v["security_protocol"]
        sasl, tls = protocol.startswith("SASL_"), protocol.endswith("SSL")
        password, password_setting = None, "LIVEVEC_KAFKA_SASL_PASSWORD"
        if sasl:
            if v["sasl_password"] and v["sasl_password_file"]:
                raise SettingError("LIVEVEC_KAFKA_SASL_PASSWORD_FILE",
                                   "set either it or LIVEVEC_KAFKA_SASL_PASSWORD, not both")
            password = v["sasl_password"]
            if v["sasl_password_file"]:
                password_setting = "LIVEVEC_KAFKA_SASL_PASSWORD_FILE"
                path = _readable(password_setting, v["sasl_password_file"])
                password = path.read_text(encoding="utf-8", errors="strict").rstrip("\r\n")
                if not password:
                    raise SettingError(password_setting, f"{path} is empty")
            for name, value in (("LIVEVEC_KAFKA_SASL_MECHANISM", v["sasl_mechanism"]),
                                ("LIVEVEC_KAFKA_SASL_USERNAME", v["sasl_username"]),
                                (password_setting, password)):
                if not value:
                    raise SettingError(name, f"is required with LIVEVEC_KAFKA_SECURITY_PROTOCOL={protocol}")
        files: dict[str, Path | None] = {"ssl_ca_file": None, "ssl_cert_file": None, "ssl_key_file": None}
        if tls:
            for key, name in (("ssl_ca_file", "LIVEVEC_KAFKA_SSL_CA_FILE"),
                              ("ssl_cert_file", "LIVEVEC_KAFKA_SSL_CERT_FILE"),
                              ("ssl_key_file", "LIVEVEC_KAFKA_SSL_KEY_FILE")):
                files[key] = _readable(name, v[key])
            if files["ssl_key_file"] and not files["ssl_cert_file"]:
                raise SettingError("LIVEVEC_KAFKA_SSL_CERT_FILE", "is required with LIVEVEC_KAFKA_SSL_KEY_FILE")
        return cls(protocol=protocol, sasl_mechanism=v["sasl_mechanism"] if sasl else None,
                   sasl_username=v["sasl_username"] if sasl else None,
                   sasl_password=Secret(password) if sasl else None, password_setting=password_setting,
                   check_hostname=v["ssl_endpoint_identification"] != "none", **files)


@dataclass(frozen=True)
class StreamSettings:
    """What a worker's stream needs."""

    bootstrap: str
    topics: tuple[str, ...]
    group: str = "livevec"
    batch_records: int = 500
    max_record_bytes: int = 1024 * 1024
    offset_reset: str = "earliest"
    session_timeout_ms: int = 10000
    revoke_grace: float = 5.0
    client_id: str = "livevec"
    security: KafkaSecurity = field(default_factory=KafkaSecurity)
    records: RecordFormat = field(default_factory=RecordFormat)
    client_logs: ClientLogSettings = field(default_factory=ClientLogSettings)

    @classmethod
    def from_args(cls, args: argparse.Namespace | None, env: Mapping[str, str] | None = None) -> "StreamSettings":
        env = os.environ if env is None else env
        values = {**KAFKA.read(args, env), **CONSUMER.read(args, env), "security": KafkaSecurity.from_args(args, env),
                  "records": RecordFormat.from_args(args, env), "client_logs": ClientLogSettings.from_args(args, env)}
        validate_bootstrap(values["bootstrap"])
        values["topics"] = parse_topics(values["topics"])
        if not values["topics"]:
            raise SettingError("LIVEVEC_KAFKA_TOPICS", "must name at least one topic")
        if not values["group"]:
            raise SettingError("LIVEVEC_KAFKA_GROUP", "must not be blank")
        return cls(**values)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **flags) -> "StreamSettings":
        """From the environment; keyword arguments stand for flags (a list of topics is fine)."""
        if isinstance(flags.get("topics"), (list, tuple)):
            flags["topics"] = ",".join(flags["topics"])
        unknown = set(flags) - set(cls.__dataclass_fields__)
        if unknown:
            raise TypeError(f"unknown StreamSettings field {sorted(unknown)[0]!r}")
        objects = {k: v for k in ("security", "records", "client_logs") if (v := flags.pop(k, None)) is not None}
        settings = cls.from_args(namespace(**flags), env)
        return dataclasses.replace(settings, **objects) if objects else settings


# ----------------------------------------------------------------------------- the local broker

def _cache_root(env: Mapping[str, str]) -> Path:
    xdg = env.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "livevec"


BROKER = SettingGroup("local Kafka broker", (
    Setting("version", "LIVEVEC_KAFKA_VERSION", default=DEFAULT_KAFKA_VERSION, flags=("--version",),
            help="Apache Kafka version of the local broker"),
    Setting("cache_dir", "LIVEVEC_CACHE_DIR", flags=(), help="jar cache (default $XDG_CACHE_HOME/livevec or "
                                                             "~/.cache/livevec)"),
    Setting("heap", "LIVEVEC_KAFKA_HEAP", default="512m", help="JVM -Xmx of the broker"),
    Setting("host", "LIVEVEC_KAFKA_HOST", default="127.0.0.1", flags=("--kafka-host",),
            help="IPv4 address the plaintext listener binds and advertises (a lab's bridge, for other hosts)"),
    Setting("port", "LIVEVEC_KAFKA_PORT", int, 0, minimum=0, maximum=65535, help="broker port (0 = a free port)"),
    Setting("data_dir", "LIVEVEC_KAFKA_DATA_DIR",
            help="keep the broker's data here (default: a temporary folder deleted by stop)"),
    Setting("start_timeout", "LIVEVEC_KAFKA_START_TIMEOUT", float, 90.0, minimum=1.0,
            help="seconds before a broker that does not answer counts as failed"),
    Setting("state_file", "LIVEVEC_KAFKA_STATE_FILE",
            help="where `livevec kafka start` records the daemon (default $LIVEVEC_CACHE_DIR/kafka-broker.json)"),
    Setting("log_level", "LIVEVEC_KAFKA_LOG_LEVEL", default="warn", choices=KAFKA_LOG_LEVELS, flags=(),
            help="the broker's own log level (broker.log in its data directory)"),
    Setting("java_home", "JAVA_HOME", flags=(), help="the Java 17+ that runs the broker (default: java on PATH)"),
    # The SASL_SSL listener, next to the plaintext one: on when a certificate is given.
    Setting("tls_cert_file", "LIVEVEC_KAFKA_BROKER_CERT_FILE", flags=("--tls-cert-file",), metavar="FILE",
            help="PEM certificate chain of a SASL-over-TLS listener next to the plaintext one (turns it on; "
                 "it must name localhost)"),
    Setting("tls_key_file", "LIVEVEC_KAFKA_BROKER_KEY_FILE", flags=("--tls-key-file",), metavar="FILE",
            help="PEM private key of that certificate (PKCS#8, unencrypted)"),
    Setting("sasl_ssl_port", "LIVEVEC_KAFKA_SASL_SSL_PORT", int, 0, minimum=0, maximum=65535,
            help="port of that listener (0 = a free port)"),
    Setting("users_file", "LIVEVEC_KAFKA_BROKER_USERS_FILE", flags=("--users-file",), metavar="FILE",
            help="USER:PASSWORD lines: that listener's users (SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN)"),
    Setting("client_ca_file", "LIVEVEC_KAFKA_BROKER_CLIENT_CA_FILE", flags=("--client-ca-file",), metavar="FILE",
            help="PEM CA whose client certificates that listener checks (mutual TLS)"),
    Setting("client_auth", "LIVEVEC_KAFKA_BROKER_CLIENT_AUTH", default="required", choices=("required", "requested"),
            help="with a client CA: every client must present a certificate it signed (required), or only a "
                 "certificate presented is checked (requested)"),
))

_USER_RE = re.compile(r"^[A-Za-z0-9._@-]{1,64}$")


def read_users_file(path: Path, setting: str = "LIVEVEC_KAFKA_BROKER_USERS_FILE") -> dict[str, Secret]:
    """``USER:PASSWORD`` per line (blank lines and ``#`` comments skipped). Names are restricted so that they
    fit Kafka's SCRAM and JAAS syntax unquoted; a password may hold anything but a double quote or a newline."""
    users: dict[str, Secret] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, password = line.partition(":")
        if not sep or not _USER_RE.match(name) or not password or '"' in password or "\\" in password:
            raise SettingError(setting, f"{path} line {number}: must be USER:PASSWORD, USER of "
                                        f"[A-Za-z0-9._@-], a password without quotes or backslashes")
        users[name] = Secret(password)
    if not users:
        raise SettingError(setting, f"{path} names no user")
    return users


@dataclass(frozen=True)
class KafkaBrokerSettings:
    """How to fetch and run the local broker."""

    version: str = DEFAULT_KAFKA_VERSION
    cache_dir: Path = field(default_factory=lambda: _cache_root(os.environ))
    heap: str = "512m"
    host: str = "127.0.0.1"
    port: int = 0
    data_dir: Path | None = None
    start_timeout: float = 90.0
    state_file: Path | None = None
    log_level: str = "warn"
    java_home: str | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    sasl_ssl_port: int = 0
    users_file: Path | None = None
    client_ca_file: Path | None = None
    client_auth: str = "required"

    @property
    def sasl_ssl(self) -> bool:
        """Whether the broker runs a SASL_SSL listener next to the plaintext one."""
        return self.tls_cert_file is not None

    @property
    def jars_dir(self) -> Path:
        return self.cache_dir / f"kafka-{self.version}"

    @property
    def resolved_state_file(self) -> Path:
        return self.state_file or (self.cache_dir / "kafka-broker.json")

    @classmethod
    def from_args(cls, args: argparse.Namespace | None, env: Mapping[str, str] | None = None) \
            -> "KafkaBrokerSettings":
        env = os.environ if env is None else env
        v = BROKER.read(args, env)
        if not _VERSION_RE.match(v["version"]):
            raise SettingError("LIVEVEC_KAFKA_VERSION", f"must look like 4.1.2, got {v['version']!r}")
        if not _HEAP_RE.match(v["heap"]):
            raise SettingError("LIVEVEC_KAFKA_HEAP", f"must be a JVM size such as 512m or 1g, got {v['heap']!r}")
        try:
            ipaddress.IPv4Address(v["host"])
        except ValueError:
            raise SettingError("LIVEVEC_KAFKA_HOST", f"must be an IPv4 address, got {v['host']!r}") from None
        v["cache_dir"] = Path(v["cache_dir"]).expanduser() if v["cache_dir"] else _cache_root(env)
        for key in ("data_dir", "state_file"):
            v[key] = Path(v[key]).expanduser() if v[key] else None
        v["tls_cert_file"] = _readable("LIVEVEC_KAFKA_BROKER_CERT_FILE", v["tls_cert_file"])
        v["tls_key_file"] = _readable("LIVEVEC_KAFKA_BROKER_KEY_FILE", v["tls_key_file"])
        v["users_file"] = _readable("LIVEVEC_KAFKA_BROKER_USERS_FILE", v["users_file"])
        v["client_ca_file"] = _readable("LIVEVEC_KAFKA_BROKER_CLIENT_CA_FILE", v["client_ca_file"])
        if v["tls_cert_file"]:
            if not v["tls_key_file"]:
                raise SettingError("LIVEVEC_KAFKA_BROKER_KEY_FILE", "is required with LIVEVEC_KAFKA_BROKER_CERT_FILE")
            if not v["users_file"]:
                raise SettingError("LIVEVEC_KAFKA_BROKER_USERS_FILE",
                                   "is required with LIVEVEC_KAFKA_BROKER_CERT_FILE (the SASL_SSL listener's users)")
            read_users_file(v["users_file"])
        else:
            for key, name in (("tls_key_file", "LIVEVEC_KAFKA_BROKER_KEY_FILE"),
                              ("users_file", "LIVEVEC_KAFKA_BROKER_USERS_FILE"),
                              ("client_ca_file", "LIVEVEC_KAFKA_BROKER_CLIENT_CA_FILE")):
                if v[key]:
                    raise SettingError(name, "is set but LIVEVEC_KAFKA_BROKER_CERT_FILE is not (the SASL_SSL "
                                             "listener needs a certificate)")
        return cls(**v)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **flags) -> "KafkaBrokerSettings":
        return cls.from_args(namespace(**flags), env)
