"""Kafka over TLS and SASL: the settings, the check at start, and SASL_SSL end to end.

The session broker (``tests/conftest.py``) runs a SASL_SSL listener next to its plaintext one, with a CA and a
broker certificate made by ``openssl`` at the start of the session (``tests/kafka_tls.py``) and a SCRAM/PLAIN
user. What the clients do is looked at from the plaintext listener: a client that failed its check must
have created, consumed and committed nothing.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from online.stream.kafka_broker import scram_credentials
from online.stream.producer import produce
from online.stream.reader import KafkaStream
from online.stream.security import KafkaUnreachable, check_kafka, client_options
from online.stream.settings import (KAFKA_SECURITY, KafkaBrokerSettings, KafkaSecurity, Secret, StreamSettings,
                                    read_users_file)
from ps_bridge.settings import SettingError
from tests.cluster_harness import Cluster, read_model, wait_until
from tests.frontend_process import running_frontend
from tests.kafka_tls import client_env
from tests.support.ports import reserved_port

REPO = Path(__file__).resolve().parents[1]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIVEVEC_", "DMLC_", "PS_"))}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def _livevec(args: list[str], env: dict[str, str], timeout: float = 120, stdin: bytes | None = None):
    return subprocess.run([sys.executable, "-m", "online.cli", *args], cwd=REPO, env=_clean_env(**env),
                          input=stdin, capture_output=True, timeout=timeout)


def _security(env: dict[str, str]) -> KafkaSecurity:
    return KafkaSecurity.from_env(env)


# --------------------------------------------------------------------------- settings, no broker

SASL = {"LIVEVEC_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "LIVEVEC_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "LIVEVEC_KAFKA_SASL_USERNAME": "alice", "LIVEVEC_KAFKA_SASL_PASSWORD": "s3cret-Pa55"}


def test_plaintext_by_default_and_hostname_checking_on():
    security = _security({})
    assert (security.protocol, security.uses_ssl, security.uses_sasl) == ("PLAINTEXT", False, False)
    assert client_options(security) == {"security_protocol": "PLAINTEXT"}
    assert _security({"LIVEVEC_KAFKA_SECURITY_PROTOCOL": "SSL"}).check_hostname is True


@pytest.mark.parametrize("missing", ["LIVEVEC_KAFKA_SASL_MECHANISM", "LIVEVEC_KAFKA_SASL_USERNAME",
                                     "LIVEVEC_KAFKA_SASL_PASSWORD"])
def test_sasl_needs_mechanism_user_and_password(missing):
    with pytest.raises(SettingError) as err:
        _security({k: v for k, v in SASL.items() if k != missing})
    assert err.value.setting == missing and "required" in str(err.value)


def test_settings_of_a_protocol_not_in_use_are_ignored(tmp_path):
    # as in Kafka's clients: deploy files point at mounted secrets, and the protocol alone turns them on
    env = {"LIVEVEC_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "LIVEVEC_KAFKA_SASL_USERNAME": "alice",
           "LIVEVEC_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "not-mounted"),
           "LIVEVEC_KAFKA_SSL_CA_FILE": str(tmp_path / "not-mounted.pem")}
    plain = _security(env)
    assert (plain.protocol, plain.sasl_username, plain.sasl_password, plain.ssl_ca_file) == ("PLAINTEXT", None, None,
                                                                                            None)
    assert client_options(plain) == {"security_protocol": "PLAINTEXT"}
    with pytest.raises(SettingError) as err:
        _security({**env, "LIVEVEC_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"})
    assert err.value.setting == "LIVEVEC_KAFKA_SASL_PASSWORD_FILE"
    with pytest.raises(SettingError) as err:
        _security({**env, "LIVEVEC_KAFKA_SECURITY_PROTOCOL": "SSL"})
    assert err.value.setting == "LIVEVEC_KAFKA_SSL_CA_FILE"


def test_password_from_a_file_and_never_shown(tmp_path):
    secret_file = tmp_path / "password"
    secret_file.write_text("from-the-file-42\n")
    env = {**SASL, "LIVEVEC_KAFKA_SASL_PASSWORD": "", "LIVEVEC_KAFKA_SASL_PASSWORD_FILE": str(secret_file),
           "LIVEVEC_KAFKA_BOOTSTRAP": "127.0.0.1:9", "LIVEVEC_KAFKA_TOPICS": "t"}
    settings = StreamSettings.from_env(env)
    assert settings.security.sasl_password.reveal() == "from-the-file-42"
    assert settings.security.password_setting == "LIVEVEC_KAFKA_SASL_PASSWORD_FILE"
    shown = " ".join([repr(settings), str(settings), repr(settings.security), settings.security.describe(),
                      repr(settings.security.sasl_password), str(settings.security.sasl_password)])
    assert "from-the-file-42" not in shown
    assert client_options(settings.security)["sasl_plain_password"] == "from-the-file-42"
    with pytest.raises(SettingError) as err:
        _security({**SASL, "LIVEVEC_KAFKA_SASL_PASSWORD_FILE": str(secret_file)})
    assert "not both" in str(err.value) and "s3cret" not in str(err.value)
    with pytest.raises(SettingError) as err:
        _security({**SASL, "LIVEVEC_KAFKA_SASL_PASSWORD": "", "LIVEVEC_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "no")})
    assert err.value.setting == "LIVEVEC_KAFKA_SASL_PASSWORD_FILE"


def test_the_password_is_never_a_flag():
    parser = argparse.ArgumentParser()
    KAFKA_SECURITY.add_arguments(parser)
    assert "--kafka-sasl-password " not in parser.format_help() + " "
    with pytest.raises(SystemExit):
        parser.parse_args(["--kafka-sasl-password", "x"])
    for command in ("worker", "produce"):
        out = subprocess.run([sys.executable, "-m", "online.cli", command, "--help"], cwd=REPO, capture_output=True,
                             text=True, env=_clean_env(), timeout=60).stdout
        assert "LIVEVEC_KAFKA_SASL_PASSWORD" in out and "LIVEVEC_KAFKA_SASL_PASSWORD_FILE" in out
        assert "--kafka-sasl-password" not in out


def test_unreadable_or_bad_files_are_named(tmp_path):
    with pytest.raises(SettingError) as err:
        _security({"LIVEVEC_KAFKA_SECURITY_PROTOCOL": "SSL", "LIVEVEC_KAFKA_SSL_CA_FILE": str(tmp_path / "none")})
    assert err.value.setting == "LIVEVEC_KAFKA_SSL_CA_FILE"
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(SettingError) as err:
        client_options(_security({"LIVEVEC_KAFKA_SECURITY_PROTOCOL": "SSL", "LIVEVEC_KAFKA_SSL_CA_FILE": str(bad)}))
    assert err.value.setting == "LIVEVEC_KAFKA_SSL_CA_FILE"
    with pytest.raises(SettingError) as err:
        _security({"LIVEVEC_KAFKA_SECURITY_PROTOCOL": "SSL", "LIVEVEC_KAFKA_SSL_KEY_FILE": str(bad)})
    assert err.value.setting == "LIVEVEC_KAFKA_SSL_CERT_FILE"


def test_broker_settings_for_the_sasl_ssl_listener(tmp_path, kafka_tls):
    assert not KafkaBrokerSettings.from_env({}).sasl_ssl
    on = KafkaBrokerSettings.from_env({"LIVEVEC_KAFKA_BROKER_CERT_FILE": str(kafka_tls.broker_cert),
                                       "LIVEVEC_KAFKA_BROKER_KEY_FILE": str(kafka_tls.broker_key),
                                       "LIVEVEC_KAFKA_BROKER_USERS_FILE": str(kafka_tls.users_file)})
    assert on.sasl_ssl and on.sasl_ssl_port == 0
    with pytest.raises(SettingError) as err:
        KafkaBrokerSettings.from_env({"LIVEVEC_KAFKA_BROKER_CERT_FILE": str(kafka_tls.broker_cert),
                                      "LIVEVEC_KAFKA_BROKER_KEY_FILE": str(kafka_tls.broker_key)})
    assert err.value.setting == "LIVEVEC_KAFKA_BROKER_USERS_FILE"
    with pytest.raises(SettingError) as err:   # a client CA only means something on the TLS listener
        KafkaBrokerSettings.from_env({"LIVEVEC_KAFKA_BROKER_CLIENT_CA_FILE": str(kafka_tls.ca_file)})
    assert err.value.setting == "LIVEVEC_KAFKA_BROKER_CLIENT_CA_FILE"
    with pytest.raises(SettingError) as err:
        KafkaBrokerSettings.from_env({"LIVEVEC_KAFKA_BROKER_CLIENT_AUTH": "sometimes"})
    assert err.value.setting == "LIVEVEC_KAFKA_BROKER_CLIENT_AUTH"
    bad = tmp_path / "users"
    bad.write_text('alice:"quoted"\n')
    with pytest.raises(SettingError) as err:
        read_users_file(bad)
    assert "line 1" in str(err.value) and "quoted" not in str(err.value)
    # the format command line carries salted credentials only, never a password
    users = read_users_file(kafka_tls.users_file)
    credentials = scram_credentials(users)
    assert len(credentials) == 2 * len(users)
    assert all(kafka_tls.password not in c and "saltedpassword=" in c for c in credentials)


def test_secret_hides_itself():
    secret = Secret("hunter2")
    assert "hunter2" not in repr(secret) + str(secret) + f"{secret}" + json.dumps({"s": str(secret)})
    assert secret == Secret("hunter2") and secret.reveal() == "hunter2"


# --------------------------------------------------------------------------- the check, against the broker

@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_every_mechanism_authenticates_over_tls(kafka_broker, kafka_tls, mechanism):
    env = client_env(kafka_tls, kafka_broker.sasl_ssl_bootstrap, mechanism)
    brokers = asyncio.run(check_kafka(env["LIVEVEC_KAFKA_BOOTSTRAP"], _security(env)))
    assert brokers == [kafka_broker.sasl_ssl_bootstrap]


def _misconfigured(case: str, tls, broker) -> tuple[dict[str, str], str]:
    """(client environment, the setting its error must name)."""
    env = client_env(tls, broker.sasl_ssl_bootstrap)
    if case == "wrong password":
        return {**env, "LIVEVEC_KAFKA_SASL_PASSWORD_FILE": "", "LIVEVEC_KAFKA_SASL_PASSWORD": "not-it"}, \
            "LIVEVEC_KAFKA_SASL_PASSWORD"
    if case == "wrong password in the file":
        wrong = tls.directory / "wrong-password.txt"
        wrong.write_text("not-it\n")
        return {**env, "LIVEVEC_KAFKA_SASL_PASSWORD_FILE": str(wrong)}, "LIVEVEC_KAFKA_SASL_PASSWORD_FILE"
    if case == "unknown user":
        return {**env, "LIVEVEC_KAFKA_SASL_USERNAME": "mallory"}, "LIVEVEC_KAFKA_SASL_PASSWORD_FILE"
    if case == "untrusted CA":
        return {**env, "LIVEVEC_KAFKA_SSL_CA_FILE": str(tls.other_ca_file)}, "LIVEVEC_KAFKA_SSL_CA_FILE"
    if case == "system CAs":
        return {**env, "LIVEVEC_KAFKA_SSL_CA_FILE": ""}, "LIVEVEC_KAFKA_SSL_CA_FILE"
    if case == "host not in the certificate":
        return {**env, "LIVEVEC_KAFKA_BOOTSTRAP": f"127.0.0.1:{broker.sasl_ssl_port}"}, \
            "LIVEVEC_KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM"
    if case == "plaintext client, TLS listener":
        return {"LIVEVEC_KAFKA_BOOTSTRAP": broker.sasl_ssl_bootstrap}, "LIVEVEC_KAFKA_SECURITY_PROTOCOL"
    if case == "TLS client, plaintext listener":
        return {**env, "LIVEVEC_KAFKA_BOOTSTRAP": broker.bootstrap}, "LIVEVEC_KAFKA_SECURITY_PROTOCOL"
    raise AssertionError(case)


CASES = ["wrong password", "wrong password in the file", "unknown user", "untrusted CA", "system CAs",
         "host not in the certificate", "plaintext client, TLS listener", "TLS client, plaintext listener"]


@pytest.mark.parametrize("case", CASES)
def test_a_misconfiguration_names_its_setting(kafka_broker, kafka_tls, case):
    env, setting = _misconfigured(case, kafka_tls, kafka_broker)
    started = time.monotonic()
    with pytest.raises(SettingError) as err:
        asyncio.run(check_kafka(env["LIVEVEC_KAFKA_BOOTSTRAP"], _security(env), timeout=10))
    assert err.value.setting == setting, str(err.value)
    assert time.monotonic() - started < 10
    assert kafka_tls.password not in str(err.value) and "not-it" not in str(err.value)


def test_hostname_checking_can_be_turned_off(kafka_broker, kafka_tls):
    env = {**client_env(kafka_tls, f"127.0.0.1:{kafka_broker.sasl_ssl_port}"),
           "LIVEVEC_KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM": "none"}
    assert asyncio.run(check_kafka(env["LIVEVEC_KAFKA_BOOTSTRAP"], _security(env)))


def test_a_client_certificate_is_loaded_for_mutual_tls(kafka_broker, kafka_tls):
    env = {**client_env(kafka_tls, kafka_broker.sasl_ssl_bootstrap),
           "LIVEVEC_KAFKA_SSL_CERT_FILE": str(kafka_tls.client_cert),
           "LIVEVEC_KAFKA_SSL_KEY_FILE": str(kafka_tls.client_key)}
    assert asyncio.run(check_kafka(env["LIVEVEC_KAFKA_BOOTSTRAP"], _security(env)))
    with pytest.raises(SettingError) as err:   # a key that is not the certificate's
        client_options(_security({**env, "LIVEVEC_KAFKA_SSL_KEY_FILE": str(kafka_tls.broker_key)}))
    assert err.value.setting in ("LIVEVEC_KAFKA_SSL_KEY_FILE", "LIVEVEC_KAFKA_SSL_CERT_FILE")
    # The broker checks what is presented (ssl.client.auth=requested): a certificate from a CA it does not
    # trust is refused, and the error names the client certificate's setting.
    stranger = {**env, "LIVEVEC_KAFKA_SSL_CERT_FILE": str(kafka_tls.stranger_cert),
                "LIVEVEC_KAFKA_SSL_KEY_FILE": str(kafka_tls.stranger_key)}
    with pytest.raises(SettingError) as err:
        asyncio.run(check_kafka(stranger["LIVEVEC_KAFKA_BOOTSTRAP"], _security(stranger), timeout=10))
    assert err.value.setting == "LIVEVEC_KAFKA_SSL_CERT_FILE", str(err.value)


@pytest.mark.kafka   # starts a broker of its own
def test_a_broker_that_requires_client_certificates(tmp_path, kafka_tls):
    """Mutual TLS as a managed Kafka runs it (ssl.client.auth=required): without a certificate the client
    stops at start naming LIVEVEC_KAFKA_SSL_CERT_FILE; with the CA's certificate it gets through."""
    from online.stream.kafka_broker import KafkaBroker
    settings = dataclasses.replace(KafkaBrokerSettings.from_env(), port=0, data_dir=tmp_path / "broker",
                                   state_file=None, sasl_ssl_port=0, tls_cert_file=kafka_tls.broker_cert,
                                   tls_key_file=kafka_tls.broker_key, users_file=kafka_tls.users_file,
                                   client_ca_file=kafka_tls.ca_file, client_auth="required")
    broker = KafkaBroker(settings)
    broker.start()
    try:
        env = client_env(kafka_tls, broker.sasl_ssl_bootstrap)
        with pytest.raises(SettingError) as err:
            asyncio.run(check_kafka(env["LIVEVEC_KAFKA_BOOTSTRAP"], _security(env), timeout=10))
        assert err.value.setting == "LIVEVEC_KAFKA_SSL_CERT_FILE", str(err.value)
        mutual = {**env, "LIVEVEC_KAFKA_SSL_CERT_FILE": str(kafka_tls.client_cert),
                  "LIVEVEC_KAFKA_SSL_KEY_FILE": str(kafka_tls.client_key)}
        assert asyncio.run(check_kafka(mutual["LIVEVEC_KAFKA_BOOTSTRAP"], _security(mutual), timeout=20))
    finally:
        broker.stop()


