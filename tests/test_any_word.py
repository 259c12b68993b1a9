"""Any word through every endpoint and every client method, and queries by vector, against gensim.

A real ``livevec frontend`` process serves a model whose vocabulary holds hostile words
(commas, ``/``, ``?``, ``#``, ``%``, ``+``, quotes, emoji, CJK, Hebrew, a space), through a
source plug-in (``tests.any_word_model``: a word2vec file cannot hold the space). gensim's
``KeyedVectors`` is built on the same vectors in the same order, and every answer is
compared with gensim's: the same words in the same order, scores within 1e-5 (the front
end keeps each row as a float32 unit vector times its norm and rounds scores to 6
decimals). The model has 3,035 rows, far below the inverted file's threshold, so every
search is exact.
"""
from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from urllib.parse import quote

import numpy as np
import pytest
from gensim.models import KeyedVectors

from online.client import AsyncLiveKeyedVectors, LiveKeyedVectors, RequestError
from online.learner.word2vec_format import (escape_word, read_vocab_counts, read_word2vec, write_binary, write_text,
                                            write_vocab)
from tests.any_word_model import HOSTILE, hostile_model, save
from tests.frontend_process import clean_env, running_frontend

ATOL = 1e-5


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    words, vectors, counts = hostile_model()
    path = tmp_path_factory.mktemp("any_word") / "model.npz"
    save(path, words, vectors, counts)
    return path, words, vectors, counts


@pytest.fixture(scope="module")
def reference(model):
    _, words, vectors, _ = model
    kv = KeyedVectors(vector_size=vectors.shape[1], count=0, dtype=np.float32)
    kv.add_vectors(words, vectors)
    return kv


@pytest.fixture(scope="module")
def served(model):
    env = clean_env(LIVEVEC_MODEL_SOURCE="tests.any_word_model:source", ANY_WORD_MODEL=str(model[0]))
    with running_frontend(["--max-k", "2000", "--sync-interval", "0.05"], env) as (url, proc):
        LiveKeyedVectors(url, retries=50, backoff=0.05, max_backoff=0.2).vector_size    # waits for the model
        yield url, proc


def call(url: str, path: str, body=None, raw: bytes | None = None) -> tuple[int, object]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url.rstrip("/") + path, data=data,
                                     headers={"Content-Type": "application/json"} if data is not None else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def same_neighbours(got, expected, label=""):
    got = [(n["word"], n["score"]) if isinstance(n, dict) else n for n in got]
    assert [w for w, _ in got] == [w for w, _ in expected], label
    np.testing.assert_allclose([s for _, s in got], [s for _, s in expected], atol=ATOL, err_msg=label)


