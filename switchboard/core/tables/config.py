"""A connected table as written in the YAML file (:class:`ConnectedTable`), and the cost model of the table tools.

The table tools are generic and shared by every connected table (the model names the table by reference), so an
agent's tool cost is the union of the operations its tables enable, never a sum per table: ``read`` costs 1
(``table_query``), ``write`` 5 (plus ``table_insert`` and ``table_update``), ``full`` 6 (plus ``table_delete``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from switchboard.core.sql.databases import is_identifier

__all__ = [
    "OPERATION_COST",
    "PERMISSION_OPERATIONS",
    "ConnectedTable",
    "Operation",
    "Permission",
    "PostgresDatabase",
    "TableCost",
    "check_table_databases",
    "table_cost",
    "tables_card",
]

Permission = Literal["read", "write", "full"]
Operation = Literal["table_query", "table_insert", "table_update", "table_delete"]

OPERATION_COST: dict[Operation, int] = {"table_query": 1, "table_insert": 2, "table_update": 2, "table_delete": 1}
"""What each table tool adds to the agent's tool cost (read 1, write 5, full 6)."""
PERMISSION_OPERATIONS: dict[Permission, tuple[Operation, ...]] = {
    "read": ("table_query",),
    "write": ("table_query", "table_insert", "table_update"),
    "full": ("table_query", "table_insert", "table_update", "table_delete"),
}
"""The table tools each permission enables."""


class ConnectedTable(BaseModel):
    """One table of a database an agent may use through the table tools, within its permission.

    ```yaml
    agents:
      shop:
        tables:
          orders:                      # the reference the model names
            database: shop             # a name under the agent's databases (SQLite) or postgres
            table: orders
            permission: read           # read | write | full
            columns: [id, status, total]
            tenant_column: tenant_id   # the gateway adds tenant_id = <the turn's tenant> to every statement
    ```
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    database: str
    """The database holding it, by name."""
    table: str
    permission: Permission = "read"
    columns: tuple[str, ...] = ()
    """The columns the model may read and write; empty: every column of the table."""
    tenant_column: str | None = None
    """The column holding the tenant: every statement is limited to the turn's tenant's rows, and new rows get it."""
    description: str = ""
    """What one row is, shown to the model."""
    max_rows: int = Field(200, ge=1, le=10_000)
    """Most rows one query returns (the rest are counted)."""
    timeout_s: float = Field(5.0, gt=0, le=120)
    """Longest a statement may run before it is stopped."""

    @field_validator("database", "table", "tenant_column")
    @classmethod
    def _identifier(cls, value: str | None) -> str | None:
        if value is not None and not is_identifier(value):
            raise ValueError(f"{value!r} is not a plain identifier (letters, digits, _)")
        return value

    @field_validator("columns")
    @classmethod
    def _columns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [c for c in value if not is_identifier(c)]
        if bad:
            raise ValueError(f"column names are plain identifiers (not {', '.join(map(repr, bad))})")
        return value

    @model_validator(mode="after")
    def _tenant_not_listed(self) -> ConnectedTable:
        if self.tenant_column is not None and self.tenant_column in self.columns:
            raise ValueError(f"the tenant column {self.tenant_column!r} is set by the gateway: do not list it")
        return self

    @property
    def operations(self) -> tuple[Operation, ...]:
        """The table tools this table's permission enables."""
        return PERMISSION_OPERATIONS[self.permission]


class PostgresDatabase(BaseModel):
    """A PostgreSQL database an agent's tables live in; its connection string is read from the environment.

    ```yaml
    agents:
      shop:
        postgres:
          crm: {dsn_env: CRM_DATABASE_URL}   # postgresql://user:password@host:5432/crm, never in the YAML file
    ```
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    dsn_env: str = Field(pattern=r"^[A-Z_][A-Z0-9_]*$")
    """The environment variable holding ``postgresql://…`` (with its password: the model never sees it)."""
    max_connections: int = Field(5, ge=1, le=100)


def check_table_databases(
    tables: Mapping[str, ConnectedTable], sqlite: Iterable[str], postgres: Iterable[str]
) -> list[str]:
    """Tables whose ``database`` names neither a SQLite database nor a PostgreSQL one, and names used by both."""
    sqlite, postgres = set(sqlite), set(postgres)
    found = [f"database name {name!r} is both a SQLite and a PostgreSQL database" for name in sorted(sqlite & postgres)]
    for ref, table in tables.items():
        if table.database not in sqlite | postgres:
            found.append(f"table {ref!r}: no database {table.database!r} under databases or postgres")
    bad = [ref for ref in tables if not is_identifier(ref)]
    found.extend(f"table reference {ref!r} is not a plain identifier" for ref in bad)
    return found


class TableCost(BaseModel):
    """An agent's table tool cost: the union of the operations its tables enable, with its parts."""

    model_config = ConfigDict(frozen=True)

    total: int
    parts: dict[str, int]
    """Each enabled table tool and what it counts."""

    def describe(self) -> str:
        """``6 (table_query 1 + table_insert 2 + ...)``, or ``0`` without tables."""
        if not self.parts:
            return "0"
        return f"{self.total} (" + " + ".join(f"{name} {cost}" for name, cost in self.parts.items()) + ")"


def table_cost(tables: Mapping[str, ConnectedTable] | Iterable[ConnectedTable]) -> TableCost:
    """The tool cost of connecting ``tables``: each enabled operation counted once, whatever the number of tables."""
    listed = tables.values() if isinstance(tables, Mapping) else tables
    enabled = {op for table in listed for op in table.operations}
    parts = {op: cost for op, cost in OPERATION_COST.items() if op in enabled}
    return TableCost(total=sum(parts.values()), parts=parts)


def tables_card(tables: Mapping[str, ConnectedTable]) -> str:
    """What the model is told of its connected tables: reference, permission, columns and description."""
    if not tables:
        return ""
    lines = ["Connected tables (name one as `table` in table_query, table_insert, table_update, table_delete):"]
    for ref, table in tables.items():
        columns = ", ".join(table.columns) if table.columns else "every column"
        about = f": {table.description}" if table.description else ""
        lines.append(f"- {ref} ({table.permission}: {', '.join(table.operations)}; columns: {columns}){about}")
    return "\n".join(lines)
