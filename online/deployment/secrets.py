"""The secrets each role reads, and where they reach it on each platform.

Every secret is a directory of files mounted read-only into the roles that need it: on Kubernetes from a
``Secret`` (``kubectl create secret generic <secret_name> --from-file=...``), on Marathon from ``host_path``, a
directory that configuration management puts on every agent (DC/OS Enterprise can inject its secret store
instead, see the runbook). The environment points the role's settings at the files.

Only Kafka's credentials are always mounted: their variables are inert until
``LIVEVEC_KAFKA_SECURITY_PROTOCOL`` asks for them, so a plaintext cluster needs no Secret. The others turn a
feature on by being set (``PS_CURVE_*`` secures the parameter-server traffic, ``LIVEVEC_API_TOKEN_FILE`` the
front end's API, ``LIVEVEC_TLS_*`` its HTTPS), and a node whose file is missing stops at start naming the
setting. So they are rendered only when asked for (``livevec deploy render --secure curve,token,tls``), never
half-on: a pod must not start unsecured because its Secret was forgotten.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

PS_ROLES = ("scheduler", "server", "worker", "frontend")   # every ps-lite node (the front end reads the servers)
SECURE_CHOICES = ("curve", "token", "tls")


@dataclass(frozen=True)
class SecretFiles:
    """One directory of secret files and the roles that mount it.

    ``env`` maps a variable to a file under the mount; ``{role}`` in a file name is the role's name, so one
    Secret can hold a key per role and each pod projects only its own (Kubernetes ``items``)."""

    name: str                       # the volume's name, and what ``--secure`` calls it
    secret_name: str                # Kubernetes Secret
    mount_path: str                 # in the container
    host_path: str                  # Marathon: the agents' directory
    roles: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    always: bool = False            # mounted even when not asked for (its variables are inert)
    https: bool = False             # the role's HTTP port speaks HTTPS only once this is on

    def files(self, role: str) -> list[str]:
        """What ``role`` reads of the Secret (the keys a Kubernetes volume projects)."""
        return list(dict.fromkeys(template.format(role=role) for template in self.env.values()))

    def role_env(self, role: str) -> dict[str, str]:
        return {var: f"{self.mount_path}/{template.format(role=role)}" for var, template in self.env.items()}


KAFKA = SecretFiles(
    name="kafka-credentials", secret_name="livevec-kafka", mount_path="/etc/livevec/kafka",
    host_path="/etc/livevec/kafka", roles=("worker", "producer-example"), always=True,
    env={"LIVEVEC_KAFKA_SASL_PASSWORD_FILE": "password", "LIVEVEC_KAFKA_SSL_CA_FILE": "ca.pem"})

# ``python -m ps_bridge.curve keygen DIR scheduler server worker frontend`` writes exactly these files.
CURVE = SecretFiles(
    name="ps-curve", secret_name="livevec-ps-curve", mount_path="/etc/livevec/ps", host_path="/etc/livevec/ps",
    roles=PS_ROLES,
    env={"PS_CURVE_PUBLIC_KEYS_FILE": "cluster.keys", "PS_CURVE_SECRET_KEY_FILE": "{role}.key_secret"})

TOKEN = SecretFiles(
    name="frontend-token", secret_name="livevec-frontend-token", mount_path="/etc/livevec/frontend",
    host_path="/etc/livevec/frontend", roles=("frontend",), env={"LIVEVEC_API_TOKEN_FILE": "token"})

# A ``kubernetes.io/tls`` Secret has exactly these two keys.
TLS = SecretFiles(
    name="frontend-tls", secret_name="livevec-frontend-tls", mount_path="/etc/livevec/tls",
    host_path="/etc/livevec/tls", roles=("frontend",), https=True,
    env={"LIVEVEC_TLS_CERT_FILE": "tls.crt", "LIVEVEC_TLS_KEY_FILE": "tls.key"})

SECRETS = {"kafka": KAFKA, "curve": CURVE, "token": TOKEN, "tls": TLS}


def parse_secure(text: str | None) -> frozenset[str]:
    """``--secure``'s value: a comma-separated subset of ``curve,token,tls``, or ``all``."""
    if not text:
        return frozenset()
    chosen = {part.strip() for part in text.split(",") if part.strip()}
    if chosen == {"all"}:
        return frozenset(SECURE_CHOICES)
    unknown = chosen - set(SECURE_CHOICES)
    if unknown:
        raise ValueError(f"unknown {', '.join(sorted(unknown))}: choose from {', '.join(SECURE_CHOICES)} or all")
    return frozenset(chosen)
