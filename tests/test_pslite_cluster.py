"""Local ps-lite clusters of real processes on 127.0.0.1 (real zmq, nothing mocked).

The scheduler is the real ``livevec scheduler`` command. Servers and workers are small
Python programs (below) built on ps_bridge: servers record which keys they saw and answer
a SimpleApp query about them; workers execute JSON commands read from stdin, so each test
drives the cluster step by step and can kill or add processes in between.
"""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from ps_bridge.message import ALL_GROUP, K_EMPTY, Cmd, Control, Meta, Node, meta_to_pb
from ps_bridge.meta import MalformedMeta, decode_meta, encode_meta

REPO = Path(__file__).resolve().parents[1]
HALF = (2**64 - 1) // 2  # first key of server rank 1 when there are two servers

SERVER_PROGRAM = r"""
import json, sys
import numpy as np
from ps_bridge.structured_logging import configure_logging
from ps_bridge.kv_app import KVServerDefaultHandle
import os
from ps_bridge.roles import start_server
from ps_bridge.settings import NodeSettings
configure_logging("INFO")
# elastic workers are the caller's choice (ps_bridge reads no product's variables)
node = NodeSettings.from_env(os.environ, role="server", elastic_workers=os.environ.get("ELASTIC") == "1")
seen = []
store = KVServerDefaultHandle()
def handle(req, data, server):
    if len(data.keys):
        seen.append((int(data.keys.min()), int(data.keys.max()), len(data.keys)))
    store(req, data, server)
server = start_server(handle, node, timeout=60)
def keys_seen(req, app):
    body = {"id": app.po.node_id, "min": min((s[0] for s in seen), default=None),
            "max": max((s[1] for s in seen), default=None), "count": sum(s[2] for s in seen)}
    app.response(req, json.dumps(body).encode())
server.set_simple_request_handle(keys_seen)
server.po.finalize()
print("finalized", flush=True)
"""

WORKER_PROGRAM = r"""
import json, sys, traceback
import numpy as np
from ps_bridge.structured_logging import configure_logging
import os
from ps_bridge.roles import start_worker
from ps_bridge.settings import NodeSettings
configure_logging("INFO")
node = NodeSettings.from_env(os.environ, role="worker", elastic_workers=os.environ.get("ELASTIC") == "1")
worker = start_worker(node, timeout=60)
po = worker.po
def out(obj):
    sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
out({"id": po.node_id, "port": po.my_node.port, "recovery": po.is_recovery})
for line in sys.stdin:
    cmd = json.loads(line)
    op = cmd["op"]
    try:
        if op == "push":
            worker.wait(worker.push(np.array(cmd["keys"], np.uint64), np.array(cmd["vals"], np.float32)),
                        cmd.get("timeout", 10))
            out({"ok": True})
        elif op == "pull":
            res = worker.wait(worker.pull(np.array(cmd["keys"], np.uint64)), cmd.get("timeout", 10))
            out({"vals": res.vals.tolist()})
        elif op == "barrier":
            po.barrier(0, cmd["group"], timeout=cmd.get("timeout", 20))
            out({"ok": True})
        elif op == "ask_servers":
            responses = worker.wait(worker.request(1, b"", 2), 10)
            out({"servers": sorted((json.loads(r.body) for r in responses), key=lambda r: r["id"])})
        elif op == "leave":
            po.leave()
            out({"ok": True})
            break
        elif op == "finalize":
            po.finalize(timeout=30)
            out({"ok": True})
            break
    except Exception as exc:
        out({"error": type(exc).__name__, "detail": str(exc)})
"""


