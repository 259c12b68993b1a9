"""The Postoffice: who is in the cluster (ps-lite ``postoffice.h`` plus the control-message
half of ``van.cc``).

It owns the Van, runs the start-up handshake (ADD_NODE), assigns ids on the scheduler
(scheduler 1, server rank r -> 8+2r, worker rank r -> 9+2r), answers barriers, tracks
heartbeats, replaces dead nodes (recovery) and routes data messages to the apps'
Customers. Key ranges are ps-lite's even split of [0, 2^64-1).

Extension beyond ps-lite (``LIVEVEC_ELASTIC_WORKERS=1``, needs a livevec scheduler; off by
default): workers may join after start-up and leave or die while the cluster runs.
The scheduler gives a newcomer the lowest free worker id, marks it ``is_recovery`` (so it
skips the start barrier, like a recovered ps-lite node) and announces it to the servers
with the same one-node ADD_NODE that ps-lite recovery uses, so C++ servers serve it too.
A worker leaves with a LEAVE control message (cmd 100, unknown to C++ ps-lite), or is
dropped when its heartbeats stop. Barriers over groups containing workers then count
only live workers, and are re-checked whenever a worker goes away.
"""
from __future__ import annotations

import functools
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


def _registration_order(a: Node, b: Node) -> int:
    """ps-lite sorts ADD_NODE entries by hostname descending, then port ascending (§4.6)."""
    if a.hostname != b.hostname:
        return -1 if a.hostname > b.hostname else 1
    return (a.port > b.port) - (a.port < b.port)


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
        self._ready = threading.Event()
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
        self._book = _SchedulerBook(self) if settings.is_scheduler else None
        self.scheduler_last_seen = 0.0
        # (Scheduler) called as listener(event, node_id, role) when membership changes: "dead",
        # "recovered", "worker_joined", "worker_left", "worker_dead". Runs on the receive or
        # monitor thread with the scheduler's book locked: listeners must only record the event.
        self.membership_listeners: list[Callable[[str, int, int], None]] = []

    # ------------------------------------------------------------------ identity

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
    def is_server(self) -> bool:
        return self.role == "server"

    @property
    def is_worker(self) -> bool:
        return self.role == "worker"

    def ready(self) -> bool:
        return self._ready.is_set() and not self._stopped

    def notify_membership(self, event: str, node_id: int, role: int) -> None:
        for listener in list(self.membership_listeners):
            try:
                listener(event, node_id, role)
            except Exception:  # a listener must never break the scheduler
                log.exception("membership listener failed")

    # ------------------------------------------------------------------ groups and keys

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

    def nodes(self) -> dict[int, Node]:
        """The nodes this process knows (for the scheduler: the whole live cluster)."""
        if self._book is not None:
            return self._book.snapshot()
        with self._nodes_lock:
            return dict(self._nodes)

    # ------------------------------------------------------------------ customers

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

    # ------------------------------------------------------------------ start / stop

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
            me = van.my_node
            van.send(Message(Meta(customer_id=K_EMPTY, timestamp=van.next_timestamp(), recver=SCHEDULER_ID,
                                  control=Control(cmd=Cmd.ADD_NODE, node=[
                                      Node(me.role, K_EMPTY, me.hostname, me.port, False, customer_id)]))))
            log_event(log, "registering", scheduler=f"{self.settings.root_uri}:{self.settings.root_port}",
                      advertised=f"{me.hostname}:{me.port}", role=self.role)
        if not self._ready.wait(timeout):
            raise RendezvousTimeout(
                f"no node list from the scheduler at {self.settings.root_uri}:{self.settings.root_port} "
                f"within {timeout}s (check DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT and DMLC_NUM_*)")
        if self._book is None:
            van.start_heartbeat(self.settings.heartbeat_interval)
        log_event(log, "node_ready", role=self.role, id=self.node_id, rank=self.rank,
                  host=self.my_node.hostname, port=self.my_node.port, recovery=self.is_recovery)
        if do_barrier and not self.is_recovery:
            self.barrier(customer_id, ALL_GROUP, timeout=timeout)

    def finalize(self, customer_id: int = 0, do_barrier: bool = True, timeout: float | None = None) -> None:
        """ps::Finalize: the all-nodes barrier (cluster shutdown), then close everything."""
        try:
            if do_barrier and self._ready.is_set() and not self._stopped:
                self.barrier(customer_id, ALL_GROUP, timeout=timeout)
        finally:
            self.stop()

    def leave(self, timeout: float = 5.0) -> None:
        """(Elastic extension) leave a running cluster for good without a cluster-wide barrier."""
        if not self.elastic or not self.is_worker:
            raise RuntimeError("leave() is for workers with LIVEVEC_ELASTIC_WORKERS=1; use finalize()")
        if self._ready.is_set() and not self._stopped:
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

    # ------------------------------------------------------------------ barrier

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

    # ------------------------------------------------------------------ receiving

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
        if not self._ready.is_set():
            mine = next((n for n in nodes if n.hostname == me.hostname and n.port == me.port
                         and n.role == me.role), None)
            if mine is None:
                self.van.reject("node_list_without_me", msg.meta.sender,
                                f"advertised {me.hostname}:{me.port} is not in the list; check DMLC_NODE_HOST")
                return
            self.van.set_my_id(mine.id, mine.is_recovery)
            self.is_recovery = mine.is_recovery
            os.environ["DMLC_RANK"] = str(id_to_rank(mine.id))
        for node in nodes:
            self._learn(node)
        self._ready.set()

    def _learn(self, node: Node) -> None:
        me = self.van.my_node
        with self._nodes_lock:
            self._nodes[node.id] = node
        if node.id == SCHEDULER_ID or node.id == me.id or node.role != me.role:
            if not self.van.is_connected(node.id, node.hostname, node.port):
                self.van.connect(node)
                if self._ready.is_set():
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


