"""``livevec server``: a ps-lite server node that holds one key-range shard of the model.

The shard (``EmbeddingShard``) does the numerics; this module only translates ps-lite
requests into calls on it (see ``online.cluster.ps_commands`` for the command numbers) and
exposes the node's health and metrics. Requests run on the node's receive thread one at
a time, so the shard never sees two writers from the network at once.
"""
from __future__ import annotations

import argparse
import logging
import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import orjson

from online.cluster import ps_commands as pc
from online.learner.embedding_shard import OPTIMIZERS, EmbeddingShard
from ps_bridge.metrics import Registry
from ps_bridge.structured_logging import log_event
from ps_bridge.kv_app import KVMeta, KVServer
from ps_bridge.message import KVPairs
from ps_bridge.postoffice import Postoffice
from ps_bridge.roles import serve_metrics
from ps_bridge.settings import NodeSettings, SettingError, add_node_arguments, current_env, env_float, env_int, \
    env_str
from ps_bridge.simple_app import SimpleData

log = logging.getLogger("livevec.server")


@dataclass
class ServerSettings:
    node: NodeSettings
    dim: int = 100
    optimizer: str = "adagrad"
    eta: float | None = None
    seed: int = 1
    checkpoint_dir: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace, env=None) -> "ServerSettings":
        env = current_env() if env is None else env
        node = NodeSettings.from_args(args, env, role="server")
        optimizer = args.optimizer or env_str(env, "LIVEVEC_OPTIMIZER", "adagrad")
        if optimizer not in OPTIMIZERS:
            raise SettingError("LIVEVEC_OPTIMIZER", f"must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
        return cls(
            node=node,
            dim=args.dim if args.dim is not None else env_int(env, "LIVEVEC_DIM", 100, minimum=1, maximum=4096),
            optimizer=optimizer,
            eta=args.eta if args.eta is not None else env_float(env, "LIVEVEC_ETA", None, minimum=0.0),
            seed=args.seed if args.seed is not None else env_int(env, "LIVEVEC_SEED", 1, minimum=0),
            checkpoint_dir=args.checkpoint_dir or env_str(env, "LIVEVEC_CHECKPOINT_DIR"),
        )


@dataclass
class _Counters:
    pulls: int = 0
    pushes: int = 0
    keys_pulled: int = 0
    keys_pushed: int = 0
    tokens_counted: int = 0
    rejected: int = 0
    started: float = field(default_factory=time.time)


class ShardService:
    """Answers the KV and SimpleApp requests of one server node from an ``EmbeddingShard``."""

    def __init__(self, shard: EmbeddingShard, registry: Registry):
        self.shard = shard
        self.epoch = secrets.randbits(62)
        self.c = _Counters()
        self.worker_reports: dict[int, tuple[float, dict]] = {}   # node id -> (received, report)
        r = registry
        self.m_requests = {name: r.counter("livevec_server_requests_total", "KV and control requests served",
                                           kind=name)
                           for name in ("pull", "push", "counts", "free", "words", "changes", "stats")}
        self.m_rejected = r.counter("livevec_server_rejected_total", "requests rejected as malformed")
        self.m_keys_pulled = r.counter("livevec_server_keys_pulled_total", "rows returned to pulls")
        self.m_keys_pushed = r.counter("livevec_server_keys_pushed_total", "rows updated by pushes")
        self.m_latency = r.histogram("livevec_server_request_seconds", "time to serve a KV request")
        r.gauge("livevec_server_rows", "rows held by this shard", fn=lambda: float(len(self.shard)))
        r.gauge("livevec_server_words", "word strings known to this shard", fn=lambda: float(len(self.shard.words)))
        r.gauge("livevec_server_version", "shard version (bumps on every change)", fn=lambda: float(self.shard.version))
        r.gauge("livevec_server_tokens_counted", "word occurrences counted by this shard",
                fn=lambda: float(self.c.tokens_counted))

    # ---------------------------------------------------------------- KV
    def handle_kv(self, req: KVMeta, data: KVPairs, server: KVServer) -> None:
        t0 = time.perf_counter()
        keys, n, dim = data.keys, len(data.keys), self.shard.dim
        try:
            if req.cmd == pc.CMD_ROWS:
                if req.push:
                    if len(data.vals) != n * dim:
                        raise ValueError(f"push of {len(data.vals)} floats for {n} keys of dim {dim}")
                    self.shard.push(keys, data.vals.reshape(n, dim))
                    self.c.pushes += 1
                    self.c.keys_pushed += n
                    self.m_requests["push"].inc()
                    self.m_keys_pushed.inc(n)
                if req.pull:
                    vals = self.shard.pull(keys) if n else np.zeros((0, dim), np.float32)
                    self.c.pulls += 1
                    self.c.keys_pulled += n
                    self.m_requests["pull"].inc()
                    self.m_keys_pulled.inc(n)
                    server.response(req, KVPairs(keys, vals.reshape(-1)))
                    return
            elif req.cmd == pc.CMD_COUNTS and req.push:
                if len(data.vals) != n:
                    raise ValueError(f"counts push of {len(data.vals)} values for {n} keys")
                deltas = np.rint(data.vals).astype(np.int64)
                self.shard.add_counts(keys, deltas)
                self.c.tokens_counted += int(deltas.sum())
                self.m_requests["counts"].inc()
            elif req.cmd == pc.CMD_FREE and req.push:
                self.shard.free(keys)
                self.m_requests["free"].inc()
            else:
                raise ValueError(f"unknown command {req.cmd} (push={req.push}, pull={req.pull})")
        except ValueError as exc:
            # Answer anyway (an empty response) so the sender does not hang; the error is
            # counted and logged, and the shard is untouched.
            self.c.rejected += 1
            self.m_rejected.inc()
            log_event(log, "request_rejected", logging.WARNING, sender=req.sender, cmd=req.cmd, error=str(exc))
            if req.pull:
                server.response(req, KVPairs(keys, np.zeros(n * dim, np.float32)))
                return
        finally:
            self.m_latency.observe(time.perf_counter() - t0)
        server.response(req)

    # ---------------------------------------------------------- SimpleApp
    def handle_simple(self, req: SimpleData, app) -> None:
        try:
            if req.head == pc.HEAD_SET_WORDS:
                keys, words = pc.decode_words(req.body)
                self.shard.set_words(keys, words)
                self.m_requests["words"].inc()
                app.response(req)
            elif req.head == pc.HEAD_CHANGES:
                ask = orjson.loads(req.body) if req.body else {}
                since = int(ask.get("since", 0)) if ask.get("epoch") == self.epoch else 0
                self.m_requests["changes"].inc()
                app.response(req, self.changes_body(since))
            elif req.head == pc.HEAD_WORKER_REPORT:
                report = orjson.loads(req.body)
                if not isinstance(report, dict):
                    raise ValueError("worker report must be a JSON object")
                self.worker_reports[req.sender] = (time.monotonic(), report)
                app.response(req)
            elif req.head == pc.HEAD_STATS:
                self.m_requests["stats"].inc()
                app.response(req, orjson.dumps(self.stats()))
            else:
                extra = getattr(self, "extra_simple_handle", None)
                if extra is None or not extra(req, app):
                    raise ValueError(f"unknown head {req.head}")
        except (ValueError, pc.PayloadError, orjson.JSONDecodeError) as exc:
            self.c.rejected += 1
            self.m_rejected.inc()
            log_event(log, "control_rejected", logging.WARNING, sender=req.sender, head=req.head, error=str(exc))
            app.response(req, orjson.dumps({"error": str(exc)}))

    def changes_body(self, since: int) -> bytes:
        shard = self.shard
        changes = shard.changes_since(since)
        full = since == 0 or changes.full_resync
        if full and since:
            changes = shard.changes_since(0)
        even = np.uint64(1)
        keys = changes.changed[(changes.changed & even) == 0]
        keys, words, vectors, counts = shard.named_input_rows(keys)
        removed = changes.removed[(changes.removed & even) == 0]
        return pc.encode_changes(epoch=self.epoch, version=changes.version, full=full, keys=keys, words=words,
                                 vectors=vectors, counts=counts, removed=removed)

    REPORT_TTL = 15.0   # seconds a worker's report counts (it reports every few seconds)

    def stats(self) -> dict:
        c = self.c
        now = time.monotonic()
        live = [r for t, r in self.worker_reports.values() if now - t < self.REPORT_TTL]
        return {"workers_reporting": len(live), "kafka_lag": sum(int(r.get("lag", 0)) for r in live),
                "workers_words_per_second": sum(float(r.get("words_per_second", 0.0)) for r in live),
                "epoch": self.epoch, "version": self.shard.version, "rows": len(self.shard),
                "words": len(self.shard.words), "pulls": c.pulls, "pushes": c.pushes,
                "keys_pulled": c.keys_pulled, "keys_pushed": c.keys_pushed,
                "tokens_counted": c.tokens_counted, "rejected": c.rejected, "started": c.started,
                **(self.extra_stats() if getattr(self, "extra_stats", None) is not None else {})}


def configure(parser: argparse.ArgumentParser) -> None:
    add_node_arguments(parser, role="server")
    g = parser.add_argument_group("model shard")
    g.add_argument("--dim", type=int, help="vector size (LIVEVEC_DIM, default 100); must match the workers")
    g.add_argument("--optimizer", choices=OPTIMIZERS, help="LIVEVEC_OPTIMIZER (default adagrad)")
    g.add_argument("--eta", type=float, help="LIVEVEC_ETA: learning rate of the optimizer")
    g.add_argument("--seed", type=int, help="LIVEVEC_SEED: seed of the deterministic row initialisation")
    g.add_argument("--checkpoint-dir", help="LIVEVEC_CHECKPOINT_DIR: where coordinated checkpoints live")


def build(settings: ServerSettings, registry: Registry | None = None) -> tuple[Postoffice, KVServer, ShardService]:
    registry = registry or Registry({"role": "server"})
    po = Postoffice(settings.node, registry)
    shard = EmbeddingShard(settings.dim, optimizer=settings.optimizer, eta=settings.eta, seed=settings.seed)
    service = ShardService(shard, registry)
    server = KVServer(po, 0, service.handle_kv)
    server.set_simple_request_handle(service.handle_simple)
    return po, server, service


def run(args: argparse.Namespace) -> int:
    settings = ServerSettings.from_args(args)
    po, server, service = build(settings)
    stop = threading.Event()

    def _terminate(signum, _frame):
        stop.set()

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)
    serve_metrics(po, settings.node.metrics_port)
    hooks = _checkpoint_hooks(settings, po, server, service)
    po.start()
    log_event(log, "server_ready", node_id=po.node_id, rank=po.rank, dim=settings.dim, pid=os.getpid())
    try:
        while not stop.wait(1.0):
            if hooks is not None:
                hooks.tick()
    finally:
        log_event(log, "server_stopping", node_id=po.node_id, **service.stats())
        po.stop()
    return 0


def _checkpoint_hooks(settings: ServerSettings, po: Postoffice, server: KVServer, service: ShardService):
    """Checkpoint save/restore on this server, when a checkpoint directory is configured."""
    if not settings.checkpoint_dir:
        return None
    try:
        from online.checkpoint.participants import ServerCheckpointing
    except ImportError:
        log_event(log, "checkpoints_unavailable", logging.WARNING, dir=settings.checkpoint_dir)
        return None
    return ServerCheckpointing(settings.checkpoint_dir, po, server, service)
