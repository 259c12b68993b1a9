"""The front end's HTTP API: answers, errors, readiness, metrics, and the CLI's configuration errors.

A real aiohttp server on 127.0.0.1 (port picked by the OS) serving a word2vec file whose
nearest neighbours are known by construction.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from online.frontend.app import create_app
from online.frontend.settings import FrontendSettings
from online.frontend.sources import Word2VecFileSource
from online.search.delta import ModelDelta
from online.learner.keys import word_key
from online.learner.word2vec_format import write_binary, write_text

REPO = Path(__file__).resolve().parents[1]
DIM = 16
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=30)   # a hung request fails the test quickly


def planted_model(seed: int = 7):
    """Pairs that are each other's nearest neighbour, an analogy that works, and filler words."""
    rng = np.random.default_rng(seed)
    words, vectors = [], []
    for a, b in [("paris", "france"), ("berlin", "germany"), ("tokyo", "japan")]:
        c = rng.standard_normal(DIM)
        words += [a, b]
        vectors += [c + 0.01 * rng.standard_normal(DIM), c + 0.01 * rng.standard_normal(DIM)]
    royal, male, female = rng.standard_normal((3, DIM))
    words += ["king", "queen", "man", "woman"]
    vectors += [royal + male, royal + female, male, female]
    words += ["Capital", "déjà-vu", "日本"]
    vectors += list(rng.standard_normal((3, DIM)))
    words += [f"w{i}" for i in range(200)]
    vectors += list(3 * rng.standard_normal((200, DIM)))
    return words, np.asarray(vectors, dtype=np.float32)


@pytest.fixture
def model_file(tmp_path):
    words, vectors = planted_model()
    path = tmp_path / "vectors.bin"
    write_binary(path, words, vectors)
    counts = tmp_path / "vocab.txt"
    counts.write_text("".join(f"{w} {1000 - i}\n" for i, w in enumerate(words)), encoding="utf-8")
    return path, counts, words, vectors


async def start(app) -> TestServer:
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


