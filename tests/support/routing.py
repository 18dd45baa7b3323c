"""Whether Citus can route a statement to one tenant's shard, judged on PostgreSQL's own parse
tree (pglast: libpg_query) of the statement as pg_stat_statements recorded it.

The rule (projections.distribution): every occurrence of a distributed table is tied to a
tenant by ``tenant_id`` equalities, in the WHERE clause or a join's ON, to a parameter or
constant, directly or through other distributed tables' ``tenant_id`` (a join, a correlated
subquery); an INSERT or COPY into one names ``tenant_id`` among its columns, and its ON CONFLICT
target includes it. Reference and coordinator tables are free. A statement whose leading
comment names an entry of ``CROSS_TENANT`` is allowed to reach every tenant.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pglast
from pglast import ast
from pglast.enums import A_Expr_Kind, BoolExprType

from projections.distribution import (
    CROSS_TENANT,
    DISTRIBUTION_COLUMN,
    TABLES,
    Placement,
)

MARKER = re.compile(r"/\*\s*cross-tenant:\s*([\w.-]+)\s*\*/")
ANCHOR = "<tenant>"
# The tenant column of a batch's key set (``projections.sql.KeyLookups`` with several
# tenants in one statement: one JSON array of keys, ``r->>0 AS tenant_id``) or of
# ``tenant_id = ANY(<array>)``: several tenants.
BATCH = "<tenants of a batch>"
# Statements that touch no table's rows: transactions, settings, locks of the session, DDL
# (Citus propagates DDL to the shards itself; the migrations run before the scenario).
DML = (ast.SelectStmt, ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt, ast.MergeStmt, ast.CopyStmt)


@dataclass
class Verdict:
    query: str
    problems: list[str]
    cross_tenant: str | None = None
    # Distributed tables looked up for a batch's keys of several tenants at once: Citus runs
    # such a statement on every shard (ops/decisions/citus.md, "Batches").
    batch: list[str] = field(default_factory=list)

    @property
    def routable(self) -> bool:
        return not self.problems


def distributed(name: str) -> bool:
    table = TABLES.get(name)
    return table is not None and table.placement is Placement.DISTRIBUTED


@dataclass
class _Links:
    """A union-find of ``<scope>.<alias>`` tenant columns and the tenant anchor."""

    parent: dict[str, str] = field(default_factory=dict)

    def find(self, node: str) -> str:
        self.parent.setdefault(node, node)
        while self.parent[node] != node:
            self.parent[node] = self.parent[self.parent[node]]
            node = self.parent[node]
        return node

    def union(self, a: str, b: str) -> None:
        self.parent[self.find(a)] = self.find(b)


@dataclass
class _Scope:
    ident: int
    # alias -> node id of its tenant column; None: a relation without one we can follow
    visible: dict[str, str | None]
    # the distributed tables of this scope: (table, alias, node id)
    tables: list[tuple[str, str, str]] = field(default_factory=list)


class _Checker:
    def __init__(self) -> None:
        self.links = _Links()
        self.problems: list[str] = []
        self.occurrences: list[tuple[str, str, str]] = []
        self.counter = 0
        self.ctes: dict[str, str | None] = {}

    # --- statements -------------------------------------------------------------------
    def statement(self, node: Any, outer: Mapping[str, str | None]) -> str | None:
        """Check one statement; return the node of its output's tenant column, if any."""
        if isinstance(node, ast.SelectStmt):
            return self.select(node, outer)
        if isinstance(node, ast.InsertStmt):
            self.insert(node, outer)
        elif isinstance(node, ast.UpdateStmt):
            self.modify(node, node.relation, node.fromClause, node.whereClause, outer, node)
        elif isinstance(node, ast.DeleteStmt):
            self.modify(node, node.relation, node.usingClause, node.whereClause, outer, node)
        elif isinstance(node, ast.CopyStmt):
            self.copy(node, outer)
        elif isinstance(node, ast.MergeStmt):
            self.problems.append("MERGE is not checked: write it as INSERT ... ON CONFLICT")
        return None

    def with_clause(self, clause: Any, outer: Mapping[str, str | None]) -> None:
        for cte in (clause.ctes or ()) if clause else ():
            assert isinstance(cte, ast.CommonTableExpr)
            self.ctes[str(cte.ctename)] = self.statement(cte.ctequery, outer)

    def select(self, node: Any, outer: Mapping[str, str | None]) -> str | None:
        self.with_clause(node.withClause, outer)
        if node.larg is not None or node.rarg is not None:
            left = self.select(node.larg, outer) if node.larg else None
            right = self.select(node.rarg, outer) if node.rarg else None
            if left and right:
                self.links.union(left, right)
            return left
        scope = self.scope(outer)
        quals: list[ast.Node] = []
        for item in node.fromClause or ():
            self.from_item(item, scope, quals)
        if node.whereClause is not None:
            quals.append(node.whereClause)
        self.equalities(quals, scope)
        for part in (node.targetList, node.havingClause, node.valuesLists):
            self.nested(part, scope.visible)
        for qual in quals:
            self.nested(qual, scope.visible)
        self.require(scope)
        return self.output_tenant(node.targetList, scope)

    def insert(self, node: Any, outer: Mapping[str, str | None]) -> None:
        self.with_clause(node.withClause, outer)
        table = node.relation.relname
        if distributed(table):
            columns = [col.name for col in node.cols or ()]
            if columns and DISTRIBUTION_COLUMN not in columns:
                self.problems.append(f"INSERT INTO {table} without {DISTRIBUTION_COLUMN}")
            conflict = node.onConflictClause
            if conflict is not None and conflict.infer is not None and conflict.infer.indexElems:
                target = [elem.name for elem in conflict.infer.indexElems]
                if DISTRIBUTION_COLUMN not in target:
                    self.problems.append(
                        f"ON CONFLICT ({', '.join(target)}) of {table} without"
                        f" {DISTRIBUTION_COLUMN}"
                    )
        if node.selectStmt is not None:
            self.statement(node.selectStmt, outer)
        scope = self.scope(outer)
        alias = node.relation.alias.aliasname if node.relation.alias else table
        scope.visible[alias] = None
        self.nested(node.onConflictClause, scope.visible)
        self.nested(node.returningClause, scope.visible)

    def modify(
        self,
        node: Any,
        relation: Any,
        from_clause: Any,
        where: Any,
        outer: Mapping[str, str | None],
        statement: Any,
    ) -> None:
        self.with_clause(node.withClause, outer)
        scope = self.scope(outer)
        quals: list[ast.Node] = []
        self.from_item(relation, scope, quals)
        for item in from_clause or ():
            self.from_item(item, scope, quals)
        if where is not None:
            quals.append(where)
        self.equalities(quals, scope)
        for qual in quals:
            self.nested(qual, scope.visible)
        if isinstance(statement, ast.UpdateStmt):
            self.nested(statement.targetList, scope.visible)
        self.nested(node.returningClause, scope.visible)
        self.require(scope)

    def copy(self, node: Any, outer: Mapping[str, str | None]) -> None:
        if node.query is not None:
            self.statement(node.query, outer)
            return
        table = node.relation.relname
        if not distributed(table):
            return
        columns = [col.sval for col in node.attlist or ()]
        if not node.is_from:
            self.problems.append(f"COPY {table} TO reads every tenant")
        elif columns and DISTRIBUTION_COLUMN not in columns:
            self.problems.append(f"COPY {table} without {DISTRIBUTION_COLUMN}")

    # --- scopes -------------------------------------------------------------------------
    def scope(self, outer: Mapping[str, str | None]) -> _Scope:
        self.counter += 1
        return _Scope(self.counter, dict(outer))

    def from_item(self, item: Any, scope: _Scope, quals: list[Any]) -> list[str]:
        """Add ``item``'s relations to ``scope``; return their aliases."""
        if isinstance(item, ast.RangeVar):
            table = str(item.relname)
            alias = str(item.alias.aliasname) if item.alias else table
            if item.schemaname is None and table in self.ctes:
                scope.visible[alias] = self.ctes[table]
            elif distributed(table):
                node = f"{scope.ident}.{alias}"
                scope.visible[alias] = node
                scope.tables.append((table, alias, node))
            else:
                scope.visible[alias] = None
            return [alias]
        if isinstance(item, ast.JoinExpr):
            left = self.from_item(item.larg, scope, quals)
            right = self.from_item(item.rarg, scope, quals)
            if item.quals is not None:
                quals.append(item.quals)
            using = [name.sval for name in item.usingClause or () if isinstance(name, ast.String)]
            if DISTRIBUTION_COLUMN in using:
                joined = [scope.visible.get(alias) for alias in left + right]
                tied = [node for node in joined if node is not None]
                for node in tied[1:]:
                    self.links.union(tied[0], node)
            return left + right
        if isinstance(item, ast.RangeSubselect):
            tenant = self.statement(item.subquery, scope.visible if item.lateral else {})
            if item.alias is not None:
                scope.visible[str(item.alias.aliasname)] = tenant
                return [str(item.alias.aliasname)]
        elif isinstance(item, ast.RangeFunction):
            self.nested(item.functions, scope.visible)
            if item.alias is not None:
                scope.visible[str(item.alias.aliasname)] = None
                return [str(item.alias.aliasname)]
        return []

    def equalities(self, quals: list[Any], scope: _Scope) -> None:
        for qual in quals:
            for conjunct in conjuncts(qual):
                column = any_of_array(conjunct)
                if column is not None:
                    term = self.tenant_term(column, scope)
                    if term is not None:
                        self.links.union(term, BATCH)
                    continue
                pair = equality(conjunct)
                if pair is None:
                    continue
                left, right = (self.tenant_term(term, scope) for term in pair)
                if left is not None and right is not None:
                    self.links.union(left, right)

    def tenant_term(self, term: Any, scope: _Scope) -> str | None:
        while isinstance(term, ast.TypeCast):
            term = term.arg
        if isinstance(term, (ast.ParamRef, ast.A_Const)):
            return ANCHOR
        if not isinstance(term, ast.ColumnRef):
            return None
        names = [str(part.sval) for part in term.fields or () if isinstance(part, ast.String)]
        if not names or names[-1] != DISTRIBUTION_COLUMN:
            return None
        if len(names) >= 2:
            return scope.visible.get(names[-2])
        own = [node for _, _, node in scope.tables]
        if len(own) == 1:
            return own[0]
        if not own:
            followed = [node for node in scope.visible.values() if node is not None]
            return followed[0] if len(followed) == 1 else None
        return None

    def output_tenant(self, targets: Any, scope: _Scope) -> str | None:
        for target in targets or ():
            if not isinstance(target, ast.ResTarget):
                continue
            name = target.name
            value: Any = target.val
            if isinstance(value, ast.ColumnRef):
                last: Any = (value.fields or (None,))[-1]
                if isinstance(last, ast.String):
                    name = name or last.sval
            if name == DISTRIBUTION_COLUMN and value is not None:
                if json_field(value):
                    return BATCH
                return self.tenant_term(value, scope)
        return None

    def nested(self, part: object, visible: Mapping[str, str | None]) -> None:
        """Check the subqueries inside an expression, which see ``visible``."""
        for sub in subqueries(part):
            self.statement(sub, visible)

    def require(self, scope: _Scope) -> None:
        self.occurrences.extend(scope.tables)

    def verdict(self) -> tuple[list[str], list[str]]:
        """The problems, and the tables tied to a batch's tenants only."""
        anchor, batch = self.links.find(ANCHOR), self.links.find(BATCH)
        roots = {table: self.links.find(node) for table, _, node in self.occurrences}
        unbound = sorted(
            f"{table} is not tied to one tenant by {DISTRIBUTION_COLUMN} equality"
            for table, root in roots.items()
            if root not in (anchor, batch)
        )
        return self.problems + unbound, sorted(t for t, r in roots.items() if r == batch)


