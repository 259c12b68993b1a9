"""``/v1/new``, ``/v1/rising``, ``/v1/drift`` and ``/v1/history``: what is new in the served model.

The answers come from the history the front end records itself (``online.frontend.whats_new``),
computed off the event loop; what the history cannot find is a 404.
"""
from __future__ import annotations

import asyncio

from aiohttp import web

from online.frontend.app_keys import SETTINGS, WHATS_NEW
from online.frontend.handlers.params import param_int, param_number, param_word, ready_index
from online.frontend.limits import MAX_CHECKPOINT_LENGTH, MAX_SINCE
from online.frontend.responses import ApiError, json_response
from online.frontend.whats_new import MAX_LIMIT as MAX_HISTORY_LIMIT, RANKINGS, HistoryLookupError


async def new_words(request: web.Request) -> web.Response:
    since = param_number(request, "since", 0.0, 0.0, MAX_SINCE)
    limit = param_int(request, "limit", 20, MAX_HISTORY_LIMIT)
    return await _from_history(request, request.app[WHATS_NEW].new_words, since, limit)


async def rising(request: web.Request) -> web.Response:
    whats_new = request.app[WHATS_NEW]
    window = param_number(request, "window", min(300.0, whats_new.max_window), 0.0, whats_new.max_window,
                          exclusive=True)
    limit = param_int(request, "limit", 20, MAX_HISTORY_LIMIT)
    by = request.query.get("by", "rise")
    if by not in RANKINGS:
        raise ApiError(400, "bad_by", f"by must be one of {', '.join(RANKINGS)}, got {by[:40]!r}", parameter="by")
    return await _from_history(request, whats_new.rising, window, limit, by)


async def drift(request: web.Request) -> web.Response:
    word = param_word(request.query.get("word"), "word")
    k = param_int(request, "k", 10, request.app[SETTINGS].max_k)
    checkpoint = request.query.get("checkpoint", "oldest")
    if not 1 <= len(checkpoint) <= MAX_CHECKPOINT_LENGTH:
        raise ApiError(400, "bad_checkpoint", f"checkpoint must be 'oldest', 'previous' or an id (1 to "
                                              f"{MAX_CHECKPOINT_LENGTH} characters)", parameter="checkpoint")
    return await _from_history(request, request.app[WHATS_NEW].drift, word, k, checkpoint)


async def history(request: web.Request) -> web.Response:
    return json_response(await asyncio.to_thread(request.app[WHATS_NEW].history))


async def _from_history(request: web.Request, method, *args) -> web.Response:
    """Call a ``WhatsNew`` answer off the event loop; what it cannot find is a 404."""
    ready_index(request)
    try:
        return json_response(await asyncio.to_thread(method, *args))
    except HistoryLookupError as exc:
        raise ApiError(503 if exc.code == "not_ready" else 404, exc.code, exc.message, **exc.extra) from None
