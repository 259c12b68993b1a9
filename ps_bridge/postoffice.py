"""The Postoffice: who is in the cluster (ps-lite ``postoffice.h`` plus the control-message
half of ``van.cc`` that every node runs).

It owns the Van, runs the start-up handshake, learns the node list, waits at barriers,
heartbeats, answers group and key-range questions (ps-lite's even split of [0, 2^64-1)) and
routes data messages to the apps' Customers. The scheduler's half is the SchedulerBook; with
``elastic_workers`` (extension) workers may join, leave (:meth:`Postoffice.leave`) or die.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable

from ps_bridge.metrics import Registry
from ps_bridge.structured_logging import log_event
from ps_bridge.customer import Customer
from ps_bridge.message import (ALL_GROUP, K_EMPTY, SCHEDULER_ID, SERVER_GROUP, WORKER_GROUP, Cmd, Control, Message,
                               Meta, NO_CONTROL, Node, Role, id_to_rank, server_rank_to_id, worker_rank_to_id)
from ps_bridge.scheduler_book import SchedulerBook
from ps_bridge.settings import NodeSettings
from ps_bridge.van import Van

log = logging.getLogger("ps_bridge.postoffice")

K_MAX_KEY = 2**64 - 1
EARLY_MESSAGE_SECONDS = 5.0  # ps-lite waits this long for an app that does not exist yet
EARLY_MESSAGE_LIMIT = 10_000


class RendezvousTimeout(TimeoutError):
    """The scheduler did not complete the start-up handshake (or a barrier) in time."""


def server_key_ranges(num_servers: int) -> list[tuple[int, int]]:
    """ps-lite's ``GetServerKeyRanges``: rank i owns [floor(kMaxKey/N)*i, floor(kMaxKey/N)*(i+1))."""
    size = K_MAX_KEY // num_servers
    return [(size * i, size * (i + 1)) for i in range(num_servers)]


