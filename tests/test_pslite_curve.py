"""CurveZMQ on ps traffic (ps_bridge.curve): a secured cluster of real processes refuses nodes and
raw senders without an allowed key at the socket (their pushes change no row, the refusals are
counted), and the same push with an allowed key does change the row, so the refusal is the key's."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from ps_bridge.curve import keygen, load_keys
from ps_bridge.kv_app import _KV_TYPES
from ps_bridge.message import Meta, pack_meta
from ps_bridge.meta import PBNode, decode_node, encode_node
from ps_bridge.postoffice import Postoffice, RendezvousTimeout
from ps_bridge.roles import start_worker
from ps_bridge.settings import NodeSettings, SettingError
from tests.cluster_harness import assert_trained_exactly_once, coordinator_idle, wait_until
from tests.support.http import get
from tests.support.ports import METRICS_LISTENING, VAN_BOUND, reported_port

REPO = Path(__file__).resolve().parents[1]
KEYS = np.array([5, 6], dtype=np.uint64)


@pytest.fixture
def keydir(tmp_path):
    keygen(str(tmp_path / "keys"), ["scheduler", "server", "worker"])
    # an outsider: a valid key pair the cluster does not list, and a keys file of its own that does
    outsider = Path(keygen(str(tmp_path / "outsider"), ["worker"]))
    outsider.write_text(outsider.read_text() + (tmp_path / "keys" / "cluster.keys").read_text())
    return tmp_path / "keys"


def _curve(keydir: Path, name: str, outsider: bool = False) -> dict:
    where = keydir.parent / "outsider" if outsider else keydir
    return {"curve_secret_key_file": str(where / f"{name}.key_secret"), "curve_public_keys_file": str(where / "cluster.keys")}


def _metric(port: int, name: str, **labels: str) -> float:
    text = get(f"http://127.0.0.1:{port}/metrics").text()
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#") and all(w in line for w in want))


class SecuredCluster:
    """A scheduler and a server (``python -m ps_bridge.roles``, default sum handle) as processes."""

    def __init__(self, tmp: Path, keydir: Path):
        self.tmp = tmp
        base = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "PORT"))}
        self.env = {**base, "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "0",
                    "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1", "DMLC_NODE_HOST": "127.0.0.1",
                    "PS_CURVE_PUBLIC_KEYS_FILE": str(keydir / "cluster.keys")}
        self.metrics, self.procs = {}, {}
        for role in ("scheduler", "server"):   # every port bound as 0 and read from the log
            log = tmp / f"{role}.log"
            self.procs[role] = proc = subprocess.Popen(
                [sys.executable, "-m", "ps_bridge.roles", role, "--metrics-port", "0"],
                env={**self.env, "PS_CURVE_SECRET_KEY_FILE": str(keydir / f"{role}.key_secret")}, cwd=REPO,
                stdout=open(log, "ab"), stderr=subprocess.STDOUT)
            self.metrics[role] = reported_port(log, METRICS_LISTENING, proc=proc)
            if role == "scheduler":   # the server is given the root port the scheduler got
                self.root_port = reported_port(log, VAN_BOUND, proc=proc)
                self.env["DMLC_PS_ROOT_PORT"] = str(self.root_port)

    def log(self, role: str) -> str:
        return (self.tmp / f"{role}.log").read_text(errors="replace")

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _node(cluster: SecuredCluster, **curve) -> NodeSettings:
    return NodeSettings(role="worker", root_uri="127.0.0.1", root_port=cluster.root_port, num_server=1,
                        num_worker=1, node_host="127.0.0.1", **curve)


def _raw_push(address: str, amount: float, keys=None, server_key: bytes | None = None) -> None:
    """What an intruder sends: a well-formed ps-lite push straight to the server's socket."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"ps11")
    sock.setsockopt(zmq.LINGER, 2000)
    if keys is not None:
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = keys.public, keys.secret, server_key
    sock.connect(address)
    for ts in range(3):
        meta = Meta(head=0, app_id=0, customer_id=0, timestamp=ts, request=True, push=True, data_type=_KV_TYPES)
        sock.send_multipart([pack_meta(meta), KEYS.tobytes(), np.full(8, amount, np.float32).tobytes()])
    time.sleep(1.0)
    sock.close()
    ctx.term()


