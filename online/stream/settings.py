"""The stream's settings: where Kafka is, how workers consume it, and the local broker.

Declared once for ``livevec worker``, ``livevec produce``, ``livevec kafka`` and ``livevec
up``; the dataclasses below are what the stream's code takes, built only from these
declarations (flags over ``LIVEVEC_KAFKA_*`` over defaults).
"""
from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

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

STREAM = (KAFKA, CONSUMER)


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

    @classmethod
    def from_args(cls, args: argparse.Namespace | None, env: Mapping[str, str] | None = None) -> "StreamSettings":
        env = os.environ if env is None else env
        values = {**KAFKA.read(args, env), **CONSUMER.read(args, env)}
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
        return cls.from_args(namespace(**flags), env)


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
))


@dataclass(frozen=True)
class KafkaBrokerSettings:
    """How to fetch and run the local broker."""

    version: str = DEFAULT_KAFKA_VERSION
    cache_dir: Path = field(default_factory=lambda: _cache_root(os.environ))
    heap: str = "512m"
    port: int = 0
    data_dir: Path | None = None
    start_timeout: float = 90.0
    state_file: Path | None = None
    log_level: str = "warn"
    java_home: str | None = None

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
        v["cache_dir"] = Path(v["cache_dir"]).expanduser() if v["cache_dir"] else _cache_root(env)
        for key in ("data_dir", "state_file"):
            v[key] = Path(v[key]).expanduser() if v[key] else None
        return cls(**v)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **flags) -> "KafkaBrokerSettings":
        return cls.from_args(namespace(**flags), env)
