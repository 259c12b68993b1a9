"""Checkpoints on disk: one directory per checkpoint, shard files, and a manifest written last.

Layout under ``LIVEVEC_CHECKPOINT_DIR`` (local, or a shared file system such as MooseFS/NFS)::

    ckpt-00000007/server-0.npz     one file per server rank (numpy .npz, no pickles)
    ckpt-00000007/server-1.npz
    ckpt-00000007/manifest.json    written LAST: ids, Kafka offsets, file sizes and SHA-256
    requests/<name>.json           on-demand requests from ``livevec checkpoint now``

Why a manifest written last: a checkpoint is complete exactly when its manifest exists and
every file it lists has the listed size and SHA-256. A crash at any point leaves either the
previous complete checkpoint or a directory without a (valid) manifest, which readers skip
with a log line saying why. Every file (shards and manifest) is written to a temporary name,
fsynced, renamed, and the directory fsynced, so a reader never sees half a file and a power
loss cannot leave a manifest pointing at data that is not on disk.

A shard file holds the live rows of one server (keys, vectors, optimizer state, counts), the
word strings, and a JSON ``meta`` entry (shape, optimizer, key range, the server's counters
and its batch ledger). Loading filters rows to the loading server's key range, so a
checkpoint written by N servers can be loaded by M.

Versions: the manifest's ``format`` (``FORMAT``) and each shard's ``meta.format`` (``SHARD_FORMAT``, also in
the manifest's entry for the file) are raised by any change that a reader of the previous version would
misread; the manifest and each shard also name the ``release`` that wrote them. A reader refuses a version newer
than it knows, with both versions and the writing release named (a shard without ``format`` is format 1).
Fields added without such a change are ignored by older readers. Which releases read which:
``docs/operations.md#compatibility``.

Why storage errors are not checkpoint errors: on a shared file system the directory can
hang (a FUSE mount whose master or chunkserver is gone), vanish (the mount died: ENOTCONN,
or the mount point is an empty local directory), turn read-only or fill up. A store given
``io_timeout`` runs every file-system call in a thread with that deadline and raises
``StorageUnavailable`` (an ``OSError``) when it is not done in time, so no caller hangs with
the mount. Any ``OSError`` that is not "this file is missing" propagates as such: a store
that cannot be read must never look like a store without checkpoints, or a rollback would
restore an empty model (``ids`` raises when the root is gone; ``verify`` raises instead of
calling the checkpoint partial). ``create=False`` stores never create the root, so a
vanished mount cannot be papered over by a fresh local directory.
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from online import __version__
from ps_bridge.structured_logging import log_event

if TYPE_CHECKING:   # imported lazily: the scheduler and the CLI need no numba
    from online.learner.embedding_shard import EmbeddingShard

log = logging.getLogger("livevec.checkpoint")

FORMAT = 1         # manifest.json's "format"
SHARD_FORMAT = 1   # server-N.npz's meta "format" (and the manifest entry's)
MANIFEST = "manifest.json"
_DIR_RE = re.compile(r"^ckpt-(\d{8,})$")
_SEP = b"\x00"

Offsets = dict[str, dict[str, int]]   # topic -> partition (as str, JSON keys) -> next offset to train


class CheckpointError(Exception):
    """A checkpoint cannot be used (missing, partial, corrupt or incompatible); the message says which and why."""


class StorageUnavailable(OSError):
    """The checkpoint directory cannot be used at all (gone, or a call on it did not finish in time)."""


_inside = threading.local()   # set in the thread of a bounded call: nested store calls run directly


# ----------------------------------------------------------------------------- atomic files

def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:   # some file systems refuse fsync on directories; the rename is still atomic
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, write) -> None:
    """``write(fileobj)`` into a temporary file next to ``path``, fsync, rename, fsync the directory."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


# ----------------------------------------------------------------------------- shard state

