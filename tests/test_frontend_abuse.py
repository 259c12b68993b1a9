"""The front end under a hostile client, written here: slow headers, slow and huge bodies, oversized
headers, 10k concurrent connections from one process; and the optional bearer token and TLS.

Every test runs a real ``livevec frontend`` process and talks to it over raw sockets; the
well-behaved client comes from another loopback address (127.0.0.2), as another host would.
"""
from __future__ import annotations

import json
import os
import resource
import socket
import ssl
import subprocess
import sys
import time

import pytest

from online.learner.word2vec_format import write_binary
from tests.frontend_process import REPO, clean_env, running_frontend
from tests.support.http import get
from tests.test_frontend_api import planted_model


@pytest.fixture
def model(tmp_path):
    words, vectors = planted_model()
    path = tmp_path / "vectors.bin"
    write_binary(path, words, vectors)
    return path, words


def _start(model, **env):
    return running_frontend(["--model", str(model[0])], clean_env(**{k: str(v) for k, v in env.items()}))


def _addr(url: str) -> tuple[str, int]:
    host, port = url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
    return host, int(port)


def _raw(url: str, data: bytes, source: str = "127.0.0.2", timeout: float = 5.0) -> socket.socket:
    s = socket.socket()
    s.settimeout(timeout)
    s.bind((source, 0))
    s.connect(_addr(url))
    if data:
        s.sendall(data)
    return s


def _read_all(s: socket.socket) -> bytes:
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (ConnectionResetError, socket.timeout):
        pass
    return out


def _ask(url: str, path: str, headers: dict | None = None, context=None) -> tuple[int, dict, float]:
    """A well-behaved client (from 127.0.0.2): status (0: no answer), JSON body ({} if none), seconds taken.
    TLS with ``context`` only: without one it speaks plain HTTP, whatever the port serves."""
    address = url.split("://", 1)[1].rstrip("/")
    answer = get(f"{'https' if context else 'http'}://{address}{path}", headers=headers, context=context,
                 tls_name="localhost", source="127.0.0.2")
    try:
        body = json.loads(answer.body)
    except ValueError:
        body = {}
    return answer.status, body, answer.seconds


def _wait_ready(url, context=None):
    deadline = time.monotonic() + 30
    while _ask(url, "/ready", context=context)[0] != 200:
        assert time.monotonic() < deadline, "the front end never became ready"
        time.sleep(0.1)


def _open_fds(proc) -> int:
    return len(os.listdir(f"/proc/{proc.pid}/fd"))


def _metric(url, name, **labels) -> float:
    s = _raw(url, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    text = _read_all(s).decode().split("\r\n\r\n", 1)[1]
    s.close()
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and all(w in line for w in want))


@pytest.mark.slow
def test_slow_headers_are_cut_off_while_others_are_served(model):
    with _start(model, LIVEVEC_HEADER_TIMEOUT=2) as (url, proc):
        _wait_ready(url)
        word = model[1][0]
        slow = [_raw(url, b"GET /v1/similar?word=" + word.encode() + b" HTTP/1.1\r\nHost: x\r\n", source="127.0.0.1")
                for _ in range(300)]
        t0, cut = time.monotonic(), set()
        while len(cut) < len(slow) and time.monotonic() - t0 < 8:
            for i, s in enumerate(slow):           # one more header byte per connection, twice a second
                if i not in cut:
                    try:
                        s.send(b"X")
                    except OSError:
                        cut.add(i)
            status, _, took = _ask(url, f"/v1/similar?word={word}&k=3")
            assert status == 200 and took < 1.0, (status, took)
            time.sleep(0.5)
        assert len(cut) == len(slow), f"{len(slow) - len(cut)} slow connections still open after 8 s"
        assert time.monotonic() - t0 < 6.5      # the 2 s deadline, plus aiohttp's rounding and our pacing
        for s in slow:
            s.close()


