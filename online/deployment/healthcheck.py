"""The container image's HEALTHCHECK: probe whichever role this container runs.

Docker runs it with the container's environment, which on Marathon holds the assigned
``PORT_<NAME>`` variables but not what ``cmd`` exported in its own shell; so the probe
falls back from the livevec variable to Marathon's. Marathon and Kubernetes ignore image
health checks (they run their own probes); this one serves ``docker run`` and Compose.
"""
from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Mapping

from ps_bridge.settings import Setting, SettingGroup

# The probe's own setting; the role's ports it falls back to are the roles' settings (and Marathon's PORT_*).
HEALTHCHECK = SettingGroup("container health check", (
    Setting("health_url", "LIVEVEC_HEALTH_URL", flags=(), metavar="URL",
            help="the URL the image's HEALTHCHECK GETs (2xx or 3xx is healthy) instead of probing the role's own "
                 "port (DMLC_PS_ROOT_PORT on the scheduler, else LIVEVEC_HTTP_PORT or LIVEVEC_METRICS_PORT)"),
))


def probe_target(env: Mapping[str, str]) -> tuple[str, str, int, str] | None:
    """(kind, host, port, path) for this container, or None when nothing listens
    (a one-shot command such as the export job)."""
    url = HEALTHCHECK.read(None, env)["health_url"]
    if url:
        return ("url", url, 0, "")
    if env.get("DMLC_ROLE") == "scheduler":
        port = env.get("PORT_PS") or env.get("DMLC_PS_ROOT_PORT")
        return ("tcp", "127.0.0.1", int(port), "") if port else None
    for var in ("LIVEVEC_HTTP_PORT", "PORT_HTTP", "LIVEVEC_METRICS_PORT", "PORT_METRICS"):
        value = env.get(var)
        if value and value != "0":
            return ("http", "127.0.0.1", int(value), "/health")
    return None


def check(env: Mapping[str, str], timeout: float = 5.0) -> tuple[bool, str]:
    try:
        target = probe_target(env)
    except ValueError as exc:
        return False, f"bad port setting: {exc}"
    if target is None:
        return True, "no long-running service in this container; nothing to probe"
    kind, host, port, path = target
    try:
        if kind == "tcp":
            with socket.create_connection((host, port), timeout=timeout):
                return True, f"tcp {host}:{port} accepts connections"
        url = host if kind == "url" else f"http://{host}:{port}{path}"
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return 200 <= resp.status < 400, f"GET {url} -> {resp.status}"
    except urllib.error.HTTPError as exc:
        return False, f"GET {url} -> {exc.code}"
    except OSError as exc:
        return False, f"{kind} {host}:{port}: {exc}"
