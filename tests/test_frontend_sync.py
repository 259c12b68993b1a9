"""Sync atomicity and the index's correctness under deltas.

The atomicity test serves a model in which every vector of version v carries v's
signature. Each row has a "version part" B * (cos psi_v, sin psi_v) and the query word's
vector has minus that, so any row of another version scores higher than every row of
version v and jumps into the top k; the ranking of the words is also shifted by v. A query
that mixed two versions (rows from two syncs, or the query vector from one and the rows
from another) therefore returns different words or scores than the exact answer for the
version it reports. Readers hammer the live HTTP server while syncs swap in a new version
every few milliseconds.
"""
from __future__ import annotations

import asyncio
import math
import random

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from online.frontend.app import create_app
from online.search.model_index import ModelIndex
from online.frontend.query_engine import QueryEngine
from online.frontend.settings import FrontendSettings
from online.search.delta import ModelDelta
from online.search.snapshot_writer import full_load_buffer
from ps_bridge.metrics import Registry
from online.learner.keys import word_key, word_keys

N = 2000
DIM = 8
SHIFT = 7
K = 10


B = 2.0                      # weight of the version part (see the module docstring)
GOLDEN = math.pi * (3 - math.sqrt(5))


def psi(v: int) -> float:
    return (GOLDEN * v) % (2 * math.pi)


def target_score(rank: int) -> float:
    """Cosine of the word of this rank with q, in q's own version."""
    return (0.9 - 0.4 * rank / N - B * B) / (1 + B * B)


def expected_top(v: int, k: int = K) -> list[tuple[str, float]]:
    return [(f"s{(r - SHIFT * v) % N}", target_score(r)) for r in range(k)]


def query_vector(v: int) -> list[float]:
    return [1.0, 0.0, -B * math.cos(psi(v)), -B * math.sin(psi(v))] + [0.0] * (DIM - 4)


def version_model(v: int):
    """Words s0..s{N-1}, the query word q and the marker x{v}, all signed with version v."""
    ranks = (np.arange(N) + SHIFT * v) % N
    theta = np.arccos(0.9 - 0.4 * ranks / N)
    vectors = np.zeros((N + 2, DIM), dtype=np.float64)
    vectors[:N, 0] = np.cos(theta)
    vectors[:N, 1] = np.sin(theta)
    vectors[:, 2] = B * math.cos(psi(v))
    vectors[:, 3] = B * math.sin(psi(v))
    vectors[N] = query_vector(v)                                             # q
    vectors[N + 1, 0] = -1.0                                                 # x{v}: last in every ranking
    words = [f"s{i}" for i in range(N)] + ["q", f"x{v}"]
    return words, vectors.astype(np.float32)


class SignatureSource:
    """Every call makes a new version in which every row changed; the previous marker word is removed."""

    def __init__(self):
        self.version = 0
        self.calls = 0

    async def changes_since(self, version: int) -> ModelDelta:
        self.calls += 1
        self.version += 1
        v = self.version
        words, vectors = version_model(v)
        full = version == 0 or v % 5 == 0
        removed = np.zeros(0, np.uint64) if full else np.array([word_key(f"x{version}")], dtype=np.uint64)
        order = np.random.default_rng(v).permutation(len(words))     # rows arrive in any order
        return ModelDelta(word_keys([words[i] for i in order]), [words[i] for i in order], vectors[order],
                          np.full(len(words), v, np.int64), v, full=full, removed=removed)

    async def stats(self):
        return {"words_trained": self.version}


def check_neighbours(version: int, neighbours: list[dict], problems: list, what: str) -> None:
    want = expected_top(version, len(neighbours))
    got = [(n["word"], n["score"]) for n in neighbours]
    if len(got) != K or [w for w, _ in got] != [w for w, _ in want] or \
            any(abs(a - b) > 5e-6 for (_, a), (_, b) in zip(got, want)):
        problems.append((what, version, got[:3], want[:3]))