def some_vector(seed: int, dim: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(dim).astype(np.float32)


# ------------------------------------------------------------------ the endpoints
def test_every_endpoint_answers_hostile_words(served, reference):
    url = served[0]
    for i, word in enumerate(HOSTILE):
        q = quote(word, safe="")
        status, body = call(url, f"/v1/similar?word={q}&k=10")
        assert status == 200 and body["word"] == word, body
        same_neighbours(body["neighbours"], reference.most_similar(word, topn=10), word)
        status, body = call(url, f"/v1/vector/{q}")
        assert status == 200 and body["word"] == word
        np.testing.assert_allclose(body["vector"], reference[word], rtol=1e-6, atol=1e-6)
        status, body = call(url, f"/v1/vocab?prefix={q}&limit=5")
        assert status == 200 and word in [w["word"] for w in body["words"]], body
        status, body = call(url, f"/v1/closer?word={q}&than=paris")
        assert status == 200 and body["word"] == word
        assert [n["word"] for n in body["words"]] == reference.closer_than(word, "paris"), word
        other, third = HOSTILE[(i + 1) % len(HOSTILE)], HOSTILE[(i + 2) % len(HOSTILE)]
        query = {"positive": [word, other], "negative": [third], "k": 7}
        for path in ("/v1/similar", "/v1/analogy"):
            status, body = call(url, path, query)
            assert status == 200 and body["positive"] == [word, other] and body["negative"] == [third], body
            same_neighbours(body["neighbours"], reference.most_similar(positive=[word, other], negative=[third],
                                                                       topn=7), f"{path} {word}")
    status, body = call(url, "/v1/similar", {"words": HOSTILE, "k": 4})
    assert status == 200 and [r["word"] for r in body["results"]] == HOSTILE
    for word, result in zip(HOSTILE, body["results"]):
        same_neighbours(result["neighbours"], reference.most_similar(word, topn=4), word)
    # GET stays as it was for simple words
    status, body = call(url, "/v1/analogy?positive=king,woman&negative=man&k=3")
    assert status == 200
    same_neighbours(body["neighbours"], reference.most_similar(positive=["king", "woman"], negative=["man"], topn=3))


def test_drift_and_history_take_any_word(served, reference):
    url = served[0]
    for word in HOSTILE:
        deadline = time.monotonic() + 60         # the first checkpoint is taken when the first model is served,
        while True:                              # written to local disk meanwhile (404 until it is there)
            status, body = call(url, f"/v1/drift?word={quote(word, safe='')}&k=5")
            first_pending = status == 404 and body.get("error") == "unknown_checkpoint" and not body["checkpoints"]
            if (status != 503 and not first_pending) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert status == 200 and body["word"] == word and body["in_checkpoint"] is True, body
        same_neighbours(body["now"], reference.most_similar(word, topn=5), word)
        assert body["overlap"] == 1.0            # the model has not changed since its checkpoint
    status, body = call(url, "/v1/history")
    assert status == 200 and body["checkpoints"] and body["version"] == 1


def test_queries_by_vector_agree_with_gensim(served, reference):
    url = served[0]
    dim = reference.vector_size
    for seed in range(5):
        v = some_vector(seed, dim)
        status, body = call(url, "/v1/similar", {"vector": v.tolist(), "k": 9})
        assert status == 200 and body["positive"] == [None], body
        same_neighbours(body["neighbours"], reference.similar_by_vector(v, topn=9), f"vector {seed}")
    v, w = some_vector(10, dim), some_vector(11, dim)
    mixed = [({"positive": [v.tolist(), "two words"], "negative": ["C++"]},
              dict(positive=[v, "two words"], negative=["C++"])),
             ({"positive": [{"vector": v.tolist(), "weight": 2.5}, {"word": "🙂", "weight": 0.5}],
               "negative": [{"word": "a,b", "weight": -1.5}, w.tolist()]},
              dict(positive=[(v, 2.5), ("🙂", 0.5)], negative=[("a,b", -1.5), w])),
             ({"positive": [{"word": "שלום", "weight": -1}]}, dict(negative=["שלום"]))]
    for body_terms, gensim_terms in mixed:
        status, body = call(url, "/v1/similar", {**body_terms, "k": 6})
        assert status == 200, body
        same_neighbours(body["neighbours"], reference.most_similar(**gensim_terms, topn=6), str(gensim_terms))
    for body_terms, gensim_terms in [({"positive": ["king", "woman"], "negative": ["man"]},
                                      dict(positive=["king", "woman"], negative=["man"])),
                                     ({"positive": ["分散", v.tolist()], "negative": ['"q"']},
                                      dict(positive=["分散", v], negative=['"q"']))]:
        status, body = call(url, "/v1/similar", {**body_terms, "k": 6, "method": "mul"})
        assert status == 200 and body["method"] == "mul", body
        same_neighbours(body["neighbours"], reference.most_similar_cosmul(**gensim_terms, topn=6))
        weighted = {name: [{"word": t, "weight": 3} if isinstance(t, str) else t for t in terms]
                    for name, terms in body_terms.items()}
        assert call(url, "/v1/analogy", {**weighted, "k": 6, "method": "mul"})[1]["neighbours"] == \
            body["neighbours"]                           # 3CosMul has no weights: they are ignored


def test_bad_query_bodies_are_clear_400s(served):
    url = served[0]
    dim = 24
    cases = [({"vector": [0.5] * (dim - 1)}, 400, "bad_vector"),
             ({"vector": [0.5] * dim + [1.0]}, 400, "bad_vector"),
             ({"vector": [None] * dim}, 400, "bad_vector"),
             ({"vector": [1e39] * dim}, 400, "bad_vector"),           # finite in JSON, infinite in float32
             ({"vector": [2e6] * dim}, 400, "bad_vector"),            # beyond the documented bound
             ({"vector": []}, 400, "bad_vector"),
             ({"vector": "paris"}, 400, "bad_vector"),
             ({"vector": [True] * dim}, 400, "bad_vector"),
             ({"positive": []}, 400, "bad_positive"),
             ({"positive": [], "negative": []}, 400, "bad_positive"),
             ({"positive": "paris"}, 400, "bad_positive"),
             ({"positive": [""]}, 400, "bad_positive"),
             ({"positive": [7]}, 400, "bad_positive"),
             ({"positive": [{"word": "paris", "weight": "x"}]}, 400, "bad_weight"),
             ({"positive": [{"word": "paris", "vector": [0.1] * dim}]}, 400, "bad_positive"),
             ({"positive": [{"colour": 1}]}, 400, "bad_positive"),
             ({"negative": ["paris"]}, 400, "bad_positive"),
             ({"positive": ["paris"], "method": "max"}, 400, "bad_method"),
             ({"negative": ["paris"], "method": "mul"}, 400, "bad_positive"),
             ({"vector": [0.1] * dim, "positive": ["paris"]}, 400, "bad_body"),
             ({"positive": ["paris"], "k": 0}, 400, "bad_k"),
             ({"positive": ["paris", "no such word"]}, 404, "unknown_word"),
             ({"positive": ["paris", [0.1] * 3]}, 400, "bad_vector"),
             ({"positive": ["paris"] * 51}, 400, "bad_positive")]
    for body, status, code in cases:
        got_status, got = call(url, "/v1/similar", body)
        assert (got_status, got.get("error")) == (status, code), (body, got)
        assert got["message"]
    for raw in (b'{"vector": [NaN, 1]}', b'{"vector": [Infinity]}', b"[1, 2]"):
        got_status, got = call(url, "/v1/similar", raw=raw)
        assert got_status == 400 and got["error"] in ("bad_json", "bad_body"), got
    status, got = call(url, "/v1/similar", {"vector": [0.0] * dim, "k": 3})     # no direction: every cosine 0
    assert status == 200 and [n["score"] for n in got["neighbours"]] == [0.0] * 3
    status, got = call(url, "/v1/analogy", {"negative": ["paris"]})
    assert (status, got["error"]) == (400, "bad_positive")
    status, got = call(url, "/v1/closer?word=paris&than=nowhere")
    assert (status, got["error"]) == (404, "unknown_word") and got["unknown"] == ["nowhere"]
    status, stats = call(url, "/v1/stats")
    assert stats["queries"]["internal_errors"] == 0


# ------------------------------------------------------------------- the clients
def client_calls(dim: int, words: list[str]):
    """(method, args, kwargs) for every mirrored method, hostile words in each."""
    v, w = some_vector(21, dim), some_vector(22, dim)
    h = HOSTILE
    calls = [("most_similar", (word,), {"topn": 6}) for word in h]
    calls += [("most_similar", (), {"positive": [h[i], h[i + 1]], "negative": [h[i + 2]], "topn": 5})
              for i in range(len(h) - 2)]
    calls += [("most_similar", (), {"positive": [v, "two words"], "negative": ["a,b"], "topn": 5}),
              ("most_similar", (), {"positive": [("C++", 0.5), (v, 2.0)], "negative": [("100%", -1.5)]}),
              ("most_similar", (), {"positive": v}),
              ("most_similar", (), {"negative": "what?", "topn": 3}),
              ("similar_by_vector", (v,), {"topn": 7}),
              ("similar_by_vector", (w,), {}),
              ("similar_by_word", ("#tag",), {"topn": 3}),
              ("similar_by_key", ("x/y",), {"topn": 3}),
              ("most_similar_cosmul", (), {"positive": ["king", "woman"], "negative": ["man"], "topn": 4}),
              ("most_similar_cosmul", (), {"positive": [h[0], h[1]], "negative": [h[2]], "topn": 5}),
              ("most_similar_cosmul", (), {"positive": ["分散", v], "negative": ['"q"'], "topn": 5}),
              ("most_similar_cosmul", ("two words",), {"topn": 5}),
              ("similarity", ("a,b", "two words"), {}),
              ("distance", ("🙂", "שלום"), {}),
              ("distances", ("C++", ["100%", "what?", "paris"]), {}),
              ("distances", (v, h), {}),
              ("distances", ("two words",), {}),
              ("n_similarity", (["a,b", "x/y"], ["two words", "paris", "no such word"]), {}),
              ("rank", ("#tag", "分散"), {}),
              ("rank", ("paris", "france"), {}),
              ("closer_than", ('"q"', "two words"), {}),
              ("words_closer_than", ("🙂", "C++"), {}),
              ("doesnt_match", (h[:6] + ["w5"],), {}),
              ("get_vector", ("two words",), {"norm": True}),
              ("__getitem__", ("100%",), {}),
              ("__getitem__", (h,), {}),
              ("has_index_for", ("x/y",), {}),
              ("has_index_for", ("X/Y",), {})]
    return calls


def assert_same(got, expected, label):
    if isinstance(expected, list) and expected and isinstance(expected[0], tuple):
        same_neighbours(got, expected, label)
    elif isinstance(expected, np.ndarray):
        assert isinstance(got, np.ndarray) and got.shape == expected.shape, label
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=label)
    elif isinstance(expected, (float, np.floating)):
        assert isinstance(got, (float, np.floating)) and abs(float(got) - float(expected)) < ATOL, (label, got)
    else:
        assert got == expected, label


