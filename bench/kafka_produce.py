"""Kafka plumbing numbers: seconds from ``livevec kafka start`` to a ready broker, and ``livevec produce`` of a
corpus into a 4-partition topic, against a bare aiokafka producer sending the same records from memory.

    .venv/bin/python bench/kafka_produce.py [--corpus ../shared/data/wiki17m.txt.xz] [--starts 3]

The reference (bare aiokafka, records prebuilt in memory, same producer settings) is measured in the same run on
the same broker, so the ratio says what reading, decompressing and chunking the file costs; the broker and the
machine's load set the absolute figure.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from online.stream.producer import RecordBuilder, TextSource, ensure_topic  # noqa: E402

DEFAULT_CORPUS = REPO.parent / "shared" / "data" / "wiki17m.txt.xz"


def livevec(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "online.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600)


def build_records(corpus: Path, words_per_record: int) -> list[bytes]:
    builder, source, out = RecordBuilder(1, words_per_record), TextSource(corpus), []
    while not source.eof:
        for line in source.read_chunk():
            out.extend(builder.add(line))
    out.extend(builder.flush())
    source.close()
    return out


async def bare_aiokafka(bootstrap: str, topic: str, records: list[bytes]) -> float:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, max_batch_size=1 << 20,
                                max_request_size=1 << 20)
    await producer.start()
    t0 = time.perf_counter()
    futures = [await producer.send(topic, value, partition=i % 4) for i, value in enumerate(records)]
    await producer.flush()
    await asyncio.gather(*futures)
    elapsed = time.perf_counter() - t0
    await producer.stop()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--starts", type=int, default=3, help="broker start/stop cycles to time")
    parser.add_argument("--words-per-record", type=int, default=1000)
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="bench-kafka-")) / "broker.json"

    start_seconds = []
    for i in range(args.starts):
        t0 = time.perf_counter()
        started = livevec("kafka", "start", "--state-file", str(state))
        wall = time.perf_counter() - t0
        if started.returncode != 0:
            print(started.stderr, file=sys.stderr)
            return 1
        logged = json.loads(state.read_text())["start_seconds"]
        start_seconds.append((wall, logged))
        print(f"kafka start #{i + 1}: {wall:.2f} s until the address was printed "
              f"(broker ready {logged:.2f} s after KafkaBroker.start)")
        if i < args.starts - 1:
            livevec("kafka", "stop", "--state-file", str(state))
    bootstrap = json.loads(state.read_text())["bootstrap"]
    try:
        records = build_records(args.corpus, args.words_per_record)
        nbytes = sum(map(len, records))
        for name in ("warm-up", "reference"):  # the first pass only warms the broker's JIT
            ref_topic = f"bench-bare-{uuid.uuid4().hex[:6]}"
            asyncio.run(ensure_topic(bootstrap, ref_topic, 4))
            bare = asyncio.run(bare_aiokafka(bootstrap, ref_topic, records))
        print(f"reference, bare aiokafka from memory: {len(records):,} records, {nbytes / 1e6:.1f} MB in "
              f"{bare:.1f} s: {len(records) / bare:,.0f} records/s, {nbytes / 1e6 / bare:.1f} MB/s")

        plain = state.parent / "corpus.txt"
        with open(plain, "wb") as out:
            subprocess.run(["xz", "-dc", str(args.corpus)], stdout=out, check=True) if args.corpus.suffix == ".xz" \
                else out.write(args.corpus.read_bytes())
        for label, path in (("compressed", args.corpus), ("plain text", plain)):
            topic = f"bench-produce-{uuid.uuid4().hex[:6]}"
            t0 = time.perf_counter()
            produced = livevec("produce", "--bootstrap", bootstrap, "--topic", topic, "--partitions", "4",
                               "--words-per-record", str(args.words_per_record), "--no-progress", str(path))
            cli_wall = time.perf_counter() - t0
            if produced.returncode != 0:
                print(produced.stderr, file=sys.stderr)
                return 1
            seconds = float(produced.stdout.split(" in ")[1].split(" s:")[0])
            print(f"{label}: {produced.stdout.strip()}\n  (whole command incl. Python start-up and topic "
                  f"creation: {cli_wall:.1f} s); ratio to bare aiokafka (records/s): {bare / seconds:.2f}")
        plain.unlink()
    finally:
        livevec("kafka", "stop", "--state-file", str(state))
    walls = sorted(w for w, _ in start_seconds)
    print(f"kafka start to ready broker: median {walls[len(walls) // 2]:.2f} s over {len(walls)} starts "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
