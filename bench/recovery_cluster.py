"""A local livevec cluster for the recovery benchmarks (``bench/soak.py``, ``bench/checkpoint_numbers.py``).

The production Marathon group run by the local Marathon-like runner (a killed task is
relaunched), a Kafka broker, a producer thread, and a ps-lite probe node that reads the
servers' statistics (server 0's batch ledger: what was trained, exactly once or not).
"""
from __future__ import annotations

import asyncio
import dataclasses
import re
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from online.cluster import ps_commands as pc  # noqa: E402
from online.checkpoint.store import CheckpointStore, read_shard_file  # noqa: E402
from online.stream.kafka_broker import KafkaBroker, KafkaBrokerSettings, _free_port  # noqa: E402
from online.stream.producer import ensure_topic  # noqa: E402
from online.stream.sample_corpus import planted_groups  # noqa: E402
from online.cli.up import local_cluster  # noqa: E402
from ps_bridge.roles import start_worker  # noqa: E402
from ps_bridge.settings import NodeSettings  # noqa: E402

FAST_RECOVERY_ENV = {
    "PS_HEARTBEAT_INTERVAL": "0.5", "PS_HEARTBEAT_TIMEOUT": "3", "LIVEVEC_KAFKA_SESSION_TIMEOUT_MS": "6000",
    "LIVEVEC_REQUEST_TIMEOUT": "5", "LIVEVEC_SYNC_INTERVAL": "0.5", "LIVEVEC_LOG_LEVEL": "INFO",
}


def start_broker(host: str = "127.0.0.1") -> KafkaBroker:
    broker = KafkaBroker(dataclasses.replace(KafkaBrokerSettings.from_env(), host=host, port=0, data_dir=None,
                                             state_file=None))
    broker.start()
    return broker


class RestartableBroker:
    """A broker on a fixed address, port and data directory that can be killed with SIGKILL and started again
    from the same directory, as an operator's restart (``tests/test_kafka_outage.py``'s broker, for the soak)."""

    def __init__(self, data_dir: Path, host: str = "127.0.0.1"):
        self.settings = dataclasses.replace(KafkaBrokerSettings.from_env(), host=host, port=_free_port(host),
                                            data_dir=Path(data_dir), state_file=None)
        self.broker: KafkaBroker | None = None
        self.restarting: threading.Thread | None = None   # a restart under way in a thread (the soak's)

    @property
    def bootstrap(self) -> str:
        return f"{self.settings.host}:{self.settings.port}"

    def running(self) -> bool:
        return self.broker is not None and self.broker.is_running()

    def start(self) -> float:
        """Start (or restart from the same data directory); the seconds until it answered."""
        self.broker = KafkaBroker(self.settings)
        self.broker.start()
        return self.broker.start_seconds

    def kill(self) -> None:
        self.broker.kill()

    def stop(self) -> None:
        if self.broker is not None:
            self.broker.stop(grace=10.0)


def new_topic(bootstrap: str, partitions: int = 4) -> str:
    topic = f"bench-{uuid.uuid4().hex[:10]}"
    asyncio.run(ensure_topic(bootstrap, topic, partitions))
    return topic


class Producer(threading.Thread):
    """Sends ``records`` round-robin over the partitions at ``rate`` records/s (None: as fast as possible)."""

    def __init__(self, bootstrap: str, topic: str, records, rate: float | None, partitions: int = 4):
        super().__init__(name="bench-producer", daemon=True)
        self.bootstrap, self.topic, self.records, self.rate, self.partitions = bootstrap, topic, records, rate, partitions
        self.sent = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            self.error = exc

    async def _run(self) -> None:
        from aiokafka import AIOKafkaProducer

        # idempotent, and a request timeout longer than a broker restart: a batch the killed broker wrote but did
        # not acknowledge is not written twice, and none expires while the broker is down
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=5,
                                    enable_idempotence=True, request_timeout_ms=180000)
        await producer.start()
        try:
            t0 = time.monotonic()
            pending = []
            for i, record in enumerate(self.records):
                if self.stop.is_set():
                    break
                value = record if isinstance(record, bytes) else record.encode()   # bytes: sent as they are
                pending.append(await producer.send(self.topic, value, partition=i % self.partitions))
                if len(pending) >= 200:
                    await asyncio.gather(*pending)
                    self.sent += len(pending)
                    pending = []
                if self.rate:
                    delay = t0 + (i + 1) / self.rate - time.monotonic()
                    if delay > 0:
                        await asyncio.gather(*pending)
                        self.sent += len(pending)
                        pending = []
                        await asyncio.sleep(delay)
            await asyncio.gather(*pending)
            self.sent += len(pending)
        finally:
            await producer.stop()


