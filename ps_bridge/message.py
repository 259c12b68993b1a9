"""ps-lite's in-memory message model (``include/ps/internal/message.h``) and the rules
that map it to and from PBMeta (``Van::PackMeta`` / ``Van::UnpackMeta``, master).

Everything above the Van speaks :class:`Message`; only :func:`pack_meta` and
:func:`unpack_meta` know which proto fields ps-lite sets (pslite-protocol.md §2.2-2.3).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from ps_bridge.meta import PBControl, PBMeta, PBNode, decode_meta, encode_meta

K_EMPTY = 2**31 - 1  # ps-lite's Meta::kEmpty / Node::kEmpty (INT32_MAX)

SCHEDULER_ID = 1
SERVER_GROUP = 2
WORKER_GROUP = 4
ALL_GROUP = 7  # scheduler + servers + workers


class Role(IntEnum):
    SERVER = 0
    WORKER = 1
    SCHEDULER = 2


class Cmd(IntEnum):
    EMPTY = 0
    TERMINATE = 1
    ADD_NODE = 2
    BARRIER = 3
    ACK = 4
    HEARTBEAT = 5
    # extension (NodeSettings.elastic_workers): a worker tells the scheduler it leaves the
    # running cluster for good. C++ ps-lite never sends it and logs+drops it if received.
    LEAVE = 100


class DataType(IntEnum):
    CHAR = 0
    INT8 = 1
    INT16 = 2
    INT32 = 3
    INT64 = 4
    UINT8 = 5
    UINT16 = 6
    UINT32 = 7
    UINT64 = 8
    FLOAT = 9
    DOUBLE = 10
    OTHER = 11


def server_rank_to_id(rank: int) -> int:
    return 8 + 2 * rank


def worker_rank_to_id(rank: int) -> int:
    return 9 + 2 * rank


def id_to_rank(node_id: int) -> int:
    return max((node_id - 8) // 2, 0)


@dataclass(slots=True)
class Node:
    role: int
    id: int = K_EMPTY
    hostname: str = ""
    port: int = 0
    is_recovery: bool = False
    customer_id: int = 0
    public_key: str = ""  # CurveZMQ (ps_bridge.curve): secured clusters only

    def __str__(self) -> str:
        role = Role(self.role).name.lower() if self.role in (0, 1, 2) else f"role{self.role}"
        ident = "?" if self.id == K_EMPTY else self.id
        return f"{role}[{ident}]@{self.hostname}:{self.port}" + (" (recovery)" if self.is_recovery else "")


@dataclass(slots=True, frozen=True)
class Control:
    """Frozen, so that every data message can share :data:`NO_CONTROL` instead of
    allocating an empty Control (and its node list) per message."""

    cmd: int = Cmd.EMPTY
    node: list[Node] = field(default_factory=list)
    barrier_group: int = 0
    msg_sig: int = 0

    def empty(self) -> bool:
        return self.cmd == 0


NO_CONTROL = Control()  # the control of every data message (cmd EMPTY)


@dataclass(slots=True)
class Meta:
    head: int = K_EMPTY
    app_id: int = K_EMPTY
    customer_id: int = 0
    timestamp: int = K_EMPTY
    sender: int = K_EMPTY
    recver: int = K_EMPTY
    request: bool = False
    push: bool = False
    pull: bool = False
    simple_app: bool = False
    priority: int = 0
    body: bytes = b""
    data_type: list[int] = field(default_factory=list)
    control: Control = NO_CONTROL
    data_size: int = 0


@dataclass(slots=True)
class Message:
    """A meta plus raw data frames (buffers: numpy arrays, bytes or memoryviews)."""

    meta: Meta
    data: list = field(default_factory=list)


@dataclass(slots=True)
class KVPairs:
    """Keys (uint64, sorted, unique), their values (float32) and optional per-key lengths (int32).

    Without ``lens`` every key owns ``len(vals) // len(keys)`` consecutive values.
    """

    keys: np.ndarray
    vals: np.ndarray
    lens: np.ndarray | None = None


def meta_to_pb(meta: Meta) -> PBMeta:
    pb = PBMeta(head=meta.head, request=meta.request, push=meta.push, simple_app=meta.simple_app,
                customer_id=meta.customer_id, pull=meta.pull, priority=meta.priority)
    if meta.app_id != K_EMPTY:
        pb.app_id = meta.app_id
    if meta.timestamp != K_EMPTY:
        pb.timestamp = meta.timestamp
    if meta.body:
        pb.body = bytes(meta.body)
    if meta.data_type:
        pb.data_type = [int(t) for t in meta.data_type]
    ctrl = meta.control
    if ctrl.cmd != Cmd.EMPTY:
        pbc = PBControl(cmd=int(ctrl.cmd))
        if ctrl.cmd == Cmd.BARRIER:
            pbc.barrier_group = ctrl.barrier_group
        elif ctrl.cmd == Cmd.ACK:
            pbc.msg_sig = ctrl.msg_sig
        pbc.node = [PBNode(role=int(n.role), id=n.id, hostname=n.hostname, port=n.port,
                           is_recovery=bool(n.is_recovery), customer_id=n.customer_id,
                           public_key=n.public_key or None) for n in ctrl.node]
        pb.control = pbc
    return pb


def pb_to_meta(pb: PBMeta) -> Meta:
    meta = Meta(
        head=0 if pb.head is None else pb.head,
        app_id=K_EMPTY if pb.app_id is None else pb.app_id,
        timestamp=K_EMPTY if pb.timestamp is None else pb.timestamp,
        customer_id=pb.customer_id or 0,
        request=bool(pb.request), push=bool(pb.push), pull=bool(pb.pull),
        simple_app=bool(pb.simple_app), priority=pb.priority or 0,
        body=pb.body or b"", data_type=pb.data_type, data_size=pb.data_size or 0,
    )
    if pb.control is not None:
        c = pb.control
        meta.control = Control(
            cmd=c.cmd, barrier_group=c.barrier_group or 0, msg_sig=c.msg_sig or 0,
            node=[Node(role=n.role, id=K_EMPTY if n.id is None else n.id, hostname=n.hostname or "",
                       port=n.port or 0, is_recovery=bool(n.is_recovery), customer_id=n.customer_id or 0,
                       public_key=n.public_key or "")
                  for n in c.node])
    return meta


# Data metas skip the PBMeta detour (same bytes both ways; the tests check it on captures and
# fuzz). Consecutive data metas differ only in their timestamp (field 8), so the byte runs
# before and after it are cached (bounded; filled only by the field-by-field code): packing is
# prefix + varint(ts) + suffix, unpacking looks both runs up (about 3x faster than the loop).

_SMALL = [bytes((i,)) for i in range(128)]
_RUN_CACHE_LIMIT = 256


def _vb(value: int) -> bytes:
    """Varint of ``value`` (negative int32s are sign-extended to 10 bytes, as protobuf does)."""
    if 0 <= value < 0x80:
        return _SMALL[value]
    if 0 < value < 0x4000:  # request timestamps, for most of a run: unrolled
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    if 0 < value < 0x200000:
        return bytes(((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80, value >> 14))
    out = bytearray()
    value &= (1 << 64) - 1
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _data_runs(meta: Meta) -> tuple[bytes, bytes]:
    """Van::PackMeta of a data message as (the bytes before the timestamp's varint, the bytes
    after it); the first run ends with the timestamp tag when the timestamp is set."""
    parts = [b"\x08", _vb(meta.head)]
    body = meta.body
    if body:
        parts += (b"\x12", _vb(len(body)), bytes(body))
    parts.append(b"\x20\x01" if meta.request else b"\x20\x00")
    parts.append(b"\x28\x01" if meta.push else b"\x28\x00")
    parts.append(b"\x30\x01" if meta.simple_app else b"\x30\x00")
    if meta.app_id != K_EMPTY:
        parts += (b"\x38", _vb(meta.app_id))
    if meta.timestamp != K_EMPTY:
        parts.append(b"\x40")
    prefix = b"".join(parts)
    parts = []
    if meta.data_type:
        inner = b"".join(_vb(int(t)) for t in meta.data_type)
        parts += (b"\x4a", _vb(len(inner)), inner)
    parts += (b"\x50", _vb(meta.customer_id), b"\x60\x01" if meta.pull else b"\x60\x00",
              b"\x68", _vb(meta.priority))
    return prefix, b"".join(parts)


# (head, request, push, simple_app, app_id, customer_id, pull, priority, *data_type) -> runs
_PACK_RUNS: dict[tuple, tuple[bytes, bytes]] = {}


def pack_meta(meta: Meta) -> bytes:
    """Van::PackMeta: serialise ``meta`` exactly as C++ ps-lite (master) does."""
    if meta.control.cmd != 0:
        return encode_meta(meta_to_pb(meta))
    ts = meta.timestamp
    if ts == K_EMPTY or meta.body:  # rare for data messages; bodies vary too much to cache
        prefix, suffix = _data_runs(meta)
        return prefix + suffix if ts == K_EMPTY else b"".join((prefix, _vb(ts), suffix))
    key = (meta.head, meta.request, meta.push, meta.simple_app, meta.app_id, meta.customer_id,
           meta.pull, meta.priority, *meta.data_type)
    runs = _PACK_RUNS.get(key)
    if runs is None:
        runs = _data_runs(meta)
        if len(_PACK_RUNS) < _RUN_CACHE_LIMIT:
            _PACK_RUNS[key] = runs
    return runs[0] + _vb(ts) + runs[1]


def _i32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


# exact bytes up to the timestamp tag -> (head, request, push, simple_app, app_id)
_PREFIX_RUNS: dict[bytes, tuple[int, bool, bool, bool, int]] = {}
# exact bytes after the timestamp varint -> (data_type, customer_id, pull, priority)
_SUFFIX_RUNS: dict[bytes, tuple[tuple[int, ...], int, bool, int]] = {}


def unpack_meta(data) -> Meta:
    """Van::UnpackMeta. Raises :class:`ps_bridge.meta.MalformedMeta` for bytes that are not a PBMeta."""
    if type(data) is bytes:
        # The first 0x40 byte is the timestamp tag if the bytes before it are a known prefix run:
        # those runs were cut at their first 0x40 (see _learn_runs), and parsing is deterministic.
        cut = data.find(b"\x40") + 1
        prefix = _PREFIX_RUNS.get(data[:cut]) if cut else None
        if prefix is not None:
            # the timestamp: up to 5 varint bytes for 0 <= ts < 2^31 (anything else: field loop)
            b = data[cut] if cut < len(data) else 0x80
            ts = b & 0x7F
            pos = cut + 1
            shift = 7
            while b & 0x80 and shift < 35 and pos < len(data):
                b = data[pos]
                ts |= (b & 0x7F) << shift
                pos += 1
                shift += 7
            if not b & 0x80 and ts < 0x80000000:
                suffix = _SUFFIX_RUNS.get(data[pos:])
                if suffix is not None:
                    head, request, push, simple_app, app_id = prefix
                    data_type, customer_id, pull, priority = suffix
                    return Meta(head, app_id, customer_id, ts, K_EMPTY, K_EMPTY, request, push, pull,
                                simple_app, priority, b"", list(data_type), NO_CONTROL, 0)
        meta = _unpack_fields(data)
        if (meta.timestamp != K_EMPTY and meta.control is NO_CONTROL and not meta.body
                and len(_SUFFIX_RUNS) < _RUN_CACHE_LIMIT and len(_PREFIX_RUNS) < _RUN_CACHE_LIMIT):
            _learn_runs(meta, data)
        return meta
    return _unpack_fields(data)


def _learn_runs(meta: Meta, data: bytes) -> None:
    """Remember the two runs around the timestamp of ``data`` if ``data`` is exactly what
    pack_meta makes of ``meta`` (so each run holds just its own fields) and its first 0x40
    byte is the timestamp tag."""
    prefix, suffix = _data_runs(meta)
    if len(prefix) == data.find(b"\x40") + 1 and data == b"".join((prefix, _vb(meta.timestamp), suffix)):
        _PREFIX_RUNS[prefix] = (meta.head, meta.request, meta.push, meta.simple_app, meta.app_id)
        _SUFFIX_RUNS[suffix] = (tuple(meta.data_type), meta.customer_id, meta.pull, meta.priority)


def _unpack_fields(data) -> Meta:
    """unpack_meta's field-by-field loop, for common data metas; anything else goes to the
    general decoder (which raises MalformedMeta)."""
    buf = data
    end = len(buf)
    pos = 0
    head = 0
    app_id = timestamp = K_EMPTY
    customer_id = priority = 0
    request = push = pull = simple_app = False
    data_type: list[int] = []
    try:
        while pos < end:
            tag = buf[pos]
            b = buf[pos + 1]
            pos += 2
            if tag == 0x4A:  # packed data_type with a one-byte length and one-byte values
                stop = pos + b
                if b >= 0x80 or stop > end:
                    return pb_to_meta(decode_meta(data))
                for t in buf[pos:stop]:
                    if t >= 0x80:
                        return pb_to_meta(decode_meta(data))
                    data_type.append(t)
                pos = stop
                continue
            if b < 0x80:
                v = b
            else:
                v = 0
                shift = 0
                pos -= 1
                while True:
                    b = buf[pos]
                    pos += 1
                    v |= (b & 0x7F) << shift
                    if b < 0x80:
                        break
                    shift += 7
                    if shift >= 70:
                        return pb_to_meta(decode_meta(data))
            if tag == 0x40:
                timestamp = _i32(v)
            elif tag == 0x20:
                request = v != 0
            elif tag == 0x28:
                push = v != 0
            elif tag == 0x60:
                pull = v != 0
            elif tag == 0x08:
                head = _i32(v)
            elif tag == 0x38:
                app_id = _i32(v)
            elif tag == 0x50:
                customer_id = _i32(v)
            elif tag == 0x30:
                simple_app = v != 0
            elif tag == 0x68:
                priority = _i32(v)
            else:  # body, control, data_size, unknown fields: the general decoder
                return pb_to_meta(decode_meta(data))
    except IndexError:
        return pb_to_meta(decode_meta(data))  # truncated: raises MalformedMeta
    if pos != end:
        return pb_to_meta(decode_meta(data))
    return Meta(head, app_id, customer_id, timestamp, K_EMPTY, K_EMPTY, request, push, pull, simple_app,
                priority, b"", data_type, NO_CONTROL, 0)
