"""The committed Marathon group, brought up by the local runner with the real roles, trains
from a real Kafka broker and serves the planted neighbours through the front end.

This is the deploy files' end-to-end test: the commands, env, ports, Mesos-DNS name,
dependencies and health checks in deploy/marathon/livevec-group.json are what run here;
only Kafka's address, the shared directory and a few sizes are overridden.
"""
from __future__ import annotations

import collections
import signal
import time
from pathlib import Path

import pytest

from online.deployment.local_runner import LocalRunner, describe
from online.deployment.marathon import GROUP_FILE
from online.stream.producer import produce
from online.stream.sample_corpus import generate_lines, planted_groups
from tests.cluster_harness import runner_metric
from tests.support.http import get

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def _wait(predicate, timeout: float, what: str, runner: LocalRunner):
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError as exc:  # a process restarting, a port not yet open
            last_error = exc
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what} (last error: {last_error})\n{describe(runner.status())}")


def _planted_hits(frontend_url: str) -> float:
    hits = total = 0
    for group in planted_groups():
        for word in group:
            total += len(group) - 1
            answer = get(f"{frontend_url}/v1/similar?word={word}&k={len(group) - 1}")
            if answer.status and not answer.ok:   # not in the vocabulary yet
                continue
            found = answer.json()
            hits += len({n["word"] for n in found["neighbours"]} & set(group))
    return hits / total


def test_marathon_group_trains_and_serves_through_the_local_runner(tmp_path, kafka_bootstrap, kafka_topic):
    topic = kafka_topic(4)
    lines = generate_lines(30_000, seed=7)
    produce(lines, bootstrap=kafka_bootstrap, topic=topic, lines_per_record=20, create_topic=False)
    expected_tokens = sum(collections.Counter(t for line in lines for t in line.split()).values())
    runner = LocalRunner.from_file(
        REPO / "deploy" / "marathon" / GROUP_FILE, work_dir=tmp_path / "run",
        instances={"server": 2, "worker": 2, "frontend": 1},
        env={"LIVEVEC_KAFKA_BOOTSTRAP": kafka_bootstrap, "LIVEVEC_KAFKA_TOPICS": topic,
             "LIVEVEC_KAFKA_GROUP": f"g-{topic}", "LIVEVEC_DIM": "32", "LIVEVEC_MIN_COUNT": "3",
             "LIVEVEC_KAFKA_BATCH_RECORDS": "50", "PS_HEARTBEAT_INTERVAL": "1", "PS_HEARTBEAT_TIMEOUT": "10"},
        app_env={"frontend": {"LIVEVEC_HTTP_HOST": "127.0.0.1"}},
        volumes={"/mnt/mfs/livevec": tmp_path / "mfs"}, dependency_timeout=90)
    with runner:
        assert runner.wait_healthy(timeout=120), describe(runner.status())
        _wait(lambda: sum(runner_metric(runner, "worker", "livevec_worker_tokens_total", i) for i in range(2))
              >= expected_tokens, 180, "every produced token to be trained", runner)
        assert all(runner_metric(runner, "server", "livevec_server_words", i) > 0 for i in range(2))
        frontend = runner.url("frontend", "http")
        _wait(lambda: get(f"{frontend}/ready").json() and _planted_hits(frontend) >= 0.9, 60,
              "the front end to serve the planted neighbours", runner)
        # /v1/stats reads the servers' counters once a second (LIVEVEC_STATS_INTERVAL), so the
        # first figures may predate the counts the workers pushed; they must arrive soon after.
        _wait(lambda: (get(f"{frontend}/v1/stats").json()["words_trained"] or 0) > 0, 30,
              "the front end's stats to count trained words", runner)
        assert get(f"{frontend}/v1/stats").json()["vocab_size"] > 0

        # A worker killed with SIGKILL is relaunched by the runner (Marathon's job) and rejoins.
        worker = next(s for s in runner.status() if s.app == "worker" and s.index == 0)
        runner.kill_task("worker", 0, signal.SIGKILL)
        _wait(lambda: next(s for s in runner.status() if s.app == "worker" and s.index == 0).launches
              == worker.launches + 1, 30, "the worker to be relaunched", runner)
        assert runner.wait_healthy(["worker"], timeout=120), describe(runner.status())
        assert all(s.launches == 1 for s in runner.status() if s.app != "worker")
        pids = [s.pid for s in runner.status() if s.pid]
    gone = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                gone.append(f.read().split(")")[-1].split()[0] == "Z")
        except FileNotFoundError:
            gone.append(True)
    assert all(gone), "tasks left running after stop()"
