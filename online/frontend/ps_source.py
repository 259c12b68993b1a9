"""The front end's model source over a livevec parameter-server cluster.

The front end joins the ps-lite cluster as a worker node (the elastic-workers extension,
``LIVEVEC_ELASTIC_WORKERS=1``, lets it come and go without disturbing the trainers) and
asks every server for the input rows changed since the version it last saw
(``HEAD_CHANGES``). Each server numbers its own changes and draws a new ``epoch`` when it
starts or reloads, so the source keeps one (epoch, version) pair per server; a server
that restarted answers in full and only its part of the copy is replaced.

Joining happens in a background thread, so the front end starts (and answers /health)
even before the scheduler is reachable; until then ``changes_since`` raises and the
front end reports itself not ready.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson

from online.cluster import ps_commands as pc
from online.cluster.training_signal import summarise_reports, summed_reasons
from online.frontend.settings import ps_node_settings
from online.search.delta import ModelDelta
from online.search.snapshot_writer import full_load_buffer
from ps_bridge.structured_logging import log_event
from ps_bridge.kv_app import KVWorker
from ps_bridge.roles import start_worker
from ps_bridge.settings import NodeSettings

log = logging.getLogger("livevec.ps_model_source")
_EMPTY_U64 = np.zeros(0, dtype=np.uint64)


class ParameterServerSource:
    def __init__(self, node: NodeSettings, timeout: float = 10.0, history: int = 256):
        self.node = node
        self.timeout = timeout
        self._kv: KVWorker | None = None
        self._join_error: BaseException | None = None
        self._issued: OrderedDict[int, dict[int, tuple[int, int]]] = OrderedDict()  # version -> {server: (epoch, v)}
        self._held: dict[int, set[int]] = {}   # server id -> keys of the caller's copy that came from it
        self._next_version = 1
        self._history = history
        self._lock = asyncio.Lock()
        self._rate: tuple[float, int] | None = None
        threading.Thread(target=self._join, name="ps-join", daemon=True).start()

    def _join(self) -> None:
        try:
            self._kv = start_worker(self.node)
            log_event(log, "frontend_joined_cluster", node_id=self._kv.po.node_id,
                      servers=len(self._kv.po.server_ids()))
        except BaseException as exc:  # reported by changes_since / stats
            self._join_error = exc
            log_event(log, "frontend_join_failed", logging.ERROR, error=f"{type(exc).__name__}: {exc}")

    def _worker(self) -> KVWorker:
        if self._kv is None:
            raise ConnectionError(f"not joined to the ps cluster yet ({self._join_error or 'waiting'})")
        return self._kv

    async def _ask(self, head: int, body: bytes, server_id: int) -> bytes:
        kv = self._worker()
        ts = kv.request(head, body, server_id)
        responses = await kv.wait_async(ts, self.timeout)
        return responses[0].body

    async def changes_since(self, version: int) -> ModelDelta:
        async with self._lock:
            kv = self._worker()
            since = self._issued.get(version) if version else None
            asked_full = since is None
            since = since or {}
            bodies = await asyncio.gather(*[
                self._ask(pc.HEAD_CHANGES, orjson.dumps({"since": since.get(sid, (0, 0))[1],
                                                         "epoch": since.get(sid, (None, 0))[0]}), sid)
                for sid in kv.po.server_ids()])
            return await asyncio.to_thread(self._merge, version, asked_full, since, kv.po.server_ids(), bodies)

    def _merge(self, version, asked_full, since, server_ids, bodies) -> ModelDelta:
        parts = [pc.decode_changes(b) for b in bodies]
        now = {sid: (p["epoch"], p["version"]) for sid, p in zip(server_ids, parts)}
        if not asked_full and now == since:
            dim = next((p["dim"] for p in parts if p["dim"]), 0)
            return ModelDelta.unchanged(version, dim)
        # A server that answered in full (restart, reload, first contact) replaces its whole part
        # of the caller's copy: what the caller held from it and the answer lacks is removed.
        removed = []
        for sid, p in zip(server_ids, parts):
            held = self._held.get(sid, set())
            if p["full"]:
                fresh = set(p["keys"].tolist())
                if not asked_full:
                    removed.append(np.fromiter(held - fresh, dtype=np.uint64))
                held = fresh
            else:
                held.update(p["keys"].tolist())
                held.difference_update(p["removed"].tolist())
                removed.append(np.asarray(p["removed"], dtype=np.uint64))
            self._held[sid] = held
        new_version = self._next_version
        self._next_version += 1
        self._issued[new_version] = now
        while len(self._issued) > self._history:
            self._issued.popitem(last=False)
        dim = next((p["dim"] for p in parts if p["dim"]), 0)
        keys = np.concatenate([p["keys"] for p in parts]) if parts else _EMPTY_U64
        words = [w for p in parts for w in p["words"]]
        with_rows = [p["vectors"] for p in parts if p["n"]]
        n = sum(len(v) for v in with_rows)
        # a full load goes straight into the buffer the index adopts as its pool (one copy of the model)
        vectors = (np.concatenate(with_rows, out=full_load_buffer(n, dim) if asked_full else None) if with_rows
                   else np.zeros((0, dim), np.float32))
        counts = np.concatenate([p["counts"] for p in parts]) if parts else np.zeros(0, np.int64)
        gone = np.concatenate(removed) if removed else _EMPTY_U64
        return ModelDelta(keys, words, vectors, counts, new_version, full=asked_full, removed=gone)

    async def stats(self) -> dict[str, Any]:
        kv = self._worker()
        # A server that does not answer (dead, restarting) means the cluster is recovering: say
        # so, with the others' figures, instead of failing (the front end keeps its last model).
        answers = await asyncio.gather(*[self._ask(pc.HEAD_STATS, b"", sid) for sid in kv.po.server_ids()],
                                       return_exceptions=True)
        stats = [orjson.loads(a) for a in answers if not isinstance(a, BaseException)]
        unreachable = [sid for sid, a in zip(kv.po.server_ids(), answers) if isinstance(a, BaseException)]
        if not stats:
            raise ConnectionError(f"no parameter server answered ({answers[0]})")
        # Trained words: server 0's batch ledger when checkpoints are on (every token of every batch trained,
        # exactly once relative to the model being served). The servers' counts miss the tokens of words not
        # yet trainable, and a worker's own log sums what it sent, rolled back or not.
        ledger = next((s["ledger"] for s in stats if isinstance(s.get("ledger"), dict)), None)
        tokens = int(ledger.get("tokens", 0)) if ledger else sum(s.get("tokens_counted", 0) for s in stats)
        now = time.monotonic()
        wps = 0.0
        if self._rate is not None and now > self._rate[0]:
            wps = max(0.0, (tokens - self._rate[1]) / (now - self._rate[0]))
        if self._rate is None or now - self._rate[0] > 1.0:
            self._rate = (now, tokens)
        reported = sum(s.get("workers_words_per_second", 0.0) for s in stats)
        # The workers' training signal: server 0 passes on the reports they send it (each worker's last one).
        reports = [r for s in stats for r in (s.get("worker_reports") or ()) if isinstance(r, dict)]
        return {"source": "ps", "servers": len(stats), "workers": max(s.get("workers_reporting", 0) for s in stats),
                "vocab_size": sum(s.get("words", 0) for s in stats), "words_trained": tokens,
                "words_per_second": reported or wps, "kafka_lag": sum(s.get("kafka_lag", 0) for s in stats),
                "rows": sum(s.get("rows", 0) for s in stats),
                "recovering": bool(unreachable) or any(s.get("recovering") for s in stats),
                "servers_unreachable": unreachable, "training": summarise_reports(reports),
                "records_malformed": summed_reasons(s.get("records_malformed") for s in stats),
                "checkpoint_loaded": max((s.get("checkpoint_loaded") or 0 for s in stats), default=None)}

    async def close(self) -> None:
        kv = self._kv
        if kv is not None:
            po = kv.po
            await asyncio.to_thread(po.leave if po.elastic else po.stop)


def create_source(settings, env: Mapping[str, str]) -> ParameterServerSource:
    """``--source ps``: the ``DMLC_*`` settings of the cluster, joined as a worker node."""
    node = getattr(settings, "node", None)
    if node is None:
        node = ps_node_settings(None, env)
    return ParameterServerSource(node)
