"""Reading a request: query parameters and JSON bodies checked against their limits, and the model ready.

Each check refuses with an ``ApiError`` that names the parameter (``bad_<name>``, or
``missing_parameter``), so a client learns what to fix.
"""
from __future__ import annotations

import asyncio
import re

import orjson
from aiohttp import web

from online.frontend import query_body
from online.frontend.app_keys import HOLDER, SETTINGS
from online.frontend.limits import MAX_ANALOGY_PARAM_LENGTH, MAX_WORD_LENGTH
from online.frontend.responses import ApiError

_DIGITS = re.compile(r"[0-9]{1,9}")
_NUMBER = re.compile(r"-?[0-9]{1,15}(\.[0-9]{1,20})?([eE][-+]?[0-9]{1,3})?")


def param_int(request: web.Request, name: str, default: int, maximum: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    if not _DIGITS.fullmatch(raw) or not 1 <= int(raw) <= maximum:
        raise ApiError(400, f"bad_{name}", f"{name} must be an integer from 1 to {maximum}, got {raw[:40]!r}",
                       parameter=name)
    return int(raw)


def param_number(request: web.Request, name: str, default: float, minimum: float, maximum: float, *,
                 exclusive: bool = False) -> float:
    raw = request.query.get(name)
    if raw is None:
        return default
    value = float(raw) if _NUMBER.fullmatch(raw) else None
    if value is None or not (minimum < value if exclusive else minimum <= value) or not value <= maximum:
        bounds = f"above {minimum:g} and at most {maximum:g}" if exclusive else f"from {minimum:g} to {maximum:g}"
        raise ApiError(400, f"bad_{name}", f"{name} must be a number {bounds}, got {raw[:40]!r}", parameter=name)
    return value


def param_word(value: str | None, name: str) -> str:
    if value is None:
        raise ApiError(400, "missing_parameter", f"the query parameter {name!r} is required", parameter=name)
    if not value:
        raise ApiError(400, f"bad_{name}", f"{name} must not be empty", parameter=name)
    if len(value) > MAX_WORD_LENGTH:
        raise ApiError(400, f"bad_{name}", f"{name} is longer than {MAX_WORD_LENGTH} characters", parameter=name)
    return value


def param_word_list(request: web.Request, name: str, required: bool) -> list[str]:
    raw = request.query.get(name)
    if raw is None or raw == "":
        if required:
            raise ApiError(400, "missing_parameter", f"the query parameter {name!r} is required "
                                                     "(comma-separated words)", parameter=name)
        return []
    if len(raw) > MAX_ANALOGY_PARAM_LENGTH:
        raise ApiError(400, f"bad_{name}", f"{name} is longer than {MAX_ANALOGY_PARAM_LENGTH} characters",
                       parameter=name)
    words = [w.strip() for w in raw.split(",") if w.strip()]
    if required and not words:
        raise ApiError(400, f"bad_{name}", f"{name} must name at least one word", parameter=name)
    return words


async def json_body(request: web.Request) -> dict:
    """The body as a JSON object, within the size and time the settings allow."""
    settings = request.app[SETTINGS]
    if (request.content_length or 0) > settings.max_body_bytes:   # refused before a byte of it is read
        raise ApiError(413, "body_too_large", f"the body may hold at most {settings.max_body_bytes} bytes")
    try:
        async with asyncio.timeout(settings.body_timeout):
            body = await request.read()
    except TimeoutError:
        raise ApiError(408, "body_timeout", f"the body did not arrive within {settings.body_timeout:g} s") from None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "bad_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "bad_body", 'the body must be a JSON object like {"words": ["paris"], "k": 10} or '
                                        '{"positive": ["king", "woman"], "negative": ["man"]}')
    return data


def body_field(parse, *args, **kwargs):
    """``parse(*args, **kwargs)``, one of ``query_body``'s checks, its ``BodyError`` answered as a 400."""
    try:
        return parse(*args, **kwargs)
    except query_body.BodyError as exc:
        raise ApiError(400, exc.code, exc.message, parameter=exc.parameter) from None


def ready_index(request: web.Request):
    """The served snapshot; a 503 before the first model is loaded."""
    holder = request.app[HOLDER]
    if not holder.loaded:
        raise ApiError(503, "not_ready", "no model has been loaded yet; try again shortly")
    return holder.current