@pytest.mark.slow
def test_huge_slow_and_oversized_requests_are_refused_early(model):
    with _start(model, LIVEVEC_MAX_BODY_BYTES=65536, LIVEVEC_BODY_TIMEOUT=1.5) as (url, proc):
        _wait_ready(url)
        post = b"POST /v1/similar HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        # a declared 200 MB body: refused on its head, before any of it is sent
        s = _raw(url, post + b"Content-Length: 200000000\r\n\r\n")
        reply = _read_all(s)
        assert reply.startswith(b"HTTP/1.1 413 ") and b"body_too_large" in reply, reply[:200]
        # a chunked body that never ends: refused once past the limit; the server stops reading
        s = _raw(url, post + b"Transfer-Encoding: chunked\r\n\r\n")
        sent, chunk = 0, b"%x\r\n%s\r\n" % (16384, b" " * 16384)
        try:
            while sent < 50_000_000:
                s.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        assert sent < 20_000_000, f"the server kept reading: {sent} bytes"
        # a slow body: the request is answered 408 at the body deadline and the connection closed
        t0 = time.monotonic()
        s = _raw(url, post + b"Content-Length: 100\r\n\r\n{\"words\"")
        reply = _read_all(s)
        assert reply.startswith(b"HTTP/1.1 408 ") and b"body_timeout" in reply, reply[:200]
        assert 1.4 < time.monotonic() - t0 < 4
        # an oversized header field and an oversized request line: 4xx from the parser, closed
        for head in (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n",
                     b"GET /v1/similar?word=" + b"a" * 200_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"):
            reply = _read_all(_raw(url, head))
            assert reply[:5] == b"HTTP/" and reply[9:12] in (b"400", b"431", b"414"), reply[:200]
        assert _ask(url, "/health")[0] == 200 and proc.poll() is None


@pytest.mark.slow
def test_too_many_requests_in_flight_get_a_503_with_retry_after(model):
    with _start(model, LIVEVEC_MAX_CONCURRENT_REQUESTS=1, LIVEVEC_BODY_TIMEOUT=2) as (url, proc):
        _wait_ready(url)
        word = model[1][0]
        # a request in flight: its handler waits for a body that trickles
        busy = _raw(url, b"POST /v1/similar HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{", source="127.0.0.1")
        time.sleep(0.3)
        status, body, _ = _ask(url, f"/v1/similar?word={word}")
        assert status == 503 and body["error"] == "overloaded", (status, body)
        assert _ask(url, "/health")[0] == 200 and _ask(url, "/ready")[0] == 200     # exempt
        assert _read_all(busy).startswith(b"HTTP/1.1 408 ")
        assert _ask(url, f"/v1/similar?word={word}")[0] == 200
        assert _metric(url, "livevec_frontend_refused_total", reason="overloaded") >= 1


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ten_thousand_connections_from_one_process_do_not_starve_other_clients(model):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 10_300:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 20_000), hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 10_300, "this machine allows too few open files"
    with _start(model, LIVEVEC_MAX_CONNECTIONS=3000, LIVEVEC_MAX_CONNECTIONS_PER_CLIENT=1000,
                LIVEVEC_HEADER_TIMEOUT=15) as (url, proc):
        _wait_ready(url)
        word = model[1][0]
        baseline = _open_fds(proc)
        flood, failed = [], 0
        t0 = time.monotonic()
        for _ in range(10_000):
            s = socket.socket()
            s.settimeout(10)
            try:
                s.connect(_addr(url))
                flood.append(s)
            except OSError:
                failed += 1
                s.close()
        connect_s = time.monotonic() - t0
        assert len(flood) == 10_000, f"{failed} connections failed"
        # the process holds at most the per-client share of them; everyone beyond got a 503 and was closed
        status, body, took = _ask(url, f"/v1/similar?word={word}&k=3")     # another client: served
        assert status == 200 and took < 2.0, (status, body, took)
        assert _ask(url, "/health")[0] == 200
        held = _open_fds(proc) - baseline
        assert held <= 1000 + 20, held
        turned_away = 0
        for s in flood[-2000:]:        # the last ones came after the share was used up
            s.settimeout(5)
            reply = _read_all(s)
            turned_away += reply.startswith(b"HTTP/1.1 503 ") and b"too_many_connections" in reply
        assert turned_away == 2000
        assert _metric(url, "livevec_frontend_refused_total", reason="too_many_connections") >= 9000
        rss_kb = int(next(line.split()[1] for line in open(f"/proc/{proc.pid}/status") if line.startswith("VmRSS")))
        for s in flood:
            s.close()
        print(f"10k connections in {connect_s:.1f} s; front end held {held} fds, RSS {rss_kb // 1024} MB")
        assert proc.poll() is None


def _cert(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def test_the_bearer_token_guards_the_api_but_not_the_probes_and_is_never_shown(model, tmp_path):
    token = "s3cr3t-token-0123456789abcdef"
    (tmp_path / "token").write_text(token + "\n")
    with _start(model, LIVEVEC_API_TOKEN_FILE=tmp_path / "token") as (url, proc):
        _wait_ready(url)
        word = model[1][0]
        for path in ("/health", "/ready", "/openapi.json", "/"):
            assert _ask(url, path)[0] == 200, path
        for path in (f"/v1/similar?word={word}", "/v1/stats", "/metrics"):
            assert _ask(url, path)[0] == 401, path
            assert _ask(url, path, {"Authorization": "Bearer " + token[:-1] + "X"})[0] == 401, path
            assert _ask(url, path, {"Authorization": token})[0] == 401, path
            assert _ask(url, path, {"Authorization": "Bearer " + token})[0] == 200, path
        stats = _ask(url, "/v1/stats", {"Authorization": "Bearer " + token})[1]
        assert token not in json.dumps(stats)
        proc.terminate()
        out, err = proc.communicate(timeout=10)
        assert token not in out + err and "api_token=True" in err
    flag = subprocess.run([sys.executable, "-m", "online.cli", "frontend", "--model", str(model[0]),
                           "--api-token", token], cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert flag.returncode == 2 and "unrecognized arguments: --api-token" in flag.stderr     # never a flag
    with _start(model, LIVEVEC_API_TOKEN=token) as (url, proc):     # or the variable
        _wait_ready(url)
        assert _ask(url, "/v1/stats")[0] == 401 and _ask(url, "/v1/stats", {"Authorization": f"Bearer {token}"})[0] == 200


def test_tls_where_no_proxy_terminates_it(model, tmp_path):
    cert, key = _cert(tmp_path)
    with _start(model, LIVEVEC_TLS_CERT_FILE=cert, LIVEVEC_TLS_KEY_FILE=key) as (url, proc):
        assert url.startswith("https://")
        context = ssl.create_default_context(cafile=str(cert))
        _wait_ready(url, context)
        assert _ask(url, f"/v1/similar?word={model[1][0]}", context=context)[0] == 200
        assert _ask(url, "/health")[0] == 0                     # plain HTTP on the TLS port gets no answer
        with pytest.raises(ssl.SSLCertVerificationError):       # and a client that does not trust it refuses
            _ask(url, "/health", context=ssl.create_default_context())
