"""The parameter server role: a ps-lite server node that holds one key-range shard of the model.

The shard (``EmbeddingShard``) does the numerics; this module only translates ps-lite
requests into calls on it (see ``online.cluster.ps_commands`` for the command numbers) and
exposes the node's health and metrics. Requests run on the node's receive thread one at
a time, so the shard never sees two writers from the network at once. ``livevec server``
(``online.cli.server``) reads the settings and runs it.
"""
from __future__ import annotations

import argparse
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import orjson

from online.cluster import delta_wire
from online.cluster import ps_commands as pc
from online.cluster import token_cost
from online.cluster.change_listing import LIST_THRESHOLD, ChangeListing
from online.cluster.node_settings import METRICS_PORT, node_groups, node_settings
from online.cluster.replica import SYNC
from online.cluster.sync_interval import servers_merge
from online.cluster.training_signal import summed_reasons
from online.learner.embedding_shard import EmbeddingShard
from online.learner.keys import is_input_row
from online.learner.settings import SERVER_MODEL
from ps_bridge.kv_app import KVMeta, KVServer
from ps_bridge.message import KVPairs
from ps_bridge.metrics import Registry
from ps_bridge.postoffice import Postoffice
from ps_bridge.settings import NodeSettings, SettingGroup
from ps_bridge.simple_app import SimpleApp, SimpleData
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.server")


# Deltas of different workers to a row within this many sync intervals may be combined as concurrent
# (``online.learner.concurrent_merge``; on clusters of more than 2 workers, at 436 B per row at dim 100);
# a round ends sooner when a worker sends again, so this only needs to cover a sync period that load
# stretches (8 workers on 2 cores sync about every 0.5 s). Design: docs/design/0001-replica-exchange.md
MERGE_WINDOW_SYNCS = 4

# What a server reads: its node (ps-lite's and livevec's) and the part of the model a shard needs.
EXCHANGE = SettingGroup("replica exchange (servers)", (LIST_THRESHOLD,))
SERVER_GROUPS = (*node_groups(), SERVER_MODEL, SYNC, EXCHANGE)


# The extension point (checkpointing plugs in here; this package never imports it).
class ServerExtension:
    """Extra behaviour of one ``livevec server`` node.

    ``attach`` is called once by ``ShardService``'s constructor, before the node starts,
    so the extension may keep the service (and replace ``service.shard`` / ``epoch``,
    as a checkpoint load does). The other methods run on the node's threads: requests
    on the receive thread, one at a time; ``tick`` about once a second on the main thread.
    """

    def attach(self, service: ShardService) -> None:
        pass

    def handle_simple(self, req: SimpleData, app: SimpleApp) -> bool:
        """Answer a control request whose head the server does not know; False: not ours either."""
        return False

    def stats(self) -> dict:
        """Entries merged into the server's ``HEAD_STATS`` answer."""
        return {}

    def admits(self, sender: int) -> bool:
        """Whether a change (push, counts, free, words) from this node may be applied. A node the
        cluster dropped (declared dead, then back from a partition) must not change the model."""
        return True

    def tick(self) -> None:
        pass


@dataclass
class ServerSettings:
    node: NodeSettings
    dim: int = 100
    optimizer: str = "adagrad"
    eta: float | None = None
    seed: int = 1
    min_count: int = 5
    vocab_capacity: int = 1_000_000
    sync_ms: int = 250
    list_threshold: float = LIST_THRESHOLD.default
    metrics_port: int | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace | None, env: Mapping[str, str] | None = None) -> "ServerSettings":
        env = os.environ if env is None else env
        return cls(node=node_settings(args, env, "server"), metrics_port=METRICS_PORT.read(args, env),
                   **SERVER_MODEL.read(args, env), **SYNC.read(args, env), **EXCHANGE.read(args, env))


@dataclass
class _Counters:
    pulls: int = 0
    pushes: int = 0
    keys_pulled: int = 0
    keys_pushed: int = 0
    tokens_counted: int = 0
    rejected: int = 0
    fenced: int = 0
    started: float = field(default_factory=time.time)


