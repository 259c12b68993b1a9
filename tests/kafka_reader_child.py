"""A worker-like reader in its own process, for the kill-and-restart test (tests/test_kafka_redelivery.py).

Writes one JSON line per event to --events: "assigned", "processed" (the texts of a batch, written BEFORE it is
marked processed, like a worker that trained on it), "committed" (after mark_processed returned) and "stalled".
With --stall-after N it processes batch N+1 and then hangs without committing, so the parent can SIGKILL it
at a known point. SIGTERM stops it cleanly.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from online.stream.reader import KafkaStream  # noqa: E402
from online.stream.settings import StreamSettings  # noqa: E402


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--stall-after", type=int, default=-1)
    parser.add_argument("--batch-records", type=int, default=50)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds of 'training' per batch")
    args = parser.parse_args()

    out = open(args.events, "a", buffering=1)

    def emit(event: str, **fields) -> None:
        out.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")
        out.flush()
        os.fsync(out.fileno())

    settings = StreamSettings(bootstrap=args.bootstrap, topics=(args.topic,), group=args.group,
                              batch_records=args.batch_records, session_timeout_ms=6000, revoke_grace=5.0)
    stream = KafkaStream(settings)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stream.start()
    emit("started")
    last_assignment = None
    done = 0
    try:
        while not stop.is_set():
            batch = await stream.next_batch(timeout=0.2)
            assignment = sorted(p for _t, p in stream.assignment())
            if assignment != last_assignment:
                last_assignment = assignment
                emit("assigned", partitions=assignment)
            if batch is None:
                continue
            emit("processed", batch=batch.id, texts=batch.texts,
                 offsets=[[r.partition, r.offset] for r in batch.records])
            if args.delay:
                await asyncio.sleep(args.delay)
            if done == args.stall_after:
                emit("stalled", batch=batch.id)
                await asyncio.Event().wait()  # hang, uncommitted, until SIGKILL
            await stream.mark_processed(batch)
            done += 1
            emit("committed", batch=batch.id,
                 committed={str(p): off for (_t, p), off in stream.committed().items()})
    finally:
        await stream.stop()
        emit("stopped", records=stream.counters.records)


if __name__ == "__main__":
    asyncio.run(main())
