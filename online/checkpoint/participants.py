"""Coordinated checkpoints and rollbacks: the server and worker sides.

The model's state and the stream position are saved together, so that after any crash the
cluster can return to a state where every Kafka record has affected the model exactly once.

**The invariant.** Between checkpoints the model equals the latest checkpoint plus the
effects of the records that the *current* owners of the partitions trained after the
checkpoint's offsets. Anything that can break that (a server or trainer dying, a batch
retried after a timeout, a Kafka rebalance moving a partition) makes the coordinator roll the
whole cluster back to the latest complete checkpoint: workers drop their batches in flight,
the servers reload, every partition restarts at the checkpoint's offset (a partition absent
from the checkpoint had nothing trained, so it restarts at its beginning). Work since the
checkpoint is redone; nothing is lost or applied twice.

**A checkpoint** (driven by ``online.checkpoint.coordinator`` in the scheduler):

1. ``HEAD_CHECKPOINT_PAUSE {"mode": "drain"}`` to every worker: finish the batches in flight
   (their pushes are acknowledged, their offsets committed), stop reading, answer with the
   processed frontier of each owned partition. A worker of the replica exchange does not
   stop training: it lets the sync in progress finish and holds the next one until the
   resume (``StreamingWorker.hold_syncs``), since what the servers hold is exactly what acknowledged syncs
   brought, and those are exactly the batches behind the processed frontier;
2. ``HEAD_CHECKPOINT_SAVE {"phase": "snapshot"}`` to every server: copy the shard in memory;
3. ``HEAD_CHECKPOINT_RESUME`` to the workers: training goes on (the pause ends here; with the
   replica exchange, syncs go on);
4. ``HEAD_CHECKPOINT_SAVE {"phase": "write"}``: each server writes its copy atomically and
   answers with the file's size and SHA-256; the coordinator writes the manifest last.

**A rollback**: ``HEAD_CHECKPOINT_PAUSE {"mode": "abandon"}`` (workers fail their requests in
flight, drop those batches uncommitted, then *fence*: one round trip to every server, so any
push they sent earlier has been applied before the reload), ``HEAD_ROLLBACK_LOAD
{"phase": "prepare"}`` (servers read and verify the checkpoint in a background thread),
``{"phase": "install"}`` (swap it in on the receive thread and draw a new epoch, so the front
end resyncs in full), ``HEAD_ROLLBACK_SEEK {"offsets": ...}`` and ``HEAD_CHECKPOINT_RESUME``.

**The ledger.** After a batch's pushes were acknowledged and before its offsets are committed,
the worker sends its offset ranges to server 0 (``HEAD_LEDGER``). Server 0 keeps, per
partition, the trained frontier and counts offsets trained twice (``overlaps``) or skipped
(``gaps``); the ledger is checkpointed and restored with the shard, so after recovery it shows
directly whether every record was trained exactly once relative to the restored checkpoint.
"""
from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time

import orjson

from online.checkpoint.storage_health import StorageHealth, describe
from online.checkpoint.store import (CheckpointError, CheckpointStore, offsets_from_json, offsets_to_json,
                                     restore_shard, snapshot_shard)
from online.cluster import ps_commands as pc
from online.cluster.server import ServerExtension
from online.cluster.worker import WorkerExtension
from ps_bridge.customer import RequestTimeout
from ps_bridge.message import SCHEDULER_ID
from ps_bridge.postoffice import Postoffice
from ps_bridge.settings import SettingError
from ps_bridge.simple_app import SendError
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.checkpoint")


# ----------------------------------------------------------------------------- ledger

