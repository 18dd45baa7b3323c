"""How memproj connects to Kafka: the bootstrap servers and the client security (TLS, SASL),
built once from the settings into the configuration of every client memproj creates.

``KafkaCluster`` is what the code passes around instead of a bootstrap string. It gives

- ``client_config()``: the librdkafka settings every confluent-kafka Producer, Consumer and
  AdminClient starts from (``streams.kafka.producer_config`` and friends merge it in), with an
  ``error_cb`` that turns an authentication or TLS failure into ``KafkaSecurityError``, raised
  from the client's next ``poll``/``flush``: librdkafka itself would retry it forever;
- ``check_connection()``: a metadata request that fails within seconds naming the cause
  (wrong password, untrusted certificate, unreachable broker), run before a worker starts.

A password lives in a ``SecretStr``: it is in no ``repr``, no log line and no error message.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata  # type: ignore[attr-defined]
from pydantic import SecretStr


class SecurityProtocol(enum.StrEnum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def uses_tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


class SaslMechanism(enum.StrEnum):
    PLAIN = "PLAIN"
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"


class KafkaSecurityError(RuntimeError):
    """Kafka refused memproj's credentials or certificate, or memproj refused the broker's:
    retrying cannot help, so the command or worker stops."""


class KafkaSecurityConfigError(ValueError):
    """The security settings contradict each other (e.g. SASL without a username)."""


@dataclass(frozen=True, slots=True)
class KafkaSecurity:
    protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    mechanism: SaslMechanism = SaslMechanism.SCRAM_SHA_512
    username: str | None = None
    password: SecretStr | None = field(default=None, repr=False)
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    check_hostname: bool = True

    def __post_init__(self) -> None:
        for problem in self.problems():
            raise KafkaSecurityConfigError(problem)

    def problems(self) -> list[str]:
        """What is wrong with this combination of settings (empty: nothing)."""
        found = []
        if self.protocol.uses_sasl and not (self.username and self.password):
            found.append(
                f"MEMPROJ_KAFKA_SECURITY_PROTOCOL={self.protocol} needs MEMPROJ_KAFKA_USERNAME "
                "and MEMPROJ_KAFKA_PASSWORD (or MEMPROJ_KAFKA_PASSWORD_FILE)"
            )
        tls_files = (self.ca_file, self.cert_file, self.key_file)
        if not self.protocol.uses_tls and any(tls_files):
            found.append(
                f"MEMPROJ_KAFKA_SECURITY_PROTOCOL={self.protocol} uses no TLS: the CA, "
                "certificate and key files would be ignored (use SSL or SASL_SSL)"
            )
        if (self.cert_file is None) != (self.key_file is None):
            found.append("MEMPROJ_KAFKA_CERT_FILE and MEMPROJ_KAFKA_KEY_FILE go together")
        return found

    @property
    def principal(self) -> str:
        """Who memproj is on this connection, for error messages."""
        if self.protocol.uses_sasl:
            return f"SASL user {self.username!r} ({self.mechanism})"
        if self.cert_file is not None:
            return f"the client certificate {self.cert_file}"
        return "ANONYMOUS"

    def librdkafka_config(self) -> dict[str, str]:
        """The security part of a confluent-kafka client's configuration."""
        config = {"security.protocol": self.protocol.value}
        if self.protocol.uses_sasl:
            assert self.username is not None and self.password is not None  # __post_init__
            config["sasl.mechanism"] = self.mechanism.value
            config["sasl.username"] = self.username
            config["sasl.password"] = self.password.get_secret_value()
        if self.protocol.uses_tls:
            # librdkafka's default is "https" (hostname verified); "none" turns it off.
            config["ssl.endpoint.identification.algorithm"] = (
                "https" if self.check_hostname else "none"
            )
            if self.ca_file is not None:
                config["ssl.ca.location"] = str(self.ca_file)
            if self.cert_file is not None and self.key_file is not None:
                config["ssl.certificate.location"] = str(self.cert_file)
                config["ssl.key.location"] = str(self.key_file)
        return config


