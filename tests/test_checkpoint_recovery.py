"""Crash recovery with real processes and the real broker: kill -9 each role in turn while a planted
corpus trains, then check that every produced record was trained exactly once relative to the
restored checkpoints, that the planted neighbours are found, and that the front end never
answered with a 5xx.

The cluster is the production Marathon group run by the local Marathon-like runner (so a killed
task is relaunched as Marathon would), with short heartbeats and checkpoint intervals. The test
reads each server's statistics (its batch ledger, see ``online.checkpoint.participants``) over ps-lite as an
elastic worker node of its own.
"""
from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import orjson
import pytest

from online.cluster import ps_commands as pc
from online.checkpoint.store import CheckpointStore
from online.stream.sample_corpus import generate_lines, planted_groups
from online.learner.tokenizers import Tokenizer
from online.cli.up import local_cluster
from ps_bridge.roles import start_worker
from ps_bridge.settings import NodeSettings
from tests.cluster_harness import assert_trained_exactly_once, coordinator_idle, runner_metric, wait_until
from tests.support.http import get

LINES_PER_RECORD = 4
REPO = Path(__file__).resolve().parents[1]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "online.cli", "checkpoint", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


class Producer(threading.Thread):
    """Produces the planted corpus in records of a few lines, at a steady rate; remembers what it sent.

    With ``reserve``, the last ``reserve`` records trickle out at ``reserve_rate`` until ``release`` is set: a test
    whose faults take longer than planned (a loaded machine) still has records flowing when it needs a worker
    holding fresh work, instead of finding the stream already drained."""

    def __init__(self, bootstrap: str, topic: str, lines: list[str], rate: float, reserve: int = 0,
                 reserve_rate: float = 2.0):
        super().__init__(name="test-producer", daemon=True)
        self.bootstrap, self.topic, self.rate = bootstrap, topic, rate
        self.records = ["\n".join(lines[i:i + LINES_PER_RECORD]) for i in range(0, len(lines), LINES_PER_RECORD)]
        self.reserve, self.reserve_rate = reserve, reserve_rate
        self.release = threading.Event()
        if not reserve:
            self.release.set()
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    async def _produce(self) -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=5)
        await producer.start()
        try:
            t0 = time.monotonic()
            trickle = len(self.records) - self.reserve
            for i, record in enumerate(self.records):
                await producer.send_and_wait(self.topic, record.encode(), partition=i % 4)
                self.sent = i + 1
                if self.sent >= trickle and not self.release.is_set():
                    await asyncio.sleep(1.0 / self.reserve_rate)
                    t0 = time.monotonic() - (i + 1) / self.rate   # once released, on at the full rate
                    continue
                delay = t0 + (i + 1) / self.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
        finally:
            await producer.stop()


class Watcher(threading.Thread):
    """Queries the front end all along: every status code, and whether it ever said 'recovering'."""

    def __init__(self, base_url):
        super().__init__(name="test-frontend-watcher", daemon=True)
        self.base = base_url   # a callable: a relaunched front end has a new port
        self.codes: dict[int, int] = {}
        self.errors_5xx: list[str] = []
        self.saw_recovering = False
        self.stop = threading.Event()
        # A relaunched front end opens its port before its model is in (so /health answers while a
        # large model loads) and answers queries 503 not_ready meanwhile. That is tolerated only after
        # the test killed the front end, and only until a query sent after the kill is answered.
        self.killed_at: float | None = None
        self.answered_since_kill = False
        self.not_ready_while_loading = 0

    def ask(self, path: str):
        """(status, the JSON of a 2xx answer, else the body's start; 0 and why while the front end restarts)."""
        answer = get(self.base() + path)
        if answer.ok:
            return answer.status, answer.json()
        return answer.status, answer.body[:300] if answer.status else answer.error

    def run(self) -> None:
        while not self.stop.wait(0.2):
            for path in ("/v1/stats", "/v1/similar?word=paris&k=5"):
                sent = time.monotonic()
                code, body = self.ask(path)
                self.codes[code] = self.codes.get(code, 0) + 1
                after_kill = self.killed_at is not None and sent > self.killed_at
                if path.startswith("/v1/similar") and code == 200 and after_kill:
                    self.answered_since_kill = True
                if (code == 503 and b'"not_ready"' in body and after_kill and not self.answered_since_kill):
                    self.not_ready_while_loading += 1
                elif code >= 500:
                    self.errors_5xx.append(f"{path}: {code} {body!r}")
                if path == "/v1/stats" and code == 200 and (body.get("source") or {}).get("recovering"):
                    self.saw_recovering = True


