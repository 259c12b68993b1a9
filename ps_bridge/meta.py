"""Hand-written proto2 codec for ps-lite's ``meta.proto`` (PBMeta, PBControl, PBNode).

Not the ``protobuf`` package: byte equality with C++ ps-lite depends on *which* fields are
set (ps-lite sets defaults such as ``request`` and leaves kEmpty ``app_id``/``timestamp``
unset; pslite-protocol.md §2.2). Here a field is set exactly when its attribute is not
``None``, written in ascending field order as protobuf-C++ does, with no generated code.

Malformed input raises :class:`MalformedMeta` (never IndexError or the like), so the
Van can count and drop the frame. Unknown fields are skipped, as protobuf does.
"""
from __future__ import annotations

__all__ = ["MalformedMeta", "PBNode", "PBControl", "PBMeta", "encode_meta", "decode_meta",
           "encode_node", "decode_node", "encode_control", "decode_control"]


class MalformedMeta(ValueError):
    """The bytes are not a valid serialised PBMeta (truncated, bad tag, missing required field)."""


_U64 = (1 << 64) - 1


class _Message:
    """Equality over the slots; repr shows the set ones."""

    __slots__ = ()

    def __eq__(self, other):
        return type(other) is type(self) and all(getattr(self, s) == getattr(other, s) for s in self.__slots__)

    def __repr__(self):
        return type(self).__name__ + "(" + ", ".join(f"{s}={getattr(self, s)!r}" for s in self.__slots__
                                                     if getattr(self, s) not in (None, [])) + ")"


class PBNode(_Message):
    """``message PBNode``. ``None`` means "not set". role is proto2 ``required``."""

    __slots__ = ("role", "id", "hostname", "port", "is_recovery", "customer_id", "public_key")

    def __init__(self, role=None, id=None, hostname=None, port=None, is_recovery=None, customer_id=None,
                 public_key=None):  # public_key: field 15, ps_bridge's (CurveZMQ clusters only)
        self.role, self.id, self.hostname, self.port = role, id, hostname, port
        self.is_recovery, self.customer_id, self.public_key = is_recovery, customer_id, public_key


class PBControl(_Message):
    """``message PBControl``. cmd is proto2 ``required``; ``node`` is repeated."""

    __slots__ = ("cmd", "node", "barrier_group", "msg_sig")

    def __init__(self, cmd=None, node=None, barrier_group=None, msg_sig=None):
        self.cmd = cmd
        self.node = [] if node is None else node
        self.barrier_group, self.msg_sig = barrier_group, msg_sig


class PBMeta(_Message):
    """``message PBMeta`` (master dialect: fields 1-13). ``data_type`` is repeated, packed."""

    __slots__ = ("head", "body", "control", "request", "push", "simple_app", "app_id", "timestamp",
                 "data_type", "customer_id", "data_size", "pull", "priority")

    def __init__(self, head=None, body=None, control=None, request=None, push=None, simple_app=None,
                 app_id=None, timestamp=None, data_type=None, customer_id=None, data_size=None,
                 pull=None, priority=None):
        self.head, self.body, self.control = head, body, control
        self.request, self.push, self.simple_app = request, push, simple_app
        self.app_id, self.timestamp = app_id, timestamp
        self.data_type = [] if data_type is None else data_type
        self.customer_id, self.data_size, self.pull, self.priority = customer_id, data_size, pull, priority


def _varint(out: bytearray, value: int) -> None:
    value &= _U64  # int32/int64 negatives are sign-extended to 10 bytes, as protobuf does
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _int_field(out: bytearray, tag: int, value: int) -> None:
    out.append(tag)
    if 0 <= value < 0x80:
        out.append(value)
    else:
        _varint(out, value)


def _len_field(out: bytearray, tag: int, payload: bytes) -> None:
    out.append(tag)
    _varint(out, len(payload))
    out += payload


def encode_node(node: PBNode) -> bytes:
    if node.role is None:
        raise ValueError("PBNode.role is required")
    out = bytearray()
    _int_field(out, 0x08, node.role)
    if node.id is not None:
        _int_field(out, 0x10, node.id)
    if node.hostname is not None:
        _len_field(out, 0x1A, node.hostname.encode("utf-8", "surrogateescape"))
    if node.port is not None:
        _int_field(out, 0x20, node.port)
    if node.is_recovery is not None:
        out += b"\x28\x01" if node.is_recovery else b"\x28\x00"
    if node.customer_id is not None:
        _int_field(out, 0x50, node.customer_id)
    if node.public_key is not None:
        _len_field(out, 0x7A, node.public_key.encode("ascii"))
    return bytes(out)


def encode_control(ctrl: PBControl) -> bytes:
    if ctrl.cmd is None:
        raise ValueError("PBControl.cmd is required")
    out = bytearray()
    _int_field(out, 0x08, ctrl.cmd)
    for node in ctrl.node:
        _len_field(out, 0x12, encode_node(node))
    if ctrl.barrier_group is not None:
        _int_field(out, 0x18, ctrl.barrier_group)
    if ctrl.msg_sig is not None:
        _int_field(out, 0x20, ctrl.msg_sig)
    return bytes(out)


def _bool_field(out: bytearray, tag: int, value) -> None:
    out.append(tag)
    out.append(1 if value else 0)


