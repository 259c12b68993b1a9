"""``/v1/similar``, ``/v1/analogy`` and ``/v1/closer``: neighbour queries, answered by the query engine.

Words come in the query string (one word, or comma-separated lists) or in a JSON body (any
character, vectors and weights: ``query_body``). The answer names the model version it comes
from and how it was searched (``search``: exact or ivf).
"""
from __future__ import annotations

from typing import Any

from aiohttp import web

from online.frontend import query_body, vector_queries
from online.frontend.app_keys import ENGINE, SETTINGS
from online.frontend.handlers.params import (body_field, json_body, param_int, param_word, param_word_list,
                                             ready_index)
from online.frontend.limits import MAX_WORD_LENGTH
from online.frontend.responses import ApiError, json_response


async def similar_get(request: web.Request) -> web.Response:
    word = param_word(request.query.get("word"), "word")
    k = param_int(request, "k", 10, request.app[SETTINGS].max_k)
    ready_index(request)
    result = _answered(await request.app[ENGINE].query([word], [], k))
    return json_response({"word": result.resolved[0], "version": result.version, "k": k,
                          "search": result.search, "neighbours": _neighbours(result)})


async def similar_post(request: web.Request) -> web.Response:
    data = await json_body(request)
    if "words" not in data and {"positive", "negative", "vector"} & set(data):   # a body with "words" is a batch
        return await _term_query(request, data)
    settings = request.app[SETTINGS]
    words = data.get("words")
    if not isinstance(words, list) or not words:
        raise ApiError(400, "bad_words", '"words" must be a non-empty list of strings (or query with "positive", '
                                         '"negative" or "vector")', parameter="words")
    if len(words) > settings.max_batch_words:
        raise ApiError(400, "bad_words", f'"words" may hold at most {settings.max_batch_words} words, '
                                         f"got {len(words)}", parameter="words")
    for w in words:
        if not isinstance(w, str) or not w or len(w) > MAX_WORD_LENGTH:
            raise ApiError(400, "bad_words", f'every word must be a string of 1 to {MAX_WORD_LENGTH} '
                                             f"characters, got {str(w)[:40]!r}", parameter="words")
    k = body_field(query_body.parse_k, data, settings.max_k)
    ready_index(request)
    results = await request.app[ENGINE].query_many(words, k)
    out = []
    for word, result in zip(words, results):
        if result.unknown:
            out.append({"word": word, "version": result.version, "error": "unknown_word",
                        "message": "not in the vocabulary"})
        else:
            out.append({"word": result.resolved[0], "version": result.version, "search": result.search,
                        "neighbours": _neighbours(result)})
    return json_response({"version": results[0].version, "k": k, "results": out})


async def analogy(request: web.Request) -> web.Response:
    positive = param_word_list(request, "positive", required=True)
    negative = param_word_list(request, "negative", required=False)
    k = param_int(request, "k", 10, request.app[SETTINGS].max_k)
    ready_index(request)
    result = _answered(await request.app[ENGINE].query(positive, negative, k))
    return json_response({"positive": result.resolved[:len(positive)], "negative": result.resolved[len(positive):],
                          "version": result.version, "k": k, "search": result.search,
                          "neighbours": _neighbours(result)})


async def analogy_post(request: web.Request) -> web.Response:
    return await _term_query(request, await json_body(request))


async def closer(request: web.Request) -> web.Response:
    word = param_word(request.query.get("word"), "word")
    than = param_word(request.query.get("than"), "than")
    ready_index(request)
    terms = [vector_queries.Term(word, 1.0), vector_queries.Term(than, 1.0)]
    result = _answered(await request.app[ENGINE].query_terms(terms, 1, "closer"))
    return json_response({"word": result.resolved[0], "than": result.resolved[1], "version": result.version,
                          "count": len(result.neighbours), "words": _neighbours(result)})


async def _term_query(request: web.Request, data: dict) -> web.Response:
    """A body of words and vectors (``positive``, ``negative``, ``vector``), as POST /v1/analogy answers it."""
    query = body_field(query_body.parse_terms, data, request.app[SETTINGS].max_k, MAX_WORD_LENGTH)
    ready_index(request)
    result = _answered(await request.app[ENGINE].query_terms(query.terms, query.k, query.kind))
    n = query.n_positive
    return json_response({"positive": result.resolved[:n], "negative": result.resolved[n:],
                          "method": query.kind, "version": result.version, "k": query.k, "search": result.search,
                          "neighbours": _neighbours(result)})


def _answered(result):
    """The result of an engine query, or the 404/400 it deserves."""
    if result.unknown:
        words = ", ".join(repr(w) for w in result.unknown[:10])
        raise ApiError(404, "unknown_word", f"not in the vocabulary (model version {result.version}): {words}",
                       unknown=result.unknown)
    if result.rejected is not None:
        raise ApiError(400, result.rejected.code, str(result.rejected))
    return result


def _neighbours(result) -> list[dict[str, Any]]:
    return [{"word": n.word, "score": n.score} for n in result.neighbours]
