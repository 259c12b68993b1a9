"""The packed layouts of the replica exchange: int8 deltas out, and rows back in float16 (``CMD_DELTA_PACKED``,
exchange version 2) or in int8 (``CMD_DELTA_PACKED_I8``, version 3).

ps-lite's KV frames carry float32 values; a packed row is bytes laid in float32 words, so it crosses the Van
unchanged (the values are never read as floats on the way) and a stock ps-lite node never sees the command.

* **Out** (worker -> server), per key, ``packed_width(dim, contraction)`` words: the row's scale (float32), the
  accumulator's increment (float32), the contraction (float32, when the kernel tracks it), then ``dim`` int8
  codes padded to a whole word. The delta is ``codes * scale`` with ``scale = max |delta| / 127``.
  **Error feedback**: the replica's base moves by the decoded delta, not by the row's change, so what the
  rounding dropped stays in ``row - base`` and goes with the row's next delta (nothing trained is lost).
* **Back** (server -> worker), per key, ``answer_width(dim, rows_back)`` words: the row's accumulator (float32),
  then its values, as ``dim`` float16 values padded to a whole word (``F16``), or as a scale (float32,
  ``max |value| / 127``) and ``dim`` int8 codes padded to a whole word (``I8``). The replica takes the row it
  decodes as its base: the servers keep float32, so the rounding never accumulates, and the replica's next delta
  is measured from what it received. A row this sender moved last before this delta (no other replica's delta
  reached it since) is what the replica already holds plus what it sent, so its answer is the accumulator alone:
  one word (ps-lite's ``lens`` give each key's length).

At dim 100 a row goes out in 108 bytes instead of 404 and comes back in 108 (int8) or 204 (float16) instead of
404, keys apart. The int8 rows learn as the float16 ones do (docs/design/0008-scalable-exchange.md).
Design: docs/design/0008-scalable-exchange.md
"""
from __future__ import annotations

import numpy as np
from numba import njit



