"""How memproj connects to Kafka: the bootstrap servers and the client security (TLS, SASL),
built once from the settings into the configuration of every client memproj creates.

``KafkaCluster`` is what the code passes around instead of a bootstrap string. It gives

- ``client_config()``: the librdkafka settings every confluent-kafka Producer, Consumer and
  AdminClient starts from (``streams.kafka.producer_config`` and friends merge it in), with an
  ``error_cb`` that turns an authentication or TLS failure into ``KafkaSecurityError``, raised
  from the client's next ``poll``/``flush``: librdkafka itself would retry it forever (a
  client that outlives a refusal, the API's producer, reports it instead: ``error_callback``);
- ``check_connection()``: a metadata request that fails within seconds naming the cause
  (wrong password, untrusted certificate, missing ACL, unreachable broker), run before a
  worker starts and before every CLI command that talks to Kafka;
- ``unavailable()``: any error of a Kafka request as one line naming the cluster and the cause.

Whether a Kafka error is a refusal is decided here only (``fatal_cause``, ``refusal``).

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


class KafkaUnavailable(RuntimeError):
    """memproj cannot use Kafka; the message names the cluster and the cause, and quotes
    nothing a message held (a log line or a command's one line of output may carry it)."""


class KafkaSecurityError(KafkaUnavailable):
    """Kafka refused memproj's credentials, certificate or ACLs, or memproj refused the
    broker's certificate: retrying cannot help, so the command or worker stops. ``reason``
    says which, naming no host or principal (what the API's readiness shows)."""

    def __init__(self, message: str, reason: str = "refused") -> None:
        super().__init__(message)
        self.reason = reason


class KafkaUnreachable(KafkaUnavailable):
    """No broker answered in time, or a request failed for another reason than a refusal."""


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


# What librdkafka reports when a connection is refused, as a short reason naming no host:
# a refused SASL login is ``_AUTHENTICATION``, a failed TLS handshake (untrusted certificate,
# wrong hostname) ``_SSL``; both are "transient" to librdkafka, so it reconnects forever.
_FATAL = {
    KafkaError._AUTHENTICATION: "authentication failed (wrong username or password?)",
    KafkaError._SSL: "TLS handshake failed (untrusted or mismatched certificate?)",
    KafkaError.SASL_AUTHENTICATION_FAILED: "authentication failed",
    KafkaError.UNSUPPORTED_SASL_MECHANISM: "authentication failed",
    KafkaError.ILLEGAL_SASL_STATE: "authentication failed",
}
# Authorization errors come back with the request that was refused and end it there.
_AUTHORIZATION = {
    code: "authorization failed (the principal needs ACLs)"
    for code in (
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    )
}


def fatal_cause(error: KafkaError) -> str | None:
    """Why ``error`` cannot go away by retrying (authentication or TLS), or None if it can:
    what a client's ``error_cb`` must not leave to librdkafka's reconnecting."""
    reason = _FATAL.get(error.code())
    return None if reason is None else f"{reason}: {error.str()}"


def refusal(error: KafkaError) -> tuple[str, str] | None:
    """Whether Kafka refuses memproj (``fatal_cause``, or an ACL refusing a request): the
    short reason and the whole cause, or None."""
    code = error.code()
    reason = _FATAL.get(code) or _AUTHORIZATION.get(code)
    return None if reason is None else (reason, f"{reason}: {error.str()}")


# What a group request meets while a new cluster creates and loads ``__consumer_offsets``, and
# a request of that time that got no answer: librdkafka can keep a FindCoordinator request in
# flight until the request's own timeout (a busy broker, confluentinc/librdkafka#4605), where
# a new request is answered once the coordinator is up.
_COORDINATOR_STARTING = (
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError._TIMED_OUT,
)
# The longest one group request of the startup check may take before it is sent again.
GROUP_CHECK_ATTEMPT_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class KafkaCluster:
    """Where memproj's Kafka is and how to connect to it."""

    bootstrap: str
    security: KafkaSecurity = KafkaSecurity()

    def describe(self) -> str:
        return (
            f"Kafka at {self.bootstrap} over {self.security.protocol} as {self.security.principal}"
        )

    def error_callback(
        self, on_refused: Callable[[KafkaSecurityError], None] | None = None
    ) -> Callable[[KafkaError], None]:
        """An ``error_cb`` raising ``KafkaSecurityError`` for the errors a retry cannot fix;
        confluent-kafka raises it from the ``poll``/``flush`` that served the callback. With
        ``on_refused``, it hands the error to it instead: for a client that keeps serving
        while librdkafka keeps reconnecting (the API's producer), until Kafka accepts it."""
        where = self.describe()

        def on_error(error: KafkaError) -> None:
            reason = _FATAL.get(error.code())
            if reason is None:
                return
            refused = KafkaSecurityError(f"{where}: {reason}: {error.str()}", reason)
            if on_refused is None:
                raise refused
            on_refused(refused)

        return on_error

    def unavailable(self, error: KafkaError | KafkaException) -> KafkaUnavailable:
        """``error`` (of any request to this cluster) as one line naming the cluster and the
        cause: ``KafkaSecurityError`` for a refusal, ``KafkaUnreachable`` otherwise."""
        if isinstance(error, KafkaException):
            first = error.args[0] if error.args else None
            if not isinstance(first, KafkaError):
                return KafkaUnreachable(f"{self.describe()}: {first}")
            error = first
        refused = refusal(error)
        if refused is not None:
            reason, cause = refused
            return KafkaSecurityError(f"{self.describe()}: {cause}", reason)
        return KafkaUnreachable(f"{self.describe()}: {error.name()}: {error.str()}")

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
        (within a second or two) and ``KafkaUnreachable`` naming the cluster after
        ``timeout``. With ``group``, the principal must also be allowed to describe that
        consumer group (a worker's own): an authorization failure is named, not retried."""
        metadata = self._metadata(timeout)
        if group is not None:
            self._check_group(group, timeout)
        return metadata

    def _check_config(self) -> dict[str, Any]:
        # The check raises what it found, named: librdkafka's own log lines (one per failed
        # connection, on stderr) would only repeat it.
        return {**self.client_config(), "log_level": 0}

    def _check_group(self, group: str, timeout: float) -> None:
        admin = AdminClient(self._check_config())
        deadline = time.monotonic() + timeout
        while True:
            attempt = min(GROUP_CHECK_ATTEMPT_SECONDS, max(0.1, deadline - time.monotonic()))
            try:
                admin.describe_consumer_groups([group], request_timeout=attempt)[group].result()
                return
            except KafkaException as exc:
                error = exc.args[0]
                if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                    raise KafkaSecurityError(
                        f"{self.describe()}: not authorized for consumer group {group!r} "
                        "(the principal needs Read and Describe on it: ACLs)",
                        _AUTHORIZATION[KafkaError.GROUP_AUTHORIZATION_FAILED],
                    ) from None
                # A new cluster has no group coordinator until __consumer_offsets exists.
                if error.code() not in _COORDINATOR_STARTING or time.monotonic() > deadline:
                    raise self.unavailable(error) from None
            time.sleep(0.2)

    def _metadata(self, timeout: float) -> ClusterMetadata:
        refusals: list[KafkaSecurityError] = []
        config = self._check_config()
        config["error_cb"] = self.error_callback(refusals.append)
        admin = AdminClient(config)
        deadline = time.monotonic() + timeout
        last: KafkaException | None = None
        while time.monotonic() < deadline:
            try:
                return admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
            except KafkaException as exc:
                last = exc
            admin.poll(0)  # serves the error callback
            if refusals:
                raise refusals[0]
        answer = last.args[0].str() if last is not None and last.args else "none"
        raise KafkaUnreachable(f"{self.describe()}: no answer within {timeout:g}s ({answer})")
