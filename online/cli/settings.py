"""``livevec settings``: the settings reference, generated from the ``Setting`` declarations.

Each command declares what it reads in ``SettingGroup``s, and its ``--help`` is built from
them. This command collects the groups each command adds to its parser, and the few groups
read outside a parser (``read_elsewhere``). It writes one table per component, as Kafka's
configuration docs do: name (variables and flags), type, default, valid values, the commands
that read it, and help. A short table of the settings that matter first comes before them.

    livevec settings --markdown --out docs/settings.md    # the reference (tests/test_settings_reference.py)
    livevec settings                                       # one line a setting: name, default, readers

A setting read by a command but in no component, or in a component but read by no command,
stops the rendering with its name: the reference covers exactly what the commands read.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ps_bridge.settings import Setting, SettingGroup

REGENERATE = "livevec settings --markdown --out docs/settings.md"
_ROLE_ORDER = ("scheduler", "server", "worker", "frontend", "train", "produce", "up", "kafka", "checkpoint",
               "deploy", "deploy healthcheck", "ps_bridge.roles")
_TYPES = {str: "string", int: "int", float: "float", bool: "boolean"}

# The settings a newcomer sets first, with what each decides (one line each; the rest of the
# row comes from the declaration).
FIRST: tuple[tuple[str, str], ...] = (
    ("DMLC_PS_ROOT_URI", "where every node finds the scheduler (a DNS name is fine)"),
    ("DMLC_PS_ROOT_PORT", "the scheduler's port"),
    ("DMLC_NUM_SERVER", "parameter servers in the cluster; the same on every node"),
    ("DMLC_NUM_WORKER", "workers in the cluster; the replicas follow from it, and with them the sync interval and "
                        "the kernel `LIVEVEC_KERNEL=auto` picks"),
    ("LIVEVEC_ELASTIC_WORKERS", "lets workers and the front end join and leave a running cluster; set it on every "
                                "node"),
    ("LIVEVEC_KAFKA_BOOTSTRAP", "the Kafka cluster the workers read"),
    ("LIVEVEC_KAFKA_TOPICS", "the topics the workers train on"),
    ("LIVEVEC_DIM", "the vector size; the same on every role"),
    ("LIVEVEC_VOCAB_CAPACITY", "most words counted at once, by a worker and by each server"),
    ("LIVEVEC_EXCHANGE", "`replica`: each worker trains a local replica and syncs deltas; `pullpush`: pull and "
                         "push every mini-batch"),
    ("LIVEVEC_KERNEL", "`auto`: `hogbatch` in `livevec train` and with at most 2 declared workers, else `pairs`"),
    ("LIVEVEC_SYNC_TOKENS", "tokens a replica trains between syncs (0: 640,000 / replicas², 100 - 10,000 where replicas merge; one: 160,000)"),
    ("LIVEVEC_HOST_REPLICA", "a tmpfs directory where the workers of one host share one replica"),
    ("LIVEVEC_CHECKPOINT_DIR", "coordinated checkpoints and rollback; set it on the scheduler, the servers and the "
                               "workers"),
    ("LIVEVEC_MODEL_SOURCE", "what the front end serves: a word2vec file, or the parameter servers (`ps`)"),
    ("LIVEVEC_HTTP_PORT", "the front end's port"),
    ("LIVEVEC_METRICS_PORT", "`/metrics`, `/health` and `/ready` of a scheduler, server or worker"),
)


@dataclass(frozen=True)
class Component:
    """One table of the reference: the groups that declare its settings, in order."""

    title: str
    about: str
    groups: tuple[SettingGroup, ...]


def components() -> tuple[Component, ...]:
    """The reference's tables. A setting belongs to the first component that declares it."""
    from online.checkpoint.settings import CHECKPOINTS, COORDINATOR, STORE
    from online.cli.main import LOGGING
    from online.cli.produce import PRODUCE
    from online.cli.train import TRAIN
    from online.cli.up import UP
    from online.cluster.node_settings import LIVEVEC_NODE
    from online.cluster.replica import REPLICA, SYNC
    from online.cluster.server import EXCHANGE
    from online.cluster.stopping import STOPPING
    from online.cluster.worker import WORKER
    from online.deployment.healthcheck import HEALTHCHECK
    from online.frontend.settings import FRONTEND
    from online.frontend.synthetic import SYNTHETIC
    from online.learner.settings import LEARNER, MODEL
    from online.stream.client_logs import KAFKA_CLIENT_LOGS
    from online.stream.records import RECORDS
    from online.stream.settings import BROKER, CONSUMER, KAFKA, KAFKA_SECURITY
    from ps_bridge.roles import PLAIN_NODE
    from ps_bridge.settings import NODE

    return (
        Component("Cluster node", "ps-lite's own variables, with ps-lite's meanings, and what every livevec node "
                                  "adds to them.", (NODE, LIVEVEC_NODE, STOPPING, LOGGING)),
        Component("Model and learner", "The model must be the same on every role that holds it (a worker and a "
                                       "server with different `dim` cannot talk).", (MODEL, LEARNER)),
        Component("Workers and the replica exchange", "How a worker trains and how its replica syncs with the "
                                                      "servers.", (WORKER, SYNC, REPLICA, EXCHANGE)),
        Component("Kafka stream", "How the workers (and `livevec produce`) reach Kafka, and how a record becomes "
                                  "text.", (KAFKA, CONSUMER, KAFKA_SECURITY, KAFKA_CLIENT_LOGS, RECORDS)),
        Component("Checkpoints", "Coordinated checkpoints and rollback: the scheduler coordinates, the servers "
                                 "and workers take part.", (COORDINATOR, CHECKPOINTS, STORE)),
        Component("Front end", "The HTTP front end: what it serves, how it searches, and its limits under load.",
                  (FRONTEND, SYNTHETIC)),
        Component("Local Kafka broker", "`livevec kafka` and `livevec up` start a single-node KRaft broker.",
                  (BROKER,)),
        Component("Offline training", "`livevec train` (it also reads the model, learner and record settings).",
                  (TRAIN,)),
        Component("Producer", "`livevec produce` (it also reads the Kafka settings).", (PRODUCE,)),
        Component("Local cluster", "`livevec up` (it also reads some model, reading and broker settings, and "
                                   "passes them on to its roles).", (UP,)),
        Component("Container health check", "`livevec deploy healthcheck`, the image's HEALTHCHECK.",
                  (HEALTHCHECK,)),
        Component("Plain ps-lite roles", "`python -m ps_bridge.roles scheduler|server`: ps-lite's roles without "
                                         "livevec (they also read the cluster node's variables).", (PLAIN_NODE,)),
    )