class Probe:
    """A ps-lite node of the benchmark's own (an elastic worker that trains nothing)."""

    def __init__(self, root_port: int, servers: int):
        self.kv = start_worker(NodeSettings(role="worker", root_uri="127.0.0.1", root_port=root_port,
                                            num_server=servers, num_worker=1, elastic_workers=True,
                                            heartbeat_interval=0.5), timeout=120)

    def stats(self, timeout: float = 3.0) -> list[dict] | None:
        out = []
        for sid in self.kv.po.server_ids():
            try:
                out.append(orjson.loads(self.kv.wait(self.kv.request(pc.HEAD_STATS, b"", sid), timeout)[0].body))
            except Exception:   # noqa: BLE001 - a server is down
                return None
        return out

    def ledger(self) -> dict | None:
        stats = self.stats()
        return stats[0].get("ledger") if stats else None

    def close(self) -> None:
        try:
            self.kv.po.leave()
        except Exception:   # noqa: BLE001
            pass


class Cluster:
    """Scheduler, servers, workers and front end from the Marathon group, plus the probe."""

    def __init__(self, work: Path, bootstrap: str, topic: str, *, servers: int = 2, workers: int = 2,
                 env: dict | None = None, lab=None, agents: int | None = None, volumes: dict | None = None,
                 store_root: Path | None = None, store_io_timeout: float | None = None):
        """With ``lab`` (a started NetnsLab) the group runs on its first ``agents`` hosts and the probe on
        the last one, which nothing in the group uses (so a partition of a group host never hides the ledger).
        ``volumes``: the runner's (a MooseFS lab's ``volumes()``), and ``store_root`` where this process sees the
        checkpoints then (the operator's mount), read with ``store_io_timeout`` per call."""
        self.work = work
        self.servers = servers
        self.lab = lab
        self.env = {**FAST_RECOVERY_ENV, "LIVEVEC_KAFKA_GROUP": f"g-{uuid.uuid4().hex[:8]}", **(env or {})}
        self.runner = local_cluster(work / "run", bootstrap, topic, servers=servers, workers=workers, env=self.env,
                                    lab=lab, agents=agents, volumes=volumes)
        self.store = CheckpointStore(store_root or work / "run" / "shared" / "livevec" / "checkpoints",
                                     io_timeout=store_io_timeout)
        self.probe: Probe | None = None

    def start(self, timeout: float = 180) -> None:
        self.runner.start()
        if not self.runner.wait_healthy(timeout=timeout):
            raise RuntimeError("cluster did not become healthy")
        if self.lab is None:
            self.probe = Probe(self.runner.port("scheduler", "ps"), self.servers)
        else:
            from tests.support.stats_probe import StatsProbe
            self.probe = StatsProbe(self.lab, self.lab.hosts[-1].address, self.runner.placement[("/livevec/scheduler", 0)],
                                    self.runner.port("scheduler", "ps"), self.servers)

    def stop(self) -> None:
        if self.probe is not None:
            self.probe.close()
        self.runner.stop()

    def log_events(self, app: str, event: str, index: int = 0) -> list[dict]:
        """``key=value`` fields of every ``event=...`` line of a task's log."""
        path = self.runner.log_dir / f"livevec-{app}-{index}.log"
        out = []
        if not path.exists():
            return out
        for line in path.read_text(errors="replace").splitlines():
            if f"event={event} " in line or line.endswith(f"event={event}"):
                out.append(dict(re.findall(r'(\w+)=("[^"]*"|\S+)', line)))
        return out

    def wait(self, predicate, timeout: float, what: str, interval: float = 0.25):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(interval)
        raise TimeoutError(f"waiting for {what}")

    def checkpoint_now(self, timeout: float = 120) -> dict:
        request = self.store.add_request("bench")
        done = request.with_name(request.name[:-5] + ".done.json")
        self.wait(done.is_file, timeout, "the checkpoint")
        return orjson.loads(done.read_bytes())


def planted_quality(store: CheckpointStore, k: int = 5) -> float:
    """Share of each planted group's other members among a member's k nearest neighbours, from
    the latest complete checkpoint's input vectors (cosine), averaged over all members."""
    ckpt = store.latest_complete()
    words, vecs = [], []
    for rank in range(ckpt.num_servers):
        st = read_shard_file(ckpt.shard_path(rank))
        pos = np.searchsorted(st.keys, st.word_keys)
        ok = pos < len(st.keys)
        ok[ok] = st.keys[pos[ok]] == st.word_keys[ok]
        words += [st.words[i] for i in np.flatnonzero(ok).tolist()]
        vecs.append(st.vectors[pos[ok]])
    m = np.concatenate(vecs).astype(np.float64)
    m /= np.linalg.norm(m, axis=1, keepdims=True) + 1e-12
    index = {w: i for i, w in enumerate(words)}
    scores = []
    for group in planted_groups():
        for w in group:
            if w not in index:
                scores.append(0.0)
                continue
            sims = m @ m[index[w]]
            sims[index[w]] = -np.inf
            top = {words[i] for i in np.argsort(-sims)[:k]}
            scores.append(len(top & (set(group) - {w})) / min(k, len(group) - 1))
    return float(np.mean(scores))