def gensim_answer(reference, name, args, kwargs):
    return getattr(reference, name)(*args, **kwargs)


def test_the_blocking_client_agrees_with_gensim_on_hostile_words(served, reference, model):
    _, words, _, _ = model
    with LiveKeyedVectors(served[0], retries=20, backoff=0.05) as kv:
        for name, args, kwargs in client_calls(reference.vector_size, words):
            assert_same(getattr(kv, name)(*args, **kwargs), gensim_answer(reference, name, args, kwargs),
                        f"{name}{args!r:.80}{kwargs!r:.80}")
        assert kv.index_to_key == reference.index_to_key            # "two words" included, exactly
        assert kv.key_to_index == reference.key_to_index
        assert all(word in kv for word in HOSTILE)
        many = kv.most_similar_many(HOSTILE, topn=5)
        for word, got in zip(HOSTILE, many):
            same_neighbours(got, reference.most_similar(word, topn=5), word)
        for name, args in [("most_similar", ("a,b,c",)), ("similarity", ("a,b", "A,B")), ("rank", ("x/y", "nope")),
                           ("closer_than", ("nope", "x/y")), ("most_similar_cosmul", (["two words", "nope"],)),
                           ("distances", ("nope", ["x/y"]))]:
            for target in (kv, reference):
                with pytest.raises(KeyError):
                    getattr(target, name)(*args)
        with pytest.raises(ValueError):                   # a vector of the wrong length: gensim cannot broadcast
            reference.similar_by_vector(np.ones(5, np.float32))
        with pytest.raises(RequestError, match="bad_vector"):
            kv.similar_by_vector(np.ones(5, np.float32))
        with pytest.raises(RequestError, match="bad_vector"):
            kv.similar_by_vector(np.full(reference.vector_size, np.nan, np.float32))


