"""What is new: /v1/new, /v1/rising, /v1/drift and /v1/history.

End to end: a real front end over real HTTP serving an in-process Trainer (``trainer_source``)
that the test feeds with text it writes itself: words introduced at known times, a burst of
known counts, and a planted change of meaning (``mercury`` is trained among planets, then
among metals). The endpoints must find exactly those arrivals, those rises and that drift.
Then the pure logic (``online.frontend.whats_new.WhatsNew``) on hand-built snapshots with a
test clock: arrivals across appends, full reloads and removals, the bounds of every ring,
the rise over a window, the checkpoints and what entered and left.
"""
from __future__ import annotations

import asyncio
import gc
import os
import time
import weakref

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from online.frontend.app import create_app
from online.search.model_index import ModelHolder, ModelIndex
from online.frontend.settings import FrontendSettings, settings_from
from online.frontend.sources import trainer_source
from online.search.delta import ModelDelta
from online.frontend.whats_new import HistoryLookupError, WhatsNew
from online.learner.keys import word_keys
from online.learner.trainer import LearnerConfig, Trainer
from ps_bridge.settings import SettingError

CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=30)
SPACE = "planet orbit comet galaxy nebula asteroid telescope lunar".split()
METAL = "alloy copper zinc smelting ore bronze nickel foundry".split()
FOOD = "bread cheese olive butter pasta garlic honey pepper".split()
EARLY = {"amberly": 6, "brimwick": 6}                  # arrive after the front end started
LATE = {"zorblax": 7, "quintar": 8, "vexium": 9}        # arrive with the drift
BURST = {"bread": 300, "cheese": 200, "olive": 100}    # counts that rise at a known moment
SYNC = 0.05


def topic_sentences(rng, topic, n, probe=None, length=8):
    out = []
    for _ in range(n):
        words = list(rng.choice(topic, length))
        if probe:
            words.insert(int(rng.integers(0, length)), probe)
        out.append(" ".join(words))
    return out


def arrival_sentences(rng, counts: dict[str, int]) -> list[str]:
    """Each word exactly ``counts[word]`` times, among food words."""
    out = []
    for word, n in counts.items():
        out += [" ".join([*rng.choice(FOOD, 3), word, *rng.choice(FOOD, 3)]) for _ in range(n)]
    return out


def exact_tokens(rng, counts: dict[str, int]) -> list[str]:
    tokens = [w for w, n in counts.items() for _ in range(n)]
    rng.shuffle(tokens)
    return [" ".join(tokens[i:i + 10]) for i in range(0, len(tokens), 10)]


def brute_top(trainer: Trainer, word: str, k: int) -> list[str]:
    words, vectors, _ = trainer.export()
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    i = words.index(word)
    scores = unit @ unit[i]
    scores[i] = -np.inf
    return [words[j] for j in np.argsort(-scores, kind="stable")[:k]]


async def get(session, url, **params):
    async with session.get(url, params=params) as r:
        return r.status, await r.json(content_type=None)


async def settle(session, base, quiet: float = 0.3) -> int:
    """Wait until the served version stopped moving (training is over and synced), then one more look."""
    deadline = time.monotonic() + 30
    version, since = None, time.monotonic()
    while time.monotonic() < deadline:
        _, history = await get(session, base + "/v1/history")     # the version the front end serves
        if history["version"] is not None and history["version"] == version:
            if time.monotonic() - since >= quiet:
                await asyncio.sleep(3 * SYNC)
                return version
        else:
            version, since = history["version"], time.monotonic()
        await asyncio.sleep(SYNC)
    raise AssertionError("the front end never settled")


@pytest.fixture
async def live():
    rng = np.random.default_rng(4)
    trainer = Trainer(LearnerConfig(dim=32, min_count=5, sample=0, seed=3, window=4, negative=5))
    baseline = (topic_sentences(rng, SPACE, 3000, "mercury") + topic_sentences(rng, METAL, 3000)
                + topic_sentences(rng, FOOD, 3000))
    rng.shuffle(baseline)
    for _ in range(2):
        trainer.train_records(baseline)
    settings = FrontendSettings(source="in-process", sync_interval=SYNC, rising_interval=0.1, rising_samples=3000,
                                drift_interval=0.3, drift_keep=60, new_words_keep=1000).validate()
    server = TestServer(create_app(settings, trainer_source(trainer)), host="127.0.0.1")
    await server.start_server()
    base = str(server.make_url("")).rstrip("/")
    try:
        async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
            await settle(session, base)
            yield session, base, trainer, rng
    finally:
        await server.close()