def test_an_absent_broker_is_not_a_configuration_error(kafka_tls):
    with reserved_port() as nobody:   # refuses every connection
        env = client_env(kafka_tls, f"localhost:{nobody}")
        with pytest.raises(KafkaUnreachable) as err:
            asyncio.run(check_kafka(env["LIVEVEC_KAFKA_BOOTSTRAP"], _security(env), timeout=5))
    assert "LIVEVEC_KAFKA_BOOTSTRAP" in str(err.value)


# --------------------------------------------------------------------------- what the broker saw

async def _topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def _group_state(bootstrap: str, group: str) -> tuple[dict, list]:
    """(committed offsets, members) of a consumer group, as the plaintext listener reports them."""
    from aiokafka.errors import GroupCoordinatorNotAvailableError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        deadline = time.monotonic() + 30
        while True:   # the first group of a session makes the broker create __consumer_offsets
            try:
                offsets = await admin.list_consumer_group_offsets(group)
                break
            except GroupCoordinatorNotAvailableError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        described = await admin.describe_consumer_groups([group])
        members = [m for g in described for m in (getattr(g, "members", None) or
                                                   (g[5] if isinstance(g, tuple) and len(g) > 5 else []))]
        return offsets, members
    finally:
        await admin.close()


async def _read(settings: StreamSettings, expected: int, timeout: float = 60.0) -> tuple[list[str], dict]:
    """Up to ``expected`` texts from a fresh group member, committing as it goes; (texts, committed offsets)."""
    texts: list[str] = []
    async with KafkaStream(settings) as stream:
        deadline = time.monotonic() + timeout
        while len(texts) < expected and time.monotonic() < deadline:
            batch = await stream.next_batch(timeout=1.0)
            if batch:
                texts += batch.texts
                await stream.mark_processed(batch)
        committed = stream.committed()
    return texts, committed


