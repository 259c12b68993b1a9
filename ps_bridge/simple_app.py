"""SimpleApp: small head/body commands between nodes (ps-lite ``simple_app.h``).

For control operations next to the KV traffic: ``head`` is the command, ``body`` its payload.
A request goes to one node or a group; :meth:`SimpleApp.wait` returns all their responses.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from ps_bridge.customer import Customer
from ps_bridge.message import SERVER_GROUP, Message, Meta
from ps_bridge.postoffice import Postoffice

log = logging.getLogger("ps_bridge.simple_app")


@dataclass(slots=True)
class SimpleData:
    head: int
    body: bytes
    sender: int
    timestamp: int
    customer_id: int


class SendError(ConnectionError):
    """A request could not be handed to the transport (unknown node id or a full queue)."""


class _SimpleRequest:
    __slots__ = ("waiting", "responses")

    def __init__(self, waiting: set[int]):
        self.waiting = waiting
        self.responses: list[SimpleData] = []


def echo_handle(req: SimpleData, app: "SimpleApp") -> None:
    """ps-lite's default SimpleApp request handle: an empty response with the same head."""
    app.response(req)


class SimpleApp:
    """``SimpleApp(postoffice, app_id)``; on a worker the customer id defaults to 0, on servers
    and the scheduler to ``app_id`` (ps-lite routes their incoming messages by app id)."""

    def __init__(self, postoffice: Postoffice, app_id: int = 0, customer_id: int | None = None):
        if customer_id is None:
            customer_id = 0 if postoffice.is_worker else app_id
        self.po = postoffice
        self.app_id = app_id
        self.customer_id = customer_id
        self._simple_request_handle: Callable[[SimpleData, SimpleApp], None] = echo_handle
        self._simple_response_handle: Callable[[SimpleData, SimpleApp], None] | None = None
        self.customer = Customer(app_id, customer_id, self._process)
        postoffice.add_customer(self.customer)

    def request(self, head: int, body: bytes = b"", recv_id: int = SERVER_GROUP) -> int:
        """Send ``head``/``body`` to node ``recv_id`` or every node of group ``recv_id``; returns a timestamp."""
        ids = list(dict.fromkeys(self.po.group_ids(recv_id)))
        ts = self.customer.new_request(len(ids), _SimpleRequest(set(ids)))
        for recver in ids:
            sent = self.po.van.send(Message(Meta(head=head, body=bytes(body), request=True, simple_app=True,
                                                 app_id=self.app_id, customer_id=self.customer_id, timestamp=ts,
                                                 recver=recver)))
            if sent < 0:
                self.customer.fail(ts, SendError(f"cannot send to node {recver}"))
        return ts

    def response(self, req: SimpleData, body: bytes = b"") -> None:
        """Answer a request (from a request handle, possibly later and from another thread)."""
        self.po.van.send(Message(Meta(head=req.head, body=bytes(body), request=False, simple_app=True,
                                      app_id=self.app_id, customer_id=req.customer_id, timestamp=req.timestamp,
                                      recver=req.sender)), block=False)

    def wait(self, ts: int, timeout: float | None = None):
        """Block until request ``ts`` completed; returns its result (for SimpleApp requests: the
        list of :class:`SimpleData` responses). Raises ``RequestTimeout`` after ``timeout`` s."""
        return self.customer.wait(ts, timeout)

    async def wait_async(self, ts: int, timeout: float | None = None):
        """Awaitable :meth:`wait` for asyncio code."""
        return await self.customer.wait_async(ts, timeout)

    def set_simple_request_handle(self, handle: Callable[[SimpleData, "SimpleApp"], None]) -> None:
        """``handle(request, app)`` runs on the receive thread and must call ``app.response`` (now or later)."""
        self._simple_request_handle = handle

    def set_simple_response_handle(self, handle: Callable[[SimpleData, "SimpleApp"], None]) -> None:
        self._simple_response_handle = handle

    # ps-lite's names, on SimpleApp itself (KVServer/KVWorker use set_request_handle for KV).
    set_request_handle = set_simple_request_handle
    set_response_handle = set_simple_response_handle

    def close(self) -> None:
        self.po.remove_customer(self.customer)

    def _process(self, msg: Message) -> None:
        if msg.meta.simple_app:
            self._process_simple(msg)
        else:
            self._process_kv(msg)

    def _process_kv(self, msg: Message) -> None:
        self.po.van.reject("kv_message_to_simple_app", msg.meta.sender)

    def _process_simple(self, msg: Message) -> None:
        m = msg.meta
        data = SimpleData(m.head, m.body, m.sender, m.timestamp, m.customer_id)
        if m.request:
            try:
                self._simple_request_handle(data, self)
            except Exception as exc:
                self.po.van.reject("handle_error", m.sender, f"{type(exc).__name__}: {exc}")
                log.exception("SimpleApp request handle failed")
            return
        req = self.customer.pending(m.timestamp)
        state = req.state if req is not None else None
        if not isinstance(state, _SimpleRequest) or m.sender not in state.waiting:
            self.po.van.reject("unexpected_response", m.sender, f"ts={m.timestamp}")
            return
        state.waiting.discard(m.sender)
        state.responses.append(data)
        if self._simple_response_handle is not None:
            try:
                self._simple_response_handle(data, self)
            except Exception:
                log.exception("SimpleApp response handle failed")
        self.customer.add_response(req, state.responses)
