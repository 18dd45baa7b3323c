"""The Kafka client configuration built from the security settings, and how a refusal is told:
pure, no broker."""

from __future__ import annotations

import re
import time
from concurrent.futures import Future
from pathlib import Path
from typing import ClassVar

import pytest
from confluent_kafka import KafkaError, KafkaException
from pydantic import SecretStr

from streams import kafka_security
from streams.kafka import admin_config, consumer_config, producer_config
from streams.kafka_security import (
    KafkaCluster,
    KafkaSecurity,
    KafkaSecurityConfigError,
    KafkaSecurityError,
    KafkaUnreachable,
    SaslMechanism,
    SecurityProtocol,
    fatal_cause,
)
from streams.settings import Settings
from topics.registry import TopicReplication

SECRET = "s3cret-pw-value"
REPO = Path(__file__).resolve().parents[2]


def security(protocol: SecurityProtocol, **values: object) -> KafkaSecurity:
    if protocol.uses_sasl:
        values = {"username": "memproj", "password": SecretStr(SECRET), **values}
    return KafkaSecurity(protocol=protocol, **values)  # type: ignore[arg-type]


@pytest.mark.parametrize("mechanism", list(SaslMechanism))
@pytest.mark.parametrize("protocol", list(SecurityProtocol))
def test_each_protocol_and_mechanism(protocol: SecurityProtocol, mechanism: SaslMechanism) -> None:
    config = security(protocol, mechanism=mechanism).librdkafka_config()
    assert config["security.protocol"] == protocol.value
    if protocol.uses_sasl:
        assert config["sasl.mechanism"] == mechanism.value
        assert (config["sasl.username"], config["sasl.password"]) == ("memproj", SECRET)
    else:
        assert not [key for key in config if key.startswith("sasl.")]
    if protocol.uses_tls:
        assert config["ssl.endpoint.identification.algorithm"] == "https"
    else:
        assert not [key for key in config if key.startswith("ssl.")]


def test_tls_files_and_hostname_check() -> None:
    config = security(
        SecurityProtocol.SSL,
        ca_file=Path("/ca.pem"),
        cert_file=Path("/c.pem"),
        key_file=Path("/c.key"),
        check_hostname=False,
    ).librdkafka_config()
    assert config == {
        "security.protocol": "SSL",
        "ssl.endpoint.identification.algorithm": "none",
        "ssl.ca.location": "/ca.pem",
        "ssl.certificate.location": "/c.pem",
        "ssl.key.location": "/c.key",
    }


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"protocol": SecurityProtocol.SASL_SSL}, "needs MEMPROJ_KAFKA_USERNAME"),
        ({"protocol": SecurityProtocol.SASL_PLAINTEXT, "username": "u"}, "MEMPROJ_KAFKA_PASSWORD"),
        ({"ca_file": Path("/ca.pem")}, "uses no TLS"),
        ({"protocol": SecurityProtocol.SSL, "cert_file": Path("/c.pem")}, "go together"),
    ],
)
def test_contradictory_settings_are_refused(values: dict[str, object], problem: str) -> None:
    with pytest.raises(KafkaSecurityConfigError, match=problem):
        KafkaSecurity(**values)  # type: ignore[arg-type]


def test_secrets_are_in_no_repr(tmp_path: Path) -> None:
    password_file = tmp_path / "pw"
    password_file.write_text(SECRET + "\n")
    settings = Settings(
        kafka_security_protocol="SASL_SSL",
        kafka_username="memproj",
        kafka_password_file=password_file,
    )
    cluster = settings.kafka
    assert cluster.security.password is not None
    assert cluster.security.password.get_secret_value() == SECRET  # the file, newline removed
    for text in (repr(settings), str(settings), repr(cluster), str(cluster), cluster.describe()):
        assert SECRET not in text


def test_every_client_config_carries_the_security_and_the_error_callback() -> None:
    cluster = KafkaCluster("broker:9094", security(SecurityProtocol.SASL_SSL))
    for config in (producer_config(cluster), consumer_config(cluster), admin_config(cluster)):
        assert config["bootstrap.servers"] == "broker:9094"
        assert config["security.protocol"] == "SASL_SSL"
        assert callable(config["error_cb"])
    assert producer_config("127.0.0.1:9092")["security.protocol"] == "PLAINTEXT"


