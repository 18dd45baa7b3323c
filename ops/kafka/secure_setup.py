"""The SASL_SSL listener's SCRAM users and ACLs on the local stack's broker (``ops/stack up``).

Runs over the PLAINTEXT listener, whose principal (ANONYMOUS) is a super user. Idempotent:
a SCRAM upsert replaces the credential, and creating an ACL that exists changes nothing.

``memproj`` gets exactly what its workers and CLI need, nothing on the cluster:

- topics: every registry topic with no prefix (a deployment's default) and every topic whose
  name starts with ``memproj.`` (a ``MEMPROJ_TOPIC_PREFIX`` such as ``memproj.staging.``):
  read, write, describe, create, describe/alter configs (``memproj topics create`` aligns
  configs) and delete (Kafka authorises DeleteRecords, the raw-input trim, as Delete: it also
  allows deleting the topic, which the workers never do);
- consumer groups starting with ``memproj`` (``MEMPROJ_GROUP_PREFIX``): read and describe;
- no transactional ids (memproj's producers are idempotent, not transactional; Kafka allows
  an idempotent producer that may write to a topic) and no cluster rights.

``intruder`` authenticates and has no ACL at all: everything it asks for is denied.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)

from topics.registry import ALL_TOPICS

USERS = ("memproj", "intruder")
PRINCIPAL = "User:memproj"
TOPIC_PREFIX = "memproj."
GROUP_PREFIX = "memproj"
SCRAM_ITERATIONS = 8192
TOPIC_OPERATIONS = (
    AclOperation.READ,
    AclOperation.WRITE,
    AclOperation.DESCRIBE,
    AclOperation.CREATE,
    AclOperation.DELETE,
    AclOperation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS,
)
GROUP_OPERATIONS = (AclOperation.READ, AclOperation.DESCRIBE)


def memproj_acls(
    principal: str = PRINCIPAL, topic_prefixes: Iterable[str] | None = None
) -> list[AclBinding]:
    """``principal``'s ACLs: memproj's topics (or those under ``topic_prefixes``) and groups."""
    # PREFIXED on each base name also covers the topics derived from it (dead letters).
    topic_patterns = sorted(
        {spec.base_name for spec in ALL_TOPICS} | {TOPIC_PREFIX}
        if topic_prefixes is None
        else set(topic_prefixes)
    )
    bindings = [
        AclBinding(
            ResourceType.TOPIC,
            pattern,
            ResourcePatternType.PREFIXED,
            principal,
            "*",
            operation,
            AclPermissionType.ALLOW,
        )
        for pattern in topic_patterns
        for operation in TOPIC_OPERATIONS
    ]
    bindings += [
        AclBinding(
            ResourceType.GROUP,
            GROUP_PREFIX,
            ResourcePatternType.PREFIXED,
            principal,
            "*",
            operation,
            AclPermissionType.ALLOW,
        )
        for operation in GROUP_OPERATIONS
    ]
    return bindings


def set_passwords(admin: AdminClient, passwords: Mapping[str, str]) -> None:
    """Create each SCRAM-SHA-512 user, or change its password (connections already
    authenticated stay; new ones need the new password)."""
    upserts: list[UserScramCredentialAlteration] = [
        UserScramCredentialUpsertion(
            user,
            ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS),
            password.encode(),
        )
        for user, password in passwords.items()
    ]
    for future in admin.alter_user_scram_credentials(upserts, request_timeout=30).values():
        future.result()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True, help="the PLAINTEXT listener")
    parser.add_argument("--secure-dir", required=True, type=Path, help="<user>.password files")
    args = parser.parse_args()
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    try:
        set_passwords(
            admin,
            {user: (args.secure_dir / f"{user}.password").read_text().strip() for user in USERS},
        )
        acls = memproj_acls()
        for future in admin.create_acls(acls, request_timeout=30).values():
            future.result()
    except KafkaException as exc:
        print(f"secure_setup: {exc}", file=sys.stderr)
        return 1
    print(f"secure_setup: SCRAM-SHA-512 users {', '.join(USERS)}; {len(acls)} ACLs for {PRINCIPAL}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
