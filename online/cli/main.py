"""The ``livevec`` command line.

Each sub-command lives in the module that owns the concept; this file only maps names
to modules, so that ``livevec kafka`` never imports numba and ``livevec frontend`` never
imports the Kafka client. A command module exposes ``configure(parser)`` and
``run(args) -> int``.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help). Imported lazily: start-up stays fast and a broken
# optional piece cannot take the other commands down with it.
COMMANDS: dict[str, tuple[str, str]] = {
    "kafka": ("online.stream.kafka_broker", "start/stop/status a local single-node KRaft Kafka broker"),
    "produce": ("online.stream.producer", "stream a text file (plain, .gz, .xz) or stdin into a Kafka topic"),
    "train": ("online.cli.train", "train offline, in-process, and write word2vec text/binary files"),
    "scheduler": ("online.cluster.scheduler", "run the ps-lite scheduler (and the checkpoint coordinator)"),
    "server": ("online.cluster.server", "run a parameter server that holds a shard of the model"),
    "worker": ("online.cluster.worker", "consume Kafka, train SGNS mini-batches, push to the servers"),
    "frontend": ("online.frontend.app", "serve similarity queries and the live page over HTTP"),
    "up": ("online.cli.up", "run a whole local cluster: Kafka, scheduler, servers, workers, front end"),
    "deploy": ("online.cli.deploy", "render Marathon / Kubernetes deployment files"),
    "checkpoint": ("online.cli.checkpoint", "trigger or inspect coordinated checkpoints"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="livevec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        build_parser().parse_args(argv)  # prints help or the "invalid choice" error
        return 2
    name, rest = argv[0], argv[1:]
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"livevec {name}", description=help_text)
    module.configure(parser)
    args = parser.parse_args(rest)
    from ps_bridge.structured_logging import configure_logging
    from ps_bridge.settings import SettingError

    configure_logging(getattr(args, "log_level", None))
    try:
        return int(module.run(args) or 0)
    except SettingError as exc:
        print(f"livevec {name}: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
