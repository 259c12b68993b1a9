"""Each ``KeyedVectors`` read method as an operation: the calls it makes and what gensim would return.

gensim's rules are kept where a remote model can keep them: keys are exact (the front end
also matches a word's lower-case form; an answer for another spelling than the one asked
is refused here with ``KeyError``), the query words are left out of ``most_similar``,
``doesnt_match`` ignores unknown words with a warning, and the arithmetic of
``similarity``, ``n_similarity``, ``distance(s)`` and ``doesnt_match`` is gensim's, in
float32, on the served vectors. Neighbour queries (``most_similar`` with words, vectors and
``(term, weight)`` tuples, ``most_similar_cosmul``, ``closer_than``) are answered by the
front end over the whole vocabulary with gensim's formulas, and their terms travel in a JSON
body, so a word may hold any character (a comma-joined query string would split ``a,b``).
What the API cannot answer (``topn=None``, ``restrict_vocab``, ``clip_start``/``clip_end``,
an ``indexer``) raises ``NotImplementedError`` instead of an approximation;
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
from urllib.parse import quote

import numpy as np
import orjson

from online.client.errors import LiveVecError
from online.client.protocol import Call, Operation, Reply
from online.client.word2vec_stream import BinaryReader, Snapshot, check_export_format

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
def _ensure_list(value: Any) -> list:
    """gensim's: one key or 1-d vector becomes a list of it, a 2-d array a list of its rows."""
    if value is None:
        return []
    if isinstance(value, str) or (isinstance(value, np.ndarray) and value.ndim == 1):
        return [value]
    if isinstance(value, np.ndarray) and value.ndim == 2:
        return list(value)
    return list(value)


def _vector_item(vector: np.ndarray) -> list[float]:
    return np.asarray(vector, dtype=np.float32).ravel().tolist()


def _term(item: Any, weighted: bool) -> tuple[Any, str | None]:
    """The JSON item of one gensim term, and the word it names (None for a vector)."""
    if isinstance(item, np.ndarray):
        return _vector_item(item), None
    if isinstance(item, tuple) and weighted:        # gensim's (key or vector, weight)
        key, weight = item
        if isinstance(key, np.ndarray):
            return {"vector": _vector_item(key), "weight": float(weight)}, None
        return {"word": _check_key(key, " in vocabulary"), "weight": float(weight)}, key
    return _check_key(item, " in vocabulary"), item


def _weighted(item: Any, weight: float) -> dict:
    if isinstance(item, dict):
        return item
    return {"word": item, "weight": weight} if isinstance(item, str) else {"vector": item, "weight": weight}


def _unknown_key(missing: list[str], asked: list[str]) -> KeyError:
    return KeyError(f"Key '{(missing or asked or ['?'])[0]}' not present in vocabulary")


def _term_query(positive: Any, negative: Any, topn: int, method: str) -> Operation[list]:
    """One POST /v1/similar of gensim's terms; the words it names must match exactly."""
    weighted = method == "add"
    pos = [_term(item, weighted) for item in _ensure_list(positive)]
    neg = [_term(item, weighted) for item in _ensure_list(negative)]
    if not pos and not neg:
        raise ValueError("cannot compute mean with no input")
    if method == "mul" and not pos:
        raise ValueError("cannot compute similarity with no input")
    if not pos:                  # the API wants a positive term: a negative one is one of weight -1
        pos, neg = [(_weighted(item, -1.0), word) for item, word in neg], []
    body = {"positive": [item for item, _ in pos], "negative": [item for item, _ in neg], "k": int(topn),
            "method": method}
    reply = yield Call("POST", "/v1/similar", orjson.dumps(body), accept=_VECTOR)
    asked = [word for _, word in pos + neg]
    if reply.status == 404:
        raise _unknown_key(_unknown(reply), [w for w in asked if w is not None])
    answer = reply.json()
    for word, got in zip(asked, answer["positive"] + answer["negative"]):
        if word is not None and word != got:           # the front end's lower-case fallback: another key
            raise KeyError(f"Key '{word}' not present in vocabulary")
    return _neighbours(answer, int(topn))


def _not_served(**options: Any) -> None:
    given = [name for name, (value, default) in options.items() if value != default]
    if given:
        raise NotImplementedError(f"{', '.join(given)} is not served (the front end searches the whole live "
                                  "vocabulary); use to_keyed_vectors() for it")


def _neighbours(body: Mapping[str, Any], topn: int) -> list[tuple[str, float]]:
    return [(n["word"], float(n["score"])) for n in body["neighbours"][:topn]]


