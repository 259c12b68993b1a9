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

    @classmethod
    def parse(cls, text: str) -> "Role":
        return cls[text.strip().upper()]


class Cmd(IntEnum):
    EMPTY = 0
    TERMINATE = 1
    ADD_NODE = 2
    BARRIER = 3
    ACK = 4
    HEARTBEAT = 5
    # livevec extension (LIVEVEC_ELASTIC_WORKERS): a worker tells the scheduler it leaves the
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

    @property
    def address(self) -> tuple[str, int]:
        return self.hostname, self.port

    def __str__(self) -> str:
        role = Role(self.role).name.lower() if self.role in (0, 1, 2) else f"role{self.role}"
        ident = "?" if self.id == K_EMPTY else self.id
        return f"{role}[{ident}]@{self.hostname}:{self.port}" + (" (recovery)" if self.is_recovery else "")


@dataclass(slots=True)
class Control:
    cmd: int = Cmd.EMPTY
    node: list[Node] = field(default_factory=list)
    barrier_group: int = 0
    msg_sig: int = 0

    def empty(self) -> bool:
        return self.cmd == Cmd.EMPTY


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
    control: Control = field(default_factory=Control)
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


# ----------------------------------------------------------------------------- Meta <-> PBMeta

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
                           is_recovery=bool(n.is_recovery), customer_id=n.customer_id) for n in ctrl.node]
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
                       port=n.port or 0, is_recovery=bool(n.is_recovery), customer_id=n.customer_id or 0)
                  for n in c.node])
    return meta


# Data messages dominate traffic and their metas differ only in a few small ints, so they
# are packed directly (same bytes as meta_to_pb + encode_meta; the tests check both ways).
def pack_meta(meta: Meta) -> bytes:
    if meta.control.cmd != Cmd.EMPTY or meta.body or not (0 <= meta.head < 128) \
            or not (0 <= meta.app_id < 128) or not (0 <= meta.timestamp < 128) \
            or not (0 <= meta.customer_id < 128) or not (0 <= meta.priority < 128) \
            or len(meta.data_type) > 3:
        return encode_meta(meta_to_pb(meta))
    out = bytearray((0x08, meta.head, 0x20, meta.request, 0x28, meta.push, 0x30, meta.simple_app,
                     0x38, meta.app_id, 0x40, meta.timestamp))
    if meta.data_type:
        out += bytes((0x4A, len(meta.data_type), *meta.data_type))
    out += bytes((0x50, meta.customer_id, 0x60, meta.pull, 0x68, meta.priority))
    return bytes(out)


def unpack_meta(data) -> Meta:
    """Raises :class:`ps_bridge.meta.MalformedMeta` for bytes that are not a PBMeta."""
    return pb_to_meta(decode_meta(data))
