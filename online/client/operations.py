"""Each ``KeyedVectors`` read method as an operation: the calls it makes and what gensim would return.

gensim's rules are kept where a remote model can keep them: keys are exact (the front end
also matches a word's lower-case form; an answer for another spelling than the one asked
is refused here with ``KeyError``), the query words are left out of ``most_similar``,
``doesnt_match`` ignores unknown words with a warning, and the arithmetic of
``similarity`` and ``doesnt_match`` is gensim's, in float32, on the served vectors. What
the API cannot answer (a vector or a weight other than +-1 in ``most_similar``,
``topn=None``) raises ``NotImplementedError`` instead of an approximation;
``to_keyed_vectors()`` has it all.

Calls that need several vectors yield them as one list: the blocking client sends them one
after another on a kept-alive connection, the asyncio one at once. They may then come from
successive versions of a model that is learning; ``to_keyed_vectors()`` is the one
consistent copy.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Integral
from typing import Any
from urllib.parse import quote, urlencode

import numpy as np
import orjson

from online.client.errors import LiveVecError
from online.client.protocol import Call, Operation, Reply
from online.client.word2vec_stream import BinaryReader, Snapshot

log = logging.getLogger("livevec.client")

_VECTOR = (200, 404)


@dataclass(frozen=True)
class Vocabulary:
    version: int
    index_to_key: list[str]
    key_to_index: dict[str, int]


def _check_key(key: Any, suffix: str = "") -> str:
    if not isinstance(key, str) or not key:
        raise KeyError(f"Key '{key}' not present{suffix}")
    return key


def _unknown(reply: Reply) -> list[str]:
    """The words a 404 names as unknown; a 404 for any other reason is not a missing key."""
    body = reply.json()
    if not isinstance(body, Mapping) or body.get("error") != "unknown_word":
        raise LiveVecError(f"404 from the front end that is not an unknown word: {body!r:.200}", 404,
                           body.get("error") if isinstance(body, Mapping) else None)
    return list(body.get("unknown") or [])


def _vector_call(word: str) -> Call:
    return Call("GET", "/v1/vector/" + quote(word, safe=""), accept=_VECTOR)


def _vector_of(reply: Reply, word: str) -> np.ndarray | None:
    if reply.status == 404:
        _unknown(reply)
        return None
    body = reply.json()
    if body["word"] != word:               # the front end's lower-case fallback: another key
        return None
    return np.asarray(body["vector"], dtype=np.float32)


def _unit(v: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(v)
    return v / norm if norm > 0 else v


# ------------------------------------------------------------------- vectors
def get_vector(word: str, norm: bool = False) -> Operation[np.ndarray]:
    _check_key(word)
    vec = _vector_of((yield _vector_call(word)), word)
    if vec is None:
        raise KeyError(f"Key '{word}' not present")
    if norm:
        vec = _unit(vec).astype(np.float32)
    vec.setflags(write=False)              # as gensim: a returned row is not a handle to edit the model
    return vec


def get_vectors(words: list[str]) -> Operation[np.ndarray]:
    for w in words:
        _check_key(w)
    replies = yield [_vector_call(w) for w in words]
    rows = []
    for word, reply in zip(words, replies):
        vec = _vector_of(reply, word)
        if vec is None:
            raise KeyError(f"Key '{word}' not present")
        rows.append(vec)
    return np.vstack(rows)


def has_index_for(word: Any) -> Operation[bool]:
    if not isinstance(word, str) or not word:
        return False
    return _vector_of((yield _vector_call(word)), word) is not None


def similarity(w1: str, w2: str) -> Operation[np.float32]:
    _check_key(w1), _check_key(w2)
    r1, r2 = yield [_vector_call(w1), _vector_call(w2)]
    v1, v2 = _vector_of(r1, w1), _vector_of(r2, w2)
    for word, vec in ((w1, v1), (w2, v2)):
        if vec is None:
            raise KeyError(f"Key '{word}' not present")
    return np.dot(_unit(v1), _unit(v2))


def doesnt_match(words: list[str]) -> Operation[str]:
    words = list(words)
    asked = [w for w in words if isinstance(w, str) and w]
    replies = yield [_vector_call(w) for w in asked]
    found = {w: v for w, r in zip(asked, replies) if (v := _vector_of(r, w)) is not None}
    used = [w for w in words if w in found]
    if len(used) != len(words):
        log.warning("vectors for words %s are not present in the model, ignoring these words",
                    set(words) - set(used))
    if not used:
        raise ValueError("cannot select a word from an empty list")
    vectors = np.vstack([_unit(found[w]) for w in used]).astype(np.float32)
    mean = _unit(vectors.mean(axis=0)).astype(np.float32)
    dists = vectors @ mean
    return sorted(zip(dists.tolist(), used), reverse=True)[-1][1]


# ------------------------------------------------------------------ neighbours
def _terms(items: Any, sign: float) -> list[tuple[str, float]]:
    if items is None:
        return []
    if isinstance(items, (str, np.ndarray)):           # as gensim's _ensure_list
        items = [items]
    out = []
    for item in items:
        word, weight = (item, sign) if not isinstance(item, tuple) else item
        if isinstance(word, np.ndarray):
            raise NotImplementedError("most_similar on a vector is not served; use to_keyed_vectors()")
        if float(weight) not in (1.0, -1.0):
            raise NotImplementedError(f"the front end sums unit vectors with weights +1 and -1; got weight "
                                      f"{weight} for {word!r} (use to_keyed_vectors() for other weights)")
        out.append((_check_key(word, " in vocabulary"), float(weight)))
    return out


def _neighbours(body: Mapping[str, Any], topn: int) -> list[tuple[str, float]]:
    return [(n["word"], float(n["score"])) for n in body["neighbours"][:topn]]


def most_similar(positive: Any = None, negative: Any = None, topn: int | None = 10) -> Operation[list]:
    if topn is None:
        raise NotImplementedError("topn=None (every similarity) is not served; use to_keyed_vectors()")
    if isinstance(topn, Integral) and topn < 1:
        return []
    terms = _terms(positive, 1.0) + _terms(negative, -1.0)
    if not terms:
        raise ValueError("cannot compute mean with no input")
    pos = [w for w, s in terms if s > 0]
    neg = [w for w, s in terms if s < 0]
    if not pos:
        raise NotImplementedError("a query without a positive word is not served; use to_keyed_vectors()")
    if len(pos) == 1 and not neg:
        call = Call("GET", "/v1/similar?" + urlencode({"word": pos[0], "k": int(topn)}), accept=_VECTOR)
    else:
        if any("," in w for w in pos + neg):
            raise ValueError("words containing ',' cannot be combined in one query (the API separates them "
                             "with commas)")
        query = {"positive": ",".join(pos), "k": int(topn)}
        if neg:
            query["negative"] = ",".join(neg)
        call = Call("GET", "/v1/analogy?" + urlencode(query), accept=_VECTOR)
    reply = yield call
    if reply.status == 404:
        missing = _unknown(reply) or pos + neg
        raise KeyError(f"Key '{missing[0]}' not present in vocabulary")
    body = reply.json()
    resolved = [body["word"]] if "word" in body else body["positive"] + body["negative"]
    for asked, got in zip(pos + neg, resolved):
        if asked != got:
            raise KeyError(f"Key '{asked}' not present in vocabulary")
    return _neighbours(body, int(topn))


def most_similar_many(words: list[str], topn: int = 10, batch_words: int = 500,
                      strict: bool = True) -> Operation[list]:
    """Neighbours of each word, ``batch_words`` words per POST /v1/similar. Unknown words raise
    ``KeyError`` naming all of them (``strict``), or get ``None`` in their place."""
    words = list(words)
    for w in words:
        _check_key(w)
    if not words or (isinstance(topn, Integral) and topn < 1):
        return [[] for _ in words]
    calls = [Call("POST", "/v1/similar", orjson.dumps({"words": words[i:i + batch_words], "k": int(topn)}))
             for i in range(0, len(words), batch_words)]
    replies = yield calls
    results = [result for reply in replies for result in reply.json()["results"]]
    if len(results) != len(words):
        raise LiveVecError(f"{len(results)} batch results for {len(words)} words")
    out = [None if "error" in result or result["word"] != word else _neighbours(result, int(topn))
           for word, result in zip(words, results)]          # another spelling answered: not this key
    missing = [w for w, r in zip(words, out) if r is None]
    if strict and missing:
        raise KeyError(f"Keys not present in vocabulary: {', '.join(repr(w) for w in missing[:20])}"
                       + (f" and {len(missing) - 20} more" if len(missing) > 20 else ""))
    return out


# ------------------------------------------------------------------ the model
def vocabulary(cached: Vocabulary | None) -> Operation[Vocabulary]:
    """The word list of the current version; the cached one while the version has not changed
    (checked on /ready, which costs the front end nothing)."""
    version = (yield Call("GET", "/ready")).json()["version"]
    if cached is not None and cached.version == version:
        return cached
    reply = yield Call("GET", "/v1/export?format=vocab")
    lines = reply.body.decode("utf-8").split("\n")
    words = [line.rsplit(" ", 1)[0] for line in lines if line]
    return Vocabulary(int(reply.headers.get("x-model-version", version)), words,
                      {w: i for i, w in enumerate(words)})


def model_shape() -> Operation[tuple[int, int]]:
    """(words, dimension) of the served copy, once a model is loaded (/ready is retried until then)."""
    yield Call("GET", "/ready")
    stats = (yield Call("GET", "/v1/stats")).json()
    return int(stats["vocab_size"]), int(stats["dim"])


def snapshot() -> Operation[Snapshot]:
    """One consistent copy of the whole model, streamed from /v1/export into preallocated arrays."""
    return (yield Call("GET", "/v1/export?format=binary", sink=BinaryReader)).body
