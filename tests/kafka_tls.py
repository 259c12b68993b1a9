"""Throw-away TLS material for the local broker's SASL_SSL listener, made with the ``openssl`` CLI.

``make_tls_material(directory)`` writes a CA, a broker certificate it signs (for ``localhost`` only, so that
connecting by ``127.0.0.1`` exercises hostname checking), a client certificate for mutual TLS, a second CA
that signs nothing of ours (the "untrusted CA" of the tests), and a users file with one SCRAM/PLAIN user and
a random password. Keys are EC P-256 in PKCS#8 PEM (what Kafka's PEM key store reads), valid for two days.
"""
from __future__ import annotations

import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

USER = "livevec"


@dataclass(frozen=True)
class TlsMaterial:
    directory: Path
    ca_file: Path            # signs the broker's and the client's certificates
    broker_cert: Path
    broker_key: Path
    client_cert: Path
    client_key: Path
    other_ca_file: Path      # a CA the broker's certificate does not come from
    users_file: Path
    username: str
    password: str
    password_file: Path
    stranger_cert: Path      # a client certificate the other CA signed: the broker must refuse it
    stranger_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    assert openssl, "the tests make their TLS material with the openssl command: apt-get install openssl"
    proc = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"openssl {' '.join(args)} failed:\n{proc.stderr}"


def _ca(directory: Path, name: str, subject: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", key.name, "-out", cert.name, "-days", "2", "-subj", f"/CN={subject}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=directory)
    return key, cert


def _leaf(directory: Path, name: str, subject: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    key, csr, cert, ext = (directory / f"{name}{suffix}" for suffix in (".key", ".csr", ".pem", ".ext"))
    ext.write_text(extensions)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key.name,
             "-out", csr.name, "-subj", f"/CN={subject}", cwd=directory)
    _openssl("x509", "-req", "-in", csr.name, "-CA", ca[1].name, "-CAkey", ca[0].name, "-CAcreateserial",
             "-out", cert.name, "-days", "2", "-extfile", ext.name, cwd=directory)
    return cert, key


def make_tls_material(directory: Path) -> TlsMaterial:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca(directory, "ca", "livevec throw-away test CA")
    other = _ca(directory, "other-ca", "a CA nobody here trusts")
    broker_cert, broker_key = _leaf(directory, "broker", "localhost", ca,
                                    "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n"
                                    "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n")
    client_cert, client_key = _leaf(directory, "client", USER, ca,
                                    "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                                    "extendedKeyUsage=clientAuth\n")
    stranger_cert, stranger_key = _leaf(directory, "stranger", USER, other,
                                        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                                        "extendedKeyUsage=clientAuth\n")
    password = secrets.token_urlsafe(18)
    users = directory / "users.txt"
    users.write_text(f"# the local broker's SASL users\n{USER}:{password}\n")
    users.chmod(0o600)
    password_file = directory / "password.txt"
    password_file.write_text(password + "\n")
    password_file.chmod(0o600)
    return TlsMaterial(directory, ca[1], broker_cert, broker_key, client_cert, client_key, other[1], users,
                       USER, password, password_file, stranger_cert, stranger_key)


def client_env(material: TlsMaterial, bootstrap: str, mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
    """The ``LIVEVEC_KAFKA_*`` environment of a client of the SASL_SSL listener."""
    return {"LIVEVEC_KAFKA_BOOTSTRAP": bootstrap, "LIVEVEC_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "LIVEVEC_KAFKA_SASL_MECHANISM": mechanism, "LIVEVEC_KAFKA_SASL_USERNAME": material.username,
            "LIVEVEC_KAFKA_SASL_PASSWORD_FILE": str(material.password_file),
            "LIVEVEC_KAFKA_SSL_CA_FILE": str(material.ca_file)}