def encode_meta(pb: PBMeta) -> bytes:
    """Serialise the set (non-None) fields in field-number order, exactly like protobuf-C++."""
    out = bytearray()
    if pb.head is not None:
        _int_field(out, 0x08, pb.head)
    if pb.body is not None:
        _len_field(out, 0x12, pb.body)
    if pb.control is not None:
        _len_field(out, 0x1A, encode_control(pb.control))
    if pb.request is not None:
        _bool_field(out, 0x20, pb.request)
    if pb.push is not None:
        _bool_field(out, 0x28, pb.push)
    if pb.simple_app is not None:
        _bool_field(out, 0x30, pb.simple_app)
    if pb.app_id is not None:
        _int_field(out, 0x38, pb.app_id)
    if pb.timestamp is not None:
        _int_field(out, 0x40, pb.timestamp)
    if pb.data_type:
        packed = bytearray()
        for t in pb.data_type:
            _varint(packed, t)
        _len_field(out, 0x4A, packed)
    if pb.customer_id is not None:
        _int_field(out, 0x50, pb.customer_id)
    if pb.data_size is not None:
        _int_field(out, 0x58, pb.data_size)
    if pb.pull is not None:
        _bool_field(out, 0x60, pb.pull)
    if pb.priority is not None:
        _int_field(out, 0x68, pb.priority)
    return bytes(out)


def _read_varint(buf, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise MalformedMeta("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & _U64, pos
        shift += 7
        if shift >= 70:
            raise MalformedMeta("varint longer than 10 bytes")


def _int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def _skip(buf, pos: int, end: int, wire: int) -> int:
    """Skip an unknown field's payload (protobuf ignores unknown fields)."""
    if wire == 0:
        return _read_varint(buf, pos, end)[1]
    if wire == 1:
        pos += 8
    elif wire == 2:
        n, pos = _read_varint(buf, pos, end)
        pos += n
    elif wire == 5:
        pos += 4
    else:
        raise MalformedMeta(f"unsupported wire type {wire}")
    if pos > end:
        raise MalformedMeta("truncated field")
    return pos


def _fields(buf, pos: int, end: int):
    """Yield (field_number, wire_type, value, pos_after) where value is an int (varint) or (start, stop)."""
    while pos < end:
        b = buf[pos]
        if b < 0x80:
            key = b
            pos += 1
        else:
            key, pos = _read_varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise MalformedMeta("field number 0")
        if wire == 0:
            if pos < end and buf[pos] < 0x80:
                value = buf[pos]
                pos += 1
            else:
                value, pos = _read_varint(buf, pos, end)
            yield field, 0, value
        elif wire == 2:
            n, pos = _read_varint(buf, pos, end)
            stop = pos + n
            if stop > end:
                raise MalformedMeta(f"field {field}: length {n} runs past the end")
            yield field, 2, (pos, stop)
            pos = stop
        else:
            pos = _skip(buf, pos, end, wire)
            yield field, wire, None
    if pos != end:
        raise MalformedMeta("truncated field")


def _decode_node(buf, pos: int, end: int) -> PBNode:
    node = PBNode()
    for field, wire, value in _fields(buf, pos, end):
        if wire == 0:
            if field == 1:
                node.role = _int32(value)
            elif field == 2:
                node.id = _int32(value)
            elif field == 4:
                node.port = _int32(value)
            elif field == 5:
                node.is_recovery = value != 0
            elif field == 10:
                node.customer_id = _int32(value)
        elif wire == 2 and field == 3:
            node.hostname = bytes(buf[value[0]:value[1]]).decode("utf-8", "surrogateescape")
        elif wire == 2 and field == 15:
            node.public_key = bytes(buf[value[0]:value[1]]).decode("ascii", "replace")
    if node.role is None:
        raise MalformedMeta("PBNode without its required role")
    return node


def _decode_control(buf, pos: int, end: int) -> PBControl:
    ctrl = PBControl()
    for field, wire, value in _fields(buf, pos, end):
        if wire == 0:
            if field == 1:
                ctrl.cmd = _int32(value)
            elif field == 3:
                ctrl.barrier_group = _int32(value)
            elif field == 4:
                ctrl.msg_sig = value
        elif wire == 2 and field == 2:
            ctrl.node.append(_decode_node(buf, value[0], value[1]))
    if ctrl.cmd is None:
        raise MalformedMeta("PBControl without its required cmd")
    return ctrl


def decode_node(data: bytes) -> PBNode:
    return _decode_node(data, 0, len(data))


def decode_control(data: bytes) -> PBControl:
    return _decode_control(data, 0, len(data))


def decode_meta(data) -> PBMeta:
    """Parse a serialised PBMeta; raises :class:`MalformedMeta` on any structural error."""
    buf = data if isinstance(data, (bytes, bytearray)) else bytes(data)
    pb = PBMeta()
    for field, wire, value in _fields(buf, 0, len(buf)):
        if wire == 0:
            if field == 1:
                pb.head = _int32(value)
            elif field == 4:
                pb.request = value != 0
            elif field == 5:
                pb.push = value != 0
            elif field == 6:
                pb.simple_app = value != 0
            elif field == 7:
                pb.app_id = _int32(value)
            elif field == 8:
                pb.timestamp = _int32(value)
            elif field == 9:  # unpacked repeated encoding is legal on the wire too
                pb.data_type.append(_int32(value))
            elif field == 10:
                pb.customer_id = _int32(value)
            elif field == 11:
                pb.data_size = _int32(value)
            elif field == 12:
                pb.pull = value != 0
            elif field == 13:
                pb.priority = _int32(value)
        elif wire == 2:
            start, stop = value
            if field == 2:
                pb.body = bytes(buf[start:stop])
            elif field == 3:
                pb.control = _decode_control(buf, start, stop)  # proto2 merges repeats; last wins is enough
            elif field == 9:
                pos = start
                while pos < stop:
                    v, pos = _read_varint(buf, pos, stop)
                    pb.data_type.append(_int32(v))
    return pb