async def reader(session: aiohttp.ClientSession, base: str, until: float, seen: set, problems: list, seed: int):
    rnd = random.Random(seed)
    loop = asyncio.get_running_loop()
    last = 0
    requests = 0
    while loop.time() < until:
        kind = rnd.randrange(6)
        if kind == 0:
            async with session.get(f"{base}/v1/similar?word=q&k={K}") as r:
                body = await r.json()
            check_neighbours(body["version"], body["neighbours"], problems, "similar")
            v = body["version"]
        elif kind == 1:
            async with session.post(f"{base}/v1/similar", json={"words": ["q", "s3", "q"], "k": K}) as r:
                body = await r.json()
            for res in (body["results"][0], body["results"][2]):
                check_neighbours(res["version"], res["neighbours"], problems, "batch")
            v = min(res["version"] for res in body["results"])
        elif kind == 2:
            async with session.get(f"{base}/v1/analogy?positive=q&k={K}") as r:
                body = await r.json()
            check_neighbours(body["version"], body["neighbours"], problems, "analogy")
            v = body["version"]
        elif kind == 3:
            async with session.get(f"{base}/v1/vector/q") as r:
                body = await r.json()
            v = body["version"]
            want = query_vector(v)
            if not np.allclose(body["vector"], want, atol=1e-6):
                problems.append(("vector", v, body["vector"][:4], want[:4]))
        elif kind == 4:
            async with session.get(f"{base}/v1/vocab?prefix=x") as r:
                body = await r.json()
            v = body["version"]
            if [w["word"] for w in body["words"]] != [f"x{v}"] or body["total"] != 1:
                problems.append(("vocab-marker", v, body["words"], f"x{v}"))
        else:
            async with session.get(f"{base}/v1/vocab?prefix=s&limit=5") as r:
                body = await r.json()
            v = body["version"]
            if body["total"] != N or any(w["count"] != v for w in body["words"]):
                problems.append(("vocab-counts", v, body["words"][:2], v))
        if v < last:
            problems.append(("went-back", v, last, None))
        last = v
        seen.add(v)
        requests += 1
    return requests


async def test_queries_never_see_half_a_sync():
    settings = FrontendSettings(source="test", sync_interval=0.01, query_batch=16).validate()
    source = SignatureSource()
    server = TestServer(create_app(settings, source), host="127.0.0.1")
    await server.start_server()
    base = str(server.make_url("")).rstrip("/")
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            for _ in range(500):
                async with session.get(base + "/ready") as r:
                    if r.status == 200:
                        break
                await asyncio.sleep(0.01)
            until = asyncio.get_running_loop().time() + 3.0
            seen: set[int] = set()
            problems: list = []
            counts = await asyncio.gather(*(reader(session, base, until, seen, problems, seed) for seed in range(12)))
    finally:
        await server.close()
    assert not problems, problems[:5]
    assert sum(counts) > 200
    assert len(seen) >= 20, f"only {len(seen)} versions were observed; the syncs did not overlap the queries"