def most_similar(positive: Any = None, negative: Any = None, topn: int | None = 10, clip_start: int = 0,
                 clip_end: int | None = None, restrict_vocab: int | None = None,
                 indexer: Any = None) -> Operation[list]:
    if topn is None:
        raise NotImplementedError("topn=None (every similarity) is not served; use to_keyed_vectors()")
    _not_served(clip_start=(clip_start, 0), clip_end=(clip_end, None), restrict_vocab=(restrict_vocab, None),
                indexer=(indexer, None))
    if isinstance(topn, Integral) and topn < 1:
        return []
    return (yield from _term_query(positive, negative, topn, "add"))


def most_similar_cosmul(positive: Any = None, negative: Any = None, topn: int | None = 10,
                        restrict_vocab: int | None = None) -> Operation[list]:
    if topn is None:
        raise NotImplementedError("topn=None (every similarity) is not served; use to_keyed_vectors()")
    _not_served(restrict_vocab=(restrict_vocab, None))
    if isinstance(topn, Integral) and topn < 1:
        return []
    return (yield from _term_query(positive, negative, topn, "mul"))


def closer_than(key1: str, key2: str) -> Operation[list[str]]:
    """gensim's ``closer_than`` answered by the front end's full scan (GET /v1/closer), in index order."""
    _check_key(key1, " in vocabulary"), _check_key(key2, " in vocabulary")
    query = f"word={quote(key1, safe='')}&than={quote(key2, safe='')}"
    reply = yield Call("GET", "/v1/closer?" + query, accept=_VECTOR)
    if reply.status == 404:
        raise _unknown_key(_unknown(reply), [key1, key2])
    body = reply.json()
    for asked, got in ((key1, body["word"]), (key2, body["than"])):
        if asked != got:
            raise KeyError(f"Key '{asked}' not present in vocabulary")
    return [n["word"] for n in body["words"]]


# ------------------------------------------------------------ vector arithmetic
def _mean(vectors: list[np.ndarray], dim: int) -> np.ndarray:
    """gensim's ``get_mean_vector(pre_normalize=False)``: the plain mean, in float32."""
    mean = np.zeros(dim, np.float32)
    for v in vectors:
        mean += np.float32(1.0) * v
    return mean / len(vectors) if vectors else mean


def n_similarity(ws1: list[str], ws2: list[str]) -> Operation[np.float32]:
    if not (len(ws1) and len(ws2)):
        raise ZeroDivisionError("At least one of the passed list is empty.")
    asked = list(dict.fromkeys(w for w in list(ws1) + list(ws2) if isinstance(w, str) and w))
    replies = yield [_vector_call(w) for w in asked]
    found = {w: v for w, r in zip(asked, replies) if (v := _vector_of(r, w)) is not None}
    if not found:                                  # gensim: two zero means, a similarity of 0
        return np.float32(0.0)
    dim = len(next(iter(found.values())))
    mean1 = _mean([found[w] for w in ws1 if w in found], dim)
    mean2 = _mean([found[w] for w in ws2 if w in found], dim)
    return np.dot(_unit(mean1), _unit(mean2))


def distance(w1: str, w2: str) -> Operation[np.float32]:
    return 1 - (yield from similarity(w1, w2))


def distances(word_or_vector: Any, other_words: Any = ()) -> Operation[np.ndarray]:
    """Cosine distances to ``other_words``; without them, to every word of one snapshot (streamed
    from /v1/export: the whole model, in ``index_to_key`` order, as gensim's). The word's own
    vector comes from /v1/vector, so on a learning model it may be a version older or newer."""
    other_words = list(other_words or ())
    vector = (yield from get_vector(word_or_vector)) if isinstance(word_or_vector, str) \
        else np.asarray(word_or_vector, dtype=np.float32)
    others = (yield from snapshot()).vectors if not other_words else (yield from get_vectors(other_words))
    return 1 - _cosines(vector, others)


def _cosines(vector: np.ndarray, others: np.ndarray) -> np.ndarray:
    """gensim's ``cosine_similarities``."""
    return (others @ vector) / (np.linalg.norm(vector) * np.linalg.norm(others, axis=1))


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
    reply = yield Call("GET", "/v1/export?format=words")     # the words exactly (vocab escapes whitespace)
    check_export_format(reply.headers)
    lines = reply.body.rstrip(b"\n")
    words = [w for w, _ in orjson.loads(b"[" + lines.replace(b"\n", b",") + b"]")] if lines else []
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
