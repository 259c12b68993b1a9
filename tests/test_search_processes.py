"""Search processes read the front end's model from shared memory and answer as it would.

In process: real search processes (OS processes mapping the memfd blocks) answer ``search_rows``
exactly as the snapshot itself does, through syncs that write rows out of place, grow the pool,
add words, re-file rows in the lists and free old blocks; a killed process costs a fallback and a
restart, never an answer. Through the real front end (``livevec frontend`` with
``LIVEVEC_SEARCH_PROCESSES``): HTTP answers are the same as a front end without processes, and a
process searching the whole model gains shared pages, not private ones.
"""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from online.search import shared_arrays
from online.search.delta import ModelDelta
from online.search.ivf_build import IvfMaintainer
from online.search.model_index import ModelHolder, ModelIndex, SearchConfig
from online.search.search_processes import SearchProcesses
from online.learner.keys import word_keys
from tests.frontend_process import clean_env, running_frontend
from tests.support.http import get


@pytest.fixture
def shared():
    """Shareable allocation for this test only (the switch is process-wide)."""
    shared_arrays.enable()
    yield
    shared_arrays._enabled = False


def clustered(n: int, dim: int, clusters: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim))
    return (centres[rng.integers(0, clusters, n)] + 0.6 * rng.standard_normal((n, dim))).astype(np.float32)


def with_lists(vectors: np.ndarray) -> ModelHolder:
    config = SearchConfig(ivf_min_rows=1000)
    words = [f"w{i}" for i in range(len(vectors))]
    holder = ModelHolder(config)
    holder.swap(ModelIndex.from_arrays(1, word_keys(words), words, vectors, config=config))
    assert IvfMaintainer(holder, config).build_now("test")
    holder.swap(holder.current.apply(ModelDelta.unchanged(2, vectors.shape[1])))
    assert holder.current.search_mode() == "ivf"
    return holder


def queries_of(index: ModelIndex, rng, b: int):
    rows = rng.choice(index.n, b, replace=False)
    q = index.unit_rows(rows)
    q += 0.05 * rng.standard_normal(q.shape).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return q.astype(np.float32), [[int(r)] for r in rows], [int(k) for k in rng.integers(1, 30, b)]


def same(a, b) -> None:
    top_a, scores_a, why_a = a
    top_b, scores_b, why_b = b
    assert why_a == why_b
    np.testing.assert_array_equal(top_a, top_b)
    np.testing.assert_array_equal(scores_a, scores_b)


def test_processes_answer_as_the_snapshot_through_syncs_growth_and_frees(shared):
    holder = with_lists(clustered(30_000, 48, 120, seed=1))
    procs = SearchProcesses(2)
    procs.start()
    try:
        rng = np.random.default_rng(2)
        first_pool = holder.current._pool
        assert shared_arrays.describe(first_pool) is not None      # the rows are in a shareable block
        for version in range(3, 23):
            index = holder.current
            for _ in range(3):                                       # both processes, same snapshot again
                q, ex, ks = queries_of(index, rng, 16)
                same(procs.search_rows(index, q, ex, ks), index.search_rows(q, ex, ks))
            q, ex, ks = queries_of(index, rng, 4)                    # exact answers too
            exact = ModelIndex.for_search(index.n, index.dim, index.n_tiles,
                                          SearchConfig(search="exact"), {n: getattr(index, n) for n in
                                                                         ModelIndex.SEARCHED}, None)
            same(procs.search_rows(exact, q, ex, ks), index.search_rows(q, ex, ks, exact=True))
            # a sync: rows change (written out of place), words arrive (the pool grows past its capacity)
            changed = rng.choice(index.n, 3000, replace=False)
            words = [index.words[r] for r in changed] + [f"new{version}_{i}" for i in range(2500)]
            vectors = clustered(len(words), 48, 120, seed=version)
            holder.swap(index.apply(ModelDelta(word_keys(words), words, vectors, np.ones(len(words), np.int64),
                                               version)))
            del index, exact
        assert holder.current._pool.base is not first_pool.base     # the pool grew into new blocks ...
        del first_pool
        assert procs.counters == {"calls": 20 * 4, "fallbacks": 0, "restarts": 0}
        mapped = [p.ask("memory")["blocks_mapped"] for p in procs._procs]
        live = shared_arrays.report()["blocks"]
        assert all(0 < m <= live for m in mapped), (mapped, live)  # ... and the old ones were unmapped there
    finally:
        procs.stop()


