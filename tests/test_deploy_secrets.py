"""The deploy files mount every secret: CurveZMQ keys, the front end's API token and its TLS files.

``livevec deploy render --secure curve,token,tls`` adds them; the default render has none of them (a plaintext
cluster needs no Secret). The last test runs the secured Marathon group through the local runner, with real
keys, a real token and a real certificate in the directories the group mounts: the ps traffic is CurveZMQ
(no peer refused), the health checks pass over HTTPS, and the API answers only with the token.
"""
from __future__ import annotations

import collections
import json
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import zmq

from online.deployment import k8s, marathon, platform_rules
from online.deployment.local_runner import LocalRunner, describe
from online.deployment.secrets import CURVE, PS_ROLES, TLS, TOKEN, parse_secure
from online.deployment.topology import default_topology
from online.stream.producer import produce
from online.stream.sample_corpus import generate_lines
from tests.cluster_harness import runner_metric

REPO = Path(__file__).resolve().parents[1]
SECURED = default_topology(servers=2, workers=2, frontends=1).with_secure(parse_secure("all"))


def _k8s_containers(objects) -> dict[str, tuple[list[dict], list[dict]]]:
    """role -> (its containers, its pod's volumes), from the Deployments and StatefulSets."""
    out = {}
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet"):
            spec = obj["spec"]["template"]["spec"]
            out[obj["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]] = (
                spec["containers"], spec.get("volumes", []))
    return out


def test_parse_secure_names_the_bad_choice():
    assert parse_secure("") == frozenset()
    assert parse_secure("all") == {"curve", "token", "tls"}
    assert parse_secure(" curve, tls ") == {"curve", "tls"}
    with pytest.raises(ValueError, match="unknown kafka"):
        parse_secure("curve,kafka")


def test_the_default_render_turns_on_no_optional_secret():
    """Kafka's credentials are always mounted (inert under PLAINTEXT); nothing else is."""
    group = marathon.render_group(default_topology())
    for app in group["apps"]:
        assert not any(var.startswith(("PS_CURVE_", "LIVEVEC_API_TOKEN", "LIVEVEC_TLS_")) for var in app["env"])
        paths = {v["containerPath"] for v in app["container"]["volumes"]}
        assert not paths & {CURVE.mount_path, TOKEN.mount_path, TLS.mount_path}, app["id"]
    worker = next(a for a in group["apps"] if a["id"] == "/livevec/worker")
    assert worker["env"]["LIVEVEC_KAFKA_SASL_PASSWORD_FILE"] == "/etc/livevec/kafka/password"


def test_every_ps_role_reads_its_own_curve_key_from_a_mount_on_both_platforms():
    group = marathon.render_group(SECURED)
    apps = {a["id"].rsplit("/", 1)[1]: a for a in group["apps"]}
    containers = _k8s_containers(k8s.render_objects(SECURED))
    for role in PS_ROLES:
        env = apps[role]["env"]
        assert env["PS_CURVE_SECRET_KEY_FILE"] == f"/etc/livevec/ps/{role}.key_secret"
        assert env["PS_CURVE_PUBLIC_KEYS_FILE"] == "/etc/livevec/ps/cluster.keys"
        assert {"containerPath": "/etc/livevec/ps", "hostPath": "/etc/livevec/ps", "mode": "RO"} in \
            apps[role]["container"]["volumes"]
        pod_containers, volumes = containers[role]
        volume = next(v for v in volumes if v["name"] == CURVE.name)
        # The pod projects only its own secret key: a compromised worker pod holds no server key.
        assert [item["key"] for item in volume["secret"]["items"]] == ["cluster.keys", f"{role}.key_secret"]
        assert "optional" not in volume["secret"], "a forgotten Secret must stop the pod, not start it unsecured"
        for container in pod_containers:
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["PS_CURVE_SECRET_KEY_FILE"] == f"/etc/livevec/ps/{role}.key_secret"
            assert {"name": CURVE.name, "mountPath": "/etc/livevec/ps", "readOnly": True} in container["volumeMounts"]
    assert "PS_CURVE_SECRET_KEY_FILE" not in apps["producer-example"]["env"]   # not a ps node


def test_the_front_end_gets_its_token_and_tls_files_and_probes_over_https():
    frontend = next(a for a in marathon.render_group(SECURED)["apps"] if a["id"] == "/livevec/frontend")
    assert frontend["env"]["LIVEVEC_API_TOKEN_FILE"] == "/etc/livevec/frontend/token"
    assert frontend["env"]["LIVEVEC_TLS_CERT_FILE"] == "/etc/livevec/tls/tls.crt"
    assert frontend["env"]["LIVEVEC_TLS_KEY_FILE"] == "/etc/livevec/tls/tls.key"
    assert [hc["protocol"] for hc in frontend["healthChecks"]] == ["MESOS_HTTPS"]
    assert [rc["protocol"] for rc in frontend["readinessChecks"]] == ["HTTPS"]
    (container,), volumes = _k8s_containers(k8s.render_objects(SECURED))["frontend"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS", probe
    tls = next(v for v in volumes if v["name"] == TLS.name)["secret"]
    assert tls["secretName"] == "livevec-frontend-tls"
    assert [item["key"] for item in tls["items"]] == ["tls.crt", "tls.key"]   # a kubernetes.io/tls Secret's keys
    # The servers' and workers' probes are on their metrics ports, which stay plain HTTP.
    server = next(a for a in marathon.render_group(SECURED)["apps"] if a["id"] == "/livevec/server")
    assert server["healthChecks"][0]["protocol"] == "MESOS_HTTP"


def test_the_secured_files_pass_the_platform_rules():
    for target, files in (("marathon", marathon.render_files(SECURED)), ("k8s", k8s.render_files(SECURED))):
        assert platform_rules.check_files(target, files) == [], target


def test_deploy_render_secure_names_a_bad_value():
    done = subprocess.run([sys.executable, "-m", "online.cli", "deploy", "render", "--target", "k8s",
                           "--secure", "curve,tokens"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode != 0
    assert "--secure" in done.stderr and "tokens" in done.stderr


def _https_get(url: str, token: str | None = None):
    context = ssl.create_default_context(cafile=None)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=5, context=context) as resp:
        return json.loads(resp.read())


@pytest.mark.slow
def test_the_secured_group_trains_over_curve_and_serves_https_with_the_token(tmp_path, kafka_bootstrap,
                                                                             kafka_topic):
    keys, token_dir, tls_dir = tmp_path / "ps", tmp_path / "frontend", tmp_path / "tls"
    subprocess.run([sys.executable, "-m", "ps_bridge.curve", "keygen", str(keys), *PS_ROLES], check=True,
                   capture_output=True)
    token_dir.mkdir()
    token = "deploy-secret-token-0123456789abcdef"
    (token_dir / "token").write_text(token + "\n")
    tls_dir.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-keyout", str(tls_dir / "tls.key"), "-out", str(tls_dir / "tls.crt")],
                   check=True, capture_output=True)
    topic = kafka_topic(2)
    lines = generate_lines(6_000, seed=3)
    produce(lines, bootstrap=kafka_bootstrap, topic=topic, lines_per_record=20, create_topic=False)
    expected_tokens = sum(collections.Counter(t for line in lines for t in line.split()).values())
    secured = default_topology(servers=1, workers=1, frontends=1).with_secure(parse_secure("all"))
    runner = LocalRunner.from_topology(
        secured, work_dir=tmp_path / "run", instances={"server": 1, "worker": 1, "frontend": 1},
        env={"LIVEVEC_KAFKA_BOOTSTRAP": kafka_bootstrap, "LIVEVEC_KAFKA_TOPICS": topic,
             "LIVEVEC_KAFKA_GROUP": f"g-{topic}", "LIVEVEC_DIM": "32", "LIVEVEC_MIN_COUNT": "3",
             "LIVEVEC_KAFKA_BATCH_RECORDS": "50", "PS_HEARTBEAT_INTERVAL": "1", "PS_HEARTBEAT_TIMEOUT": "10"},
        app_env={"frontend": {"LIVEVEC_HTTP_HOST": "127.0.0.1"}},
        volumes={"/mnt/mfs/livevec": tmp_path / "mfs", CURVE.mount_path: keys, TOKEN.mount_path: token_dir,
                 TLS.mount_path: tls_dir}, dependency_timeout=90)
    with runner:
        assert runner.wait_healthy(timeout=150), describe(runner.status())   # (the front end's over HTTPS)
        deadline = time.monotonic() + 120
        while runner_metric(runner, "worker", "livevec_worker_tokens_total") < expected_tokens:
            assert time.monotonic() < deadline, describe(runner.status())
            time.sleep(0.5)
        base = runner.url("frontend", "http").replace("http://", "https://", 1)
        with pytest.raises(urllib.error.HTTPError) as refused:
            _https_get(f"{base}/v1/stats")
        assert refused.value.code == 401
        deadline = time.monotonic() + 30
        while not (_https_get(f"{base}/v1/stats", token).get("words_trained") or 0):
            assert time.monotonic() < deadline, "the front end never read the servers' counts over CurveZMQ"
            time.sleep(0.5)
        with pytest.raises((urllib.error.URLError, ConnectionError)):   # the port speaks HTTPS only
            urllib.request.urlopen(runner.url("frontend", "http", "/health"), timeout=5)
        # The ps traffic is CurveZMQ: the nodes' own keys were all allowed, and a plain ps-lite peer is refused.
        for app in ("scheduler", "server", "worker"):
            assert runner_metric(runner, app, 'pslite_connections_refused_total{reason="key_not_allowed"') == 0
        # Which side sees the mechanism mismatch first is a race: the scheduler counts the plain peer as
        # not_curve, or as hung_up when the peer noticed first and hung up (as test_pslite_curve accepts too).
        def refused() -> float:
            return sum(runner_metric(runner, "scheduler", f'pslite_connections_refused_total{{reason="{reason}"')
                       for reason in ("not_curve", "hung_up"))

        before = refused()
        context = zmq.Context()
        try:
            plain = context.socket(zmq.DEALER)
            plain.setsockopt(zmq.LINGER, 0)
            plain.connect(f"tcp://127.0.0.1:{runner.port('scheduler', 'ps')}")
            plain.send(b"hello")
            deadline = time.monotonic() + 15
            while refused() <= before:
                assert time.monotonic() < deadline, "a plain ps-lite peer was not refused: the cluster is not secured"
                time.sleep(0.5)
        finally:
            context.destroy(linger=0)   # term() would wait for ever on a socket an assertion left open
        logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "run").rglob("*.log")) \
            if any((tmp_path / "run").rglob("*.log")) else ""
        assert token not in logs
