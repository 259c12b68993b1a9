"""``livevec produce FILE``: stream a text file (plain, .gz, .xz) or stdin into a Kafka topic."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping

from online.stream.client_logs import KAFKA_CLIENT_LOGS, ClientLogSettings
from online.stream.producer import DEFAULT_PARTITIONS, DEFAULT_WORDS_PER_RECORD, ProduceError, produce
from online.stream.security import KafkaUnreachable
from online.stream.settings import KAFKA, KAFKA_SECURITY, KafkaSecurity, parse_topics, validate_bootstrap, \
    validate_topic
from ps_bridge.settings import Setting, SettingError, SettingGroup

# The producer reads the same Kafka declarations as the workers; it writes one topic, and
# LIVEVEC_KAFKA_TOPICS stands in for --topic when it names exactly one.
PRODUCE_KAFKA = KAFKA.only("bootstrap", "topics").override(
    bootstrap=KAFKA["bootstrap"].replace(flags=("--bootstrap", "--kafka-bootstrap")),
    topics=KAFKA["topics"].replace(required=False, flags=(), help="the topic, when it names exactly one"))

PRODUCE = SettingGroup("produce", (
    Setting("topic", (), flags=("--topic",), help="topic to write (default: LIVEVEC_KAFKA_TOPICS when it names one)"),
    Setting("partitions", (), int, DEFAULT_PARTITIONS, minimum=1, help="partitions when the topic is created"),
    Setting("rate", (), float, minimum=1e-9, help="at most N records/s (default: as fast as Kafka takes them)"),
    Setting("lines_per_record", (), int, 1, minimum=1, help="lines grouped into one record"),
    Setting("words_per_record", (), int, DEFAULT_WORDS_PER_RECORD, minimum=0,
            help="cut longer lines into pieces of this many words (0 = never)"),
    Setting("compression", (), default="none", choices=("none", "gzip"),
            help="record batch compression (none: loopback and LAN links are not the bottleneck)"),
    Setting("progress", (), bool, True, help="a progress bar on stderr"),
))


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE|-", help="text file (plain, .gz or .xz) or - for stdin")
    PRODUCE_KAFKA.add_arguments(parser)
    KAFKA_SECURITY.add_arguments(parser)
    KAFKA_CLIENT_LOGS.add_arguments(parser)
    PRODUCE.add_arguments(parser)


def read_settings(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> dict:
    """Every setting of the command, checked; ``bootstrap``, ``topic`` and ``security`` resolved."""
    kafka = PRODUCE_KAFKA.read(args, env)
    opts = PRODUCE.read(args, env)
    opts["security"] = KafkaSecurity.from_args(args, env)
    opts["client_logs"] = ClientLogSettings.from_args(args, env)
    opts["bootstrap"] = validate_bootstrap(kafka["bootstrap"])
    if opts["topic"]:
        validate_topic(opts["topic"])
    else:
        topics = parse_topics(kafka["topics"])
        if len(topics) != 1:
            raise SettingError("--topic", "is required (or set LIVEVEC_KAFKA_TOPICS to exactly one topic)")
        opts["topic"] = topics[0]
    return opts


def run(args: argparse.Namespace) -> int:
    opts = read_settings(args)
    bootstrap, topic = opts["bootstrap"], opts["topic"]
    try:
        stats = produce(args.file, bootstrap=bootstrap, topic=topic, partitions=opts["partitions"],
                        rate=opts["rate"], lines_per_record=opts["lines_per_record"],
                        words_per_record=opts["words_per_record"],
                        compression=None if opts["compression"] == "none" else opts["compression"],
                        progress=opts["progress"], security=opts["security"], client_logs=opts["client_logs"])
    except (ProduceError, KafkaUnreachable) as exc:
        print(f"livevec produce: {exc}", file=sys.stderr)
        return 1
    print(stats.summary())
    return 0