def read_elsewhere() -> tuple[tuple[str, tuple[SettingGroup, ...], bool], ...]:
    """Groups read outside a command's parser: (reader, groups, whether the reader reads them as declared).

    The health check only looks at the role's variables to find its port: it reads them, but
    without their flags and without requiring them, so it does not shape their rows."""
    from online.cluster.node_settings import LIVEVEC_NODE
    from online.deployment.healthcheck import HEALTHCHECK
    from online.frontend.settings import FRONTEND
    from online.frontend.synthetic import SYNTHETIC
    from ps_bridge.roles import PLAIN_NODE
    from ps_bridge.settings import NODE

    return (
        # --source online.frontend.synthetic:create_source reads its sizes from the environment
        ("frontend", (SYNTHETIC,), True),
        ("deploy healthcheck", (HEALTHCHECK,), True),
        # the probe falls back from its URL to the port of the role the container runs
        ("deploy healthcheck", tuple(_looked_at(g) for g in (NODE.only("role", "root_port"), FRONTEND.only("port"),
                                                            LIVEVEC_NODE.only("metrics_port"))), False),
        ("ps_bridge.roles", (NODE.without("role"), PLAIN_NODE), True),
    )


def _looked_at(group: SettingGroup) -> SettingGroup:
    return SettingGroup(group.title, tuple(s.replace(flags=(), required=False) for s in group))


@contextlib.contextmanager
def _recording(into: list[SettingGroup]) -> Iterator[None]:
    """Record every group added to a parser while a command configures it."""
    original = SettingGroup.add_arguments

    def add_arguments(group: SettingGroup, parser: argparse.ArgumentParser) -> None:
        into.append(group)
        original(group, parser)

    SettingGroup.add_arguments = add_arguments
    try:
        yield
    finally:
        SettingGroup.add_arguments = original