def conjuncts(node: Any) -> Iterator[Any]:
    if isinstance(node, ast.BoolExpr) and node.boolop == BoolExprType.AND_EXPR:
        for arg in node.args or ():
            yield from conjuncts(arg)
    else:
        yield node


def equality(node: Any) -> tuple[Any, Any] | None:
    if not isinstance(node, ast.A_Expr):
        return None
    op = [part.sval for part in node.name or () if isinstance(part, ast.String)]
    if op != ["="]:
        return None
    kind = node.kind
    if kind == A_Expr_Kind.AEXPR_OP:
        return node.lexpr, node.rexpr
    listed: Any = node.rexpr
    if kind == A_Expr_Kind.AEXPR_IN and len(listed) == 1:
        return node.lexpr, listed[0]
    return None


def json_field(term: Any) -> bool:
    while isinstance(term, ast.TypeCast):
        term = term.arg
    return isinstance(term, ast.A_Expr) and [
        part.sval for part in term.name or () if isinstance(part, ast.String)
    ] == ["->>"]


def any_of_array(node: Any) -> Any:
    """The column of ``column = ANY(<parameter>)``."""
    if not isinstance(node, ast.A_Expr) or node.kind != A_Expr_Kind.AEXPR_OP_ANY:
        return None
    op = [part.sval for part in node.name or () if isinstance(part, ast.String)]
    return node.lexpr if op == ["="] else None