class BatchLedger:
    """Kafka offsets trained so far, per partition (kept by server 0, checkpointed with its shard)."""

    def __init__(self, state: dict | None = None):
        state = state or {}
        self.frontier: dict[str, int] = {k: int(v) for k, v in (state.get("frontier") or {}).items()}
        self.offsets = int(state.get("offsets", 0))      # offsets trained (valid and malformed records)
        self.records = int(state.get("records", 0))      # valid records trained
        self.tokens = int(state.get("tokens", 0))        # tokens read from them
        self.batches = int(state.get("batches", 0))
        self.overlaps = int(state.get("overlaps", 0))    # offsets trained again (a duplicate)
        self.gaps = int(state.get("gaps", 0))            # offsets skipped (all-malformed batches, or a loss)

    def apply(self, ranges: list, records: int, tokens: int, batches: int = 1) -> None:
        """Ranges in the order they were trained (one batch's, or several batches' one after the other)."""
        for topic, partition, start, end in ranges:
            start, end = int(start), int(end)
            if end < start:
                raise ValueError(f"range [{start}, {end}) of {topic}[{partition}] is reversed")
            key = f"{topic}/{int(partition)}"
            frontier = self.frontier.get(key)
            if frontier is not None:
                if start < frontier:
                    self.overlaps += min(end, frontier) - start
                    # never expected: say which range, so a duplicate can be traced to its batch
                    log_event(log, "ledger_overlap", logging.WARNING, partition=key, start=start, end=end,
                              frontier=frontier, batches=self.batches)
                elif start > frontier:
                    self.gaps += start - frontier
            self.frontier[key] = max(end, frontier or 0)
            self.offsets += end - start
        self.records += int(records)
        self.tokens += int(tokens)
        self.batches += int(batches)

    def to_json(self) -> dict:
        return {"frontier": dict(self.frontier), "offsets": self.offsets, "records": self.records,
                "tokens": self.tokens, "batches": self.batches, "overlaps": self.overlaps, "gaps": self.gaps}


def _json(body: bytes) -> dict:
    value = orjson.loads(body) if body else {}
    if not isinstance(value, dict):
        raise ValueError("body must be a JSON object")
    return value


# ----------------------------------------------------------------------------- server side

