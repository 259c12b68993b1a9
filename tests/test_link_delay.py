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


def _free_lab_id(ids: range) -> int:
    """An id whose bridge and hosts do not exist now (a lab started on a used id would remove the other one)."""
    import random
    import subprocess
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    free = [i for i in ids if f"lv{i}br" not in links and f"lv{i}h" not in spaces]
    assert free, f"every lab id in {ids} is in use"
    return random.choice(free)


def test_transparent_relay_delays_a_hosts_connections_to_another_host():
    """Two lab hosts: host 1's connection to an echo server on host 2 goes through host 1's relay (the nftables
    redirect and SO_ORIGINAL_DST), which connects on past its own rule: the echo comes back from host 2, a
    round trip later."""
    import subprocess
    from online.deployment.netns_lab import NetnsLab, lab_support_problem

    problem = lab_support_problem()
    assert problem is None, problem
    bench = Path(__file__).resolve().parents[1] / "bench"
    with NetnsLab(2, lab_id=_free_lab_id(range(100, 200))) as lab:
        near, far = lab.hosts
        echo = subprocess.Popen([*lab.exec_prefix(far.name), sys.executable, "-c",
                                 "import socket\ns = socket.create_server(('0.0.0.0', 9000))\nprint('up', flush=True)\n"
                                 "c, _ = s.accept()\nwhile d := c.recv(65536):\n    c.sendall(d)\n"],
                                stdout=subprocess.PIPE, text=True)
        relay = subprocess.Popen([*lab.exec_prefix(near.name), sys.executable, str(bench / "link_delay.py"),
                                  "--delay-ms", "25", "--transparent", "--listen", "127.0.0.1:15001"],
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert echo.stdout.readline().strip() == "up"
            assert relay.stdout.readline().startswith("ready")
            subprocess.run([*lab.exec_prefix(near.name), "nft", "-f", "-"], check=True, text=True,
                           input=redirect_ruleset("lvdelaytest", [far.address], 15001))
            client = subprocess.run([*lab.exec_prefix(near.name), sys.executable, "-c", f"""
import socket, statistics, time
c = socket.create_connection(({far.address!r}, 9000))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
times = []
for i in range(5):
    t = time.monotonic()
    c.sendall(b'ping%d' % i)
    assert c.recv(16) == b'ping%d' % i
    times.append(time.monotonic() - t)
print(statistics.median(times))
"""], capture_output=True, text=True, timeout=60)
            assert client.returncode == 0, client.stderr
            assert 0.025 <= float(client.stdout) <= 0.075, client.stdout   # 2 x 25 ms, +- 50 %
        finally:
            relay.terminate()
            echo.kill()
            stats = relay.communicate(timeout=10)[0]
            echo.communicate(timeout=10)
        assert '"connections": 1' in stats and '"failed": 0' in stats, stats
