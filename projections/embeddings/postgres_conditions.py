"""The conditions the PostgreSQL vector store selects by (``projections.embeddings.postgres``,
which owns the statements): what a ``Match`` erases or finds, what a search ranks within, the
query a lexical search's terms make. Pure composition of SQL fragments, every value a literal
composed by psycopg (any text at all is an identifier: quotes, backslashes and all).
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from projections.embeddings.vectors import Match, MemoryOnly


def columns(names: Sequence[str]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(name) for name in names)


def match_condition(match: Match, collection: str) -> sql.Composable | None:
    """The condition selecting exactly the entries ``match.matches`` in ``collection``; None
    when the match is empty (it selects nothing)."""
    alternatives: list[sql.Composable] = []
    if match.subject is not None:
        alternatives.append(
            sql.SQL("(subject_type = {} AND subject_id = {})").format(
                sql.Literal(match.subject[0]), sql.Literal(match.subject[1])
            )
        )
    for column, values in (
        ("conversation_id", match.conversation_ids),
        ("memory_id", match.memory_ids),
        ("id", match.entry_ids),
    ):
        if values:
            alternatives.append(
                sql.SQL("{} = ANY({}::text[])").format(
                    sql.Identifier(column), sql.Literal(list(values))
                )
            )
    if not alternatives:
        return None
    return sql.SQL("(tenant_id = {} AND collection = {} AND ({}))").format(
        sql.Literal(match.tenant_id),
        sql.Literal(collection),
        sql.SQL(" OR ").join(alternatives),
    )


def any_match_condition(matches: Sequence[Match], collection: str) -> sql.Composable | None:
    """The condition selecting what any of ``matches`` selects; None when every one is empty."""
    conditions = [match_condition(match, collection) for match in matches]
    chosen = [condition for condition in conditions if condition is not None]
    return sql.SQL(" OR ").join(chosen) if chosen else None


def candidates_condition(
    collection: str,
    tenant_id: str,
    subject: tuple[str, str] | None,
    only: MemoryOnly | None,
) -> sql.Composable:
    """The condition a search ranks within: the tenant, its subject, the kinds and scopes
    ``only`` admits. The ranking never sees another entry."""
    conditions: list[sql.Composable] = [
        sql.SQL("tenant_id = {}").format(sql.Literal(tenant_id)),
        sql.SQL("collection = {}").format(sql.Literal(collection)),
    ]
    if subject is not None:
        conditions.append(
            sql.SQL("subject_type = {} AND subject_id = {}").format(
                sql.Literal(subject[0]), sql.Literal(subject[1])
            )
        )
    if only is not None:
        conditions.append(sql.SQL("kind = 'memory'"))
        for column, admitted in (("memory_kind", only.kinds), ("scope", only.scopes)):
            if admitted is not None:
                conditions.append(
                    sql.SQL("{} = ANY({}::text[])").format(
                        sql.Identifier(column), sql.Literal(sorted(admitted))
                    )
                )
    return sql.SQL(" AND ").join(conditions)


def any_term_query(terms: Sequence[str]) -> sql.Composable:
    """A ``tsquery`` matching a ``tsvector`` that holds any of ``terms``, taken as they are
    (cast, not parsed by a text search configuration: the terms are already the lexemes the
    store keeps)."""
    quoted = " | ".join("'" + term.replace("\\", "\\\\").replace("'", "''") + "'" for term in terms)
    return sql.SQL("{}::tsquery").format(sql.Literal(quoted))