@pytest.mark.timeout(120)
async def test_the_endpoints_find_the_planted_arrivals_rises_and_drift(live):
    session, base, trainer, rng = live
    _, history = await get(session, base + "/v1/history")
    assert history["observed_since"] is not None and [c["id"] for c in history["checkpoints"]] == [1]
    status, body = await get(session, base + "/v1/new")
    assert status == 200 and body["words"] == [] and body["total"] == 0   # the first model has no arrivals

    # --- words introduced at known times
    t_a = time.time()
    await asyncio.to_thread(trainer.train_records, arrival_sentences(rng, EARLY))
    before_drift = await settle(session, base)
    status, body = await get(session, base + "/v1/new", since=t_a)
    assert status == 200 and body["complete"] and body["total"] == 2
    assert {w["word"]: w["count"] for w in body["words"]} == EARLY
    assert all(t_a <= w["first_seen"] <= body["now"] for w in body["words"])
    _, body = await get(session, base + "/v1/new", since=0)
    assert {w["word"] for w in body["words"]} == set(EARLY) and not body["complete"]   # 0 predates the first model

    # a checkpoint of the model before the change of meaning
    deadline = time.monotonic() + 10
    while not any(c["version"] == before_drift for c in history["checkpoints"]):
        assert time.monotonic() < deadline, history
        await asyncio.sleep(0.1)
        _, history = await get(session, base + "/v1/history")
    cp_before = next(c["id"] for c in history["checkpoints"] if c["version"] == before_drift)
    then_expected = brute_top(trainer, "mercury", 8)
    assert set(then_expected) == set(SPACE)
    status, body = await get(session, base + "/v1/drift", word="mercury", k=8, checkpoint=cp_before)
    assert status == 200 and body["overlap"] == 1.0 and body["entered"] == [] and body["left"] == []

    # --- the change of meaning, and more arrivals
    t0 = time.time()
    await asyncio.to_thread(trainer.train_records, arrival_sentences(rng, LATE))
    metal = topic_sentences(rng, METAL, 6000, "mercury")
    for _ in range(2):
        await asyncio.to_thread(trainer.train_records, metal)
    after_drift = await settle(session, base)
    status, body = await get(session, base + "/v1/new", since=t0)
    assert status == 200 and body["total"] == 3 and {w["word"]: w["count"] for w in body["words"]} == LATE
    assert all(t0 <= w["first_seen"] <= body["now"] for w in body["words"])
    _, body = await get(session, base + "/v1/new", since=t_a)
    listed = [w["word"] for w in body["words"]]
    assert set(listed[:3]) == set(LATE) and set(listed[3:]) == set(EARLY) and body["total"] == 5
    order = [(-w["first_seen"], -w["count"]) for w in body["words"]]
    assert order == sorted(order)                                       # newest first, then most frequent
    _, body = await get(session, base + "/v1/new", since=t0, limit=2)
    assert len(body["words"]) == 2 and body["total"] == 3

    now_expected = brute_top(trainer, "mercury", 8)
    assert set(now_expected) == set(METAL)
    status, body = await get(session, base + "/v1/drift", word="MERCURY", k=8, checkpoint=cp_before)
    assert status == 200 and body["word"] == "mercury" and body["checkpoint"]["id"] == cp_before
    assert [n["word"] for n in body["then"]] == then_expected
    assert [n["word"] for n in body["now"]] == now_expected
    assert [n["word"] for n in body["entered"]] == now_expected and [n["word"] for n in body["left"]] == then_expected
    assert body["overlap"] == 0.0 and body["shared"] == 0 and body["in_checkpoint"] and body["version"] == after_drift
    assert body["self_similarity"] < 0.9
    _, oldest = await get(session, base + "/v1/drift", word="mercury", k=8)
    assert oldest["checkpoint"]["id"] == 1 and {n["word"] for n in oldest["left"]} == set(SPACE)
    _, body = await get(session, base + "/v1/drift", word="vexium", k=5, checkpoint=cp_before)
    assert not body["in_checkpoint"] and body["then"] == [] and body["overlap"] == 0.0
    assert body["entered"] == body["now"] and len(body["now"]) == 5
    _, history = await get(session, base + "/v1/history")
    differing = [c["id"] for c in history["checkpoints"] if c["version"] != after_drift]
    _, body = await get(session, base + "/v1/drift", word="mercury", checkpoint="previous")
    assert body["checkpoint"]["id"] == max(differing)

    # --- counts that rise at a known moment
    await asyncio.sleep(0.5)
    t1 = time.time()
    await asyncio.sleep(0.3)
    await asyncio.to_thread(trainer.train_records, exact_tokens(rng, BURST))
    await settle(session, base)
    window = time.time() - t1 + 0.15
    status, body = await get(session, base + "/v1/rising", window=f"{window:.3f}")
    # the sample compared with is one from before the burst (it began 0.3 s after t1); the server's
    # clock has moved on since the window was computed, so the sample may be up to that delay later
    assert status == 200 and not body["partial"] and body["from"] <= t1
    assert [(w["word"], w["rise"]) for w in body["words"]] == list(BURST.items())
    assert all(w["count"] - w["count_then"] == w["rise"] for w in body["words"])
    _, body = await get(session, base + "/v1/rising", window=f"{window:.3f}", by="lift")
    assert {w["word"] for w in body["words"]} == set(BURST) and all(w["lift"] > 1 for w in body["words"])
    await asyncio.sleep(0.4)
    _, body = await get(session, base + "/v1/rising", window="0.2")
    assert body["words"] == [] and not body["partial"]
    _, body = await get(session, base + "/v1/rising", window=299, limit=1)
    assert body["partial"] and len(body["words"]) == 1 and body["from"] == history["rising"]["oldest_sample_at"]


