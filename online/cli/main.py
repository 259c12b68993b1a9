"""The ``livevec`` command line.

Each sub-command is one module of ``online.cli``; this file only maps names to modules,
so that ``livevec kafka`` never imports numba and ``livevec frontend`` never imports the
Kafka client. A command module exposes ``configure(parser)`` and ``run(args) -> int``;
the log level is the one setting every command reads, so it is added here. ``livevec --version``
prints the release and the versions of the formats it writes (``version_text``).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from online import __version__
from ps_bridge.settings import Setting, SettingError, SettingGroup
from ps_bridge.structured_logging import configure_logging

LOGGING = SettingGroup("logging", (
    Setting("log_level", "LIVEVEC_LOG_LEVEL", default="INFO",
            help="DEBUG, INFO, WARNING or ERROR; logs are one key=value line per event on stderr"),
))
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def log_level(args: argparse.Namespace | None) -> str:
    level = LOGGING.read(args, os.environ)["log_level"].upper()
    if level not in LOG_LEVELS:
        raise SettingError("LIVEVEC_LOG_LEVEL", f"must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    return level

# name -> (module, one-line help). Imported lazily: start-up stays fast and a broken
# optional piece cannot take the other commands down with it.
COMMANDS: dict[str, tuple[str, str]] = {
    "kafka": ("online.cli.kafka", "start/stop/status a local single-node KRaft Kafka broker"),
    "produce": ("online.cli.produce", "stream a text file (plain, .gz, .xz) or stdin into a Kafka topic"),
    "train": ("online.cli.train", "train offline, in-process, and write word2vec text/binary files"),
    "scheduler": ("online.cli.scheduler", "run the ps-lite scheduler (and the checkpoint coordinator)"),
    "server": ("online.cli.server", "run a parameter server that holds a shard of the model"),
    "worker": ("online.cli.worker", "consume Kafka, train SGNS mini-batches, push to the servers"),
    "frontend": ("online.cli.frontend", "serve similarity queries and the live page over HTTP"),
    "up": ("online.cli.up", "run a whole local cluster: Kafka, scheduler, servers, workers, front end"),
    "deploy": ("online.cli.deploy", "render Marathon / Kubernetes deployment files"),
    "checkpoint": ("online.cli.checkpoint", "trigger or inspect coordinated checkpoints"),
    "settings": ("online.cli.settings", "print the settings reference (--markdown: docs/settings.md)"),
}


def formats() -> dict[str, int]:
    """Each format's name -> the version this release writes (``online``'s docstring lists them)."""
    from online.checkpoint.store import FORMAT, SHARD_FORMAT
    from online.cluster.ps_commands import EXCHANGE_VERSION
    from online.cluster.segment_layout import LAYOUT
    from online.frontend.export import EXPORT_FORMAT

    return {"checkpoint manifest": FORMAT, "checkpoint shard": SHARD_FORMAT, "host replica layout": LAYOUT,
            "exchange": EXCHANGE_VERSION, "export": EXPORT_FORMAT}


def version_text() -> str:
    """``livevec --version``: the release on the first line, the versions of the formats it writes on the second."""
    return f"livevec {__version__}\n" + ", ".join(f"{name} {v}" for name, v in formats().items())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="livevec", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="store_true",
                        help="print the release and the versions of the formats it writes, and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--version"]:
        print(version_text())
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        build_parser().parse_args(argv)  # prints help or the "invalid choice" error
        return 2
    name, rest = argv[0], argv[1:]
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"livevec {name}", description=help_text)
    module.configure(parser)
    LOGGING.add_arguments(parser)
    args = parser.parse_args(rest)
    try:
        configure_logging(log_level(args))
        return int(module.run(args) or 0)
    except SettingError as exc:
        print(f"livevec {name}: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
