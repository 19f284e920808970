"""One connected table as the table tools use it: its permission, allowed columns, tenant filter and caps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from switchboard.core.tables.backends import TableBackend
from switchboard.core.tables.config import ConnectedTable, Operation
from switchboard.core.tables.statements import (
    Built,
    TableDeleteInput,
    TableInsertInput,
    TableQueryInput,
    TableUpdateInput,
    build_delete,
    build_insert,
    build_query,
    build_update,
)
from switchboard.errors import ToolError

__all__ = ["TableAccess"]


@dataclass(slots=True)
class TableAccess:
    """A connected table bound to its database."""

    ref: str
    config: ConnectedTable
    backend: TableBackend
    _allowed: tuple[str, ...] | None = field(default=None, repr=False)

    def _permit(self, operation: Operation) -> None:
        if operation not in self.config.operations:
            raise ToolError(
                f"the table {self.ref!r} is connected with {self.config.permission!r} permission: {operation} "
                "is not allowed on it",
                error_class="auth",
            )

    async def allowed(self) -> tuple[str, ...]:
        """The columns the model may use: the configured ones, or every column but the tenant's."""
        if self._allowed is None:
            found = await self.backend.columns(self.config.table)
            if not found:
                raise ToolError(f"the table {self.ref!r} is not in its database", error_class="permanent")
            # SQLite (and an unquoted PostgreSQL name) matches identifiers whatever their case: ``TenantId`` in the
            # database is the tenant column ``tenantid`` of the YAML file, and must never be the model's to use
            tenant = (self.config.tenant_column or "").lower()
            if self.config.columns:
                missing = [c for c in self.config.columns if c not in found]
                if missing:
                    raise ToolError(f"the table {self.ref!r} has no column {missing[0]!r}", error_class="permanent")
                if any(c.lower() == tenant for c in self.config.columns):
                    raise ToolError(
                        f"the table {self.ref!r} lists its tenant column (in another case) among its columns",
                        error_class="permanent",
                    )
                self._allowed = self.config.columns
            else:
                self._allowed = tuple(c for c in found if c.lower() != tenant)
        return self._allowed

    async def query(self, args: TableQueryInput, tenant: str) -> dict[str, Any]:
        """The tenant's matching rows, at most the table's row cap; the rest counted as ``more``."""
        self._permit("table_query")
        cap = min(args.limit, self.config.max_rows)
        built = build_query(self.config, await self.allowed(), args, tenant, self.backend.dialect, cap + 1)
        columns, rows = await self.backend.fetch(built, timeout_s=self.config.timeout_s)
        shown = [list(row) for row in rows[:cap]]
        found: dict[str, Any] = {"table": self.ref, "columns": columns, "rows": shown, "row_count": len(shown)}
        if len(rows) > cap:
            found["more"] = f"more rows than the {cap} shown: narrow the where conditions"
        return found

    async def insert(self, args: TableInsertInput, tenant: str, key: str = "") -> dict[str, Any]:
        """Insert one row for the tenant (once per idempotency ``key``)."""
        self._permit("table_insert")
        built = build_insert(self.config, await self.allowed(), args, tenant, self.backend.dialect)
        return {"table": self.ref, "inserted": await self._write(built, key)}

    async def update(self, args: TableUpdateInput, tenant: str, key: str = "") -> dict[str, Any]:
        """Update the tenant's matching rows (once per idempotency ``key``)."""
        self._permit("table_update")
        built = build_update(self.config, await self.allowed(), args, tenant, self.backend.dialect)
        return {"table": self.ref, "updated": await self._write(built, key)}

    async def delete(self, args: TableDeleteInput, tenant: str, key: str = "") -> dict[str, Any]:
        """Delete the tenant's matching rows (once per idempotency ``key``)."""
        self._permit("table_delete")
        built = build_delete(self.config, await self.allowed(), args, tenant, self.backend.dialect)
        return {"table": self.ref, "deleted": await self._write(built, key)}

    async def _write(self, built: Built, key: str) -> int:
        return await self.backend.execute(built, timeout_s=self.config.timeout_s, key=key)
