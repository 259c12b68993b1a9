"""The delaying relay of bench/link_delay.py: a round trip through it takes about twice its one-way delay, and
every byte arrives, in order, in both directions."""
from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from link_delay import DelayRelay, redirect_ruleset  # noqa: E402


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1 << 16):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _through_relay(delay: float, payload: bytes) -> tuple[float, bytes]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    relay = await DelayRelay(delay, target=("127.0.0.1", server.sockets[0].getsockname()[1]),
                             buffer_limit=256 << 10).start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
        t0 = time.monotonic()
        writer.write(b"x")
        assert await reader.readexactly(1) == b"x"
        round_trip = time.monotonic() - t0

        async def send():
            for i in range(0, len(payload), 100_000):
                writer.write(payload[i:i + 100_000])
                await writer.drain()
            writer.write_eof()
        sender = asyncio.create_task(send())
        back = await reader.read(-1)   # until the relay passes on the echo server's end of stream
        await sender
        writer.close()
        return round_trip, back
    finally:
        await relay.close()
        server.close()


def test_round_trip_takes_twice_the_delay_and_every_byte_arrives_in_order():
    payload = os.urandom(3 << 20)    # 12x the relay's buffer limit: back-pressure must hold the sender
    round_trip, back = asyncio.run(_through_relay(0.05, payload))
    assert 0.05 <= round_trip <= 0.15, round_trip    # 2 x 50 ms, +- 50 %
    assert back == payload


def test_without_delay_the_round_trip_is_short():
    round_trip, back = asyncio.run(_through_relay(0.0, b"abc" * 1000))
    assert round_trip < 0.05, round_trip
    assert back == b"abc" * 1000


def test_redirect_ruleset_lets_the_relay_through_first():
    rules = redirect_ruleset("t", ["198.18.7.2", "198.18.7.3"], 15001, mark=0x1DE1)
    assert rules.index("meta mark 0x1de1 return") < rules.index("redirect to :15001")
    assert "ip daddr { 198.18.7.2, 198.18.7.3 }" in rules
