"""Authenticated, encrypted ps traffic with CurveZMQ (an extension; C++ ps-lite cannot join).

A node holds a key pair (``PS_CURVE_SECRET_KEY_FILE``, a zmq certificate) and the cluster's
allowed public keys (``PS_CURVE_PUBLIC_KEYS_FILE``: "KEY NAME" lines; NAME scheduler is the
scheduler's). Its ROUTER is a curve server with its own key; its DEALERs are curve clients
with the peer's key as server key. The scheduler takes a node's key from the handshake of its
ADD_NODE (not from the message) and hands it on in node lists (PBNode field 15, secured
clusters only). A ZAP handler admits allowed keys only, a monitor sees handshakes that fail
before it (a plain ps-lite node): refused peers never reach the decoder, and are counted
(``pslite_connections_refused_total{reason}``) and logged.

    python -m ps_bridge.curve keygen DIR scheduler server worker   # DIR/<name>.key_secret, DIR/cluster.keys
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from dataclasses import dataclass

import zmq
import zmq.auth
import zmq.utils.z85
from zmq.utils.monitor import parse_monitor_message

from ps_bridge.metrics import Registry
from ps_bridge.settings import NodeSettings, SettingError
from ps_bridge.structured_logging import log_event

log = logging.getLogger("ps_bridge.curve")
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
DOMAIN = b"ps"
# a peer that speaks no curve (plain ps-lite) or bad crypto; or one that hung up mid-handshake (a TCP
# health probe, or a plain peer that noticed the mismatch first): counted, logged at debug only
_FAILURES = {zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "not_curve", zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "hung_up"}


@dataclass(frozen=True)
class CurveKeys:  # Z85: this node's pair, the cluster's public keys, the scheduler's public key
    public: bytes
    secret: bytes
    allowed: frozenset[bytes]
    scheduler: bytes


def _is_key(text: bytes) -> bool:  # Z85 of 32 bytes
    return len(text) == 40 and all(33 <= c < 127 for c in text)


def load_keys(settings: NodeSettings) -> CurveKeys | None:
    """The node's curve keys, or None for a plain (ps-lite compatible) node."""
    pair, allowed_file = settings.curve_secret_key_file, settings.curve_public_keys_file
    if not pair and not allowed_file:
        return None
    try:
        public, secret = zmq.auth.load_certificate(pair)
    except (OSError, ValueError) as exc:
        raise SettingError("PS_CURVE_SECRET_KEY_FILE", f"cannot read a key pair from {pair}: {exc}") from None
    if not secret or not _is_key(secret) or not _is_key(public):
        raise SettingError("PS_CURVE_SECRET_KEY_FILE", f"{pair} holds no public-key and secret-key pair")
    allowed, scheduler = set(), b""
    try:
        lines = open(allowed_file, "rb").read().splitlines()
    except OSError as exc:
        raise SettingError("PS_CURVE_PUBLIC_KEYS_FILE", f"cannot read {allowed_file}: {exc.strerror}") from None
    for number, line in enumerate(lines, 1):
        words = line.split()
        if not words or words[0] == b"#" or line.startswith(b"# "):  # '#' alone is a comment; Z85 has '#'
            continue
        if not _is_key(words[0]):
            raise SettingError("PS_CURVE_PUBLIC_KEYS_FILE", f"{allowed_file}:{number}: not a 40-character Z85 key")
        allowed.add(words[0])
        if words[1:2] == [b"scheduler"]:
            scheduler = words[0]
    if public not in allowed:
        raise SettingError("PS_CURVE_PUBLIC_KEYS_FILE", f"does not allow this node's own public key {public.decode()}")
    if not scheduler and not settings.is_scheduler:
        raise SettingError("PS_CURVE_PUBLIC_KEYS_FILE", "names no key 'scheduler' (the key this node connects to)")
    return CurveKeys(public, secret, frozenset(allowed), scheduler or public)


def secure_client(sock: zmq.Socket, keys: CurveKeys, server_key: str | bytes) -> None:
    sock.curve_publickey, sock.curve_secretkey = keys.public, keys.secret
    sock.curve_serverkey = server_key.encode() if isinstance(server_key, str) else server_key


class CurveGate:
    """Makes the ROUTER a curve server; ZAP and monitor in one thread, which ends with the context."""

    def __init__(self, ctx: zmq.Context, router: zmq.Socket, keys: CurveKeys, registry: Registry):
        self.keys, self.registry, self._counters = keys, registry, {}
        self._zap = ctx.socket(zmq.REP)
        self._zap.bind(ZAP_ENDPOINT)
        self._monitor = router.get_monitor_socket(sum(_FAILURES))
        router.curve_server, router.curve_secretkey, router.zap_domain = True, keys.secret, DOMAIN
        threading.Thread(target=self._serve, name="ps-curve-gate", daemon=True).start()

    def _refuse(self, reason: str, **fields) -> None:
        counter = self._counters.get(reason)
        if counter is None:
            counter = self._counters[reason] = self.registry.counter(
                "pslite_connections_refused_total", "ps connections refused by CurveZMQ", reason=reason)
        counter.inc()
        n = int(counter.value)
        if n <= 20 or (n & (n - 1)) == 0:  # rate-limited like rejected frames
            log_event(log, "connection_refused", logging.DEBUG if reason == "hung_up" else logging.WARNING,
                      reason=reason, count=n, **fields)

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._zap, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        try:
            while True:
                for sock, _ in poller.poll():
                    if sock is self._zap:
                        self._answer(self._zap.recv_multipart())
                    else:
                        event = parse_monitor_message(self._monitor.recv_multipart())
                        self._refuse(_FAILURES.get(event["event"], "hung_up"), error=event["value"])
        except zmq.ContextTerminated:
            pass
        finally:
            self._zap.close(0)
            self._monitor.close(0)

    def _answer(self, request: list[bytes]) -> None:
        version, request_id, _domain, address, _identity, mechanism = request[:6]
        key = zmq.utils.z85.encode(request[6]) if mechanism == b"CURVE" and len(request) > 6 else b""
        ok = key in self.keys.allowed
        if not ok:
            self._refuse("key_not_allowed", address=address.decode(errors="replace"), key=key.decode() or "-")
        self._zap.send_multipart([version, request_id, b"200" if ok else b"400",
                                  b"OK" if ok else b"key not allowed", key if ok else b"", b""])


def keygen(directory: str, names: list[str]) -> str:
    """A key pair per name (``<name>.key_secret``, ``<name>.key``) and ``cluster.keys`` naming them all."""
    os.makedirs(directory, exist_ok=True)
    lines = []
    for name in names:
        public_file, _ = zmq.auth.create_certificates(directory, name)  # the secret file is 0600
        lines.append(f"{zmq.auth.load_certificate(public_file)[0].decode()} {name}\n")
    with open(os.path.join(directory, "cluster.keys"), "a") as f:
        f.writelines(lines)
    return f.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ps_bridge.curve", description="CurveZMQ keys for ps nodes")
    gen = parser.add_subparsers(dest="command", required=True).add_parser(
        "keygen", help="write a key pair per name and append their public keys to DIRECTORY/cluster.keys")
    gen.add_argument("directory")
    gen.add_argument("names", nargs="+", help="e.g. scheduler server worker frontend (one must be scheduler)")
    args = parser.parse_args(argv)
    print(keygen(args.directory, args.names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