class Proc:
    """A node process: stderr (structured log) and stdout collected by reader threads."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]):
        self.name = name
        self.p = subprocess.Popen(argv, env=env, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, bufsize=1)
        self.log: list[str] = []
        self.lines: queue.Queue[str] = queue.Queue()
        self._log_cv = threading.Condition()
        threading.Thread(target=self._read_err, daemon=True).start()
        threading.Thread(target=self._read_out, daemon=True).start()

    def _read_err(self) -> None:
        for line in self.p.stderr:
            with self._log_cv:
                self.log.append(line.rstrip("\n"))
                self._log_cv.notify_all()

    def _read_out(self) -> None:
        for line in self.p.stdout:
            self.lines.put(line)

    def wait_log(self, pattern: str, timeout: float = 20.0, start: int = 0) -> re.Match:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._log_cv:
            while True:
                for line in self.log[start:]:
                    m = rx.search(line)
                    if m:
                        return m
                left = deadline - time.monotonic()
                if left <= 0 or (self.p.poll() is not None and not self._log_cv.wait(0.2)):
                    raise AssertionError(f"{self.name}: no log line matching {pattern!r} "
                                         f"(exit={self.p.poll()}); log tail:\n" + "\n".join(self.log[-30:]))
                self._log_cv.wait(min(left, 0.2))

    def read(self, timeout: float = 30.0) -> dict:
        try:
            return json.loads(self.lines.get(timeout=timeout))
        except queue.Empty:
            raise AssertionError(f"{self.name}: no output in {timeout}s (exit={self.p.poll()}); log tail:\n"
                                 + "\n".join(self.log[-30:])) from None

    def send(self, **command) -> None:
        self.p.stdin.write(json.dumps(command) + "\n")
        self.p.stdin.flush()

    def cmd(self, read_timeout: float = 30.0, **command) -> dict:
        self.send(**command)
        return self.read(read_timeout)

    def alive(self) -> bool:
        return self.p.poll() is None

    def kill9(self) -> None:
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(10)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(10)
        for stream in (self.p.stdin, self.p.stdout, self.p.stderr):
            try:
                stream.close()
            except Exception:
                pass


class Cluster:
    def __init__(self, num_server: int, num_worker: int, **extra_env: str):
        self.procs: list[Proc] = []
        self.env = {**os.environ, "PYTHONPATH": str(REPO), "DMLC_PS_ROOT_URI": "127.0.0.1",
                    "DMLC_NODE_HOST": "127.0.0.1", "DMLC_NUM_SERVER": str(num_server),
                    "DMLC_NUM_WORKER": str(num_worker), "LIVEVEC_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1",
                    "OMP_NUM_THREADS": "1", **extra_env}
        for k in ("PORT", "PORT0", "DMLC_ROLE", "DMLC_PS_ROOT_PORT"):
            self.env.pop(k, None)
        self.scheduler = self._spawn("scheduler", [sys.executable, "-m", "online.cli", "scheduler",
                                                   "--root-port", "0"], "scheduler")
        m = self.scheduler.wait_log(r"event=van_bound .*advertised=127\.0\.0\.1:(\d+)")
        self.root_port = int(m.group(1))
        self.env["DMLC_PS_ROOT_PORT"] = str(self.root_port)

    def _spawn(self, name: str, argv: list[str], role: str, **env: str) -> Proc:
        proc = Proc(name, argv, {**self.env, "DMLC_ROLE": role, **env})
        self.procs.append(proc)
        return proc

    def server(self, name: str = "server") -> Proc:
        return self._spawn(name, [sys.executable, "-c", SERVER_PROGRAM], "server")

    def worker(self, name: str = "worker") -> Proc:
        return self._spawn(name, [sys.executable, "-c", WORKER_PROGRAM], "worker")

    def close(self) -> None:
        for p in self.procs:
            p.stop()


@pytest.fixture
def cluster_factory():
    made: list[Cluster] = []

    def make(num_server: int, num_worker: int, **env: str) -> Cluster:
        c = Cluster(num_server, num_worker, **env)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def _node_port(proc: Proc) -> int:
    return int(proc.wait_log(r"event=node_ready .* port=(\d+)").group(1))


def _node_id(proc: Proc) -> int:
    return int(proc.wait_log(r"event=node_ready .* id=(\d+)").group(1))


KEYS = [1, 2, 3, 1000, HALF - 1, HALF, HALF + 7, 2**64 - 10]


def test_two_servers_two_workers_sum_pushes_and_split_keys_by_range(cluster_factory):
    c = cluster_factory(2, 2)
    servers = [c.server(f"server{i}") for i in range(2)]
    workers = [c.worker(f"worker{i}") for i in range(2)]
    infos = [w.read() for w in workers]
    assert sorted(i["id"] for i in infos) == [9, 11]
    assert sorted(_node_id(s) for s in servers) == [8, 10]
    n = len(KEYS)
    for rank, w in enumerate(workers):  # worker r pushes (r+1) * (i+1) to key i
        assert w.cmd(op="push", keys=KEYS, vals=[(rank + 1) * (i + 1.0) for i in range(n)]) == {"ok": True}
    for w in workers:
        w.send(op="barrier", group=4)
    for w in workers:
        assert w.read() == {"ok": True}  # both pushes are acknowledged by now
    for w in workers:
        assert w.cmd(op="pull", keys=KEYS) == {"vals": [3.0 * (i + 1) for i in range(n)]}
    # a pull of a subset on a single server, and of keys nobody pushed (ps-lite: zeros)
    assert workers[0].cmd(op="pull", keys=[HALF, 2**64 - 10]) == {"vals": [18.0, 24.0]}
    assert workers[0].cmd(op="pull", keys=[5, HALF + 1]) == {"vals": [0.0, 0.0]}
    seen = workers[1].cmd(op="ask_servers")["servers"]
    assert [s["id"] for s in seen] == [8, 10]
    assert seen[0]["min"] == 1 and seen[0]["max"] == HALF - 1  # server rank 0: [0, HALF)
    assert seen[1]["min"] == HALF and seen[1]["max"] == 2**64 - 10  # server rank 1: [HALF, 2*HALF)
    for w in workers:
        w.send(op="finalize")
    for w in workers:
        assert w.read() == {"ok": True}
    for p in [c.scheduler, *servers, *workers]:
        assert p.p.wait(20) == 0, p.name
    assert c.scheduler.wait_log(r"event=node_stopped role=scheduler")


def _two_servers_and_a_pushing_worker(c: Cluster) -> tuple[dict[int, Proc], Proc]:
    """Servers 8 and 10 and worker 9 started, and 1.0 pushed to every key of ``KEYS``: (servers by id, worker)."""
    servers = [c.server(f"server{i}") for i in range(2)]
    worker = c.worker()
    assert worker.read()["id"] == 9
    ids = {_node_id(s): s for s in servers}
    assert worker.cmd(op="push", keys=KEYS, vals=[1.0] * len(KEYS)) == {"ok": True}
    return ids, worker


def test_killed_server_is_replaced_under_its_old_id(cluster_factory):
    c = cluster_factory(2, 1, PS_HEARTBEAT_INTERVAL="0.2", PS_HEARTBEAT_TIMEOUT="1.0")
    ids, worker = _two_servers_and_a_pushing_worker(c)

    ids[8].kill9()
    # While server 8 is gone, requests touching its range time out (ps-lite would hang forever).
    assert worker.cmd(op="pull", keys=[1, HALF], timeout=0.5)["error"] == "RequestTimeout"
    replacement = c.server("replacement")
    assert replacement.wait_log(r"event=node_ready role=server id=(\d+)").group(1) == "8"
    replacement.wait_log(r"event=node_ready .*recovery=True")
    c.scheduler.wait_log(r"event=recovered id=8")
    worker.wait_log(r"event=peer_reconnected peer=8")

    assert worker.cmd(op="push", keys=KEYS, vals=[2.0] * len(KEYS)) == {"ok": True}
    # server 10 kept its sums (1 + 2); the replacement started empty (ps-lite keeps no state)
    assert worker.cmd(op="pull", keys=KEYS) == {"vals": [2.0] * 5 + [3.0] * 3}
    assert worker.cmd(op="finalize") == {"ok": True}
    for p in (c.scheduler, ids[10], replacement, worker):
        assert p.p.wait(20) == 0, p.name


def test_a_server_registering_while_schedulers_restart_takes_its_slot(cluster_factory):
    """(Extension) a restarted server's ADD_NODE reaches a scheduler that dies before it answers, and
    the next scheduler hears it before any running node's heartbeat: the server must still get its
    id back, or it waits for ever, and the cluster with it (test_overlapping_faults reaches this state)."""
    c = cluster_factory(2, 1, PS_HEARTBEAT_INTERVAL="0.2", PS_HEARTBEAT_TIMEOUT="1.5")
    ids, worker = _two_servers_and_a_pushing_worker(c)

    c.scheduler.kill9()
    ids[8].kill9()
    # a scheduler that takes the replacement's ADD_NODE and dies before it answers
    ctx = zmq.Context()
    try:
        doomed = ctx.socket(zmq.ROUTER)
        doomed.setsockopt(zmq.LINGER, 0)
        doomed.bind(f"tcp://127.0.0.1:{c.root_port}")
        replacement = c.server("replacement")
        deadline = time.monotonic() + 20
        while True:
            assert doomed.poll(int(max(0.0, deadline - time.monotonic()) * 1000)), "no ADD_NODE reached the port"
            frames = doomed.recv_multipart()
            control = decode_meta(frames[1]).control
            if control is not None and control.cmd == Cmd.ADD_NODE:
                break
        doomed.close(0)
    finally:
        ctx.destroy(linger=0)
    # the next scheduler hears the replacement first: the running nodes are held still until it has
    for running in (ids[10], worker):
        running.p.send_signal(signal.SIGSTOP)
    try:
        c.scheduler = c._spawn("scheduler2", [sys.executable, "-m", "online.cli", "scheduler",
                                              "--root-port", str(c.root_port)], "scheduler")
        # a new scheduler process starts in seconds, and in tens of them on a loaded machine (over 20 in CI)
        replacement.wait_log(r"event=registering_again", timeout=60)
        c.scheduler.wait_log(r"event=node_registered role=server", timeout=60)
    finally:
        for running in (ids[10], worker):
            running.p.send_signal(signal.SIGCONT)
    assert replacement.wait_log(r"event=node_ready role=server id=(\d+)", timeout=30).group(1) == "8"
    c.scheduler.wait_log(r"event=node_adopted id=10 ")
    c.scheduler.wait_log(r"event=recovered id=8 ")
    worker.wait_log(r"event=peer_reconnected peer=8")
    assert worker.cmd(op="push", keys=KEYS, vals=[2.0] * len(KEYS)) == {"ok": True}
    assert worker.cmd(op="pull", keys=KEYS) == {"vals": [2.0] * 5 + [3.0] * 3}


def _dealer(ctx: zmq.Context, port: int, identity: bytes) -> zmq.Socket:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 1000)
    s.setsockopt(zmq.IDENTITY, identity)
    s.connect(f"tcp://127.0.0.1:{port}")
    return s


def _malformed_random(rng: np.random.Generator) -> bytes:
    while True:
        data = rng.integers(0, 256, size=int(rng.integers(3, 60)), dtype=np.uint8).tobytes()
        try:
            decode_meta(data)
        except MalformedMeta:
            return data


def _data_meta(push: bool = True, pull: bool = False, ts: int = 0, request: bool = True) -> bytes:
    return encode_meta(meta_to_pb(Meta(head=0, app_id=0, customer_id=0, timestamp=ts, request=request,
                                       push=push, pull=pull, data_type=[8, 9])))


def _control_meta(cmd: int, nodes=(), group: int = 0, request: bool = False) -> bytes:
    return encode_meta(meta_to_pb(Meta(customer_id=K_EMPTY, timestamp=0, request=request,
                                       control=Control(cmd=cmd, node=list(nodes), barrier_group=group))))


def _u64(*v: int) -> bytes:
    return np.array(v, np.uint64).tobytes()


def _f32(*v: float) -> bytes:
    return np.array(v, np.float32).tobytes()


def test_garbage_frames_are_rejected_counted_and_every_node_keeps_serving(cluster_factory):
    c = cluster_factory(1, 1)
    server = c.server()
    worker = c.worker()
    info = worker.read()
    server_port = _node_port(server)
    rng = np.random.default_rng(7)
    push_meta = _data_meta()
    truncated = push_meta[:-1] + b"\x80"  # last varint left open
    with pytest.raises(MalformedMeta):
        decode_meta(truncated)
    ctx = zmq.Context()
    try:
        common = [([_malformed_random(rng)], "bad_meta"), ([truncated], "bad_meta"),
                  ([truncated, _u64(1), _f32(1.0)], "bad_meta")]
        server_cases = common + [
            ([push_meta, _u64(1)], "bad_frame_count"),                                   # keys without vals
            ([push_meta, _u64(1), _f32(1.0), b"\0" * 4, b"\0" * 4], "bad_frame_count"),  # 4 data frames
            ([push_meta, b"\x01" * 7, _f32(1.0)], "bad_data_length"),                    # 7-byte keys
            ([push_meta, _u64(1, 2), _f32(1.0, 2.0, 3.0)], "bad_data_length"),           # 3 vals for 2 keys
            ([push_meta, _u64(1, 2), _f32(1.0, 2.0), np.array([1], np.int32).tobytes()], "bad_lens_length"),
            ([push_meta, _u64(1, 2), _f32(1.0, 2.0), np.array([1, 2], np.int32).tobytes()], "bad_lens_sum"),
            ([push_meta, _u64(2, 1), _f32(1.0, 2.0)], "unsorted_keys"),
            ([_data_meta(push=False, pull=False), _u64(1), _f32(1.0)], "neither_push_nor_pull"),
            ([_data_meta(request=False), _u64(1), _f32(1.0)], "kv_response_to_server"),
            ([b""], "no_such_app"),                                                       # empty meta frame
            ([_control_meta(Cmd.TERMINATE)], "foreign_terminate"),
        ]
        worker_cases = common + [
            ([_data_meta(request=False, ts=12345), _u64(1), _f32(1.0)], "unknown_timestamp"),
            ([push_meta, _u64(1), _f32(1.0)], "kv_request_to_worker"),
            ([_control_meta(Cmd.ADD_NODE, [Node(0, 8, "127.0.0.1", 1)])], "add_node_not_from_scheduler"),
            ([_control_meta(Cmd.TERMINATE)], "foreign_terminate"),
            ([_control_meta(77)], "unknown_control_cmd"),
        ]
        scheduler_cases = common + [
            ([_control_meta(Cmd.ADD_NODE, [Node(7, K_EMPTY, "127.0.0.1", 5)])], "bad_add_node"),
            ([_control_meta(Cmd.ADD_NODE, [Node(0, K_EMPTY, "127.0.0.1", 0)])], "bad_add_node"),
            ([_control_meta(Cmd.BARRIER, group=9, request=True)], "bad_barrier_group"),
            ([_control_meta(Cmd.BARRIER, group=7, request=True)], "barrier_from_unknown_node"),
            ([_control_meta(Cmd.HEARTBEAT, [Node(1, 99, "127.0.0.1", 5)])], "heartbeat_from_unknown_node"),
            ([_control_meta(Cmd.TERMINATE)], "foreign_terminate"),
            ([_control_meta(77)], "unknown_control_cmd"),
        ]
        targets = [(server, server_port, server_cases), (worker, info["port"], worker_cases),
                   (c.scheduler, c.root_port, scheduler_cases)]
        for proc, port, cases in targets:
            start = len(proc.log)
            garbage = _dealer(ctx, port, b"garbage")  # not a psN identity: the sender is kEmpty
            for frames, _reason in cases:
                garbage.send_multipart(frames)
            # a cluster-full ADD_NODE must come without identity; with one it is refused outright
            if proc is c.scheduler:
                _dealer(ctx, port, b"ps77").send_multipart(
                    [_control_meta(Cmd.ADD_NODE, [Node(1, K_EMPTY, "127.0.0.1", 5)])])
                cases = cases + [(None, "add_node_with_identity")]
            for _frames, reason in cases:
                proc.wait_log(rf"event=frame_rejected reason={reason} ", start=start)
            expected_total = len(cases)
            proc.wait_log(rf"event=frame_rejected .* total={expected_total} ", start=start)
            assert proc.alive(), proc.name
    finally:
        ctx.destroy(linger=0)
    # everyone still serves: KV traffic, a SimpleApp round trip, barriers through the scheduler
    assert worker.cmd(op="push", keys=[1, 2], vals=[0.5, 0.25]) == {"ok": True}
    assert worker.cmd(op="pull", keys=[1, 2]) == {"vals": [0.5, 0.25]}
    assert worker.cmd(op="ask_servers")["servers"][0]["count"] == 4
    assert worker.cmd(op="finalize") == {"ok": True}
    for p in (c.scheduler, server, worker):
        assert p.p.wait(20) == 0, p.name


def test_elastic_workers_join_late_leave_and_die(cluster_factory):
    c = cluster_factory(1, 1, LIVEVEC_ELASTIC_WORKERS="1", ELASTIC="1", PS_HEARTBEAT_INTERVAL="0.2",
                        PS_HEARTBEAT_TIMEOUT="1.0")
    server = c.server()
    first = c.worker("first")
    assert first.read() == {"id": 9, "port": _node_port(first), "recovery": False}
    assert first.cmd(op="push", keys=[1, 2**63], vals=[1.0, 1.0]) == {"ok": True}

    late = c.worker("late")  # DMLC_NUM_WORKER=1 is already reached: admitted as an extra worker
    late_info = late.read()
    assert late_info["id"] == 11 and late_info["recovery"] is True
    c.scheduler.wait_log(r"event=worker_joined id=11")
    assert late.cmd(op="push", keys=[1, 2**63], vals=[2.0, 2.0]) == {"ok": True}  # the server answers it
    assert late.cmd(op="pull", keys=[1, 2**63]) == {"vals": [3.0, 3.0]}
    # a barrier over the worker group now needs both workers
    first.send(op="barrier", group=4)
    with pytest.raises(queue.Empty):
        first.lines.get(timeout=0.5)
    assert late.cmd(op="barrier", group=4) == {"ok": True}
    assert first.read() == {"ok": True}

    assert late.cmd(op="leave") == {"ok": True}
    assert late.p.wait(20) == 0
    c.scheduler.wait_log(r"event=worker_removed id=11 reason=left")
    assert first.cmd(op="barrier", group=4, timeout=10) == {"ok": True}  # only live workers count

    doomed = c.worker("doomed")
    assert doomed.read()["id"] == 11  # the lowest free worker id is reused
    doomed.kill9()
    c.scheduler.wait_log(r"event=worker_removed id=11 reason=dead")
    assert first.cmd(op="pull", keys=[1, 2**63]) == {"vals": [3.0, 3.0]}
    assert first.cmd(op="finalize") == {"ok": True}  # the final barrier does not wait for the dead
    for p in (c.scheduler, server, first):
        assert p.p.wait(20) == 0, p.name


def test_a_worker_admitted_before_the_start_barrier_is_not_waited_for(cluster_factory):
    """(Extension) an elastic worker admitted after cluster_ready starts as a recovering node and skips
    the start barrier; the barrier must not wait for it. (The front end joins as a worker: when it takes
    the last initial slot, the trainer that comes next is such a worker: were it waited for, every node
    would hang.)"""
    from ps_bridge.postoffice import Postoffice
    from ps_bridge.settings import NodeSettings

    c = cluster_factory(1, 2, LIVEVEC_ELASTIC_WORKERS="1", ELASTIC="1", PS_HEARTBEAT_INTERVAL="0.2",
                        PS_HEARTBEAT_TIMEOUT="2.0")
    server = c.server()
    first = c.worker("first")
    # the second initial worker registers but holds its start barrier back (ps::StartAsync)
    slow = Postoffice(NodeSettings.from_env({**c.env, "DMLC_ROLE": "worker"}, role="worker",
                                            elastic_workers=True))
    try:
        slow.start(do_barrier=False, timeout=20)
        c.scheduler.wait_log(r"event=cluster_ready")
        late = c.worker("late")
        assert late.read()["recovery"] is True     # admitted after cluster_ready: no start barrier
        c.scheduler.wait_log(r"event=worker_joined id=13")
        slow.barrier(0, ALL_GROUP, timeout=10)     # the last initial node arrives: the barrier is released
        assert first.read()["id"] in (9, 11)
        assert first.cmd(op="push", keys=[1, 2**63], vals=[1.0, 1.0]) == {"ok": True}
        assert late.cmd(op="pull", keys=[1, 2**63]) == {"vals": [1.0, 1.0]}
    finally:
        slow.stop()
