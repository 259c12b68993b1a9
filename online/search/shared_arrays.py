"""The model's large arrays in memory another process can map: one copy for several searchers.

A second front-end process that loads its own model costs a second model (4 GB of float32 rows at
10M x 100, 2.5 GB more of codes and maps). With ``enable()``, the arrays the search reads (the pool
of unit rows, the int8 codes, the per-row and per-slot maps: ``row_store``) are allocated here
instead of by numpy: each is an anonymous ``memfd`` mapped ``MAP_SHARED``. Untouched pages still
cost nothing (as with ``np.zeros``), and a killed front end leaves nothing behind (no name in
``/dev/shm``: the kernel frees the pages with the last mapping).

Another process maps a block by opening ``/proc/<pid>/fd/<fd>`` of the owner while the owner holds
it open (``search_processes``: the owner keeps the snapshot alive for the whole call, so the
block and its fd are too), and ``describe`` / ``attach`` carry an array view across as (block,
offset, shape, strides, dtype). Arrays not allocated here (the inverted file's small lists) travel
by value. The owner's blocks die with their last view (numpy's base chain holds the mapping);
``forgotten()`` lists them so that the other processes unmap theirs too.
"""
from __future__ import annotations

import itertools
import mmap
import os
import threading
import weakref
from dataclasses import dataclass

import numpy as np

_enabled = False
_lock = threading.Lock()
_ids = itertools.count(1)
_blocks: dict[int, "Block"] = {}          # id(mmap) -> its block, while the mapping lives
_gone: list[int] = []                     # block ids whose mappings died since the last forgotten()
_stats = {"blocks": 0, "bytes": 0}


@dataclass(frozen=True)
class Block:
    ident: int
    fd: int
    size: int
    address: int


def enable() -> None:
    """From now on ``zeros``/``empty`` allocate shareable blocks (call before the model loads)."""
    global _enabled
    _enabled = True


def enabled() -> bool:
    return _enabled


def _allocate(nbytes: int) -> mmap.mmap:
    size = max(int(nbytes), 1)
    fd = os.memfd_create("livevec-model", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise
    address = np.frombuffer(mm, np.uint8, 1).__array_interface__["data"][0]
    block = Block(next(_ids), fd, size, address)
    with _lock:
        _blocks[id(mm)] = block
        _stats["blocks"] += 1
        _stats["bytes"] += size
    weakref.finalize(mm, _release, id(mm), block)
    return mm


def _release(key: int, block: Block) -> None:
    with _lock:
        if _blocks.get(key) is block:
            del _blocks[key]
        _gone.append(block.ident)
        _stats["blocks"] -= 1
        _stats["bytes"] -= block.size
    os.close(block.fd)


def empty(shape, dtype) -> np.ndarray:
    """``np.empty``, in a shareable block when enabled (its pages read zero until written)."""
    if not _enabled:
        return np.empty(shape, dtype)
    dtype = np.dtype(dtype)
    shape = tuple(np.atleast_1d(np.asarray(shape, dtype=np.int64)).tolist())
    mm = _allocate(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
    return np.ndarray(shape, dtype, buffer=mm)     # a view of it has this array as its base


def zeros(shape, dtype) -> np.ndarray:
    """``np.zeros``: a fresh block reads zero, and its pages cost memory only once written."""
    return empty(shape, dtype) if _enabled else np.zeros(shape, dtype)


def block_of(a: np.ndarray) -> Block | None:
    """The shareable block under ``a``, or None (numpy memory)."""
    base = a
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    if not isinstance(base, mmap.mmap):
        return None
    with _lock:
        return _blocks.get(id(base))


def describe(a: np.ndarray) -> tuple | None:
    """How another process finds ``a``: (block id, fd, block size, byte offset, shape, strides, dtype), or
    None when ``a`` is not in a shareable block."""
    block = block_of(a)
    if block is None:
        return None
    offset = a.__array_interface__["data"][0] - block.address
    return block.ident, block.fd, block.size, offset, a.shape, a.strides, a.dtype.str


def forgotten() -> list[int]:
    """Blocks whose last view died since the previous call (the owner's side)."""
    with _lock:
        out = list(_gone)
        _gone.clear()
    return out


def report() -> dict:
    """Live shareable blocks and their bytes (capacities; untouched pages cost nothing)."""
    with _lock:
        return {"enabled": _enabled, **_stats}


class Attached:
    """The other side: blocks of one owner process mapped read-only, by id."""

    def __init__(self, owner_pid: int):
        self.owner_pid = owner_pid
        self._maps: dict[int, mmap.mmap] = {}

    def array(self, desc: tuple) -> np.ndarray:
        ident, fd, size, offset, shape, strides, dtype = desc
        mm = self._maps.get(ident)
        if mm is None:
            # the owner holds the block open for the whole call, so this fd is that block
            with open(f"/proc/{self.owner_pid}/fd/{fd}", "rb") as f:
                mm = mmap.mmap(f.fileno(), size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            self._maps[ident] = mm
        dtype = np.dtype(dtype)
        count = (max(size - offset, 0)) // dtype.itemsize
        flat = np.frombuffer(mm, dtype, count, offset)
        return np.lib.stride_tricks.as_strided(flat, shape=tuple(shape), strides=tuple(strides), writeable=False)

    def forget(self, idents) -> None:
        for ident in idents:
            mm = self._maps.pop(ident, None)
            if mm is not None:
                try:
                    mm.close()
                except BufferError:          # a view is still exported; dropped with it
                    pass

    def __len__(self) -> int:
        return len(self._maps)
