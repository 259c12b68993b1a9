"""``livevec up``: the whole system on one machine, from the deployment files themselves.

It starts a real Kafka broker (``online.stream.kafka_broker``), creates the topic, brings up the
Marathon group (scheduler, servers, workers, front end) through the local Marathon-like
runner (``online.deployment.local_runner``) so that what runs here is what the cluster
runs, and streams a corpus into the topic at a steady rate. The default corpus is the
generated one of ``online.stream.sample_corpus`` (endless, with planted topics, so neighbours of
``king`` or ``paris`` are meaningful within seconds on any machine); ``--corpus FILE``
streams a text file (plain, .gz or .xz) instead, one record per line when
``LIVEVEC_RECORD_FORMAT=json`` (``online.stream.records``), read by the workers as ``livevec train``
reads it. ``--demo sessions`` streams generated shopping sessions as JSON records
(``online.stream.sample_sessions``), read as item2vec reads them: the ``items`` field, tokens kept as
they are. Ctrl-C stops everything cleanly.

``--hosts N`` (root) runs the same group across N network-namespace hosts on one bridge
(``online.deployment.netns_lab``), placed as Mesos would place it, with Kafka on the bridge;
``--link 1gbit`` shapes every host's link. There the checkpoints live on MooseFS, as on the seed's
agents (``online.deployment.moosefs_lab``: a master on the bridge, a chunkserver per host, each host's
own mount at the group's hostPath); without Debian's packages or /dev/fuse it says so and uses a local
directory, unless ``--storage moosefs`` asks for MooseFS (then it stops).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from online.deployment.lab_runner import lab_cluster
from online.deployment.local_runner import LocalRunner
from online.deployment.moosefs_lab import MooseFSLab, moosefs_support_problem
from online.deployment.netns_lab import NetnsLab, check_rate, lab_support_problem
from online.deployment.topology import default_topology
from online.learner.settings import LEARNER, MODEL
from online.stream.kafka_broker import KafkaBroker
from online.stream.settings import BROKER, KafkaBrokerSettings
from online.stream.producer import DEFAULT_WORDS_PER_RECORD, produce_async
from online.stream.records import RECORDS, RecordFormat
from online.stream.sample_corpus import iter_sentences
from online.stream.sample_sessions import iter_sessions
from ps_bridge.structured_logging import log_event
from ps_bridge.settings import Setting, SettingError, SettingGroup, add_groups

log = logging.getLogger("livevec.up")
TOPIC = "livevec-text"


UP = SettingGroup("local cluster", (
    Setting("corpus", (), metavar="FILE", help="text file to stream (plain/.gz/.xz); default: the generated sample corpus"),
    Setting("demo", (), default="text", choices=("text", "sessions"),
            help="without --corpus: the generated corpus to stream: text (English-like sentences) or sessions "
                 "(shopping sessions as JSON records, trained as item2vec: the items field, tokens as they are)"),
    Setting("loop", (), bool, False, help="stream --corpus again and again"),
    Setting("servers", (), int, 1, minimum=1, help="parameter servers"),
    Setting("workers", (), int, 2, minimum=1, help="training workers"),
    Setting("rate", (), float, 2000.0, minimum=1e-9, help="lines per second streamed into Kafka"),
    Setting("partitions", (), int, 4, minimum=1, help="partitions of the topic"),
    Setting("work_dir", (), metavar="DIR", help="logs, sandboxes and checkpoints (default: a new temporary directory)"),
    Setting("duration", (), float, 0.0, minimum=0.0, help="stop after this many seconds (0 = until Ctrl-C)"),
    Setting("hosts", (), int, 0, minimum=0, maximum=250,
            help="run the group across this many network-namespace hosts (root; 0 = all on 127.0.0.1)"),
    Setting("link", (), metavar="RATE", help="with --hosts: shape every host's link, e.g. 1gbit or 100mbit"),
    Setting("storage", (), default="auto", choices=("auto", "moosefs", "local"),
            help="with --hosts: where the shared volume (checkpoints) lives: moosefs (a MooseFS mounted on every "
                 "host; stops if it cannot run), local (a directory of this machine) or auto (MooseFS when it "
                 "can run, else local, saying why)"),
    Setting("chunkservers", (), int, 0, minimum=0, help="with MooseFS: chunkservers on the first hosts (0 = one per host)"),
))
# The model settings the local cluster passes on to its roles (the rest keep their defaults).
UP_MODEL = MODEL.only("dim", "min_count")
# How the roles read the stream, passed on to them as well (``--demo sessions`` sets its own).
UP_READING = (LEARNER.only("tokenizer", "language"), RECORDS)
SESSIONS_READING = {"LIVEVEC_RECORD_FORMAT": "json", "LIVEVEC_RECORD_FIELD": "items", "LIVEVEC_TOKENIZER": "tokens"}


def configure(parser: argparse.ArgumentParser) -> None:
    add_groups(parser, (UP, UP_MODEL, *UP_READING, BROKER))


def read_settings(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> argparse.Namespace:
    """The command's settings as one namespace, every value checked against its declaration."""
    reading = {k: v for group in UP_READING for k, v in group.read(args, env).items()}
    return argparse.Namespace(**UP.read(args, env), **UP_MODEL.read(args, env), reading=reading,
                              records=RecordFormat(reading["record_format"], reading["record_field"] or ""),
                              broker=KafkaBrokerSettings.from_args(args, env))