def subqueries(part: object) -> Iterator[Any]:
    """The statements directly inside ``part`` (through SubLinks), not below them."""
    if isinstance(part, ast.SubLink):
        yield part.subselect
        yield from subqueries(part.testexpr)
    elif isinstance(part, (ast.SelectStmt, ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt)):
        yield part
    elif isinstance(part, ast.Node):
        slots: Any = type(part).__slots__  # type: ignore[attr-defined]
        for slot in slots:
            yield from subqueries(getattr(part, slot, None))
    elif isinstance(part, (list, tuple)):
        for item in part:
            yield from subqueries(item)


def judge(query: str) -> Verdict:
    """The routing verdict on one statement (a normalized pg_stat_statements text)."""
    marker = MARKER.search(query)
    if marker is not None:
        name = marker.group(1)
        if name in CROSS_TENANT:
            return Verdict(query, [], cross_tenant=name)
        return Verdict(query, [f"cross-tenant statement {name} is not in CROSS_TENANT"])
    problems: list[str] = []
    batch: list[str] = []
    for raw in pglast.parse_sql(query):
        if not isinstance(raw.stmt, DML):
            continue
        checker = _Checker()
        checker.statement(raw.stmt, {})
        found, batched = checker.verdict()
        problems.extend(found)
        batch.extend(batched)
    return Verdict(query, problems, batch=batch)