async def wait_ready(session: aiohttp.ClientSession, base: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        async with session.get(base + "/ready") as r:
            if r.status == 200:
                return
        assert asyncio.get_running_loop().time() < deadline, "front end never became ready"
        await asyncio.sleep(0.02)


@pytest.fixture
async def api(model_file):
    path, counts, words, vectors = model_file
    settings = FrontendSettings(source="word2vec", model_file=str(path), vocab_counts_file=str(counts),
                                sync_interval=0.05, max_k=50, max_batch_words=8).validate()
    server = await start(create_app(settings, Word2VecFileSource(path, counts_path=counts)))
    base = str(server.make_url("")).rstrip("/")
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
        await wait_ready(session, base)
        yield session, base, words, vectors
    await server.close()


async def get(session, url, **kw):
    async with session.get(url, **kw) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.json(content_type=None)


def brute_force(words, vectors, positive, negative, k):
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    row = {w: i for i, w in enumerate(words)}
    q = unit[[row[w] for w in positive]].sum(0) - (unit[[row[w] for w in negative]].sum(0) if negative else 0)
    scores = unit @ (q / np.linalg.norm(q))
    for w in list(positive) + list(negative):
        scores[row[w]] = -np.inf
    return [words[i] for i in np.argsort(-scores, kind="stable")[:k]], scores


async def test_similar_returns_the_exact_top_k(api):
    session, base, words, vectors = api
    status, ctype, body = await get(session, base + "/v1/similar?word=paris&k=5")
    assert status == 200 and ctype.startswith("application/json")
    expected, scores = brute_force(words, vectors, ["paris"], [], 5)
    assert [n["word"] for n in body["neighbours"]] == expected
    assert body["neighbours"][0]["word"] == "france"
    assert body["word"] == "paris" and body["k"] == 5 and body["version"] >= 1
    got_scores = [n["score"] for n in body["neighbours"]]
    assert got_scores == sorted(got_scores, reverse=True)
    assert np.allclose(got_scores, np.sort(scores[np.isfinite(scores)])[::-1][:5], atol=1e-5)
    # default k, and the lower-case fallback
    status, _, body = await get(session, base + "/v1/similar?word=PARIS")
    assert status == 200 and body["word"] == "paris" and len(body["neighbours"]) == 10
    # words outside ASCII
    status, _, body = await get(session, base + "/v1/similar", params={"word": "日本", "k": "3"})
    assert status == 200 and body["word"] == "日本" and len(body["neighbours"]) == 3


async def test_similar_errors_are_clear_4xx(api):
    session, base, _, _ = api
    cases = [
        ("/v1/similar?word=nosuchword", 404, "unknown_word"),
        ("/v1/similar", 400, "missing_parameter"),
        ("/v1/similar?word=", 400, "bad_word"),
        ("/v1/similar?word=paris&k=0", 400, "bad_k"),
        ("/v1/similar?word=paris&k=51", 400, "bad_k"),          # above --max-k
        ("/v1/similar?word=paris&k=-3", 400, "bad_k"),
        ("/v1/similar?word=paris&k=ten", 400, "bad_k"),
        ("/v1/similar?word=paris&k=1.5", 400, "bad_k"),
        ("/v1/similar?word=paris&k=99999999999999999999", 400, "bad_k"),
        ("/v1/similar?word=" + "x" * 1001, 400, "bad_word"),
        ("/v1/analogy?negative=man", 400, "missing_parameter"),
        ("/v1/analogy?positive=,,%20,", 400, "bad_positive"),
        ("/v1/analogy?positive=king,nosuch", 404, "unknown_word"),
        ("/v1/vector/nosuchword", 404, "unknown_word"),
        ("/v1/vocab?limit=0", 400, "bad_limit"),
        ("/v1/vocab?limit=abc", 400, "bad_limit"),
        ("/v1/vocab?prefix=" + "p" * 201, 400, "bad_prefix"),
        ("/v1/nothing-here", 404, "not_found"),
    ]
    for path, want_status, want_code in cases:
        status, ctype, body = await get(session, base + path)
        assert (status, body.get("error")) == (want_status, want_code), path
        assert ctype.startswith("application/json"), path
        assert isinstance(body["message"], str) and body["message"], path
    status, _, body = await get(session, base + "/v1/analogy?positive=king,nosuch")
    assert body["unknown"] == ["nosuch"]


async def test_batch_similar_and_its_errors(api):
    session, base, words, vectors = api
    async with session.post(base + "/v1/similar", json={"words": ["paris", "nosuch", "tokyo"], "k": 3}) as r:
        assert r.status == 200
        body = await r.json()
    results = body["results"]
    assert [x["word"] for x in results] == ["paris", "nosuch", "tokyo"]
    assert [n["word"] for n in results[0]["neighbours"]] == brute_force(words, vectors, ["paris"], [], 3)[0]
    assert results[1]["error"] == "unknown_word" and "neighbours" not in results[1]
    assert results[2]["neighbours"][0]["word"] == "japan"
    bad_bodies = [
        (b"{not json", "bad_json"),
        (b"", "bad_json"),
        (b"[1, 2]", "bad_body"),
        (b'"paris"', "bad_body"),
        (b'{"k": 3}', "bad_words"),
        (b'{"words": []}', "bad_words"),
        (b'{"words": "paris"}', "bad_words"),
        (b'{"words": ["paris", 3]}', "bad_words"),
        (b'{"words": [""]}', "bad_words"),
        (b'{"words": ["a","b","c","d","e","f","g","h","i"]}', "bad_words"),   # above --max-batch-words
        (b'{"words": ["paris"], "k": "3"}', "bad_k"),
        (b'{"words": ["paris"], "k": true}', "bad_k"),
        (b'{"words": ["paris"], "k": 0}', "bad_k"),
        (b'{"words": ["paris"], "k": 2.5}', "bad_k"),
        (b"\xff\xfe garbage", "bad_json"),
    ]
    for raw, code in bad_bodies:
        async with session.post(base + "/v1/similar", data=raw,
                                headers={"Content-Type": "application/json"}) as r:
            body = await r.json(content_type=None)
            assert (r.status, body["error"]) == (400, code), raw
    async with session.post(base + "/v1/similar", data=b"x" * (5 * 1024 * 1024)) as r:
        assert r.status == 413
        assert (await r.json(content_type=None))["error"]


async def test_analogy_vector_vocab(api):
    session, base, words, vectors = api
    status, _, body = await get(session, base + "/v1/analogy?positive=king,woman&negative=man&k=3")
    assert status == 200
    assert body["neighbours"][0]["word"] == "queen"
    assert [n["word"] for n in body["neighbours"]] == brute_force(words, vectors, ["king", "woman"], ["man"], 3)[0]
    assert body["positive"] == ["king", "woman"] and body["negative"] == ["man"]

    status, _, body = await get(session, base + "/v1/vector/d%C3%A9j%C3%A0-vu")
    assert status == 200 and body["word"] == "déjà-vu" and body["dim"] == DIM
    assert np.allclose(body["vector"], vectors[words.index("déjà-vu")], atol=1e-6)
    assert body["key"] == str(word_key("déjà-vu"))
    assert body["count"] == 1000 - words.index("déjà-vu")

    status, _, body = await get(session, base + "/v1/vocab?prefix=w1&limit=5")
    assert status == 200
    matching = [w for w in words if w.startswith("w1")]
    assert body["total"] == len(matching)
    # most frequent first: the counts file gave earlier words higher counts
    assert [x["word"] for x in body["words"]] == matching[:5]
    assert all(x["count"] == 1000 - words.index(x["word"]) for x in body["words"])
    status, _, body = await get(session, base + "/v1/vocab")
    assert status == 200 and body["total"] == len(words) and body["words"][0]["word"] == "paris"
    status, _, body = await get(session, base + "/v1/vocab?prefix=zzz")
    assert status == 200 and body["total"] == 0 and body["words"] == []


async def test_stats_health_metrics_openapi_page(api):
    session, base, words, _ = api
    await get(session, base + "/v1/similar?word=paris")
    status, _, body = await get(session, base + "/v1/stats")
    assert status == 200
    assert body["ready"] is True and body["vocab_size"] == len(words) and body["dim"] == DIM
    assert body["version"] >= 1 and body["model_time"] > 0
    assert body["freshness_seconds"] is not None and body["freshness_seconds"] < 60
    assert body["sync"]["source_reachable"] is True and body["sync"]["errors"] == 0
    assert body["source"]["source"] == "word2vec-file"
    for key in ("words_trained", "words_per_second", "kafka_lag", "history"):
        assert key in body
    assert (await get(session, base + "/health"))[:1] == (200,)
    status, _, body = await get(session, base + "/ready")
    assert status == 200 and body["ready"] is True
    async with session.get(base + "/metrics") as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    assert 'livevec_frontend_http_requests_total{method="GET",role="frontend",route="/v1/similar",status="200"}' \
        in text
    assert "livevec_frontend_model_version" in text and "livevec_frontend_sync_seconds_count" in text
    # each metric family is contiguous (the text format requires it)
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(families) == len(set(families))
    status, ctype, spec = await get(session, base + "/openapi.json")
    assert status == 200 and spec["openapi"].startswith("3.")
    assert {"/v1/similar", "/v1/analogy", "/v1/vector/{word}", "/v1/vocab", "/v1/stats", "/health", "/ready",
            "/metrics", "/openapi.json", "/"} <= set(spec["paths"])
    async with session.get(base + "/") as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
        assert "livevec" in await r.text()
    for asset in ("/static/app.js", "/static/style.css"):
        async with session.get(base + asset) as r:
            assert r.status == 200
    async with session.delete(base + "/v1/stats") as r:
        assert r.status == 405 and "GET" in r.headers["Allow"]
        assert (await r.json(content_type=None))["error"] == "method_not_allowed"


async def test_inputs_never_reach_the_500_handler(api):
    """A spread of hostile inputs: every answer is a 2xx/4xx JSON, and the internal-error counter stays 0."""
    session, base, _, _ = api
    nasty = ["\x00", "%", "../../etc/passwd", "a" * 1000, "\ud7ff", "😀", " ", "\t", "paris\n", "<script>", "null",
             "1e309", "-0", "\\", "\"", "'", ",", "paris,france"]
    for word in nasty:
        for path, params in [("/v1/similar", {"word": word, "k": "3"}), ("/v1/analogy", {"positive": word}),
                             ("/v1/analogy", {"positive": "paris", "negative": word}),
                             ("/v1/vocab", {"prefix": word, "limit": "3"}),
                             ("/v1/similar", {"word": "paris", "k": word})]:
            async with session.get(base + path, params=params) as r:
                assert r.status < 500, (path, params)
                await r.read()
        async with session.post(base + "/v1/similar", json={"words": [word], "k": 2}) as r:
            assert r.status < 500
    status, _, body = await get(session, base + "/v1/stats")
    assert body["queries"]["internal_errors"] == 0


class NeverReadySource:
    async def changes_since(self, version):
        raise ConnectionError("parameter servers not reachable")

    async def stats(self):
        raise ConnectionError("parameter servers not reachable")


async def test_not_ready_until_a_model_is_loaded():
    settings = FrontendSettings(source="test", sync_interval=0.05).validate()
    server = await start(create_app(settings, NeverReadySource()))
    base = str(server.make_url("")).rstrip("/")
    try:
        async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
            await asyncio.sleep(0.2)
            status, _, body = await get(session, base + "/ready")
            assert status == 503 and body == {"ready": False}
            status, _, body = await get(session, base + "/v1/similar?word=paris")
            assert status == 503 and body["error"] == "not_ready"
            status, _, body = await get(session, base + "/v1/stats")
            assert status == 200 and body["ready"] is False
            assert body["sync"]["errors"] >= 1 and "ConnectionError" in body["sync"]["last_error"]
            assert (await get(session, base + "/health"))[0] == 200
    finally:
        await server.close()


class FlakySource:
    """A real in-memory model whose transport can be switched off, like a parameter server restarting."""

    def __init__(self, words, vectors):
        self.words, self.vectors = words, vectors
        self.up = True
        self.version = 1

    async def changes_since(self, version):
        if not self.up:
            raise ConnectionRefusedError("connection refused")
        if version == self.version:
            return ModelDelta.unchanged(version, self.vectors.shape[1])
        keys = np.array([word_key(w) for w in self.words], dtype=np.uint64)
        return ModelDelta(keys, self.words, self.vectors, np.zeros(len(self.words), np.int64), self.version, full=True)

    async def stats(self):
        if not self.up:
            raise ConnectionRefusedError("connection refused")
        return {"words_trained": 1000, "words_per_second": 10.0, "kafka_lag": 3}


async def test_source_down_keeps_answering_from_the_last_copy_and_says_so():
    words, vectors = planted_model()
    source = FlakySource(words, vectors)
    settings = FrontendSettings(source="test", sync_interval=0.02, stats_interval=0.1).validate()
    server = await start(create_app(settings, source))
    base = str(server.make_url("")).rstrip("/")
    try:
        async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
            await wait_ready(session, base)
            source.up = False
            await asyncio.sleep(0.3)
            status, _, body = await get(session, base + "/v1/similar?word=paris&k=1")
            assert status == 200 and body["neighbours"][0]["word"] == "france"
            status, _, stats = await get(session, base + "/v1/stats")
            assert stats["sync"]["source_reachable"] is False
            assert stats["sync"]["consecutive_errors"] >= 1 and "refused" in stats["sync"]["last_error"]
            assert stats["freshness_seconds"] >= 0.25       # the copy is getting old, and the API says how old
            assert stats["ready"] is True
            # the source comes back with a new model: it is picked up
            source.vectors = vectors[::-1].copy()
            source.words = words
            source.version = 2
            source.up = True
            for _ in range(200):
                status, _, stats = await get(session, base + "/v1/stats")
                if stats["version"] == 2 and stats["sync"]["source_reachable"]:
                    break
                await asyncio.sleep(0.02)
            assert stats["version"] == 2 and stats["sync"]["consecutive_errors"] == 0
            assert stats["freshness_seconds"] < 0.25
    finally:
        await server.close()


async def test_model_file_replaced_on_disk_is_reloaded_and_a_broken_one_is_not(model_file, tmp_path):
    path, counts, words, vectors = model_file
    settings = FrontendSettings(source="word2vec", model_file=str(path), sync_interval=0.02).validate()
    server = await start(create_app(settings, Word2VecFileSource(path)))
    base = str(server.make_url("")).rstrip("/")
    try:
        async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
            await wait_ready(session, base)
            status, _, body = await get(session, base + "/v1/similar?word=paris&k=1")
            first_version = body["version"]
            # a truncated copy in place: parse error, the old model keeps serving
            path.write_bytes(path.read_bytes()[:200])
            for _ in range(100):
                _, _, stats = await get(session, base + "/v1/stats")
                if stats["sync"]["errors"]:
                    break
                await asyncio.sleep(0.02)
            assert "truncated" in stats["sync"]["last_error"]
            status, _, body = await get(session, base + "/v1/similar?word=paris&k=1")
            assert status == 200 and body["version"] == first_version and body["neighbours"][0]["word"] == "france"
            # the export job finishes with an atomic rename: the new model is served
            new_words = words + ["newword"]
            new_vectors = np.concatenate([vectors, vectors[words.index("paris")][None] * 1.01])
            write_text(path, new_words, new_vectors)
            for _ in range(200):
                status, _, body = await get(session, base + "/v1/similar?word=newword&k=1")
                if status == 200:
                    break
                await asyncio.sleep(0.02)
            assert status == 200 and body["neighbours"][0]["word"] == "paris" and body["version"] > first_version
    finally:
        await server.close()


# ------------------------------------------------------------------------ the CLI
def run_cli(*args, env=None, timeout=30):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("LIVEVEC_", "DMLC_"))}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "online.cli", "frontend", *args], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args, env, setting", [
    ([], {}, "LIVEVEC_MODEL_SOURCE"),
    (["--model", "/nonexistent/vectors.bin"], {}, "LIVEVEC_MODEL_FILE"),
    (["--source", "word2vec"], {}, "LIVEVEC_MODEL_FILE"),
    (["--model", "__MODEL__", "--port", "70000"], {}, "LIVEVEC_HTTP_PORT"),
    (["--model", "__MODEL__"], {"LIVEVEC_HTTP_PORT": "eighty"}, "LIVEVEC_HTTP_PORT"),
    (["--model", "__MODEL__", "--sync-interval", "0"], {}, "LIVEVEC_SYNC_INTERVAL"),
    (["--model", "__MODEL__"], {"LIVEVEC_MAX_K": "0"}, "LIVEVEC_MAX_K"),
    (["--source", "no.such.module:factory"], {}, "LIVEVEC_MODEL_SOURCE"),
    (["--source", "nonsense"], {}, "LIVEVEC_MODEL_SOURCE"),
])
def test_cli_configuration_errors_name_the_setting(model_file, args, env, setting):
    path = str(model_file[0])
    result = run_cli(*[path if a == "__MODEL__" else a for a in args], env=env)
    assert result.returncode == 2, result.stderr
    assert setting in result.stderr


