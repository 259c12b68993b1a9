"""Starting ps-lite roles from code, and ``python -m ps_bridge.roles`` for plain nodes.

    from ps_bridge.roles import start_server, start_worker
    server = start_server(my_handle)          # KVServer, created before the start barrier
    worker = start_worker()                   # KVWorker on a started Postoffice
    ...
    worker.po.finalize()                      # cluster-wide barrier, then close

Settings: ``DMLC_*``/``PS_*``/``PORT`` or a ``NodeSettings``. ``python -m ps_bridge.roles
{scheduler,server}`` runs a scheduler or a sum-handle server, e.g. next to C++ ps-lite.
"""
from __future__ import annotations

import argparse
import os
import logging
import signal
import sys
import threading

from ps_bridge.metrics import Registry, serve_http
from ps_bridge.structured_logging import configure_logging, log_event
from ps_bridge.kv_app import KVServer, KVWorker, RequestHandle
from ps_bridge.postoffice import Postoffice
from ps_bridge.settings import NODE, NodeSettings, Setting, SettingError, SettingGroup

log = logging.getLogger("ps_bridge.roles")


def _settings(settings: NodeSettings | None, role: str) -> NodeSettings:
    if settings is None:
        return NodeSettings.from_env(os.environ, role=role)
    if settings.role != role:
        raise SettingError("DMLC_ROLE", f"this entry point runs a {role}, the settings say {settings.role}")
    return settings


def serve_metrics(po: Postoffice, port: int | None) -> int | None:
    """Serve /metrics, /health and /ready of a node on ``port`` (0 = free port); returns the port."""
    if port is None:
        return None
    http = serve_http(po.registry, "0.0.0.0", port, ready=po.ready)
    bound = http.server_address[1]
    log_event(log, "metrics_listening", port=bound, role=po.role)
    return bound


def start_server(handle: RequestHandle | None = None, settings: NodeSettings | None = None, *, app_id: int = 0,
                 registry: Registry | None = None, timeout: float | None = None) -> KVServer:
    """Start a server node whose KV requests go to ``handle(req_meta, req_data, server)``
    (default: ps-lite's sum). The KVServer exists before the start barrier, so no push can
    arrive before its handle (ps-lite's start-up race). Returns once the node is ready."""
    po = Postoffice(_settings(settings, "server"), registry)
    server = KVServer(po, app_id, handle)
    po.start(timeout=timeout)
    return server


def start_worker(settings: NodeSettings | None = None, *, app_id: int = 0, customer_id: int = 0,
                 registry: Registry | None = None, timeout: float | None = None) -> KVWorker:
    """Start a worker node and return its KVWorker (``worker.po`` is the Postoffice)."""
    po = Postoffice(_settings(settings, "worker"), registry)
    worker = KVWorker(po, app_id, customer_id)
    po.start(customer_id, timeout=timeout)
    return worker


def start_scheduler(settings: NodeSettings | None = None, *, registry: Registry | None = None) \
        -> tuple[Postoffice, threading.Thread]:
    """Run a scheduler in a background thread (start, then the final barrier). Returns its
    Postoffice (already bound: ``po.my_node.port`` is known) and the thread."""
    po = Postoffice(_settings(settings, "scheduler"), registry)
    po.bind()

    def _run() -> None:
        try:
            po.start()
            po.finalize()
        except Exception:
            log.exception("scheduler failed")
            po.stop()

    thread = threading.Thread(target=_run, name="ps-scheduler", daemon=True)
    thread.start()
    return po, thread


def _run_until_finalized(po: Postoffice, metrics_port: int | None = None) -> int:
    def _terminate(signum, _frame):
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    try:
        serve_metrics(po, metrics_port)
        po.start()
        po.finalize()
        return 0
    except SystemExit as exc:
        log_event(log, "terminated", role=po.role, code=exc.code)
        return 0
    finally:
        po.stop()


def run_scheduler(settings: NodeSettings | None = None, *, registry: Registry | None = None,
                  metrics_port: int | None = None) -> int:
    """Run a scheduler in this thread until the cluster finalizes (or SIGTERM)."""
    return _run_until_finalized(Postoffice(_settings(settings, "scheduler"), registry), metrics_port)


def run_server(handle: RequestHandle | None = None, settings: NodeSettings | None = None, *,
               registry: Registry | None = None, metrics_port: int | None = None) -> int:
    """Run a server node in this thread until the cluster finalizes (or SIGTERM)."""
    po = Postoffice(_settings(settings, "server"), registry)
    KVServer(po, 0, handle)
    return _run_until_finalized(po, metrics_port)


# The plain node's own settings, beside ps-lite's.
PLAIN_NODE = SettingGroup("plain node", (
    Setting("metrics_port", (), int, minimum=0, maximum=65535, help="serve /metrics, /health, /ready here"),
    Setting("log_level", (), default="INFO", help="DEBUG, INFO, WARNING"),
))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ps_bridge.roles",
                                     description="plain ps-lite roles (server: default sum handle)")
    parser.add_argument("role", choices=("scheduler", "server"))
    NODE.without("role").add_arguments(parser)
    PLAIN_NODE.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        plain = PLAIN_NODE.read(args, os.environ)
        configure_logging(plain["log_level"])
        settings = NodeSettings.from_args(args, os.environ, role=args.role)
        if args.role == "scheduler":
            return run_scheduler(settings, metrics_port=plain["metrics_port"])
        return run_server(None, settings, metrics_port=plain["metrics_port"])
    except SettingError as exc:
        print(f"ps_bridge {args.role}: configuration error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