@dataclass
class ShardState:
    """An in-memory copy of what one server checkpoints (taken while training is paused)."""

    keys: np.ndarray            # uint64 [n]
    vectors: np.ndarray         # float32 [n, dim]
    accum: np.ndarray           # float32 [n, a] (a = dim, 1) or [0, dim] for SGD
    counts: np.ndarray          # int64 [n]
    word_keys: np.ndarray       # uint64 [m]
    words: list[str]
    meta: dict = field(default_factory=dict)
    count_keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))   # the cluster's word counts
    count_values: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.vectors.nbytes + self.accum.nbytes + self.counts.nbytes
                   + self.word_keys.nbytes + sum(len(w) + 1 for w in self.words)
                   + self.count_keys.nbytes + self.count_values.nbytes)


def snapshot_shard(shard: "EmbeddingShard", meta: dict | None = None) -> ShardState:
    """Copy the live rows of ``shard`` (callers make sure no push runs at the same time)."""
    st = shard.state()
    keys = st["keys"]
    named = np.fromiter((w is not None for w in st["words"]), dtype=bool, count=len(keys))
    accum = st["accum"] if st["accum"] is not None else np.zeros((0, shard.dim), np.float32)
    base = {"dim": shard.dim, "optimizer": shard.optimizer, "eta": shard.eta, "adagrad_init": shard.adagrad_init,
            "seed": shard.seed, "rows": int(len(keys)), "words": int(named.sum())}
    count_keys, count_values = st["word_counts"]
    return ShardState(keys, st["vectors"], accum, st["counts"], keys[named],
                      [w for w in st["words"] if w is not None], {**base, **(meta or {})}, count_keys, count_values)


def write_shard_file(path: Path, state: ShardState) -> dict:
    """Write ``state`` atomically; returns the manifest entry ``{"bytes", "sha256", "rows", "words", "format"}``."""
    blob = np.frombuffer(_SEP.join(w.encode("utf-8") for w in state.words), dtype=np.uint8)
    meta = np.frombuffer(json.dumps({**state.meta, "format": SHARD_FORMAT, "release": __version__},
                                    sort_keys=True).encode("utf-8"), dtype=np.uint8)

    def write(fh):
        np.savez(fh, keys=state.keys, vectors=state.vectors, accum=state.accum, counts=state.counts,
                 word_keys=state.word_keys, words=blob, meta=meta, count_keys=state.count_keys,
                 count_values=state.count_values)

    atomic_write(path, write)
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path), "rows": int(len(state.keys)),
            "words": len(state.words), "format": SHARD_FORMAT}


def newer_format(what: str, found, reads: int, written_by=None) -> str | None:
    """Why a ``found`` version of ``what`` cannot be read by this release, which reads up to ``reads``; None if it
    can. Names both versions, the release that wrote it when known, and what to do."""
    if isinstance(found, int) and not isinstance(found, bool) and 1 <= found <= reads:
        return None
    if not isinstance(found, int) or isinstance(found, bool) or found < 1:
        return f"{what} format {found!r} is not a format any livevec release writes (damaged?)"
    by = f", written by livevec {written_by}," if written_by else ""
    return (f"{what} format {found}{by} is newer than this release reads: livevec {__version__} reads {what} "
            f"format {reads}. Run the release that wrote it (or a later one), or restore a checkpoint this "
            "release wrote")


