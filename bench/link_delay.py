"""A TCP relay that holds every byte for a fixed time in each direction: a long round trip without netem.

This kernel has no ``netem`` qdisc (``tc qdisc ... netem delay`` fails: "Specified qdisc kind is unknown"), so a
link's latency is made in user space instead. The relay accepts a connection, opens its own to the destination,
and forwards each chunk it reads only ``delay`` seconds after reading it, in both directions: a request and its
answer each take ``delay`` longer, and a round trip ``2 * delay`` longer (``--delay-ms`` is that one-way time,
half the round trip). Per direction, chunks wait in a FIFO with their due times and leave in the order they came;
while more than ``buffer_limit`` bytes wait (queued plus the socket's unsent buffer), the relay stops reading
from the sender, so a fast sender is slowed by TCP's own flow control rather than by unbounded memory.

Two ways to choose the destination:
* fixed: every connection goes to ``--to HOST:PORT``;
* transparent: the destination is the one the client asked for. A ``redirect`` rule of nftables in the client's
  network namespace (``redirect_ruleset``) sends the client's TCP connections to the chosen addresses to the
  relay's port on 127.0.0.1; the relay reads the address they were meant for (``SO_ORIGINAL_DST``, from the
  connection tracking of that namespace) and connects there. Its own connections carry a socket mark
  (``SO_MARK``) that the rule lets through, so they are not redirected again. This is how a sidecar proxy
  captures a pod's traffic; the programs at either end keep their addresses, ports and code.

What it does not model: each leg of the relayed connection is a local TCP connection, so TCP's congestion window
grows at local speed, not per long round trip (bulk transfers ramp up faster than on a real long link), and
bandwidth is whatever the machine gives (shape it with ``tc``'s token bucket where needed). Connection set-up
takes no extra round trip. Loss and jitter are not emulated.

    python bench/link_delay.py --delay-ms 5 --to 198.18.0.2:9000 [--listen 127.0.0.1:0]
    ip netns exec HOST python bench/link_delay.py --delay-ms 5 --transparent --listen 127.0.0.1:15001

It prints ``ready PORT`` once listening, and on SIGTERM or SIGINT one JSON line of what it relayed.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import signal
import socket
import struct
import sys

SO_ORIGINAL_DST = 80          # linux/netfilter_ipv4.h
DEFAULT_MARK = 0x1DE1         # the relay's own connections: the redirect rule lets them through
DEFAULT_BUFFER = 4 << 20      # bytes waiting per direction before the sender is held


class _Direction:
    """One direction of a relayed connection: chunks in, each out ``delay`` seconds after it came, in order."""

    def __init__(self, relay: "DelayRelay", source: "_Side", delay: float):
        self.relay, self.source, self.delay = relay, source, delay
        self.sink: asyncio.Transport | None = None
        self.queue: collections.deque = collections.deque()   # (due, bytes | None): None = end of stream
        self.queued = 0
        self.timer: asyncio.TimerHandle | None = None
        self.sink_paused = False
        self.held = False          # the source is paused by this direction
        self.ended = False         # the end of stream went out

    def push(self, data: bytes | None) -> None:
        loop = self.relay.loop
        self.queue.append((loop.time() + self.delay, data))
        if data:
            self.queued += len(data)
            self.relay.bytes[self.source.name] += len(data)
        if self.sink is not None and self.timer is None:
            self.timer = loop.call_at(self.queue[0][0], self.flush)
        self._check()

    def attach(self, sink: asyncio.Transport) -> None:
        self.sink = sink
        if self.queue and self.timer is None:
            self.timer = self.relay.loop.call_at(self.queue[0][0], self.flush)

    def flush(self) -> None:
        self.timer = None
        if self.sink is None or self.sink.is_closing():
            self.queue.clear()
            self.queued = 0
            return
        now = self.relay.loop.time()
        while self.queue and self.queue[0][0] <= now:
            _, data = self.queue.popleft()
            if data is None:
                self.ended = True
                try:
                    if self.sink.can_write_eof():
                        self.sink.write_eof()
                    else:
                        self.sink.close()
                except OSError:             # the receiver is gone already
                    self.sink.close()
                self.source.pair.maybe_close()
                break
            self.queued -= len(data)
            self.sink.write(data)
        if self.queue:
            self.timer = self.relay.loop.call_at(self.queue[0][0], self.flush)
        self._check()

    def _check(self) -> None:
        """Hold the source while too much waits; let it go once the backlog has halved."""
        waiting = self.queued + (self.sink.get_write_buffer_size() if self.sink is not None else 0)
        if not self.held and (waiting > self.relay.buffer_limit or self.sink_paused):
            self.held = True
            self.source.hold()
        elif self.held and waiting <= self.relay.buffer_limit // 2 and not self.sink_paused:
            self.held = False
            self.source.release()


class _Side(asyncio.Protocol):
    """One TCP connection of a relayed pair (the accepted one, ``in``, or the relay's own, ``out``)."""

    def __init__(self, pair: "_Pair", name: str):
        self.pair, self.name = pair, name
        self.transport: asyncio.Transport | None = None
        self.outgoing: _Direction = _Direction(pair.relay, self, pair.relay.delay)   # what this side sent
        self.incoming: _Direction | None = None    # what this side receives (the other side's outgoing)
        self.holds = 0
        self.reading_paused = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=self.pair.relay.buffer_limit // 4)
        if self.holds:
            transport.pause_reading()
            self.reading_paused = True

    def data_received(self, data: bytes) -> None:
        self.outgoing.push(data)

    def eof_received(self) -> bool:
        self.outgoing.push(None)
        return True                 # half-closed: the other direction goes on

    def connection_lost(self, exc) -> None:
        self.pair.lost(self)

    def pause_writing(self) -> None:
        if self.incoming is not None:
            self.incoming.sink_paused = True
            self.incoming._check()

    def resume_writing(self) -> None:
        if self.incoming is not None:
            self.incoming.sink_paused = False
            self.incoming._check()

    def hold(self) -> None:
        self.holds += 1
        if self.transport is not None and not self.reading_paused and not self.transport.is_closing():
            self.transport.pause_reading()
            self.reading_paused = True

    def release(self) -> None:
        self.holds = max(0, self.holds - 1)
        if self.holds == 0 and self.transport is not None and self.reading_paused and not self.transport.is_closing():
            self.transport.resume_reading()
            self.reading_paused = False


class _Pair:
    """An accepted connection and the relay's connection to its destination."""

    def __init__(self, relay: "DelayRelay"):
        self.relay = relay
        self.inside = _Side(self, "in")
        self.outside = _Side(self, "out")
        self.inside.incoming, self.outside.incoming = self.outside.outgoing, self.inside.outgoing
        self.closed = False

    def maybe_close(self) -> None:
        if self.inside.outgoing.ended and self.outside.outgoing.ended:
            self.close()

    def lost(self, side: _Side) -> None:
        """One connection is gone: what it sent still goes out after its delay, then the other one closes."""
        if not side.outgoing.ended and (not side.outgoing.queue or side.outgoing.queue[-1][1] is not None):
            side.outgoing.push(None)
        other = self.outside if side is self.inside else self.inside
        other.outgoing.queue.clear()       # nobody is left to read it
        other.outgoing.queued = 0
        other.outgoing.ended = True
        if other.transport is None or side.outgoing.sink is None:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.relay.pairs.discard(self)
        for side in (self.inside, self.outside):
            if side.transport is not None:
                side.transport.close()      # sends what is buffered, then FIN


class DelayRelay:
    """The relay's listening socket and its connections, on the running event loop.

    ``delay``: seconds each chunk waits, per direction. ``target``: (host, port) for every connection, or None
    to take each connection's original destination (transparent). ``mark``: the socket mark of its own
    connections (needs CAP_NET_ADMIN), which the transparent rule lets through."""

    def __init__(self, delay: float, *, listen: tuple[str, int] = ("127.0.0.1", 0),
                 target: tuple[str, int] | None = None, mark: int | None = None,
                 buffer_limit: int = DEFAULT_BUFFER):
        if delay < 0:
            raise ValueError(f"delay must be >= 0 s, got {delay}")
        self.delay, self.listen, self.target, self.mark = delay, listen, target, mark
        self.buffer_limit = buffer_limit
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: asyncio.AbstractServer | None = None
        self.pairs: set[_Pair] = set()
        self.connections = 0
        self.failed = 0
        self.bytes = {"in": 0, "out": 0}   # from the clients, from the destinations

    @property
    def port(self) -> int:
        return self.server.sockets[0].getsockname()[1]

    async def start(self) -> "DelayRelay":
        self.loop = asyncio.get_running_loop()
        self.server = await self.loop.create_server(self._accepted, self.listen[0], self.listen[1],
                                                    reuse_address=True, backlog=512)
        return self

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        for pair in list(self.pairs):
            pair.close()

    def stats(self) -> dict:
        return {"delay_s": self.delay, "connections": self.connections, "failed": self.failed,
                "open": len(self.pairs), "bytes_from_clients": self.bytes["in"],
                "bytes_from_destinations": self.bytes["out"]}

    def _accepted(self) -> _Side:
        pair = _Pair(self)
        self.pairs.add(pair)
        self.connections += 1
        self.loop.create_task(self._connect(pair))
        return pair.inside

    async def _connect(self, pair: _Pair) -> None:
        while pair.inside.transport is None:   # connection_made runs before this task, but be sure
            await asyncio.sleep(0)
        try:
            host, port = self.target or original_destination(pair.inside.transport.get_extra_info("socket"))
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.mark is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, self.mark)
            try:
                await self.loop.sock_connect(sock, (host, port))
            except BaseException:
                sock.close()
                raise
            await self.loop.create_connection(lambda: pair.outside, sock=sock)
        except (OSError, ValueError):
            self.failed += 1
            pair.close()
            return
        if pair.closed:                        # the client left while the relay was connecting
            pair.outside.transport.close()
            return
        pair.inside.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pair.inside.outgoing.attach(pair.outside.transport)
        pair.outside.outgoing.attach(pair.inside.transport)


