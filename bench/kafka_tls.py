"""The cost of TLS and SASL on Kafka throughput: `livevec produce` and the workers' consumer (KafkaStream),
over the local broker's plaintext listener against its SASL_SSL listener (SCRAM-SHA-512, TLS 1.3), in one run.

One broker serves both listeners, so both sides share the JVM, the disk and the machine's load. The rounds
alternate (plain, TLS, plain, TLS...) so that a change of load during the run hits both. Produce is the real
command (a subprocess, as an operator runs it) on a plain-text copy of the corpus (decompressed beforehand:
xz would be the limit otherwise); consumption is ``KafkaStream`` as a worker uses it (fetch, decode, batch,
commit after every batch), without training (the kernel would hide the difference).

    python bench/kafka_tls.py [--corpus ../shared/data/wiki17m.txt.xz] [--mb 100] [--rounds 2]
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import lzma
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from online.stream.kafka_broker import KafkaBroker  # noqa: E402
from online.stream.reader import KafkaStream  # noqa: E402
from online.stream.settings import KafkaBrokerSettings, StreamSettings  # noqa: E402
from tests.kafka_tls import client_env, make_tls_material  # noqa: E402


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def plain_copy(corpus: Path, mb: float, out: Path) -> Path:
    limit = int(mb * 1e6)
    with (lzma.open(corpus) if corpus.suffix == ".xz" else open(corpus, "rb")) as src, open(out, "wb") as dst:
        written = 0
        for line in src:
            dst.write(line)
            written += len(line)
            if written >= limit:
                break
    return out


def produce_cli(path: Path, topic: str, env: dict[str, str]) -> tuple[float, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LIVEVEC_")}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "online.cli", "produce", "--topic", topic, "--partitions", "4",
                           "--no-progress", str(path)], cwd=REPO, env={**clean, **env}, capture_output=True,
                          text=True, timeout=900)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"livevec produce failed:\n{done.stderr}")
    return wall, done.stdout.strip()


async def consume(env: dict[str, str], topic: str, expected: int) -> tuple[int, int, float]:
    settings = StreamSettings.from_env(env, topics=[topic], group=f"bench-{uuid.uuid4().hex[:8]}")
    records = nbytes = 0
    async with KafkaStream(settings) as stream:
        first = await stream.next_batch(timeout=30)   # the group is formed and the fetch started: clock starts
        started = time.monotonic()
        batch = first
        while records < expected:
            if batch:
                records += len(batch)
                nbytes += sum(len(t) for t in batch.texts)
                await stream.mark_processed(batch)
            batch = await stream.next_batch(timeout=5)
            if batch is None and time.monotonic() - started > 300:
                break
        seconds = time.monotonic() - started
    return records, nbytes, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(REPO.parent / "shared" / "data" / "wiki17m.txt.xz"))
    parser.add_argument("--mb", type=float, default=100.0, help="megabytes of the corpus to send each round")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="livevec-bench-tls-"))
    print(f"load before: {loadavg()}  ({os.cpu_count()} cores)")
    corpus = plain_copy(Path(args.corpus), args.mb, work / "corpus.txt")
    print(f"corpus: {corpus.stat().st_size / 1e6:.1f} MB of plain text from {args.corpus}")
    tls = make_tls_material(work / "tls")
    settings = dataclasses.replace(KafkaBrokerSettings.from_env(), port=0, data_dir=None, state_file=None,
                                   tls_cert_file=tls.broker_cert, tls_key_file=tls.broker_key,
                                   users_file=tls.users_file)
    results: dict[str, list[tuple]] = {"PLAINTEXT": [], "SASL_SSL": []}
    with KafkaBroker(settings) as broker:
        sides = {"PLAINTEXT": {"LIVEVEC_KAFKA_BOOTSTRAP": broker.bootstrap},
                 "SASL_SSL": client_env(tls, broker.sasl_ssl_bootstrap, "SCRAM-SHA-512")}
        for rnd in range(args.rounds):
            for side, env in sides.items():
                topic = f"bench-{side.lower()}-{rnd}-{uuid.uuid4().hex[:6]}"
                wall, summary = produce_cli(corpus, topic, env)
                m = re.search(r"produced ([\d,]+) records .*?([\d.]+) MB\) .*? in ([\d.]+) s", summary)
                n_records, mb, seconds = int(m.group(1).replace(",", "")), float(m.group(2)), float(m.group(3))
                got, nbytes, cseconds = asyncio.run(consume(env, topic, n_records))
                results[side].append((n_records / seconds, mb / seconds, wall, got / cseconds, nbytes / 1e6 / cseconds))
                print(f"round {rnd + 1} {side:9s}: produce {n_records:,} records {mb:.1f} MB in {seconds:.2f} s "
                      f"({n_records / seconds:,.0f} rec/s, {mb / seconds:.1f} MB/s; command wall {wall:.1f} s); "
                      f"consume {got:,} in {cseconds:.2f} s ({got / cseconds:,.0f} rec/s, "
                      f"{nbytes / 1e6 / cseconds:.1f} MB/s)  load {loadavg().split()[0]}", flush=True)
    print(f"load after: {loadavg()}")
    for i, what in ((0, "produce records/s"), (3, "consume records/s")):
        plain = [r[i] for r in results["PLAINTEXT"]]
        secure = [r[i] for r in results["SASL_SSL"]]
        ratios = [s / p for s, p in zip(secure, plain)]
        print(f"{what}: plaintext {', '.join(f'{x:,.0f}' for x in plain)}; SASL_SSL "
              f"{', '.join(f'{x:,.0f}' for x in secure)}; SASL_SSL/plaintext per round "
              f"{', '.join(f'{r:.2f}' for r in ratios)}")


if __name__ == "__main__":
    main()