async def test_bad_parameters_get_clear_errors_and_the_document_states_the_limits(live):
    session, base, _trainer, _rng = live
    cases = [
        ("/v1/new", {"since": "yesterday"}, 400, "bad_since"),
        ("/v1/new", {"since": "-1"}, 400, "bad_since"),
        ("/v1/new", {"since": "2e11"}, 400, "bad_since"),
        ("/v1/new", {"limit": "0"}, 400, "bad_limit"),
        ("/v1/new", {"limit": "1001"}, 400, "bad_limit"),
        ("/v1/rising", {"window": "0"}, 400, "bad_window"),
        ("/v1/rising", {"window": "300.5"}, 400, "bad_window"),
        ("/v1/rising", {"window": "soon"}, 400, "bad_window"),
        ("/v1/rising", {"by": "fame"}, 400, "bad_by"),
        ("/v1/drift", {}, 400, "missing_parameter"),
        ("/v1/drift", {"word": "mercury", "k": "0"}, 400, "bad_k"),
        ("/v1/drift", {"word": "mercury", "checkpoint": ""}, 400, "bad_checkpoint"),
        ("/v1/drift", {"word": "qqqqqq"}, 404, "unknown_word"),
        ("/v1/drift", {"word": "mercury", "checkpoint": "999"}, 404, "unknown_checkpoint"),
        ("/v1/drift", {"word": "mercury", "checkpoint": "yesterday"}, 404, "unknown_checkpoint"),
        ("/v1/drift", {"word": "mercury", "checkpoint": "previous"}, 404, "unknown_checkpoint"),  # none differs yet
    ]
    for path, params, status, code in cases:
        got, body = await get(session, base + path, **params)
        assert (got, body.get("error")) == (status, code), (path, params, body)
        assert body["message"]
    _, body = await get(session, base + "/v1/rising", window="300")
    assert body["window_seconds"] == 300 and body["partial"]
    assert "at most 300," in (await get(session, base + "/v1/rising", window="301"))[1]["message"]
    _, body = await get(session, base + "/v1/drift", word="mercury", checkpoint="banana")
    assert body["checkpoints"] == [1]

    _, doc = await get(session, base + "/openapi.json")
    params = {p["name"]: p["schema"] for p in doc["paths"]["/v1/rising"]["get"]["parameters"]}
    assert params["window"]["maximum"] == 300.0 and params["limit"]["maximum"] == 1000
    assert params["by"]["enum"] == ["rise", "lift"]
    assert {"/v1/new", "/v1/rising", "/v1/drift", "/v1/history"} <= set(doc["paths"])
    assert "404" in doc["paths"]["/v1/drift"]["get"]["responses"]