def command_groups() -> list[tuple[str, tuple[SettingGroup, ...], bool]]:
    """(reader, the groups it reads, as declared?): each ``livevec`` command's parser, then ``read_elsewhere``."""
    from online.cli.main import COMMANDS, LOGGING

    readers: list[tuple[str, tuple[SettingGroup, ...], bool]] = []
    for name, (module_name, _help) in COMMANDS.items():
        if name == "settings":
            continue
        module = importlib.import_module(module_name)
        groups: list[SettingGroup] = []
        with _recording(groups):
            module.configure(argparse.ArgumentParser(prog=f"livevec {name}"))
        readers.append((name, (*groups, LOGGING), True))
    return readers + list(read_elsewhere())


def _key(setting: Setting) -> tuple:
    """A setting's identity across the groups that derive from its declaration: its variables
    (a role may give it another default or flag), or for a flag-only setting its flag and help."""
    if setting.variables:
        return setting.variables
    return ("", setting.field, setting.flag_names, setting.help)


@dataclass
class Entry:
    """One row: the declaration in its component, and how each reader declares it (``uses``;
    ``looks`` are the readers that only look at its value)."""

    declared: Setting
    component: int
    uses: list[tuple[str, Setting]] = field(default_factory=list)
    looks: list[tuple[str, Setting]] = field(default_factory=list)

    @property
    def readers(self) -> list[str]:
        return _ordered({reader for reader, _ in self.uses + self.looks})

    @property
    def shaping(self) -> list[tuple[str, Setting]]:
        """The uses its cells describe: the readers that read it as declared, else those that look."""
        return self.uses or self.looks


def _ordered(readers: Iterable[str]) -> list[str]:
    rank = {name: i for i, name in enumerate(_ROLE_ORDER)}
    return sorted(set(readers), key=lambda r: (rank.get(r, len(rank)), r))


@dataclass
class Reference:
    components: tuple[Component, ...]
    entries: list[Entry]
    commands: tuple[str, ...]   # every ``livevec`` command that reads settings

    def by_variable(self) -> dict[str, Entry]:
        return {v: e for e in self.entries for v in e.declared.variables}

    def variables(self) -> set[str]:
        return set(self.by_variable())


def collect() -> Reference:
    comps = components()
    entries: dict[tuple, Entry] = {}
    for i, comp in enumerate(comps):
        for group in comp.groups:
            for setting in group:
                entries.setdefault(_key(setting), Entry(setting, i))
    readers = command_groups()
    for reader, groups, as_declared in readers:
        for group in groups:
            for setting in group:
                entry = entries.get(_key(setting))
                if entry is None:
                    raise LookupError(f"{setting.name} ({group.title}) is read by {reader} but declared in no "
                                      f"component of online/cli/settings.py")
                uses = entry.uses if as_declared else entry.looks
                if (reader, setting) not in uses:
                    uses.append((reader, setting))
    for entry in entries.values():
        if not entry.readers:
            raise LookupError(f"{entry.declared.name} is in the reference but no command reads it")
    from online.cli.main import COMMANDS
    commands = tuple(name for name in COMMANDS if name != "settings")
    return Reference(comps, list(entries.values()), commands)


# ----------------------------------------------------------------------------- cells

def _escape(text: str) -> str:
    """Text for a Markdown table cell: one line, pipes and HTML-looking brackets escaped."""
    text = " ".join(str(text).split())
    return (text.replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*")
            .replace("<", "&lt;").replace(">", "&gt;"))


def _code(text: str) -> str:
    return "`" + str(text).replace("|", "\\|") + "`"


