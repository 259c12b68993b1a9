"""What a Marathon group document means, independent of where it runs.

The rule checker (``platform_rules``) and the local runner both have to read a group the
way Marathon does: nested groups give absolute app ids, relative dependencies resolve
against the app, an omitted ``portDefinitions`` means one dynamic port, and a failing app
is relaunched after a growing delay. Kept apart from the runner so that checking the
committed deploy files does not drag in process supervision.
"""
from __future__ import annotations

import copy
import posixpath
import re
from collections.abc import Iterable, Mapping


def flatten_group(group: Mapping, parent: str = "/") -> list[dict]:
    """All apps of a group and its sub-groups, with absolute ids and dependencies."""
    gid = posixpath.normpath(posixpath.join(parent, group.get("id", "/")))
    apps = []
    for app in group.get("apps", []):
        app = copy.deepcopy(dict(app))
        app["id"] = posixpath.normpath(posixpath.join(gid, app["id"]))
        app["dependencies"] = [posixpath.normpath(posixpath.join(app["id"], d))
                               if not d.startswith("/") else d for d in app.get("dependencies", [])]
        apps.append(app)
    for sub in group.get("groups", []):
        apps.extend(flatten_group(sub, gid))
    return apps


def start_order(apps: Iterable[Mapping]) -> list[str]:
    """App ids with every dependency before its dependents (Kahn; ties keep file order)."""
    apps = list(apps)
    ids = [a["id"] for a in apps]
    deps = {a["id"]: set(a.get("dependencies", [])) for a in apps}
    for app_id, ds in deps.items():
        missing = ds - set(ids)
        if missing:
            raise ValueError(f"{app_id} depends on {sorted(missing)}, which the group does not define")
    order: list[str] = []
    while len(order) < len(ids):
        ready = [i for i in ids if i not in order and deps[i] <= set(order)]
        if not ready:
            raise ValueError(f"dependency cycle among {sorted(set(ids) - set(order))}")
        order.append(ready[0])
    return order


def port_definitions(spec: Mapping) -> list[dict]:
    """The app's port definitions, with the one Marathon injects when they are omitted."""
    if "portDefinitions" in spec:
        return list(spec["portDefinitions"])
    return [{"port": 0, "name": "default"}]


def port_env_name(port_name: str) -> str:
    """The ``PORT_<NAME>`` variable Marathon exports for a named port."""
    return "PORT_" + re.sub(r"[^A-Z0-9_]", "_", port_name.upper())


def launch_delay(app: Mapping, consecutive_failures: int) -> float:
    """Marathon's launch delay after the n-th consecutive failure (n >= 1)."""
    if consecutive_failures <= 0:
        return 0.0
    base = float(app.get("backoffSeconds", 1))
    factor = float(app.get("backoffFactor", 1.15))
    cap = float(app.get("maxLaunchDelaySeconds", 300))
    return min(base * factor ** (consecutive_failures - 1), cap)