# ------------------------------------------------------------------------------ the pure logic
class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def index_of(version, words, counts=None, dim=4, seed=0):
    vectors = np.random.default_rng(seed).standard_normal((len(words), dim)).astype(np.float32)
    counts = np.full(len(words), 10) if counts is None else np.asarray(counts)
    return ModelIndex.from_arrays(version, word_keys(words), words, vectors, counts)


def delta(version, words, counts=None, dim=4, removed=(), full=False, vectors=None):
    if vectors is None:
        vectors = np.random.default_rng(version).standard_normal((len(words), dim)).astype(np.float32)
    counts = np.full(len(words), 10) if counts is None else np.asarray(counts)
    gone = word_keys(list(removed)) if removed else np.zeros(0, np.uint64)
    return ModelDelta(word_keys(words), list(words), np.asarray(vectors, np.float32), np.asarray(counts, np.int64),
                      version, full=full, removed=gone)


def recorder(**kw):
    holder, clock = ModelHolder(), Clock()
    return holder, clock, WhatsNew(holder, clock=clock, **kw)


def step(holder, clock, wn, d, at):
    holder.swap(holder.current.apply(d))
    clock.t = at
    wn.observe(at)


def arrived(wn, since=0.0):
    return {w["word"]: w["first_seen"] for w in wn.new_words(since, 1000)["words"]}


def test_arrivals_follow_appends_full_reloads_and_removals():
    holder, clock, wn = recorder()
    assert wn.observe(999.0) is None                       # nothing served yet: nothing recorded
    step(holder, clock, wn, delta(1, ["a", "b", "c"], full=True), 1000.0)
    assert arrived(wn) == {} and wn.observed_since == 1000.0
    step(holder, clock, wn, delta(2, ["d", "a"]), 1010.0)               # d is new, a only changed
    step(holder, clock, wn, delta(3, ["b"]), 1020.0)
    assert arrived(wn) == {"d": 1010.0} and arrived(wn, 1010.5) == {}
    # a full reload in another row order: only the key never served before arrives
    step(holder, clock, wn, delta(4, ["e", "d", "c", "b", "a"], full=True), 1030.0)
    assert arrived(wn) == {"d": 1010.0, "e": 1030.0}
    # a removed word drops out; admitted again, it arrives again
    step(holder, clock, wn, delta(5, [], removed=["d"]), 1040.0)
    assert arrived(wn) == {"e": 1030.0}
    step(holder, clock, wn, delta(6, ["d"]), 1050.0)
    answer = wn.new_words(1000.0, 10)
    assert [w["word"] for w in answer["words"]] == ["d", "e"] and answer["complete"] and answer["total"] == 2
    assert not wn.new_words(999.0, 10)["complete"]       # before the first snapshot: unknown
    # the clock stepping back does not move history backwards
    wn.observe(1045.0)
    assert wn._last_at == 1050.0


def test_the_arrival_ring_is_bounded_and_says_what_it_forgot():
    holder, clock, wn = recorder(new_words_keep=3)
    step(holder, clock, wn, delta(1, ["a"], full=True), 1000.0)
    step(holder, clock, wn, delta(2, ["b", "c"]), 1010.0)
    step(holder, clock, wn, delta(3, ["d", "e"]), 1020.0)
    assert wn.history()["new_words"] == {"remembered": 3, "keep": 3, "forgotten_until": 1010.0}
    got = wn.new_words(0, 10)
    assert len(got["words"]) == 3 and {"d", "e"} <= {w["word"] for w in got["words"]}
    assert not wn.new_words(1010.0, 10)["complete"] and wn.new_words(1010.5, 10)["complete"]