def _number(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        shown = repr(value)
        return shown[:-2] if shown.endswith(".0") else shown
    return str(value)


def _default(setting: Setting) -> str:
    if setting.required:
        return "required"
    if setting.default is None:
        return "unset"
    if setting.type is str:
        return _code(setting.default) if setting.default != "" else '`""`'
    return _code(_number(setting.default))


def _valid(setting: Setting) -> str:
    if setting.choices is not None:
        return ", ".join(_code(c) for c in setting.choices)
    low, high = setting.minimum, setting.maximum
    if low is not None and high is not None:
        return f"[{_number(low)}, {_number(high)}]"
    if low is not None:
        return f"&gt;= {_number(low)}"
    if high is not None:
        return f"&lt;= {_number(high)}"
    return ""


def _readers_text(readers: Iterable[str], commands: tuple[str, ...]) -> str:
    readers = _ordered(readers)
    if set(commands) <= set(readers):
        rest = [r for r in readers if r not in commands]
        return ", ".join(["every `livevec` command", *rest])
    return ", ".join(readers)


def _variants(entry: Entry, shown: Callable[[Setting], str], commands: tuple[str, ...]) -> str:
    """A cell that differs between readers lists each value with the readers it applies to."""
    values: dict[str, list[str]] = {}
    for value in [shown(entry.declared)] + [shown(s) for _, s in entry.shaping]:
        values.setdefault(value, [])
    for reader, setting in entry.shaping:
        values[shown(setting)].append(reader)
    values = {v: r for v, r in values.items() if r}
    if len(values) == 1:
        return next(iter(values))
    return "; ".join(f"{v} ({_readers_text(r, commands)})" for v, r in values.items() if v)


def _flags(setting: Setting) -> str:
    return ", ".join(_code(f) for f in sorted(setting.flag_names))


def _name(entry: Entry, commands: tuple[str, ...]) -> str:
    variables = ", ".join(_code(v) for v in entry.declared.variables)
    flags = _variants(entry, _flags, commands)
    return "<br>".join(part for part in (variables, flags) if part)


def _help(entry: Entry, commands: tuple[str, ...]) -> str:
    parts = [entry.declared.help]
    seen = {entry.declared.help}
    for reader, setting in entry.shaping:
        if setting.help and setting.help not in seen:
            seen.add(setting.help)
            parts.append(f"{reader}: {setting.help}")
    whys: dict[str, list[str]] = {}
    for reader, setting in entry.shaping:
        if setting.why:
            whys.setdefault(setting.why, []).append(reader)
    for why, readers in whys.items():
        parts.append(f"{_readers_text(readers, commands)}: {why}")
    return "; ".join(_escape(p) for p in parts if p)


# ----------------------------------------------------------------------------- documents

def _anchor(title: str) -> str:
    return "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c == "-")


def render_markdown(reference: Reference | None = None) -> str:
    ref = reference or collect()
    commands = ref.commands
    by_variable = ref.by_variable()
    out = [
        "# Settings reference",
        "",
        f"Generated from the `Setting` declarations by `{REGENERATE}`; edit the declarations, not this file "
        "(`tests/test_settings_reference.py` fails when it is stale).",
        "",
        "A setting is read from its flag, else from its environment variable (of several, the first one set), "
        "else it takes its default. A bad value stops the command at start with a message that names the "
        "setting. Booleans take 1/0, true/false, yes/no or on/off, and a boolean's flag `--x` has its `--no-x`. "
        "*Read by* names `livevec` commands; `ps_bridge.roles` is `python -m ps_bridge.roles`. Where readers "
        "differ (another default, another flag), the cell names the readers of each.",
        "",
        "## Settings that matter first",
        "",
        "| setting | default | read by | what it decides |",
        "| --- | --- | --- | --- |",
    ]
    for variable, what in FIRST:
        entry = by_variable[variable]
        out.append(f"| {_code(variable)} | {_variants(entry, _default, commands)} | "
                   f"{_readers_text(entry.readers, commands)} | {what} |")
    out += ["", "## Components", ""]
    out += [f"- [{c.title}](#{_anchor(c.title)})" for c in ref.components]
    for i, comp in enumerate(ref.components):
        out += ["", f"## {comp.title}", "", comp.about, "",
                "| name | type | default | valid values | read by | description |",
                "| --- | --- | --- | --- | --- | --- |"]
        for entry in (e for e in ref.entries if e.component == i):
            s = entry.declared
            out.append(" | ".join([
                "", _name(entry, commands), _TYPES.get(s.type, s.type.__name__),
                _variants(entry, _default, commands), _variants(entry, _valid, commands),
                _readers_text(entry.readers, commands), _help(entry, commands), "",
            ]).strip())
    return "\n".join(out) + "\n"


def render_text(reference: Reference | None = None) -> str:
    ref = reference or collect()
    lines = []
    for entry in ref.entries:
        s = entry.declared
        name = ", ".join(s.variables) or ", ".join(s.flag_names)
        default = _variants(entry, _default, ref.commands).replace("`", "")
        lines.append(f"{name}\t{default}\t{_readers_text(entry.readers, ref.commands).replace('`', '')}")
    return "\n".join(lines) + "\n"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--markdown", action="store_true",
                        help="the reference as Markdown (docs/settings.md), else one line a setting")
    parser.add_argument("--out", type=Path, default=None, metavar="FILE", help="write here instead of stdout")


def run(args: argparse.Namespace) -> int:
    text = render_markdown() if args.markdown else render_text()
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
    return 0
