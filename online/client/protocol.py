"""The exchange between an operation and a transport: calls, replies and when to ask again.

Why the operations never touch a socket: the blocking client and the asyncio one must
give the same answers to the last detail (which word raises ``KeyError``, how a
lower-cased match is refused, how ``doesnt_match`` ranks), so every operation
(``online.client.operations``) is a generator that yields the ``Call`` objects it needs and
is sent the ``Reply`` of each. ``LiveKeyedVectors`` drives them with ``http.client``,
``AsyncLiveKeyedVectors`` with aiohttp, and the two hold no logic of their own beyond
moving bytes and the retry loop below, which they share.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

import orjson

T = TypeVar("T")

# A proxy in front of the front end answers 502/504 while the front end restarts; the front
# end itself answers 503 before its first model and when too many requests are in flight.
RETRY_STATUSES = frozenset({502, 503, 504})
USER_AGENT = "livevec-client/0.1"


class Sink(Protocol):
    """Where a streamed 200 body goes, a chunk at a time; ``finish`` gives the reply's ``body``."""

    def feed(self, data: bytes) -> None: ...

    def finish(self) -> Any: ...


@dataclass(frozen=True)
class Call:
    method: str
    path: str                                  # below the base URL, percent-encoded, with its query
    body: bytes | None = None
    accept: tuple[int, ...] = (200,)           # statuses handed to the operation; the rest are raised
    sink: Callable[[Mapping[str, str]], Sink] | None = None   # a fresh sink per attempt, from the headers


@dataclass
class Reply:
    status: int
    headers: Mapping[str, str]                 # names in lower case
    body: Any                                  # bytes, or what the sink finished with

    def json(self) -> Any:
        return orjson.loads(self.body)


Operation = Generator["Call | list[Call]", "Reply | list[Reply]", T]


@dataclass(frozen=True)
class Endpoint:
    """The parts of the base URL a transport needs; a path prefix (a proxy's) is kept."""

    url: str
    scheme: str
    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, url: str) -> "Endpoint":
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the front end's URL must be http(s)://host[:port][/prefix], got {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(url.rstrip("/"), parts.scheme, parts.hostname, port, parts.path.rstrip("/"))


def request_headers(token: str | None, body: bytes | None) -> dict[str, str]:
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json, */*"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if body is not None:
        headers["Content-Type"] = "application/json"
    return headers


@dataclass(frozen=True)
class RetryPolicy:
    """Every call is safe to repeat (the API is read-only), so connection errors and busy answers
    are retried ``retries`` times with exponential backoff."""

    retries: int = 3
    backoff: float = 0.1
    max_backoff: float = 5.0

    def __post_init__(self):
        if self.retries < 0 or self.backoff < 0 or self.max_backoff < 0:
            raise ValueError("retries, backoff and max_backoff must be >= 0")

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        """Seconds to wait before retry ``attempt`` (0-based): the server's Retry-After when it gives
        one, else the backoff, jittered so that clients that failed together do not return together;
        never more than ``max_backoff``."""
        wait = min(self.max_backoff, self.backoff * 2 ** attempt) * (0.5 + random.random() / 2)
        try:
            hinted = float(retry_after) if retry_after else 0.0
        except ValueError:                      # an HTTP date: not worth parsing here
            hinted = 0.0
        return min(self.max_backoff, max(wait, hinted))