def test_the_async_client_agrees_with_gensim_on_hostile_words(served, reference, model):
    _, words, _, _ = model
    calls = client_calls(reference.vector_size, words)

    async def main():
        async with AsyncLiveKeyedVectors(served[0], retries=20, backoff=0.05, pool_size=4) as akv:
            answers = [await getattr(akv, name)(*args, **kwargs) for name, args, kwargs in calls]
            return answers, await akv.index_to_key, await akv.key_to_index

    answers, index_to_key, key_to_index = asyncio.run(main())
    for (name, args, kwargs), got in zip(calls, answers):
        assert_same(got, gensim_answer(reference, name, args, kwargs), f"async {name}{args!r:.80}")
    assert index_to_key == reference.index_to_key and key_to_index == reference.key_to_index


def _questions(tmp_path):
    analogies = tmp_path / "questions.txt"
    analogies.write_text(": capitals\nparis france berlin germany\nberlin germany tokyo japan\n"
                         "paris france tokyo nowhere\nPARIS FRANCE TOKYO JAPAN\n"
                         ": hostile\nman king woman queen\na,b x/y what? #tag\nC++ 100% 🙂 分散\n"
                         "x/y a,b \"q\" שלום\nnot a question\n分散 C++ שלום \"q\"\n", encoding="utf-8")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("# hostile pairs\ntwo words\tparis\t3.5\na,b\tx/y\t7.25\nC++\t100%\t1.0\n🙂\t分散\t5.0\n"
                     "שלום\t\"q\"\t2.0\nking\tqueen\t9.0\nnope\tparis\t4.0\nbroken line\n#tag\twhat?\t6.5\n",
                     encoding="utf-8")
    return analogies, pairs