def test_signature_model_is_what_the_check_expects():
    """The checker itself: a correct index passes, a mixed one fails (so the test above can fail)."""
    words, vectors = version_model(4)
    index = ModelIndex.from_arrays(4, word_keys(words), words, vectors)
    got = [{"word": n.word, "score": n.score} for n in index.most_similar(["q"], k=K)]
    problems: list = []
    check_neighbours(4, got, problems, "correct")
    assert not problems
    # half of version 5's rows on top of version 4: the answer no longer matches either version
    words5, vectors5 = version_model(5)
    mixed_vectors = vectors.copy()
    mixed_vectors[: N // 2] = vectors5[: N // 2]
    mixed = ModelIndex.from_arrays(4, word_keys(words), words, mixed_vectors)
    got = [{"word": n.word, "score": n.score} for n in mixed.most_similar(["q"], k=K)]
    check_neighbours(4, got, problems, "mixed-4")
    check_neighbours(5, got, problems, "mixed-5")
    assert len(problems) == 2
    # the query vector of version 5 against the rows of version 4
    problems.clear()
    q5 = vectors5[N] / np.linalg.norm(vectors5[N])
    got = [{"word": n.word, "score": n.score}
           for n in index.top_k(q5[None, :], [[index.row("q")]], [K])[0]]
    check_neighbours(4, got, problems, "q-from-5")
    check_neighbours(5, got, problems, "q-from-5")
    assert len(problems) == 2


# ----------------------------------------------------------------- index deltas
def reference(model: dict[str, tuple[np.ndarray, int]], positive: str, k: int):
    words = sorted(model)
    m = np.array([model[w][0] for w in words], dtype=np.float64)
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    unit = m / np.where(norms == 0, 1, norms)
    q = unit[words.index(positive)]
    scores = unit @ q
    scores[words.index(positive)] = -np.inf
    order = np.argsort(-scores, kind="stable")[:k]
    return [words[i] for i in order], scores[order]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_incremental_deltas_equal_a_full_rebuild(seed):
    """Random adds, updates, removals, duplicate keys and NaN rows applied as deltas give the same
    index as building the final model from scratch."""
    rng = np.random.default_rng(seed)
    dim = 5
    model: dict[str, tuple[np.ndarray, int]] = {}
    index = ModelIndex.empty()
    pool = [f"{random.Random(seed * 1000 + i).choice(['ab', 'abc', 'b', 'ba', 'zz'])}{i}" for i in range(300)]
    version = 0
    for step in range(40):
        version += 1
        present = list(model)
        n_upd = int(rng.integers(0, min(len(present), 30) + 1))
        upd = list(rng.choice(present, n_upd, replace=False)) if n_upd else []
        fresh = [w for w in rng.choice(pool, 20, replace=False) if w not in model][:int(rng.integers(0, 15))]
        gone = [w for w in present if w not in upd and rng.random() < 0.05]
        words = upd + fresh
        vectors = rng.standard_normal((len(words), dim)).astype(np.float32)
        counts = rng.integers(0, 1000, len(words))
        if len(words) > 2 and step % 7 == 3:                       # a duplicate key: the last one wins
            words.append(words[0])
            vectors = np.concatenate([vectors, rng.standard_normal((1, dim)).astype(np.float32)])
            counts = np.append(counts, 5)
        if len(words) and step % 11 == 5:                          # a NaN row is served as a zero vector
            vectors[-1, 0] = np.nan
        full = step % 13 == 12
        if full:
            words = [w for w in dict.fromkeys(list(model) + words) if w not in gone]
            new = rng.standard_normal((len(words), dim)).astype(np.float32)
            cnt = rng.integers(0, 1000, len(words))
            delta = ModelDelta(word_keys(words), words, new, cnt, version, full=True)
            model = {w: (new[i], int(cnt[i])) for i, w in enumerate(words)}
        else:
            delta = ModelDelta(word_keys(words), words, vectors, counts, version,
                               removed=word_keys(gone) if gone else np.zeros(0, np.uint64))
            for w in gone:
                del model[w]
            for i, w in enumerate(words):
                v = vectors[i].copy()
                if not np.isfinite(v).all():
                    v[:] = 0
                model[w] = (v, int(counts[i]))
        index = index.apply(delta)
        assert index.version == version
        assert sorted(index.words) == sorted(model)
        for w, (v, c) in model.items():
            r = index.row(w)
            assert index.words[r] == w and int(index.keys[r]) == word_key(w)
            assert np.allclose(index.vector(r), v, rtol=1e-6, atol=1e-7) and index.counts[r] == c
        assert index.alpha_words == sorted(model)
        for prefix in ("a", "ab", "b", "zz", "q", ""):
            matching = sorted((w for w in model if w.startswith(prefix)), key=lambda w: (-model[w][1], w))
            assert index.prefix(prefix, 7) == [(w, model[w][1]) for w in matching[:7]]
            assert index.prefix_total(prefix) == len(matching)
        if len(model) > 3:
            probe = sorted(model)[len(model) // 2]
            if np.linalg.norm(model[probe][0]) > 0:
                want_words, want_scores = reference(model, probe, 3)
                got = index.most_similar([probe], k=3)
                assert np.allclose([n.score for n in got], want_scores, atol=1e-5)


def test_dimension_mismatch_and_shape_errors_are_rejected():
    index = ModelIndex.from_arrays(1, word_keys(["a", "b"]), ["a", "b"], np.ones((2, 3), np.float32))
    from online.search.delta import ModelDeltaError
    with pytest.raises(ModelDeltaError, match="dimension"):
        index.apply(ModelDelta(word_keys(["c"]), ["c"], np.ones((1, 4), np.float32), np.zeros(1, np.int64), 2))
    with pytest.raises(ModelDeltaError, match="must match"):
        index.apply(ModelDelta(word_keys(["c", "d"]), ["c"], np.ones((2, 3), np.float32), np.zeros(2, np.int64), 2))
    assert index.n == 2 and index.version == 1          # the old snapshot is untouched


@pytest.mark.parametrize("threaded", [True, False])
async def test_batched_engine_answers_equal_single_queries(threaded):
    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(3000)]
    index = ModelIndex.from_arrays(1, word_keys(words), words, rng.standard_normal((3000, 20)).astype(np.float32))

    class Holder:
        current = index
        loaded = True

    registry = Registry()
    engine = QueryEngine(Holder(), max_batch=32, registry=registry, threaded=threaded)
    engine.start()
    try:
        probes = [words[i] for i in rng.choice(3000, 200, replace=False)]
        results = await asyncio.gather(*(engine.query([w], [], 7) for w in probes),
                                       engine.query(["w1", "w2"], ["w3"], 5), engine.query(["nope"], [], 5))
    finally:
        engine.stop()
    for w, res in zip(probes, results):
        assert [n.word for n in res.neighbours] == [n.word for n in index.most_similar([w], k=7)]
    assert [n.word for n in results[-2].neighbours] == [n.word for n in index.most_similar(["w1", "w2"], ["w3"], 5)]
    assert results[-1].unknown == ["nope"] and results[-1].neighbours == []
    text = registry.render()
    batches = float(next(line.split()[-1] for line in text.splitlines()
                         if line.startswith("livevec_frontend_query_batch_size_count")))
    assert batches < 202, "202 concurrent queries should have been fused into fewer matrix products"


class _FullLoads:
    """A source whose every answer is a full load of a new version (a source that resyncs)."""

    def __init__(self):
        self.version = 0

    async def changes_since(self, version: int) -> ModelDelta:
        self.version += 1
        words = [f"w{self.version}_{i}" for i in range(50)]
        rng = np.random.default_rng(self.version)
        return ModelDelta(word_keys(words), words, rng.normal(size=(50, DIM)).astype(np.float32),
                          np.ones(50, np.int64), self.version, full=True)

    async def stats(self) -> dict:
        return {}


@pytest.mark.slow
async def test_a_full_load_is_frozen_out_of_the_collector_and_the_model_it_replaced_is_still_freed():
    import gc
    import weakref

    from online.search.model_index import ModelHolder
    from online.frontend.sync import ModelSync

    class Handover:                      # a reference cycle through the store, as the IVF hand-over makes
        def __init__(self, store):
            self.store = store

    holder = ModelHolder()
    sync = ModelSync(_FullLoads(), holder, interval=0.01, freeze=True)
    task = asyncio.create_task(sync.run())
    try:
        while sync.frozen_objects == 0:
            await asyncio.sleep(0.01)
        first = holder.current
        assert first.n == 50 and gc.get_freeze_count() > 0
        first.store.pending_ivf = Handover(first.store)
        gone = weakref.ref(first.store)
        version, freezes = first.version, sync.freezes
        del first
        while holder.current.version < version + 2 or sync.freezes == freezes:   # replaced, then a freeze
            await asyncio.sleep(0.01)
        assert gone() is None, "the replaced model stayed frozen in its cycle"
        assert sync.report()["frozen_objects"] > 0
    finally:
        sync.stop()
        await task
        gc.unfreeze()


async def test_without_gc_freeze_nothing_is_frozen():
    import gc

    from online.search.model_index import ModelHolder
    from online.frontend.sync import ModelSync

    gc.unfreeze()
    holder = ModelHolder()
    sync = ModelSync(_FullLoads(), holder, interval=0.01, freeze=False)
    task = asyncio.create_task(sync.run())
    try:
        while holder.current.version < 3:
            await asyncio.sleep(0.01)
        assert gc.get_freeze_count() == 0 and sync.frozen_objects == 0
    finally:
        sync.stop()
        await task


def test_the_float32_rows_are_held_once_through_syncs():
    """The rows were double-buffered (two float32 copies, 8 GB at 10M words); now one pool holds them,
    written out of place, and the memory report says so."""
    rng = np.random.default_rng(21)
    n, dim = 20_000, 32
    words = [f"w{i}" for i in range(n)]
    index = ModelIndex.from_arrays(1, word_keys(words), words, rng.standard_normal((n, dim)).astype(np.float32))
    for version in range(2, 8):
        rows = rng.choice(n, 2_000, replace=False)
        index = index.apply(ModelDelta(word_keys([words[r] for r in rows]), [words[r] for r in rows],
                                       rng.standard_normal((len(rows), dim)).astype(np.float32),
                                       np.ones(len(rows), np.int64), version))
    memory = index.memory()
    assert len(index.store.buffers) == 2                    # the small arrays are double-buffered ...
    assert memory["rows_float32"] <= 1.3 * n * dim * 4      # ... the rows are not (1.25x capacity)
    assert memory["total"] == sum(v for k, v in memory.items() if k != "total")
    assert memory["words"] > n * 8


def test_a_full_load_in_its_buffer_becomes_the_pool_and_answers_as_a_copied_one():
    """A source that assembles a full load in ``full_load_buffer`` hands the index its one copy of the model
    (normalised in place, adopted as the pool); any other delta's vectors are copied and left as they were."""
    rng = np.random.default_rng(5)
    n, dim = 5_000, 16
    words = [f"w{i}" for i in range(n)]
    raw = rng.standard_normal((n, dim)).astype(np.float32)
    loaded = full_load_buffer(n, dim)
    loaded[:] = raw
    adopted = ModelIndex.empty().apply(ModelDelta(word_keys(words), words, loaded, np.ones(n, np.int64), 1, full=True))
    sent = raw.copy()
    copied = ModelIndex.empty().apply(ModelDelta(word_keys(words), words, sent, np.ones(n, np.int64), 1, full=True))
    assert np.shares_memory(adopted._pool, loaded) and not np.shares_memory(copied._pool, sent)
    assert np.array_equal(sent, raw)                          # not the index's: untouched
    assert np.allclose(np.linalg.norm(loaded, axis=1), 1.0, atol=1e-5)   # normalised in place
    np.testing.assert_array_equal(adopted.unit, copied.unit)
    for word in words[:20]:
        assert adopted.most_similar([word], k=5) == copied.most_similar([word], k=5)
    # syncs after the load write into the adopted pool's spare rows, and answer as the copied lineage does
    for version in range(2, 5):
        rows = rng.choice(n, 500, replace=False)
        delta = lambda: ModelDelta(word_keys([words[r] for r in rows]), [words[r] for r in rows],  # noqa: E731
                                   changed.copy(), np.ones(len(rows), np.int64), version)
        changed = rng.standard_normal((len(rows), dim)).astype(np.float32)
        adopted, copied = adopted.apply(delta()), copied.apply(delta())
    np.testing.assert_array_equal(adopted.unit, copied.unit)
    assert adopted.most_similar([words[7]], k=5) == copied.most_similar([words[7]], k=5)


def test_count_arrays_are_reused_only_once_nothing_reads_them():
    """Syncs reuse the count arrays of dead snapshots (no page faults on a fresh 80 MB array per sync at 10M
    words), but never one that a live snapshot, a view or a history sample still reads."""
    rng = np.random.default_rng(9)
    n, dim = 3_000, 8
    words = [f"w{i}" for i in range(n)]
    index = ModelIndex.from_arrays(1, word_keys(words), words, rng.standard_normal((n, dim)).astype(np.float32))
    held = index.counts                         # what a count sample keeps: the array, not the snapshot
    before = held.copy()
    for version in range(2, 12):
        rows = rng.choice(n, 300, replace=False)
        index = index.apply(ModelDelta(word_keys([words[r] for r in rows]), [words[r] for r in rows],
                                       rng.standard_normal((len(rows), dim)).astype(np.float32),
                                       rng.integers(1, 1000, len(rows)), version))
        np.testing.assert_array_equal(held, before)        # never written while held
        assert not np.shares_memory(index.counts, held)
    assert index.store.counters["counts_recycled"] >= 5     # the snapshots dropped along the way were reused


class _OneBigDelta:
    """A full load of 100 rows, then one delta that changes all of them and adds 150 (the rows that changed
    while a large front end loaded), then nothing."""

    def __init__(self):
        self.calls = 0
        self.words = [f"w{i}" for i in range(250)]
        self.vectors = np.random.default_rng(5).normal(size=(250, DIM)).astype(np.float32)

    async def changes_since(self, version: int) -> ModelDelta:
        self.calls += 1
        if version == 0:
            return ModelDelta(word_keys(self.words[:100]), self.words[:100], self.vectors[:100] * 2,
                              np.ones(100, np.int64), 1, full=True)
        if version == 1:
            return ModelDelta(word_keys(self.words), self.words, self.vectors, np.full(250, 3, np.int64), 2)
        return ModelDelta.unchanged(version, DIM)

    async def stats(self) -> dict:
        return {}


async def test_a_large_delta_is_applied_and_served_a_part_at_a_time(monkeypatch):
    """A delta of more than ``MAX_DELTA_ROWS`` rows becomes several snapshots, each served as soon as it is
    built: no apply holds every row of a huge delta (at 10M words the rows' pool grew by half), and the
    served model moves forward part by part. Only the last part carries the delta's version."""
    from online.frontend import sync as sync_module
    from online.search.model_index import ModelHolder

    monkeypatch.setattr(sync_module, "MAX_DELTA_ROWS", 64)
    holder, source = ModelHolder(), _OneBigDelta()
    served = []
    real_swap = holder.swap
    monkeypatch.setattr(holder, "swap", lambda index: served.append((index.version, index.n)) or real_swap(index))
    sync = sync_module.ModelSync(source, holder, interval=0.01)
    assert await sync.sync_once() and await sync.sync_once()
    assert served == [(1, 100), (1, 100), (1, 128), (1, 192), (2, 250)]
    assert sync.report()["apply"]["delta"]["count"] == 4
    index = holder.current
    assert index.version == 2 and index.n == 250 and (index.counts == 3).all()
    assert np.allclose(index.vectors, source.vectors, atol=1e-5)
    assert await sync.sync_once() and holder.current.version == 2 and source.calls == 3


async def test_the_first_load_may_take_longer_than_a_sync():
    """A 10M-word first load takes past a minute on a busy core: with the sync's own timeout it was cut short
    and started again from scratch, forever. Unless a timeout is given, the first load gets its own bound."""
    from online.frontend.sync import FIRST_LOAD_TIMEOUT, ModelSync
    from online.search.model_index import ModelHolder

    class Slow(_FullLoads):
        async def changes_since(self, version: int) -> ModelDelta:
            await asyncio.sleep(0.3)
            return await super().changes_since(version)

    sync = ModelSync(Slow(), ModelHolder(), interval=0.01)
    assert sync.first_load_timeout == FIRST_LOAD_TIMEOUT > sync.timeout
    sync.timeout = 0.1                           # a sync's bound now shorter than the source's answer
    assert await sync.sync_once() and sync.holder.loaded
    assert not await sync.sync_once()            # once loaded, the sync's own bound applies
    assert not await ModelSync(Slow(), ModelHolder(), interval=0.01, timeout=0.1).sync_once()
