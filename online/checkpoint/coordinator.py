"""The checkpoint coordinator: runs in the scheduler process and drives checkpoints and rollbacks.

Why the scheduler: it already knows who is in the cluster (registrations, heartbeats, dead nodes, elastic joins and
leaves), and there is exactly one. ``online.checkpoint.participants`` describes the protocol and the invariant; this
module decides *when*:

* a **checkpoint** every ``interval`` seconds (``LIVEVEC_CHECKPOINT_INTERVAL``), every
  ``records`` trained records (``LIVEVEC_CHECKPOINT_RECORDS``, read from server 0's ledger),
  or on demand (``HEAD_CHECKPOINT_REQUEST {"action": "checkpoint"}``, or a request file from
  ``livevec checkpoint now``);
* a **rollback** when a server dies or is replaced, a trainer is dropped (dead or left), a worker asks for one (it
  started, its partitions were rebalanced, a batch was retried or not acknowledged), or the coordinator itself
  (re)starts. Requests arriving within ``ROLLBACK_DELAY`` seconds are served by one rollback; a rollback that cannot
  complete (a server still dead, a worker not answering) leaves the workers paused and is retried.

Rollbacks always win over checkpoints: no checkpoint is taken while one is pending, and a checkpoint whose workers
report a rebalance since their last rollback (``dirty``) is abandoned in favour of a rollback, so a checkpoint can
never capture a state that is not exactly "records before its offsets, each once".

**Storage faults** (the directory is a shared file system: a MooseFS master or chunkserver
down, a mount gone or read-only, a full disk) never stop training. Every call on the store has
a deadline (``LIVEVEC_CHECKPOINT_IO_TIMEOUT``), so the coordinator cannot hang with a dead
mount. Before pausing the workers it probes the directory (a small write); a checkpoint whose
probe, shard writes or manifest fail is aborted without a manifest and its directory removed,
so it is never taken as the latest. While storage is failing, a probe every
``STORAGE_RETRY`` seconds (no pause) finds it back and a checkpoint is taken at once; a server
that could not write is retried with a backoff up to the interval. A rollback whose store
cannot be read waits (the workers stay paused) rather than restore an empty model.
``online.checkpoint.storage_health`` turns the outage into a metric and rate-limited log lines.

Design: docs/design/0006-checkpoints.md
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from online.checkpoint.metrics import CoordinatorMetrics
from online.checkpoint.node_requests import ask_nodes
from online.checkpoint.settings import CoordinatorSettings
from online.checkpoint.storage_health import StorageHealth, describe
from online.checkpoint.store import CheckpointStore, StoredCheckpoint, offsets_from_json, offsets_to_json
from online.cluster import ps_commands as pc
from online.cluster.scheduler import SchedulerExtension
from ps_bridge.message import Role
from ps_bridge.metrics import Registry
from ps_bridge.postoffice import Postoffice
from ps_bridge.simple_app import SimpleApp
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.checkpoint")


@dataclass
class _Cut:
    """A checkpoint in the making: what its pause and snapshot found, for the steps after them."""
    reason: str
    started: float
    id: int = 0
    trainers: dict[int, dict] = field(default_factory=dict)      # the trainers' answers to the pause
    servers: list[int] = field(default_factory=list)
    snapshots: dict[int, dict | None] = field(default_factory=dict)
    paused_ms: float = 0.0        # until every worker had paused
    pause: float = 0.0            # the training stall, pause to resume, in seconds
    writing_from: float = 0.0

    @property
    def ledger(self) -> dict:
        """Server 0's ledger at the snapshot: the records, tokens and batches trained into it."""
        return (self.snapshots.get(self.servers[0]) or {}).get("ledger") or {}


class _Failed(Exception):
    """A checkpoint step failed; ``result`` is the coordinator's answer to the checkpoint's request."""

    def __init__(self, result: dict):
        super().__init__(result.get("error"))
        self.result = result


