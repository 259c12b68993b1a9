"""Many hosts, not one: the committed Marathon group across network-namespace hosts, with partitions.

Each host is a network namespace with its own address (198.18.0.0/15), its own /etc/hosts resolving
the Mesos-DNS names, and a link that can go down while its processes keep running (see
``online.deployment.netns_lab``). The tasks are placed as Mesos would place them, honouring the
group's constraints (``online.deployment.lab_placement``). Kafka listens on the lab's bridge.

The long test trains a planted corpus while it cuts, in turn, a server's host, a worker's host and
the scheduler's host, and kills every process of one host; it then checks the batch ledger: every
produced record trained exactly once relative to the restored checkpoints (0 twice, 0 skipped),
the planted neighbours found through the front end, and no 5xx from it at any time.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from online.deployment.lab_placement import Agent, PlacementError, check_placement, place_tasks
from online.deployment.lab_runner import lab_cluster
from online.deployment.local_runner import describe
from tests.support.stats_probe import StatsProbe
from online.deployment.topology import default_topology
from online.learner.tokenizers import Tokenizer
from online.stream.kafka_broker import KafkaBroker
from online.stream.sample_corpus import generate_lines, planted_groups
from online.stream.settings import KafkaBrokerSettings
from tests.cluster_harness import assert_trained_exactly_once, coordinator_idle, netns_lab, runner_metric, wait_until
from tests.test_checkpoint_recovery import Producer, Watcher

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- placement (pure)

def _agents(n):
    return [Agent(f"198.18.9.{i}", {"moosefs": "true"}) for i in range(1, n + 1)]


def test_placement_honours_unique_and_max_per_and_spreads():
    apps = [("/g/scheduler", 1, [["moosefs", "IS", "true"]]),
            ("/g/server", 4, [["hostname", "UNIQUE"], ["moosefs", "IS", "true"]]),
            ("/g/worker", 6, [["hostname", "MAX_PER", "2"]]),
            ("/g/frontend", 2, [["hostname", "MAX_PER", "1"]])]
    placed = place_tasks(apps, _agents(4))
    assert check_placement(placed, {a: c for a, _, c in apps}) == []
    servers = [placed[("/g/server", i)].hostname for i in range(4)]
    assert len(set(servers)) == 4
    load = {}
    for agent in placed.values():
        load[agent.hostname] = load.get(agent.hostname, 0) + 1
    assert max(load.values()) - min(load.values()) <= 1, load   # 13 tasks over 4 hosts: 4/3/3/3


def test_a_group_that_cannot_be_placed_is_refused_naming_the_app():
    with pytest.raises(PlacementError) as err:
        place_tasks([("/g/server", 3, [["hostname", "UNIQUE"]])], _agents(2))
    assert "/g/server" in str(err.value) and "UNIQUE" in str(err.value) and "instance 3 of 3" in str(err.value)
    with pytest.raises(PlacementError) as err:   # an attribute no agent has
        place_tasks([("/g/scheduler", 1, [["rack", "IS", "r1"]])], _agents(2))
    assert "/g/scheduler" in str(err.value)
    with pytest.raises(PlacementError):
        place_tasks([("/g/x", 1, [["hostname", "SOMETIMES"]])], _agents(1))
    assert check_placement({("/g/s", 0): _agents(1)[0], ("/g/s", 1): _agents(1)[0]},
                           {"/g/s": [["hostname", "UNIQUE"]]})


@pytest.mark.root   # unshare --user, and `ip netns`
def test_without_root_the_lab_stops_with_a_clear_message_and_changes_nothing():
    # `unshare --user`: the same files (it may read a checkout only root can), but no root and no capabilities
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    code = ("import sys; from online.deployment.netns_lab import NetnsLab, LabUnavailable\n"
            "try:\n    NetnsLab(2, lab_id=201).start()\nexcept LabUnavailable as e:\n    print(e); sys.exit(3)\n")
    done = subprocess.run(["unshare", "--user", sys.executable, "-c", code],
                          cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO), "HOME": "/tmp"})
    assert done.returncode == 3, done.stdout + done.stderr
    assert "needs root" in done.stdout
    assert subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout == before


@pytest.mark.root   # unshare --user
def test_livevec_up_hosts_names_the_setting_when_the_lab_cannot_run():
    done = subprocess.run(["unshare", "--user", sys.executable, "-m",
                           "online.cli", "up", "--hosts", "4"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO), "HOME": "/tmp"})
    assert done.returncode != 0 and "--hosts" in done.stderr and "needs root" in done.stderr, done.stderr[-500:]
    assert "starting Kafka" not in done.stderr           # stopped before anything started
    done = subprocess.run([sys.executable, "-m", "online.cli", "up", "--link", "1gbit"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "--link" in done.stderr and "--hosts" in done.stderr, done.stderr[-500:]
    done = subprocess.run([sys.executable, "-m", "online.cli", "up", "--hosts", "2", "--link", "fast"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "--link" in done.stderr and "1gbit" in done.stderr, done.stderr[-500:]


# ----------------------------------------------------------------------------- the 4-host cluster

@pytest.fixture(scope="module")
def lab():
    with netns_lab(4, range(100, 200)) as lab:
        yield lab


@pytest.fixture(scope="module")
def lab_kafka(lab, tmp_path_factory):
    settings = dataclasses.replace(KafkaBrokerSettings.from_env(), host=lab.bridge_address, port=0,
                                   data_dir=tmp_path_factory.mktemp("lab-kafka"), state_file=None)
    broker = KafkaBroker(settings)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def _ledger(stats):
    return stats[0].get("ledger") if stats else None


def _host_of(runner, app: str, index: int = 0) -> str:
    return runner.placement[(f"/livevec/{app}", index)]


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.timeout(600)
def test_four_hosts_train_serve_and_survive_partitions_and_a_host_loss(lab, lab_kafka, tmp_path):
    topic = "lab-text"
    lines = generate_lines(4800, seed=11)
    producer = Producer(lab_kafka.bootstrap, topic, lines, rate=20.0)     # 1200 records over ~60 s
    from online.stream.producer import produce
    produce([], bootstrap=lab_kafka.bootstrap, topic=topic, partitions=4, create_topic=True)
    tokens_expected = sum(len(s) for s in Tokenizer("text8").sentences_of(producer.records))
    env = {"LIVEVEC_KAFKA_BOOTSTRAP": lab_kafka.bootstrap, "LIVEVEC_KAFKA_TOPICS": topic,
           "PS_HEARTBEAT_INTERVAL": "0.5", "PS_HEARTBEAT_TIMEOUT": "3", "LIVEVEC_CHECKPOINT_INTERVAL": "2",
           "LIVEVEC_DIM": "24", "LIVEVEC_MIN_COUNT": "3", "LIVEVEC_KAFKA_BATCH_RECORDS": "15",
           "LIVEVEC_KAFKA_SESSION_TIMEOUT_MS": "6000", "LIVEVEC_REQUEST_TIMEOUT": "4",
           "LIVEVEC_SYNC_INTERVAL": "0.3", "LIVEVEC_LOG_LEVEL": "INFO"}
    runner = lab_cluster(lab, default_topology(servers=2, workers=2, frontends=1), work_dir=tmp_path / "run",
                         env=env, app_env={"frontend": {"LIVEVEC_HTTP_HOST": "0.0.0.0", "LIVEVEC_MODEL_SOURCE": "ps"}},
                         instances={"server": 2, "worker": 2, "frontend": 1, "producer-example": 0},
                         volumes={"/mnt/mfs": tmp_path / "run" / "shared"})
    # Mesos-like placement over 4 hosts: the servers on two different hosts, every host used.
    assert _host_of(runner, "server", 0) != _host_of(runner, "server", 1)
    assert len(set(runner.placement.values())) == 4, runner.placement
    probe = watcher = None
    try:
        runner.start()
        assert runner.wait_healthy(timeout=150), describe(runner.status())
        # every task registered with its own host's address, found the scheduler by its Mesos-DNS name
        sched_log = _scheduler_log(tmp_path)
        for app, index in [("server", 0), ("server", 1), ("worker", 0), ("worker", 1)]:
            assert f"address={_host_of(runner, app, index)}:" in sched_log, (app, index)
        # the probe lives on the front end's host, which no step below cuts off
        probe = StatsProbe(lab, _host_of(runner, "frontend"), _host_of(runner, "scheduler"),
                           runner.port("scheduler", "ps"), servers=2)
        watcher = Watcher(lambda: runner.url("frontend", "http"))
        watcher.start()
        producer.start()
        wait_until(lambda: (_ledger(probe.stats()) or {}).get("records", 0) > 60, 120, interval=0.25,
                   message="training to start across the hosts")

        def records():
            return (_ledger(probe.stats()) or {}).get("records", 0)

        def settled():
            stats = probe.stats()
            return bool(stats) and not any(s.get("recovering") for s in stats)

        # 1. A partition of one server's host, longer than the heartbeat timeout: the scheduler declares
        #    it dead; when the link returns, it rejoins through recovery (a rollback), and checkpoints go on.
        server_host = _host_of(runner, "server", 1)
        alone = [k for k, h in runner.placement.items() if h == server_host]
        assert alone == [("/livevec/server", 1)], runner.placement   # only that server is cut off
        lab.partition(server_host)
        # the front end keeps answering from its last copy, and says that its source is out of reach
        said = wait_until(lambda: (lambda r: r[0] == 200 and r[1]["sync"]["source_reachable"] is False)(
            watcher.ask("/v1/stats")), 25, interval=0.5, message="the front end to say its source is unreachable")
        assert said
        code, body = watcher.ask("/v1/similar?word=paris&k=3")
        assert code in (200, 404), (code, body)   # answered from the copy it has (404: not learned yet)
        lab.heal(server_host)
        wait_until(lambda: "back after being declared dead" in
                   (tmp_path / "run" / "logs" / "livevec-scheduler-0.log").read_text(), 30, message="the rejoin")
        wait_until(settled, 90, interval=0.25, message="recovery after the server's partition")
        before = records()
        wait_until(lambda: records() > before, 60, message="training to go on after the server's partition")

        # 2. A partition of a worker's host: its Kafka partitions move to the other worker; its late
        #    pushes (ZeroMQ queues them and delivers them when the link returns) are fenced.
        worker_host = _host_of(runner, "worker", 0)
        assert [k for k, h in runner.placement.items() if h == worker_host] == [("/livevec/worker", 0)]
        lab.partition(worker_host)
        during = records()
        wait_until(lambda: records() > during + 20, 60, message="the other worker to take over while one is cut off")
        time.sleep(3.0)
        mark = len(_scheduler_log(tmp_path))
        lab.heal(worker_host)
        # back from the partition, the worker is taken in again by a rollback (until then it is fenced)
        wait_until(lambda: "event=node_adopted id=9" in _scheduler_log(tmp_path)[mark:] or
                   "event=node_adopted id=11" in _scheduler_log(tmp_path)[mark:], 60, message="the worker's return")
        wait_until(lambda: "workers=2" in "".join(line for line in _scheduler_log(tmp_path)[mark:].splitlines()
                                                   if "event=rollback_done" in line), 90,
                   message="a rollback taking both workers in")
        wait_until(settled, 90, interval=0.25, message="recovery after the worker's partition")

        # 3. A partition of the scheduler's host: training goes on without it (the workers and servers
        #    talk directly); the cluster checkpoints again once it is back.
        sched_host = _host_of(runner, "scheduler")
        lab.partition(sched_host)
        during = records()
        wait_until(lambda: records() > during + 20, 60, message="training to go on while the scheduler is cut off")
        mark = len(_scheduler_log(tmp_path))
        lab.heal(sched_host)
        # back, the scheduler takes the nodes it declared dead back from their heartbeats and rolls back once
        wait_until(lambda: "event=rollback_done" in _scheduler_log(tmp_path)[mark:], 90,
                   message="a rollback after the scheduler's partition")
        wait_until(settled, 90, interval=0.25, message="the cluster after the scheduler's partition")

        # 4. A host loss: kill -9 every process of the server's host; the runner relaunches them there.
        for (app_id, index), host in runner.placement.items():
            if host == server_host:
                runner.kill_task(app_id, index)
        wait_until(settled, 120, interval=0.25, message="recovery after the host loss")

        producer.join(timeout=180)
        assert producer.error is None and producer.sent == len(producer.records)
        ledger = assert_trained_exactly_once(probe.stats, topic, len(producer.records), tokens_expected,
                                             timeout=180, idle=lambda: coordinator_idle(runner))

        seen = {}

        def neighbours_found():
            found = 0
            for group in planted_groups():
                code, body = watcher.ask(f"/v1/similar?word={group[0]}&k=4")
                seen[group[0]] = code
                if code == 200 and {n["word"] for n in body["neighbours"]} & set(group):
                    found += 1
            return found >= 6

        wait_until(neighbours_found, 90, interval=1.0, message=f"the planted neighbours: {seen}")
        watcher.stop.set()
        watcher.join(timeout=10)
        assert not watcher.errors_5xx, watcher.errors_5xx[:5]
        assert watcher.codes.get(200, 0) > 50
        fenced = sum(runner_metric(runner, "server", "livevec_server_fenced_total", i) for i in range(2))
        sched_log = _scheduler_log(tmp_path)
        assert "event=node_dead" in sched_log and "event=rollback_done" in sched_log
        print(f"lab: fenced changes {fenced:.0f}; {ledger}")
    finally:
        if watcher is not None:
            watcher.stop.set()
        if probe is not None:
            probe.close()
        runner.stop()
        shutil.rmtree(tmp_path / "run" / "sandboxes", ignore_errors=True)


def _scheduler_log(tmp_path) -> str:
    return (tmp_path / "run" / "logs" / "livevec-scheduler-0.log").read_text()
