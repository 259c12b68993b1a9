"""The stream interface without a broker: FileStream, the offset bookkeeping, record building, settings."""
from __future__ import annotations

import gzip
import lzma

import pytest

from online.stream.producer import RecordBuilder, TextSource, split_long_line
from online.stream.batches import OffsetTracker, TextRecord, decode_record, decode_records
from online.stream.reader import FileStream
from online.stream.records import RecordFormat
from online.stream.settings import StreamSettings
from ps_bridge.settings import SettingError


def write(path, data: bytes):
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    elif path.suffix == ".xz":
        path.write_bytes(lzma.compress(data))
    else:
        path.write_bytes(data)
    return path


LONG = " ".join(f"w{i}" for i in range(2500))
CORPUS = ("the first sentence\n\n" + LONG + "\nbad \xff line\n  \nlast line without newline").encode("latin-1")


@pytest.mark.parametrize("suffix", [".txt", ".gz", ".xz"])
async def test_file_stream_yields_the_records_produce_would_send(tmp_path, suffix):
    path = write(tmp_path / f"corpus{suffix}", CORPUS)
    stream = FileStream(path, batch_records=2, words_per_record=1000)
    await stream.start()
    records: list[TextRecord] = []
    async for batch in stream:
        records.extend(batch.records)
        await stream.mark_processed(batch)
    await stream.stop()

    texts = [r.text for r in records]
    assert texts[0] == "the first sentence"
    assert texts[1:4] == [" ".join(f"w{i}" for i in range(a, min(a + 1000, 2500))) for a in (0, 1000, 2000)]
    assert texts[4] == "last line without newline"
    assert [r.offset for r in records] == [0, 1, 2, 3, 5]  # offset 4 was the invalid UTF-8 line
    assert {(r.topic, r.partition) for r in records} == {(path.name, 0)}
    assert stream.counters.malformed["invalid_utf8"] == 1 and stream.counters.records == 5
    assert stream.exhausted and stream.positions() == {(path.name, 0): 6}

    # The same bytes through produce's record builder give the same record values, in the same order.
    builder = RecordBuilder(1, 1000)
    source = TextSource(path)
    values = []
    while not source.eof:
        for line in source.read_chunk():
            values.extend(builder.add(line))
    values.extend(builder.flush())
    assert [v for v in values if decode_record(v, 1 << 20)[0] is not None] == [t.encode() for t in texts]


async def test_file_stream_seek_to_and_lines_per_record(tmp_path):
    path = write(tmp_path / "n.txt", "".join(f"n{i}\n" for i in range(100)).encode())
    stream = FileStream(path, batch_records=7, lines_per_record=3)
    await stream.start()
    first = await stream.next_batch()
    assert first.texts[0] == "n0\nn1\nn2" and len(first) == 7
    await stream.seek_to({(path.name, 0): 30})
    assert not stream.is_current(first)
    batch = await stream.next_batch()
    assert [r.offset for r in batch.records] == [30, 31, 32, 33]
    assert batch.texts[0] == "n90\nn91\nn92" and batch.texts[-1] == "n99"
    await stream.mark_processed(batch)
    assert await stream.next_batch() is None and stream.exhausted
    await stream.mark_processed(first)  # stale: ignored
    assert stream.counters.stale_batches == 1
    assert stream.positions() == {(path.name, 0): 34}
    await stream.seek_to({(path.name, 0): 0})
    again = await stream.next_batch()
    assert again.records[0].offset == 0 and again.texts[0] == "n0\nn1\nn2"
    with pytest.raises(ValueError):
        await stream.seek_to({("other", 0): 1})
    await stream.stop()


