"""``livevec produce`` as a user runs it (a subprocess) and as Python code calls it, against the real broker."""
from __future__ import annotations

import lzma
import os
import subprocess
import sys
import uuid
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

from online.stream.producer import produce
from online.stream.reader import KafkaStream
from online.stream.settings import StreamSettings

REPO = Path(__file__).resolve().parents[1]


def livevec(*args: str, input: bytes | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "online.cli", *args], cwd=REPO, input=input,
                          capture_output=True, timeout=120, env=env if env is not None else os.environ.copy())


async def read_all(bootstrap: str, topic: str, expected: int) -> list[tuple[int, int, str]]:
    stream = KafkaStream(StreamSettings(bootstrap=bootstrap, topics=(topic,), group=f"r-{uuid.uuid4().hex[:8]}",
                                        session_timeout_ms=6000))
    await stream.start()
    out = []
    try:
        while len(out) < expected:
            batch = await stream.next_batch(timeout=10)
            if batch is None:
                break
            out.extend((r.partition, r.offset, r.text) for r in batch.records)
            await stream.mark_processed(batch)
    finally:
        await stream.stop()
    return out


async def partition_count(bootstrap: str, topic: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return len((await admin.describe_topics([topic]))[0]["partitions"])
    finally:
        await admin.close()


async def test_cli_streams_an_xz_file_into_a_new_topic(tmp_path, kafka_bootstrap):
    topic = f"cli-xz-{uuid.uuid4().hex[:8]}"
    long_line = " ".join(f"w{i}" for i in range(25))
    text = "".join(f"sentence {i}\n" for i in range(99)) + "\n\n" + long_line + "\n"
    path = tmp_path / "corpus.txt.xz"
    path.write_bytes(lzma.compress(text.encode()))

    result = livevec("produce", "--bootstrap", kafka_bootstrap, "--topic", topic, "--partitions", "3",
                     "--lines-per-record", "2", "--words-per-record", "10", str(path))
    assert result.returncode == 0, result.stderr.decode()
    # 99 sentences + the long line cut into 10 + 10 + 5 words = 102 pieces, two per record.
    assert "produced 51 records (100 lines" in result.stdout.decode()
    assert "records/s" in result.stdout.decode()
    assert await partition_count(kafka_bootstrap, topic) == 3

    records = await read_all(kafka_bootstrap, topic, 51)
    assert {p for p, _o, _t in records} == {0, 1, 2}
    lines = [line for _p, _o, t in sorted(records, key=lambda r: (r[1], r[0])) for line in t.split("\n")]
    words = long_line.split()
    expected = [f"sentence {i}" for i in range(99)] + [" ".join(words[:10]), " ".join(words[10:20]),
                                                       " ".join(words[20:])]
    assert sorted(lines) == sorted(expected)


async def test_cli_reads_stdin_with_a_rate_limit_into_an_existing_topic(kafka_bootstrap, kafka_topic):
    topic = kafka_topic(partitions=2)
    data = "".join(f"piped {i}\n" for i in range(40)).encode()
    result = livevec("produce", "--bootstrap", kafka_bootstrap, "--topic", topic, "--rate", "400", "-",
                     input=data)
    assert result.returncode == 0, result.stderr.decode()
    assert "produced 40 records" in result.stdout.decode()
    assert await partition_count(kafka_bootstrap, topic) == 2  # existing topic kept as it was
    assert sorted(t for _p, _o, t in await read_all(kafka_bootstrap, topic, 40)) == sorted(
        f"piped {i}" for i in range(40))


def test_cli_errors_name_the_flag_or_file(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("LIVEVEC_KAFKA_BOOTSTRAP", "LIVEVEC_KAFKA_TOPICS")}
    missing = livevec("produce", "--topic", "t", "-", input=b"", env=env)
    assert missing.returncode == 2 and b"--bootstrap" in missing.stderr
    bad_topic = livevec("produce", "--bootstrap", "127.0.0.1:1", "--topic", "no spaces", "-", input=b"", env=env)
    assert bad_topic.returncode == 2 and b"--topic" in bad_topic.stderr
    no_file = livevec("produce", "--bootstrap", "127.0.0.1:1", "--topic", "t", str(tmp_path / "nope.txt"), env=env)
    assert no_file.returncode == 2 and b"FILE" in no_file.stderr and b"nope.txt" in no_file.stderr


async def test_python_api_from_inside_a_running_loop(kafka_bootstrap, kafka_topic):
    topic = kafka_topic(partitions=1)
    stats = produce([b"bytes line", "str line", "", "x " * 5], bootstrap=kafka_bootstrap, topic=topic,
                    words_per_record=3)
    assert (stats.records, stats.lines, stats.blank_lines, stats.failed) == (4, 3, 1, 0)
    assert stats.bytes == len(b"bytes line") + len(b"str line") + len(b"x x x") + len(b"x x")
    texts = [t for _p, _o, t in await read_all(kafka_bootstrap, topic, 4)]
    assert texts == ["bytes line", "str line", "x x x", "x x"]
