"""Where each array of a host replica's segment file lies (``online.cluster.host_replica``).

Standard library only: the deployment renderer sizes the workers' memory from the file's size,
and must not import numpy or numba to do so.
"""
from __future__ import annotations

PAGE = 4096   # the header's size, and every array's alignment
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
