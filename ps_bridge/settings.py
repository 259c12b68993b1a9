"""Typed settings for ps-lite roles, read from ``DMLC_*`` (and Marathon's ``PORT*``).

Every role validates its whole configuration before it opens a socket, so that a typo
in a deployment file stops the process at once with the setting's name in the message,
instead of hanging at rendezvous.
"""
from __future__ import annotations

import os
from collections.abc import Mapping


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
              minimum: float | None = None) -> float | None:
    raw = env_str(env, name, None, required=required)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingError(name, f"must be a number, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise SettingError(name, f"must be >= {minimum}, got {value}")
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
