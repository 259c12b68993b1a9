"""The Van: ps-lite's ZMQ transport (``src/zmq_van.h``), over pyzmq.

One ROUTER receives everything; one DEALER per peer sends, with identity ``ps<my id>`` (none
before the scheduler assigned one). A receive thread decodes ``[routing id, PBMeta, data...]``
into :class:`Message` objects for the Postoffice. The Van knows nothing about membership.
An undecodable frame is counted (``pslite_frames_rejected_total``), logged and dropped, and a
handler exception is logged; ps-lite aborts in both cases.

Zero copy (same bytes on the wire): large data frames go to libzmq by reference and received
frames are memoryviews over libzmq's buffers; do not modify a pushed array before ``wait``.
With ``PS_CURVE_*`` set, every socket is CurveZMQ (:mod:`ps_bridge.curve`).
"""
from __future__ import annotations

import errno
import fcntl
import ipaddress
import logging
import socket
import struct
import threading
from collections.abc import Callable

import zmq
from zmq.utils.monitor import parse_monitor_message

from ps_bridge.curve import CurveGate, load_keys, secure_client
from ps_bridge.metrics import Registry
from ps_bridge.structured_logging import log_event
from ps_bridge.message import K_EMPTY, SCHEDULER_ID, Cmd, Control, Message, Meta, Node, Role, pack_meta, unpack_meta
from ps_bridge.meta import MalformedMeta
from ps_bridge.settings import NodeSettings, SettingError

log = logging.getLogger("ps_bridge.van")

SEND_TIMEOUT_MS = 10_000  # a blocking send gives up (and counts a drop) after this long
STOP_LINGER_MS = 500

# pyzmq's send_multipart/recv_multipart cost 10 - 15 us per 3-frame message here against ~1 us
# for the compiled send/recv, so the Van calls those with int flags. Frames below ZERO_COPY_MIN
# bytes are copied (pyzmq would copy them anyway); larger ones go to libzmq by reference.
_zsend = zmq.backend.Socket.send
_zrecv = zmq.backend.Socket.recv
_SNDMORE = int(zmq.SNDMORE)
_NOBLOCK = int(zmq.NOBLOCK)
_TERMINATE = int(Cmd.TERMINATE)  # a plain int: comparing against an IntEnum member is 5x slower
ZERO_COPY_MIN = 65536


def send_frames(sock: zmq.Socket, frames: list, flags: int = 0) -> int:
    """``sock.send_multipart(frames, flags, copy=False)`` without pyzmq's Python layer.
    Returns the number of bytes sent."""
    total = 0
    more = flags | _SNDMORE
    last = len(frames) - 1
    for i in range(last + 1):
        frame = frames[i]
        if type(frame) is bytes:
            size = len(frame)
        else:  # numpy arrays and memoryviews have nbytes; bytearray, zmq.Frame: len
            size = getattr(frame, "nbytes", None)
            if size is None:
                size = len(frame)
        total += size
        _zsend(sock, frame, more if i < last else flags, size < ZERO_COPY_MIN, False)
    return total


def recv_frames(sock: zmq.Socket) -> list:
    """``sock.recv_multipart(copy=False)`` without pyzmq's Python layer."""
    frame = _zrecv(sock, 0, False, False)
    frames = [frame]
    while frame.more:
        frame = _zrecv(sock, 0, False, False)
        frames.append(frame)
    return frames


def parse_identity(identity: bytes) -> int:
    """``b"ps9"`` -> 9; anything else (libzmq's auto ids, garbage) -> kEmpty, as ps-lite does."""
    if len(identity) > 2 and identity[:2] == b"ps" and identity[2:].isdigit() and len(identity) < 12:
        value = int(identity[2:])
        return value if value < K_EMPTY else K_EMPTY
    return K_EMPTY