def original_destination(sock) -> tuple[str, int]:
    """Where a redirected connection was going (``SO_ORIGINAL_DST`` of netfilter's connection tracking)."""
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack_from("!2xH4s", raw)
    return socket.inet_ntoa(packed), port


def redirect_ruleset(table: str, addresses: list[str], relay_port: int, mark: int = DEFAULT_MARK,
                     ports: list[int] | None = None) -> str:
    """nftables rules for one network namespace: its new TCP connections to ``addresses`` (to ``ports`` only, if
    given) go to the relay on 127.0.0.1:``relay_port``; the relay's own (marked ``mark``) go out as they are.
    ``nft -f -`` reads it; ``delete table ip TABLE`` undoes it."""
    if not addresses:
        raise ValueError("no addresses to redirect")
    dport = f" tcp dport {{ {', '.join(map(str, ports))} }}" if ports else ""
    return (f"table ip {table} {{\n"
            f"  chain output {{\n"
            f"    type nat hook output priority -100; policy accept;\n"
            f"    meta mark {mark:#x} return\n"
            f"    ip daddr {{ {', '.join(addresses)} }} meta l4proto tcp{dport} redirect to :{relay_port}\n"
            f"  }}\n"
            f"}}\n")


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


async def _serve(args) -> int:
    relay = await DelayRelay(args.delay_ms / 1000.0, listen=args.listen, target=args.to,
                             mark=args.mark if (args.transparent or args.mark_always) else None,
                             buffer_limit=args.buffer).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"ready {relay.port}", flush=True)
    await stop.wait()
    print(json.dumps(relay.stats()), flush=True)
    await relay.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delay-ms", type=float, required=True, help="one-way delay: half the round trip added")
    ap.add_argument("--listen", type=_address, default=("127.0.0.1", 0), help="HOST:PORT (127.0.0.1:0)")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--to", type=_address, help="relay every connection to HOST:PORT")
    where.add_argument("--transparent", action="store_true",
                       help="relay each connection to its original destination (after an nftables redirect)")
    ap.add_argument("--mark", type=lambda s: int(s, 0), default=DEFAULT_MARK,
                    help=f"socket mark of the relay's own connections in transparent mode ({DEFAULT_MARK:#x})")
    ap.add_argument("--mark-always", action="store_true", help="mark them with --to as well")
    ap.add_argument("--buffer", type=int, default=DEFAULT_BUFFER,
                    help=f"bytes waiting per direction before the sender is held ({DEFAULT_BUFFER})")
    args = ap.parse_args(argv)
    return asyncio.run(_serve(args))


if __name__ == "__main__":
    sys.exit(main())