def test_rise_over_a_window_from_bounded_count_samples():
    holder, clock, wn = recorder(rising_interval=10.0, rising_samples=3)
    words = ["the", "of", "burst", "quiet"]
    step(holder, clock, wn, delta(1, words, counts=[10_000, 5_000, 50, 500], full=True), 1000.0)
    clock.t = 1005.0
    early = wn.rising(10.0, 5)                                  # the history is shorter than the window
    assert early["partial"] and early["from"] == 1000.0 and early["words"] == []
    for i, t in enumerate([1005.0, 1010.0, 1020.0, 1030.0], start=2):
        step(holder, clock, wn, delta(i, ["the"], counts=[10_000 + 100 * (i - 1)]), t)
    step(holder, clock, wn, delta(9, ["the", "of", "burst"], counts=[11_000, 5_100, 450]), 1035.0)
    assert wn._samples.times() == [1000.0, 1010.0, 1020.0, 1030.0]   # one per interval, samples + 1 kept
    assert wn.max_window == 30.0
    clock.t = 1041.0
    by_rise = wn.rising(10.0, 10, "rise")                      # against the sample of 1030
    assert by_rise["from"] == 1030.0 and by_rise["span_seconds"] == 11.0 and not by_rise["partial"]
    assert [(w["word"], w["rise"]) for w in by_rise["words"]] == [("the", 600), ("burst", 400), ("of", 100)]
    assert wn._samples.times() == [1010.0, 1020.0, 1030.0, 1041.0]
    by_lift = wn.rising(10.0, 10, "lift")                      # burst rose far beyond its share; "the" did not
    assert [w["word"] for w in by_lift["words"]] == ["burst", "the", "of"]
    assert by_lift["words"][0]["lift"] > 50 and by_lift["words"][1]["lift"] < 1
    assert [w["word"] for w in wn.rising(10.0, 2)["words"]] == ["the", "burst"]          # limit
    clock.t = 1052.0
    assert wn.rising(5.0, 10)["words"] == []                   # the sample of 1041 already had these counts
    # a removal moves rows: the samples are re-indexed by key, so rises stay with their words
    step(holder, clock, wn, delta(10, [], removed=["of"]), 1056.0)
    step(holder, clock, wn, delta(11, ["burst", "late"], counts=[500, 7]), 1057.0)
    clock.t = 1060.0
    assert {w["word"]: w["rise"] for w in wn.rising(10.0, 10)["words"]} == {"burst": 50}   # "late" is new


def test_checkpoints_are_bounded_skip_an_unchanged_model_and_resolve_names():
    holder, clock, wn = recorder(drift_interval=10.0, drift_keep=2)
    step(holder, clock, wn, delta(1, ["a", "b"], full=True), 1000.0)
    wn.observe(1015.0)                                          # unchanged: no second checkpoint
    assert [c["id"] for c in wn.history()["checkpoints"]] == [1]
    step(holder, clock, wn, delta(2, ["a"]), 1016.0)
    step(holder, clock, wn, delta(3, ["b"]), 1020.0)            # too soon after 1016
    step(holder, clock, wn, delta(4, ["a"]), 1030.0)
    assert [(c["id"], c["version"]) for c in wn.history()["checkpoints"]] == [(2, 2), (3, 4)]
    current = holder.current
    assert wn._checkpoint("oldest", current).id == 2
    assert wn._checkpoint("previous", current).id == 2          # 3 is the served model itself
    assert wn._checkpoint("3", current).id == 3
    for spec in ("1", "007x", "latest"):
        with pytest.raises(HistoryLookupError) as err:
            wn._checkpoint(spec, current)
        assert err.value.code == "unknown_checkpoint" and err.value.extra["checkpoints"] == [2, 3]
    none = recorder(drift_keep=0)
    step(*none, delta(1, ["a"], full=True), 1000.0)
    with pytest.raises(HistoryLookupError, match="LIVEVEC_DRIFT_KEEP is 0"):
        none[2].drift("a", 1)


