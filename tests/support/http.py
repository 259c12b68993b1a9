"""The tests' one HTTP client: ``get(url)`` answers with status, body and time, and never raises for a status.

A test of a service that restarts, refuses or sheds load asks the same questions every time: what status came
back (0 when no HTTP answer came at all: refused, reset, timed out, not HTTP), what body, after how long. The
JSON and text of a 2xx answer are one call away, and that call raises ``NoAnswer`` (an ``OSError``, as
``urllib``'s errors are) for anything else.
"""
from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

_REQUIRED = object()


class NoAnswer(OSError):
    """A 2xx answer was required and another came, or none."""


@dataclass(frozen=True)
class Answer:
    url: str
    status: int          # the HTTP status; 0: no HTTP answer came (``error`` says why)
    body: bytes
    seconds: float
    error: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def _required(self) -> None:
        if not self.ok:
            raise NoAnswer(f"GET {self.url}: " + (f"{self.status} {self.body[:300]!r}" if self.status
                                                  else self.error))

    def json(self, default: Any = _REQUIRED) -> Any:
        """The body of a 2xx answer, parsed; for any other answer ``default``, or ``NoAnswer`` without one."""
        if not self.ok and default is not _REQUIRED:
            return default
        self._required()
        return json.loads(self.body)

    def text(self) -> str:
        """The body of a 2xx answer as text; ``NoAnswer`` for any other."""
        self._required()
        return self.body.decode()


class _Https(http.client.HTTPSConnection):
    """TLS to the URL's address, the certificate checked against ``tls_name`` (a test's certificate names
    ``localhost``, the URL the address the server bound)."""

    def __init__(self, *args, tls_name: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._tls_name = tls_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self._tls_name or self.host)


def get(url: str, *, headers: dict[str, str] | None = None, timeout: float = 5.0,
        context: ssl.SSLContext | None = None, tls_name: str | None = None, source: str | None = None) -> Answer:
    """GET ``url`` (``https``: with ``context``, the certificate checked against ``tls_name`` or the URL's host),
    from the local address ``source`` when given (a server that counts clients by address sees another client).
    A certificate the client does not trust raises ``ssl.SSLCertVerificationError``: that is the caller's
    mistake, not the server's answer."""
    parts = urllib.parse.urlsplit(url)
    kind = _Https if parts.scheme == "https" else http.client.HTTPConnection
    extra = {"context": context, "tls_name": tls_name} if parts.scheme == "https" else {}
    conn = kind(parts.hostname, parts.port, timeout=timeout, source_address=(source, 0) if source else None,
                **extra)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    started = time.monotonic()
    try:
        conn.request("GET", path, headers={"Connection": "close", **(headers or {})})
        resp = conn.getresponse()
        return Answer(url, resp.status, resp.read(), time.monotonic() - started)
    except ssl.SSLCertVerificationError:
        raise
    except (OSError, http.client.HTTPException) as exc:
        return Answer(url, 0, b"", time.monotonic() - started, f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()
