"""Background work runs below the similarity queries (``online/frontend/thread_priority.py``).

On a shared core the syncs, the inverted file's builds and recall checks and the analytics
requests must take the CPU the queries leave, not half of it: their threads (the loop's default
executor, behind every ``asyncio.to_thread``) carry a higher nice value than the event loop and
the query threads. Read back from the kernel (``/proc``), in a real front end serving HTTP.
"""
from __future__ import annotations

import asyncio
import os
import threading

import aiohttp
import numpy as np
import pytest

from online.frontend.settings import FrontendSettings
from online.frontend.thread_priority import MAX_NICE, background_executor
from ps_bridge.settings import SettingError
from tests.test_frontend_ivf import StaticSource, _serve


def nice_of(tid: int) -> int:
    """The nice value the kernel holds for thread ``tid`` of this process (field 19 of its stat)."""
    stat = open(f"/proc/self/task/{tid}/stat").read()
    return int(stat.rsplit(")", 1)[1].split()[16])


def threads_named(prefix: str) -> list[int]:
    return [t.native_id for t in threading.enumerate() if t.name.startswith(prefix)]


def test_the_pool_lowers_its_own_threads_only():
    base = nice_of(threading.get_native_id())
    with background_executor(5) as pool:
        assert pool.submit(lambda: nice_of(threading.get_native_id())).result() == min(MAX_NICE, base + 5)
    with background_executor(40) as pool:                 # capped at the kernel's lowest priority
        assert pool.submit(lambda: nice_of(threading.get_native_id())).result() == MAX_NICE
    assert nice_of(threading.get_native_id()) == base      # the caller keeps its priority


@pytest.mark.parametrize("steps", [10, 0])
async def test_the_front_ends_background_runs_below_its_queries(steps):
    base = nice_of(threading.get_native_id())
    settings = FrontendSettings(source="test", sync_interval=0.05, background_nice=steps).validate()
    vectors = np.random.default_rng(0).standard_normal((500, 8)).astype(np.float32)
    server, base_url = await _serve(settings, StaticSource(vectors))
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(base_url + "/v1/similar?word=w1&k=3") as r:
                assert r.status == 200 and len((await r.json())["neighbours"]) == 3
        background = await asyncio.to_thread(lambda: nice_of(threading.get_native_id()))
        syncing = threads_named("background")
        queries = threads_named("similarity-queries")
        assert syncing and queries
        assert {nice_of(t) for t in syncing} == {min(MAX_NICE, base + steps)}   # the syncs ran in them
        assert {nice_of(t) for t in queries} == {base}
        assert background == min(MAX_NICE, base + steps)
        assert nice_of(threading.get_native_id()) == base     # the event loop's thread
    finally:
        await server.close()
    # the loop outlives the app: its default executor is an ordinary one again
    assert await asyncio.to_thread(lambda: nice_of(threading.get_native_id())) == base


def test_a_nice_out_of_range_names_the_setting():
    with pytest.raises(SettingError, match="LIVEVEC_BACKGROUND_NICE"):
        FrontendSettings(source="test", background_nice=20).validate()


def test_a_sandbox_that_refuses_the_priority_still_gets_a_working_pool(monkeypatch, caplog):
    """seccomp can refuse setpriority; the pool must start anyway (a broken pool fails every sync),
    at the queries' priority, with one warning for all its threads."""
    from online.frontend import thread_priority

    def refuse(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(thread_priority.os, "setpriority", refuse)
    monkeypatch.setattr(thread_priority, "_refused", False)
    base = nice_of(threading.get_native_id())
    with caplog.at_level("WARNING", logger="livevec.frontend"):
        with background_executor(10, max_workers=3) as pool:
            got = list(pool.map(lambda _: (threading.get_native_id(), nice_of(threading.get_native_id())),
                                range(30)))
    assert {nice for _, nice in got} == {base}
    assert sum("background_priority_refused" in r.getMessage() for r in caplog.records) == 1