def code_words(dim: int) -> int:
    """float32 words that hold ``dim`` int8 codes."""
    return -(-int(dim) // 4)


def packed_width(dim: int, contraction: bool) -> int:
    """float32 words per key of a packed delta."""
    return (3 if contraction else 2) + code_words(dim)


F16 = "f16"   # rows back as float16 values (``CMD_DELTA_PACKED``)
I8 = "i8"     # rows back as int8 codes and a scale (``CMD_DELTA_PACKED_I8``)


def answer_width(dim: int, rows_back: str = F16) -> int:
    """float32 words per key of a packed answer: the accumulator, then the values."""
    if rows_back == I8:
        return 2 + code_words(dim)
    return 1 + -(-int(dim) // 2)


@njit(nogil=True, cache=True)
def pack_deltas(deltas, base, rows, head, codes):
    """Pack the float32 deltas a collect took (``delta_rows.take_deltas``: [n, dim + 1 (+ 1)], which set each
    base to the row it read): ``head[i]`` = (scale, accumulator increment[, contraction]), ``codes[i]`` the int8
    codes of the delta; then ``base -= delta - codes * scale``, so the base moved by the decoded delta only and
    the rounding's remainder stays in ``row - base`` for the next collect (error feedback)."""
    dim = base.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        top = 0.0
        for d in range(dim):
            x = abs(deltas[i, d])
            if x > top:
                top = x
        scale = np.float32(top / 127.0) if top > 0.0 else np.float32(1.0)
        inv = 1.0 / scale
        for d in range(dim):
            q = round(deltas[i, d] * inv)
            codes[i, d] = q
            base[r, d] -= deltas[i, d] - np.float32(q) * scale
        head[i, 0] = scale
        head[i, 1] = deltas[i, dim]
        if head.shape[1] > 2:
            head[i, 2] = deltas[i, dim + 1]


def packed_buffer(n: int, dim: int, contraction: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(wire [n, width] float32, head [n, 2 or 3] float32 view, codes [n, dim] int8 view) over one buffer."""
    width = packed_width(dim, contraction)
    wire = np.zeros((n, width), dtype=np.float32)
    nhead = width - code_words(dim)
    head = wire[:, :nhead]
    codes = wire.view(np.int8)[:, 4 * nhead:4 * nhead + dim]
    return wire, head, codes


def unpack_deltas(vals: np.ndarray, n: int, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A packed request's float32 words as (deltas [n, dim] float32, accumulator increments [n], contraction or
    None). Raises ValueError when the length fits neither width."""
    vals = np.ascontiguousarray(vals, dtype=np.float32)
    for contraction in (False, True):
        width = packed_width(dim, contraction)
        if len(vals) == n * width:
            break
    else:
        raise ValueError(f"packed delta of {len(vals)} words for {n} keys of dim {dim} (expected "
                         f"{packed_width(dim, False)} or {packed_width(dim, True)} per key)")
    wire = vals.reshape(n, width)
    nhead = width - code_words(dim)
    codes = wire.view(np.int8)[:, 4 * nhead:4 * nhead + dim]
    scale = wire[:, 0:1]
    if n and not np.isfinite(scale).all():
        raise ValueError("packed delta with a scale that is not a finite number")
    deltas = codes.astype(np.float32) * scale
    return deltas, wire[:, 1].copy(), (wire[:, 2].copy() if contraction else None)


def _write_values(wire: np.ndarray, values: np.ndarray, dim: int, rows_back: str) -> None:
    """``values`` [n, dim] into the value words of answer rows ``wire`` [n, width] (word 0 is the accumulator)."""
    if rows_back == I8:
        top = np.abs(values).max(axis=1, initial=np.float32(0.0))
        scale = np.where(top > 0, top / np.float32(127.0), np.float32(1.0)).astype(np.float32)
        wire[:, 1] = scale
        wire.view(np.int8)[:, 8:8 + dim] = np.rint(values / scale[:, None])
    else:
        wire.view(np.float16)[:, 2:2 + dim] = values


def _read_values(wire: np.ndarray, dim: int, rows_back: str) -> np.ndarray:
    """The values [n, dim] float32 of answer rows ``wire`` [n, width]."""
    if rows_back == I8:
        scale = wire[:, 1:2]
        if len(wire) and not np.isfinite(scale).all():
            raise ValueError("packed answer with a scale that is not a finite number")
        return wire.view(np.int8)[:, 8:8 + dim].astype(np.float32) * scale
    return wire.view(np.float16)[:, 2:2 + dim].astype(np.float32)


def pack_answer(rows: np.ndarray, dim: int, rows_back: str = F16) -> np.ndarray:
    """The servers' merged rows [n, dim + 1] (values, accumulator) as packed answer words [n * answer_width]."""
    n = len(rows)
    wire = np.zeros((n, answer_width(dim, rows_back)), dtype=np.float32)
    wire[:, 0] = rows[:, dim]
    _write_values(wire, rows[:, :dim], dim, rows_back)
    return wire.reshape(-1)


def unpack_answer(vals: np.ndarray, n: int, dim: int, rows_back: str = F16) -> np.ndarray:
    """Packed answer words as merged rows [n, dim + 1] float32 (what ``ReplicaShard.apply`` takes)."""
    width = answer_width(dim, rows_back)
    vals = np.ascontiguousarray(vals, dtype=np.float32)
    if len(vals) != n * width:
        raise ValueError(f"packed answer of {len(vals)} words for {n} keys of dim {dim} (expected {width} per key)")
    wire = vals.reshape(n, width)
    out = np.empty((n, dim + 1), dtype=np.float32)
    out[:, :dim] = _read_values(wire, dim, rows_back)
    out[:, dim] = wire[:, 0]
    return out


def pack_answer_sparse(rows: np.ndarray, full: np.ndarray, dim: int,
                       rows_back: str = F16) -> tuple[np.ndarray, np.ndarray]:
    """Merged rows [n, dim + 1] as packed answer words and ps-lite lens: the rows ``full`` marks with their
    values, the others with their accumulator alone (the sender holds their value)."""
    n = len(rows)
    width = answer_width(dim, rows_back)
    lens = np.where(full, width, 1).astype(np.int32)
    wire = np.zeros((n, width), dtype=np.float32)
    wire[:, 0] = rows[:, dim]
    _write_values(wire, rows[:, :dim], dim, rows_back)
    if full.all():
        return wire.reshape(-1), lens
    keep = np.ones((n, width), dtype=bool)
    keep[~full, 1:] = False
    return wire[keep], lens


def unpack_answer_sparse(vals: np.ndarray, lens: np.ndarray | None, n: int, dim: int,
                         base: np.ndarray, rows_back: str = F16) -> np.ndarray:
    """Packed answer words (with ``lens``, or all full without) as merged rows [n, dim + 1]; a key answered with
    its accumulator alone gets ``base`` (the replica's base of that row, [n, dim]) as its value, which
    ``ReplicaShard.apply`` then leaves as it is."""
    if lens is None or not len(lens):
        return unpack_answer(vals, n, dim, rows_back)
    width = answer_width(dim, rows_back)
    vals = np.ascontiguousarray(vals, dtype=np.float32)
    lens = np.asarray(lens)
    if len(lens) != n or not np.isin(lens, (1, width)).all() or int(lens.sum()) != len(vals):
        raise ValueError(f"packed answer of {len(vals)} words and {len(lens)} lengths for {n} keys of dim {dim}")
    full = lens == width
    starts = np.concatenate([[0], np.cumsum(lens[:-1])]).astype(np.int64)
    out = np.empty((n, dim + 1), dtype=np.float32)
    out[:, dim] = vals[starts]
    out[~full, :dim] = base[~full]
    if full.any():
        idx = starts[full][:, None] + np.arange(width)[None, :]
        out[full, :dim] = _read_values(vals[idx], dim, rows_back)
    return out
