"""What can go wrong talking to a front end, as exceptions a caller can tell apart.

Unknown words are ``KeyError``, as in gensim, so code written against ``KeyedVectors``
keeps its ``except KeyError``. Everything else derives from ``LiveVecError`` and also from
the built-in class a caller would reach for first (``PermissionError`` for a missing or
refused token, ``ConnectionError`` when the front end cannot be reached or stays busy,
``ValueError`` for a request the front end calls invalid, ``TimeoutError`` for an
answer that does not come), so neither style of handler misses them.
"""
from __future__ import annotations

from collections.abc import Mapping

import orjson


class LiveVecError(Exception):
    """An answer the client cannot turn into a result; ``status`` and ``code`` come from the front end."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code


class AuthenticationError(LiveVecError, PermissionError):
    """401: the front end wants ``Authorization: Bearer <token>`` and did not get a token it accepts."""


class ServiceUnavailable(LiveVecError, ConnectionError):
    """No answer after every retry: refused connections, resets, or 502/503/504 (no model yet, overloaded)."""


class RequestTimeout(LiveVecError, TimeoutError):
    """The front end accepted the request but sent no answer within ``timeout``; not retried, since a
    slow answer does not get faster by asking again (a connect that times out is retried)."""


class RequestError(LiveVecError, ValueError):
    """4xx other than 401: the front end refused the request itself (a limit, a malformed argument)."""


class IncompleteExport(ConnectionError):
    """The export stream ended before its header's row count: the connection broke; retried like one."""


def _message(body: bytes) -> tuple[str | None, str]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, body[:200].decode("utf-8", "replace").strip()
    if isinstance(data, Mapping):
        return data.get("error"), str(data.get("message", ""))
    return None, str(data)[:200]


def error_for(url: str, status: int, body: bytes, token_given: bool) -> LiveVecError:
    """The exception for a final answer ``status`` with ``body`` from ``url``."""
    code, message = _message(body)
    if status == 401:
        hint = ("the token given was refused" if token_given
                else "no token was given: pass token=... to the client")
        return AuthenticationError(f"{url}: 401 unauthorized, {hint} ({message})", status, code)
    if status in (502, 503, 504):
        return ServiceUnavailable(f"{url}: {status} {code or ''} after every retry: {message}", status, code)
    if 400 <= status < 500:
        return RequestError(f"{url}: {status} {code or ''}: {message}", status, code)
    return LiveVecError(f"{url}: unexpected answer {status} {code or ''}: {message}", status, code)