def test_offsets_advance_only_over_contiguous_completed_batches():
    tracker = OffsetTracker()
    tp, other = ("t", 0), ("t", 1)
    b1 = tracker.new_batch([], {tp: (0, 10)})
    b2 = tracker.new_batch([], {tp: (10, 20), other: (5, 8)})
    b3 = tracker.new_batch([], {tp: (20, 25)})
    assert tracker.complete(b2) == ({other: 8}, False)  # tp waits for b1
    assert tracker.complete(b3) == ({}, False)
    assert tracker.complete(b1) == ({tp: 25}, False)  # b1..b3 all done
    tracker.mark_committed({tp: 25, other: 8})
    assert tracker.uncommitted() == {}
    b4 = tracker.new_batch([], {tp: (25, 30)})
    tracker.reset(tp, frontier=12)  # seek or revocation: b4 becomes stale
    assert not tracker.is_current(b4)
    assert tracker.complete(b4) == ({}, True)
    assert tracker.positions() == {tp: 12, other: 8}
    tracker.forget(other)
    b5 = tracker.new_batch([], {other: (8, 9)})
    assert tracker.complete(b5) == ({other: 9}, False)


def test_decode_record_reasons():
    assert decode_record(b"hello", 10) == ("hello", None)
    assert decode_record(None, 10) == (None, "empty")
    assert decode_record(b" \t\n", 10) == (None, "empty")
    assert decode_record(b"x" * 11, 10) == (None, "too_large")
    assert decode_record(b"\xc3\x28", 10) == (None, "invalid_utf8")


def test_split_long_line():
    assert split_long_line(b"a b c", 2) == [b"a b", b"c"]
    assert split_long_line(b"a b c", 0) == [b"a b c"]
    assert split_long_line(b"a  b", 5) == [b"a  b"]


def test_stream_settings_validate_and_name_the_setting():
    env = {"LIVEVEC_KAFKA_BOOTSTRAP": "127.0.0.1:9092", "LIVEVEC_KAFKA_TOPICS": "a, b"}
    s = StreamSettings.from_env(env)
    assert s.topics == ("a", "b") and s.group == "livevec" and s.offset_reset == "earliest"
    assert StreamSettings.from_env(env, group="g2", batch_records=7).batch_records == 7
    for key, value in [("LIVEVEC_KAFKA_BOOTSTRAP", "nohost"), ("LIVEVEC_KAFKA_TOPICS", "bad topic"),
                       ("LIVEVEC_KAFKA_TOPICS", " , "), ("LIVEVEC_KAFKA_BATCH_RECORDS", "0"),
                       ("LIVEVEC_KAFKA_OFFSET_RESET", "middle"), ("LIVEVEC_KAFKA_SESSION_TIMEOUT_MS", "100")]:
        with pytest.raises(SettingError, match=key):
            StreamSettings.from_env({**env, key: value})
    with pytest.raises(SettingError, match="LIVEVEC_KAFKA_BOOTSTRAP"):
        StreamSettings.from_env({"LIVEVEC_KAFKA_TOPICS": "a"})


@pytest.mark.parametrize("fmt", [RecordFormat(), RecordFormat("json", "items")], ids=["text", "json"])
def test_a_batch_of_values_gets_each_ones_reason_as_one_value_alone_does(fmt):
    """``decode_records`` checks a JSON batch as a whole (sizes, UTF-8): every value still gets the reason it
    would get alone, whatever its neighbours, and a character split across two values is not UTF-8."""
    good = b'{"items": ["sku-1", "\xe6\x9d\xb1\xe4\xba\xac"]}' if not fmt.is_text else "sku-1 東京".encode()
    cut = good[:-1] + b"\xe6"
    cases = [(good, None), (None, "empty"), (b"", "empty"), (b" \t\n", "empty"), (b"x" * 101, "too_large"),
             (b"\xc3\x28", "invalid_utf8"), (cut, "invalid_utf8"), (b"\x9d\xb1" + good, "invalid_utf8")]
    values = [v for v, _ in cases]
    alone = [decode_records([v], 100, fmt) for v in values]
    assert [a[0][1] for a in alone] == [reason for _, reason in cases]
    for order in (values, values[::-1], [good] * 3 + values):
        assert decode_records(order, 100, fmt) == [decode_records([v], 100, fmt)[0] for v in order]
    assert decode_records([good] * 3, 100, fmt) == alone[0] * 3