class Postoffice:
    def __init__(self, settings: NodeSettings, registry: Registry | None = None):
        self.settings = settings
        self.van = Van(settings, self._on_message, registry)
        self.registry = self.van.registry
        self.role = settings.role
        self.num_servers = settings.num_server
        self.num_workers = settings.num_worker
        self.elastic = settings.elastic_workers
        self.is_recovery = False
        self.ready_event = threading.Event()
        self._nodes: dict[int, Node] = {}
        self._nodes_lock = threading.Lock()
        self._customers: dict[tuple[int, int], Customer] = {}
        self._route_lock = threading.RLock()
        # ps-lite routes a worker's messages by (app, customer), other roles' by app alone
        self._route_by_customer = settings.role == "worker"
        self._early: list[tuple[float, tuple[int, int], Message]] = []
        self._barrier_cv = threading.Condition()
        self._barrier_done: dict[tuple[int, int], bool] = {}
        self._left = threading.Event()
        self._started = False
        self._stopped = False
        self._bound: Node | None = None
        self._key_ranges = server_key_ranges(self.num_servers)
        self._book = SchedulerBook(self) if settings.is_scheduler else None
        self.scheduler_last_seen = 0.0
        # (Scheduler) listener(event, node_id, role): "dead", "alive_again", "recovered", "adopted", "worker_*";
        # called with the book locked, on the receive or monitor thread: only record the event.
        self.membership_listeners: list[Callable[[str, int, int], None]] = []
        # (Server, worker) set when the scheduler gave this node's id to another process (this one was
        # declared dead, e.g. while cut off, and replaced): it is no longer in the cluster. Listeners
        # (called once, on the receive thread, with the new owner) decide what to do, e.g. stop the process.
        self.replaced_event = threading.Event()
        self.replaced_listeners: list[Callable[[Node], None]] = []

    @property
    def my_node(self) -> Node:
        return self.van.my_node

    @property
    def node_id(self) -> int:
        return self.van.my_node.id

    @property
    def rank(self) -> int:
        return id_to_rank(self.node_id)

    @property
    def is_scheduler(self) -> bool:
        return self.role == "scheduler"

    @property
    def is_worker(self) -> bool:
        return self.role == "worker"

    def ready(self) -> bool:
        return self.ready_event.is_set() and not self._stopped

    def notify_membership(self, event: str, node_id: int, role: int) -> None:
        for listener in list(self.membership_listeners):
            try:
                listener(event, node_id, role)
            except Exception:  # a listener must never break the scheduler
                log.exception("membership listener failed")

    def server_key_ranges(self) -> list[tuple[int, int]]:
        return self._key_ranges

    def server_ids(self) -> list[int]:
        return [server_rank_to_id(r) for r in range(self.num_servers)]

    def worker_ids(self) -> list[int]:
        """Workers of the cluster: the configured ones, or (elastic) the live ones."""
        if self._book is not None:
            return self._book.worker_ids()
        if self.elastic:
            with self._nodes_lock:
                return sorted(i for i, n in self._nodes.items() if n.role == Role.WORKER)
        return [worker_rank_to_id(r) for r in range(self.num_workers)]

    def group_ids(self, group: int) -> list[int]:
        """Node ids of a group id (a bit mask: 1 scheduler, 2 servers, 4 workers) or of one node."""
        if group >= 8:
            return [group]
        ids: list[int] = []
        if group & SCHEDULER_ID:
            ids.append(SCHEDULER_ID)
        if group & SERVER_GROUP:
            ids.extend(self.server_ids())
        if group & WORKER_GROUP:
            ids.extend(self.worker_ids())
        return ids

    def dead_node_ids(self) -> set[int]:
        """(Scheduler) ids declared dead (silent for longer than PS_HEARTBEAT_TIMEOUT) and not back or
        replaced since; elsewhere empty."""
        if self._book is None:
            return set()
        with self._book.lock:
            return set(self._book.reported_dead)

    def nodes(self) -> dict[int, Node]:
        """The nodes this process knows (for the scheduler: the whole live cluster)."""
        if self._book is not None:
            return self._book.snapshot()
        with self._nodes_lock:
            return dict(self._nodes)

    def add_customer(self, customer: Customer) -> None:
        key = (customer.app_id, customer.customer_id)
        with self._route_lock:
            if key in self._customers:
                raise ValueError(f"app {customer.app_id} customer {customer.customer_id} already exists")
            self._customers[key] = customer
            customer.defer = self.van.defer
            early = [m for (_, k, m) in self._early if k == key]
            if early:
                self._early = [e for e in self._early if e[1] != key]
                for msg in early:
                    customer.recv_handle(msg)
            with self._barrier_cv:
                self._barrier_done.setdefault((customer.app_id, customer.customer_id), True)

    def remove_customer(self, customer: Customer) -> None:
        with self._route_lock:
            self._customers.pop((customer.app_id, customer.customer_id), None)

    def bind(self) -> Node:
        """Bind the receive socket now (start() does it otherwise); returns this node's address,
        e.g. to learn the port a scheduler with DMLC_PS_ROOT_PORT=0 got before starting others."""
        if self._bound is None:
            self._bound = self.van.bind()
        return self._bound

    def start(self, customer_id: int = 0, do_barrier: bool = True, timeout: float | None = None) -> None:
        """ps::Start (or ps::StartAsync with ``do_barrier=False``): bind, register with the
        scheduler, learn the node list, and (unless recovering) wait at the start barrier."""
        if self._started:
            raise RuntimeError("Postoffice.start() called twice")
        self._started = True
        van = self.van
        self.bind()
        van.start_receiving()
        if self._book is not None:
            van.connect(van.my_node)  # the scheduler's own ps1 DEALER: self barrier requests
            self._book.start()
        else:
            van.connect_scheduler_anonymously()
            self._send_add_node(customer_id)
            log_event(log, "registering", scheduler=f"{self.settings.root_uri}:{self.settings.root_port}",
                      advertised=f"{van.my_node.hostname}:{van.my_node.port}", role=self.role)
        if not self._await_node_list(timeout, customer_id):
            raise RendezvousTimeout(
                f"no node list from the scheduler at {self.settings.root_uri}:{self.settings.root_port} "
                f"within {timeout}s (check DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT and DMLC_NUM_*)")
        if self._book is None:
            van.start_heartbeat(self.settings.heartbeat_interval)
        log_event(log, "node_ready", role=self.role, id=self.node_id, rank=self.rank,
                  host=self.my_node.hostname, port=self.my_node.port, recovery=self.is_recovery)
        if do_barrier and not self.is_recovery:
            self.barrier(customer_id, ALL_GROUP, timeout=timeout)

    def _send_add_node(self, customer_id: int) -> None:
        me = self.van.my_node
        self.van.send(Message(Meta(customer_id=K_EMPTY, timestamp=self.van.next_timestamp(), recver=SCHEDULER_ID,
                                   control=Control(cmd=Cmd.ADD_NODE, node=[
                                       Node(me.role, K_EMPTY, me.hostname, me.port, False, customer_id)]))))

    def _await_node_list(self, timeout: float | None, customer_id: int) -> bool:
        """(Extension) a scheduler restarted before it answered has lost this node's ADD_NODE, and the
        node would wait for ever: it is sent again on each new connection to the scheduler. ps-lite's
        scheduler never restarts, so C++ clusters see it only after a broken link (and ignore it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self.ready_event.wait(0.2 if deadline is None else
                                            min(0.2, max(0.0, deadline - time.monotonic()))):
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                if self._book is None and self.van.scheduler_reconnected():
                    log_event(log, "registering_again", logging.WARNING,
                              reason="a new connection to the scheduler: it may have restarted")
                    self._send_add_node(customer_id)
            return True
        finally:
            self.van.stop_watching_scheduler()

    def finalize(self, customer_id: int = 0, do_barrier: bool = True, timeout: float | None = None) -> None:
        """ps::Finalize: the all-nodes barrier (cluster shutdown), then close everything."""
        try:
            if do_barrier and self.ready_event.is_set() and not self._stopped:
                self.barrier(customer_id, ALL_GROUP, timeout=timeout)
        finally:
            self.stop()

    def leave(self, timeout: float = 5.0) -> None:
        """(Elastic extension) leave a running cluster for good without a cluster-wide barrier."""
        if not self.elastic or not self.is_worker:
            raise RuntimeError("leave() is for workers of a cluster with elastic workers; use finalize()")
        if self.ready_event.is_set() and not self._stopped:
            self.van.send(Message(Meta(customer_id=K_EMPTY, timestamp=self.van.next_timestamp(), request=True,
                                       recver=SCHEDULER_ID, control=Control(cmd=Cmd.LEAVE))))
            if not self._left.wait(timeout):
                log_event(log, "leave_unacknowledged", logging.WARNING, id=self.node_id)
        self.stop()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._book is not None:
            self._book.stop()
        self.van.stop()
        log_event(log, "node_stopped", role=self.role, id=self.node_id)

    def barrier(self, customer_id: int = 0, group: int = ALL_GROUP, timeout: float | None = None) -> None:
        """Block until every node of ``group`` called barrier (ps-lite §5)."""
        if not self.elastic and len(self.group_ids(group)) <= 1:
            return
        key = (0, customer_id)
        with self._barrier_cv:
            self._barrier_done[key] = False
        self.van.send(Message(Meta(app_id=0, customer_id=customer_id, timestamp=self.van.next_timestamp(),
                                   request=True, recver=SCHEDULER_ID,
                                   control=Control(cmd=Cmd.BARRIER, barrier_group=group))))
        with self._barrier_cv:
            if not self._barrier_cv.wait_for(lambda: self._barrier_done.get(key, True) or self._stopped, timeout):
                raise RendezvousTimeout(f"barrier on group {group} not released within {timeout}s")

    def _on_message(self, msg: Message) -> None:
        control = msg.meta.control
        if control is NO_CONTROL:  # every data message (the receive path shares NO_CONTROL)
            self._route_data(msg)
            return
        cmd = control.cmd
        if cmd == Cmd.EMPTY:
            self._route_data(msg)
        elif cmd == Cmd.ADD_NODE:
            if self._book is not None:
                self._book.on_add_node(msg)
            else:
                self._on_node_list(msg)
        elif cmd == Cmd.BARRIER:
            if msg.meta.request:
                if self._book is not None:
                    self._book.on_barrier_request(msg)
                else:
                    self.van.reject("barrier_request_to_non_scheduler", msg.meta.sender)
            else:
                self._on_barrier_release(msg)
        elif cmd == Cmd.HEARTBEAT:
            if self._book is not None:
                self._book.on_heartbeat(msg)
            elif msg.meta.sender == SCHEDULER_ID:
                self.scheduler_last_seen = time.monotonic()
            else:
                self.van.reject("heartbeat_not_from_scheduler", msg.meta.sender)
        elif cmd == Cmd.LEAVE:
            if self._book is not None:
                self._book.on_leave(msg)
            elif msg.meta.sender == SCHEDULER_ID and not msg.meta.request:
                self._left.set()
            else:
                self.van.reject("unexpected_leave", msg.meta.sender)
        elif cmd == Cmd.ACK:
            pass  # we never enable PS_RESEND, so there is nothing to acknowledge
        else:
            self.van.reject("unknown_control_cmd", msg.meta.sender, f"cmd={cmd}")

    def _route_data(self, msg: Message) -> None:
        m = msg.meta
        key = (m.app_id, m.customer_id) if self._route_by_customer else (m.app_id, m.app_id)
        with self._route_lock:
            customer = self._customers.get(key)
            if customer is not None:
                customer.recv_handle(msg)
                return
            # The app may not exist yet (ps-lite's start-up race): keep it for a few seconds.
            now = time.monotonic()
            if self._early and now - self._early[0][0] > EARLY_MESSAGE_SECONDS:
                keep = [e for e in self._early if now - e[0] <= EARLY_MESSAGE_SECONDS]
                for _ in range(len(self._early) - len(keep)):
                    self.van.reject("no_such_app", m.sender, "expired while waiting for the app")
                self._early = keep
            if len(self._early) >= EARLY_MESSAGE_LIMIT or m.app_id == K_EMPTY:
                self.van.reject("no_such_app", m.sender, f"app={m.app_id} customer={m.customer_id}")
                return
            self._early.append((now, key, msg))

    def _on_node_list(self, msg: Message) -> None:
        if msg.meta.sender != SCHEDULER_ID:
            self.van.reject("add_node_not_from_scheduler", msg.meta.sender)
            return
        nodes = msg.meta.control.node
        problem = _invalid_nodes(nodes)
        if problem:
            self.van.reject("bad_node_list", msg.meta.sender, problem)
            return
        me = self.van.my_node
        if not self.ready_event.is_set():
            mine = next((n for n in nodes if n.hostname == me.hostname and n.port == me.port
                         and n.role == me.role), None)
            if mine is None:
                self.van.reject("node_list_without_me", msg.meta.sender,
                                f"advertised {me.hostname}:{me.port} is not in the list; check DMLC_NODE_HOST")
                return
            self.van.set_my_id(mine.id, mine.is_recovery)
            self.is_recovery = mine.is_recovery
            os.environ["DMLC_RANK"] = str(id_to_rank(mine.id))
        else:
            owner = next((n for n in nodes if n.id == me.id and n.role == me.role
                          and (n.hostname, n.port) != (me.hostname, me.port)), None)
            if owner is not None:
                self._replaced(owner)
                return
        for node in nodes:
            self._learn(node)
        self.ready_event.set()

    def _replaced(self, owner: Node) -> None:
        """The scheduler says that this node's id belongs to another process now: this one was declared
        dead and replaced. It stops heartbeating (the scheduler ignores those heartbeats anyway) and
        tells its listeners once."""
        if self.replaced_event.is_set():
            return
        self.replaced_event.set()
        self.van.stop_heartbeat()
        me = self.van.my_node
        log_event(log, "node_replaced", logging.ERROR, id=me.id, role=self.role, address=f"{me.hostname}:{me.port}",
                  owner=f"{owner.hostname}:{owner.port}",
                  reason="declared dead by the scheduler (silent for longer than PS_HEARTBEAT_TIMEOUT) and its id "
                         "given to another process: this one is no longer in the cluster")
        for listener in list(self.replaced_listeners):
            try:
                listener(owner)
            except Exception:  # a listener must never break the receive thread
                log.exception("replaced listener failed")

    def _learn(self, node: Node) -> None:
        me = self.van.my_node
        with self._nodes_lock:
            self._nodes[node.id] = node
        if node.id == SCHEDULER_ID or node.id == me.id or node.role != me.role:
            if not self.van.is_connected(node.id, node.hostname, node.port):
                self.van.connect(node)
                if self.ready_event.is_set():
                    log_event(log, "peer_reconnected", peer=node.id, address=f"{node.hostname}:{node.port}",
                              recovery=node.is_recovery)

    def _on_barrier_release(self, msg: Message) -> None:
        if msg.meta.sender != SCHEDULER_ID:
            self.van.reject("barrier_release_not_from_scheduler", msg.meta.sender)
            return
        app_id = msg.meta.app_id
        with self._barrier_cv:
            for key in self._barrier_done:
                if key[0] == app_id:
                    self._barrier_done[key] = True
            self._barrier_cv.notify_all()


def _invalid_nodes(nodes: Iterable[Node]) -> str:
    for n in nodes:
        if n.role not in (Role.SERVER, Role.WORKER, Role.SCHEDULER):
            return f"role {n.role}"
        if not (0 < n.id < K_EMPTY):
            return f"id {n.id}"
        if not (0 < n.port < 65536) or not n.hostname or len(n.hostname) > 255 or not n.hostname.isprintable():
            return f"address {n.hostname!r}:{n.port}"
    return ""