class ClusterProbe:
    """A ps-lite node of the test's own, to read each server's statistics."""

    def __init__(self, root_port: int, servers: int):
        self.kv = start_worker(NodeSettings(role="worker", root_uri="127.0.0.1", root_port=root_port,
                                            num_server=servers, num_worker=2, elastic_workers=True,
                                            heartbeat_interval=0.5), timeout=60)

    def stats(self) -> list[dict] | None:
        out = []
        for sid in self.kv.po.server_ids():
            try:
                ts = self.kv.request(pc.HEAD_STATS, b"", sid)
                out.append(orjson.loads(self.kv.wait(ts, 3.0)[0].body))
            except Exception:   # a server is down
                return None
        return out

    def close(self) -> None:
        self.kv.po.leave()


def _ledger(stats: list[dict] | None) -> dict | None:
    return stats[0].get("ledger") if stats else None



def _warnings(logs: Path, last: int = 12) -> str:
    """The last warnings and errors of every worker's log: what a failed assertion shows of a stuck worker."""
    out = []
    for path in sorted(logs.glob("livevec-worker-*.log")):
        lines = [line for line in path.read_text(errors="replace").splitlines()
                 if "level=warning" in line or "level=error" in line]
        out += [f"--- {path.name}"] + [line[:300] for line in lines[-last:]]
    return "\n".join(out)

@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("sync_ms,host_replica", [("250", False), ("1500", False), ("1500", True)],
                         ids=["sync-250ms", "unsynced-deltas-at-kill", "host-replica-unsynced-at-kill"])