@pytest.mark.parametrize("case", ["wrong password", "untrusted CA"])
def test_produce_fails_at_start_and_sends_nothing(kafka_broker, kafka_tls, case):
    env, setting = _misconfigured(case, kafka_tls, kafka_broker)
    topic = f"never-{uuid.uuid4().hex[:8]}"
    done = _livevec(["produce", "--topic", topic, "--no-progress", "-"], env, stdin=b"a b c\nd e f\n")
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert f"configuration error: {setting}" in err, err
    assert "not-it" not in err and kafka_tls.password not in err
    assert topic not in asyncio.run(_topics(kafka_broker.bootstrap))


@pytest.mark.parametrize("case", ["wrong password", "untrusted CA"])
def test_worker_fails_at_start_and_consumes_nothing(kafka_broker, kafka_tls, kafka_topic, case):
    topic = kafka_topic(2)
    produce([f"sentence {i} of the stream" for i in range(200)], bootstrap=kafka_broker.bootstrap, topic=topic,
            create_topic=False)
    env, setting = _misconfigured(case, kafka_tls, kafka_broker)
    group = f"g-{uuid.uuid4().hex[:8]}"
    # No scheduler listens there: the worker must stop on Kafka's settings before it tries to join ps-lite.
    with reserved_port() as nobody:
        cluster = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(nobody), "DMLC_NUM_SERVER": "1",
                   "DMLC_NUM_WORKER": "1", "DMLC_NODE_HOST": "127.0.0.1"}
        started = time.monotonic()
        done = _livevec(["worker"], {**cluster, **env, "LIVEVEC_KAFKA_TOPICS": topic, "LIVEVEC_KAFKA_GROUP": group},
                        timeout=90)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert f"configuration error: {setting}" in err, err
    assert time.monotonic() - started < 60
    assert "not-it" not in err and kafka_tls.password not in err
    offsets, members = asyncio.run(_group_state(kafka_broker.bootstrap, group))
    assert offsets == {} and members == []


