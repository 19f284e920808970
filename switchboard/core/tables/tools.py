"""The four generic table tools, shared by every connected table of an agent (the model names the table).

Each goes through the tool gateway like any tool: ``table_query`` is a read; the others are writes, so they carry
the call's idempotency key, are gated by policy and recorded by the gateway's effect store. The database keeps the
key with the write in one transaction (:data:`~switchboard.core.tables.backends.LEDGER_TABLE`), so the writes are
``idempotent``: a re-run under the same key is answered from the database, never written twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from switchboard.core.tables.access import TableAccess
from switchboard.core.tables.config import OPERATION_COST
from switchboard.core.tables.statements import TableDeleteInput, TableInsertInput, TableQueryInput, TableUpdateInput
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.errors import ToolError

__all__ = ["ConnectedTables", "table_tools"]

ConnectedTables = Callable[[str], Mapping[str, TableAccess]]
"""An agent's connected tables by reference, from the agent's name."""


def table_tools(connected: ConnectedTables) -> list[Tool]:
    """``table_query``, ``table_insert``, ``table_update`` and ``table_delete`` over ``connected``."""

    def pick(ctx: ToolContext, ref: str) -> TableAccess:
        tables = connected(ctx.agent)
        found = tables.get(ref)
        if found is None:
            known = ", ".join(sorted(tables)) or "none"
            raise ToolError(f"no connected table {ref!r} (connected: {known})", error_class="validation")
        return found

    async def table_query(args: TableQueryInput, ctx: ToolContext) -> dict[str, Any]:
        return await pick(ctx, args.table).query(args, ctx.tenant)

    async def table_insert(args: TableInsertInput, ctx: ToolContext) -> dict[str, Any]:
        return await pick(ctx, args.table).insert(args, ctx.tenant, ctx.idempotency_key)

    async def table_update(args: TableUpdateInput, ctx: ToolContext) -> dict[str, Any]:
        return await pick(ctx, args.table).update(args, ctx.tenant, ctx.idempotency_key)

    async def table_delete(args: TableDeleteInput, ctx: ToolContext) -> dict[str, Any]:
        return await pick(ctx, args.table).delete(args, ctx.tenant, ctx.idempotency_key)

    return [
        Tool(
            name="table_query",
            description="Read rows of a connected table: choose columns, where conditions, order and limit.",
            input=TableQueryInput,
            fn=table_query,
            output_trust="data",
            connector="tables",
            cost=OPERATION_COST["table_query"],
        ),
        Tool(
            name="table_insert",
            description="Insert one row into a connected table you may write.",
            input=TableInsertInput,
            fn=table_insert,
            side_effect="write",
            idempotent=True,
            risk="medium",
            connector="tables",
            cost=OPERATION_COST["table_insert"],
            resources=lambda a: (f"table {a.table}",),
        ),
        Tool(
            name="table_update",
            description="Change the rows of a connected table you may write that match all where conditions.",
            input=TableUpdateInput,
            fn=table_update,
            side_effect="write",
            idempotent=True,
            risk="medium",
            connector="tables",
            cost=OPERATION_COST["table_update"],
            resources=lambda a: (f"table {a.table}",),
        ),
        Tool(
            name="table_delete",
            description="Delete the rows of a connected table with full permission that match all where conditions.",
            input=TableDeleteInput,
            fn=table_delete,
            side_effect="write",
            idempotent=True,
            risk="high",
            reversible=False,
            connector="tables",
            cost=OPERATION_COST["table_delete"],
            resources=lambda a: (f"table {a.table}",),
        ),
    ]
