"""Typed settings for ps-lite roles, read from ``DMLC_*`` (and Marathon's ``PORT*``).

Every role validates its whole configuration before it opens a socket, so that a typo
in a deployment file stops the process at once with the setting's name in the message,
instead of hanging at rendezvous.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


class SettingError(ValueError):
    """A configuration value is missing or invalid; the message names the setting."""

    def __init__(self, setting: str, problem: str):
        super().__init__(f"{setting}: {problem}")
        self.setting = setting


def env_str(env: Mapping[str, str], name: str, default: str | None = None, *, required: bool = False) -> str | None:
    value = env.get(name)
    if value is None or value == "":
        if required:
            raise SettingError(name, "is required but not set")
        return default
    return value


def env_int(env: Mapping[str, str], name: str, default: int | None = None, *, required: bool = False,
            minimum: int | None = None, maximum: int | None = None) -> int | None:
    raw = env_str(env, name, None, required=required)
    if raw is None:
        return default
    try:
        value = int(raw, 10)
    except ValueError:
        raise SettingError(name, f"must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise SettingError(name, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise SettingError(name, f"must be <= {maximum}, got {value}")
    return value


def env_float(env: Mapping[str, str], name: str, default: float | None = None, *, required: bool = False,
              minimum: float | None = None, maximum: float | None = None) -> float | None:
    raw = env_str(env, name, None, required=required)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingError(name, f"must be a number, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise SettingError(name, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise SettingError(name, f"must be <= {maximum}, got {value}")
    return value


def env_bool(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    raw = env_str(env, name, None)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise SettingError(name, f"must be a boolean (1/0/true/false), got {raw!r}")


def current_env() -> Mapping[str, str]:
    return os.environ


# ----------------------------------------------------------------------------- NodeSettings

ROLES = ("scheduler", "server", "worker")


@dataclass(frozen=True)
class NodeSettings:
    """Everything a ps-lite node needs, with ps-lite's names and meanings (pslite-protocol.md §10).

    Heartbeat periods are seconds and may be fractional (ps-lite reads whole seconds).
    ``port`` 0 means "bind a free port". The scheduler binds ``root_port`` (0 there picks a
    free port too, for local clusters and tests; the chosen port is logged and available
    as ``Postoffice.my_node.port``).
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
    elastic_workers: bool = False
    metrics_port: int | None = None

    @property
    def is_scheduler(self) -> bool:
        return self.role == "scheduler"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides) -> "NodeSettings":
        """Read ``DMLC_*``/``PS_*``/``PORT*``/``LIVEVEC_*``; keyword overrides (e.g. from
        command-line flags) win over the environment when they are not None."""
        env = dict(current_env() if env is None else env)
        flag_names = {
            "role": "DMLC_ROLE", "root_uri": "DMLC_PS_ROOT_URI", "root_port": "DMLC_PS_ROOT_PORT",
            "num_server": "DMLC_NUM_SERVER", "num_worker": "DMLC_NUM_WORKER", "node_host": "DMLC_NODE_HOST",
            "interface": "DMLC_INTERFACE", "port": "PORT", "verbose": "PS_VERBOSE",
            "heartbeat_interval": "PS_HEARTBEAT_INTERVAL", "heartbeat_timeout": "PS_HEARTBEAT_TIMEOUT",
            "water_mark": "DMLC_PS_WATER_MARK", "use_kubernetes": "DMLC_USE_KUBERNETES",
            "elastic_workers": "LIVEVEC_ELASTIC_WORKERS", "metrics_port": "LIVEVEC_METRICS_PORT",
        }
        for key, value in overrides.items():
            if key not in flag_names:
                raise TypeError(f"unknown NodeSettings field {key!r}")
            if value is not None:
                if isinstance(value, bool):
                    value = "1" if value else "0"
                env[flag_names[key]] = str(value)

        role = (env_str(env, "DMLC_ROLE", required=True) or "").strip().lower()
        if role not in ROLES:
            raise SettingError("DMLC_ROLE", f"must be one of {', '.join(ROLES)}, got {role!r}")
        is_scheduler = role == "scheduler"
        root_uri = env_str(env, "DMLC_PS_ROOT_URI", required=True).strip()
        if not root_uri or any(c in root_uri for c in " /:"):
            raise SettingError("DMLC_PS_ROOT_URI", f"must be a host name or IP address, got {root_uri!r}")
        root_port = env_int(env, "DMLC_PS_ROOT_PORT", required=True, minimum=0 if is_scheduler else 1,
                            maximum=65535)
        elastic = env_bool(env, "LIVEVEC_ELASTIC_WORKERS", False)
        num_server = env_int(env, "DMLC_NUM_SERVER", required=True, minimum=1, maximum=100000)
        num_worker = env_int(env, "DMLC_NUM_WORKER", required=True, minimum=0 if elastic else 1, maximum=100000)
        port = env_int(env, "PORT", None, minimum=0, maximum=65535)
        if port is None:
            port = env_int(env, "PORT0", 0, minimum=0, maximum=65535)
        node_host = env_str(env, "DMLC_NODE_HOST")
        if node_host is not None:
            node_host = node_host.strip()
            if not node_host or any(c in node_host for c in " /:"):
                raise SettingError("DMLC_NODE_HOST", f"must be a host name or IPv4 address, got {node_host!r}")
        # Elastic workers can die while the cluster runs; noticing that needs heartbeats, so the
        # extension turns them on unless the operator chose values.
        hb_default = 2.0 if elastic else 0.0
        hb_timeout_default = 10.0 if elastic else 0.0
        heartbeat_interval = env_float(env, "PS_HEARTBEAT_INTERVAL", hb_default, minimum=0.0)
        heartbeat_timeout = env_float(env, "PS_HEARTBEAT_TIMEOUT", hb_timeout_default, minimum=0.0)
        if 0 < heartbeat_timeout <= heartbeat_interval:
            raise SettingError("PS_HEARTBEAT_TIMEOUT", f"must exceed PS_HEARTBEAT_INTERVAL "
                                                       f"({heartbeat_interval}), got {heartbeat_timeout}")
        return cls(
            role=role, root_uri=root_uri, root_port=root_port, num_server=num_server, num_worker=num_worker,
            node_host=node_host, interface=env_str(env, "DMLC_INTERFACE"), port=port,
            verbose=env_int(env, "PS_VERBOSE", 0, minimum=0, maximum=2),
            heartbeat_interval=heartbeat_interval, heartbeat_timeout=heartbeat_timeout,
            water_mark=env_int(env, "DMLC_PS_WATER_MARK", None, minimum=0),
            use_kubernetes=env_bool(env, "DMLC_USE_KUBERNETES", False),
            elastic_workers=elastic,
            metrics_port=env_int(env, "LIVEVEC_METRICS_PORT", None, minimum=0, maximum=65535),
        )

    @classmethod
    def from_args(cls, args, env: Mapping[str, str] | None = None, role: str | None = None) -> "NodeSettings":
        """Settings from an argparse namespace filled by :func:`add_node_arguments` plus the environment."""
        fields = ("root_uri", "root_port", "num_server", "num_worker", "node_host", "interface", "port",
                  "verbose", "heartbeat_interval", "heartbeat_timeout", "water_mark", "elastic_workers",
                  "metrics_port")
        overrides = {f: getattr(args, f, None) for f in fields}
        overrides["role"] = role or getattr(args, "role", None)
        return cls.from_env(env, **overrides)