class ShardService:
    """Answers the KV and SimpleApp requests of one server node from an ``EmbeddingShard``."""

    def __init__(self, shard: EmbeddingShard, registry: Registry, extension: ServerExtension | None = None,
                 list_threshold: float = LIST_THRESHOLD.default):
        self.shard = shard
        self.list_threshold = float(list_threshold)
        self._listing, self._listed_shard = ChangeListing(self.list_threshold), shard
        self.epoch = secrets.randbits(62)
        self.c = _Counters()
        self.worker_reports: dict[int, tuple[float, dict]] = {}   # node id -> (received, report)
        self.merge_groups: dict[int, int] = {}   # node id -> the shared replica it syncs (online.cluster.host_replica)
        r = registry
        self.m_requests = {name: r.counter("livevec_server_requests_total", "KV and control requests served",
                                           kind=name)
                           for name in ("pull", "push", "deltas", "counts", "word_counts", "free", "words", "trainable",
                                        "changes", "changed_rows", "refresh", "stats")}
        self.m_fenced = r.counter("livevec_server_fenced_total",
                                  "changes dropped unanswered: the sender is not a member of the training")
        self.m_rejected = r.counter("livevec_server_rejected_total", "requests rejected as malformed")
        self.m_keys_pulled = r.counter("livevec_server_keys_pulled_total", "rows returned to pulls")
        self.m_keys_pushed = r.counter("livevec_server_keys_pushed_total", "rows updated by pushes")
        self.m_latency = r.histogram("livevec_server_request_seconds", "time to serve a KV request")
        r.gauge("livevec_server_rows", "rows held by this shard", fn=lambda: float(len(self.shard)))
        r.gauge("livevec_server_words", "word strings known to this shard", fn=lambda: float(len(self.shard.words)))
        r.gauge("livevec_server_version", "shard version (bumps on every change)", fn=lambda: float(self.shard.version))
        r.gauge("livevec_server_fresh_deltas_dropped", "rows a worker created and trained that arrived after the "
                "servers' row had moved on: that training is dropped (the worker adopts the servers' row)",
                fn=lambda: float(self.shard.fresh_dropped))
        r.gauge("livevec_server_tokens_counted", "word occurrences counted by this shard",
                fn=lambda: float(self.c.tokens_counted))
        # the same count as a counter of this process (a checkpoint's load sets the gauge, not it): what the
        # per-token cost divides by
        self.m_tokens = r.counter("livevec_server_tokens_total", "word occurrences counted by this shard since "
                                  "the process started: its share of the tokens the workers read")
        self.cost = token_cost.export(r, lambda: self.m_tokens.value)
        self.extension = extension or ServerExtension()
        self.extension.attach(self)

    # ---------------------------------------------------------------- KV
    def handle_kv(self, req: KVMeta, data: KVPairs, server: KVServer) -> None:
        """Answer one KV request with the handler its command names (``_KV_COMMANDS``). A pull is answered
        with the handler's values, anything else with an empty acknowledgement."""
        t0 = time.perf_counter()
        keys, n, dim = data.keys, len(data.keys), self.shard.dim
        if req.push and not self.extension.admits(req.sender):
            self._fenced(req.sender, f"cmd {req.cmd}")
            return
        try:
            handler = self._KV_COMMANDS.get(req.cmd, ShardService._kv_unknown)
            vals = handler(self, req, data)
            if vals is not None:
                server.response(req, KVPairs(keys, *vals) if isinstance(vals, tuple) else KVPairs(keys, vals))
                return
        except ValueError as exc:
            # Answer anyway (an empty response) so the sender does not hang; the error is
            # counted and logged, and the shard is untouched.
            self.c.rejected += 1
            self.m_rejected.inc()
            log_event(log, "request_rejected", logging.WARNING, sender=req.sender, cmd=req.cmd, error=str(exc))
            if req.pull:
                width = {pc.CMD_DELTA: dim + 1, pc.CMD_DELTA_FRESH: dim + 1, pc.CMD_WORD_COUNTS: 1,
                         **{cmd: delta_wire.answer_width(dim, rows_back)
                            for cmd, rows_back in pc.ROWS_BACK.items()}}.get(req.cmd, dim)
                server.response(req, KVPairs(keys, np.zeros(n * width, np.float32)))
                return
        finally:
            self.m_latency.observe(time.perf_counter() - t0)
        server.response(req)

    # Each KV command's handler: the flat values a pull is answered with (or values and ps-lite lens), or None
    # (acknowledged empty).
    # A malformed request raises ValueError, which ``handle_kv`` counts, logs and answers empty.
    def _kv_unknown(self, req: KVMeta, data: KVPairs) -> None:
        raise ValueError(f"unknown command {req.cmd} (push={req.push}, pull={req.pull})")

    def _kv_rows(self, req: KVMeta, data: KVPairs) -> np.ndarray | None:
        """Rows pushed (added to the model) and/or pulled (read)."""
        keys, n, dim = data.keys, len(data.keys), self.shard.dim
        if req.push:
            if len(data.vals) != n * dim:
                raise ValueError(f"push of {len(data.vals)} floats for {n} keys of dim {dim}")
            self.shard.push(keys, data.vals.reshape(n, dim))
            self.c.pushes += 1
            self.c.keys_pushed += n
            self.m_requests["push"].inc()
            self.m_keys_pushed.inc(n)
        if not req.pull:
            return None
        vals = self.shard.pull(keys) if n else np.zeros((0, dim), np.float32)
        self.c.pulls += 1
        self.c.keys_pulled += n
        self.m_requests["pull"].inc()
        self.m_keys_pulled.inc(n)
        return vals.reshape(-1)

    def _kv_delta(self, req: KVMeta, data: KVPairs) -> np.ndarray:
        """A replica's exchange: a pull alone refreshes rows, a push and pull merges its deltas."""
        if req.pull and not req.push:
            return self._kv_refresh(req, data)
        return self._kv_deltas(req, data)

    def _kv_refresh(self, req: KVMeta, data: KVPairs) -> np.ndarray:
        """A replica refreshing rows it did not change: the rows and their accumulators, nothing applied
        (packed, in float16 or int8, for the packed commands)."""
        n = len(data.keys)
        rows = self.shard.read_rows(data.keys)
        self.c.pulls += 1
        self.c.keys_pulled += n
        self.m_requests["refresh"].inc()
        self.m_keys_pulled.inc(n)
        rows_back = pc.ROWS_BACK.get(req.cmd)
        if rows_back is not None:
            return delta_wire.pack_answer(rows.reshape(n, self.shard.dim + 1), self.shard.dim, rows_back)
        return rows.reshape(-1)

    def _kv_deltas(self, req: KVMeta, data: KVPairs) -> np.ndarray:
        """A replica's deltas merged; per key the answer is its values and its accumulator. The packed commands:
        int8 deltas in, float16 (``CMD_DELTA_PACKED``) or int8 (``CMD_DELTA_PACKED_I8``) rows out
        (``online.cluster.delta_wire``)."""
        if not (req.push and req.pull):
            return self._kv_unknown(req, data)
        keys, n, dim = data.keys, len(data.keys), self.shard.dim
        rows_back = pc.ROWS_BACK.get(req.cmd)
        if rows_back is not None:
            deltas, acc, contraction = delta_wire.unpack_deltas(data.vals, n, dim)
        else:
            # dim + 1 floats per key: the row's delta and its accumulator's; dim + 2: and its contraction
            width = dim + 2 if n and len(data.vals) == n * (dim + 2) else dim + 1
            if len(data.vals) != n * width:
                raise ValueError(f"delta push of {len(data.vals)} floats for {n} keys of dim {dim} "
                                 f"(expected {dim} + 1 or {dim} + 2 per key)")
            vals = data.vals.reshape(n, width)
            deltas, acc = vals[:, :dim], vals[:, dim]
            contraction = vals[:, dim + 1] if width == dim + 2 else None
        sender = self.merge_groups.get(req.sender, req.sender)
        held = self.shard.last_movers(keys) == sender if rows_back is not None else None
        answer = self.shard.add_deltas(keys, deltas, acc, fresh=req.cmd == pc.CMD_DELTA_FRESH, sender=sender,
                                       contraction=contraction)
        self._list(keys, deltas, answer)
        self.c.pushes += 1
        self.c.keys_pushed += n
        self.m_requests["deltas"].inc()
        self.m_keys_pushed.inc(n)
        if held is not None:   # rows this sender moved last hold what it has plus what it sent: their accumulator
            return delta_wire.pack_answer_sparse(answer, ~held, dim, rows_back)
        return answer.reshape(-1)

    def _list(self, keys: np.ndarray, deltas: np.ndarray, answer: np.ndarray) -> None:
        """The merged rows the replicas are told of (``online.cluster.change_listing``); a shard a checkpoint's
        load put in place starts a new listing."""
        if self._listed_shard is not self.shard:
            self._listing, self._listed_shard = ChangeListing(self.list_threshold), self.shard
        self._listing.merged(self.shard.rows_for(keys, create=False), deltas, answer, self.shard.version)

    def _kv_word_counts(self, req: KVMeta, data: KVPairs) -> np.ndarray:
        """Word counts added; the answer is each word's total."""
        if not (req.push and req.pull):
            return self._kv_unknown(req, data)
        n = len(data.keys)
        if len(data.vals) != n:
            raise ValueError(f"word counts push of {len(data.vals)} values for {n} keys")
        deltas = np.rint(data.vals).astype(np.int64)
        if n and int(deltas.min()) < 0:
            raise ValueError("word counts must not be negative")
        totals = self.shard.count_words(data.keys, deltas)
        self._counted(int(deltas.sum()))
        self.m_requests["word_counts"].inc()
        return totals.astype(np.float32)

    def _kv_counts(self, req: KVMeta, data: KVPairs) -> None:
        """Counts added to rows, acknowledged."""
        if not req.push:
            return self._kv_unknown(req, data)
        n = len(data.keys)
        if len(data.vals) != n:
            raise ValueError(f"counts push of {len(data.vals)} values for {n} keys")
        deltas = np.rint(data.vals).astype(np.int64)
        self.shard.add_counts(data.keys, deltas)
        self._counted(int(deltas.sum()))
        self.m_requests["counts"].inc()
        return None

    def _counted(self, tokens: int) -> None:
        self.c.tokens_counted += tokens
        self.m_tokens.inc(tokens)

    def _kv_free(self, req: KVMeta, data: KVPairs) -> None:
        """Rows dropped, acknowledged."""
        if not req.push:
            return self._kv_unknown(req, data)
        self.shard.free(data.keys)
        self.m_requests["free"].inc()
        return None

    _KV_COMMANDS: dict[int, Callable] = {pc.CMD_ROWS: _kv_rows, pc.CMD_DELTA: _kv_delta, pc.CMD_DELTA_PACKED: _kv_delta,
                                         pc.CMD_DELTA_PACKED_I8: _kv_delta, pc.CMD_DELTA_FRESH: _kv_deltas,
                                         pc.CMD_WORD_COUNTS: _kv_word_counts, pc.CMD_COUNTS: _kv_counts,
                                         pc.CMD_FREE: _kv_free}

    # ---------------------------------------------------------- SimpleApp
    def handle_simple(self, req: SimpleData, app) -> None:
        try:
            if req.head == pc.HEAD_SET_WORDS:
                if not self.extension.admits(req.sender):
                    self._fenced(req.sender, "words")
                    return
                keys, words = pc.decode_words(req.body)
                self.shard.set_words(keys, words)
                self.m_requests["words"].inc()
                app.response(req)
            elif req.head == pc.HEAD_CHANGES:
                ask = orjson.loads(req.body) if req.body else {}
                since = int(ask.get("since", 0)) if ask.get("epoch") == self.epoch else 0
                self.m_requests["changes"].inc()
                app.response(req, self.changes_body(since))
            elif req.head == pc.HEAD_CHANGED_ROWS:
                ask = orjson.loads(req.body) if req.body else {}
                if not isinstance(ask, dict):
                    raise ValueError("changed-rows request must be a JSON object")
                if ask.get("epoch") == self.epoch:
                    version, keys = self.shard.changed_keys_since(
                        int(ask.get("since", 0)), asker=self.merge_groups.get(req.sender, req.sender),
                        listing=self._listing if self._listed_shard is self.shard else None)
                else:   # a new shard for this worker (restart, rollback): from now on
                    version, keys = self.shard.version, np.zeros(0, dtype=np.uint64)
                self.m_requests["changed_rows"].inc()
                app.response(req, pc.encode_changed_rows(self.epoch, version, keys))
            elif req.head == pc.HEAD_TRAINABLE_SINCE:
                ask = orjson.loads(req.body) if req.body else {}
                if not isinstance(ask, dict):
                    raise ValueError("trainable request must be a JSON object")
                if ask.get("group"):   # a replica shared by a host's workers: its syncs merge as one worker's
                    self.merge_groups[req.sender] = int(ask["group"])
                generation, position, keys = self.shard.trainable_since(int(ask.get("generation", 0)),
                                                                        int(ask.get("since", 0)))
                self.m_requests["trainable"].inc()
                app.response(req, pc.encode_trainable(generation, position, keys))
            elif req.head == pc.HEAD_WORKER_REPORT:
                report = orjson.loads(req.body)
                if not isinstance(report, dict):
                    raise ValueError("worker report must be a JSON object")
                self.worker_reports[req.sender] = (time.monotonic(), report)
                app.response(req)
            elif req.head == pc.HEAD_EXCHANGE:
                app.response(req, orjson.dumps({"exchange": pc.EXCHANGE_VERSION}))
            elif req.head == pc.HEAD_STATS:
                self.m_requests["stats"].inc()
                app.response(req, orjson.dumps(self.stats()))
            else:
                if not self.extension.handle_simple(req, app):
                    raise ValueError(f"unknown head {req.head}")
        except (ValueError, TypeError, pc.PayloadError, orjson.JSONDecodeError) as exc:
            self.c.rejected += 1
            self.m_rejected.inc()
            log_event(log, "control_rejected", logging.WARNING, sender=req.sender, head=req.head, error=str(exc))
            app.response(req, orjson.dumps({"error": str(exc)}))

    def _fenced(self, sender: int, what: str) -> None:
        # Unanswered on purpose: the sender times out as if this server were gone, so it neither
        # acknowledges the batch nor commits its offsets; it rejoins through the next rollback.
        self.c.fenced += 1
        self.m_fenced.inc()
        if self.c.fenced in (1, 10, 100) or self.c.fenced % 1000 == 0:
            log_event(log, "change_fenced", logging.WARNING, sender=sender, what=what, total=self.c.fenced)

    def changes_body(self, since: int) -> bytes:
        shard = self.shard
        changes = shard.changes_since(since)
        full = since == 0 or changes.full_resync
        if full and since:
            changes = shard.changes_since(0)
        keys, words, vectors, counts = shard.named_input_rows(changes.changed[is_input_row(changes.changed)])
        removed = changes.removed[is_input_row(changes.removed)]
        return pc.encode_changes(epoch=self.epoch, version=changes.version, full=full, keys=keys, words=words,
                                 vectors=vectors, counts=counts, removed=removed)

    REPORT_TTL = 15.0   # seconds a worker's report counts (it reports every few seconds)

    def stats(self) -> dict:
        c = self.c
        now = time.monotonic()
        live = [r for t, r in self.worker_reports.values() if now - t < self.REPORT_TTL]
        return {"workers_reporting": len(live), "kafka_lag": sum(int(r.get("lag", 0)) for r in live),
                "workers_words_per_second": sum(float(r.get("words_per_second", 0.0)) for r in live),
                "worker_reports": live,   # as each worker sent it: the front end shows their training signal
                "records_malformed": summed_reasons(r.get("malformed") for r in live),
                "epoch": self.epoch, "version": self.shard.version, "rows": len(self.shard),
                "words": len(self.shard.words), "pulls": c.pulls, "pushes": c.pushes,
                "keys_pulled": c.keys_pulled, "keys_pushed": c.keys_pushed,
                "tokens_counted": c.tokens_counted, "rejected": c.rejected, "started": c.started,
                **self.extension.stats()}


def build(settings: ServerSettings, registry: Registry | None = None,
          extension: Callable[[Postoffice], ServerExtension] | None = None) \
        -> tuple[Postoffice, KVServer, ShardService]:
    """The node, its KV server and the service behind it, ready for ``po.start()``.

    ``extension`` makes the server's extension for its node (it needs the node's rank and
    key range, which the service does not know)."""
    registry = registry or Registry({"role": "server"})
    po = Postoffice(settings.node, registry)
    shard = EmbeddingShard(settings.dim, optimizer=settings.optimizer, eta=settings.eta, seed=settings.seed,
                           min_count=settings.min_count, word_capacity=settings.vocab_capacity)
    if servers_merge(settings.node.num_worker) or settings.node.elastic_workers:
        # two workers' deltas are summed anyway (the merge's floor), so only larger clusters pay its memory
        shard.merge_window = MERGE_WINDOW_SYNCS * settings.sync_ms / 1000.0
    service = ShardService(shard, registry, extension(po) if extension is not None else None,
                           list_threshold=settings.list_threshold)
    server = KVServer(po, 0, service.handle_kv)
    server.set_simple_request_handle(service.handle_simple)
    return po, server, service
