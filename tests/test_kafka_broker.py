"""The project's own Kafka broker: the session fixture, ``livevec kafka start|status|stop`` and its errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from online.stream.kafka_broker import is_our_broker
from online.stream.settings import KafkaBrokerSettings
from ps_bridge.settings import SettingError

REPO = Path(__file__).resolve().parents[1]


def livevec(*args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "online.cli", *args], cwd=REPO, capture_output=True, text=True,
                          env=env if env is not None else os.environ.copy(), timeout=timeout)


async def roundtrip(bootstrap: str, topic: str, values: list[bytes]) -> list[bytes]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"g-{uuid.uuid4().hex[:8]}",
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    seen: list[bytes] = []
    try:
        while len(seen) < len(values):
            batch = await consumer.getmany(timeout_ms=10000)
            if not batch:
                break
            for records in batch.values():
                seen.extend(r.value for r in records)
    finally:
        await consumer.stop()
    return seen


async def test_session_broker_serves_aiokafka(kafka_broker, kafka_topic):
    assert kafka_broker.is_running()
    assert kafka_broker.bootstrap.startswith("127.0.0.1:")
    topic = kafka_topic(partitions=1)
    values = [f"record {i}".encode() for i in range(20)]
    assert await roundtrip(kafka_broker.bootstrap, topic, values) == values


@pytest.mark.kafka   # starts a broker of its own
async def test_cli_start_prints_an_address_aiokafka_can_use_then_stops(tmp_path):
    state = tmp_path / "broker.json"
    started = livevec("kafka", "start", "--state-file", str(state))
    assert started.returncode == 0, started.stderr
    address = started.stdout.strip()
    assert address.startswith("127.0.0.1:") and address.split(":")[1].isdigit()
    recorded = json.loads(state.read_text())
    try:
        assert recorded["bootstrap"] == address
        assert is_our_broker(recorded["pid"], recorded["data_dir"])
        assert "kafka_broker_ready" in started.stderr and "seconds=" in started.stderr

        status = livevec("kafka", "status", "--state-file", str(state))
        assert status.returncode == 0 and address in status.stdout

        # A second start finds the running broker instead of starting another one.
        again = livevec("kafka", "start", "--state-file", str(state))
        assert again.returncode == 0 and again.stdout.strip() == address

        topic = f"cli-{uuid.uuid4().hex[:8]}"
        from online.stream.producer import ensure_topic

        await ensure_topic(address, topic, 1)
        assert await roundtrip(address, topic, [b"from the cli broker"]) == [b"from the cli broker"]
    finally:
        stopped = livevec("kafka", "stop", "--state-file", str(state))
    assert stopped.returncode == 0, stopped.stderr
    assert not is_our_broker(recorded["pid"], recorded["data_dir"])
    assert not Path(recorded["data_dir"]).exists()
    assert not state.exists()
    status = livevec("kafka", "status", "--state-file", str(state))
    assert status.returncode == 1 and "not running" in status.stdout


def test_missing_java_names_the_package_to_install(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(tmp_path)  # no java, no mvn
    result = livevec("kafka", "start", "--state-file", str(tmp_path / "s.json"), env=env)
    assert result.returncode == 1
    assert "install Java 17: apt-get install openjdk-17-jre-headless" in result.stderr


def test_missing_maven_names_the_package_to_install(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path), LIVEVEC_CACHE_DIR=str(tmp_path / "empty-cache"))
    result = livevec("kafka", "fetch", env=env)
    assert result.returncode == 1
    assert "install Maven: apt-get install maven" in result.stderr


def test_bad_settings_stop_at_start_naming_the_setting(tmp_path):
    result = livevec("kafka", "start", "--state-file", str(tmp_path / "s.json"),
                     env=dict(os.environ, LIVEVEC_KAFKA_HEAP="lots"))
    assert result.returncode == 2
    assert "LIVEVEC_KAFKA_HEAP" in result.stderr
    with pytest.raises(SettingError, match="LIVEVEC_KAFKA_VERSION"):
        KafkaBrokerSettings.from_env({"LIVEVEC_KAFKA_VERSION": "latest"})
    with pytest.raises(SettingError, match="LIVEVEC_KAFKA_PORT"):
        KafkaBrokerSettings.from_env({"LIVEVEC_KAFKA_PORT": "70000"})
    settings = KafkaBrokerSettings.from_env({"LIVEVEC_CACHE_DIR": str(tmp_path), "LIVEVEC_KAFKA_VERSION": "3.9.1"})
    assert settings.jars_dir == tmp_path / "kafka-3.9.1"
