"""The gensim-compatible client (``online.client``) and the export it downloads, against real
``livevec frontend`` processes on real sockets, compared with gensim's own ``KeyedVectors``
loaded from the file the front end serves.

Tolerances: the front end keeps each vector as a float32 unit row times its norm, so a served
vector differs from the file's by float32 rounding (rtol 1e-6); scores are float32 cosines
rounded to 6 decimals by the API, so they agree with gensim's to 1e-5. The search is exact:
with the int8 pre-filter (the default from 8192 rows, which this model has, where
``int8_prefilter`` has a fast kernel for the CPU) only the rows that can still win are
re-scored in float32, so the words and their order are gensim's; elsewhere the float32
product answers, with the same words.
"""
from __future__ import annotations

import asyncio
import http.client
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from gensim.models import KeyedVectors

from online.client import (AsyncLiveKeyedVectors, AuthenticationError, LiveKeyedVectors, RequestError,
                           ServiceUnavailable)
from online.learner.word2vec_format import write_binary
from tests.frontend_process import REPO, clean_env, running_frontend
from tests.support.ports import reserved_port

DIM = 32
N_FILLER = 9000                         # > int8_prefilter.MIN_ROWS_FOR_CODES
TOKEN = "t0ken-for-the-client-tests"
SPECIAL = ["Capital", "déjà-vu", "日本", "a/b", "..", "x,y", "%41"]


def planted_model(seed: int = 11, filler: int = N_FILLER, dim: int = DIM):
    rng = np.random.default_rng(seed)
    words, vectors = [], []
    for a, b in [("paris", "france"), ("berlin", "germany"), ("tokyo", "japan")]:
        c = rng.standard_normal(dim)
        words += [a, b]
        vectors += [c + 0.05 * rng.standard_normal(dim), c + 0.05 * rng.standard_normal(dim)]
    royal, male, female = rng.standard_normal((3, dim))
    words += ["king", "queen", "man", "woman"]
    vectors += [royal + male, royal + female, male, female]
    words += SPECIAL
    vectors += list(rng.standard_normal((len(SPECIAL), dim)))
    words += [f"w{i}" for i in range(filler)]
    vectors += list(rng.standard_normal((filler, dim)))
    return words, np.asarray(vectors, dtype=np.float32)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    words, vectors = planted_model()
    path = tmp_path_factory.mktemp("client") / "vectors.bin"
    write_binary(path, words, vectors)
    return path, words, vectors


@pytest.fixture(scope="module")
def reference(model):
    return KeyedVectors.load_word2vec_format(str(model[0]), binary=True)


@pytest.fixture(scope="module")
def served(model):
    with running_frontend(["--model", str(model[0]), "--max-k", "2000", "--sync-interval", "0.05"],
                          clean_env()) as (url, proc):
        yield url, proc


@pytest.fixture
def kv(served):
    with LiveKeyedVectors(served[0], retries=20, backoff=0.05, max_backoff=0.5) as client:
        yield client


def metric(url: str, name: str, **labels: str) -> float:
    with urllib.request.urlopen(url + "metrics", timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


def sample_words(words, n=40, seed=3):
    rng = np.random.default_rng(seed)
    return words[:20] + [words[i] for i in rng.choice(len(words), n, replace=False)]


def assert_same_neighbours(got, expected):
    assert [w for w, _ in got] == [w for w, _ in expected]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in expected], atol=1e-5)
    assert all(isinstance(w, str) and type(s) is float for w, s in got)


