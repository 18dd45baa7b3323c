"""The filters the LanceDB vector store selects by (``projections.embeddings.lance``, which
runs the queries): what a ``Match`` erases or finds, what a search ranks within. Pure text: a
filter is a LanceDB (DataFusion) SQL condition, every value a quoted literal (``sql_string``).
"""

from __future__ import annotations

from collections.abc import Sequence

from projections.embeddings.vectors import Match, MemoryOnly


def sql_string(value: str) -> str:
    """``value`` as a LanceDB (DataFusion) SQL string literal.

    Every identifier reaching a filter goes through here: they are any text at all, quotes
    included. Only the single quote is special in a standard SQL literal (backslashes and
    ``%`` are plain characters outside ``LIKE``), and it is escaped by doubling it.
    """
    return "'" + value.replace("'", "''") + "'"


def any_of(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(sql_string(value) for value in values)})"


def tenant_filter(tenant_id: str, subject: tuple[str, str] | None = None) -> str:
    condition = f"tenant_id = {sql_string(tenant_id)}"
    if subject is not None:
        condition += f" AND {_subject_filter(subject)}"
    return condition


def _subject_filter(subject: tuple[str, str]) -> str:
    subject_type, subject_id = subject
    return f"subject_type = {sql_string(subject_type)} AND subject_id = {sql_string(subject_id)}"


def memory_only_filter(only: MemoryOnly) -> str:
    """The LanceDB filter selecting the memory entries ``only`` admits (not an empty one:
    ``IN ()`` is no SQL, and it admits nothing, so there is no query to run)."""
    if only.admits_nothing:
        raise ValueError("a confinement that admits nothing has no filter")
    condition = "kind = 'memory'"
    if only.kinds is not None:
        condition += f" AND {any_of('memory_kind', sorted(only.kinds))}"
    if only.scopes is not None:
        condition += f" AND {any_of('scope', sorted(only.scopes))}"
    return condition


def match_filter(match: Match) -> str | None:
    """The LanceDB filter selecting exactly the entries ``match.matches``; None when the match
    is empty (it selects nothing, and there is no query to run)."""
    alternatives = []
    if match.subject is not None:
        alternatives.append(f"({_subject_filter(match.subject)})")
    if match.conversation_ids:
        alternatives.append(any_of("conversation_id", match.conversation_ids))
    if match.memory_ids:
        alternatives.append(any_of("memory_id", match.memory_ids))
    if match.entry_ids:
        alternatives.append(any_of("id", match.entry_ids))
    if not alternatives:
        return None
    return f"{tenant_filter(match.tenant_id)} AND ({' OR '.join(alternatives)})"


def any_match_filter(matches: Sequence[Match]) -> str | None:
    """The LanceDB filter selecting the entries any of ``matches`` selects; None when every
    match is empty."""
    filters = [f"({where})" for where in map(match_filter, matches) if where is not None]
    return " OR ".join(filters) if filters else None