def test_the_error_callback_raises_only_what_a_retry_cannot_fix() -> None:
    on_error = KafkaCluster("b:1", security(SecurityProtocol.SASL_SSL)).error_callback()
    with pytest.raises(KafkaSecurityError, match="authentication failed"):
        on_error(KafkaError(KafkaError._AUTHENTICATION, "invalid credentials"))
    with pytest.raises(KafkaSecurityError, match="TLS handshake failed"):
        on_error(KafkaError(KafkaError._SSL, "certificate verify failed"))
    on_error(KafkaError(KafkaError._TRANSPORT, "connection refused"))  # retried by librdkafka
    assert fatal_cause(KafkaError(KafkaError._ALL_BROKERS_DOWN)) is None


def test_a_client_that_outlives_a_refusal_is_told_of_it_instead() -> None:
    reported: list[KafkaSecurityError] = []
    on_error = KafkaCluster("b:1", security(SecurityProtocol.SASL_SSL)).error_callback(
        reported.append
    )
    on_error(KafkaError(KafkaError._AUTHENTICATION, "invalid credentials"))
    on_error(KafkaError(KafkaError._TRANSPORT, "connection refused"))
    [refused] = reported
    assert refused.reason == "authentication failed (wrong username or password?)"
    assert "b:1" in str(refused) and "b:1" not in refused.reason  # readiness shows the reason


def test_a_failed_request_is_one_line_naming_the_cluster_and_the_cause() -> None:
    cluster = KafkaCluster("b:1", security(SecurityProtocol.SASL_SSL))
    acl = cluster.unavailable(
        KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "topic t: refused"))
    )
    assert isinstance(acl, KafkaSecurityError)
    assert str(acl).startswith("Kafka at b:1 over SASL_SSL as SASL user 'memproj'")
    assert "authorization failed (the principal needs ACLs): topic t: refused" in str(acl)
    away = cluster.unavailable(KafkaError(KafkaError._TIMED_OUT, "no answer"))
    assert isinstance(away, KafkaUnreachable) and "_TIMED_OUT: no answer" in str(away)
    assert SECRET not in str(acl) + str(away)


def test_no_client_is_built_from_the_bare_bootstrap_string() -> None:
    """Every Kafka client in memproj's code takes ``settings.kafka`` (security included)."""
    allowed = {"streams/settings.py"}
    offenders = [
        str(path.relative_to(REPO))
        for path in (REPO / "streams").rglob("*.py")
        if str(path.relative_to(REPO)) not in allowed
        and re.search(r"\bkafka_bootstrap\b", path.read_text())
    ]
    assert offenders == []


def test_replication_settings_default_to_one_broker_and_are_checked_at_start() -> None:
    assert Settings().topic_replication == TopicReplication(1, 1)
    cluster = Settings(topic_replication_factor=3, topic_min_insync_replicas=2)
    assert cluster.topic_replication == TopicReplication(3, 2)
    with pytest.raises(ValueError, match=r"min\.insync\.replicas"):
        Settings(topic_replication_factor=1, topic_min_insync_replicas=2)


class _SlowCoordinatorAdmin:
    """An admin client whose first group requests get no answer (a FindCoordinator request
    kept in flight by a busy new cluster), and whose next one is answered."""

    timeouts: ClassVar[list[float]] = []

    def __init__(self, config: dict[str, object]) -> None:
        pass

    def describe_consumer_groups(
        self, groups: list[str], request_timeout: float
    ) -> dict[str, Future[object]]:
        self.timeouts.append(request_timeout)
        answer: Future[object] = Future()
        if len(self.timeouts) < 3:
            answer.set_exception(KafkaException(KafkaError(KafkaError._TIMED_OUT)))
        else:
            answer.set_result(object())
        return {groups[0]: answer}


def test_the_group_check_asks_again_when_a_request_got_no_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kafka_security, "AdminClient", _SlowCoordinatorAdmin)
    monkeypatch.setattr(time, "sleep", lambda _seconds: None)
    _SlowCoordinatorAdmin.timeouts = []
    KafkaCluster("127.0.0.1:1")._check_group("memproj-memory", timeout=20.0)
    assert len(_SlowCoordinatorAdmin.timeouts) == 3
    assert max(_SlowCoordinatorAdmin.timeouts) <= kafka_security.GROUP_CHECK_ATTEMPT_SECONDS
