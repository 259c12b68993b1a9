"""Declared settings: each is written down once and that one declaration makes its flag,
its environment read, its validation and the error that names it.

A setting parsed in two places drifts; so a role lists the ``Setting``s it reads in
``SettingGroup``s, its ``--help`` is generated from exactly those, and a bad value stops it
at start with ``NAME (--flag): problem``. A flag wins over its variable, the variable over
the default. ``NodeSettings`` (ps-lite's ``DMLC_*``/``PS_*``/``PORT*``) uses the same
mechanism; extensions such as elastic workers are passed in by the caller.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


class SettingError(ValueError):
    """A configuration value is missing or invalid; the message names the setting."""

    def __init__(self, setting: str, problem: str, *, label: str | None = None):
        super().__init__(f"{label or setting}: {problem}")
        self.setting = setting


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_METAVARS = {int: "N", float: "X"}


@dataclass(frozen=True)
class Setting:
    """One setting: the field it fills, where it is read from, its type, bounds and default.

    ``env`` is one variable or several (the first one set wins, as Marathon's ``PORT`` over
    ``PORT0``); ``flags`` default to ``--field-name``, and ``()`` means the variable only.
    ``why`` is required reading when a role gives a shared setting another default.
    """

    field: str
    env: str | tuple[str, ...]
    type: type = str
    default: Any = None
    help: str = ""
    flags: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    required: bool = False
    why: str = ""
    metavar: str | None = None

    @property
    def variables(self) -> tuple[str, ...]:
        return (self.env,) if isinstance(self.env, str) else tuple(self.env)

    @property
    def name(self) -> str:
        """How errors and help name the setting: its first variable, or its flag."""
        if self.variables:
            return self.variables[0]
        return self.flag_names[0]

    @property
    def flag_names(self) -> tuple[str, ...]:
        if self.flags is None:
            return ("--" + self.field.replace("_", "-"),)
        return self.flags

    def label(self) -> str:
        flags = self.flag_names
        return f"{self.name} ({flags[0]})" if flags and self.variables else self.name

    def with_default(self, default: Any, why: str) -> "Setting":
        """The same setting with a role's own default; ``why`` says why it differs."""
        if not why:
            raise ValueError(f"{self.name}: a different default needs a reason")
        return dataclasses.replace(self, default=default, why=why)

    def replace(self, **changes: Any) -> "Setting":
        return dataclasses.replace(self, **changes)

    def parse(self, raw: Any, variable: str | None = None) -> Any:
        """Turn a flag's or a variable's text into a checked value (SettingError names it:
        the variable it came from, else the setting and its flag)."""
        name, label = (variable, variable) if variable else (self.name, self.label())
        if self.type is bool:
            if isinstance(raw, bool):
                return raw
            lowered = str(raw).strip().lower()
            if lowered in _TRUE:
                return True
            if lowered in _FALSE:
                return False
            raise SettingError(name, label=label, problem=f"must be a boolean (1/0/true/false), got {raw!r}")
        if self.type is int:
            try:
                value = raw if isinstance(raw, int) else int(str(raw).strip(), 10)
            except ValueError:
                raise SettingError(name, label=label, problem=f"must be an integer, got {raw!r}") from None
        elif self.type is float:
            try:
                value = float(raw)
            except ValueError:
                raise SettingError(name, label=label, problem=f"must be a number, got {raw!r}") from None
            if value != value:
                raise SettingError(name, label=label, problem="must be a number, got NaN")
        else:
            value = str(raw).strip()
        if self.choices is not None and value not in self.choices:
            raise SettingError(name, label=label, problem=f"must be one of {', '.join(self.choices)}, got {value!r}")
        if self.minimum is not None and value < self.minimum:
            raise SettingError(name, label=label, problem=f"must be >= {self.minimum}, got {value}")
        if self.maximum is not None and value > self.maximum:
            raise SettingError(name, label=label, problem=f"must be <= {self.maximum}, got {value}")
        return value

    def read(self, args: argparse.Namespace | None, env: Mapping[str, str]) -> Any:
        given = getattr(args, self.field, None) if args is not None and self.flag_names else None
        if given is not None:
            return self.parse(given)
        for variable in self.variables:
            raw = env.get(variable)
            if raw is not None and raw.strip() != "":
                return self.parse(raw, variable)
        if self.required:
            raise SettingError(self.name, "is required but not set", label=self.label())
        return self.default

    def help_text(self) -> str:
        parts = [self.help] if self.help else []
        source = ", ".join(self.variables)
        if self.required:
            source += ", required" if source else "required"
        elif self.default is not None and self.default != "":
            shown = ({True: "on", False: "off"}[self.default] if self.type is bool else self.default)
            source += f", default {shown}" if source else f"default {shown}"
        if source:
            parts.append(f"({source})")
        if self.why:
            parts.append(f"[{self.why}]")
        return " ".join(parts).replace("%", "%%")

    def add_to(self, group) -> None:
        if not self.flag_names:
            return
        if self.type is bool:
            group.add_argument(*self.flag_names, dest=self.field, action=argparse.BooleanOptionalAction,
                               default=None, help=self.help_text())
        else:
            shown = self.metavar or (None if self.choices else _METAVARS.get(self.type, "TEXT"))
            group.add_argument(*self.flag_names, dest=self.field, default=None, choices=self.choices,
                               metavar=shown, help=self.help_text())