def read_shard_file(path: Path) -> ShardState:
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode("utf-8"))
            problem = newer_format("checkpoint shard", meta.get("format", 1), SHARD_FORMAT, meta.get("release"))
            if problem:
                raise CheckpointError(f"{path}: {problem}")
            blob = bytes(z["words"])
            word_keys = z["word_keys"].astype(np.uint64, copy=False)
            words = [w.decode("utf-8") for w in blob.split(_SEP)] if len(word_keys) else []
            state = ShardState(z["keys"].astype(np.uint64, copy=False), z["vectors"], z["accum"],
                               z["counts"].astype(np.int64, copy=False), word_keys, words, meta)
            if "count_keys" in z.files:   # absent in checkpoints written before the cluster's word counts
                state.count_keys = z["count_keys"].astype(np.uint64, copy=False)
                state.count_values = z["count_values"].astype(np.int64, copy=False)
    except (OSError, ValueError, KeyError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: unreadable shard file ({type(exc).__name__}: {exc})") from None
    n = len(state.keys)
    if state.vectors.shape[0] != n or state.counts.shape[0] != n or len(state.words) != len(state.word_keys) \
            or (state.accum.shape[0] not in (0, n)):
        raise CheckpointError(f"{path}: inconsistent array lengths")
    return state


def restore_shard(states: list[ShardState], *, dim: int, optimizer: str, eta: float | None, seed: int,
                  key_range: tuple[int, int] | None = None, adagrad_init: float = 1e-8, min_count: int = 5,
                  word_capacity: int = 1_000_000) -> "EmbeddingShard":
    """A new ``EmbeddingShard`` holding the rows of ``states`` that fall in ``key_range`` ([lo, hi)).
    The optimizer state is converted when the checkpoint was written with another AdaGrad variant."""
    from online.learner.embedding_shard import EmbeddingShard

    width = {"adagrad": dim, "rowadagrad": 1, "sgd": 0}[optimizer]
    parts = []
    counted: list[tuple[np.ndarray, np.ndarray]] = []
    for st in states:
        if st.meta.get("dim", dim) != dim or st.vectors.shape[1:] != (dim,):
            raise CheckpointError(f"checkpoint has dim {st.meta.get('dim')}, this server runs with dim {dim} "
                                  f"(LIVEVEC_DIM must match)")
        mask = np.ones(len(st.keys), dtype=bool)
        if key_range is not None:
            mask = (st.keys >= np.uint64(key_range[0])) & (st.keys < np.uint64(key_range[1]))
        keys = st.keys[mask]
        accum = np.full((len(keys), width), adagrad_init, np.float32)
        if width and st.accum.shape[0]:
            acc = st.accum[mask]
            if acc.shape[1] == width:
                accum = acc
            elif width == 1:          # per-coordinate -> per-row: the mean of the squares
                accum = acc.mean(axis=1, keepdims=True)
            else:                     # per-row -> per-coordinate: broadcast
                accum = np.repeat(acc[:, :1], width, axis=1)
        names = dict(zip(st.word_keys.tolist(), st.words))
        parts.append((keys, st.vectors[mask], accum, st.counts[mask], [names.get(k) for k in keys.tolist()]))
        in_range = np.ones(len(st.count_keys), dtype=bool) if key_range is None else \
            (st.count_keys >= np.uint64(key_range[0])) & (st.count_keys < np.uint64(key_range[1]))
        counted.append((st.count_keys[in_range], st.count_values[in_range]))
    keys = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.uint64)
    order = np.argsort(keys)
    cat = (lambda i, empty: np.concatenate([p[i] for p in parts])[order] if parts else empty)
    words = [w for p in parts for w in p[4]]
    state = {"dim": dim, "optimizer": optimizer, "eta": eta, "adagrad_init": adagrad_init, "seed": seed,
             "version": 0, "keys": keys[order], "vectors": cat(1, np.zeros((0, dim), np.float32)),
             "accum": cat(2, np.zeros((0, max(width, 1)), np.float32)) if width else None,
             "counts": cat(3, np.zeros(0, np.int64)), "words": [words[i] for i in order.tolist()],
             "word_counts": (np.concatenate([c[0] for c in counted]), np.concatenate([c[1] for c in counted]))
             if counted else None}
    return EmbeddingShard.from_state(state, min_count=min_count, word_capacity=word_capacity)


# ----------------------------------------------------------------------------- manifests

@dataclass
class StoredCheckpoint:
    """A complete checkpoint in the store: its directory and its manifest (the shards it lists, the stream
    offsets it holds)."""

    id: int
    path: Path
    manifest: dict

    @property
    def offsets(self) -> Offsets:
        return self.manifest.get("offsets", {})

    @property
    def num_servers(self) -> int:
        return int(self.manifest["num_servers"])

    def shard_path(self, rank: int) -> Path:
        return self.path / f"server-{rank}.npz"

    @property
    def bytes(self) -> int:
        return sum(int(f["bytes"]) for f in self.manifest["files"].values())


