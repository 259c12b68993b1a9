"""``/v1/vector/{word}`` and ``/v1/vocab``: a word's vector, and the words that start with a prefix."""
from __future__ import annotations

from aiohttp import web

from online.frontend.handlers.params import param_int, param_word, ready_index
from online.frontend.limits import MAX_PREFIX_LENGTH, MAX_VOCAB_LIMIT
from online.frontend.responses import ApiError, json_response


async def vector(request: web.Request) -> web.Response:
    word = param_word(request.match_info.get("word"), "word")
    index = ready_index(request)
    row = index.row(word)
    if row < 0:
        raise ApiError(404, "unknown_word", f"not in the vocabulary (model version {index.version}): {word!r}",
                       unknown=[word])
    return json_response({"word": index.words[row], "key": str(int(index.keys[row])), "count": int(index.counts[row]),
                          "dim": index.dim, "version": index.version, "vector": index.vector(row)})


async def vocab(request: web.Request) -> web.Response:
    prefix = request.query.get("prefix", "")
    if len(prefix) > MAX_PREFIX_LENGTH:
        raise ApiError(400, "bad_prefix", f"prefix is longer than {MAX_PREFIX_LENGTH} characters",
                       parameter="prefix")
    limit = param_int(request, "limit", 20, MAX_VOCAB_LIMIT)
    index = ready_index(request)
    words = [{"word": w, "count": c} for w, c in index.prefix(prefix, limit)]
    return json_response({"version": index.version, "prefix": prefix, "total": index.prefix_total(prefix),
                          "words": words})