def test_kill_each_role_then_every_record_is_trained_exactly_once(kafka_bootstrap, kafka_topic, tmp_path, sync_ms,
                                                                  host_replica):
    """``host_replica``: the two workers share one replica in shared memory (``online.cluster.host_replica``),
    so a sync of either sends what both trained, and the one killed leaves its unsynced work in it."""
    topic = kafka_topic(partitions=4, prefix="ckpt")
    lines = generate_lines(4800, seed=7)
    # 1200 records over ~40 s; the last 150 trickle until the faults are done, so each worker killed holds work
    producer = Producer(kafka_bootstrap, topic, lines, rate=30.0, reserve=150)
    tokens_expected = sum(len(s) for s in Tokenizer("text8").sentences_of(producer.records))
    env = {"PS_HEARTBEAT_INTERVAL": "0.5", "PS_HEARTBEAT_TIMEOUT": "3", "LIVEVEC_CHECKPOINT_INTERVAL": "2",
           "LIVEVEC_DIM": "24", "LIVEVEC_MIN_COUNT": "3", "LIVEVEC_KAFKA_BATCH_RECORDS": "15",
           "LIVEVEC_KAFKA_SESSION_TIMEOUT_MS": "6000", "LIVEVEC_REQUEST_TIMEOUT": "4",
           "LIVEVEC_KAFKA_GROUP": f"g-{uuid.uuid4().hex[:8]}", "LIVEVEC_SYNC_INTERVAL": "0.3",
           "LIVEVEC_LOG_LEVEL": "INFO", "LIVEVEC_SYNC_MS": sync_ms, "LIVEVEC_SYNC_TOKENS": "100000000"}
    # the deploy files share one replica per host; the other cases test a replica per worker process
    env["LIVEVEC_HOST_REPLICA"] = str(tmp_path / "shm") if host_replica else ""   # a tmpfs, mounted below
    if host_replica:
        env["LIVEVEC_HOST_REPLICA_ROWS"] = "20000"
        (tmp_path / "shm").mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(tmp_path / "shm")], check=True)
    runner = local_cluster(tmp_path / "run", kafka_bootstrap, topic, servers=2, workers=2, env=env)
    store = CheckpointStore(tmp_path / "run" / "shared" / "livevec" / "checkpoints")
    probe = watcher = None
    rng = random.Random(8)
    try:
        runner.start()
        assert runner.wait_healthy(timeout=120), "cluster did not become healthy"
        probe = ClusterProbe(runner.port("scheduler", "ps"), servers=2)
        watcher = Watcher(lambda: runner.url("frontend", "http"))
        watcher.start()
        producer.start()
        wait_until(lambda: (_ledger(probe.stats()) or {}).get("records", 0) > 100, 90, interval=0.25,
                   message="training to start")
        wait_until(lambda: store.latest_complete(check_data=False), 60, interval=0.25,
                   message="a first checkpoint")
        if host_replica:   # both workers of this host train one replica
            assert [p.suffix for p in (tmp_path / "shm").iterdir()].count(".replica") == 1

        def recovered_after(kill_time: float, loaded_before: list):
            stats = probe.stats()
            if not stats or any(s.get("recovering") for s in stats):
                return False
            # every server reloaded a checkpoint since the kill (a new epoch), and training goes on
            return [s["epoch"] for s in stats] if all(
                s["epoch"] != e for s, e in zip(stats, loaded_before)) else False

        for app, index in [("worker", 0), ("server", 1), ("scheduler", 0), ("worker", 1), ("server", 0), ("frontend", 0)]:
            time.sleep(rng.uniform(0.5, 2.5))
            before = wait_until(probe.stats, 30, interval=0.25,
                                message="all servers answering")
            epochs = [s["epoch"] for s in before]
            if app == "worker" and sync_ms != "250":
                # kill -9 a worker holding trained batches whose deltas the servers have not seen
                def unsynced() -> bool:
                    try:
                        return runner_metric(runner, "worker", "livevec_worker_unsynced_tokens", index) > 0
                    except OSError:   # its metrics port is not up (yet)
                        return False
                wait_until(unsynced, 30, interval=0.05, message=f"worker#{index} holding unsynced deltas")
            t_kill = time.monotonic()
            assert runner.kill_task(app, index) is not None, f"{app}#{index} was not running"
            if app == "frontend":
                watcher.killed_at = time.monotonic()
                continue
            if (app, index) == ("server", 0):
                # Damage the newest checkpoint while the server is down (none can complete meanwhile):
                # the rollback must skip it, say so, and fall back to the previous one.
                time.sleep(0.5)
                damaged = store.latest_complete(check_data=False)
                shard_file = damaged.shard_path(0)
                data = bytearray(shard_file.read_bytes())
                data[len(data) // 2] ^= 0xFF
                shard_file.write_bytes(bytes(data))
            wait_until(lambda: recovered_after(t_kill, epochs), 90, interval=0.25,
                       message=f"recovery from killing {app}#{index}")
        producer.release.set()

        log = (tmp_path / "run" / "logs" / "livevec-scheduler-0.log").read_text()
        assert f"event=checkpoint_skipped id={damaged.id} " in log and "checksum mismatch" in log
        assert "event=rollback_done to=" in log
        # the replica exchange's checkpoints held syncs only (a shared replica's: every sync of the host):
        # no worker stopped training for them
        done_lines = [line for line in log.splitlines() if "event=checkpoint_done " in line]
        assert done_lines and all("training_pause_ms=0.0 " in line for line in done_lines), done_lines[:3]
        producer.join(timeout=120)
        assert producer.error is None and producer.sent == len(producer.records)
        assert_trained_exactly_once(probe.stats, topic, len(producer.records), tokens_expected,
                                    idle=lambda: coordinator_idle(runner))
        # the planted neighbours are found, through the front end
        assert runner.wait_healthy(["frontend"], timeout=60)
        # and /v1/stats counts what was trained: every token, once
        wait_until(lambda: (lambda r: r[0] == 200 and r[1].get("words_trained") == tokens_expected)(
            watcher.ask("/v1/stats")), 30, interval=0.5,
                   message=f"/v1/stats to count the {tokens_expected} tokens trained")

        seen = {}

        def neighbours_found():
            found = 0
            for group in planted_groups():
                code, body = watcher.ask(f"/v1/similar?word={group[0]}&k=4")
                seen[group[0]] = (code, [n["word"] for n in body.get("neighbours", [])] if code == 200 else body)
                if code == 200 and {n["word"] for n in body["neighbours"]} & set(group):
                    found += 1
            return found >= 6 or seen

        deadline = time.monotonic() + 60
        while neighbours_found() is not True:
            assert time.monotonic() < deadline, f"planted neighbours not found through the front end: {seen}"
            time.sleep(1.0)
        watcher.stop.set()
        watcher.join(timeout=10)
        assert not watcher.errors_5xx, watcher.errors_5xx[:5]
        assert watcher.codes.get(200, 0) > 50
        assert watcher.saw_recovering, "the front end's /v1/stats never said the cluster was recovering"
        # on demand, through the request file the coordinator watches; then verify and export it
        done = _cli("--dir", str(store.root), "now", "--timeout", "60")
        assert done.returncode == 0 and json.loads(done.stdout)["ok"], done.stdout + done.stderr + _warnings(
            tmp_path / "run" / "logs")
        assert _cli("--dir", str(store.root), "verify", str(json.loads(done.stdout)["id"])).returncode == 0
        exported = _cli("--dir", str(store.root), "export", "--out", str(tmp_path / "export"))
        assert exported.returncode == 0, exported.stderr
        header = (tmp_path / "export" / "vectors.txt").read_text().split("\n", 1)[0]
        assert header.split()[1] == "24" and int(header.split()[0]) > 50
    finally:
        if watcher is not None:
            watcher.stop.set()
        if probe is not None:
            probe.close()
        runner.stop()
        if host_replica:
            left = sorted(p.name for p in (tmp_path / "shm").iterdir())
            subprocess.run(["umount", "-l", str(tmp_path / "shm")], check=False)
            # the last worker removed the data file, its member files and its lock files
            assert not [name for name in left if name.endswith(".replica") or ".member" in name], left


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_batch_of_only_malformed_records_is_processed_like_any_other(kafka_bootstrap, kafka_topic, tmp_path):
    """A malformed record that arrives alone makes a batch with nothing to train. Its offsets must still
    reach the ledger, the commit and the checkpoint's positions: a batch left out held its partition's
    frontier back for good, so every later checkpoint stored an offset below what the ledger had passed,
    and the next rollback trained those records twice (the 4-host soak's 1,157 duplicates)."""
    from aiokafka import AIOKafkaProducer

    topic = kafka_topic(partitions=1, prefix="malformed")
    env = {"PS_HEARTBEAT_INTERVAL": "0.5", "PS_HEARTBEAT_TIMEOUT": "3", "LIVEVEC_CHECKPOINT_INTERVAL": "1",
           "LIVEVEC_DIM": "16", "LIVEVEC_MIN_COUNT": "2", "LIVEVEC_KAFKA_GROUP": f"g-{uuid.uuid4().hex[:8]}",
           "LIVEVEC_SYNC_MS": "200", "LIVEVEC_LOG_LEVEL": "INFO"}
    runner = local_cluster(tmp_path / "run", kafka_bootstrap, topic, servers=1, workers=1, env=env)
    store = CheckpointStore(tmp_path / "run" / "shared" / "livevec" / "checkpoints")
    lines = generate_lines(120, seed=3)
    good = ["\n".join(lines[i:i + LINES_PER_RECORD]).encode() for i in range(0, len(lines), LINES_PER_RECORD)]

    async def produce(values):
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            for value in values:
                await producer.send_and_wait(topic, value, partition=0)
        finally:
            await producer.stop()

    probe = None
    try:
        runner.start()
        assert runner.wait_healthy(timeout=120), "cluster did not become healthy"
        probe = ClusterProbe(runner.port("scheduler", "ps"), servers=1)
        asyncio.run(produce(good[:20]))
        frontier = lambda: ((_ledger(probe.stats()) or {}).get("frontier") or {}).get(f"{topic}/0")  # noqa: E731
        wait_until(lambda: frontier() == 20, 90, interval=0.25, message="the first 20 records trained")
        asyncio.run(produce([b"\xff\xfe not utf-8"]))      # offset 20, alone in its batch
        wait_until(lambda: runner_metric(runner, "worker", "livevec_stream_malformed_total") == 1, 30,
                   interval=0.1, message="the worker to read the malformed record")
        asyncio.run(produce(good[20:30]))
        wait_until(lambda: frontier() == 31, 60, interval=0.25, message="the last 10 records trained")
        ledger = wait_until(lambda: (lambda led: led if led and coordinator_idle(runner) else False)(
            _ledger(probe.stats())), 30, interval=0.25, message="the coordinator idle")
        assert ledger["gaps"] == 0 and ledger["overlaps"] == 0, ledger
        assert ledger["offsets"] == 31 and ledger["records"] == 30, ledger
        # the checkpoint's position covers the malformed record: a rollback resumes after it
        done = _cli("--dir", str(store.root), "now", "--timeout", "60")
        assert done.returncode == 0 and json.loads(done.stdout)["ok"], done.stdout + done.stderr + _warnings(
            tmp_path / "run" / "logs")
        assert store.latest_complete(check_data=False).offsets == {topic: {"0": 31}}
    finally:
        if probe is not None:
            probe.close()
        runner.stop()

