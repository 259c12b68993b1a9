"""The trainer's ``ParamStore`` over ps-lite: rows live on ``livevec server`` nodes.

Each mini-batch costs one pull and one push (``online.learner.param_store`` explains the
contract); both are plain ps-lite KV requests, sliced across the servers by key range
by ``KVWorker``. ps-lite requires sorted unique keys, so ``pull`` de-duplicates and
re-expands, and ``push`` sorts.

A request that a server does not answer within ``timeout`` seconds raises
``RequestTimeout``: the worker then drops the batch without committing its Kafka
offsets, so the records are read again (at-least-once) instead of being lost.
"""
from __future__ import annotations

import time

import numpy as np

from online.cluster import ps_commands as pc
from ps_bridge.metrics import Registry
from ps_bridge.kv_app import KVWorker


class PSParamStore:
    def __init__(self, worker: KVWorker, dim: int, timeout: float = 30.0, registry: Registry | None = None):
        registry = registry or Registry()
        self.pull_seconds = registry.histogram("livevec_worker_pull_seconds", "round trip of a mini-batch's pull")
        self.push_seconds = registry.histogram("livevec_worker_push_seconds", "round trip of a mini-batch's push")
        self.keys_pulled = registry.counter("livevec_worker_keys_pulled_total", "rows pulled from the servers")
        self.worker = worker
        self.dim = int(dim)
        self.timeout = timeout
        po = worker.po
        self._server_ids = po.server_ids()
        self._starts = np.array([r[0] for r in po.server_key_ranges()], dtype=np.uint64)

    def pull(self, keys: np.ndarray) -> np.ndarray:
        keys = np.asarray(keys, dtype=np.uint64)
        uniq, inverse = np.unique(keys, return_inverse=True)
        t0 = time.perf_counter()
        res = self.worker.wait(self.worker.pull(uniq, pc.CMD_ROWS), self.timeout)
        self.pull_seconds.observe(time.perf_counter() - t0)
        self.keys_pulled.inc(len(uniq))
        vals = np.asarray(res.vals, dtype=np.float32).reshape(len(uniq), self.dim)
        return vals if len(uniq) == len(keys) and np.array_equal(uniq, keys) else vals[inverse]

    def push(self, keys: np.ndarray, grads: np.ndarray) -> None:
        t0 = time.perf_counter()
        try:
            self._push_rows(keys, grads)
        finally:
            self.push_seconds.observe(time.perf_counter() - t0)

    def _push_rows(self, keys: np.ndarray, grads: np.ndarray) -> None:
        keys = np.asarray(keys, dtype=np.uint64)
        grads = np.asarray(grads, dtype=np.float32).reshape(len(keys), self.dim)
        order = np.argsort(keys, kind="stable")
        skeys = keys[order]
        if len(skeys) > 1 and not bool((skeys[1:] > skeys[:-1]).all()):
            # Duplicates: sum their gradients, as applying them one after the other would.
            skeys, first = np.unique(skeys, return_index=True)
            summed = np.add.reduceat(grads[order], first, axis=0)
            self.worker.wait(self.worker.push(skeys, summed.reshape(-1), cmd=pc.CMD_ROWS), self.timeout)
            return
        self.worker.wait(self.worker.push(skeys, grads[order].reshape(-1), cmd=pc.CMD_ROWS), self.timeout)

    def _push_scalar(self, keys: np.ndarray, values: np.ndarray, cmd: int) -> None:
        keys = np.asarray(keys, dtype=np.uint64)
        if not len(keys):
            return
        uniq, inverse = np.unique(keys, return_inverse=True)
        summed = np.zeros(len(uniq), dtype=np.float64)
        np.add.at(summed, inverse, np.asarray(values, dtype=np.float64))
        self.worker.wait(self.worker.push(uniq, summed.astype(np.float32), cmd=cmd), self.timeout)

    def free(self, keys: np.ndarray) -> None:
        self._push_scalar(keys, np.zeros(len(keys)), pc.CMD_FREE)

    def add_counts(self, keys: np.ndarray, deltas: np.ndarray) -> None:
        self._push_scalar(keys, deltas, pc.CMD_COUNTS)

    def set_words(self, keys: np.ndarray, words: list[str]) -> None:
        keys = np.asarray(keys, dtype=np.uint64)
        if not len(keys):
            return
        owner = np.searchsorted(self._starts, keys, side="right") - 1
        pending = []
        for rank in np.unique(owner).tolist():
            pos = np.flatnonzero(owner == rank)
            body = pc.encode_words(keys[pos], [words[i] for i in pos.tolist()])
            pending.append(self.worker.request(pc.HEAD_SET_WORDS, body, self._server_ids[rank]))
        for ts in pending:
            self.worker.wait(ts, self.timeout)

    def local_shard(self):
        return None