def test_cli_serves_a_word2vec_file_and_stops_on_sigterm(model_file):
    path, counts, _, _ = model_file
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIVEVEC_", "DMLC_"))}
    env.update({"LIVEVEC_HTTP_HOST": "127.0.0.1", "LIVEVEC_HTTP_PORT": "0", "LIVEVEC_MODEL_FILE": str(path)})
    proc = subprocess.Popen([sys.executable, "-m", "online.cli", "frontend", "--vocab-counts", str(counts)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("livevec frontend: serving http://127.0.0.1:"), line
        url = line.split()[-1]

        async def check():
            async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
                await wait_ready(session, url.rstrip("/"))
                return await get(session, url + "v1/similar?word=tokyo&k=1")

        status, _, body = asyncio.run(check())
        assert status == 200 and body["neighbours"][0]["word"] == "japan"
        proc.terminate()
        assert proc.wait(timeout=15) == 0
        # a second front end on a port that is taken fails with the setting named (the blocker binds port 0 and
        # says which it got, so no other process can be holding it instead)
        blocker = subprocess.Popen([sys.executable, "-c", "import socket,time; s=socket.socket(); "
                                    "s.bind(('127.0.0.1',0)); s.listen(); print(s.getsockname()[1], flush=True); "
                                    "time.sleep(30)"], stdout=subprocess.PIPE, text=True)
        try:
            port = blocker.stdout.readline().strip()
            assert port.isdigit(), port
            result = run_cli("--model", str(path), "--port", port)
            assert result.returncode == 2 and "LIVEVEC_HTTP_PORT" in result.stderr
        finally:
            blocker.kill()
            blocker.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_settings_flags_over_environment_over_defaults(model_file):
    import argparse

    from online.frontend.settings import add_arguments, settings_from
    from ps_bridge.settings import SettingError

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    path = str(model_file[0])
    env = {"LIVEVEC_HTTP_PORT": "9000", "LIVEVEC_HTTP_HOST": "0.0.0.0", "LIVEVEC_MODEL_FILE": path,
           "LIVEVEC_SYNC_INTERVAL": "0.25"}
    s = settings_from(parser.parse_args([]), env)
    assert (s.host, s.port, s.source, s.model_file, s.sync_interval, s.max_k) == ("0.0.0.0", 9000, "word2vec", path,
                                                                                  0.25, 1000)
    s = settings_from(parser.parse_args(["--port", "7000", "--sync-interval", "2", "--max-k", "5"]), env)
    assert (s.port, s.sync_interval, s.max_k) == (7000, 2.0, 5)
    cluster = {"DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "9091", "DMLC_NUM_SERVER": "2",
               "DMLC_NUM_WORKER": "0", "LIVEVEC_ELASTIC_WORKERS": "1", "PORT": "31555"}
    s = settings_from(parser.parse_args([]), cluster)
    assert s.source == "ps" and s.model_file is None
    # the cluster is read and checked at start; --port is the HTTP port, PORT the ps socket's
    s = settings_from(parser.parse_args(["--port", "7000"]), cluster)
    assert (s.port, s.node.role, s.node.root_uri, s.node.num_server, s.node.elastic_workers, s.node.port) == \
        (7000, "worker", "10.0.0.1", 2, True, 31555)
    with pytest.raises(SettingError) as err:
        settings_from(parser.parse_args([]), {**cluster, "LIVEVEC_ELASTIC_WORKERS": "0"})
    assert err.value.setting == "DMLC_NUM_WORKER"
    s = settings_from(parser.parse_args(["--source", "online.frontend.synthetic:create_source"]), {})
    assert s.source == "online.frontend.synthetic:create_source"