@pytest.mark.slow
def test_a_node_without_an_allowed_key_is_refused_and_its_pushes_change_no_row(tmp_path, keydir):
    cluster = SecuredCluster(tmp_path, keydir)
    worker = None
    try:
        worker = start_worker(_node(cluster, **_curve(keydir, "worker")), timeout=30)
        worker.wait(worker.push(KEYS, np.ones(8, np.float32)), 10)
        assert worker.pull_sync(KEYS, timeout=10).tolist() == [1.0] * 8
        server = worker.po.nodes()[8]
        assert server.public_key == load_keys(_node(cluster, **_curve(keydir, "server"))).public.decode()

        # ps nodes that are not members: a plain one, and one with a valid key pair the cluster does not list
        for curve in ({}, _curve(keydir, "worker", outsider=True)):
            intruder = Postoffice(_node(cluster, **curve))
            with pytest.raises(RendezvousTimeout):
                intruder.start(timeout=3)
            intruder.stop()
        # raw pushes straight to the server: plain, and curve with the outsider's key
        address = f"tcp://{server.hostname}:{server.port}"
        outsider = load_keys(_node(cluster, **_curve(keydir, "worker", outsider=True)))
        _raw_push(address, 100.0)
        _raw_push(address, 100.0, outsider, server.public_key.encode())
        assert worker.pull_sync(KEYS, timeout=10).tolist() == [1.0] * 8        # no row changed
        for role in ("scheduler", "server"):
            port = cluster.metrics[role]
            # a plain peer fails the handshake (or hangs up first when it notices the mismatch before we do)
            assert _metric(port, "pslite_connections_refused_total", reason="not_curve") \
                + _metric(port, "pslite_connections_refused_total", reason="hung_up") >= 1, role
            assert _metric(port, "pslite_connections_refused_total", reason="key_not_allowed") >= 1, role
            assert _metric(port, "pslite_frames_rejected_total") == 0, role          # nothing reached the decoder
        assert outsider.public.decode() in cluster.log("server")   # the refused key is logged (quoted)
        assert "event=connection_refused reason=key_not_allowed" in cluster.log("scheduler")

        # the same push with an allowed key does change the rows: the key alone made the difference
        member = load_keys(_node(cluster, **_curve(keydir, "worker")))
        _raw_push(address, 100.0, member, server.public_key.encode())
        wait_until(lambda: worker.pull_sync(KEYS, timeout=10).tolist() == [301.0] * 8, 10, interval=0.2,
                   message="the member's pushes to arrive")
    finally:
        if worker is not None:
            worker.po.stop()
        cluster.stop()


def test_keys_are_checked_at_start_and_errors_name_the_setting(tmp_path, keydir):
    def settings(role="worker", **kw):
        return NodeSettings.build({"role": role, "root_uri": "h", "root_port": 1, "num_server": 1, "num_worker": 1,
                                   **kw})

    assert load_keys(settings()) is None                                   # plain: ps-lite compatible
    with pytest.raises(SettingError, match="^PS_CURVE_PUBLIC_KEYS_FILE: is required"):
        settings(curve_secret_key_file=str(keydir / "worker.key_secret"))
    with pytest.raises(SettingError, match="^PS_CURVE_SECRET_KEY_FILE: is required"):
        settings(curve_public_keys_file=str(keydir / "cluster.keys"))
    with pytest.raises(SettingError, match="^PS_CURVE_SECRET_KEY_FILE: .*no public-key and secret-key pair"):
        load_keys(settings(**{**_curve(keydir, "worker"), "curve_secret_key_file": str(keydir / "worker.key")}))
    with pytest.raises(SettingError, match="^PS_CURVE_PUBLIC_KEYS_FILE: does not allow this node's own"):
        load_keys(settings(**{**_curve(keydir, "worker"),
                              "curve_secret_key_file": _curve(keydir, "worker", True)["curve_secret_key_file"]}))
    bad = tmp_path / "bad.keys"
    bad.write_text("# cluster keys\n" + (keydir / "cluster.keys").read_text() + "not-a-key worker\n")
    with pytest.raises(SettingError, match=r"^PS_CURVE_PUBLIC_KEYS_FILE: .*bad.keys:5: not a 40-character"):
        load_keys(settings(**{**_curve(keydir, "worker"), "curve_public_keys_file": str(bad)}))
    unnamed = tmp_path / "unnamed.keys"
    unnamed.write_text((keydir / "cluster.keys").read_text().replace(" scheduler", " boss"))
    with pytest.raises(SettingError, match="names no key 'scheduler'"):
        load_keys(settings(**{**_curve(keydir, "worker"), "curve_public_keys_file": str(unnamed)}))
    keys = load_keys(settings(**_curve(keydir, "worker")))
    assert keys.scheduler in keys.allowed and keys.public in keys.allowed and len(keys.allowed) == 3