def test_evaluations_run_on_the_live_model_as_gensim_runs_them(served, reference, tmp_path):
    analogies, pairs = _questions(tmp_path)
    with LiveKeyedVectors(served[0], retries=20, backoff=0.05) as kv:
        for options in ({}, {"case_insensitive": False}, {"dummy4unknown": True}, {"restrict_vocab": 15}):
            got = kv.evaluate_word_analogies(str(analogies), **options)
            expected = reference.evaluate_word_analogies(str(analogies), **options)
            assert got[0] == expected[0] and got[1] == expected[1], options
            pearson, spearman, oov = kv.evaluate_word_pairs(str(pairs), **options)
            e_pearson, e_spearman, e_oov = reference.evaluate_word_pairs(str(pairs), **options)
            assert abs(pearson[0] - e_pearson[0]) < 1e-5 and abs(spearman[0] - e_spearman[0]) < 1e-9, options
            assert abs(pearson[1] - e_pearson[1]) < 1e-4 and oov == e_oov, options
        assert len(kv.evaluate_word_analogies(str(analogies))[1][-1]["correct"]) >= 2   # not trivially empty

    async def twin():
        async with AsyncLiveKeyedVectors(served[0], retries=20, backoff=0.05) as akv:
            return await akv.evaluate_word_analogies(str(analogies)), await akv.evaluate_word_pairs(str(pairs))

    (score, sections), (pearson, _, _) = asyncio.run(twin())
    expected = reference.evaluate_word_analogies(str(analogies))
    assert (score, sections) == expected
    assert abs(pearson[0] - reference.evaluate_word_pairs(str(pairs))[0][0]) < 1e-5


# ------------------------------------------------------------------------ export
def read_export(url: str, fmt: str) -> tuple[dict, bytes]:
    with urllib.request.urlopen(url + f"v1/export?format={fmt}", timeout=30) as r:
        return {k.lower(): v for k, v in r.headers.items()}, r.read()


def test_the_export_escapes_whitespace_as_documented(served, model, tmp_path):
    url = served[0]
    _, words, vectors, counts = model
    spelled = [escape_word(w) for w in words]
    assert spelled[words.index("two words")] == "two%20words"
    assert [s for s, w in zip(spelled, words) if s != w] == ["two%20words"]     # the rest byte for byte
    for fmt, binary in (("binary", True), ("text", False)):
        headers, data = read_export(url, fmt)
        assert headers["x-model-skipped"] == "0" and int(headers["x-model-rows"]) == len(words)
        (tmp_path / fmt).write_bytes(data)
        loaded = KeyedVectors.load_word2vec_format(str(tmp_path / fmt), binary=binary)
        assert loaded.index_to_key == spelled
        np.testing.assert_allclose(loaded.vectors, vectors, rtol=1e-6, atol=1e-6)
        assert read_word2vec(tmp_path / fmt).words == spelled
    _, vocab = read_export(url, "vocab")
    assert vocab.decode("utf-8").splitlines() == [f"{s} {c}" for s, c in zip(spelled, counts.tolist())]
    headers, exact = read_export(url, "words")
    assert headers["content-type"].startswith("application/x-ndjson")
    assert [json.loads(line) for line in exact.decode("utf-8").splitlines()] == \
        [[w, c] for w, c in zip(words, counts.tolist())]
    with LiveKeyedVectors(url) as kv:                    # the gensim copy holds what a file holds
        assert kv.to_keyed_vectors().index_to_key == spelled


def test_the_writers_escape_whitespace_and_leave_out_a_collision(tmp_path):
    words = ["plain", "two words", "tab\tword", "nbsp\u00a0word", "100%", "a b", "a%20b"]
    vectors = np.arange(len(words) * 3, dtype=np.float32).reshape(-1, 3)
    expected = ["plain", "two%20words", "tab%09word", "nbsp%C2%A0word", "100%", "a%20b"]  # "a b" collides
    for writer in (write_binary, write_text):
        path = tmp_path / writer.__name__
        writer(path, words, vectors)
        got = read_word2vec(path)
        assert got.words == expected
        np.testing.assert_allclose(got.vectors, np.delete(vectors, 5, axis=0))
        assert KeyedVectors.load_word2vec_format(str(path), binary=writer is write_binary).index_to_key == expected
    write_vocab(tmp_path / "vocab.txt", words, range(len(words)))
    assert read_vocab_counts(tmp_path / "vocab.txt") == {w: i for i, w in enumerate(expected[:5])} | {"a%20b": 6}
    (tmp_path / "raw.txt").write_text("two words 7\nplain 3\n", encoding="utf-8")   # written with its space
    assert read_vocab_counts(tmp_path / "raw.txt") == {"two%20words": 7, "plain": 3}
    with pytest.raises(ValueError, match="empty"):
        write_binary(tmp_path / "empty", ["ok", ""], vectors[:2])