def add_node_arguments(parser, *, role: str | None = None) -> None:
    """Flags mirroring the ps-lite environment variables (a flag wins over its variable)."""
    g = parser.add_argument_group("ps-lite node (flags override the environment variables)")
    if role is None:
        g.add_argument("--role", choices=ROLES, help="DMLC_ROLE")
    g.add_argument("--root-uri", help="DMLC_PS_ROOT_URI: scheduler host name or IP (a DNS name is fine)")
    g.add_argument("--root-port", type=int, help="DMLC_PS_ROOT_PORT: scheduler port")
    g.add_argument("--num-server", type=int, help="DMLC_NUM_SERVER")
    g.add_argument("--num-worker", type=int, help="DMLC_NUM_WORKER")
    g.add_argument("--node-host", help="DMLC_NODE_HOST: address this node advertises and binds")
    g.add_argument("--interface", help="DMLC_INTERFACE: take the advertised IPv4 address from this interface")
    g.add_argument("--port", type=int, help="PORT / PORT0: port of this node's ps socket (0 = free port)")
    g.add_argument("--verbose", type=int, help="PS_VERBOSE: 0, 1 (connections) or 2 (every message)")
    g.add_argument("--heartbeat-interval", type=float, help="PS_HEARTBEAT_INTERVAL seconds (0 = off)")
    g.add_argument("--heartbeat-timeout", type=float, help="PS_HEARTBEAT_TIMEOUT seconds (scheduler; 0 = off)")
    g.add_argument("--water-mark", type=int, help="DMLC_PS_WATER_MARK: ZMQ_SNDHWM of peer sockets")
    g.add_argument("--elastic-workers", action="store_const", const=True, default=None,
                   help="LIVEVEC_ELASTIC_WORKERS=1: admit workers that join or leave at run time")
    g.add_argument("--metrics-port", type=int, help="LIVEVEC_METRICS_PORT (0 = pick a free port)")
    g.add_argument("--log-level", help="LIVEVEC_LOG_LEVEL")
