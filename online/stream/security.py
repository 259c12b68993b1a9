"""Kafka over TLS and SASL for every livevec client: aiokafka's options, and a check at start.

``KafkaSecurity`` (``online.stream.settings``) says what the operator asked for; this module turns it into the
keyword arguments of ``AIOKafkaConsumer``, ``AIOKafkaProducer`` and ``AIOKafkaAdminClient``
(``client_options``), and checks it against the brokers before a client does anything (``check_kafka``).

Why a check of its own: aiokafka retries a failed bootstrap and then reports "Unable to bootstrap from
[...]", whatever the cause. A wrong password, a CA that does not sign the broker's certificate or a
certificate for another host are configuration errors. They do not heal by retrying, and a worker that
started anyway would join its consumer group and hold partitions it cannot read. So the check opens one
connection to a bootstrap broker (TLS handshake, ApiVersions, SASL), asks for the cluster's brokers, and
connects to each of them the same way. It raises ``SettingError`` naming the setting to fix, which makes
``livevec`` exit with code 2 as for any configuration error. A broker that cannot be reached at all (refused,
timed out) is not a configuration error: that raises ``KafkaUnreachable``.

The password is handed to aiokafka and nowhere else: ``KafkaSecurity`` keeps it in a ``Secret`` (its repr is
``Secret(***)``), and no message of this module includes it.
"""
from __future__ import annotations

import asyncio
import logging
import ssl

from online.stream.settings import KafkaSecurity
from ps_bridge.settings import SettingError
from ps_bridge.structured_logging import log_event

logger = logging.getLogger("livevec.kafka")

# OpenSSL's verify codes that mean "no trusted CA signs this certificate"
_UNTRUSTED = {2, 18, 19, 20, 21, 27}   # unable to get issuer, self-signed, self-signed in chain, no local issuer...
_HOSTNAME_MISMATCH = {62, 64}         # host name, IP address


class KafkaUnreachable(ConnectionError):
    """No bootstrap broker accepted a connection (not a configuration error: it may come back)."""


def ssl_context(security: KafkaSecurity) -> ssl.SSLContext | None:
    """The client's TLS context: the CA file (or the system's trust store), hostname checking unless turned
    off, the client certificate for mutual TLS. None without TLS."""
    if not security.uses_ssl:
        return None
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                             cafile=str(security.ssl_ca_file) if security.ssl_ca_file else None)
    except (ssl.SSLError, OSError) as exc:
        raise SettingError("LIVEVEC_KAFKA_SSL_CA_FILE",
                           f"{security.ssl_ca_file} holds no PEM CA certificate ({exc})") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = security.check_hostname
    context.verify_mode = ssl.CERT_REQUIRED
    if security.ssl_cert_file:
        try:
            context.load_cert_chain(str(security.ssl_cert_file),
                                    str(security.ssl_key_file) if security.ssl_key_file else None)
        except (ssl.SSLError, OSError) as exc:
            name = "LIVEVEC_KAFKA_SSL_KEY_FILE" if "KEY" in str(exc).upper() and security.ssl_key_file \
                else "LIVEVEC_KAFKA_SSL_CERT_FILE"
            raise SettingError(name, f"cannot load the client certificate {security.ssl_cert_file} and key "
                                     f"{security.ssl_key_file or '(in the same file)'}: {exc}") from None
    return context


def client_options(security: KafkaSecurity) -> dict:
    """Keyword arguments for any aiokafka client (consumer, producer, admin)."""
    options: dict = {"security_protocol": security.protocol}
    if security.uses_ssl:
        options["ssl_context"] = ssl_context(security)
    if security.uses_sasl:
        options.update(sasl_mechanism=security.sasl_mechanism, sasl_plain_username=security.sasl_username,
                       sasl_plain_password=security.sasl_password.reveal())
    return options