class ServerCheckpointing(ServerExtension):
    """Save, load and fence on one ``livevec server`` (its extension when ``LIVEVEC_CHECKPOINT_DIR``
    is set). ``tick()`` runs every second on the main thread."""

    def __init__(self, checkpoint_dir: str, po: Postoffice, io_timeout: float | None = 120.0):
        # create=False: the coordinator makes the directory; a server whose mount is gone must fail
        # its writes, not write into an empty local directory under the mount point.
        self.store = CheckpointStore(checkpoint_dir, io_timeout=io_timeout, create=False)
        self.storage = StorageHealth(po.registry, checkpoint_dir)
        self.po = po
        self.service = None                   # the ShardService, once attached
        self.ledger = BatchLedger()
        self.recovering = False
        # The workers the last rollback took in (None: no coordinator has spoken yet). Changes from any
        # other node are dropped: a worker declared dead whose partition healed would otherwise apply
        # pushes (queued by ZeroMQ meanwhile) for records that its partitions' new owner trains again.
        self.members: set[int] | None = None
        self.loaded_id: int | None = None
        self.saved_id: int | None = None
        self._snapshot = None                 # (checkpoint id, ShardState) between snapshot and write
        self._prepared = None                 # (checkpoint id, shard, meta) between prepare and install
        self._install_lock = threading.Lock()
        self._initial_load_done = False

    def attach(self, service) -> None:
        self.service = service

    # -- helpers
    def _rank(self) -> int:
        return self.po.rank

    def _key_range(self) -> tuple[int, int]:
        return self.po.server_key_ranges()[self._rank()]

    def _meta(self) -> dict:
        return {"rank": self._rank(), "num_servers": self.po.num_servers, "key_range": list(self._key_range()),
                "tokens_counted": self.service.c.tokens_counted, "ledger": self.ledger.to_json(),
                "epoch": self.service.epoch}

    def tick(self) -> None:
        """A restarted server loads the latest complete checkpoint as soon as it knows its rank."""
        if self._initial_load_done or not self.po.ready():
            return
        self._initial_load_done = True
        if self.loaded_id is not None:
            return
        try:
            ckpt = self.store.latest_complete()
            if ckpt is None:
                log_event(log, "no_checkpoint", dir=str(self.store.root))
                return
            prepared = self._prepare(ckpt.id)
            with self._install_lock:
                if self.loaded_id is None:    # a rollback may have loaded one meanwhile
                    self._install(*prepared)
        except (CheckpointError, OSError) as exc:
            log_event(log, "initial_load_failed", logging.ERROR, error=str(exc))

    def admits(self, sender: int) -> bool:
        return self.members is None or sender in self.members

    def stats(self) -> dict:
        out = {"recovering": self.recovering, "checkpoint_loaded": self.loaded_id, "checkpoint_saved": self.saved_id}
        if self._rank() == 0:
            out["ledger"] = self.ledger.to_json()
        return out

    # -- requests (on the node's receive thread)
    def handle_simple(self, req, app) -> bool:
        try:
            return self._handle(req, app)
        except (KeyError, TypeError) as exc:   # a body without the fields its head needs
            raise ValueError(f"malformed body for head {req.head}: {type(exc).__name__}: {exc}") from None

    def _handle(self, req, app) -> bool:
        head = req.head
        if head == pc.HEAD_LEDGER:
            if not self.admits(req.sender):
                self.service._fenced(req.sender, "ledger")
                return True
            ask = _json(req.body)
            self.ledger.apply(ask.get("ranges") or [], int(ask.get("records", 0)), int(ask.get("tokens", 0)),
                              int(ask.get("batches", 1)))
            app.response(req)
        elif head == pc.HEAD_FENCE:
            app.response(req)   # answered in order after every earlier message from that worker
        elif head == pc.HEAD_RECOVERING:
            ask = _json(req.body)
            self.recovering = bool(ask.get("recovering"))
            if isinstance(ask.get("members"), list):
                self.members = {int(m) for m in ask["members"]}
            elif self.recovering:
                self.members = set()        # nothing changes the model while it is rolled back
            app.response(req)
        elif head == pc.HEAD_CHECKPOINT_SAVE:
            ask = _json(req.body)
            ckpt_id, phase = int(ask["id"]), ask.get("phase")
            if phase == "snapshot":
                t0 = time.perf_counter()
                state = snapshot_shard(self.service.shard, self._meta())
                self._snapshot = (ckpt_id, state)
                app.response(req, orjson.dumps({"ok": True, "rows": int(len(state.keys)), "bytes": state.nbytes,
                                                "seconds": time.perf_counter() - t0,
                                                "ledger": state.meta["ledger"] if self._rank() == 0 else None}))
            elif phase == "write":
                threading.Thread(target=self._write, args=(req, app, ckpt_id), name="ckpt-write",
                                 daemon=True).start()
            else:
                raise ValueError(f"unknown save phase {phase!r}")
        elif head == pc.HEAD_ROLLBACK_LOAD:
            ask = _json(req.body)
            ckpt_id, phase = ask.get("id"), ask.get("phase")
            ckpt_id = None if ckpt_id is None else int(ckpt_id)
            if phase == "prepare":
                threading.Thread(target=self._prepare_for, args=(req, app, ckpt_id), name="ckpt-load",
                                 daemon=True).start()
            elif phase == "install":
                prepared = self._prepared
                if prepared is None or prepared[0] != ckpt_id:
                    raise ValueError(f"checkpoint {ckpt_id} was not prepared")
                with self._install_lock:
                    self._install(*prepared)
                self._prepared = None
                app.response(req, orjson.dumps({"ok": True, "epoch": self.service.epoch,
                                                "rows": len(self.service.shard)}))
            else:
                raise ValueError(f"unknown load phase {phase!r}")
        else:
            return False
        return True

    def _write(self, req, app, ckpt_id: int) -> None:
        try:
            snap = self._snapshot
            if snap is None or snap[0] != ckpt_id:
                raise CheckpointError(f"no snapshot for checkpoint {ckpt_id}")
            t0 = time.perf_counter()
            path, entry = self.store.write_shard(ckpt_id, self._rank(), snap[1])
            self._snapshot = None
            self.saved_id = ckpt_id
            seconds = time.perf_counter() - t0
            self.storage.succeeded(id=ckpt_id, rank=self._rank())
            log_event(log, "shard_written", id=ckpt_id, rank=self._rank(), rows=entry["rows"], bytes=entry["bytes"],
                      ms=round(seconds * 1e3, 1))
            app.response(req, orjson.dumps({"ok": True, "file": path.name, "seconds": seconds, **entry}))
        except OSError as exc:   # the file system: counted and told once per outage (storage_health)
            self.storage.failed("write shard", exc, id=ckpt_id, rank=self._rank())
            app.response(req, orjson.dumps({"ok": False, "storage": True, "errno": exc.errno, "error": describe(exc)}))
        except Exception as exc:   # answered, never fatal: the checkpoint stays incomplete
            log_event(log, "shard_write_failed", logging.ERROR, id=ckpt_id, error=f"{type(exc).__name__}: {exc}")
            app.response(req, orjson.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))

    def _prepare_for(self, req, app, ckpt_id: int | None) -> None:
        try:
            t0 = time.perf_counter()
            self._prepared = self._prepare(ckpt_id)
            app.response(req, orjson.dumps({"ok": True, "seconds": time.perf_counter() - t0}))
        except Exception as exc:
            log_event(log, "checkpoint_load_failed", logging.ERROR, id=ckpt_id, error=f"{type(exc).__name__}: {exc}")
            app.response(req, orjson.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))

    def _prepare(self, ckpt_id: int | None):
        """Read (and verify) checkpoint ``ckpt_id`` into a new shard; None = an empty model."""
        old = self.service.shard
        params = dict(dim=old.dim, optimizer=old.optimizer, eta=old.eta, seed=old.seed,
                      adagrad_init=old.adagrad_init, min_count=old.word_counts.min_count,
                      word_capacity=old.word_counts.capacity)
        if ckpt_id is None:
            return None, restore_shard([], **params), {}
        ckpt = self.store.verify(ckpt_id)   # only a verified checkpoint is read
        rank = self._rank()
        if ckpt.num_servers == self.po.num_servers:
            states = [self.store.read_shard(ckpt, rank)]
            meta = dict(states[0].meta)
        else:   # written by another number of servers: take the rows of my key range from every file
            states = [self.store.read_shard(ckpt, r) for r in range(ckpt.num_servers)]
            meta = {"tokens_counted": sum(int(s.meta.get("tokens_counted", 0)) for s in states) if rank == 0 else 0,
                    "ledger": next((s.meta.get("ledger") for s in states if s.meta.get("rank") == 0), None)}
        shard = restore_shard(states, key_range=self._key_range(), **params)
        return ckpt_id, shard, meta

    def _install(self, ckpt_id: int | None, shard, meta: dict) -> None:
        svc = self.service
        shard.merge_window = svc.shard.merge_window
        svc.shard = shard
        svc.c.tokens_counted = int(meta.get("tokens_counted", 0))
        self.ledger = BatchLedger(meta.get("ledger") if self._rank() == 0 else None)
        svc.epoch = secrets.randbits(62)   # the front end's next sync is a full one
        self.loaded_id = ckpt_id if ckpt_id is not None else 0
        log_event(log, "checkpoint_loaded", id=ckpt_id, rank=self._rank(), rows=len(shard), words=len(shard.words),
                  tokens_counted=svc.c.tokens_counted)