# ----------------------------------------------------------------- mirrored reads
def test_most_similar_agrees_with_gensim(kv, reference, model):
    _, words, _ = model
    for word in sample_words(words):
        assert_same_neighbours(kv.most_similar(word, topn=10), reference.most_similar(word, topn=10))
    for positive, negative, topn in [(["king", "woman"], ["man"], 5), (["paris", "germany"], ["berlin"], 3),
                                     (["king", "queen", "w7"], [], 12), ("tokyo", "japan", 4),
                                     ([("king", 1.0), "woman"], [("man", -1.0)], 5)]:
        assert_same_neighbours(kv.most_similar(positive=positive, negative=negative, topn=topn),
                               reference.most_similar(positive=positive, negative=negative, topn=topn))
    assert kv.most_similar(positive=["king", "woman"], negative=["man"], topn=1)[0][0] == "queen"
    assert_same_neighbours(kv.most_similar("paris", topn=1500), reference.most_similar("paris", topn=1500))
    assert_same_neighbours(kv.similar_by_word("x,y", topn=3), reference.similar_by_word("x,y", topn=3))
    assert kv.most_similar("paris", topn=0) == reference.most_similar("paris", topn=0) == []
    weighted = dict(positive=[("king", 0.5), "woman"], negative=[("man", -2.0)], topn=5)   # gensim's weights
    assert_same_neighbours(kv.most_similar(**weighted), reference.most_similar(**weighted))
    with pytest.raises(NotImplementedError):        # gensim's restriction of the search is not served either
        kv.most_similar("paris", restrict_vocab=100)
    with pytest.raises(ValueError):
        kv.most_similar(positive=[])
    with pytest.raises(RequestError, match="bad_k"):  # beyond the front end's --max-k, its own message
        kv.most_similar("paris", topn=2001)


def test_most_similar_many_is_one_request_per_batch(kv, reference, served, model):
    _, words, _ = model
    batch = sample_words(words, n=60)
    before = metric(served[0], "livevec_frontend_http_requests_total", route="/v1/similar", method="POST")
    got = kv.most_similar_many(batch, topn=7)
    after = metric(served[0], "livevec_frontend_http_requests_total", route="/v1/similar", method="POST")
    assert after - before == 1
    assert len(got) == len(batch)
    for word, neighbours in zip(batch, got):
        assert_same_neighbours(neighbours, reference.most_similar(word, topn=7))
    small = LiveKeyedVectors(served[0], batch_words=16)
    assert small.most_similar_many(batch, topn=7) == got
    assert metric(served[0], "livevec_frontend_http_requests_total", route="/v1/similar",
                  method="POST") - after == 5                                      # ceil(80 / 16)
    with pytest.raises(KeyError, match="nope"):
        kv.most_similar_many(["paris", "nope", "Paris"], topn=3)
    loose = kv.most_similar_many(["paris", "nope", "Paris"], topn=3, strict=False)
    assert loose[1] is None and loose[2] is None                # 'Paris' would be answered as 'paris'
    assert_same_neighbours(loose[0], reference.most_similar("paris", topn=3))


def test_similarity_doesnt_match_and_vectors_agree_with_gensim(kv, reference, model):
    _, words, _ = model
    pairs = [("king", "queen"), ("paris", "france"), ("man", "w5"), ("日本", "déjà-vu"), ("a/b", "..")]
    for w1, w2 in pairs:
        got = kv.similarity(w1, w2)
        assert isinstance(got, np.floating)
        assert abs(float(got) - float(reference.similarity(w1, w2))) < 1e-5
    for group in [["king", "queen", "man", "paris"], ["paris", "france", "berlin", "germany", "w3"],
                  ["tokyo", "japan", "nope", "w100", "w200"], words[20:60]]:
        assert kv.doesnt_match(group) == reference.doesnt_match(group)
    with pytest.raises(ValueError):
        kv.doesnt_match(["nope", "nada"])
    for word in sample_words(words) + SPECIAL:
        np.testing.assert_allclose(kv[word], reference[word], rtol=1e-6, atol=1e-6)
        assert kv[word].dtype == np.float32 and kv[word].shape == (DIM,)
        np.testing.assert_allclose(kv.get_vector(word, norm=True), reference.get_vector(word, norm=True),
                                   rtol=1e-5, atol=1e-6)
    several = kv[["paris", "..", "w9"]]
    assert several.shape == (3, DIM)
    np.testing.assert_allclose(several, reference[["paris", "..", "w9"]], rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError):          # the vector a caller gets is not a handle on the model
        kv["paris"][0] = 1.0