def reading_env(args: argparse.Namespace) -> dict[str, str]:
    """The roles' settings of how to read the stream (the demo's, or the ones given to this command)."""
    if args.demo == "sessions" and not args.corpus:
        return dict(SESSIONS_READING)
    r = args.reading
    return {"LIVEVEC_TOKENIZER": r["tokenizer"], "LIVEVEC_LANGUAGE": r["language"],
            "LIVEVEC_RECORD_FORMAT": r["record_format"], "LIVEVEC_RECORD_FIELD": r["record_field"] or ""}


def _json_records(args: argparse.Namespace) -> bool:
    """Whether the stream is one JSON record per line (never grouped or cut into records of several lines)."""
    return reading_env(args)["LIVEVEC_RECORD_FORMAT"] == "json"


def _validate(args: argparse.Namespace) -> None:
    if args.corpus and not Path(args.corpus).is_file():
        raise SettingError("--corpus", f"no such file: {args.corpus}")
    if args.corpus and args.demo != "text":
        raise SettingError("--demo", "streams a generated corpus; it cannot go with --corpus")
    if args.link and not args.hosts:
        raise SettingError("--link", "shapes the links of --hosts; give --hosts N as well")
    try:
        check_rate(args.link)
    except ValueError as exc:
        raise SettingError("--link", str(exc)) from None
    if args.hosts:
        problem = lab_support_problem()
        if problem:
            raise SettingError("--hosts", f"{problem}; nothing was changed")
    if args.storage == "moosefs":
        if not args.hosts:
            raise SettingError("--storage", "moosefs runs on the lab's hosts; give --hosts N as well")
        problem = moosefs_support_problem()
        if problem:
            raise SettingError("--storage", f"{problem}; nothing was changed")
    if args.chunkservers > max(args.hosts, 0) and args.hosts:
        raise SettingError("--chunkservers", f"at most one per host ({args.hosts})")


def _corpus_lines(args: argparse.Namespace):
    if not args.corpus and args.demo == "sessions":
        import orjson
        yield from (orjson.dumps(session) for session in iter_sessions(seed=1))
        return
    if not args.corpus:
        yield from iter_sentences(seed=1)
        return
    from online.stream.producer import TextSource
    while True:
        source = TextSource(args.corpus)
        try:
            while chunk := source.read_chunk():
                yield from chunk
        finally:
            source.close()
        if not args.loop:
            return


