"""The coordinator's requests to the cluster's nodes: one request to each, their answers gathered.

A node may die, leave, be replaced or never answer while the coordinator waits, so every wait has a
deadline, and a caller may stop waiting early (``give_up``) when what it waits for cannot happen any more.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import orjson

from ps_bridge.customer import RequestTimeout
from ps_bridge.postoffice import Postoffice
from ps_bridge.simple_app import SendError, SimpleApp

_GONE = object()


def ask_nodes(app: SimpleApp, po: Postoffice, head: int, body: dict, ids: list[int], timeout: float, *,
              drop_gone: bool = False, give_up: Callable[[], bool] | None = None) -> dict[int, dict | None]:
    """Send ``body`` to each node separately; its parsed answer, or None if it did not answer in time.
    With ``drop_gone``, workers that leave the cluster meanwhile are left out of the result; without, a
    worker that leaves counts as not answering. When ``give_up()`` turns true the wait ends and the
    missing answers are None."""
    data = orjson.dumps(body)
    customer = app.customer
    results: dict[int, object] = {}
    lock = threading.Lock()
    arrived = threading.Event()
    pending: dict[int, int] = {}

    def deliver(node: int, result: object) -> None:
        with lock:
            results[node] = result
        arrived.set()

    for node in ids:
        ts = app.request(head, data, node)
        pending[node] = ts
        customer.on_complete(ts, lambda result, node=node: deliver(node, result))
    deadline = time.monotonic() + timeout
    while True:
        with lock:
            waiting = [n for n in pending if n not in results]
        if not waiting:
            break
        live = set(po.worker_ids()) | set(po.server_ids())
        for node in waiting:
            if node not in live:
                customer.fail(pending[node], SendError(f"node {node} left the cluster"))
                if drop_gone:
                    with lock:
                        results[node] = _GONE
        if time.monotonic() > deadline or (give_up is not None and give_up()):
            for node in waiting:
                customer.fail(pending[node], RequestTimeout(f"node {node} did not answer in {timeout}s"))
            continue
        arrived.wait(0.1)
        arrived.clear()
    return _parsed(po, results, drop_gone)


def _parsed(po: Postoffice, results: dict[int, object], drop_gone: bool) -> dict[int, dict | None]:
    out: dict[int, dict | None] = {}
    for node, result in results.items():
        if result is _GONE:
            continue
        if isinstance(result, BaseException):
            if drop_gone and node not in po.worker_ids():
                continue
            out[node] = None
            continue
        try:
            value = orjson.loads(result[0].body) if result and result[0].body else {}
            out[node] = value if isinstance(value, dict) else {"ok": False, "error": "answer is not an object"}
        except orjson.JSONDecodeError as exc:
            out[node] = {"ok": False, "error": f"bad answer: {exc}"}
    return out