def test_the_key_travels_in_pbnode_field_15_only_when_set():
    plain = PBNode(role=1, id=9, hostname="10.0.0.1", port=9000, is_recovery=False, customer_id=0)
    assert b"\x7a" not in encode_node(plain)        # plain clusters: the bytes C++ ps-lite sends
    keyed = PBNode(role=1, id=9, hostname="10.0.0.1", port=9000, is_recovery=False, customer_id=0,
                   public_key="Qf-iIZ+yH?qwlw/>bt%:GbRbyn<Gcl7G)*#2$vYu")
    assert encode_node(keyed) == encode_node(plain) + b"\x7a\x28" + keyed.public_key.encode()
    assert decode_node(encode_node(keyed)) == keyed


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.timeout(360)
@pytest.mark.parametrize("secured", [True, False], ids=["curve", "plain"])
def test_a_secured_livevec_cluster_trains_every_record_exactly_once(kafka_bootstrap, kafka_topic, tmp_path, secured):
    """The exactly-once check (``assert_trained_exactly_once``) on a cluster whose every ps link is CurveZMQ, with
    a worker and a server killed and relaunched while it trains (their replacements rejoin with their keys)."""
    from online.deployment.local_runner import LocalRunner
    from online.deployment.topology import default_topology
    from online.learner.tokenizers import Tokenizer
    from online.stream.sample_corpus import generate_lines
    from online.checkpoint.store import CheckpointStore
    from online.cluster import ps_commands as pc
    from tests.test_checkpoint_recovery import Producer, _ledger
    import orjson
    import uuid

    keydir = tmp_path / "keys"
    keygen(str(keydir), ["scheduler", "server", "worker", "frontend", "probe"])
    topic = kafka_topic(partitions=4, prefix="curve")
    producer = Producer(kafka_bootstrap, topic, generate_lines(2400, seed=11), rate=30.0)   # 600 records, ~20 s
    tokens_expected = sum(len(s) for s in Tokenizer("text8").sentences_of(producer.records))
    env = {"LIVEVEC_KAFKA_BOOTSTRAP": kafka_bootstrap, "LIVEVEC_KAFKA_TOPICS": topic,
           "PS_HEARTBEAT_INTERVAL": "0.5", "PS_HEARTBEAT_TIMEOUT": "3", "LIVEVEC_CHECKPOINT_INTERVAL": "2",
           "LIVEVEC_DIM": "24", "LIVEVEC_MIN_COUNT": "3", "LIVEVEC_KAFKA_BATCH_RECORDS": "15",
           "LIVEVEC_KAFKA_SESSION_TIMEOUT_MS": "6000", "LIVEVEC_REQUEST_TIMEOUT": "4",
           "LIVEVEC_KAFKA_GROUP": f"g-{uuid.uuid4().hex[:8]}"}
    curve = {"curve_public_keys_file": str(keydir / "cluster.keys"),
             "curve_secret_key_file": str(keydir / "probe.key_secret")} if secured else {}
    if secured:
        env["PS_CURVE_PUBLIC_KEYS_FILE"] = str(keydir / "cluster.keys")
    app_env = {app: {"PS_CURVE_SECRET_KEY_FILE": str(keydir / f"{app}.key_secret")} if secured else {}
               for app in ("scheduler", "server", "worker", "frontend")}
    app_env["frontend"].update({"LIVEVEC_HTTP_HOST": "127.0.0.1", "LIVEVEC_MODEL_SOURCE": "ps"})
    runner = LocalRunner.from_topology(default_topology(servers=2, workers=2, frontends=1), work_dir=tmp_path / "run",
                                       env=env, app_env=app_env,
                                       instances={"server": 2, "worker": 2, "frontend": 1, "producer-example": 0},
                                       volumes={"/mnt/mfs": tmp_path / "run" / "shared"})
    probe = None
    try:
        runner.start()
        assert runner.wait_healthy(timeout=120), "the secured cluster did not become healthy"
        probe = start_worker(NodeSettings(role="worker", root_uri="127.0.0.1", root_port=runner.port("scheduler", "ps"),
                                          num_server=2, num_worker=2, elastic_workers=True, heartbeat_interval=0.5,
                                          **curve), timeout=60)

        def stats():
            out = []
            for sid in probe.po.server_ids():
                try:
                    out.append(orjson.loads(probe.wait(probe.request(pc.HEAD_STATS, b"", sid), 3.0)[0].body))
                except Exception:   # a server is down
                    return None
            return out

        producer.start()
        wait_until(lambda: (_ledger(stats()) or {}).get("records", 0) > 60, 90, interval=0.25, message="training")
        store = CheckpointStore(tmp_path / "run" / "shared" / "livevec" / "checkpoints")
        wait_until(lambda: store.latest_complete(check_data=False), 60, interval=0.25, message="a first checkpoint")
        for app, index in (("worker", 0), ("server", 1)):
            epochs = [s["epoch"] for s in wait_until(stats, 30, interval=0.25, message="all servers answering")]
            assert runner.kill_task(app, index) is not None
            wait_until(lambda: (s := stats()) and not any(x.get("recovering") for x in s)
                       and all(x["epoch"] != e for x, e in zip(s, epochs)), 90, interval=0.25,
                       message=f"recovery from killing {app}#{index}")
        producer.join(timeout=120)
        assert producer.error is None and producer.sent == len(producer.records)
        assert_trained_exactly_once(stats, topic, len(producer.records), tokens_expected,
                                    idle=lambda: coordinator_idle(runner))
        assert runner.wait_healthy(["frontend"], timeout=60)

        def frontend_ready():   # its ps source joined with its key and synced the model
            return get(runner.url("frontend", "http", "/ready")).status == 200

        wait_until(frontend_ready, 60, interval=0.5, message="the front end to serve the secured cluster's model")
        logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "run" / "logs").glob("*.log"))
        assert "reason=key_not_allowed" not in logs and "reason=not_curve" not in logs   # no member was refused
    finally:
        if probe is not None:
            probe.po.leave()
        runner.stop()