class _Producer(threading.Thread):
    """Streams the corpus into the topic from its own event loop, until stopped."""

    def __init__(self, args: argparse.Namespace, bootstrap: str):
        super().__init__(name="producer", daemon=True)
        self.args, self.bootstrap = args, bootstrap
        self.stats = None
        self.error: BaseException | None = None
        self.loop = asyncio.new_event_loop()
        self._task = None

    def run(self) -> None:
        asyncio.set_event_loop(self.loop)
        # Text goes 10 lines to a record; JSON records are one line each, never cut.
        per_record, cut = (1, 0) if _json_records(self.args) else (10, DEFAULT_WORDS_PER_RECORD)
        self._task = self.loop.create_task(produce_async(
            _corpus_lines(self.args), bootstrap=self.bootstrap, topic=TOPIC, partitions=self.args.partitions,
            rate=self.args.rate / per_record, lines_per_record=per_record, words_per_record=cut, create_topic=True))
        try:
            self.stats = self.loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass
        except BaseException as exc:
            self.error = exc
            log_event(log, "producer_failed", logging.ERROR, error=f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        if self._task is not None:
            self.loop.call_soon_threadsafe(self._task.cancel)
        self.join(timeout=10)


def local_cluster(work_dir: Path, bootstrap: str, topic: str, *, servers: int, workers: int, frontend: bool = True,
                  env: dict[str, str] | None = None, lab: NetnsLab | None = None,
                  agents: int | None = None, volumes: dict | None = None,
                  frontends: int | None = None) -> LocalRunner:
    """The production Marathon group, pointed at a local broker, with this machine's counts; with ``lab``,
    placed over the lab's hosts as Mesos would place it. ``frontends`` front ends, each with its own ports
    (default: one, or none with ``frontend=False``)."""
    topology = default_topology(servers=servers, workers=workers, frontends=1)
    frontends = (1 if frontend else 0) if frontends is None else frontends
    kwargs = dict(
        work_dir=work_dir,
        env={"LIVEVEC_KAFKA_BOOTSTRAP": bootstrap, "LIVEVEC_KAFKA_TOPICS": topic,
             "PS_HEARTBEAT_INTERVAL": "1", "PS_HEARTBEAT_TIMEOUT": "10", **(env or {})},
        app_env={"frontend": {"LIVEVEC_HTTP_HOST": "0.0.0.0" if lab else "127.0.0.1", "LIVEVEC_MODEL_SOURCE": "ps"}},
        instances={"server": servers, "worker": workers, "frontend": frontends, "producer-example": 0},
        volumes=volumes or {"/mnt/mfs": Path(work_dir) / "shared"})
    if lab is not None:
        return lab_cluster(lab, topology, agents=agents, **kwargs)
    return LocalRunner.from_topology(topology, **kwargs)


def run(args: argparse.Namespace) -> int:
    args = read_settings(args)
    _validate(args)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="livevec-up-"))
    work.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    t0 = time.monotonic()
    lab = mfs = None
    if args.hosts:
        lab = NetnsLab(args.hosts, link=args.link).start()
        print(f"livevec up: {args.hosts} hosts {lab.hosts[0].address} - {lab.hosts[-1].address} on bridge "
              f"{lab.bridge} ({lab.bridge_address}), links {args.link or 'unshaped'}", file=sys.stderr, flush=True)
        args.broker = dataclasses.replace(args.broker, host=lab.bridge_address)
        problem = moosefs_support_problem() if args.storage == "auto" else None
        if problem:
            print(f"livevec up: no MooseFS ({problem}); checkpoints in {work / 'shared'}", file=sys.stderr, flush=True)
        elif args.storage != "local":
            try:
                mfs = MooseFSLab(lab, work, chunkservers=args.chunkservers or None).start()
            except BaseException:
                lab.close()
                raise
            print(f"livevec up: MooseFS master on {mfs.master_address}, {len(mfs.chunkserver_hosts)} chunkserver(s), "
                  f"mounted at {mfs.mount_point} on every host (operator's mount: {mfs.admin_path})",
                  file=sys.stderr, flush=True)
    print(f"livevec up: starting Kafka (work dir {work})", file=sys.stderr, flush=True)
    broker = KafkaBroker(args.broker)
    try:
        broker.start()
    except BaseException:
        if mfs is not None:
            mfs.close()
        if lab is not None:
            lab.close()
        raise
    runner = producer = None
    try:
        runner = local_cluster(work, broker.bootstrap, TOPIC, servers=args.servers, workers=args.workers,
                               env={"LIVEVEC_DIM": str(args.dim), "LIVEVEC_MIN_COUNT": str(args.min_count),
                                    **reading_env(args)}, lab=lab, volumes=mfs.volumes() if mfs else None)
        if lab is not None:
            for (app_id, index), host in sorted(runner.placement.items()):
                print(f"  {app_id}#{index} on {host}", file=sys.stderr, flush=True)
        print("livevec up: starting scheduler, servers, workers and front end", file=sys.stderr, flush=True)
        runner.start()
        producer = _Producer(args, broker.bootstrap)
        producer.start()
        runner.wait_healthy(timeout=120)
        url = runner.url("frontend", "http", "/")
        word = "sku-tent-2p" if args.demo == "sessions" and not args.corpus else "king"
        print(f"\nlivevec is up in {time.monotonic() - t0:.0f} s\n"
              f"  page:     {url}\n"
              f"  API:      {url}v1/similar?word={word}&k=10   {url}v1/stats   {url}openapi.json\n"
              f"  Kafka:    {broker.bootstrap} topic {TOPIC} ({args.partitions} partitions, "
              f"{args.rate:g} lines/s)\n"
              f"  logs:     {runner.log_dir}/  (Kafka: {broker.log_path})\n"
              f"Ctrl-C stops everything.", flush=True)
        deadline = time.monotonic() + args.duration if args.duration > 0 else None
        while not stop.wait(1.0):
            if deadline is not None and time.monotonic() > deadline:
                break
    finally:
        print("livevec up: stopping", file=sys.stderr, flush=True)
        if producer is not None:
            producer.stop()
        if runner is not None:
            runner.stop()
        broker.stop()
        if mfs is not None:
            mfs.close()
        if lab is not None:
            lab.close()
    return 0
