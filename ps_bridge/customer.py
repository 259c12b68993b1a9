"""Customer: one app instance's mailbox and request tracker (ps-lite ``customer.h``).

Requests get timestamps from a per-customer counter; each records how many responses
it expects. Responses are matched by the echoed timestamp. Waiting is blocking
(:meth:`Customer.wait`), asynchronous (:meth:`Customer.wait_async`, for asyncio callers)
or by callback.

Messages are handled on the Van's receive thread (ps-lite adds a customer thread; skipping
it saves a wake-up per message): handlers must not block waiting for other ps messages.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from ps_bridge.message import K_EMPTY, Message


class RequestTimeout(TimeoutError):
    """The responses of a request did not all arrive in time (a peer died or dropped it)."""


class _Request:
    __slots__ = ("ts", "expected", "received", "state", "result", "done", "_lock", "_callbacks")

    def __init__(self, ts: int, expected: int, state: Any):
        self.ts = ts
        self.expected = expected
        self.received = 0
        self.state = state
        self.result: Any = None
        self.done = False
        self._lock = threading.Lock()
        self._lock.acquire()  # released once, when the last response arrives
        self._callbacks: list[Callable[[Any], None]] | None = None


class Customer:
    def __init__(self, app_id: int, customer_id: int, recv_handle: Callable[[Message], None]):
        self.app_id = app_id
        self.customer_id = customer_id
        self.recv_handle = recv_handle
        self._next_ts = 0
        self._tracker: dict[int, _Request] = {}
        self._mu = threading.Lock()
        # the Van's defer: wake waiters when the receive thread blocks again (no GIL wait; ~40 us/RTT)
        self.defer: Callable[[Callable[[], None]], None] | None = None

    def new_request(self, expected: int, state: Any = None) -> int:
        """Register a request that waits for ``expected`` responses; returns its timestamp."""
        with self._mu:
            ts = self._next_ts
            # int32 on the wire and kEmpty is reserved: wrap instead of overflowing after 2^31.
            self._next_ts = ts + 1 if ts + 1 < K_EMPTY else 0
            req = _Request(ts, expected, state)
            self._tracker[ts] = req
        if expected <= 0:
            self._finish(req, None)
        return ts

    def pending(self, ts: int) -> _Request | None:
        req = self._tracker.get(ts)
        return req if req is not None and not req.done else None

    def add_response(self, req: _Request, result: Any = None, count: int = 1) -> bool:
        """Record ``count`` responses for ``req`` (from :meth:`pending`); on the last one the request
        completes with ``result`` (a callable is called to build it). False if it already completed."""
        if req.done:
            return False
        req.received += count
        if req.received >= req.expected:
            self._finish(req, result() if callable(result) else result)
        return True

    def _finish(self, req: _Request, result: Any) -> None:
        with self._mu:
            if req.done:  # a last response racing fail() from another thread: the first one wins
                return
            req.result = result
            req.done = True
            callbacks, req._callbacks = req._callbacks, None
        if self.defer is not None:
            self.defer(req._lock.release)
        else:
            req._lock.release()
        if callbacks:
            for cb in callbacks:
                cb(result)

    def fail(self, ts: int, error: BaseException) -> None:
        """Complete ``ts`` with an exception that ``wait`` re-raises."""
        req = self._tracker.get(ts)
        if req is not None and not req.done:
            self._finish(req, _Failure(error))

    def fail_all(self, error: BaseException) -> int:
        """Complete every outstanding request with ``error``; returns how many. For a caller that
        abandons its work in flight (e.g. a rollback to a checkpoint) instead of waiting for timeouts."""
        with self._mu:
            pending = [ts for ts, r in self._tracker.items() if not r.done]
        for ts in pending:
            self.fail(ts, error)
        return len(pending)

    def wait(self, ts: int, timeout: float | None = None) -> Any:
        """Block until ``ts`` completes; returns its result and forgets the request. On timeout
        the request is abandoned (responses still in flight are dropped) and RequestTimeout raised."""
        req = self._tracker.get(ts)
        if req is None:
            raise KeyError(f"unknown or already collected request timestamp {ts}")
        if not req._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            with self._mu:  # abandoned: late responses are dropped as unknown
                self._tracker.pop(ts, None)
            raise RequestTimeout(f"request {ts} (app {self.app_id}) got {req.received}/{req.expected} "
                                 f"responses in {timeout}s")
        with self._mu:
            self._tracker.pop(ts, None)
        return _unwrap(req.result)

    async def wait_async(self, ts: int, timeout: float | None = None) -> Any:
        """The awaitable variant of :meth:`wait`, for asyncio callers (never blocks the loop)."""
        req = self._tracker.get(ts)
        if req is None:
            raise KeyError(f"unknown or already collected request timestamp {ts}")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def _deliver(result: Any) -> None:
            loop.call_soon_threadsafe(_resolve, fut, result)

        self._on_done(req, _deliver)
        try:
            if timeout is None:
                result = await fut
            else:
                result = await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            with self._mu:
                self._tracker.pop(ts, None)
            raise RequestTimeout(f"request {ts} (app {self.app_id}) got {req.received}/{req.expected} "
                                 f"responses in {timeout}s") from None
        with self._mu:
            self._tracker.pop(ts, None)
        return _unwrap(result)

    def on_complete(self, ts: int, callback: Callable[[Any], None]) -> None:
        """Call ``callback(result)`` when ``ts`` completes (on the receive thread), then forget it."""
        req = self._tracker.get(ts)
        if req is None:
            raise KeyError(f"unknown request timestamp {ts}")

        def _then(result: Any) -> None:
            with self._mu:
                self._tracker.pop(ts, None)
            callback(_unwrap_soft(result))

        self._on_done(req, _then)

    def _on_done(self, req: _Request, cb: Callable[[Any], None]) -> None:
        with self._mu:
            if not req.done:
                if req._callbacks is None:
                    req._callbacks = []
                req._callbacks.append(cb)
                return
        cb(req.result)


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


def _unwrap(result: Any) -> Any:
    if isinstance(result, _Failure):
        raise result.error
    return result


def _unwrap_soft(result: Any) -> Any:
    return result.error if isinstance(result, _Failure) else result


def _resolve(fut: asyncio.Future, result: Any) -> None:
    if not fut.done():
        fut.set_result(result)
