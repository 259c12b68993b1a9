"""``/openapi.json`` and ``/``: the API's description and the live page."""
from __future__ import annotations

from pathlib import Path

import orjson
from aiohttp import web

from online.frontend.app_keys import HOLDER, OPENAPI, SETTINGS
from online.frontend.openapi import build_openapi

STATIC_DIR = Path(__file__).parent.parent / "static"


async def openapi(request: web.Request) -> web.Response:
    """The document for the served model's dimension (a query vector must have it), built once per dimension."""
    holder, documents = request.app[HOLDER], request.app[OPENAPI]
    dim = holder.current.dim if holder.loaded else None
    if dim not in documents:
        documents[dim] = orjson.dumps(build_openapi(request.app[SETTINGS], dim))
    return web.Response(body=documents[dim], content_type="application/json")


async def page(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})