@pytest.mark.parametrize("on_disk", [False, True], ids=["in-memory", "on-disk"])
def test_drift_names_the_neighbours_that_entered_and_left(on_disk, tmp_path):
    """On disk (``LIVEVEC_DRIFT_DIR``) the answers are the same, the rows are not in memory, and the
    directory holds no file even while the checkpoints live (unlinked once open)."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((2, 8)) * 5
    a_words, b_words = ["a1", "a2", "a3", "a4"], ["b1", "b2", "b3"]
    words = ["x", *a_words, *b_words]
    vectors = np.concatenate([centres[:1], centres[0] + 0.1 * rng.standard_normal((4, 8)),
                              centres[1] + 0.1 * rng.standard_normal((3, 8))]).astype(np.float32)
    holder, clock, wn = recorder(drift_interval=1.0, drift_dir=tmp_path if on_disk else None)
    step(holder, clock, wn, delta(1, words, full=True, dim=8, vectors=vectors), 1000.0)
    moved = centres[1] + 0.1 * rng.standard_normal((2, 8))       # x and a2 now sit among the b words
    step(holder, clock, wn, delta(2, ["x", "a2"], dim=8, vectors=moved), 1002.0)
    got = wn.drift("x", 4, "1")
    assert {n["word"] for n in got["then"]} == set(a_words)
    assert {n["word"] for n in got["now"]} == {"a2", *b_words}
    assert {n["word"] for n in got["entered"]} == set(b_words) and {n["word"] for n in got["left"]} == {"a1", "a3", "a4"}
    assert got["shared"] == 1 and got["overlap"] == 0.25 and got["in_checkpoint"]
    assert got["self_similarity"] < 0.9 and got["checkpoint"]["age_seconds"] == 2.0
    assert [n["word"] for n in got["entered"]] == [n["word"] for n in got["now"] if n["word"] in b_words]
    assert [c["id"] for c in wn.history()["checkpoints"]] == [1, 2]
    assert wn.drift("x", 4, "previous") == got                  # 2 is the served model: previous is 1
    same = wn.drift("x", 4, "2")                                # the served model, in float16
    assert same["overlap"] == 1.0 and same["self_similarity"] == pytest.approx(1.0, abs=1e-5)
    assert [n["score"] for n in same["then"]] == pytest.approx([n["score"] for n in same["now"]], abs=2e-3)
    with pytest.raises(HistoryLookupError) as err:
        wn.drift("nope", 3)
    assert err.value.code == "unknown_word"
    drift = wn.history()["drift"]
    if on_disk:
        assert list(tmp_path.iterdir()) == [] and drift["on_disk"]
        assert drift["disk_bytes"] == wn.disk_bytes() == 2 * len(words) * 8 * 2     # 2 checkpoints, float16
        assert wn.nbytes() < 2 * len(words) * 8 * 2                                  # not in memory
        fds = len(os.listdir("/proc/self/fd"))
        del err                                                 # its traceback's frames hold a checkpoint
        wn._checkpoints.clear()
        gc.collect()
        assert len(os.listdir("/proc/self/fd")) == fds - 2      # the checkpoints' files are closed with them
    else:
        assert drift["disk_bytes"] == 0 and not drift["on_disk"]


def test_the_history_keeps_no_served_snapshot_alive():
    # a ModelIndex held here would keep its row buffer from being reused by the next sync
    holder, clock, wn = recorder(drift_interval=1.0, rising_interval=1.0)
    step(holder, clock, wn, delta(1, ["a", "b", "c"], full=True), 1000.0)
    for version, at in ((2, 1010.0), (3, 1020.0)):
        clock.t = at
        wn.new_words(0, 10), wn.rising(5.0, 10), wn.drift("a", 2, "1"), wn.history()
        served = weakref.ref(holder.current)
        holder.swap(holder.current.apply(delta(version, ["d", "a"])))     # the next sync, not observed yet
        gc.collect()
        assert served() is None
    step(holder, clock, wn, delta(4, ["e"]), 1030.0)
    assert len(wn._checkpoints) == 2 and wn.drift("e", 2)["in_checkpoint"] is False


@pytest.mark.parametrize("variable, value", [("LIVEVEC_DRIFT_KEEP", "-1"), ("LIVEVEC_RISING_INTERVAL", "often"),
                                             ("LIVEVEC_DRIFT_DIR", "/nonexistent/drift"),
                                             ("LIVEVEC_RISING_SAMPLES", "0"), ("LIVEVEC_NEW_WORDS_KEEP", "0"),
                                             ("LIVEVEC_DRIFT_INTERVAL", "0")])
def test_a_bad_history_setting_stops_the_start_naming_it(tmp_path, variable, value):
    model = tmp_path / "m.txt"
    model.write_text("1 2\na 1 2\n")
    env = {"LIVEVEC_MODEL_FILE": str(model), variable: value}
    with pytest.raises(SettingError) as err:
        settings_from(None, env)
    assert str(err.value).startswith(variable)
    assert settings_from(None, {"LIVEVEC_MODEL_FILE": str(model), "LIVEVEC_DRIFT_KEEP": "0"}).drift_keep == 0


def test_a_checkpoint_in_the_making_blocks_neither_the_stats_nor_the_answers(monkeypatch):
    """A drift checkpoint copies every row: about 27 s at 10M words in a background thread. ``/v1/stats``
    reads the history's size on the event loop, and while the copy ran under the history's lock every
    request waited for it. The copy now runs outside the lock, once: the sizes, the answers and further
    looks go on meanwhile."""
    import threading
    from online.frontend import whats_new

    holder, clock, wn = recorder(drift_interval=1.0)
    step(holder, clock, wn, delta(1, ["a", "b", "c"], full=True), 1000.0)       # checkpoint 1
    holder.swap(holder.current.apply(delta(2, ["d", "a"])))
    clock.t = 1002.0
    started, release = threading.Event(), threading.Event()
    real = whats_new.PastModel

    class SlowPastModel(real):
        def __init__(self, *args, **kwargs):
            started.set()
            assert release.wait(30)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(whats_new, "PastModel", SlowPastModel)
    looking = threading.Thread(target=wn.observe, args=(1002.0,))
    looking.start()
    try:
        assert started.wait(10)
        done = threading.Event()

        def read_while_copying():
            wn.nbytes(), wn.disk_bytes(), wn.new_words(0, 10), wn.rising(5.0, 10), wn.history()
            assert wn.drift("a", 2, "1")["checkpoint"]["id"] == 1
            wn.observe(1002.5)                    # no second copy while one is being made
            done.set()

        reader = threading.Thread(target=read_while_copying)
        reader.start()
        assert done.wait(10), "the history's readers waited for the checkpoint's copy"
        reader.join()
    finally:
        release.set()
        looking.join(30)
    assert [c["id"] for c in wn.history()["checkpoints"]] == [1, 2]
    assert wn.drift("d", 2, "2")["in_checkpoint"] is True


def test_drift_checkpoints_go_to_the_temporary_directory_unless_kept_in_memory(tmp_path, monkeypatch):
    """A 10M-word checkpoint is 2 GB: by default it goes to local disk (the temporary directory), not into
    the front end's memory; ``LIVEVEC_DRIFT_DIR=memory`` keeps it in memory, a directory puts it there."""
    import tempfile

    model = tmp_path / "m.txt"
    model.write_text("1 2\na 1 2\n")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    base = {"LIVEVEC_MODEL_FILE": str(model)}
    assert settings_from(None, base).drift_directory() == str(tmp_path)
    assert settings_from(None, {**base, "LIVEVEC_DRIFT_DIR": "memory"}).drift_directory() is None
    other = tmp_path / "drift"
    other.mkdir()
    assert settings_from(None, {**base, "LIVEVEC_DRIFT_DIR": str(other)}).drift_directory() == str(other)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    with pytest.raises(SettingError) as err:
        settings_from(None, base)
    assert str(err.value).startswith("LIVEVEC_DRIFT_DIR") and "'memory'" in str(err.value)