# --------------------------------------------------------------------------- SASL_SSL end to end

def test_produce_and_consume_over_sasl_ssl(kafka_broker, kafka_tls, kafka_sasl_ssl):
    topic = f"tls-{uuid.uuid4().hex[:8]}"
    lines = [f"line {i} over tls" for i in range(2000)]
    done = _livevec(["produce", "--topic", topic, "--partitions", "2", "--no-progress", "-"],
                    {**kafka_sasl_ssl, "LIVEVEC_LOG_LEVEL": "DEBUG"}, stdin="\n".join(lines).encode())
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0, out
    assert "produced 2,000 records" in out
    assert kafka_tls.password not in out          # not even at DEBUG
    # the records, read over SASL_SSL, and the same records seen in clear on the broker's plaintext listener
    secure = StreamSettings.from_env(kafka_sasl_ssl, topics=[topic], group=f"g-{topic}")
    texts, committed = asyncio.run(_read(secure, len(lines)))
    assert sorted(texts) == sorted(lines)
    assert sum(committed.values()) == len(lines)
    clear = StreamSettings.from_env({"LIVEVEC_KAFKA_BOOTSTRAP": kafka_broker.bootstrap}, topics=[topic],
                                    group=f"clear-{topic}")
    assert sorted(asyncio.run(_read(clear, len(lines)))[0]) == sorted(lines)


