"""Where each array of a host replica's segment file lies (``online.cluster.host_replica``), and the layout's version.

Standard library only: the deployment renderer sizes the workers' memory from the file's size,
and must not import numpy or numba to do so.

``LAYOUT`` is what every process attached to one segment must agree on: the arrays below, the header's slots,
and what ``ReplicaShard`` and ``SharedReplicaShard`` keep in them. Any change to one of these raises it. It is
written in the header and in the segment's file name (``host_replica.segment_path``), so during a rolling
upgrade the workers of two layouts on one host each make and train a segment of their own, and a segment of
another layout under this layout's name is refused at start, before the worker joins anything.
Layouts: 1 (before per-member counters), 2 (livevec 0.1.0; its file name carries no layout), 3 (the name
carries the layout; the header names the release that made the segment).
"""
from __future__ import annotations

LAYOUT = 3
PAGE = 4096   # the header's size, and every array's alignment
MAGIC = 0x6C69766576656331    # "livevec1"
# Header slots (int64). H_RELEASE: the release that made the segment (``segment_check.release_number``), for
# messages only.
(H_MAGIC, H_LAYOUT, H_DIM, H_ROWS, H_SLOTS, H_ACCUM, H_SEED, H_OPT, H_VERSION, H_NEXT_ROW, H_SYNCED, H_REFRESH,
 H_SIZE, H_GROUP, H_LAST_SYNC, H_RELEASE) = range(16)
MAX_MEMBERS = 64
# Per member process (its slot): batches finished, batches an acknowledged sync carried, syncs held, batches
# whose word counts the servers acknowledged.
H_FINISHED, H_COVERED, H_HELD, H_COUNTED = (64 + i * MAX_MEMBERS for i in range(4))
_ITEMSIZE = {"float32": 4, "bool": 1, "uint64": 8, "int64": 8}


def segment_layout(dim: int, rows: int, accum_width: int) -> tuple[dict[str, tuple[int, tuple[int, ...], str]], int, int]:
    """(array name -> (offset, shape, dtype name), key-table slots, total bytes). Per row: the vectors and their
    base copies, the accumulators and their base, the contraction since the last collect, a confirmed flag, the key, two version stamps and a count; then
    the key table, four slots per row (a power of two: the index is never rehashed and stays at most half full)."""
    slots = 1 << (max(4 * rows, 16) - 1).bit_length()
    specs = [("vectors", (rows, dim), "float32"), ("base", (rows, dim), "float32"),
             ("accum", (rows if accum_width else 0, max(accum_width, 1)), "float32"),
             ("base_acc", (rows, 1), "float32"), ("contraction", (rows,), "float32"), ("confirmed", (rows,), "bool"),
             ("row_keys", (rows,), "uint64"), ("row_version", (rows,), "int64"), ("row_born", (rows,), "int64"),
             ("counts", (rows,), "int64"), ("tkeys", (slots,), "uint64"), ("tvals", (slots,), "int64")]
    at, out = PAGE, {}
    for name, shape, dtype in specs:
        out[name] = (at, shape, dtype)
        count = 1
        for n in shape:
            count *= n
        at += -(-count * _ITEMSIZE[dtype] // PAGE) * PAGE
    return out, slots, at