def _manifest_digest(body: dict) -> str:
    rest = {k: v for k, v in body.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class CheckpointStore:
    """The checkpoint directory: ids, atomic manifests, verification, fallback, pruning.

    ``io_timeout`` (seconds, None = unbounded) bounds every call that touches the file system;
    ``create=False``: the root must exist (it is the shared mount's; see the module's docstring)."""

    MAX_STUCK = 3   # calls left hanging on the file system before new ones fail at once

    def __init__(self, root: str | os.PathLike, *, io_timeout: float | None = None, create: bool = True):
        self.root = Path(root)
        self.io_timeout = io_timeout
        self.create = create
        self._stuck: list[tuple[threading.Thread, str, float]] = []
        self._stuck_lock = threading.Lock()

    # -- every file-system call of the store goes through here
    def _bounded(self, what: str, fn, *args, **kwargs):
        if self.io_timeout is None or getattr(_inside, "active", False):
            return fn(*args, **kwargs)
        with self._stuck_lock:
            self._stuck = [s for s in self._stuck if s[0].is_alive()]
            if len(self._stuck) >= self.MAX_STUCK:
                _, first, since = self._stuck[0]
                raise StorageUnavailable(errno.ETIMEDOUT, f"{self.root}: {len(self._stuck)} earlier calls still hang "
                                                          f"(the first, {first}, for {time.monotonic() - since:.0f} s)")
        box: dict = {}

        def run() -> None:
            _inside.active = True
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as exc:   # handed to the caller
                box["error"] = exc

        thread = threading.Thread(target=run, name=f"ckpt-io-{what}", daemon=True)
        started = time.monotonic()
        thread.start()
        thread.join(self.io_timeout)
        if thread.is_alive():
            with self._stuck_lock:
                self._stuck.append((thread, what, started))
            raise StorageUnavailable(errno.ETIMEDOUT, f"{what} on {self.root} did not finish in {self.io_timeout:g} s "
                                                      f"(LIVEVEC_CHECKPOINT_IO_TIMEOUT): the file system hangs")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def ensure(self) -> None:
        self._bounded("mkdir", self.root.mkdir, parents=True, exist_ok=True)

    def path_of(self, ckpt_id: int) -> Path:
        return self.root / f"ckpt-{ckpt_id:08d}"

    def probe(self) -> None:
        """Write, fsync, read back and remove a small file: raises ``OSError`` unless the directory
        takes writes now (what a checkpoint is about to need, checked before training pauses)."""
        def probe() -> None:
            self._root_must_exist()
            path = self.root / f".probe-{os.getpid()}-{threading.get_ident()}"
            data = str(time.time_ns()).encode()
            try:
                with open(path, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                if path.read_bytes() != data:
                    raise StorageUnavailable(errno.EIO, f"{path}: read back other bytes than written")
            finally:
                path.unlink(missing_ok=True)
        self._bounded("probe", probe)

    def _root_must_exist(self) -> None:
        if not self.create and not self.root.is_dir():
            # os.stat, not is_dir(), says why (ENOTCONN for a dead FUSE mount)
            try:
                os.stat(self.root)
            except OSError as exc:
                raise StorageUnavailable(exc.errno or errno.ENOENT, f"{self.root}: {exc.strerror} "
                                         f"(the shared file system is not mounted?)") from None
            raise StorageUnavailable(errno.ENOTDIR, f"{self.root} is not a directory")

    def ids(self) -> list[int]:
        """Ids of every checkpoint directory, complete or not, ascending. Raises ``OSError`` when the
        directory cannot be listed (a ``create=True`` store without a root has no checkpoints)."""
        return self._bounded("list", self._ids)

    def _ids(self) -> list[int]:
        if self.create and not self.root.exists():
            return []
        self._root_must_exist()
        out = []
        with os.scandir(self.root) as entries:
            for entry in entries:
                m = _DIR_RE.match(entry.name)
                if m and entry.is_dir():
                    out.append(int(m.group(1)))
        return sorted(out)

    def next_id(self) -> int:
        ids = self.ids()
        return (ids[-1] + 1) if ids else 1

    def prepare(self, ckpt_id: int) -> Path:
        def prepare() -> Path:
            self._root_must_exist()
            path = self.path_of(ckpt_id)
            path.mkdir(parents=self.create, exist_ok=True)
            fsync_dir(self.root)
            return path
        return self._bounded("mkdir", prepare)

    def discard(self, ckpt_id: int) -> bool:
        """Remove what a checkpoint that failed left behind (never one with a manifest); False if it
        could not (the directory stays without a manifest: skipped by readers, pruned later)."""
        path = self.path_of(ckpt_id)

        def discard() -> bool:
            if (path / MANIFEST).exists():
                return False
            shutil.rmtree(path)
            return True
        try:
            return self._bounded("rmtree", discard)
        except FileNotFoundError:
            return True
        except OSError:
            return False

    def write_shard(self, ckpt_id: int, rank: int, state: "ShardState") -> tuple[Path, dict]:
        """One server's shard file of checkpoint ``ckpt_id`` (its directory made if needed), bounded."""
        def write() -> tuple[Path, dict]:
            path = self.prepare(ckpt_id) / f"server-{rank}.npz"
            return path, write_shard_file(path, state)
        return self._bounded("write shard", write)

    def read_shard(self, ckpt: StoredCheckpoint, rank: int) -> "ShardState":
        return self._bounded("read shard", read_shard_file, ckpt.shard_path(rank))

    def write_manifest(self, ckpt_id: int, manifest: dict) -> StoredCheckpoint:
        body = {"format": FORMAT, "release": __version__, "id": ckpt_id, **manifest}
        body["sha256"] = _manifest_digest(body)
        path = self.path_of(ckpt_id)
        data = json.dumps(body, indent=1, sort_keys=True).encode("utf-8")
        self._bounded("write manifest", atomic_write, path / MANIFEST, lambda fh: fh.write(data))
        return StoredCheckpoint(ckpt_id, path, body)

    def verify(self, ckpt_id: int, check_data: bool = True) -> StoredCheckpoint:
        """The checkpoint if it is complete and intact; else ``CheckpointError`` saying why. A file system
        that cannot be read raises ``OSError`` instead: that says nothing about the checkpoint."""
        return self._bounded("verify", self._verify, ckpt_id, check_data)

    def _verify(self, ckpt_id: int, check_data: bool) -> StoredCheckpoint:
        path = self.path_of(ckpt_id)
        mpath = path / MANIFEST
        self._root_must_exist()
        try:
            raw = mpath.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            raise CheckpointError(f"{path.name}: no manifest (partial checkpoint: a writer stopped before the end)") \
                from None
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise CheckpointError(f"{path.name}: unreadable manifest ({exc})") from None
        if not isinstance(body, dict):
            raise CheckpointError(f"{path.name}: unreadable manifest (not an object)")
        # the version first: a later format may compute its checksum otherwise
        problem = newer_format("checkpoint manifest", body.get("format"), FORMAT, body.get("release"))
        if problem:
            raise CheckpointError(f"{path.name}: {problem}")
        if body.get("sha256") != _manifest_digest(body):
            raise CheckpointError(f"{path.name}: manifest checksum mismatch (corrupt manifest)")
        if body.get("id") != ckpt_id:
            raise CheckpointError(f"{path.name}: manifest id {body.get('id')} unexpected")
        files = body.get("files") or {}
        for name, entry in files.items():
            problem = newer_format("checkpoint shard", entry.get("format", 1), SHARD_FORMAT, body.get("release"))
            if problem:
                raise CheckpointError(f"{path.name}: {name}: {problem}")
        if len(files) != int(body.get("num_servers", -1)):
            raise CheckpointError(f"{path.name}: manifest lists {len(files)} files for {body.get('num_servers')} servers")
        for name, entry in files.items():
            fpath = path / name
            try:
                size = fpath.stat().st_size
            except FileNotFoundError:
                raise CheckpointError(f"{path.name}: {name} is missing") from None
            if size != int(entry["bytes"]):
                raise CheckpointError(f"{path.name}: {name} has {size} bytes, manifest says {entry['bytes']}")
            if check_data:
                digest = sha256_file(fpath)
                if digest != entry["sha256"]:
                    raise CheckpointError(f"{path.name}: {name} checksum mismatch (corrupt data)")
        return StoredCheckpoint(ckpt_id, path, body)

    def latest_complete(self, check_data: bool = True, before: int | None = None) -> StoredCheckpoint | None:
        """The newest complete checkpoint; damaged or partial ones are skipped with a WARNING naming why.
        ``OSError`` when the file system cannot be read (never None for a store it cannot see)."""
        return self._bounded("find latest", self._latest_complete, check_data, before)

    def _latest_complete(self, check_data: bool, before: int | None) -> StoredCheckpoint | None:
        for ckpt_id in reversed(self.ids()):
            if before is not None and ckpt_id >= before:
                continue
            try:
                return self.verify(ckpt_id, check_data)
            except CheckpointError as exc:
                log_event(log, "checkpoint_skipped", logging.WARNING, id=ckpt_id, reason=str(exc),
                          action="falling back to the previous checkpoint")
        return None

    def prune(self, keep: int) -> list[int]:
        """Delete all but the newest ``keep`` complete checkpoints (and anything older than them)."""
        return self._bounded("prune", self._prune, keep)

    def _prune(self, keep: int) -> list[int]:
        complete = []
        for ckpt_id in reversed(self.ids()):
            if (self.path_of(ckpt_id) / MANIFEST).is_file():
                complete.append(ckpt_id)
            if len(complete) >= keep:
                break
        if len(complete) < keep:
            return []
        oldest_kept = complete[-1]
        removed = []
        for ckpt_id in self.ids():
            if ckpt_id < oldest_kept:
                shutil.rmtree(self.path_of(ckpt_id), ignore_errors=True)
                removed.append(ckpt_id)
        return removed

    # -- on-demand requests (``livevec checkpoint now``): files, so they work on a shared file system
    @property
    def requests_dir(self) -> Path:
        return self.root / "requests"

    def add_request(self, reason: str = "cli") -> Path:
        return self._bounded("add request", self._add_request, reason)

    def _add_request(self, reason: str) -> Path:
        self.requests_dir.mkdir(parents=True, exist_ok=True)
        path = self.requests_dir / f"{time.time_ns()}-{os.getpid()}.json"
        data = json.dumps({"reason": reason, "time": time.time()}).encode()
        atomic_write(path, lambda fh: fh.write(data))
        return path

    def pending_requests(self) -> list[Path]:
        def pending() -> list[Path]:
            if not self.requests_dir.is_dir():
                return []
            return sorted(p for p in self.requests_dir.glob("*.json") if not p.name.endswith(".done.json"))
        return self._bounded("list requests", pending)

    def take_request(self, path: Path) -> Path:
        taken = path.with_suffix(".taken")
        self._bounded("take request", path.rename, taken)
        return taken

    def answer_request(self, path: Path, answer: dict) -> None:
        data = json.dumps(answer).encode()

        def answer_() -> None:
            atomic_write(path.with_name(path.name[:-5] + ".done.json"), lambda fh: fh.write(data))
            path.unlink(missing_ok=True)
        self._bounded("answer request", answer_)


def offsets_to_json(offsets: dict[tuple[str, int], int]) -> Offsets:
    out: Offsets = {}
    for (topic, partition), off in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(off)
    return out


def offsets_from_json(offsets: Offsets) -> dict[tuple[str, int], int]:
    return {(topic, int(p)): int(off) for topic, parts in (offsets or {}).items() for p, off in parts.items()}
