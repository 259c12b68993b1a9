"""NodeSettings: ps-lite's variables, their validation, and start-up with a DNS scheduler name."""
from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from ps_bridge.postoffice import Postoffice, server_key_ranges
from ps_bridge.roles import start_scheduler, start_server, start_worker
from ps_bridge.settings import NodeSettings, SettingError

REPO = Path(__file__).resolve().parents[1]
BASE = {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "9091",
        "DMLC_NUM_SERVER": "2", "DMLC_NUM_WORKER": "3"}


def test_reads_pslite_variables():
    s = NodeSettings.from_env({**BASE, "DMLC_NODE_HOST": "10.0.0.7", "PORT0": "31005", "PS_VERBOSE": "1",
                               "PS_HEARTBEAT_INTERVAL": "5", "DMLC_PS_WATER_MARK": "100"})
    assert (s.role, s.root_uri, s.root_port, s.num_server, s.num_worker) == ("worker", "10.0.0.1", 9091, 2, 3)
    assert (s.node_host, s.port, s.verbose, s.heartbeat_interval, s.water_mark) == ("10.0.0.7", 31005, 1, 5.0, 100)
    assert s.heartbeat_timeout == 0 and not s.elastic_workers
    assert NodeSettings.from_env({**BASE, "PORT": "31000", "PORT0": "31005"}).port == 31000
    assert NodeSettings.from_env(BASE).port == 0


def test_flags_override_the_environment():
    s = NodeSettings.from_env(BASE, role="server", root_port=7000, num_worker=1, elastic_workers=True)
    assert (s.role, s.root_port, s.num_worker, s.elastic_workers) == ("server", 7000, 1, True)
    assert s.heartbeat_interval > 0 and s.heartbeat_timeout > s.heartbeat_interval  # elastic turns them on


@pytest.mark.parametrize("change, setting", [
    ({"DMLC_ROLE": None}, "DMLC_ROLE"),
    ({"DMLC_ROLE": "master"}, "DMLC_ROLE"),
    ({"DMLC_PS_ROOT_URI": None}, "DMLC_PS_ROOT_URI"),
    ({"DMLC_PS_ROOT_URI": "tcp://x:1"}, "DMLC_PS_ROOT_URI"),
    ({"DMLC_PS_ROOT_PORT": None}, "DMLC_PS_ROOT_PORT"),
    ({"DMLC_PS_ROOT_PORT": "0"}, "DMLC_PS_ROOT_PORT"),  # only a scheduler may pick a free port
    ({"DMLC_PS_ROOT_PORT": "70000"}, "DMLC_PS_ROOT_PORT"),
    ({"DMLC_NUM_SERVER": None}, "DMLC_NUM_SERVER"),
    ({"DMLC_NUM_SERVER": "0"}, "DMLC_NUM_SERVER"),
    ({"DMLC_NUM_WORKER": "two"}, "DMLC_NUM_WORKER"),
    ({"DMLC_NUM_WORKER": "0"}, "DMLC_NUM_WORKER"),
    ({"PORT": "-1"}, "PORT"),
    ({"PORT0": "abc"}, "PORT0"),
    ({"PS_VERBOSE": "3"}, "PS_VERBOSE"),
    ({"PS_HEARTBEAT_INTERVAL": "soon"}, "PS_HEARTBEAT_INTERVAL"),
    ({"PS_HEARTBEAT_INTERVAL": "2", "PS_HEARTBEAT_TIMEOUT": "1"}, "PS_HEARTBEAT_TIMEOUT"),
    ({"DMLC_NODE_HOST": "a b"}, "DMLC_NODE_HOST"),
])
def test_bad_settings_name_the_setting(change, setting):
    env = dict(BASE)
    for k, v in change.items():
        if v is None:
            env.pop(k)
        else:
            env[k] = v
    with pytest.raises(SettingError) as info:
        NodeSettings.from_env(env)
    assert info.value.setting == setting and setting in str(info.value)


def test_elastic_allows_starting_without_workers():
    assert NodeSettings.from_env({**BASE, "DMLC_NUM_WORKER": "0"}, elastic_workers=True).num_worker == 0
    # ps_bridge knows no product's variables: the extension is the caller's choice
    with pytest.raises(SettingError):
        NodeSettings.from_env({**BASE, "DMLC_NUM_WORKER": "0", "LIVEVEC_ELASTIC_WORKERS": "1"})


def test_unknown_interface_is_a_setting_error():
    po = Postoffice(NodeSettings.from_env({**BASE, "DMLC_INTERFACE": "nosuchif"}))
    with pytest.raises(SettingError) as info:
        po.bind()
    assert info.value.setting == "DMLC_INTERFACE"
    po.stop()


def test_livevec_scheduler_command_reports_missing_setting():
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "DMLC_PS_ROOT_URI": "127.0.0.1",
           "DMLC_PS_ROOT_PORT": "0", "DMLC_NUM_WORKER": "1"}
    r = subprocess.run([sys.executable, "-m", "online.cli", "scheduler"], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "DMLC_NUM_SERVER" in r.stderr


def test_key_ranges_match_pslite():
    assert server_key_ranges(1) == [(0, 0xFFFFFFFFFFFFFFFF)]
    assert server_key_ranges(2) == [(0, 0x7FFFFFFFFFFFFFFF), (0x7FFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFE)]
    r4 = server_key_ranges(4)
    assert [b for _, b in r4] == [0x3FFFFFFFFFFFFFFF, 0x7FFFFFFFFFFFFFFE, 0xBFFFFFFFFFFFFFFD, 0xFFFFFFFFFFFFFFFC]


def test_scheduler_known_by_dns_name_binds_all_interfaces_and_others_connect_by_name():
    common = {"root_uri": "localhost", "num_server": 1, "num_worker": 1, "node_host": "127.0.0.1"}
    sched, thread = start_scheduler(NodeSettings.from_env({}, role="scheduler", root_port=0, **common))
    assert sched.van.bind_endpoint.startswith("tcp://0.0.0.0:")
    assert sched.my_node.hostname == "localhost"  # advertised by name, as the node list carries it
    port = sched.my_node.port
    started = {}
    t = threading.Thread(target=lambda: started.setdefault(
        "server", start_server(settings=NodeSettings.from_env({}, role="server", root_port=port, **common),
                               timeout=20)))
    t.start()
    worker = start_worker(NodeSettings.from_env({}, role="worker", root_port=port, **common), timeout=20)
    t.join(20)
    server = started["server"]
    keys = np.array([3, 2**63], np.uint64)
    worker.wait(worker.push(keys, np.array([1.5, 2.5], np.float32)), 10)
    assert worker.pull_sync(keys, timeout=10).tolist() == [1.5, 2.5]
    with pytest.raises(ValueError):
        worker.push(np.array([2, 1], np.uint64), np.ones(2, np.float32))  # unsorted keys
    with pytest.raises(ValueError):
        worker.push(np.array([2**64 - 1], np.uint64), np.ones(1, np.float32))  # beyond the last range
    threads = [threading.Thread(target=n.po.finalize) for n in (server, worker)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    thread.join(20)
    assert not thread.is_alive()
