"""The scaling model's arithmetic (bench/scaling_model.py): pure logic, no cluster."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import scaling_model as sm  # noqa: E402

TEN = sm.Link(10.0, rtt_us=100.0)


def costs(**kw) -> sm.Costs:
    base = dict(k=16, parallel=2.0, sync=0.01, server=0.5, bytes_out=10.0, bytes_in=10.0, interval=2500, bound=1.5)
    base.update(kw)
    return sm.Costs(**base)


def test_the_resource_named_first_is_the_smallest_bound():
    c = costs()
    rate, first, b = sm.cluster(c, hosts=16, cores=16, servers=64, link=TEN)
    assert rate == min(b.values()) and b[first] == rate
    assert first == "worker cores"                 # 256 cores at 2.2 µs: 116M; the rest is larger
    assert b["worker cores"] == pytest.approx(16 * 16 / 2.01 * 1e6, rel=1e-3)


def test_a_server_bound_cluster_gains_from_twice_the_servers():
    c = costs(server=20.0)
    one_rate, one_first, _ = sm.cluster(c, 16, 16, 4, TEN)
    two_rate, _, _ = sm.cluster(c, 16, 16, 8, TEN)
    assert one_first == "server cores"
    assert two_rate == pytest.approx(2 * one_rate, rel=0.02)


def test_the_sizing_rule_names_the_fewest_servers_that_never_run_out_first():
    c = costs(server=2.0)
    s, clears = sm.servers_needed(c, 16, 16, TEN)
    assert clears
    assert sm.cluster(c, 16, 16, s, TEN)[1] not in ("server cores", "server links")
    assert sm.cluster(c, 16, 16, s - 1, TEN)[1] in ("server cores", "server links")


def test_a_fixed_cost_per_sync_caps_the_servers_whatever_their_number():
    # each server pays 1,000 µs per sync of 156 tokens: the servers carry at most 156k tokens/s in all
    c = costs(server=0.1, server_fixed_us=1000.0, interval=156)
    capped = [sm.cluster(c, 64, 16, s, TEN)[2]["server cores"] for s in (64, 256, 1024)]
    assert all(r < 156 / 1000 * 1e6 for r in capped)
    s, clears = sm.servers_needed(c, 64, 16, TEN)
    assert not clears
    assert sm.cluster(c, 64, 16, s, TEN)[1] == "server cores"


def test_a_slow_link_makes_the_host_syncs_or_links_run_out_first():
    c = costs(bytes_out=2000.0, bytes_in=8000.0)
    rate, first, b = sm.cluster(c, 16, 16, 1024, sm.Link(1.0))
    assert first in ("host syncs", "worker links")
    # a host's sync sends its deltas, then takes the merged rows back: both directions count, one after the other
    assert b["host syncs"] < b["worker links"]


def test_nnls_recovers_a_per_byte_and_a_per_sync_cost():
    pts = [(b, 0.2 + 0.004 * b + 300.0 / t, t) for b, t in ((30, 160_000), (600, 10_000), (1800, 2500), (300, 40_000))]
    c0, a, b = sm.fit_per_sync(pts)
    assert (c0, a, b) == pytest.approx((0.2, 0.004, 300.0), rel=1e-6)


def test_the_simulation_line_is_read():
    line = ("trained: 1,977,510 tokens kept (65.9% of those read), 11,446,747 pairs; per kept token: 2.15 rows out "
            "(deltas merged), 7.27 rows in (answered), 5.7 changed keys listed, about 299 / 1,528 B out / in; 27.0")
    s = sm.parse_simulation(16, "noise\n" + line + "\n")
    assert (s.rows_out, s.rows_in, s.bytes_out, s.bytes_in) == (2.15, 7.27, 299.0, 1528.0)
    assert sm.parse_simulation(16, "round 1: 40,000 tokens") is None


def run_line(workers, replicas, wps, stages, server, b_out, b_in):
    worker = sum(stages.values())
    return {"bench": "cluster_learning", "workers": workers, "replicas": replicas, "date": "2026-01-01T00:00:00",
            "livevec": {"seconds": 100.0, "words_per_second": wps, "cores_busy": 1.9,
                        "worker_bound_wait_seconds": 10.0, "loadavg_window": ["2.0 2 2", "2.5 2 2"],
                        "cpu_us_per_token": {"worker": worker, "server": server, "scheduler": 0.0, "kafka": 0.1},
                        "worker_cpu_us_per_token_by_stage": stages,
                        "ps_bytes_per_token": {"workers_to_servers": {"sent_by_workers": b_out},
                                               "servers_to_workers": {"sent_by_servers": b_in}}}}


def test_the_kernel_comes_from_one_replica_and_the_exchange_is_what_k_replicas_add(tmp_path):
    one = {"prepare": 0.4, "kernel": 0.9, "sync": 0.3, "event loop": 0.1, "other": 0.1}
    eight = {"prepare": 0.8, "kernel": 3.4, "sync": 2.0, "event loop": 1.1, "other": 0.6}   # inflated kernel
    p1, p8 = tmp_path / "one.out", tmp_path / "eight.out"
    p1.write_text("text\n" + json.dumps(run_line(2, 1, 800_000, one, 0.2, 20, 10)) + "\n"
                  + json.dumps(run_line(2, 1, 900_000, one, 0.4, 20, 10)) + "\n")
    p8.write_text(json.dumps(run_line(8, 8, 400_000, eight, 3.0, 300, 600)) + "\n")
    m1, m8 = sm.load_run(1, str(p1)), sm.load_run(8, str(p8))
    assert m1.runs == 2 and m1.server == pytest.approx(0.3)        # the median of the two runs
    model = sm.Model({1: m1, 8: m8}, server_per_sync_us=0.0, worker_per_sync_us=0.0)
    c = model.costs(8)
    # prepare + kernel + event loop + other of one replica, plus the event loop and rest 8 replicas add
    assert c.parallel == pytest.approx(0.4 + 0.9 + 0.1 + 0.1 + (1.7 - 0.2))
    assert c.sync == pytest.approx(2.0) and c.server == pytest.approx(3.0)
    assert c.interval == 10_000


def test_beyond_the_runs_the_exchange_grows_by_the_simulations_rows():
    one = sm.Measured(k=1, source="", worker=1.8, server=0.2, stages={"prepare": 0.4, "kernel": 0.9, "sync": 0.3,
                                                                      "event loop": 0.1, "other": 0.1},
                      bytes_out=20, bytes_in=10)
    sixteen = sm.Measured(k=16, source="", worker=4.0, server=2.0, stages={"prepare": 0.5, "kernel": 1.0, "sync": 1.5,
                                                                          "event loop": 0.6, "other": 0.4},
                          bytes_out=300, bytes_in=1500)
    sims = {16: sm.Simulated(16, 2.0, 8.0, 0, 0), 64: sm.Simulated(64, 4.0, 24.0, 0, 0)}
    model = sm.Model({1: one, 16: sixteen}, sims, server_per_sync_us=50.0, worker_per_sync_us=0.0, cores=1)
    c16, c64 = model.costs(16), model.costs(64)
    assert c64.server == pytest.approx(c16.server * 2.8)             # (4 + 24) / (2 + 8) rows per kept token
    assert c64.bytes_out == pytest.approx(600) and c64.bytes_in == pytest.approx(4500)
    assert c64.parallel - model.costs(1).parallel == pytest.approx((c16.parallel - model.costs(1).parallel) * 2.8)
    assert c64.interval == sm.replica_interval(64, 1) and c64.server_fixed_us == 50.0
    assert model.costs(32) is None                                   # no simulation at 32: no figures


def test_a_record_keeps_the_costs_the_model_ran_on(tmp_path, capsys):
    one = {"prepare": 0.4, "kernel": 0.9, "sync": 0.3, "event loop": 0.1, "other": 0.1}
    eight = {"prepare": 0.5, "kernel": 2.7, "sync": 2.7, "event loop": 0.6, "other": 0.5}
    p1, p8, rec = tmp_path / "one.out", tmp_path / "eight.out", tmp_path / "scaling_model.json"
    p1.write_text(json.dumps(run_line(2, 1, 870_000, one, 0.23, 21, 9)) + "\n")
    p8.write_text(json.dumps(run_line(8, 8, 190_000, eight, 2.3, 206, 481)) + "\n")
    sm.main(["--run", f"1={p1}", "--run", f"8={p8}", "--hosts", "1,8", "--record", str(rec)])
    first = capsys.readouterr().out
    body = json.loads(rec.read_text())
    assert [row["key"] for row in body["rows"]] == ["scaling_model"]
    assert "missed" in body["rows"][0]["status"]          # no figures at 16 and 64 hosts: nothing is met
    assert set(body["measured"]) == {"1", "8"}
    sm.main(["--costs", str(rec), "--hosts", "1,8"])
    assert capsys.readouterr().out == first               # the same model from the recorded costs


def test_a_k_the_simulation_has_not_reached_follows_the_power_law_of_the_two_before():
    sims = {8: sm.Simulated(8, 1.0, 2.0, 0, 0), 16: sm.Simulated(16, 2.0, 8.0, 0, 0)}
    model = sm.Model({1: sm.Measured(k=1, source="", worker=1.8, server=0.2, bytes_out=20, bytes_in=10),
                      16: sm.Measured(k=16, source="", worker=4.0, server=2.0, bytes_out=300, bytes_in=1500)},
                     sims, server_per_sync_us=0.0, worker_per_sync_us=0.0)
    c = model.costs(64)   # two doublings past 16: out x2 each, in x4 each
    assert c.bytes_out == pytest.approx(300 * 4) and c.bytes_in == pytest.approx(1500 * 16)
    assert "as a power of k" in c.how


def test_a_host_of_16_processes_syncs_its_replica_every_16_process_intervals():
    from online.cluster import sync_interval as si

    assert sm.replica_interval(1, 16) == si.SYNC_TOKENS_MAX
    one_each = sm.replica_interval(16, 1)                # 16 replicas of one process each
    assert sm.replica_interval(16, 16) == 16 * (one_each // 16)
    assert sm.replica_interval(64, 16) >= 16 * si.SYNC_TOKENS_MIN > sm.replica_interval(64, 1)