def interface_ipv4(name_prefix: str | None) -> str | None:
    """IPv4 address of the first interface whose name starts with ``name_prefix`` (ps-lite's
    DMLC_INTERFACE), or of the first non-loopback interface when no prefix is given."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:  # pragma: no cover - exotic platforms
        return None
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for name in names:
            if name_prefix is not None and not name.startswith(name_prefix):
                continue
            try:
                packed = fcntl.ioctl(probe.fileno(), 0x8915,  # SIOCGIFADDR
                                     struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            addr = socket.inet_ntoa(packed[20:24])
            if name_prefix is None and ipaddress.ip_address(addr).is_loopback:
                continue
            return addr
    finally:
        probe.close()
    return None


def _is_ip_literal(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


class _Peer:
    __slots__ = ("node_id", "address", "identified", "sock", "lock")

    def __init__(self, node_id: int, address: str, identified: bool, sock: zmq.Socket):
        self.node_id, self.address, self.identified, self.sock = node_id, address, identified, sock
        self.lock = threading.Lock()


class Van:
    def __init__(self, settings: NodeSettings, on_message: Callable[[Message], None],
                 registry: Registry | None = None):
        self.settings = settings
        self._verbose = settings.verbose
        self._on_message = on_message
        self._ctx = zmq.Context()
        self._ctx.setsockopt(zmq.MAX_SOCKETS, 65536)
        self._router: zmq.Socket | None = None
        self._peers: dict[int, _Peer] = {}
        self._peers_lock = threading.Lock()
        self._ts = 0
        self._ts_lock = threading.Lock()
        self._sent_lock = threading.Lock()
        self._recv_thread: threading.Thread | None = None
        self._recv_ident: int | None = None
        self._deferred: list[Callable[[], None]] = []
        self._hb_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._hb_stop = threading.Event()
        self._stopped = False
        self.my_node = Node(role=int(Role[settings.role.upper()]))
        self.bind_endpoint = ""
        registry = registry if registry is not None else Registry()
        self.registry = registry
        self._rejected: dict[str, object] = {}
        # per message: received ones by the receive thread alone (no lock), sent ones under _sent_lock
        self._m_recv = registry.counter("pslite_messages_received_total", "ps-lite messages received")
        self._m_sent = registry.counter("pslite_messages_sent_total", "ps-lite messages sent")
        self._m_recv_bytes = registry.counter("pslite_received_bytes_total", "payload bytes received")
        self._m_sent_bytes = registry.counter("pslite_sent_bytes_total", "payload bytes sent")
        self._m_send_fail = registry.counter("pslite_send_failures_total",
                                             "messages that could not be sent (no route, queue full)")
        self.rejected_total = 0
        self.curve = load_keys(settings)  # None: a plain cluster, byte-compatible with C++ ps-lite
        self.gate: CurveGate | None = None
        self._scheduler_watch: zmq.Socket | None = None   # monitor of the registering DEALER
        self._scheduler_connects = 0
        self._scheduler_dropped = False                    # a disconnect seen since the last connect

    def reject(self, reason: str, sender: int | str = "?", detail: str = "") -> None:
        """Count and log a message that is dropped because it is malformed or unexpected."""
        counter = self._rejected.get(reason)
        if counter is None:
            counter = self.registry.counter("pslite_frames_rejected_total",
                                            "ps-lite messages rejected as malformed or unexpected",
                                            reason=reason)
            self._rejected[reason] = counter
        counter.inc()
        self.rejected_total += 1
        n = int(counter.value)
        if n <= 20 or (n & (n - 1)) == 0:  # rate-limited: the first 20, then powers of two
            log_event(log, "frame_rejected", logging.WARNING, reason=reason, sender=sender,
                      count=n, total=self.rejected_total, detail=detail[:200])

    def next_timestamp(self) -> int:
        with self._ts_lock:
            ts = self._ts
            self._ts = (self._ts + 1) % K_EMPTY
            return ts

    def bind(self) -> Node:
        """Bind the ROUTER and work out the address this node advertises (ps-lite §4.2)."""
        s = self.settings
        router = self._ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        # Lets a restarted peer (recovery) take over its old identity at once, even if the dead
        # connection has not been noticed yet. Receive-side only: nothing changes on the wire.
        router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        if self.curve is not None:
            self.gate = CurveGate(self._ctx, router, self.curve, self.registry)
        if s.is_scheduler:
            host = s.root_uri
            bind_host = host
            if s.use_kubernetes or not _is_ip_literal(host):
                bind_host = "0.0.0.0"  # zmq cannot bind a DNS name; peers connect to the name
            port = s.root_port
            try:
                port = self._bind_router(router, bind_host, port)
            except zmq.ZMQError as exc:
                if bind_host != "0.0.0.0" and exc.errno in (errno.EADDRNOTAVAIL, errno.EINVAL, errno.ENODEV):
                    bind_host = "0.0.0.0"  # e.g. a NATed address: listen everywhere
                    port = self._bind_router(router, bind_host, port)
                else:
                    router.close(0)
                    raise SettingError("DMLC_PS_ROOT_PORT",
                                       f"cannot bind {bind_host}:{port} for the scheduler: {exc}") from None
            self.my_node = Node(role=int(Role.SCHEDULER), id=SCHEDULER_ID, hostname=host, port=port)
        else:
            host = s.node_host
            if host is None and s.interface:
                host = interface_ipv4(s.interface)
                if host is None:
                    router.close(0)
                    raise SettingError("DMLC_INTERFACE", f"no interface with an IPv4 address matches {s.interface!r}")
            if host is None:
                host = interface_ipv4(None) or "127.0.0.1"
            bind_host = host if _is_ip_literal(host) else "0.0.0.0"
            try:
                port = self._bind_router(router, bind_host, s.port)
            except zmq.ZMQError as exc:
                if exc.errno in (errno.EADDRNOTAVAIL, errno.EINVAL, errno.ENODEV) and bind_host != "0.0.0.0":
                    log_event(log, "bind_fallback", logging.WARNING, host=bind_host, error=str(exc))
                    bind_host = "0.0.0.0"
                    port = self._bind_router(router, bind_host, s.port)
                elif s.port:
                    # ps-lite retries random ports when PORT is taken; the advertised port follows.
                    log_event(log, "port_taken", logging.WARNING, port=s.port, error=str(exc))
                    port = self._bind_router(router, bind_host, 0)
                else:
                    router.close(0)
                    raise
            self.my_node = Node(role=self.my_node.role, id=K_EMPTY, hostname=host, port=port)
        self._router = router
        self.my_node.public_key = self.curve.public.decode() if self.curve else ""
        self.bind_endpoint = f"tcp://{bind_host}:{self.my_node.port}"
        log_event(log, "van_bound", endpoint=self.bind_endpoint, advertised=f"{self.my_node.hostname}:{self.my_node.port}",
                  role=self.settings.role)
        return self.my_node

    @staticmethod
    def _bind_router(router: zmq.Socket, host: str, port: int) -> int:
        if port:
            router.bind(f"tcp://{host}:{port}")
            return port
        router.bind(f"tcp://{host}:0")
        return int(router.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1])

    def start_receiving(self) -> None:
        self._recv_thread = threading.Thread(target=self._receiving, name="ps-van-recv", daemon=True)
        self._recv_thread.start()

    def set_my_id(self, node_id: int, is_recovery: bool = False) -> None:
        self.my_node.id = node_id
        self.my_node.is_recovery = is_recovery

    def connect(self, node: Node) -> None:
        """(Re)open the DEALER for ``node.id`` to its address, with identity ``ps<my id>``."""
        self._open_peer(node.id, node.hostname, node.port, True, node.public_key)

    def connect_scheduler_anonymously(self) -> None:
        """The first DEALER to the scheduler carries no identity (ps-lite §4.3): the scheduler
        only registers ADD_NODEs from identity-less senders. Its TCP connections are watched until
        the node list comes (``scheduler_reconnected``)."""
        self._open_peer(SCHEDULER_ID, self.settings.root_uri, self.settings.root_port, False,
                        self.curve.scheduler if self.curve else "")
        # and disconnects: the first connect's event can come before the monitor (then a connect after a drop tells)
        self._scheduler_watch = self._peers[SCHEDULER_ID].sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._scheduler_connects, self._scheduler_dropped = 0, False

    def scheduler_reconnected(self) -> bool:
        """Whether the anonymous DEALER connected anew since the last call (after its first connection):
        the scheduler may have restarted, and a restarted one has lost an ADD_NODE it did not answer."""
        watch, again = self._scheduler_watch, False
        while watch is not None and watch.poll(0):
            event = parse_monitor_message(watch.recv_multipart())["event"]
            if event == zmq.EVENT_DISCONNECTED:
                self._scheduler_dropped = True
                continue
            self._scheduler_connects += 1
            again = again or self._scheduler_connects > 1 or self._scheduler_dropped
            self._scheduler_dropped = False
        return again

    def stop_watching_scheduler(self) -> None:
        watch, self._scheduler_watch = self._scheduler_watch, None
        if watch is not None:
            watch.close(0)

    def disconnect(self, node_id: int, linger_ms: int = 0) -> None:
        with self._peers_lock:
            peer = self._peers.pop(node_id, None)
        if peer is not None:
            with peer.lock:
                peer.sock.close(linger=linger_ms)

    def is_connected(self, node_id: int, hostname: str, port: int) -> bool:
        peer = self._peers.get(node_id)
        return peer is not None and peer.identified and peer.address == f"tcp://{hostname}:{port}"

    def send_once(self, node: Node, msg: Message) -> bool:
        """Send one message to an address that is not (or no longer) a peer of this node, e.g. a
        process whose id the scheduler gave to another: a DEALER of its own, closed at once with a
        short linger. Returns whether the message was queued."""
        sock = self._dealer(node.id, node.hostname, node.port, True, node.public_key)
        try:
            send_frames(sock, [pack_meta(msg.meta), *msg.data], _NOBLOCK)
            return True
        except zmq.ZMQError:
            self._m_send_fail.inc()
            return False
        finally:
            sock.close(linger=STOP_LINGER_MS)

    def _dealer(self, node_id: int, hostname: str, port: int, identity: bool, server_key: str | bytes) -> zmq.Socket:
        address = f"tcp://{hostname}:{port}"
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
        if self.curve is not None:
            if not server_key:  # the handshake will fail: the scheduler did not vouch for this peer
                log_event(log, "peer_without_key", logging.WARNING, peer=node_id, address=address)
            secure_client(sock, self.curve, server_key or self.curve.public)
        if identity:
            sock.setsockopt(zmq.IDENTITY, b"ps%d" % self.my_node.id)
            if self.settings.water_mark is not None:
                sock.setsockopt(zmq.SNDHWM, self.settings.water_mark)
        sock.connect(address)
        return sock

    def _open_peer(self, node_id: int, hostname: str, port: int, identity: bool, server_key: str | bytes) -> None:
        address = f"tcp://{hostname}:{port}"
        sock = self._dealer(node_id, hostname, port, identity, server_key)
        peer = _Peer(node_id, address, identity, sock)
        with self._peers_lock:
            old = self._peers.get(node_id)
            self._peers[node_id] = peer
        if old is not None:
            with old.lock:
                old.sock.close(0)
        if self.settings.verbose >= 1:
            log_event(log, "van_connected", peer=node_id, address=address, identity=identity)

    def send(self, msg: Message, block: bool = True) -> int:
        """Send ``msg`` to ``msg.meta.recver``. Returns the bytes sent, or -1 if it was dropped
        (no route to that id, or the peer's queue stayed full; counted and logged)."""
        meta = msg.meta
        peer = self._peers.get(meta.recver)
        if peer is None:
            self._m_send_fail.inc()
            log_event(log, "send_no_route", logging.WARNING, recver=meta.recver)
            return -1
        frames = [pack_meta(meta), *msg.data]
        flags = 0 if block else _NOBLOCK
        for _attempt in range(2):
            try:
                with peer.lock:
                    size = send_frames(peer.sock, frames, flags)
                break
            except zmq.Again:
                self._m_send_fail.inc()
                log_event(log, "send_dropped", logging.WARNING, recver=meta.recver, reason="queue_full")
                return -1
            except zmq.ZMQError as exc:
                if exc.errno != zmq.ENOTSOCK:
                    raise
                peer = self._peers.get(meta.recver)  # replaced under us (reconnect): retry once
                if peer is None:
                    return -1
        else:
            return -1
        with self._sent_lock:  # several threads send; one lock for both counters
            self._m_sent.value += 1
            self._m_sent_bytes.value += size
        if self._verbose >= 2:
            log_event(log, "van_send", recver=meta.recver, meta=meta, frames=len(frames))
        return size

    def _receiving(self) -> None:
        try:
            self._receive_loop()
        finally:
            if self._router is not None:
                self._router.close(0)

    def defer(self, fn: Callable[[], None]) -> None:
        """On the receive thread: run ``fn`` right before the thread blocks for the next message
        (used to wake waiters without making them queue for the GIL). Elsewhere: run it now."""
        if threading.get_ident() == self._recv_ident:
            self._deferred.append(fn)
        else:
            fn()

    def _receive_loop(self) -> None:
        router = self._router
        assert router is not None
        on_message = self._on_message
        deferred = self._deferred
        idents: dict[bytes, int] = {}
        verbose = self._verbose
        # secured scheduler: a node entry gets the key its sender authenticated with (User-Id)
        stamp = self.curve is not None and self.settings.is_scheduler
        self._recv_ident = threading.get_ident()
        while True:
            if deferred:
                for fn in deferred:
                    fn()
                deferred.clear()
            try:
                frames = recv_frames(router)
            except zmq.ContextTerminated:
                break
            except zmq.ZMQError as exc:
                if self._stopping.is_set():
                    break
                log_event(log, "van_recv_error", logging.ERROR, error=str(exc))
                continue
            ident = frames[0].bytes
            sender = idents.get(ident)
            if sender is None:
                sender = parse_identity(ident)
                if len(idents) < 4096:
                    idents[ident] = sender
            if len(frames) < 2:
                self.reject("no_meta_frame", sender)
                continue
            try:
                meta = unpack_meta(frames[1].bytes)
            except MalformedMeta as exc:
                self.reject("bad_meta", sender, str(exc))
                continue
            meta.sender = sender
            meta.recver = self.my_node.id
            if stamp and meta.control.node:
                for n in meta.control.node:
                    n.public_key = frames[1].get("User-Id")
            data = [memoryview(f) for f in frames[2:]]  # what Frame.buffer returns, minus its weakref cache
            self._m_recv.value += 1  # only this thread writes these two: no lock needed
            self._m_recv_bytes.value += sum(map(len, frames)) - len(ident)
            if verbose >= 2:
                log_event(log, "van_recv", sender=sender, meta=meta, frames=len(frames) - 1)
            if meta.control.cmd == _TERMINATE:
                if self._stopping.is_set():
                    break
                # ps-lite ends its receive thread on any TERMINATE; only our own stop() may.
                self.reject("foreign_terminate", sender)
                continue
            try:
                on_message(Message(meta, data))
            except Exception as exc:  # one bad message must never take the node down
                self.reject("handler_error", sender, f"{type(exc).__name__}: {exc}")
                log.exception("message handler failed")

    def start_heartbeat(self, interval: float) -> None:
        if interval <= 0 or self._hb_thread is not None:
            return
        self._hb_thread = threading.Thread(target=self._heartbeat_loop, args=(interval,),
                                           name="ps-van-heartbeat", daemon=True)
        self._hb_thread.start()

    def stop_heartbeat(self) -> None:
        """No more heartbeats (the node was replaced); everything else goes on until stop()."""
        self._hb_stop.set()

    def _heartbeat_loop(self, interval: float) -> None:
        while not self._stopping.wait(interval) and not self._hb_stop.is_set():
            node = self.my_node
            meta = Meta(customer_id=K_EMPTY, timestamp=self.next_timestamp(), recver=SCHEDULER_ID,
                        control=Control(cmd=Cmd.HEARTBEAT, node=[Node(node.role, node.id, node.hostname,
                                                                      node.port, node.is_recovery)]))
            try:
                self.send(Message(meta), block=False)
            except zmq.ZMQError:
                if self._stopping.is_set():
                    return

    def stop(self) -> None:
        """ps-lite's Van::Stop: TERMINATE to ourselves ends the receive thread; then close."""
        if self._stopped:
            return
        self._stopped = True
        self._stopping.set()
        self.stop_watching_scheduler()   # before term(), which waits for every socket
        recv = self._recv_thread
        if recv is not None and recv.is_alive() and self.my_node.id in self._peers:
            self.send(Message(Meta(customer_id=0, recver=self.my_node.id,
                                   control=Control(cmd=Cmd.TERMINATE))), block=False)
            recv.join(timeout=2.0)
        with self._peers_lock:
            peers = list(self._peers.values())
            self._peers.clear()
        for peer in peers:
            with peer.lock:
                # A short linger lets the last sends (barrier releases, LEAVE) reach the wire.
                peer.sock.close(linger=STOP_LINGER_MS)
        if recv is None and self._router is not None:
            self._router.close(0)
        # With the receive thread still blocked (no id yet, so no self-connection), term()
        # wakes it with ETERM; it closes the ROUTER itself on the way out.
        self._ctx.term()
        if recv is not None:
            recv.join(timeout=2.0)
        if self._hb_thread is not None:
            self._hb_thread.join(timeout=2.0)