def test_a_checkpoint_copy_holds_no_snapshot_and_gives_up_on_a_reload(tmp_path, monkeypatch):
    """A checkpoint of 10M rows takes half a minute to copy; a snapshot held that long keeps every row the
    syncs retire meanwhile (the pool grew by half, 5 GB, at 10M words). So the copy reads the served
    snapshot block by block and lets each go; a reload in between (rows renumbered) skips the checkpoint."""
    from online.frontend import whats_new

    monkeypatch.setattr(whats_new, "_BLOCK", 2)
    holder, clock, wn = recorder(drift_interval=1.0, drift_dir=tmp_path)
    holder.swap(holder.current.apply(delta(1, ["a", "b", "c", "d", "e"], full=True)))
    first = weakref.ref(holder.current)
    seen = []

    def served():
        seen.append(holder.current.version)
        if len(seen) == 2:           # a sync while the copy runs: the first snapshot must be free to go
            holder.swap(holder.current.apply(delta(2, ["a"])))
            gc.collect()
            assert first() is None
        return holder.current

    past = whats_new.PastModel(served, tmp_path)
    assert seen == [1, 1, 2, 2] and past.version == 1 and past.n == 5
    assert np.allclose(past.vector(0), holder.current.unit_row(0), atol=1e-3)     # read after the sync
    assert np.allclose(past.vector(4), holder.current.unit_row(4), atol=1e-3)

    def reloaded():
        seen.append(0)
        if len(seen) > 6:
            holder.swap(holder.current.apply(delta(3, ["e", "d", "c", "b", "a"], full=True)))
        return holder.current

    with pytest.raises(whats_new.Stale):
        whats_new.PastModel(reloaded, tmp_path)
