"""The scheduler's book of the cluster: the half of ps-lite's ``van.cc`` that only runs on
the scheduler (``ProcessAddNodeCommandAtScheduler``, ``ProcessBarrierCommand``,
``ProcessHearbeat``, ``GetDeadNodes``).

It registers nodes, assigns ids (scheduler 1, server rank r -> 8+2r, worker r -> 9+2r, in
ps-lite's order), releases barriers, tracks heartbeats and replaces dead nodes with newcomers
of their role (recovery). Extensions: a restarted scheduler takes the running nodes back from
their heartbeats; with ``elastic_workers`` a late worker gets the lowest free worker id, is
marked ``is_recovery`` (no start barrier) and announced with ps-lite's one-node ADD_NODE (C++
servers serve it too); it leaves with LEAVE (cmd 100) or when its heartbeats stop, and
barriers then count live workers only.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Protocol

from ps_bridge.message import (ALL_GROUP, K_EMPTY, SCHEDULER_ID, SERVER_GROUP, WORKER_GROUP, Cmd, Control, Message,
                               Meta, Node, Role, id_to_rank, server_rank_to_id, worker_rank_to_id)
from ps_bridge.metrics import Registry
from ps_bridge.settings import NodeSettings
from ps_bridge.structured_logging import log_event
from ps_bridge.van import Van

log = logging.getLogger("ps_bridge.postoffice")  # the logger operators already filter on


def _registration_order(a: Node, b: Node) -> int:
    """ps-lite sorts ADD_NODE entries by hostname descending, then port ascending (§4.6)."""
    if a.hostname != b.hostname:
        return -1 if a.hostname > b.hostname else 1
    return (a.port > b.port) - (a.port < b.port)


class SchedulerNode(Protocol):
    """What the book needs of the scheduler's Postoffice, the layer it serves: the node's
    sockets and settings, its ready event (set once ids are assigned), and two calls back."""

    van: Van
    settings: NodeSettings
    registry: Registry
    elastic: bool
    is_recovery: bool
    ready_event: threading.Event

    def group_ids(self, group: int) -> list[int]: ...

    def notify_membership(self, event: str, node_id: int, role: int) -> None: ...


class SchedulerBook:
    """The scheduler's side: registrations, id assignment, barriers, heartbeats, recovery and
    (extension) elastic workers. Runs on the receive thread plus a small monitor thread."""

    def __init__(self, po: SchedulerNode):
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
        self._start_members: set[int] | None = None   # who the start barrier waits for, until it is released
        self._told_replaced: dict[tuple[str, int], float] = {}   # stale address -> when it was last told
        # processes whose id went to another (declared dead, maybe only cut off): told so until this deadline,
        # since one alive behind a partition hears it only when the link returns
        self._displaced: dict[tuple[str, int], tuple[Node, float]] = {}
        self._removed_dead: dict[int, Node] = {}   # elastic workers removed as dead: displaced if their id is reused
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        registry = po.registry
        self.m_nodes = registry.gauge("pslite_cluster_nodes", "servers and workers in the cluster",
                                      fn=lambda: float(len(self.distinct_ids())))
        self.m_recovered = registry.counter("pslite_nodes_recovered_total", "dead nodes replaced by a restart")
        self.m_joined = registry.counter("pslite_workers_joined_total", "workers admitted after start (elastic)")
        self.m_removed = registry.counter("pslite_workers_removed_total", "workers that left or died (elastic)")
        self.m_dead = registry.counter("pslite_nodes_dead_total", "nodes declared dead (silent > PS_HEARTBEAT_TIMEOUT)")
        registry.gauge("pslite_dead_nodes", "dead nodes not back/replaced", fn=lambda: float(len(self.reported_dead)))
        self.m_stale = registry.counter("pslite_stale_nodes_total",
                                        "processes heartbeating under an id the scheduler gave to another process")

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
        return Node(int(Role.SCHEDULER), SCHEDULER_ID, n.hostname, n.port, False, 0, n.public_key)

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

    def _list_for(self, node_id: int, dead: set[int]) -> list[Node]:
        """The node list a (re)joining node gets: every live member, itself, and the scheduler."""
        return [e for e in self.entries if e.id not in dead or e.id == node_id] + [self.me()]

    def send_list(self, recver: int, nodes: list[Node]) -> None:
        self.van.send(Message(Meta(customer_id=K_EMPTY, timestamp=self.van.next_timestamp(), recver=recver,
                                   control=Control(cmd=Cmd.ADD_NODE, node=nodes))), block=False)

    def dead_nodes(self) -> list[int]:
        """ps-lite's GetDeadNodes(PS_HEARTBEAT_TIMEOUT): silent for longer than the timeout."""
        t = self.settings.heartbeat_timeout
        # A restarted scheduler that is still taking the nodes back (not ready: a server is missing) times
        # out the nodes it adopted too: one that died meanwhile would otherwise stay a member for ever.
        if t <= 0 or not (self.po.ready_event.is_set() or self.adopted):
            return []
        now = time.monotonic()
        if self.start_time + t >= now:
            return []
        with self.lock:
            return [i for i in self.distinct_ids() if self.last_seen.get(i, 0.0) + t < now]

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
        node = Node(n.role, K_EMPTY, n.hostname, n.port, False, n.customer_id, n.public_key)
        with self.lock:
            member = next((e for e in self.entries if (e.hostname, e.port, e.role) == (n.hostname, n.port, n.role)),
                          None)
            if member is not None:
                # sent again (it saw a new connection): its answer may be what was lost, so it gets it again
                log_event(log, "duplicate_add_node", id=member.id, address=f"{node.hostname}:{node.port}")
                self.send_list(member.id, self._list_for(member.id, set(self.dead_nodes())))
            elif not self.po.ready_event.is_set() and self.adopted:
                self._register_while_adopting(node)
            elif not self.po.ready_event.is_set():
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
        self._start_members = set(self.distinct_ids()) | {SCHEDULER_ID}
        full = self.entries + [self.me()]
        for node_id in self.distinct_ids():
            self.send_list(node_id, full)
        self.po.ready_event.set()
        log_event(log, "cluster_ready", servers=self.settings.num_server, workers=self.settings.num_worker,
                  ids=",".join(str(i) for i in self.distinct_ids()))
        pending, self.pending_joins = self.pending_joins, []
        for node in pending:
            self._admit_late(node)

    def _admit_late(self, node: Node) -> None:
        if any((e.hostname, e.port, e.role) == (node.hostname, node.port, node.role) for e in self.entries):
            return   # a waiting node admitted meanwhile (on_add_node answers repeats)
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
                if (e.hostname, e.port) != (node.hostname, node.port):
                    self._displaced[(e.hostname, e.port)] = (e, time.monotonic() + self.DISPLACED_NOTICE_FOR)
                if not replaced:
                    entries.append(node)
                    replaced = True
                continue
            entries.append(e)
        if not replaced:
            entries.append(node)
            gone = self._removed_dead.pop(node_id, None)   # a worker removed as dead may still run (cut off)
            if gone is not None and (gone.hostname, gone.port) != (node.hostname, node.port):
                self._displaced[(gone.hostname, gone.port)] = (gone, time.monotonic() + self.DISPLACED_NOTICE_FOR)
        self.entries = entries
        self.last_seen[node_id] = time.monotonic()
        self.reported_dead.discard(node_id)
        self.van.connect(node)
        dead = set(self.dead_nodes())
        self.send_list(node_id, self._list_for(node_id, dead))
        for other in self.distinct_ids():
            if other != node_id and other not in dead:
                self.send_list(other, [node])
        log_event(log, event, id=node_id, address=f"{node.hostname}:{node.port}")
        self.po.notify_membership(event, node_id, node.role)
        self._recheck_barriers()

    def _remove_worker(self, node_id: int, reason: str, linger_ms: int = 0) -> None:
        if reason == "dead":
            self._removed_dead.update((e.id, e) for e in self.entries if e.id == node_id)
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

    def on_heartbeat(self, msg: Message) -> None:
        now = time.monotonic()
        with self.lock:
            known = {e.id: e for e in self.entries}
            for n in msg.meta.control.node:
                if n.id not in known and not self._adopt(n, msg.meta.sender):
                    self.van.reject("heartbeat_from_unknown_node", msg.meta.sender, f"id={n.id}")
                    return
                entry = known.get(n.id)
                if entry is not None and (entry.hostname, entry.port) != (n.hostname, n.port):
                    # Its id went to another process (it was declared dead and replaced, e.g. while cut
                    # off): its heartbeats must not keep that id alive. Tell it, so that it stops.
                    self._tell_replaced(n, entry)
                    return
            for n in msg.meta.control.node:
                self.last_seen[n.id] = now
                if n.id in self.reported_dead:
                    self.reported_dead.discard(n.id)
                    log_event(log, "node_alive_again", id=n.id)
                    self.po.notify_membership("alive_again", n.id, n.role)   # e.g. a healed partition
                    # Nodes that joined while it was dead got the live nodes' addresses only, and it never heard
                    # of them: both ways, requests would have no route for ever (every rollback then waits for a
                    # fence or an answer that cannot come). Each side learns the other now.
                    for other in self.distinct_ids():
                        if other != n.id:
                            self.send_list(other, [known[n.id]])
                    self.send_list(n.id, [e for e in self.entries if e.id not in self.reported_dead] + [self.me()])
            recvers = {n.id for n in msg.meta.control.node}
        for recver in recvers:
            self.van.send(Message(Meta(customer_id=K_EMPTY, timestamp=self.van.next_timestamp(), recver=recver,
                                       control=Control(cmd=Cmd.HEARTBEAT, node=[self.me()]))), block=False)

    TELL_REPLACED_EVERY = 2.0   # seconds between two notices to one stale process
    DISPLACED_NOTICE_FOR = 600.0   # seconds a replaced node's old address keeps being told

    def _tell_replaced(self, stale: Node, entry: Node) -> None:
        """A process heartbeats under an id that belongs to ``entry`` (another address): send it the
        node list that says so (ps-lite's ADD_NODE; the Postoffice of a stale node sees its id at
        another address and stops), on a socket of its own since its id routes to the new owner."""
        address = (stale.hostname, stale.port)
        now = time.monotonic()
        last = self._told_replaced.get(address)
        if last is not None and now - last < self.TELL_REPLACED_EVERY:
            return
        if last is None:
            self.m_stale.inc()
            log_event(log, "stale_node", logging.WARNING, id=stale.id, address=f"{stale.hostname}:{stale.port}",
                      owner=f"{entry.hostname}:{entry.port}",
                      action="told it was replaced; its heartbeats no longer count for the id")
        if len(self._told_replaced) > 1024:
            self._told_replaced.clear()
        self._told_replaced[address] = now
        target = Node(stale.role, stale.id, stale.hostname, stale.port, False, 0, stale.public_key)
        self.van.send_once(target, Message(Meta(customer_id=K_EMPTY, timestamp=self.van.next_timestamp(),
                                                recver=stale.id,
                                                control=Control(cmd=Cmd.ADD_NODE, node=[entry, self.me()]))))

    def _adopt(self, n: Node, sender: int) -> bool:
        """(Extension) a heartbeat from a node never registered here (this scheduler restarted): the
        node keeps its id and is taken back; once all servers (and non-elastic workers) are back,
        the cluster is ready again without a start barrier."""
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
        node = Node(int(role), n.id, n.hostname, n.port, False, 0, n.public_key)
        self.entries.append(node)
        self.last_seen[n.id] = time.monotonic()
        self.adopted = True
        self.van.connect(node)
        self.send_list(n.id, self.entries + [self.me()])   # it may have missed replacements while cut off
        for other in self.distinct_ids():   # and a node that registered with this scheduler may not know it
            if other != n.id:
                self.send_list(other, [node])
        log_event(log, "node_adopted", id=n.id, role=role.name.lower(), address=f"{n.hostname}:{n.port}")
        self.po.notify_membership("adopted", n.id, int(role))
        # ADD_NODEs that came before this first heartbeat were taken for a fresh start: the cluster runs,
        # so they are restarted nodes (left in the registrations, a restarted server would wait for ever)
        registered, self.registrations = self.registrations, []
        for waiting in registered:
            self._register_while_adopting(waiting)
        self._ready_if_rebuilt()
        return True

    def _ready_if_rebuilt(self) -> None:
        if self.po.ready_event.is_set():
            return
        servers = {e.id for e in self.entries if e.role == Role.SERVER}
        workers = {e.id for e in self.entries if e.role == Role.WORKER}
        if len(servers) < self.settings.num_server or (not self.po.elastic and len(workers) < self.settings.num_worker):
            return
        self.po.is_recovery = True   # no start barrier
        self.po.ready_event.set()
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
            # a slot nobody holds first; then one adopted and silent since (its process may only be slow)
            taken = {e.id for e in self.entries if e.role == Role.SERVER}
            dead = set(self.dead_nodes())
            ids = [server_rank_to_id(r) for r in range(self.settings.num_server)]
            free = [i for i in ids if i not in taken] + [i for i in ids if i in taken and i in dead]
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
            now = time.monotonic()
            for address, (old, until) in list(self._displaced.items()):
                owner = next((e for e in self.entries if e.id == old.id), None)
                if until < now or owner is None or (owner.hostname, owner.port) == address:
                    del self._displaced[address]
                else:
                    self._tell_replaced(old, owner)
            dead = self.dead_nodes()
            for i in dead:
                if i not in self.reported_dead:
                    self.reported_dead.add(i)
                    self.m_dead.inc()
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
            if group == ALL_GROUP and self._start_members is not None:
                # the start barrier: a worker admitted since cluster_ready starts as a recovering node and
                # skips it (e.g. a trainer that came after the front end had taken the last initial slot)
                members &= self._start_members
            done = bool(members) and members <= {sender for sender, _ in arrived}
        else:
            done = len(arrived) >= self.group_size(group)
        if not done:
            return
        req = self.barrier_request.pop(group)
        self.barrier_members[group] = set()
        if group == ALL_GROUP:
            self._start_members = None
        for recver in dict.fromkeys(self.po.group_ids(group)):
            self.van.send(Message(Meta(app_id=req.app_id, customer_id=req.customer_id,
                                       timestamp=self.van.next_timestamp(), recver=recver,
                                       control=Control(cmd=Cmd.BARRIER, barrier_group=group))), block=False)
