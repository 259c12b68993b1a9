"""The front end's JSON answers: a body, and the error a handler raises for a client's mistake."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web


class ApiError(Exception):
    """A client error: status, machine-readable code, message and extra fields for the body."""

    def __init__(self, status: int, code: str, message: str, **extra: Any):
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra


def json_response(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY), status=status,
                        content_type="application/json", headers=headers)


def error_response(status: int, code: str, message: str, headers: Mapping[str, str] | None = None,
                   **extra: Any) -> web.Response:
    return json_response({"error": code, "message": message, **extra}, status, headers)