class _SchedulerBook:
    """The scheduler's side: registrations, id assignment, barriers, heartbeats, recovery and
    (extension) elastic workers. Runs on the receive thread plus a small monitor thread."""

    def __init__(self, po: Postoffice):
        self.po = po
        self.van = po.van
        self.settings = po.settings
        self.lock = threading.RLock()
        self.registrations: list[Node] = []
        self.entries: list[Node] = []  # assigned nodes in list order (shared duplicates included)
        self.last_seen: dict[int, float] = {}
        self.reported_dead: set[int] = set()
        self.pending_joins: list[Node] = []
        self.barrier_members: dict[int, set[tuple[int, int]]] = {}
        self.barrier_request: dict[int, Meta] = {}
        self.start_time = time.monotonic()
        self.adopted = False   # nodes were taken back from their heartbeats (restarted scheduler)
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        registry = po.registry
        self.m_nodes = registry.gauge("pslite_cluster_nodes", "servers and workers in the cluster",
                                      fn=lambda: float(len(self.distinct_ids())))
        self.m_recovered = registry.counter("pslite_nodes_recovered_total", "dead nodes replaced by a restart")
        self.m_joined = registry.counter("pslite_workers_joined_total", "workers admitted after start (elastic)")
        self.m_removed = registry.counter("pslite_workers_removed_total", "workers that left or died (elastic)")

    # ------------------------------------------------------------------ helpers

    def start(self) -> None:
        if self.settings.heartbeat_timeout > 0 or self.po.elastic:
            self._monitor = threading.Thread(target=self._monitor_loop, name="ps-scheduler-monitor", daemon=True)
            self._monitor.start()
        if self.settings.num_server + self.settings.num_worker == 0:  # pragma: no cover - settings forbid it
            self._assign()

    def stop(self) -> None:
        self._stop.set()
        if self._monitor is not None:
            self._monitor.join(timeout=2.0)

    def me(self) -> Node:
        n = self.van.my_node
        return Node(int(Role.SCHEDULER), SCHEDULER_ID, n.hostname, n.port, False, 0)

    def distinct_ids(self) -> list[int]:
        with self.lock:
            return list(dict.fromkeys(e.id for e in self.entries))

    def snapshot(self) -> dict[int, Node]:
        with self.lock:
            nodes = {e.id: e for e in self.entries}
        nodes[SCHEDULER_ID] = self.me()
        return nodes

    def worker_ids(self) -> list[int]:
        if not self.po.elastic:
            return [worker_rank_to_id(r) for r in range(self.settings.num_worker)]
        with self.lock:
            return sorted({e.id for e in self.entries if e.role == Role.WORKER})

    def send_list(self, recver: int, nodes: list[Node]) -> None:
        self.van.send(Message(Meta(customer_id=K_EMPTY, timestamp=self.van.next_timestamp(), recver=recver,
                                   control=Control(cmd=Cmd.ADD_NODE, node=nodes))), block=False)

    def dead_nodes(self) -> list[int]:
        """ps-lite's GetDeadNodes(PS_HEARTBEAT_TIMEOUT): silent for longer than the timeout."""
        t = self.settings.heartbeat_timeout
        if t <= 0 or not self.po._ready.is_set():
            return []
        now = time.monotonic()
        if self.start_time + t >= now:
            return []
        with self.lock:
            return [i for i in self.distinct_ids() if self.last_seen.get(i, 0.0) + t < now]

    # ------------------------------------------------------------------ ADD_NODE

    def on_add_node(self, msg: Message) -> None:
        if msg.meta.sender != K_EMPTY:
            # ps-lite only registers identity-less senders; a psN sender is a node list echo or garbage.
            self.van.reject("add_node_with_identity", msg.meta.sender)
            return
        nodes = msg.meta.control.node
        if len(nodes) != 1:
            self.van.reject("bad_add_node", msg.meta.sender, f"{len(nodes)} nodes")
            return
        n = nodes[0]
        if n.role not in (Role.SERVER, Role.WORKER) or not (0 < n.port < 65536) or not n.hostname \
                or len(n.hostname) > 255 or not n.hostname.isprintable():
            self.van.reject("bad_add_node", msg.meta.sender, f"role={n.role} address={n.hostname!r}:{n.port}")
            return
        node = Node(n.role, K_EMPTY, n.hostname, n.port, False, n.customer_id)
        with self.lock:
            if not self.po._ready.is_set() and self.adopted:
                self._register_while_adopting(node)
            elif not self.po._ready.is_set():
                self._register(node)
            else:
                self._admit_late(node)

    def _register(self, node: Node) -> None:
        for e in self.registrations:
            if (e.hostname, e.port, e.customer_id, e.role) == (node.hostname, node.port, node.customer_id, node.role):
                log_event(log, "duplicate_add_node", address=f"{node.hostname}:{node.port}")
                return
        wanted = self.settings.num_server if node.role == Role.SERVER else self.settings.num_worker
        have = sum(1 for e in self.registrations if e.role == node.role)
        if have >= wanted:
            if self.po.elastic and node.role == Role.WORKER:
                self.pending_joins.append(node)
            else:
                self.van.reject("too_many_nodes", K_EMPTY, f"{Role(node.role).name} {node.hostname}:{node.port}")
            return
        self.registrations.append(node)
        log_event(log, "node_registered", role=Role(node.role).name.lower(), address=f"{node.hostname}:{node.port}",
                  have=len(self.registrations), want=self.settings.num_server + self.settings.num_worker)
        if len(self.registrations) == self.settings.num_server + self.settings.num_worker:
            self._assign()

    def _assign(self) -> None:
        ordered = sorted(self.registrations, key=functools.cmp_to_key(_registration_order))
        next_id = {Role.SERVER: server_rank_to_id(0), Role.WORKER: worker_rank_to_id(0)}
        by_address: dict[tuple[str, int], int] = {}
        now = time.monotonic()
        for n in ordered:
            addr = (n.hostname, n.port)
            if addr in by_address:  # several customers in one process share the id (A21)
                n.id = by_address[addr]
                continue
            n.id = next_id[n.role]
            next_id[n.role] += 2
            by_address[addr] = n.id
            self.last_seen[n.id] = now
            self.van.connect(n)
        self.entries = ordered
        self.registrations = []
        full = self.entries + [self.me()]
        for node_id in self.distinct_ids():
            self.send_list(node_id, full)
        self.po._ready.set()
        log_event(log, "cluster_ready", servers=self.settings.num_server, workers=self.settings.num_worker,
                  ids=",".join(str(i) for i in self.distinct_ids()))
        pending, self.pending_joins = self.pending_joins, []
        for node in pending:
            self._admit_late(node)

    def _admit_late(self, node: Node) -> None:
        for e in self.entries:
            if (e.hostname, e.port) == (node.hostname, node.port) and e.role == node.role:
                log_event(log, "duplicate_add_node", address=f"{node.hostname}:{node.port}")
                return
        dead = set(self.dead_nodes())
        for e in self.entries:
            if e.id in dead and e.role == node.role:
                self._replace(e.id, node, "recovered")
                self.m_recovered.inc()
                return
        if self.po.elastic and node.role == Role.WORKER:
            taken = {e.id for e in self.entries if e.role == Role.WORKER}
            rank = 0
            while worker_rank_to_id(rank) in taken:
                rank += 1
            self._replace(worker_rank_to_id(rank), node, "worker_joined")
            self.m_joined.inc()
            return
        if all((p.hostname, p.port) != (node.hostname, node.port) for p in self.pending_joins):
            self.pending_joins.append(node)
        log_event(log, "join_pending", logging.WARNING, role=Role(node.role).name.lower(),
                  address=f"{node.hostname}:{node.port}",
                  reason="cluster is full; waiting for a dead node of this role to replace (PS_HEARTBEAT_TIMEOUT)")

    def _replace(self, node_id: int, node: Node, event: str) -> None:
        """ps-lite recovery (§9): the newcomer takes ``node_id``; it gets the full list, the others
        get a list holding only it, and everyone reconnects."""
        node.id = node_id
        node.is_recovery = True
        replaced = False
        entries: list[Node] = []
        for e in self.entries:
            if e.id == node_id:
                if not replaced:
                    entries.append(node)
                    replaced = True
                continue
            entries.append(e)
        if not replaced:
            entries.append(node)
        self.entries = entries
        self.last_seen[node_id] = time.monotonic()
        self.reported_dead.discard(node_id)
        self.van.connect(node)
        dead = set(self.dead_nodes())
        self.send_list(node_id, [e for e in self.entries if e.id not in dead or e.id == node_id] + [self.me()])
        for other in self.distinct_ids():
            if other != node_id and other not in dead:
                self.send_list(other, [node])
        log_event(log, event, id=node_id, address=f"{node.hostname}:{node.port}")
        self.po.notify_membership(event, node_id, node.role)
        self._recheck_barriers()

    def _remove_worker(self, node_id: int, reason: str, linger_ms: int = 0) -> None:
        self.entries = [e for e in self.entries if e.id != node_id]
        self.last_seen.pop(node_id, None)
        self.reported_dead.discard(node_id)
        self.van.disconnect(node_id, linger_ms)
        self.m_removed.inc()
        log_event(log, "worker_removed", id=node_id, reason=reason, workers=len(self.worker_ids()))
        self.po.notify_membership(f"worker_{reason}", node_id, int(Role.WORKER))
        for group, members in self.barrier_members.items():
            self.barrier_members[group] = {m for m in members if m[0] != node_id}
        self._recheck_barriers()

    # ------------------------------------------------------------------ heartbeats, leave, monitor

    def on_heartbeat(self, msg: Message) -> None:
        now = time.monotonic()
        with self.lock:
            known = {e.id for e in self.entries}
            for n in msg.meta.control.node:
                if n.id not in known and not self._adopt(n, msg.meta.sender):
                    self.van.reject("heartbeat_from_unknown_node", msg.meta.sender, f"id={n.id}")
                    return
            for n in msg.meta.control.node:
                self.last_seen[n.id] = now
                if n.id in self.reported_dead:
                    self.reported_dead.discard(n.id)
                    log_event(log, "node_alive_again", id=n.id)
            recvers = {n.id for n in msg.meta.control.node}
        for recver in recvers:
            self.van.send(Message(Meta(customer_id=K_EMPTY, timestamp=self.van.next_timestamp(), recver=recver,
                                       control=Control(cmd=Cmd.HEARTBEAT, node=[self.me()]))), block=False)

    def _adopt(self, n: Node, sender: int) -> bool:
        """(Extension) a heartbeat from a node this scheduler never registered: the scheduler was
        restarted while the cluster ran. The node keeps its id (its heartbeat carries it and its
        address), so take it back instead of leaving the cluster without a scheduler. Once every
        server (and, without elastic workers, every worker) is back, the cluster is ready again,
        without a start barrier (the nodes passed theirs long ago)."""
        role = Role(n.role) if n.role in (Role.SERVER, Role.WORKER) else None
        if role is None or n.id != sender or n.id < 8 or not (0 < n.port < 65536) or not n.hostname \
                or len(n.hostname) > 255 or not n.hostname.isprintable():
            return False
        rank = id_to_rank(n.id)
        if (role == Role.SERVER) != (n.id % 2 == 0) or (role == Role.SERVER and rank >= self.settings.num_server) \
                or (role == Role.WORKER and not self.po.elastic and rank >= self.settings.num_worker):
            return False
        if any((e.hostname, e.port) == (n.hostname, n.port) for e in self.entries):
            return False
        node = Node(int(role), n.id, n.hostname, n.port, False, 0)
        self.entries.append(node)
        self.last_seen[n.id] = time.monotonic()
        self.adopted = True
        self.van.connect(node)
        log_event(log, "node_adopted", id=n.id, role=role.name.lower(), address=f"{n.hostname}:{n.port}")
        self.po.notify_membership("adopted", n.id, int(role))
        self._ready_if_rebuilt()
        return True

    def _ready_if_rebuilt(self) -> None:
        if self.po._ready.is_set():
            return
        servers = {e.id for e in self.entries if e.role == Role.SERVER}
        workers = {e.id for e in self.entries if e.role == Role.WORKER}
        if len(servers) < self.settings.num_server or (not self.po.elastic and len(workers) < self.settings.num_worker):
            return
        self.po.is_recovery = True   # no start barrier
        self.po._ready.set()
        log_event(log, "cluster_rebuilt", servers=len(servers), workers=len(workers),
                  ids=",".join(str(i) for i in self.distinct_ids()))
        pending, self.pending_joins = self.registrations + self.pending_joins, []
        self.registrations = []
        for node in pending:
            self._admit_late(node)

    def _register_while_adopting(self, node: Node) -> None:
        """A node registering (ADD_NODE) with a restarted scheduler that is still taking the running
        nodes back: a restarted server takes its missing slot; others wait for the cluster to be ready."""
        if node.role == Role.SERVER:
            taken = {e.id for e in self.entries if e.role == Role.SERVER}
            free = [server_rank_to_id(r) for r in range(self.settings.num_server) if server_rank_to_id(r) not in taken]
            if free:
                self._replace(free[0], node, "recovered")
                self._ready_if_rebuilt()
                return
        if all((p.hostname, p.port) != (node.hostname, node.port) for p in self.pending_joins):
            self.pending_joins.append(node)

    def on_leave(self, msg: Message) -> None:
        sender = msg.meta.sender
        with self.lock:
            if not self.po.elastic or not msg.meta.request \
                    or sender not in {e.id for e in self.entries if e.role == Role.WORKER}:
                self.van.reject("unexpected_leave", sender)
                return
            self.van.send(Message(Meta(customer_id=K_EMPTY, timestamp=self.van.next_timestamp(), recver=sender,
                                       control=Control(cmd=Cmd.LEAVE))), block=False)
            self._remove_worker(sender, "left", linger_ms=1000)

    def _monitor_loop(self) -> None:
        t = self.settings.heartbeat_timeout
        period = min(max(t / 4.0, 0.05), 1.0) if t > 0 else 1.0
        while not self._stop.wait(period):
            try:
                self._monitor_tick()
            except Exception:  # keep watching whatever happens
                log.exception("scheduler monitor failed")

    def _monitor_tick(self) -> None:
        with self.lock:
            dead = self.dead_nodes()
            for i in dead:
                if i not in self.reported_dead:
                    self.reported_dead.add(i)
                    log_event(log, "node_dead", logging.WARNING, id=i,
                              silent_for=round(time.monotonic() - self.last_seen.get(i, self.start_time), 2))
                    role = next((e.role for e in self.entries if e.id == i), -1)
                    self.po.notify_membership("dead", i, role)
            if self.pending_joins and dead:
                pending, self.pending_joins = self.pending_joins, []
                for node in pending:
                    self._admit_late(node)
            if self.po.elastic:
                for i in dead:
                    if any(e.id == i and e.role == Role.WORKER for e in self.entries):
                        self._remove_worker(i, "dead")

    # ------------------------------------------------------------------ barriers

    def group_size(self, group: int) -> int:
        size = 1 if group & SCHEDULER_ID else 0
        if group & SERVER_GROUP:
            size += self.settings.num_server
        if group & WORKER_GROUP:
            size += len(self.worker_ids()) if self.po.elastic else self.settings.num_worker
        return size

    def on_barrier_request(self, msg: Message) -> None:
        group = msg.meta.control.barrier_group
        if not (1 <= group <= 7):
            self.van.reject("bad_barrier_group", msg.meta.sender, f"group={group}")
            return
        sender = msg.meta.sender
        with self.lock:
            if sender != SCHEDULER_ID and sender not in {e.id for e in self.entries}:
                self.van.reject("barrier_from_unknown_node", sender)
                return
            self.barrier_request[group] = msg.meta
            # ps-lite counts requests; we count distinct (node, customer) pairs, which is the same
            # for live nodes but does not count a dead node's request and its replacement's twice.
            self.barrier_members.setdefault(group, set()).add((sender, msg.meta.customer_id))
            self._check_barrier(group)

    def _recheck_barriers(self) -> None:
        for group in list(self.barrier_request):
            self._check_barrier(group)

    def _check_barrier(self, group: int) -> None:
        if group not in self.barrier_request:
            return
        arrived = self.barrier_members.get(group, set())
        if self.po.elastic:  # every live member has arrived
            members = set(self.po.group_ids(group))
            done = bool(members) and members <= {sender for sender, _ in arrived}
        else:
            done = len(arrived) >= self.group_size(group)
        if not done:
            return
        req = self.barrier_request.pop(group)
        self.barrier_members[group] = set()
        for recver in dict.fromkeys(self.po.group_ids(group)):
            self.van.send(Message(Meta(app_id=req.app_id, customer_id=req.customer_id,
                                       timestamp=self.van.next_timestamp(), recver=recver,
                                       control=Control(cmd=Cmd.BARRIER, barrier_group=group))), block=False)