def fatal_cause(error: KafkaError) -> str | None:
    """Why ``error`` cannot go away by retrying (authentication or TLS), or None if it can.

    librdkafka reports a refused SASL login as ``_AUTHENTICATION`` and a failed TLS
    handshake (untrusted certificate, wrong hostname) as ``_SSL``; both are "transient" to
    it, so it reconnects forever. Authorization errors come back with the request that was
    refused and end it there: they need no callback."""
    code = error.code()
    if code == KafkaError._AUTHENTICATION:
        return f"authentication failed (wrong username or password?): {error.str()}"
    if code == KafkaError._SSL:
        return f"TLS handshake failed (untrusted or mismatched certificate?): {error.str()}"
    if code in (
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.UNSUPPORTED_SASL_MECHANISM,
        KafkaError.ILLEGAL_SASL_STATE,
    ):
        return f"authentication failed: {error.str()}"
    return None


_COORDINATOR_STARTING = (
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
)


@dataclass(frozen=True, slots=True)
class KafkaCluster:
    """Where memproj's Kafka is and how to connect to it."""

    bootstrap: str
    security: KafkaSecurity = KafkaSecurity()

    def describe(self) -> str:
        return (
            f"Kafka at {self.bootstrap} over {self.security.protocol} as {self.security.principal}"
        )

    def error_callback(self) -> Callable[[KafkaError], None]:
        """An ``error_cb`` raising ``KafkaSecurityError`` for the errors a retry cannot fix;
        confluent-kafka raises it from the ``poll``/``flush`` that served the callback."""
        where = self.describe()

        def on_error(error: KafkaError) -> None:
            cause = fatal_cause(error)
            if cause is not None:
                raise KafkaSecurityError(f"{where}: {cause}")

        return on_error

    def client_config(self) -> dict[str, Any]:
        """What every confluent-kafka client memproj builds starts from (``Any``: the type
        stubs of AdminClient allow no callback, librdkafka takes one from every client)."""
        return {
            "bootstrap.servers": self.bootstrap,
            **self.security.librdkafka_config(),
            "error_cb": self.error_callback(),
        }

    def check_connection(self, timeout: float = 20.0, group: str | None = None) -> ClusterMetadata:
        """One metadata request, tried until ``timeout``: returns the metadata, or raises
        ``KafkaSecurityError`` as soon as librdkafka reports an authentication or TLS failure
        (within a second or two) and ``KafkaException`` naming the cluster after ``timeout``.
        With ``group``, the principal must also be allowed to describe that consumer group
        (a worker's own): an authorization failure is named, not retried."""
        metadata = self._metadata(timeout)
        if group is not None:
            self._check_group(group, timeout)
        return metadata

    def _check_group(self, group: str, timeout: float) -> None:
        admin = AdminClient(self.client_config())
        deadline = time.monotonic() + timeout
        while True:
            try:
                admin.describe_consumer_groups([group], request_timeout=timeout)[group].result()
                return
            except KafkaException as exc:
                error = exc.args[0]
                if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                    raise KafkaSecurityError(
                        f"{self.describe()}: not authorized for consumer group {group!r} "
                        "(the principal needs Read and Describe on it: ACLs)"
                    ) from None
                # A new cluster has no group coordinator until __consumer_offsets exists.
                if error.code() not in _COORDINATOR_STARTING or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def _metadata(self, timeout: float) -> ClusterMetadata:
        causes: list[str] = []
        config = self.client_config()
        config["error_cb"] = lambda error: causes.append(fatal_cause(error) or "")
        admin = AdminClient(config)
        deadline = time.monotonic() + timeout
        last: KafkaException | None = None
        while time.monotonic() < deadline:
            try:
                return admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
            except KafkaException as exc:
                last = exc
            admin.poll(0)  # serves the error callback
            fatal = [cause for cause in causes if cause]
            if fatal:
                raise KafkaSecurityError(f"{self.describe()}: {fatal[0]}")
        raise KafkaException(f"{self.describe()}: no answer within {timeout:g}s ({last})")