@dataclass(frozen=True)
class SettingGroup:
    """The settings of one concern (a node, the model, the stream...), as a role reads them."""

    title: str
    settings: tuple[Setting, ...]

    def __post_init__(self):
        fields = [s.field for s in self.settings]
        if len(fields) != len(set(fields)):
            raise ValueError(f"{self.title}: a field is declared twice")

    def __iter__(self):
        return iter(self.settings)

    def __getitem__(self, field: str) -> Setting:
        for s in self.settings:
            if s.field == field:
                return s
        raise KeyError(field)

    def only(self, *fields: str, title: str | None = None) -> "SettingGroup":
        """The subset a role reads (a server may need the model's size but not its window)."""
        return SettingGroup(title or self.title, tuple(self[f] for f in fields))

    def override(self, **settings: Setting) -> "SettingGroup":
        """The same group with some settings replaced (a role's own default, with its why)."""
        return SettingGroup(self.title, tuple(settings.get(s.field, s) for s in self.settings))

    def without(self, *fields: str) -> "SettingGroup":
        return SettingGroup(self.title, tuple(s for s in self.settings if s.field not in fields))

    def plus(self, *settings: Setting) -> "SettingGroup":
        return SettingGroup(self.title, self.settings + tuple(settings))

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The flags, and a note listing the settings read from the environment alone, so that
        ``--help`` shows everything the group reads."""
        env_only = [s for s in self.settings if not s.flag_names and s.variables]
        note = None
        if env_only:
            note = "from the environment only: " + "; ".join(s.help_text() for s in env_only)
        group = parser.add_argument_group(f"{self.title} (a flag wins over its variable)", note)
        for setting in self.settings:
            setting.add_to(group)

    def read(self, args: argparse.Namespace | None, env: Mapping[str, str] | None = None) -> dict[str, Any]:
        env = os.environ if env is None else env
        return {s.field: s.read(args, env) for s in self.settings}


def add_groups(parser: argparse.ArgumentParser, groups: Iterable[SettingGroup]) -> None:
    for group in groups:
        group.add_arguments(parser)


def namespace(**values: Any) -> argparse.Namespace:
    """Flag values given in code instead of on a command line (tests, embedding)."""
    return argparse.Namespace(**values)


ROLES = ("scheduler", "server", "worker")


def _host(setting: str, value: str | None, what: str) -> str | None:
    if value is None:
        return None
    if not value or any(c in value for c in " /:"):
        raise SettingError(setting, f"must be {what}, got {value!r}")
    return value


NODE = SettingGroup("ps-lite node", (
    Setting("role", "DMLC_ROLE", choices=ROLES, required=True, help="this node's role"),
    Setting("root_uri", "DMLC_PS_ROOT_URI", required=True,
            help="scheduler host name or IP (a DNS name is fine)"),
    Setting("root_port", "DMLC_PS_ROOT_PORT", int, required=True, minimum=0, maximum=65535,
            help="scheduler port (0 on the scheduler: a free port)"),
    Setting("num_server", "DMLC_NUM_SERVER", int, required=True, minimum=1, maximum=100000),
    Setting("num_worker", "DMLC_NUM_WORKER", int, required=True, minimum=0, maximum=100000,
            help="workers at the start barrier (0 only with elastic workers)"),
    Setting("node_host", "DMLC_NODE_HOST", help="address this node advertises and binds"),
    Setting("interface", "DMLC_INTERFACE", help="take the advertised IPv4 address from this interface"),
    Setting("port", ("PORT", "PORT0"), int, 0, minimum=0, maximum=65535,
            help="port of this node's ps socket, as Marathon assigns it (0 = free port)"),
    Setting("verbose", "PS_VERBOSE", int, 0, minimum=0, maximum=2, help="0, 1 (connections) or 2 (every message)"),
    Setting("heartbeat_interval", "PS_HEARTBEAT_INTERVAL", float, minimum=0.0,
            help="seconds between heartbeats, 0 = off (default 0, or 2 with elastic workers)"),
    Setting("heartbeat_timeout", "PS_HEARTBEAT_TIMEOUT", float, minimum=0.0,
            help="seconds of silence before the scheduler declares a node dead, 0 = off "
                 "(default 0, or 10 with elastic workers)"),
    Setting("water_mark", "DMLC_PS_WATER_MARK", int, minimum=0, help="send high-water mark (messages) of peer sockets"),
    Setting("use_kubernetes", "DMLC_USE_KUBERNETES", bool, False, flags=(),
            help="ps-lite's Kubernetes mode, as its launcher sets it"),
    Setting("curve_secret_key_file", "PS_CURVE_SECRET_KEY_FILE", metavar="FILE",
            help="this node's CurveZMQ key pair (python -m ps_bridge.curve keygen): ps traffic authenticated and "
                 "encrypted; C++ ps-lite nodes cannot join"),
    Setting("curve_public_keys_file", "PS_CURVE_PUBLIC_KEYS_FILE", metavar="FILE",
            help="the cluster's allowed public keys, 'KEY NAME' per line (the key named scheduler is the scheduler's)"),
))


@dataclass(frozen=True)
class NodeSettings:
    """Everything a ps-lite node needs, with ps-lite's names and meanings (pslite-protocol.md §10).

    Heartbeats are seconds, fractional allowed. ``port`` 0 binds a free port; so does
    ``root_port`` 0 on the scheduler (``Postoffice.my_node.port``). ``elastic_workers``
    (extension, turned on by the caller) turns heartbeats on unless they were chosen.
    """

    role: str
    root_uri: str
    root_port: int
    num_server: int
    num_worker: int
    node_host: str | None = None
    interface: str | None = None
    port: int = 0
    verbose: int = 0
    heartbeat_interval: float = 0.0
    heartbeat_timeout: float = 0.0
    water_mark: int | None = None
    use_kubernetes: bool = False
    curve_secret_key_file: str | None = None
    curve_public_keys_file: str | None = None
    elastic_workers: bool = False

    @property
    def is_scheduler(self) -> bool:
        return self.role == "scheduler"

    @classmethod
    def from_args(cls, args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None, *,
                  role: str | None = None, elastic_workers: bool = False) -> "NodeSettings":
        """Settings from flags (``NODE.add_arguments``) over ``DMLC_*``/``PS_*``/``PORT*``.

        ``role`` fixes the role of an entry point that runs only one (``DMLC_ROLE`` is then
        not read: Marathon groups set it, and the entry point knows better)."""
        env = os.environ if env is None else env
        group = NODE if role is None else NODE.without("role")
        values = group.read(args, env)
        values.setdefault("role", role)
        return cls.build(values, elastic_workers=elastic_workers)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, role: str | None = None,
                 elastic_workers: bool = False, **flags: Any) -> "NodeSettings":
        """Settings from the environment; keyword arguments stand for flags (they win)."""
        return cls.from_args(namespace(**flags), env, role=role, elastic_workers=elastic_workers)

    @classmethod
    def build(cls, values: Mapping[str, Any], *, elastic_workers: bool = False) -> "NodeSettings":
        """Cross-setting rules on values already read one by one."""
        v = dict(values)
        v["root_uri"] = _host("DMLC_PS_ROOT_URI", v["root_uri"], "a host name or IP address")
        v["node_host"] = _host("DMLC_NODE_HOST", v.get("node_host"), "a host name or IPv4 address")
        if v["role"] != "scheduler" and v["root_port"] < 1:
            raise SettingError("DMLC_PS_ROOT_PORT", f"must be >= 1 on a {v['role']}, got {v['root_port']}")
        if not elastic_workers and v["num_worker"] < 1:
            raise SettingError("DMLC_NUM_WORKER", f"must be >= 1 without elastic workers, got {v['num_worker']}")
        if v.get("heartbeat_interval") is None:
            v["heartbeat_interval"] = 2.0 if elastic_workers else 0.0
        if v.get("heartbeat_timeout") is None:
            v["heartbeat_timeout"] = 10.0 if elastic_workers else 0.0
        if 0 < v["heartbeat_timeout"] <= v["heartbeat_interval"]:
            raise SettingError("PS_HEARTBEAT_TIMEOUT", f"must exceed PS_HEARTBEAT_INTERVAL "
                                                       f"({v['heartbeat_interval']}), got {v['heartbeat_timeout']}")
        if bool(v.get("curve_secret_key_file")) != bool(v.get("curve_public_keys_file")):
            missing = "PS_CURVE_PUBLIC_KEYS_FILE" if v.get("curve_secret_key_file") else "PS_CURVE_SECRET_KEY_FILE"
            raise SettingError(missing, "is required with the other PS_CURVE_* setting (a secured cluster)")
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: val for k, val in v.items() if k in fields}, elastic_workers=elastic_workers)