class CheckpointCoordinator(SchedulerExtension):
    ROLLBACK_DELAY = 0.5      # seconds to gather rollback requests into one
    RETRY_DELAY = 1.0         # seconds between attempts of a rollback that could not complete
    STATS_INTERVAL = 2.0      # seconds between reads of server 0's ledger (record trigger)
    STORAGE_RETRY = 2.0       # seconds between probes of a failing checkpoint directory

    def __init__(self, po: Postoffice, settings: CoordinatorSettings, registry: Registry | None = None):
        self.po = po
        self.settings = settings
        self.store = CheckpointStore(settings.checkpoint_dir, io_timeout=settings.io_timeout)
        self.store.ensure()   # the one place the directory is created: afterwards a missing root is a lost mount
        self.store.create = False
        self.storage = StorageHealth(registry or po.registry, str(self.store.root))
        self._storage_retry_at = 0.0      # while storage fails: next probe
        self._write_backoff = 0.0         # after servers failed to write: seconds until the next attempt
        self.app = SimpleApp(po, 0)
        self.app.set_simple_request_handle(self._on_request)
        po.membership_listeners.append(self._on_membership)
        self.metrics = CoordinatorMetrics(registry or po.registry)
        self.base: StoredCheckpoint | None = None
        started = time.time()   # with no complete checkpoint yet, the age counts from the start
        (registry or po.registry).gauge(
            "livevec_checkpoint_age_seconds", "seconds since the latest complete checkpoint was written",
            fn=lambda: time.time() - float(self.base.manifest.get("created", started) if self.base else started))
        self.trainers: set[int] = set()
        self.readers: set[int] = set()   # answered a pause with no batch (front ends): dying in one aborts nothing
        self.dead_servers: set[int] = set()
        self.last_checkpoint: dict | None = None
        self.last_rollback: dict | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._rollback_reasons: list[str] = ["coordinator started"]
        self._rollback_after = 0.0
        self._checkpoint_requests: list[tuple[str, Path | None]] = []
        self._last_checkpoint_at = time.monotonic()
        self._records_at_checkpoint: int | None = None
        self._next_stats = 0.0
        self._next_files = 0.0
        self._thread: threading.Thread | None = None
        self._membership_changes = 0
        # The wait of a pending rollback (liveness): when its first attempt failed, what it last waited for
        # and when that was logged, and the workers a timed-out wait went on without (fenced by the servers).
        self._wait_started: float | None = None
        self._wait_logged: tuple[str, float] = ("", 0.0)
        self._wait_timed_out = False
        self.left_out: set[int] = set()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        try:
            self.base = self.store.latest_complete()
        except OSError as exc:   # the rollback it starts with waits for the store
            self.storage.failed("read", exc)
        if self.base is not None:
            self.metrics.last_id.set(self.base.id)
            self.metrics.bytes.set(self.base.bytes)
        log_event(log, "coordinator_started", dir=str(self.store.root), base=self.base.id if self.base else None,
                  interval=self.settings.interval, records=self.settings.records)
        self._thread = threading.Thread(target=self._run, name="checkpoint-coordinator", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # ------------------------------------------------------------------ triggers (any thread)
    def request_rollback(self, reason: str) -> None:
        with self._lock:
            if not self._rollback_reasons:
                self._rollback_after = time.monotonic() + self.ROLLBACK_DELAY
            self._rollback_reasons.append(reason)
        self.metrics.recovering.set(1)
        self._wake.set()

    def request_checkpoint(self, reason: str, answer: Path | None = None) -> None:
        with self._lock:
            self._checkpoint_requests.append((reason, answer))
        self._wake.set()

    def _on_membership(self, event: str, node_id: int, role: int) -> None:
        self._membership_changes += 1
        if event == "adopted":   # this scheduler restarted and took a running node back
            self.request_rollback(f"{Role(role).name.lower()} {node_id} re-joined a restarted scheduler")
        elif role == Role.SERVER:
            if event == "dead":
                self.dead_servers.add(node_id)
                self.request_rollback(f"server {node_id} dead")
            elif event == "recovered":
                self.dead_servers.discard(node_id)
                self.request_rollback(f"server {node_id} restarted")
            elif event == "alive_again" and node_id in self.dead_servers:
                # A partition healed: the process never died, but it missed updates (or applied some the
                # rest of the cluster gave up on). It rejoins through recovery: every server reloads the
                # checkpoint and the workers seek back, exactly as after a restart.
                self.dead_servers.discard(node_id)
                self.request_rollback(f"server {node_id} back after being declared dead")
        elif role == Role.WORKER and event == "recovered":   # another process has the id: its role is unknown
            self.readers.discard(node_id)
        if role == Role.WORKER and node_id in self.trainers and \
                event in ("dead", "recovered", "worker_dead", "worker_left"):
            # "recovered": a restarted process took over the dead trainer's id
            self.trainers.discard(node_id)
            self.request_rollback(f"worker {node_id} {event.removeprefix('worker_')}")

    def _on_request(self, req, app) -> None:
        try:
            ask = orjson.loads(req.body) if req.body else {}
            action = ask.get("action", "checkpoint") if isinstance(ask, dict) else None
            reason = str(ask.get("reason", "requested"))[:200] if isinstance(ask, dict) else ""
            if req.head != pc.HEAD_CHECKPOINT_REQUEST or action not in ("checkpoint", "rollback"):
                raise ValueError(f"unknown request head={req.head} action={action!r}")
            if action == "rollback":
                self.trainers.add(req.sender)
                self.request_rollback(f"node {req.sender}: {reason}")
            else:
                self.request_checkpoint(f"node {req.sender}: {reason}")
            app.response(req, orjson.dumps({"ok": True}))
        except (ValueError, orjson.JSONDecodeError) as exc:
            log_event(log, "coordinator_request_rejected", logging.WARNING, sender=req.sender, error=str(exc))
            app.response(req, orjson.dumps({"ok": False, "error": str(exc)}))

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(0.25)
            self._wake.clear()
            try:
                self._step()
            except Exception:   # keep coordinating whatever happens
                log.exception("coordinator step failed")
                time.sleep(self.RETRY_DELAY)

    def _step(self) -> None:
        now = time.monotonic()
        with self._lock:
            rollback_due = bool(self._rollback_reasons) and now >= self._rollback_after
        if rollback_due:
            with self._lock:
                reasons, self._rollback_reasons = self._rollback_reasons, []
            if self._rollback(reasons):
                self._wait_started, self._wait_logged, self._wait_timed_out = None, ("", 0.0), False
            else:
                if self._wait_started is None:
                    self._wait_started = time.monotonic()
                with self._lock:
                    self._rollback_reasons = reasons + self._rollback_reasons
                    self._rollback_after = time.monotonic() + self.RETRY_DELAY
            return
        with self._lock:
            if self._rollback_reasons:
                return
        if now >= self._next_files and self.storage.ok:
            self._next_files = now + 1.0
            try:
                for path in self.store.pending_requests():
                    self.request_checkpoint("livevec checkpoint now", self.store.take_request(path))
            except OSError as exc:
                self.storage.failed("requests", exc)
                self._storage_retry_at = now + self.STORAGE_RETRY
        if not self.storage.ok and now >= self._storage_retry_at:
            self._storage_retry_at = now + self.STORAGE_RETRY
            if self._probe() and self._write_backoff == 0.0:
                self.request_checkpoint("checkpoint directory back")
        reason = self._checkpoint_due(now)
        if reason is not None:
            with self._lock:
                requests, self._checkpoint_requests = self._checkpoint_requests, []
            if not requests and reason != "retry after a failed write" and self._nothing_trained_since_base():
                self._last_checkpoint_at = now   # an idle cluster writes no identical checkpoints
                return
            result = self._checkpoint(reason)
            for _, answer in requests:
                if answer is not None:
                    try:
                        self.store.answer_request(answer.with_suffix(".json"), result)
                    except OSError as exc:
                        self.storage.failed("requests", exc)

    def _probe(self) -> bool:
        """Whether the directory takes a small write here now (bounded). The outage ends with the next
        complete checkpoint, not with this: the servers write through mounts of their own."""
        try:
            self.store.probe()
        except OSError as exc:
            self.storage.failed("probe", exc)
            return False
        return True

    def _checkpoint_due(self, now: float) -> str | None:
        with self._lock:
            if self._checkpoint_requests:
                return self._checkpoint_requests[0][0]
        s = self.settings
        if self._write_backoff and (s.interval > 0 or s.records > 0) and \
                now - self._last_checkpoint_at >= self._write_backoff:
            return "retry after a failed write"
        if s.interval > 0 and now - self._last_checkpoint_at >= s.interval:
            return "interval"
        if s.records > 0 and now >= self._next_stats:
            self._next_stats = now + self.STATS_INTERVAL
            records = self._ledger_records()
            if records is not None:
                if self._records_at_checkpoint is None:
                    self._records_at_checkpoint = records
                elif records - self._records_at_checkpoint >= s.records:
                    return "records"
        return None

    def _nothing_trained_since_base(self) -> bool:
        if self.base is None:
            return False
        answers = self._ask(pc.HEAD_STATS, {}, self.po.server_ids()[:1], 5.0)
        ledger = (answers.get(self.po.server_ids()[0]) or {}).get("ledger")
        return bool(ledger) and ledger.get("batches") == self.base.manifest.get("batches")

    def _ledger_records(self) -> int | None:
        answers = self._ask(pc.HEAD_STATS, {}, self.po.server_ids()[:1], 5.0)
        stats = answers.get(self.po.server_ids()[0])
        ledger = (stats or {}).get("ledger") or {}
        return ledger.get("records")

    # ------------------------------------------------------------------ requests to nodes
    def _ask(self, head: int, body: dict, ids: list[int], timeout: float, *, drop_gone: bool = False,
             give_up_on_rollback: bool = False) -> dict[int, dict | None]:
        """``ask_nodes``; ``give_up_on_rollback``: stop waiting (the missing answers are None) as soon as a
        rollback is requested or the membership changes (a node died, was replaced or re-joined: its answer
        may never come)."""
        changes = self._membership_changes

        def rollback_wanted() -> bool:
            with self._lock:
                return bool(self._rollback_reasons) or self._membership_changes != changes
        return ask_nodes(self.app, self.po, head, body, ids, timeout, drop_gone=drop_gone,
                         give_up=rollback_wanted if give_up_on_rollback else None)

    # ------------------------------------------------------------------ checkpoint
    def _checkpoint(self, reason: str) -> dict:
        """One checkpoint: the workers pause while the servers snapshot, then, training resumed, the servers
        write their shards and the manifest goes last. A step that fails abandons it, without a manifest."""
        if self.dead_servers:
            self.metrics.checkpoints["aborted"].inc()
            return {"ok": False, "error": f"servers {sorted(self.dead_servers)} are dead"}
        cut = _Cut(reason, started=time.monotonic())
        self._last_checkpoint_at = cut.started
        try:
            cut.id = self._probe_and_number(reason)
            self._pause_and_snapshot(cut)
            files = self._write_shards(cut)
            ckpt = self._write_manifest(cut, files)
        except _Failed as failed:
            return failed.result
        return self._done(cut, ckpt, files, removed=self._prune())

    def _probe_and_number(self, reason: str) -> int:
        # Checked before the workers pause: a directory that takes no writes costs training nothing.
        try:
            self.store.probe()
            return self.store.next_id()
        except OSError as exc:
            raise _Failed(self._storage_abort(None, "probe", exc, reason)) from None

    def _pause_and_snapshot(self, cut: _Cut) -> None:
        """Pause the workers, have the servers snapshot, resume; ``_Failed`` if the cut is not consistent."""
        workers = [w for w in self.po.worker_ids() if w not in self.left_out]
        problem = self._pause_workers(cut, workers) or self._snapshot_servers(cut) or self._rollback_meanwhile()
        self._ask(pc.HEAD_CHECKPOINT_RESUME, {}, workers, 5.0, drop_gone=True)
        cut.pause = time.monotonic() - cut.started
        self.metrics.pause.observe(cut.pause)   # an aborted checkpoint stalled training too
        self.metrics.last_pause.set(cut.pause)
        if problem is not None:
            self.metrics.checkpoints["aborted"].inc()
            log_event(log, "checkpoint_aborted", logging.WARNING, id=cut.id, reason=problem,
                      pause_ms=round(cut.pause * 1e3))
            raise _Failed({"ok": False, "error": problem})
        self.trainers |= set(cut.trainers)

    def _pause_workers(self, cut: _Cut, workers: list[int]) -> str | None:
        """Drain and pause the workers (``cut.trainers``: the trainers' answers); what went wrong, if anything."""
        s = self.settings
        # A worker that dies during the pause must abort the checkpoint (not be left out of it): its
        # last batch may be half applied, which only the rollback its death triggers can undo.
        answers = self._ask(pc.HEAD_CHECKPOINT_PAUSE, {"mode": "drain", "id": cut.id, "timeout": s.pause_timeout},
                            workers, s.pause_timeout + 5, give_up_on_rollback=True)
        cut.trainers = trainers = {n: a for n, a in answers.items() if a and a.get("trainer")}
        self.readers = (self.readers | {n for n, a in answers.items() if a is not None and not a.get("trainer")}) \
            - set(trainers)    # a reader's answer is empty: it has no handler for the pause
        answers = {n: a for n, a in answers.items() if a is not None or n not in self.readers
                   or n in self.po.worker_ids()}
        cut.paused_ms = round((time.monotonic() - cut.started) * 1e3, 1)
        if any(a is None or not a.get("ok", True) for a in answers.values()):
            bad = sorted(n for n, a in answers.items() if a is None or not a.get("ok", True))
            why = "; ".join(f"{n}: {answers[n]['error'] if answers[n] and answers[n].get('error') else 'no answer'}"
                            for n in bad)
            return f"workers {bad} did not pause ({why})"
        if any(a.get("dirty") for a in trainers.values()):
            self.request_rollback("partitions rebalanced (seen at checkpoint)")
            return "partitions were rebalanced since the last rollback"
        return None

    def _snapshot_servers(self, cut: _Cut) -> str | None:
        cut.servers = self.po.server_ids()
        # A server that dies meanwhile never answers (its replacement takes its id, so it stays "live"):
        # stop waiting once a rollback is wanted, which this checkpoint could not be part of anyway.
        cut.snapshots = self._ask(pc.HEAD_CHECKPOINT_SAVE, {"id": cut.id, "phase": "snapshot"}, cut.servers, 120,
                                  give_up_on_rollback=True)
        if any(a is None or not a.get("ok") for a in cut.snapshots.values()):
            return f"servers did not snapshot: {cut.snapshots}"
        return None

    def _rollback_meanwhile(self) -> str | None:
        with self._lock:
            if self._rollback_reasons:
                # a node died, restarted or retried a batch meanwhile: the snapshot may mix states
                return f"a rollback was requested during the checkpoint ({self._rollback_reasons[0]})"
        return None

    def _write_shards(self, cut: _Cut) -> dict[str, dict]:
        """Have the servers write their snapshots; the manifest's entry of each file."""
        cut.writing_from = time.monotonic()
        try:
            self.store.prepare(cut.id)
        except OSError as exc:
            raise _Failed(self._storage_abort(cut.id, "mkdir", exc, cut.reason)) from None
        # A server killed mid-write is relaunched under its id, so its request never fails: without
        # giving up on the rollback its death causes, this would wait out the 600 s while the cluster trained
        # against an empty server. The checkpoint then fails (it is incomplete) and the rollback goes on.
        written = self._ask(pc.HEAD_CHECKPOINT_SAVE, {"id": cut.id, "phase": "write"}, cut.servers, 600,
                            give_up_on_rollback=True)
        if any(a is None or not a.get("ok") for a in written.values()):
            storage = [a for a in written.values() if a and a.get("storage")]
            if storage:   # the servers' file system failed: the outage's lines, not one ERROR per attempt
                raise _Failed(self._storage_abort(cut.id, "write shard", str(storage[0].get("error", "")),
                                                  cut.reason))
            self.metrics.checkpoints["failed"].inc()
            self.store.discard(cut.id)
            log_event(log, "checkpoint_failed", logging.ERROR, id=cut.id, answers=str(written)[:500])
            raise _Failed({"ok": False, "error": "servers did not write their shards", "id": cut.id})
        return {a["file"]: {k: a[k] for k in ("bytes", "sha256", "rows", "words")} for a in written.values()}

    def _write_manifest(self, cut: _Cut, files: dict[str, dict]) -> StoredCheckpoint:
        """The manifest, written last: with it the checkpoint is complete, and the new base."""
        offsets = offsets_from_json(self.base.offsets) if self.base is not None else {}
        for answer in cut.trainers.values():
            offsets.update(offsets_from_json(answer.get("positions") or {}))
        ledger = cut.ledger
        manifest = {"created": time.time(), "num_servers": len(cut.servers), "offsets": offsets_to_json(offsets),
                    "files": files, "reason": cut.reason, "workers": len(cut.trainers),
                    "pause_seconds": round(cut.pause, 4), "write_seconds": None, "records": ledger.get("records"),
                    "tokens": ledger.get("tokens"), "batches": ledger.get("batches"),
                    "reading": next((a["reading"] for a in cut.trainers.values() if a.get("reading")), None),
                    "previous": self.base.id if self.base is not None else None}
        manifest["write_seconds"] = round(time.monotonic() - cut.writing_from, 4)
        try:
            ckpt = self.store.write_manifest(cut.id, manifest)
        except OSError as exc:
            raise _Failed(self._storage_abort(cut.id, "write manifest", exc, cut.reason)) from None
        self.base = ckpt
        self._write_backoff = 0.0
        self.storage.succeeded(id=cut.id)
        self._records_at_checkpoint = ledger.get("records", self._records_at_checkpoint)
        return ckpt

    def _prune(self) -> list[int]:
        try:
            return self.store.prune(self.settings.keep)
        except OSError as exc:   # the checkpoint is complete; older ones go at the next success
            self.storage.failed("prune", exc)
            return []

    def _done(self, cut: _Cut, ckpt: StoredCheckpoint, files: dict[str, dict], removed: list[int]) -> dict:
        """Metrics, ``checkpoint_done`` and the answer to the request."""
        total = time.monotonic() - cut.started
        trainers, pause = cut.trainers, cut.pause
        self.metrics.checkpoints["done"].inc()
        self.metrics.write.observe(time.monotonic() - cut.writing_from)
        self.metrics.bytes.set(ckpt.bytes)
        self.metrics.last_id.set(ckpt.id)
        self.last_checkpoint = {"id": ckpt.id, "pause_seconds": pause,
                                "write_seconds": time.monotonic() - cut.writing_from, "total_seconds": total,
                                "bytes": ckpt.bytes, "rows": sum(f["rows"] for f in files.values()),
                                "reason": cut.reason}
        stopped = any(a.get("training_paused", True) for a in trainers.values())
        log_event(log, "checkpoint_done", id=ckpt.id, reason=cut.reason, pause_ms=round(pause * 1e3, 1),
                  training_pause_ms=round(pause * 1e3, 1) if stopped else 0.0, workers_paused_ms=cut.paused_ms,
                  drain_ms=max((float(a.get("drain_ms", 0)) for a in trainers.values()), default=0.0),
                  write_ms=round((time.monotonic() - cut.writing_from) * 1e3, 1), bytes=ckpt.bytes,
                  workers=len(trainers), records=cut.ledger.get("records"), pruned=",".join(map(str, removed)) or "-")
        return {"ok": True, **self.last_checkpoint}

    def _storage_abort(self, ckpt_id: int | None, op: str, exc: BaseException | str, reason: str) -> dict:
        """A checkpoint the directory did not take: no manifest, its directory removed (when the file
        system lets us), one counted failure, and a retry soon."""
        self.metrics.checkpoints["failed" if ckpt_id is not None else "aborted"].inc()
        removed = self.store.discard(ckpt_id) if ckpt_id is not None else None
        self.storage.failed(op, exc, id=ckpt_id, checkpoint_reason=reason, removed=removed)
        now = time.monotonic()
        self._storage_retry_at = now + self.STORAGE_RETRY
        if op == "write shard":   # only the servers see their mounts: retry the whole checkpoint, backing off
            cap = self.settings.interval if self.settings.interval > 0 else 60.0
            self._write_backoff = min(max(2 * self._write_backoff, self.STORAGE_RETRY), cap)
        else:
            self._write_backoff = 0.0
        return {"ok": False, "error": f"checkpoint directory failed ({op}): {describe(exc)}", "id": ckpt_id}

    # ------------------------------------------------------------------ rollback
    ROLLBACK_WAITING_EVERY = 30.0   # seconds between two rollback_waiting lines that say the same

    def _log_waiting(self, why: str, waiting_for: str, level: int = logging.INFO) -> None:
        """``rollback_waiting``, rate-limited: when what it waits for changes, else every 30 s."""
        now = time.monotonic()
        last, at = self._wait_logged
        if waiting_for == last and now - at < self.ROLLBACK_WAITING_EVERY:
            return
        self._wait_logged = (waiting_for, now)
        waited = round(now - self._wait_started, 1) if self._wait_started is not None else 0.0
        log_event(log, "rollback_waiting", level, reason=why, waiting_for=waiting_for, waited_s=waited,
                  timeout_s=self.settings.rollback_wait_timeout)

    def _wait_expired(self) -> bool:
        return self._wait_started is not None and \
            time.monotonic() - self._wait_started >= self.settings.rollback_wait_timeout

    def _live_workers(self) -> list[int]:
        """The workers a rollback waits for: the members of the cluster not declared dead."""
        dead = self.po.dead_node_ids()
        return [w for w in self.po.worker_ids() if w not in dead]

    def _missing_servers(self) -> list[int]:
        """Servers a rollback cannot go without: declared dead (and not back or replaced since), or not
        in the scheduler's book at all (a restarted scheduler that has not taken them back yet)."""
        known = self.po.nodes()
        dead = self.po.dead_node_ids()
        # the book is the truth: a server back or replaced since its "dead" event is no longer waited for
        self.dead_servers = {s for s in self.dead_servers if s in dead or s not in known}
        return sorted(s for s in self.po.server_ids() if s in self.dead_servers or s in dead or s not in known)

    def _rollback(self, reasons: list[str]) -> bool:
        t0 = time.monotonic()
        why = "; ".join(dict.fromkeys(reasons))[:500]
        missing = self._missing_servers()
        if missing:
            self._log_waiting(why, f"servers {missing}")
            self._pause_for_rollback(self._live_workers())   # stop useless retries meanwhile
            return False
        servers = self.po.server_ids()
        self._ask(pc.HEAD_RECOVERING, {"recovering": True}, servers, 2.0)
        answers = self._pause_for_rollback(self._live_workers())
        failed = sorted(n for n, a in answers.items() if a is None or not a.get("ok", True) or
                        not a.get("fence_ok", True))
        if failed and self._wait_expired():
            # No wait is unbounded: go on with the workers that answered. The others are not taken in,
            # so the servers fence whatever they send; one that is alive asks for a rollback again.
            if not self._wait_timed_out:
                self._wait_timed_out = True
                self.metrics.wait_timeouts.inc()
                log_event(log, "rollback_wait_timeout", logging.WARNING, reason=why, left_out=",".join(map(str, failed)),
                          waited_s=round(time.monotonic() - self._wait_started, 1),
                          timeout_s=self.settings.rollback_wait_timeout,
                          action="rolling back with the workers that answered; the others stay fenced")
            answers = {n: a for n, a in answers.items() if n not in failed}
        elif failed:
            self._log_waiting(why, f"workers {failed} to pause and fence")
            return False
        trainers = sorted(n for n, a in answers.items() if a and a.get("trainer"))
        try:   # a store it cannot read is not a store without checkpoints: wait, never restore an empty model
            target = self.store.latest_complete()
        except OSError as exc:
            self.storage.failed("read", exc, rollback=why)
            return False
        target_id = target.id if target is not None else None
        for phase, timeout in (("prepare", 600.0), ("install", 60.0)):
            loads = self._ask(pc.HEAD_ROLLBACK_LOAD, {"id": target_id, "phase": phase}, servers, timeout,
                              give_up_on_rollback=True)
            bad = {n: a for n, a in loads.items() if a is None or not a.get("ok")}
            if bad:
                log_event(log, "rollback_waiting", logging.WARNING, reason=why,
                          waiting_for=f"servers to {phase} checkpoint {target_id}: {str(bad)[:300]}")
                return False
        # The servers accept changes from these workers only (their seek names words again): a worker the
        # cluster dropped, back from a partition, cannot change the model until a rollback takes it in.
        taken_in = self._ask(pc.HEAD_RECOVERING, {"recovering": True, "members": trainers}, servers, 10.0,
                             give_up_on_rollback=True)
        if any(a is None for a in taken_in.values()):
            log_event(log, "rollback_waiting", logging.WARNING, reason=why, waiting_for="servers to take the members in")
            return False
        offsets = target.offsets if target is not None else {}
        seeks = self._ask(pc.HEAD_ROLLBACK_SEEK, {"offsets": offsets, "id": target_id}, trainers, 60.0,
                          drop_gone=True, give_up_on_rollback=True)
        bad = sorted(n for n, a in seeks.items() if a is None or not a.get("ok"))
        if bad:
            self._log_waiting(why, f"workers {bad} to seek", logging.WARNING)
            return False
        self.base = target
        self.trainers = set(seeks)
        self.left_out = set(failed)
        # The servers take the new members in before the workers resume, or their first pushes are fenced.
        self._ask(pc.HEAD_RECOVERING, {"recovering": False, "members": sorted(seeks)}, servers, 2.0)
        self._ask(pc.HEAD_CHECKPOINT_RESUME, {}, sorted(seeks), 10.0, drop_gone=True)
        seconds = time.monotonic() - t0
        with self._lock:
            if not self._rollback_reasons:
                self.metrics.recovering.set(0)
        self.metrics.rollbacks.inc()
        self.metrics.rollback_seconds.observe(seconds)
        self._last_checkpoint_at = max(self._last_checkpoint_at, time.monotonic() - self.settings.interval / 2)
        self.last_rollback = {"to": target_id, "seconds": seconds, "reason": why, "workers": len(seeks)}
        log_event(log, "rollback_done", to=target_id, reason=why, ms=round(seconds * 1e3, 1), workers=len(seeks))
        return True

    def _pause_for_rollback(self, workers: list[int]) -> dict[int, dict | None]:
        return self._ask(pc.HEAD_CHECKPOINT_PAUSE, {"mode": "abandon", "timeout": self.settings.pause_timeout},
                         workers, self.settings.pause_timeout + 5, drop_gone=True, give_up_on_rollback=True)