# ----------------------------------------------------------------------------- worker side

# How the workers read the stream, kept in each checkpoint's manifest (``reading``): the model's words
# are what these made of the records, so a cluster restarted with other ones would go on learning other
# words on top of the checkpoint's, and its offsets would resume a stream it reads differently.
READING_SETTINGS = {"tokenizer": "LIVEVEC_TOKENIZER", "language": "LIVEVEC_LANGUAGE",
                    "record_format": "LIVEVEC_RECORD_FORMAT", "record_field": "LIVEVEC_RECORD_FIELD"}


def worker_reading(settings) -> dict:
    """The ``reading`` of a worker's settings (``WorkerSettings``)."""
    return {"tokenizer": settings.learner.tokenizer, "language": settings.learner.language,
            "record_format": settings.stream.records.kind, "record_field": settings.stream.records.field}


def check_reading(checkpoint_dir: str, reading: dict, io_timeout: float | None = None) -> None:
    """Stops a worker at start, naming the setting, when the latest complete checkpoint was trained
    reading the stream another way (a checkpoint from before this was recorded is not checked). A directory
    that cannot be read now (a file-system outage) does not stop the worker: it trains, and the rollback that
    would restore that checkpoint waits for the storage anyway; one warning says the check was skipped."""
    store = CheckpointStore(checkpoint_dir, io_timeout=io_timeout)
    try:
        ckpt = store.latest_complete(check_data=False)
    except OSError as exc:
        log_event(log, "checkpoint_reading_unchecked", logging.WARNING, directory=checkpoint_dir,
                  error=f"{type(exc).__name__}: {exc}")
        return
    saved = (ckpt.manifest.get("reading") if ckpt is not None else None) or {}
    for key, setting in READING_SETTINGS.items():
        if key in saved and saved[key] != reading.get(key):
            raise SettingError(setting, f"is {reading.get(key)!r}, but the latest checkpoint ({ckpt.path}) was "
                                        f"trained with {saved[key]!r}: set it back, or start the cluster on a new "
                                        f"LIVEVEC_CHECKPOINT_DIR")