@pytest.mark.slow
def test_sasl_ssl_produce_train_serve(tmp_path, kafka_broker, kafka_tls, kafka_sasl_ssl):
    """`livevec produce` and the workers over SASL_SSL only; the front end serves what they trained."""
    from online.stream.sample_corpus import generate_lines, planted_groups

    topic = f"tls-e2e-{uuid.uuid4().hex[:8]}"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(generate_lines(30_000, seed=7)) + "\n")
    done = _livevec(["produce", "--topic", topic, "--partitions", "2", "--lines-per-record", "20", "--no-progress",
                     str(corpus)], kafka_sasl_ssl)
    assert done.returncode == 0, done.stderr.decode()
    env = {**kafka_sasl_ssl, "LIVEVEC_KAFKA_TOPICS": topic, "LIVEVEC_KAFKA_GROUP": f"g-{topic}", "LIVEVEC_DIM": "32",
           "LIVEVEC_MIN_COUNT": "3", "LIVEVEC_KAFKA_BATCH_RECORDS": "50", "LIVEVEC_LOG_LEVEL": "DEBUG"}
    cluster = Cluster(tmp_path, servers=1, workers=1, env=env)
    try:
        cluster.start("scheduler", "scheduler")
        cluster.start("server0", "server")
        cluster.start("worker0", "worker")
        records = 30_000 // 20
        wait_until(lambda: cluster.metric("worker0", "livevec_worker_records_total") >= records, 180,
                   message="every record trained over SASL_SSL")
        cluster.assert_alive()
        frontend_env = {**cluster.env, "LIVEVEC_MODEL_SOURCE": "ps", "LIVEVEC_HTTP_HOST": "127.0.0.1", "PORT": "0"}
        with running_frontend([], frontend_env) as (url, _proc):
            url = url.rstrip("/")
            def hits() -> float:
                found = total = 0
                for group in planted_groups():
                    for word in group:
                        total += len(group) - 1
                        try:
                            with urllib.request.urlopen(f"{url}/v1/similar?word={word}&k={len(group) - 1}",
                                                        timeout=5) as resp:
                                neighbours = json.loads(resp.read())["neighbours"]
                        except urllib.error.HTTPError as exc:
                            errors.append(f"{word}: {exc.code} {exc.read()[:200]!r}")
                            continue
                        found += len({n["word"] for n in neighbours} & set(group))
                return found / total
            seen: list[float] = []
            errors: list[str] = []
            try:
                wait_until(lambda: seen.append(hits()) or seen[-1] >= 0.9, 60, message="planted neighbours served")
            except AssertionError as exc:
                metrics = {metric: cluster.metric("worker0", metric) for metric in
                           ("livevec_worker_syncs_total", "livevec_worker_rows_synced_total", "livevec_worker_pairs_total")}
                metrics.update({metric: cluster.metric("server0", metric) for metric in
                                ("livevec_server_fresh_deltas_dropped", "livevec_server_keys_pushed_total",
                                 "livevec_server_keys_pulled_total", "livevec_server_version")})
                raise AssertionError(f"{exc}; share found {seen[-3:]}, errors {errors[-3:]}; on the servers' "
                                     f"own model {_servers_share(cluster, planted_groups()):.3f}; worker {metrics}\n"
                                     + _warnings(cluster, ("worker0", "server0"))) from None
        worker_log = cluster.log("worker0")
        assert "security=SASL_SSL" in worker_log.replace('"', "")
        assert kafka_tls.password not in worker_log
    finally:
        cluster.stop()


