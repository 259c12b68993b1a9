"""What an anonymous client can make the front end do, and the limits that hold it (the threat model
is in README "Security" and docs/operations.md#front-end-security).

The API is read-only: no request changes the model. These guards bound what a request costs:
an optional bearer token on ``/v1/*`` and ``/metrics``, a cap on requests in flight (503 with
``Retry-After``), a cap on open connections (a newcomer beyond it gets a 503 and is closed),
a deadline for the request head and for idle keep-alive connections (slowloris: aiohttp's
keep-alive timer closes a connection whose head is still incomplete), a deadline for bodies
(408) and a size limit for them (413).
"""
from __future__ import annotations

import asyncio
import hmac
import logging

from aiohttp import web

from ps_bridge.metrics import Registry
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.frontend")

OPEN_PATHS = ("/health", "/ready", "/openapi.json", "/", "/favicon.ico")   # and /static/*
UNLIMITED_PATHS = ("/health", "/ready", "/metrics")
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
         b"Connection: close\r\nContent-Length: 71\r\n\r\n"
         b'{"error":"too_many_connections","message":"too many open connections"}\n')
assert len(_BUSY.split(b"\r\n\r\n", 1)[1]) == 71


class Guards:
    """The request-level guards as one aiohttp middleware, and their counters."""

    def __init__(self, registry: Registry, max_concurrent: int, token: str | None, error_response):
        self.max_concurrent, self.in_flight = max_concurrent, 0
        self._token = None if token is None else f"Bearer {token}".encode()
        self._error = error_response
        self.refused = {reason: registry.counter("livevec_frontend_refused_total",
                                                 "requests and connections refused by a limit", reason=reason)
                        for reason in ("unauthorized", "overloaded", "too_many_connections")}
        registry.gauge("livevec_frontend_requests_in_flight", "requests being handled", fn=lambda: self.in_flight)

    def _authorized(self, request: web.Request) -> bool:
        path = request.path
        if self._token is None or path in OPEN_PATHS or path.startswith("/static/"):
            return True
        given = request.headers.get("Authorization", "").encode("utf-8", "replace")
        return hmac.compare_digest(given, self._token)

    @web.middleware
    async def middleware(self, request: web.Request, handler) -> web.StreamResponse:
        if not self._authorized(request):
            self.refused["unauthorized"].inc()
            return self._error(401, "unauthorized", "this API needs 'Authorization: Bearer <token>'",
                               headers={"WWW-Authenticate": 'Bearer realm="livevec"'})
        if request.path in UNLIMITED_PATHS:
            return await handler(request)
        if self.in_flight >= self.max_concurrent:
            self.refused["overloaded"].inc()
            return self._error(503, "overloaded", f"more than {self.max_concurrent} requests in flight; retry",
                               headers={"Retry-After": "1"})
        self.in_flight += 1
        try:
            return await handler(request)
        finally:
            self.in_flight -= 1


class GuardedRunner(web.AppRunner):
    """An AppRunner whose server turns away a connection beyond ``max_connections`` in all, or beyond
    ``per_client`` from one address (so one host cannot starve the others): a 503, then close."""

    def __init__(self, app: web.Application, max_connections: int, per_client: int, refused, **kwargs):
        super().__init__(app, **kwargs)
        self.max_connections, self.per_client, self._refused = max_connections, per_client, refused
        self.by_client: dict[str, int] = {}
        self.admitted = 0

    async def _make_server(self):
        server = await super()._make_server()
        admit, lost = server.connection_made, server.connection_lost
        clients: dict[object, str] = {}

        def connection_made(handler, transport) -> None:
            admit(handler, transport)
            peer = transport.get_extra_info("peername")
            client = peer[0] if isinstance(peer, tuple) else ""
            held = self.by_client.get(client, 0)
            if self.admitted >= self.max_connections or held >= self.per_client:
                self._refused.inc()
                n = int(self._refused.value)
                if n <= 10 or (n & (n - 1)) == 0:
                    log_event(log, "connection_refused", logging.WARNING, reason="too_many_connections",
                              client=client, held=held, open=self.admitted, count=n)
                transport.write(_BUSY)
                transport.pause_reading()
                # closed two loop turns later: after the handler's start task ran once (aiohttp asserts
                # that a handler it starts still has its server)
                loop = asyncio.get_running_loop()
                loop.call_soon(loop.call_soon, transport.close)
                return
            clients[handler] = client
            self.by_client[client] = held + 1
            self.admitted += 1

        def connection_lost(handler, exc) -> None:
            client = clients.pop(handler, None)
            if client is not None:
                self.admitted -= 1
                left = self.by_client[client] - 1
                if left:
                    self.by_client[client] = left
                else:
                    del self.by_client[client]
            lost(handler, exc)

        server.connection_made, server.connection_lost = connection_made, connection_lost
        return server