class WorkerCheckpointing(WorkerExtension):
    """The checkpoint/rollback side of one ``livevec worker`` (its extension when
    ``LIVEVEC_CHECKPOINT_DIR`` is set).

    Checkpointing is on when that directory is set on every role, as the deployment files
    do. The worker then starts paused and asks the coordinator to take it in: training
    starts with the rollback that seeks its partitions to the latest checkpoint, so nothing it
    would train before that is wasted. If the scheduler never answers (it runs without the
    directory), the worker says so in an ERROR line and trains without checkpoints.
    """

    ASK_INTERVAL = 2.0        # seconds between requests for a rollback while one is wanted
    CHECKPOINT_LEASE = 60.0   # a checkpoint pause longer than this ends by itself (the coordinator died)
    # A rollback's pause with no seek after this long: the rollback went on without this worker (twice the
    # coordinator's default LIVEVEC_ROLLBACK_WAIT_TIMEOUT, so a slow checkpoint load is not taken for it).
    ROLLBACK_LEASE = 120.0
    PROBES = 3                # unanswered requests before concluding the scheduler runs no coordinator

    def attach(self, worker) -> None:
        """Take over the worker's control requests and hold it paused until the coordinator
        takes it in (called by ``StreamingWorker``'s constructor, on its event loop)."""
        self.worker = worker
        self.kv = worker.kv
        self.stream = worker.stream
        self.loop = asyncio.get_running_loop()
        self._task = None
        self.coordinator: bool | None = None   # None: not heard from yet
        self._want: str | None = "worker started"
        self._want_at = time.monotonic()
        self._next_ask = 0.0
        self._unanswered = 0
        self._mode: str | None = None          # "checkpoint" or "rollback" while paused by the coordinator
        self._paused_at = 0.0
        self._rollback_started = 0.0
        self._rebalances_seen = self._rebalances_at_seek = self._rebalances()
        self.kv.set_simple_request_handle(self._on_request)
        worker.paused.set()   # until the coordinator takes this worker in (a rollback's seek + resume)
        self._mode = "joining"
        self._task = self.loop.create_task(self._watch(), name="checkpoint-watch")

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _rebalances(self) -> int:
        """Revocations and assignments both count. A rebalance revokes first and assigns later, possibly after
        a rollback's seek; partitions assigned then may have been trained past the checkpoint by their previous
        owner, so this worker is not clean again until a rollback seeks after the assignment."""
        counters = self.stream.counters
        return counters.rebalances + counters.assignments

    def _server0(self) -> int:
        return self.kv.po.server_ids()[0]

    def want_rollback(self, reason: str) -> None:
        if self._want is None:
            self._want_at = time.monotonic()
            self._next_ask = 0.0
        self._want = reason

    # -- requests from the coordinator (receive thread -> event loop)
    def _on_request(self, req, app) -> None:
        handlers = {pc.HEAD_CHECKPOINT_PAUSE: self._pause, pc.HEAD_ROLLBACK_SEEK: self._seek,
                    pc.HEAD_CHECKPOINT_RESUME: self._resume}
        handler = handlers.get(req.head)
        if handler is None:
            app.response(req)
            return
        asyncio.run_coroutine_threadsafe(self._serve(handler, req, app), self.loop)

    async def _serve(self, handler, req, app) -> None:
        if self.coordinator is not True:
            log_event(log, "checkpoint_coordinator_found", command=req.head)
            self.coordinator = True
        try:
            answer = await handler(_json(req.body))
        except Exception as exc:   # answered either way: the coordinator decides what to do
            log_event(log, "checkpoint_command_failed", logging.ERROR, head=req.head,
                      error=f"{type(exc).__name__}: {exc}")
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        app.response(req, orjson.dumps(answer))

    async def _pause(self, ask: dict) -> dict:
        w = self.worker
        abandon = ask.get("mode") == "abandon"
        now = time.monotonic()
        if abandon:
            self._mode = "rollback"
            self._rollback_started = now
            w.abandon.set()
            w.release_syncs()   # held by a checkpoint whose coordinator died: the rollback drains instead
        elif self._mode is None:
            self._mode = "checkpoint"
        self._paused_at = now
        timeout = float(ask.get("timeout", 30.0))
        hold = not abandon and w.replica is not None
        if hold:
            # The replica exchange's checkpoint does not stop training. The servers hold exactly what
            # acknowledged syncs brought, and the processed frontier covers exactly the batches those
            # syncs carried, so holding syncs while the servers snapshot is enough: batches trained
            # meanwhile stay in the replica, uncommitted, and go out with the first sync after the resume.
            if not await w.hold_syncs(timeout):
                return {"ok": False, "trainer": True, "error": "the sync in progress did not finish in time"}
        else:
            w.idle.clear()
            w.paused.set()
            deadline = now + timeout
            while not w.idle.is_set():
                if w.abandon.is_set():
                    self.kv.customer.fail_all(RequestTimeout("abandoned: the cluster is rolling back"))
                if w.stopping.is_set() or time.monotonic() > deadline:
                    return {"ok": False, "trainer": True, "error": "batches in flight did not finish in time"}
                await asyncio.sleep(0.005)
        drained = time.monotonic()
        answer = {"ok": True, "trainer": True, "node": self.kv.po.node_id, "drain_ms": round((drained - now) * 1e3, 1),
                  "training_paused": not hold, "assignment": sorted([t, p] for t, p in self.stream.assignment()),
                  "reading": worker_reading(w.settings)}
        if abandon:
            answer["fence_ok"] = await self._fence()
        else:
            await self.stream.commit()
            answer["positions"] = offsets_to_json(self.stream.positions())
            answer["commit_ms"] = round((time.monotonic() - drained) * 1e3, 1)
        # Read last: a revocation during the commit above (a rebalance while the pause waited on a slow sync) drops
        # its partitions from the positions while the ledger the servers snapshot has their batches. A checkpoint
        # taken from such an answer would store offsets behind its own ledger, and a rollback to it train those
        # records twice (tests/test_kafka_outage.py, 42 records in 1 run of 2).
        answer["dirty"] = self._rebalances() != self._rebalances_at_seek
        return answer

    async def _fence(self) -> bool:
        """One round trip to every server: whatever this worker sent before has been applied."""
        pending = [self.kv.request(pc.HEAD_FENCE, b"", sid) for sid in self.kv.po.server_ids()]
        ok = True
        for ts in pending:
            try:
                await self.kv.wait_async(ts, 10.0)
            except (RequestTimeout, SendError):
                ok = False
        return ok

    async def _seek(self, ask: dict) -> dict:
        offsets = offsets_from_json(ask.get("offsets") or {})
        beginnings = await self.stream.beginning_offsets()
        target = {**beginnings, **{tp: off for tp, off in offsets.items() if tp in beginnings or not beginnings}}
        await self.stream.seek_to(target)
        await self.stream.commit()
        rows = await asyncio.to_thread(self.worker.reload_replica)
        words = await asyncio.to_thread(self._resend_words)
        self._rebalances_at_seek = self._rebalances()
        if self._want is not None and self._want_at <= self._rollback_started:
            self._want = None
        return {"ok": True, "partitions": len(target), "words": words, "replica_rows": rows}

    def _resend_words(self) -> int:
        """The servers were reloaded, but this worker's vocabulary was not: words that became
        trainable after the checkpoint would never be named again. Name them all (the worker is
        paused, so the vocabulary does not change meanwhile)."""
        trainer = self.worker.trainer
        vocab = trainer.vocab
        slots = vocab.trainable_slots()
        if len(slots):
            trainer.store.set_words(vocab.keys[slots].copy(), [vocab.words[i] for i in slots.tolist()])
        return int(len(slots))

    async def _resume(self, ask: dict) -> dict:
        w = self.worker
        w.release_syncs()
        self._mode = None
        w.abandon.clear()
        w.paused.clear()
        return {"ok": True}

    # -- called by the worker
    async def batch_done(self, batch, stats) -> bool:
        return await self.batches_done([(batch, stats)])

    async def batches_done(self, done) -> bool:
        """One ledger message for the batches a sync carried, in the order they were trained."""
        if self.coordinator is False:
            return True
        body = orjson.dumps({"ranges": [[t, p, s, e] for batch, _ in done for (t, p), (s, e) in batch.ranges.items()],
                             "records": sum(len(b) for b, _ in done), "tokens": sum(int(st.tokens) for _, st in done),
                             "batches": len(done)})
        try:
            ts = self.kv.request(pc.HEAD_LEDGER, body, self._server0())
            await self.kv.wait_async(ts, self.worker.settings.request_timeout)
            return True
        except (RequestTimeout, SendError) as exc:
            if not self.worker.abandon.is_set():
                self.want_rollback(f"ledger not acknowledged: {exc}")
            return False

    def batch_retried(self, exc: BaseException) -> None:
        # A retried batch may have been applied in part: only a rollback makes that exact again.
        self.loop.call_soon_threadsafe(self.want_rollback, f"batch retried: {type(exc).__name__}")

    # -- background: rebalances, asking for rollbacks, the pause lease
    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            try:
                await self._watch_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("checkpoint watch failed")

    async def _watch_once(self) -> None:
        now = time.monotonic()
        rebalances = self._rebalances()
        if rebalances != self._rebalances_seen:
            self._rebalances_seen = rebalances
            self.want_rollback("partitions rebalanced")
        if self._mode == "checkpoint" and now - self._paused_at > self.CHECKPOINT_LEASE:
            log_event(log, "checkpoint_pause_expired", logging.WARNING, seconds=round(now - self._paused_at, 1))
            await self._resume({})
        if self._mode == "rollback" and self._want is None and now - self._paused_at > self.ROLLBACK_LEASE:
            # Paused by a rollback that went on without this worker (its wait timed out, or the coordinator
            # restarted): it trains nothing until a rollback seeks it, so it asks for one.
            log_event(log, "rollback_pause_expired", logging.WARNING, seconds=round(now - self._paused_at, 1))
            self.want_rollback("left out of a rollback")
        if self._want is None or self.coordinator is False or now < self._next_ask:
            return
        self._next_ask = now + self.ASK_INTERVAL
        body = orjson.dumps({"action": "rollback", "reason": self._want, "node": self.kv.po.node_id})
        try:
            ts = self.kv.request(pc.HEAD_CHECKPOINT_REQUEST, body, SCHEDULER_ID)
            answer = await self.kv.wait_async(ts, self.ASK_INTERVAL)
            ok = bool(answer) and _json(answer[0].body).get("ok")
        except (RequestTimeout, SendError, ValueError, orjson.JSONDecodeError):
            ok = False
        if ok:
            if self.coordinator is not True:
                log_event(log, "checkpoint_coordinator_found", reason=self._want)
            self.coordinator = True
            self._unanswered = 0
            self._next_ask = now + 5 * self.ASK_INTERVAL   # it rolls back soon; ask again if it does not
        else:
            self._unanswered += 1
            if self.coordinator is None and self._unanswered >= self.PROBES:
                self.coordinator = False
                self._want = None
                log_event(log, "no_checkpoint_coordinator", logging.ERROR,
                          problem="LIVEVEC_CHECKPOINT_DIR is set here but the scheduler does not coordinate "
                                  "checkpoints (set it on the scheduler too)",
                          consequence="training without checkpoints: Kafka delivery is at-least-once")
                if self._mode == "joining":
                    await self._resume({})