def _servers_share(cluster: Cluster, groups: list[list[str]]) -> float:
    """The planted neighbours' share on the model the servers hold, read directly: tells a front-end fault
    from a training fault when the served share is low."""
    import numpy as np
    try:
        model, _ = read_model(cluster)
    except Exception as exc:   # (diagnostic only)
        print(f"reading the servers' model failed: {exc!r}")
        return float("nan")
    at = {w: i for i, w in enumerate(model.words)}
    norms = np.linalg.norm(model.vectors, axis=1)
    print(f"servers' model: {len(model.words)} words, {int(np.isnan(model.vectors).any(axis=1).sum())} rows with NaN, "
          f"{int((norms == 0).sum())} zero rows, norm mean {float(np.nanmean(norms)):.4f} max {float(np.nanmax(norms)):.4f}, "
          f"counts total {int(model.counts.sum())}")
    unit = model.vectors / np.maximum(norms[:, None], 1e-12)
    found = total = 0
    for group in groups:
        for word in group:
            total += len(group) - 1
            if word in at:
                scores = unit @ unit[at[word]]
                scores[at[word]] = -2.0
                top = {model.words[i] for i in np.argsort(-scores)[:len(group) - 1]}
                found += len(top & set(group))
    return found / max(total, 1)


def _warnings(cluster: Cluster, names: tuple[str, ...], last: int = 15) -> str:
    out = []
    for name in names:
        lines = [line for line in cluster.log(name).splitlines() if "level=warning" in line or "level=error" in line]
        out += [f"--- {name}"] + [line[:300] for line in lines[-last:]]
    return "\n".join(out)
