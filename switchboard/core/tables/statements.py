"""Structured table operations (never raw SQL) and the parameterised statements built from them.

The model names columns and gives values; column names are checked against the table's allowed columns and quoted,
values are always bound parameters, and the tenant filter is added here, by the gateway, never by the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from switchboard.core.sql.guard import quote_ident
from switchboard.core.tables.config import ConnectedTable
from switchboard.errors import ToolError

__all__ = [
    "Built",
    "Condition",
    "Dialect",
    "Order",
    "Scalar",
    "TableDeleteInput",
    "TableInsertInput",
    "TableQueryInput",
    "TableUpdateInput",
    "build_delete",
    "build_insert",
    "build_query",
    "build_update",
]

Dialect = Literal["sqlite", "postgres"]
Scalar = str | int | float | bool | None
_OPS = {"=": "=", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">=", "like": "LIKE"}


class Condition(BaseModel):
    """One condition of a ``where`` list (all of them must hold)."""

    model_config = ConfigDict(extra="forbid")

    column: str
    op: Literal["=", "!=", "<", "<=", ">", ">=", "like", "in", "is_null", "not_null"] = "="
    value: Scalar | list[Scalar] = None
    """The value compared (a list for ``in``; ignored for ``is_null`` and ``not_null``)."""


class Order(BaseModel):
    """One sort key."""

    model_config = ConfigDict(extra="forbid")

    column: str
    descending: bool = False


class TableQueryInput(BaseModel):
    """Arguments of ``table_query``."""

    model_config = ConfigDict(extra="forbid")

    table: str = Field(description="The connected table, by the reference listed in your context.")
    columns: list[str] = Field(default_factory=list, description="Columns to return; empty: every allowed column.")
    where: list[Condition] = Field(default_factory=list, max_length=20, description="Conditions, all must hold.")
    order_by: list[Order] = Field(default_factory=list, max_length=5)
    limit: int = Field(50, ge=1, le=10_000, description="Most rows returned; the rest are counted.")


class TableInsertInput(BaseModel):
    """Arguments of ``table_insert``."""

    model_config = ConfigDict(extra="forbid")

    table: str = Field(description="The connected table, by reference.")
    values: dict[str, Scalar] = Field(min_length=1, description="The new row: column to value.")


class TableUpdateInput(BaseModel):
    """Arguments of ``table_update``."""

    model_config = ConfigDict(extra="forbid")

    table: str = Field(description="The connected table, by reference.")
    set: dict[str, Scalar] = Field(min_length=1, description="Column to new value.")
    where: list[Condition] = Field(min_length=1, max_length=20, description="Which rows: conditions, all must hold.")


class TableDeleteInput(BaseModel):
    """Arguments of ``table_delete``."""

    model_config = ConfigDict(extra="forbid")

    table: str = Field(description="The connected table, by reference.")
    where: list[Condition] = Field(min_length=1, max_length=20, description="Which rows: conditions, all must hold.")


@dataclass(frozen=True, slots=True)
class Built:
    """A parameterised statement."""

    sql: str
    params: tuple[Any, ...]


class _Params:
    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.values: list[Any] = []

    def __call__(self, value: Any) -> str:
        self.values.append(value)
        return "?" if self.dialect == "sqlite" else f"${len(self.values)}"


def _checked(table: ConnectedTable, allowed: tuple[str, ...], names: list[str] | tuple[str, ...]) -> None:
    bad = [name for name in names if name not in allowed]
    if bad:
        shown = ", ".join(allowed)
        raise ToolError(
            f"{', '.join(map(repr, bad))}: not a column of {table.table!r} you may use (columns: {shown})",
            error_class="validation",
        )


def _where(table: ConnectedTable, allowed: tuple[str, ...], where: list[Condition], tenant: str, p: _Params) -> str:
    _checked(table, allowed, [c.column for c in where])
    parts: list[str] = []
    if table.tenant_column is not None:
        parts.append(f"{quote_ident(table.tenant_column)} = {p(tenant)}")
    for cond in where:
        col = quote_ident(cond.column)
        if cond.op == "is_null":
            parts.append(f"{col} IS NULL")
        elif cond.op == "not_null":
            parts.append(f"{col} IS NOT NULL")
        elif cond.op == "in":
            values = cond.value if isinstance(cond.value, list) else [cond.value]
            if not values:
                parts.append("1 = 0")
            else:
                parts.append(f"{col} IN ({', '.join(p(v) for v in values)})")
        else:
            if isinstance(cond.value, list):
                raise ToolError(f"{cond.op!r} compares one value, not a list", error_class="validation")
            parts.append(f"{col} {_OPS[cond.op]} {p(cond.value)}")
    return " WHERE " + " AND ".join(parts) if parts else ""


def build_query(
    table: ConnectedTable, allowed: tuple[str, ...], args: TableQueryInput, tenant: str, dialect: Dialect, cap: int
) -> Built:
    """``SELECT`` of allowed columns, the tenant's rows only, at most ``cap`` rows."""
    columns = args.columns or list(allowed)
    _checked(table, allowed, columns)
    _checked(table, allowed, [o.column for o in args.order_by])
    p = _Params(dialect)
    sql = f"SELECT {', '.join(map(quote_ident, columns))} FROM {quote_ident(table.table)}"  # noqa: S608
    sql += _where(table, allowed, args.where, tenant, p)
    if args.order_by:
        keys = (quote_ident(o.column) + (" DESC" if o.descending else "") for o in args.order_by)
        sql += " ORDER BY " + ", ".join(keys)
    sql += f" LIMIT {int(cap)}"
    return Built(sql, tuple(p.values))


def build_insert(
    table: ConnectedTable, allowed: tuple[str, ...], args: TableInsertInput, tenant: str, dialect: Dialect
) -> Built:
    """``INSERT`` of one row; the tenant column is set to the turn's tenant."""
    _checked(table, allowed, list(args.values))
    p = _Params(dialect)
    values = dict(args.values)
    if table.tenant_column is not None:
        values[table.tenant_column] = tenant
    names = ", ".join(map(quote_ident, values))
    marks = ", ".join(p(v) for v in values.values())
    return Built(f"INSERT INTO {quote_ident(table.table)} ({names}) VALUES ({marks})", tuple(p.values))  # noqa: S608


def build_update(
    table: ConnectedTable, allowed: tuple[str, ...], args: TableUpdateInput, tenant: str, dialect: Dialect
) -> Built:
    """``UPDATE`` of the tenant's matching rows (the tenant column is never set)."""
    _checked(table, allowed, list(args.set))
    p = _Params(dialect)
    assignments = ", ".join(f"{quote_ident(name)} = {p(value)}" for name, value in args.set.items())
    sql = f"UPDATE {quote_ident(table.table)} SET {assignments}"  # noqa: S608
    return Built(sql + _where(table, allowed, args.where, tenant, p), tuple(p.values))


def build_delete(
    table: ConnectedTable, allowed: tuple[str, ...], args: TableDeleteInput, tenant: str, dialect: Dialect
) -> Built:
    """``DELETE`` of the tenant's matching rows."""
    p = _Params(dialect)
    sql = f"DELETE FROM {quote_ident(table.table)}"  # noqa: S608
    return Built(sql + _where(table, allowed, args.where, tenant, p), tuple(p.values))