def test_a_killed_process_costs_a_fallback_and_a_restart_not_an_answer(shared):
    holder = with_lists(clustered(5000, 16, 30, seed=3))
    procs = SearchProcesses(1)
    procs.start()
    try:
        index, rng = holder.current, np.random.default_rng(4)
        q, ex, ks = queries_of(index, rng, 8)
        expected = index.search_rows(q, ex, ks)
        same(procs.search_rows(index, q, ex, ks), expected)
        victim = procs.pids()[0]
        os.kill(victim, signal.SIGKILL)
        time.sleep(0.3)
        same(procs.search_rows(index, q, ex, ks), expected)          # searched here
        assert procs.counters["fallbacks"] == 1 and procs.pids() == []
        time.sleep(1.1)                                             # the restart's back-off
        same(procs.search_rows(index, q, ex, ks), expected)          # by the new process
        assert procs.counters["restarts"] == 1 and procs.pids() and procs.pids()[0] != victim
    finally:
        procs.stop()


def _serve_and_ask(processes: int, words_asked: int = 200):
    env = clean_env(LIVEVEC_SYNTHETIC_WORDS="150000", LIVEVEC_SYNTHETIC_UPDATES="0", LIVEVEC_SYNTHETIC_NEW_WORDS="0",
                    LIVEVEC_SEARCH_PROCESSES=str(processes), LIVEVEC_IVF_MIN_ROWS="50000",
                    LIVEVEC_IVF_NPROBE_AUTO="0")
    with running_frontend(["--source", "online.frontend.synthetic:create_source"], env) as (url, proc):
        url = url.rstrip("/")

        def ask(path: str):   # 150,000 words on two cores: a long answer may take a while
            return get(url + path, timeout=60).json()

        deadline = time.time() + 120
        while True:
            stats = ask("/v1/stats")
            if stats["ready"] and stats["search"]["ivf"]:
                break
            assert time.time() < deadline, "the front end never built its lists"
            time.sleep(0.3)
        words = [w["word"] for w in ask(f"/v1/vocab?limit={words_asked}")["words"]]
        warm = [ask(f"/v1/similar?word={w}&k=1") for w in words[:4]]   # the processes have started
        time.sleep(5.1)                                   # the memory reading is cached for 5 s
        before = ask("/v1/stats")["search"]["search_processes"]
        answers = warm + [ask(f"/v1/similar?word={w}&k=10") for w in words]
        answers += [ask(f"/v1/similar?word={w}&k=1000") for w in words[:20]]   # long answers: more rows
        time.sleep(5.1)                                   # the memory reading is cached for 5 s
        after = ask("/v1/stats")["search"]["search_processes"]
        return [[(n["word"], n["score"]) for n in a["neighbours"]] for a in answers[4:]], before, after


@pytest.mark.slow
def test_the_front_end_answers_the_same_through_processes_that_share_its_rows():
    alone, none, _ = _serve_and_ask(0)
    assert none is None
    through, before, after = _serve_and_ask(2)
    assert through == alone
    assert after["calls"] == len(alone) + 4 and after["fallbacks"] == 0
    # searching mapped the model's pages into the processes (shared), and made few pages of their own
    model_bytes = 150_000 * 100 * 4
    for b in before["processes"]:
        a = next(p for p in after["processes"] if p["pid"] == b["pid"])
        print(b, a)
        assert a["shared"] - b["shared"] > 0.1 * model_bytes, (b, a)
        assert a["private"] - b["private"] < 0.1 * model_bytes, (b, a)


def test_processes_need_the_query_thread_and_say_so_at_start():
    from online.frontend.settings import settings_from
    from ps_bridge.settings import SettingError
    env = {"LIVEVEC_MODEL_SOURCE": "online.frontend.synthetic:create_source", "LIVEVEC_SEARCH_PROCESSES": "2",
           "LIVEVEC_QUERY_THREAD": "0"}
    with pytest.raises(SettingError, match="LIVEVEC_SEARCH_PROCESSES"):
        settings_from(None, env)
    with pytest.raises(SettingError, match="LIVEVEC_SEARCH_PROCESSES"):
        settings_from(None, {**env, "LIVEVEC_QUERY_THREAD": "1", "LIVEVEC_SEARCH_PROCESSES": "-1"})
    assert settings_from(None, {**env, "LIVEVEC_QUERY_THREAD": "1"}).search_processes == 2


def test_a_killed_front_end_leaves_no_search_process_behind():
    env = clean_env(LIVEVEC_SYNTHETIC_WORDS="2000", LIVEVEC_SEARCH_PROCESSES="2")
    with running_frontend(["--source", "online.frontend.synthetic:create_source"], env) as (url, proc):
        url = url.rstrip("/")
        pids = get(url + "/v1/stats").json()["search"]["search_processes"]["pids"]
        assert len(pids) == 2 and all(os.path.exists(f"/proc/{p}") for p in pids)
        proc.kill()
        proc.wait()
        deadline = time.time() + 10
        while any(_alive(p) for p in pids) and time.time() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids), pids


def _alive(pid: int) -> bool:
    """Running, not a zombie (an orphan is reaped by init, but a zombie still has /proc/<pid>)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