def test_keys_are_exact_and_unknown_words_raise_key_error_as_in_gensim(kv, reference):
    # 'Paris' is not in the model; the front end would answer for 'paris', gensim would not
    for key in ["nope", "Paris", "CAPITAL", ""]:
        for target in (kv, reference):
            assert key not in target
            with pytest.raises(KeyError):
                target[key]
            with pytest.raises(KeyError):
                target.most_similar(key)
            with pytest.raises(KeyError):
                target.similarity("paris", key)
            with pytest.raises(KeyError):
                target.most_similar(positive=["king", key], negative=["man"])
            with pytest.raises(KeyError):
                target[["paris", key]]
    assert "paris" in kv and "Capital" in kv and ".." in kv and "a/b" in kv
    with pytest.raises(KeyError, match="Key 'nope' not present"):
        kv["nope"]


def test_vocabulary_and_sizes(kv, reference, served):
    assert kv.index_to_key == reference.index_to_key
    assert kv.key_to_index == reference.key_to_index
    assert kv.vector_size == reference.vector_size == DIM
    assert len(kv) == len(reference) == kv.vocab_size
    # the word list is fetched once per model version, not once per access
    before = metric(served[0], "livevec_frontend_http_requests_total", route="/v1/export")
    for _ in range(5):
        assert kv.key_to_index["queen"] == reference.key_to_index["queen"]
    assert metric(served[0], "livevec_frontend_http_requests_total", route="/v1/export") == before


def test_to_keyed_vectors_is_a_gensim_copy_of_the_served_model(kv, reference, model):
    _, words, vectors = model
    copy = kv.to_keyed_vectors()
    assert type(copy) is KeyedVectors
    assert copy.index_to_key == reference.index_to_key
    np.testing.assert_allclose(copy.vectors, reference.vectors, rtol=1e-6, atol=1e-6)
    for word in sample_words(words) + SPECIAL:
        assert np.array_equal(copy[word], kv[word])                 # the same float32 bits as /v1/vector
        assert copy.get_vecattr(word, "count") == reference.get_vecattr(word, "count")
        assert_same_neighbours(copy.most_similar(word, topn=5), reference.most_similar(word, topn=5))
    event = copy.lifecycle_events[-1]
    assert event["version"] >= 1 and "livevec_export" == event["event"]


def test_to_keyed_vectors_says_gensim_is_missing_before_downloading(kv, served, monkeypatch):
    before = metric(served[0], "livevec_frontend_http_requests_total", route="/v1/export")
    monkeypatch.setitem(sys.modules, "gensim", None)
    monkeypatch.setitem(sys.modules, "gensim.models", None)
    with pytest.raises(ImportError, match="pip install 'gensim"):
        kv.to_keyed_vectors()
    assert metric(served[0], "livevec_frontend_http_requests_total", route="/v1/export") == before


