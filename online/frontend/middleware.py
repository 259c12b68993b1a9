"""Every answer's last step: errors turned into JSON bodies, and each request counted and timed.

Every bad input raises ``ApiError`` (a 4xx with a JSON body), a shed query ``Overloaded`` (503 with
Retry-After), aiohttp's own refusals (404, 405, 413) keep their status with a JSON body, and anything
unexpected becomes a logged JSON 500.
"""
from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from online.frontend.app_keys import HTTP_METRICS
from online.frontend.query_engine import Overloaded
from online.frontend.responses import ApiError, error_response
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.frontend")


def _route_name(request: web.Request) -> str:
    route = request.match_info.route
    resource = getattr(route, "resource", None)
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    started = time.perf_counter()
    try:
        response = await handler(request)
    except ApiError as exc:
        response = error_response(exc.status, exc.code, exc.message, **exc.extra)
    except Overloaded as exc:                 # load shedding (query_engine): fast 503s instead of a queue
        response = error_response(503, "overloaded", str(exc), headers={"Retry-After": "1"}, reason=exc.reason)
    except web.HTTPException as exc:          # routing (404/405), body too large (413), ...
        if exc.status < 400:
            raise
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        code = exc.reason.lower().replace(" ", "_") if exc.reason else "http_error"
        response = error_response(exc.status, code, exc.text or exc.reason, headers=headers)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        request.app[HTTP_METRICS].errors_500.inc()
        log.exception("unhandled error in %s %s", request.method, request.path)
        log_event(log, "internal_error", logging.ERROR, method=request.method, path=request.path, error=repr(exc))
        response = error_response(500, "internal_error", "the server failed to answer; this is a bug and was logged")
    if response.status in (408, 413):   # the rest of that body is not worth waiting for
        response.force_close()
    request.app[HTTP_METRICS].observe(_route_name(request), request.method, response.status,
                                      time.perf_counter() - started)
    return response
