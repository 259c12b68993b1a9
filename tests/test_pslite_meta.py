"""The PBMeta codec against the byte captures of real C++ ps-lite traffic.

The captures live in ../shared/reference/pslite-captures.txt (read-only reference material,
never copied into the repository). Each entry documents the meta field by field; this file
parses those breakdowns and checks that our decoder yields exactly the documented fields
and that re-encoding gives back the captured bytes.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from ps_bridge.message import K_EMPTY, Cmd, meta_to_pb, pack_meta, pb_to_meta, unpack_meta
from ps_bridge.meta import MalformedMeta, PBMeta, decode_meta, encode_meta

CAPTURES = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "pslite-captures.txt"

needs_captures = pytest.mark.skipif(not CAPTURES.exists(), reason="../shared reference material is absent")


@dataclass
class DocField:
    number: int
    kind: str  # VARINT or LEN
    name: str
    rest: str
    hexbytes: bytes
    children: list["DocField"] = field(default_factory=list)


@dataclass
class Capture:
    ident: str
    title: str
    meta: bytes = b""
    fields: list[DocField] = field(default_factory=list)
    frames: dict[int, bytes] = field(default_factory=dict)

    @property
    def master(self) -> bool:
        return self.ident.startswith("A")


_FIELD_RE = re.compile(r"^(\s+)((?:[0-9a-f]{2} )+)\s*field (\d+)\s+(VARINT|LEN)\s+(\S+)\s*(.*)$")
_FRAME_RE = re.compile(r"^frame (\d+) = (PBMeta|data\[\d\]), (\d+) bytes")


def _hexdump_line(line: str) -> bytes | None:
    m = re.match(r"^    [0-9a-f]{4}  ", line)
    if not m:
        return None
    return bytes.fromhex("".join(line[10:58].split()))


def parse_captures(text: str) -> list[Capture]:
    captures: list[Capture] = []
    cur: Capture | None = None
    frame_no: int | None = None
    in_fields = False
    stack: list[tuple[int, DocField]] = []
    for line in text.splitlines():
        head = re.match(r"^### ([AB]\d+)\. (.*)$", line)
        if head:
            cur = Capture(head.group(1), head.group(2))
            captures.append(cur)
            frame_no, in_fields, stack = None, False, []
            continue
        if cur is None:
            continue
        fm = _FRAME_RE.match(line)
        if fm:
            frame_no, in_fields = int(fm.group(1)), False
            cur.frames[frame_no] = b""
            continue
        if line.startswith("exact ZMTP") or line.startswith("READY") or line.startswith("-----"):
            frame_no, in_fields = None, False
            continue
        if line.strip() == "field by field:":
            in_fields, frame_no = True, None
            continue
        if in_fields:
            m = _FIELD_RE.match(line)
            if not m:
                in_fields = False
                continue
            indent = len(m.group(1))
            f = DocField(int(m.group(3)), m.group(4), m.group(5), m.group(6).strip(),
                         bytes.fromhex(m.group(2)))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            (stack[-1][1].children if stack else cur.fields).append(f)
            stack.append((indent, f))
            continue
        if frame_no is not None:
            chunk = _hexdump_line(line)
            if chunk is not None:
                cur.frames[frame_no] += chunk
    for c in captures:
        c.meta = c.frames.pop(0, b"")
    return [c for c in captures if c.meta]


def _all_hex(fields: list[DocField]) -> bytes:
    return b"".join(f.hexbytes + _all_hex(f.children) for f in fields)


_META_FIELDS = {1: "head", 2: "body", 3: "control", 4: "request", 5: "push", 6: "simple_app", 7: "app_id",
                8: "timestamp", 9: "data_type", 10: "customer_id", 11: "data_size", 12: "pull", 13: "priority"}
_CONTROL_FIELDS = {1: "cmd", 2: "node", 3: "barrier_group", 4: "msg_sig"}
_NODE_FIELDS = {1: "role", 2: "id", 3: "hostname", 4: "port", 5: "is_recovery", 10: "customer_id"}


def _documented_value(f: DocField):
    rest = f.rest
    if rest.startswith("="):
        text = rest[1:].strip()
        if text.startswith("'"):
            return text[1:text.rindex("'")]
        return int(text.split()[0])
    if rest.startswith("packed"):
        return [int(x.split("=")[0]) for x in rest[rest.index("[") + 1:rest.index("]")].split(",")]
    raise AssertionError(f"cannot read documented value {rest!r}")


def _check_message(obj, fields: list[DocField], names: dict[int, str], where: str) -> None:
    documented = set()
    repeated: dict[str, int] = {}
    for f in fields:
        attr = names[f.number]
        assert f.name.split("(")[0] in (attr, "customer_id"), f"{where}: field {f.number} documented as {f.name}"
        documented.add(attr)
        value = getattr(obj, attr)
        if attr == "control":
            _check_message(value, f.children, _CONTROL_FIELDS, f"{where}.control")
        elif attr == "node":
            i = repeated.get(attr, 0)
            repeated[attr] = i + 1
            _check_message(value[i], f.children, _NODE_FIELDS, f"{where}.node[{i}]")
        elif attr == "body":
            assert value == _documented_value(f).encode(), where
        else:
            expected = _documented_value(f)
            got = int(value) if isinstance(value, bool) else value
            assert got == expected, f"{where}.{attr}: decoded {got!r}, documented {expected!r}"
    for attr in names.values():
        value = getattr(obj, attr)
        if value is not None and value != []:
            assert attr in documented, f"{where}: decoded {attr}={value!r} that the capture does not show"
    if "node" in repeated:
        assert len(obj.node) == repeated["node"], where


@pytest.fixture(scope="module")
def captures() -> list[Capture]:
    caps = parse_captures(CAPTURES.read_text())
    assert len([c for c in caps if c.master]) >= 24
    return caps


@needs_captures
def test_parser_reads_every_breakdown(captures):
    for c in captures:
        assert c.fields, c.ident
        assert _all_hex(c.fields) == c.meta, f"{c.ident}: field breakdown does not add up to the meta bytes"


@needs_captures
def test_every_capture_decodes_to_documented_fields_and_reencodes_exactly(captures):
    for c in captures:
        pb = decode_meta(c.meta)
        _check_message(pb, c.fields, _META_FIELDS, c.ident)
        assert encode_meta(pb) == c.meta, c.ident


@needs_captures
def test_master_captures_roundtrip_through_pslite_meta_rules(captures):
    """Van::UnpackMeta then Van::PackMeta must reproduce the C++ bytes: this checks which
    fields we set (kEmpty app_id/timestamp left out, defaults written) not just the codec."""
    master = [c for c in captures if c.master]
    for c in master:
        meta = unpack_meta(c.meta)
        assert pack_meta(meta) == c.meta, c.ident
        assert encode_meta(meta_to_pb(meta)) == c.meta, c.ident
    assert len(master) == 24


@needs_captures
def test_documented_semantics_of_selected_captures(captures):
    by_id = {c.ident: c for c in captures}
    a1 = unpack_meta(by_id["A1"].meta)
    assert a1.control.cmd == Cmd.ADD_NODE and a1.app_id == K_EMPTY and a1.customer_id == K_EMPTY
    assert a1.control.node[0].id == K_EMPTY and a1.control.node[0].hostname == "127.0.0.1"
    a3 = unpack_meta(by_id["A3"].meta)
    assert [n.id for n in a3.control.node] == [8, 10, 9, 1] and a3.control.node[-1].role == 2
    a6 = by_id["A6"]
    assert np.frombuffer(a6.frames[1], np.uint64).tolist() == [1, 2, 3]
    assert np.frombuffer(a6.frames[2], np.float32).tolist() == [1.5, 3.0, 4.5]
    assert np.frombuffer(by_id["A7"].frames[1], np.uint64).tolist() == [0x8000000000000004]
    a9 = unpack_meta(by_id["A9"].meta)
    assert a9.pull and not a9.push and by_id["A9"].frames[2] == b""
    assert np.frombuffer(by_id["A12"].frames[2], np.float32).tolist() == [3.0, 6.0, 9.0]
    a13 = unpack_meta(by_id["A13"].meta)
    assert a13.head == 42 and a13.data_type == [8, 9, 3]
    assert np.frombuffer(by_id["A13"].frames[3], np.int32).tolist() == [1, 1]
    a14 = unpack_meta(by_id["A14"].meta)
    assert a14.simple_app and a14.body == b"hello" and a14.app_id == 1
    a16 = unpack_meta(by_id["A16"].meta)
    assert a16.control.cmd == Cmd.TERMINATE and a16.timestamp == K_EMPTY
    a19 = unpack_meta(by_id["A19"].meta)
    assert a19.control.msg_sig == 0x0000_09_01_00000003
    a23 = unpack_meta(by_id["A23"].meta)
    assert a23.control.node[0].id == 8 and a23.control.node[0].is_recovery


@needs_captures
def test_unpatched_2016_meta_is_rejected():
    text = CAPTURES.read_text()
    section = text[text.index("### B11."):]
    line = next(ln for ln in section.splitlines()[1:] if re.fullmatch(r"\s+(?:[0-9a-f]{2} ?)+", ln))
    with pytest.raises(MalformedMeta):
        decode_meta(bytes.fromhex(line))


@needs_captures
def test_every_truncation_is_rejected_or_a_valid_prefix(captures):
    """A cut inside a field is rejected; a cut between top-level fields decodes to exactly the
    documented fields before it and re-encodes to the cut bytes."""
    for c in captures:
        ends = np.cumsum([0] + [len(_all_hex([f])) for f in c.fields]).tolist()
        for cut in range(len(c.meta)):
            try:
                pb = decode_meta(c.meta[:cut])
            except MalformedMeta:
                assert cut not in ends, f"{c.ident}: cut at {cut}, a field boundary, was rejected"
                continue
            assert cut in ends, f"{c.ident}: cut at {cut}, inside a field, decoded to {pb!r}"
            _check_message(pb, c.fields[:ends.index(cut)], _META_FIELDS, f"{c.ident}[:{cut}]")
            assert encode_meta(pb) == c.meta[:cut], f"{c.ident}[:{cut}]"


def test_fuzzed_bytes_never_raise_anything_but_malformed():
    rng = random.Random(1234)
    base = bytes.fromhex("0800200128013000380040004a0208095000600068 00".replace(" ", ""))
    for _ in range(3000):
        kind = rng.random()
        if kind < 0.4:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        else:
            data = bytearray(base)
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            data = bytes(data)
        try:
            pb = decode_meta(data)
        except MalformedMeta:
            continue
        assert isinstance(pb, PBMeta)
        pb_to_meta(pb)


@pytest.mark.parametrize("data", [
    b"\x08",                      # truncated varint
    b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # 11-byte varint
    b"\x00\x01",                  # field number 0
    b"\x1b\x00",                  # wire type 3 (group start)
    b"\x12\x05ab",                # LEN runs past the end
    b"\x1a\x02\x18\x01",          # control without its required cmd
    b"\x1a\x04\x08\x02\x12\x00",  # node without its required role
])
def test_structural_errors_raise_malformed(data):
    with pytest.raises(MalformedMeta):
        decode_meta(data)


def test_unknown_fields_are_skipped_and_negative_int32_roundtrips():
    pb = PBMeta(head=-1, request=True, timestamp=5)
    raw = encode_meta(pb)
    assert raw[:11] == b"\x08" + b"\xff" * 9 + b"\x01"
    extended = raw + b"\x78\x05" + b"\x82\x01\x02hi" + b"\x8d\x01abcd"  # fields 15 (varint), 16 (len), 17 (i32)
    assert decode_meta(extended) == pb


def test_fast_data_meta_packing_matches_the_generic_encoder():
    from ps_bridge.message import Meta
    for head in (0, 42, 200):
        for ts in (0, 127, 128, 70000):
            for dt in ([], [8, 9], [8, 9, 3]):
                m = Meta(head=head, app_id=0, customer_id=0, timestamp=ts, request=True, push=True,
                         pull=bool(ts & 1), data_type=list(dt))
                assert pack_meta(m) == encode_meta(meta_to_pb(m))
                back = unpack_meta(pack_meta(m))
                assert (back.head, back.timestamp, back.data_type, back.pull) == (head, ts, list(dt), bool(ts & 1))


def _same_meta(raw: bytes) -> None:
    try:
        slow = pb_to_meta(decode_meta(raw))
    except MalformedMeta:
        with pytest.raises(MalformedMeta):
            unpack_meta(raw)
        return
    assert unpack_meta(raw) == slow, raw.hex()


def test_fast_unpack_agrees_with_the_generic_decoder_on_fuzzed_input():
    rng = random.Random(99)
    bases = [bytes.fromhex("0800200128013000380040004a020809500060006800"),
             bytes.fromhex("082a200128013000380040034a0308090350006000680 0".replace(" ", "")),
             pack_meta(__import__("ps_bridge.message", fromlist=["Meta"]).Meta(
                 head=300, app_id=5, customer_id=2, timestamp=2**31 - 2, request=True, pull=True,
                 priority=-3, data_type=[8, 9]))]
    for base in bases:
        _same_meta(base)
        for cut in range(len(base)):
            _same_meta(base[:cut])
        for _ in range(1500):
            data = bytearray(base)
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            _same_meta(bytes(data))


@needs_captures
def test_fast_unpack_agrees_on_every_capture(captures):
    for c in captures:
        _same_meta(c.meta)


def test_cached_runs_never_change_the_bytes_or_the_fields():
    """pack/unpack cache the byte runs around the timestamp of data metas. Every field that a
    cached run covers is varied here, many times over (so most calls hit the caches, and the
    caches fill up past their limit): each packed meta must equal the generic encoder's bytes
    and unpack to the same fields as the generic decoder."""
    from ps_bridge.message import Meta
    rng = random.Random(5)
    for _ in range(3000):
        m = Meta(head=rng.choice([0, 1, 100, 101, 300, -2]), app_id=rng.choice([0, 1, 7]),
                 customer_id=rng.choice([0, 1, 2]), timestamp=rng.choice([0, 1, 127, 128, 2**31 - 2, 99_999]),
                 request=rng.random() < 0.5, push=rng.random() < 0.5, pull=rng.random() < 0.5,
                 simple_app=rng.random() < 0.2, priority=rng.choice([0, 0, 5, -1]),
                 data_type=rng.choice([[], [8, 9], [8, 9, 3], [3]]))
        raw = pack_meta(m)
        assert raw == encode_meta(meta_to_pb(m)), m
        assert unpack_meta(raw) == pb_to_meta(decode_meta(raw)), m