def _hosts(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        out.append((host.strip("[]"), int(port)))
    return out


def _diagnose(exc: BaseException, security: KafkaSecurity, where: str) -> SettingError | None:
    """The setting to blame for a failed connection, or None when the broker is just not there."""
    from aiokafka import errors as kafka_errors

    protocol = f"LIVEVEC_KAFKA_SECURITY_PROTOCOL={security.protocol}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        if exc.verify_code in _HOSTNAME_MISMATCH:
            return SettingError("LIVEVEC_KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM",
                                f"the certificate of the broker at {where} does not name that host "
                                f"({exc.verify_message}); connect by a name it holds, or set none to skip the "
                                f"check")
        if exc.verify_code in _UNTRUSTED:
            ca = security.ssl_ca_file or "the system's trust store (no CA file set)"
            return SettingError("LIVEVEC_KAFKA_SSL_CA_FILE",
                                f"the certificate of the broker at {where} is not signed by a CA in {ca} "
                                f"({exc.verify_message})")
        return SettingError("LIVEVEC_KAFKA_SSL_CA_FILE",
                            f"the certificate of the broker at {where} is not valid: {exc.verify_message}")
    if isinstance(exc, ssl.SSLError):
        text = str(exc)
        if "CERTIFICATE_REQUIRED" in text.upper() or "CERTIFICATE REQUIRED" in text.upper() \
                or "BAD_CERTIFICATE" in text.upper() or "UNKNOWN_CA" in text.upper() \
                or "CERTIFICATE_UNKNOWN" in text.upper():   # alerts the broker sent: it refused ours
            return SettingError("LIVEVEC_KAFKA_SSL_CERT_FILE",
                                f"the broker at {where} refused the client certificate "
                                f"({security.ssl_cert_file or 'none given'}): {exc.reason or text}")
        return SettingError("LIVEVEC_KAFKA_SECURITY_PROTOCOL",
                            f"TLS with the broker at {where} failed ({exc.reason or text}); is it a TLS listener?")
    if isinstance(exc, kafka_errors.SaslAuthenticationFailed):
        return SettingError(security.password_setting,
                            f"the broker at {where} refused user {security.sasl_username!r} with "
                            f"{security.sasl_mechanism}: wrong username (LIVEVEC_KAFKA_SASL_USERNAME) or password")
    if isinstance(exc, kafka_errors.UnsupportedSaslMechanismError):
        return SettingError("LIVEVEC_KAFKA_SASL_MECHANISM", f"the broker at {where}: {exc}")
    if isinstance(exc, kafka_errors.IllegalSaslStateError):
        return SettingError("LIVEVEC_KAFKA_SECURITY_PROTOCOL",
                            f"the broker at {where} does not expect SASL ({protocol}); is it a SASL listener?")
    if isinstance(exc, (kafka_errors.KafkaConnectionError, ConnectionResetError, BrokenPipeError,
                        asyncio.IncompleteReadError)):
        # The TCP connection was made (a refused one is an OSError below), then the broker hung up during the
        # handshake: it speaks another protocol on this port (TLS against plaintext or the reverse).
        return SettingError("LIVEVEC_KAFKA_SECURITY_PROTOCOL",
                            f"the broker at {where} closed the connection during the handshake; does that "
                            f"listener speak {security.protocol}? ({type(exc).__name__}: {exc})")
    if isinstance(exc, kafka_errors.KafkaError):
        return SettingError("LIVEVEC_KAFKA_SECURITY_PROTOCOL", f"the broker at {where}: {type(exc).__name__}: {exc}")
    return None


async def _tls_alert(host: str, port: int, security: KafkaSecurity, timeout: float) -> ssl.SSLError | None:
    """Why a TLS broker hung up, if it said so. Under TLS 1.3 a broker refuses a client certificate after the
    client has finished its side of the handshake, so the client only sees the connection close; the alert
    (certificate required, unknown CA) arrives on the first read, which this bare handshake makes."""
    context = ssl_context(security)
    if context is None:
        return None
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=context, server_hostname=host), timeout)
        try:
            # ApiVersions v0 (key 18, version 0, correlation 1, no client id): any Kafka listener answers it.
            writer.write(bytes.fromhex("0000000a" "00120000" "00000001" "ffff"))
            await asyncio.wait_for(reader.read(4), timeout)
        finally:
            writer.close()
    except ssl.SSLError as exc:
        return exc
    except (OSError, asyncio.TimeoutError):
        return None
    return None


async def _connect(host: str, port: int, options: dict, client_id: str, timeout: float):
    from aiokafka.conn import create_conn

    return await asyncio.wait_for(create_conn(host, port, client_id=client_id,
                                              request_timeout_ms=int(timeout * 1000), **options), timeout)


async def check_kafka(bootstrap: str, security: KafkaSecurity, *, client_id: str = "livevec",
                      timeout: float = 15.0) -> list[str]:
    """Connect as the clients will, to a bootstrap broker and then to every broker it lists; return their
    addresses. ``SettingError`` names the setting at fault; ``KafkaUnreachable`` when no broker answers."""
    from aiokafka.protocol.metadata import MetadataRequest

    options = client_options(security)
    unreachable: list[str] = []
    for host, port in _hosts(bootstrap):
        where = f"{host}:{port}"
        try:
            conn = await _connect(host, port, options, client_id, timeout)
        except (OSError, asyncio.TimeoutError, Exception) as exc:  # noqa: BLE001 - sorted out by _diagnose
            problem = _diagnose(exc, security, where)
            if problem is not None and problem.setting == "LIVEVEC_KAFKA_SECURITY_PROTOCOL":
                alert = await _tls_alert(host, port, security, timeout)
                problem = _diagnose(alert, security, where) if alert is not None else problem
            if problem is not None:
                raise problem from None
            unreachable.append(f"{where}: {type(exc).__name__}: {exc}")
            continue
        try:
            metadata = await asyncio.wait_for(conn.send(MetadataRequest([])), timeout)
        except Exception as exc:  # noqa: BLE001
            problem = _diagnose(exc, security, where)
            if problem is not None:
                raise problem from None
            unreachable.append(f"{where}: {type(exc).__name__}: {exc}")
            continue
        finally:
            conn.close()
        brokers = [f"{b[1]}:{b[2]}" for b in metadata.brokers]
        for address in brokers:
            if address == where:
                continue
            b_host, _, b_port = address.rpartition(":")
            try:
                other = await _connect(b_host, int(b_port), options, client_id, timeout)
            except Exception as exc:  # noqa: BLE001
                problem = _diagnose(exc, security, f"{address} (as the cluster advertises it)")
                if problem is not None:
                    raise problem from None
                continue   # a broker that is down now is the cluster's business, not a setting
            other.close()
        log_event(logger, "kafka_checked", bootstrap=bootstrap, security=security.describe(), brokers=len(brokers))
        return brokers
    raise KafkaUnreachable(f"no Kafka broker answers at {bootstrap} (LIVEVEC_KAFKA_BOOTSTRAP): "
                           + "; ".join(unreachable))