def test_the_async_twin_agrees(served, reference, model):
    _, words, _ = model
    batch = sample_words(words, n=10)

    async def main():
        async with AsyncLiveKeyedVectors(served[0], retries=5, pool_size=4) as akv:
            sims = [await akv.most_similar(w, topn=6) for w in batch]
            analogy = await akv.most_similar(positive=["king", "woman"], negative=["man"], topn=3)
            many = await akv.most_similar_many(batch, topn=6)
            similarity = await akv.similarity("paris", "france")
            odd = await akv.doesnt_match(["king", "queen", "man", "paris"])
            vec, vecs = await akv["日本"], await akv[["a/b", "..", "w1"]]
            contains = [await akv.has_index_for(w) for w in ("paris", "Paris", "nope")]
            missing = []
            for call in (lambda: akv["nope"], lambda: akv.most_similar("Paris"), lambda: akv.similarity("a", "b")):
                try:
                    await call()
                except KeyError:
                    missing.append(True)
            with pytest.raises(TypeError, match="has_index_for"):
                "paris" in akv
            return (sims, analogy, many, similarity, odd, vec, vecs, contains, missing,
                    await akv.index_to_key, await akv.key_to_index, await akv.vector_size, await akv.vocab_size,
                    await akv.to_keyed_vectors(), akv)

    (sims, analogy, many, similarity, odd, vec, vecs, contains, missing, index_to_key, key_to_index,
     vector_size, vocab_size, copy, akv) = asyncio.run(main())
    for word, got, batched in zip(batch, sims, many):
        assert_same_neighbours(got, reference.most_similar(word, topn=6))
        assert batched == got
    assert_same_neighbours(analogy, reference.most_similar(positive=["king", "woman"], negative=["man"], topn=3))
    assert abs(float(similarity) - float(reference.similarity("paris", "france"))) < 1e-5
    assert odd == reference.doesnt_match(["king", "queen", "man", "paris"])
    np.testing.assert_allclose(vec, reference["日本"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(vecs, reference[["a/b", "..", "w1"]], rtol=1e-6, atol=1e-6)
    assert contains == [True, False, False] and missing == [True, True, True]
    assert index_to_key == reference.index_to_key and key_to_index == reference.key_to_index
    assert (vector_size, vocab_size) == (DIM, len(reference))
    assert type(copy) is KeyedVectors and copy.index_to_key == reference.index_to_key
    np.testing.assert_allclose(copy.vectors, reference.vectors, rtol=1e-6, atol=1e-6)
    assert akv._session is None                                     # closed by the async with


# ------------------------------------------------------------------ token, retries
def test_bearer_token(model, reference):
    env = clean_env(LIVEVEC_API_TOKEN=TOKEN)
    with running_frontend(["--model", str(model[0])], env) as (url, _):
        with pytest.raises(AuthenticationError, match="no token was given") as info:
            LiveKeyedVectors(url, retries=20, backoff=0.05).most_similar("paris")
        assert info.value.status == 401 and isinstance(info.value, PermissionError)
        with pytest.raises(AuthenticationError, match="refused"):
            LiveKeyedVectors(url, token="wrong-token-wrong-token").most_similar("paris")
        with pytest.raises(urllib.error.HTTPError) as raw:           # the export is behind the same guard
            urllib.request.urlopen(url + "v1/export", timeout=10)
        assert raw.value.code == 401
        kv = LiveKeyedVectors(url, token=TOKEN, retries=20, backoff=0.05)
        assert_same_neighbours(kv.most_similar("paris", topn=5), reference.most_similar("paris", topn=5))
        assert kv.to_keyed_vectors().index_to_key == reference.index_to_key

        async def check():
            async with AsyncLiveKeyedVectors(url) as anonymous:
                with pytest.raises(AuthenticationError, match="no token"):
                    await anonymous.most_similar("paris")
                with pytest.raises(AuthenticationError, match="no token"):      # concurrent calls: the error itself
                    await anonymous[["paris", "france", "king"]]
            async with AsyncLiveKeyedVectors(url, token=TOKEN) as akv:
                return await akv.most_similar("paris", topn=5)

        assert_same_neighbours(asyncio.run(check()), reference.most_similar("paris", topn=5))


def test_connections_the_server_closed_while_idle_are_replaced_without_a_retry(model, reference):
    env = clean_env(LIVEVEC_HEADER_TIMEOUT="0.3")          # the front end's keep-alive timeout
    with running_frontend(["--model", str(model[0])], env) as (url, _):
        kv = LiveKeyedVectors(url, retries=30, backoff=0.05, pool_size=4)
        expected = reference.most_similar("paris", topn=3)
        threads = [threading.Thread(target=kv.most_similar, args=("paris",)) for _ in range(4)]
        for t in threads:                              # four connections in the pool
            t.start()
        for t in threads:
            t.join()
        assert len(kv._pool._idle) >= 2
        kv.retries_made = 0
        time.sleep(1.0)                                # every idle connection is closed by now
        assert_same_neighbours(kv.most_similar("paris", topn=3), expected)
        assert kv.retries_made == 0
        fresh = LiveKeyedVectors(url, retries=0)       # and with no retries at all
        fresh.most_similar("paris")
        time.sleep(1.0)
        assert_same_neighbours(fresh.most_similar("paris", topn=3), expected)

        async def twin():
            async with AsyncLiveKeyedVectors(url, retries=0) as akv:
                await akv.most_similar("paris")
                await asyncio.sleep(1.0)
                return await akv.most_similar("paris", topn=3)

        assert_same_neighbours(asyncio.run(twin()), expected)


def test_retries_reach_a_front_end_that_starts_late(model, reference):
    # The client has the URL before the front end exists. The port is held meanwhile: nothing else can take it,
    # connections to it are refused, and the front end binds it when it starts (SO_REUSEADDR, as servers do).
    with reserved_port() as port:
        url = f"http://127.0.0.1:{port}/"
        with pytest.raises(ServiceUnavailable, match="no answer after 1 attempts"):   # nobody listens yet
            LiveKeyedVectors(url, retries=0).most_similar("paris")
        procs = []

        def start_late():
            time.sleep(1.0)
            procs.append(subprocess.Popen([sys.executable, "-m", "online.cli", "frontend", "--model", str(model[0]),
                                           "--port", str(port)], cwd=REPO, env=clean_env(),
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        starter = threading.Thread(target=start_late)
        starter.start()
        try:
            kv = LiveKeyedVectors(url, retries=200, backoff=0.05, max_backoff=0.1)
            assert_same_neighbours(kv.most_similar("paris", topn=5), reference.most_similar("paris", topn=5))
            assert kv.retries_made >= 5                 # refused for at least the first second
            starter.join()

            async def async_twin():
                async with AsyncLiveKeyedVectors(url, retries=3) as akv:
                    return await akv.most_similar("paris", topn=5)

            assert_same_neighbours(asyncio.run(async_twin()), reference.most_similar("paris", topn=5))
        finally:
            starter.join()
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=15)


def stalled_export(url: str) -> socket.socket:
    """A client that asks for the export and reads nothing: the handler stays in flight."""
    host, port = url.split("//")[1].rstrip("/").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(b"GET /v1/export HTTP/1.1\r\nHost: x\r\n\r\n")
    return sock


@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    words, vectors = planted_model(seed=5, filler=60_000, dim=50)       # 12 MB: far beyond socket buffers
    path = tmp_path_factory.mktemp("big") / "big.bin"
    write_binary(path, words, vectors)
    return path, words, vectors


def test_retries_wait_out_503_overloaded(big_model):
    path, _, _ = big_model
    with running_frontend(["--model", str(path), "--max-concurrent-requests", "1"], clean_env()) as (url, _):
        kv = LiveKeyedVectors(url, retries=50, backoff=0.05, max_backoff=0.2)
        expected = kv.most_similar("paris", topn=3)
        blocker = stalled_export(url)
        try:
            deadline = time.monotonic() + 20
            while True:                       # until the stalled export holds the only slot
                try:
                    LiveKeyedVectors(url, retries=0).most_similar("paris")
                except ServiceUnavailable as exc:
                    assert exc.status == 503 and exc.code == "overloaded"
                    break
                assert time.monotonic() < deadline, "the stalled export never held the slot"
                time.sleep(0.05)
            refused = metric(url, "livevec_frontend_refused_total", reason="overloaded")
            threading.Timer(0.6, blocker.close).start()
            started = time.monotonic()
            assert kv.most_similar("paris", topn=3) == expected
            assert time.monotonic() - started >= 0.5 and kv.retries_made >= 2
            assert metric(url, "livevec_frontend_refused_total", reason="overloaded") >= refused + 2
        finally:
            blocker.close()
        assert metric(url, "livevec_frontend_internal_errors_total") == 0     # the abandoned export is no bug


# ------------------------------------------------------------------------ export
def read_export(url: str, fmt: str = "binary", token: str | None = None) -> tuple[dict, bytes]:
    request = urllib.request.Request(url + f"v1/export?format={fmt}",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=30) as r:
        return {k.lower(): v for k, v in r.headers.items()}, r.read()


def test_export_formats_are_word2vec_files_of_one_version(served, reference, tmp_path):
    url = served[0]
    headers, binary = read_export(url, "binary")
    assert headers["content-type"] == "application/octet-stream"
    assert headers["transfer-encoding"] == "chunked"
    assert int(headers["x-model-rows"]) == len(reference) and int(headers["x-model-dim"]) == DIM
    assert headers["x-model-skipped"] == "0" and int(headers["x-model-version"]) >= 1
    assert binary.startswith(f"{len(reference)} {DIM}\n".encode())
    text_headers, text = read_export(url, "text")
    assert text_headers["content-type"].startswith("text/plain") and "utf-8" in text_headers["content-type"]
    vocab_headers, vocab = read_export(url, "vocab")
    (tmp_path / "e.bin").write_bytes(binary)
    (tmp_path / "e.txt").write_bytes(text)
    from_binary = KeyedVectors.load_word2vec_format(str(tmp_path / "e.bin"), binary=True)
    from_text = KeyedVectors.load_word2vec_format(str(tmp_path / "e.txt"), binary=False)
    assert from_binary.index_to_key == from_text.index_to_key == reference.index_to_key
    assert np.array_equal(from_binary.vectors, from_text.vectors)         # 9 digits: the same float32 bits
    np.testing.assert_allclose(from_binary.vectors, reference.vectors, rtol=1e-6, atol=1e-6)
    assert [line.split(" ")[0] for line in vocab.decode().splitlines()] == reference.index_to_key
    assert headers["x-model-version"] == text_headers["x-model-version"] == vocab_headers["x-model-version"]
    # livevec reads its own export too
    from online.learner.word2vec_format import read_word2vec
    assert read_word2vec(tmp_path / "e.bin").words == reference.index_to_key
    with pytest.raises(urllib.error.HTTPError) as bad:
        read_export(url, "csv")
    assert bad.value.code == 400 and b"bad_format" in bad.value.read()
    head = urllib.request.urlopen(urllib.request.Request(url + "v1/export", method="HEAD"), timeout=10)
    assert head.headers["X-Model-Rows"] == str(len(reference)) and head.read() == b""


def test_export_orders_rows_by_count(tmp_path):
    words = ["rare", "common", "middle", "tied-a", "tied-b"]
    vectors = np.arange(5 * 4, dtype=np.float32).reshape(5, 4)
    path = tmp_path / "m.bin"
    write_binary(path, words, vectors)
    counts = tmp_path / "counts.txt"
    counts.write_text("rare 1\ncommon 100\nmiddle 10\ntied-a 5\ntied-b 5\n")
    with running_frontend(["--model", str(path), "--vocab-counts", str(counts)], clean_env()) as (url, _):
        kv = LiveKeyedVectors(url, retries=20, backoff=0.05)
        assert kv.index_to_key == ["common", "middle", "tied-a", "tied-b", "rare"]
        _, vocab = read_export(url, "vocab")
        assert vocab.decode() == "common 100\nmiddle 10\ntied-a 5\ntied-b 5\nrare 1\n"
        copy = kv.to_keyed_vectors()
        assert copy.index_to_key == kv.index_to_key
        np.testing.assert_allclose(copy["middle"], vectors[2], rtol=1e-6)


def test_export_escapes_whitespace_and_leaves_out_words_a_word2vec_file_cannot_hold():
    # no file makes such words; a plug-in source or a JSON record might, so the index is built directly
    from online.frontend.export import encode_rows, exportable_rows
    from online.search.model_index import ModelIndex
    from online.learner.keys import word_keys
    words = ["ok", "has space", "", "tab\tx", "fine", "nbsp\u00a0x", "a b", "a%20b"]
    index = ModelIndex.from_arrays(1, word_keys(words), words, np.eye(8, 3, dtype=np.float32), np.arange(8))
    rows = exportable_rows(index)          # "" cannot be written; "a b" would be spelled as "a%20b", a word
    assert [index.words[r] for r in rows] == ["a%20b", "nbsp\u00a0x", "fine", "tab\tx", "has space", "ok"]
    assert encode_rows(index, rows, "vocab") == \
        b"a%20b 7\nnbsp%C2%A0x 5\nfine 4\ntab%09x 3\nhas%20space 1\nok 0\n"
    assert encode_rows(index, rows[2:], "text") == b"fine 0 0 0\ntab%09x 0 0 0\nhas%20space 0 1 0\nok 1 0 0\n"
    assert encode_rows(index, rows[-2:], "binary") == b"has%20space " + np.array([0, 1, 0], "<f4").tobytes() + \
        b"\nok " + np.array([1, 0, 0], "<f4").tobytes() + b"\n"
    every = exportable_rows(index, "words")                 # the exact words: every row
    assert encode_rows(index, every[:3], "words") == b'["a%20b",7]\n["a b",6]\n["nbsp\xc2\xa0x",5]\n'
    assert len(every) == len(words)


def test_export_streams_one_snapshot_while_the_model_is_replaced(big_model, tmp_path):
    _, words_a, vectors_a = big_model
    path = tmp_path / "live.bin"
    write_binary(path, words_a, vectors_a)
    with running_frontend(["--model", str(path), "--sync-interval", "0.05"], clean_env()) as (url, _):
        kv = LiveKeyedVectors(url, retries=50, backoff=0.05, max_backoff=0.2)
        version_a = kv._run(_ready_version())
        host, port = url.split("//")[1].rstrip("/").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.sock = socket.socket()
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.sock.settimeout(30)
        conn.sock.connect((host, int(port)))
        conn.request("GET", "/v1/export")
        response = conn.getresponse()
        assert response.getheader("X-Model-Version") == str(version_a)
        first = response.read(65536)
        # model B: other words, other vectors; the front end swaps it in while the export is unread
        words_b = [f"b{i}" for i in range(1000)]
        write_binary(tmp_path / "next.bin", words_b, np.ones((1000, 50), np.float32))
        (tmp_path / "next.bin").replace(path)
        deadline = time.monotonic() + 20
        while kv._run(_ready_version()) == version_a:
            assert time.monotonic() < deadline, "the replaced file was never loaded"
            time.sleep(0.05)
        assert kv.index_to_key == words_b and kv.most_similar("b1", topn=1)[0][0].startswith("b")
        rest = response.read()
        conn.close()
        total = first + rest
        assert len(rest) > 10 * 65536            # most of the file was still to be sent at the swap
        snapshot = _parse_binary(total)
        assert snapshot[0] == words_a
        np.testing.assert_allclose(snapshot[1], vectors_a, rtol=1e-6, atol=1e-6)
        after = kv.to_keyed_vectors()
        assert after.index_to_key == words_b and after.lifecycle_events[-1]["version"] > version_a


def _ready_version():
    from online.client.protocol import Call
    return (yield Call("GET", "/ready")).json()["version"]


def _parse_binary(data: bytes):
    from online.client.word2vec_stream import BinaryReader
    reader = BinaryReader({})
    for i in range(0, len(data), 7777):          # in odd pieces: records cut anywhere
        reader.feed(data[i:i + 7777])
    snap = reader.finish()
    return snap.words, snap.vectors


def test_a_truncated_export_is_an_error_not_a_short_model():
    from online.client.errors import IncompleteExport
    from online.client.word2vec_stream import BinaryReader
    words, vectors = planted_model(filler=10, dim=4)
    data = f"{len(words)} 4\n".encode() + b"".join(w.encode() + b" " + v.tobytes() + b"\n"
                                                  for w, v in zip(words, vectors))
    assert _parse_binary(data)[0] == words
    reader = BinaryReader({"x-model-rows": str(len(words))})
    reader.feed(data[:-20])
    with pytest.raises(IncompleteExport, match=f"after {len(words) - 1} of {len(words)} rows"):
        reader.finish()
