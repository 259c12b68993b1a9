"""What a livevec node adds to ps-lite's settings: elastic workers and the metrics port.

ps_bridge reads only ps-lite's ``DMLC_*``/``PS_*``/``PORT*``; livevec's own node settings
are declared here and handed to it, so every livevec node (scheduler, server, worker and
the front end's ps source) reads them the same way.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from ps_bridge.settings import NODE, NodeSettings, Setting, SettingGroup

ELASTIC_WORKERS = Setting(
    "elastic_workers", "LIVEVEC_ELASTIC_WORKERS", bool, False,
    help="admit workers (and the front end) that join or leave a running cluster; set it on every node")
METRICS_PORT = Setting("metrics_port", "LIVEVEC_METRICS_PORT", int, minimum=0, maximum=65535,
                       help="serve /metrics (Prometheus), /health and /ready here (0 = a free port)")

LIVEVEC_NODE = SettingGroup("livevec node", (ELASTIC_WORKERS, METRICS_PORT))


def node_groups(with_metrics: bool = True) -> tuple[SettingGroup, ...]:
    """The node settings a livevec role reads: ps-lite's (its role is fixed) and livevec's."""
    ours = LIVEVEC_NODE if with_metrics else LIVEVEC_NODE.without("metrics_port")
    return NODE.without("role"), ours


def node_settings(args: argparse.Namespace | None, env: Mapping[str, str] | None, role: str) -> NodeSettings:
    env = os.environ if env is None else env
    elastic = ELASTIC_WORKERS.read(args, env)
    return NodeSettings.from_args(args, env, role=role, elastic_workers=elastic)
