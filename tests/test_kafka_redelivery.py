"""At-least-once across a crash: a reader process is SIGKILLed mid-stream and restarted.

Records it processed but had not committed are delivered again; records it committed are never read again;
nothing is lost.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

from online.stream.producer import produce_async

CHILD = Path(__file__).with_name("kafka_reader_child.py")


class Reader:
    """A reader subprocess and the events it wrote."""

    def __init__(self, tmp_path: Path, name: str, bootstrap: str, topic: str, group: str, *extra: str):
        self.events_path = tmp_path / f"{name}.jsonl"
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), "--bootstrap", bootstrap, "--topic", topic, "--group", group,
             "--events", str(self.events_path), *extra],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{name}.log", "w"))

    def events(self, kind: str | None = None) -> list[dict]:
        if not self.events_path.exists():
            return []
        rows = [json.loads(line) for line in self.events_path.read_text().splitlines() if line.strip()]
        return [r for r in rows if kind is None or r["event"] == kind]

    def processed_texts(self) -> list[str]:
        return [t for e in self.events("processed") for t in e["texts"]]

    def assignment(self) -> list[int] | None:
        assigned = self.events("assigned")
        return assigned[-1]["partitions"] if assigned else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_for(condition, timeout: float, what: str, readers=()) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        for reader in readers:
            assert reader.proc.poll() is None, f"a reader died: {(reader.events_path.with_suffix('.log')).name}"
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


async def test_killed_reader_redelivers_uncommitted_and_loses_nothing(tmp_path, kafka_bootstrap, kafka_topic):
    topic = kafka_topic(partitions=4)
    group = f"crash-{uuid.uuid4().hex[:8]}"
    first = [f"first {i}" for i in range(2000)]
    second = [f"second {i}" for i in range(400)]

    b = Reader(tmp_path, "b", kafka_bootstrap, topic, group, "--delay", "0.02")
    a = a2 = None
    try:
        wait_for(lambda: b.assignment() == [0, 1, 2, 3], 30, "reader B to own all partitions", [b])
        a = Reader(tmp_path, "a", kafka_bootstrap, topic, group, "--stall-after", "3")
        wait_for(lambda: a.assignment() and b.assignment() and len(a.assignment()) == 2
                 and len(b.assignment()) == 2, 30, "A and B to split the partitions", [a, b])
        assert set(a.assignment()) | set(b.assignment()) == {0, 1, 2, 3}

        await produce_async(first, bootstrap=kafka_bootstrap, topic=topic, partitions=4)
        wait_for(lambda: a.events("stalled"), 30, "reader A to stall mid-stream", [a, b])

        # A has committed three batches and processed a fourth without committing it. Kill it there.
        committed_texts = [t for e in a.events("processed")[:3] for t in e["texts"]]
        stalled_texts = a.events("processed")[3]["texts"]
        assert len(a.events("committed")) == 3 and stalled_texts
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait()

        # Restart it (a new process, same group). It joins once the broker expires the dead member's session.
        a2 = Reader(tmp_path, "a2", kafka_bootstrap, topic, group)
        wait_for(lambda: a2.assignment(), 40, "the restarted reader to get partitions", [a2, b])
        await produce_async(second, bootstrap=kafka_bootstrap, topic=topic, partitions=4)

        everything = set(first) | set(second)
        wait_for(lambda: everything <= set(a.processed_texts() + b.processed_texts() + a2.processed_texts()),
                 60, "every record to be processed", [a2, b])
    finally:
        for reader in (b, a, a2):
            if reader is not None:
                reader.stop()

    seen = Counter(a.processed_texts() + b.processed_texts() + a2.processed_texts())
    assert set(seen) == everything, "a record was lost or invented"
    # Records after A's last commit were delivered again, to B or to the restarted A ...
    redelivered = Counter(b.processed_texts() + a2.processed_texts())
    assert all(redelivered[t] == 1 for t in stalled_texts)
    # ... records A had committed were never read again, and nothing else was read twice.
    assert all(seen[t] == 1 for t in committed_texts)
    assert {t for t, n in seen.items() if n > 1} == set(stalled_texts)
    assert a2.processed_texts(), "the restarted reader processed nothing"
    assert a2.events("stopped") and b.events("stopped")
