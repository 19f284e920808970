"""``sql``: one SQLite statement on the session database and the agent's shared read-only databases.

The tables, their columns and what they mean are in the model's context
(:func:`~switchboard.core.sql.card.database_card`), so the model asks only for the rows it needs; the result is
capped in rows and characters and says how many rows were left out. Reads reach every attached database; writes
only the session's own (:mod:`switchboard.core.sql.store`).
A CodeAct program calls it as ``sql(statement=...)`` like any tool.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from switchboard.core.sql.databases import is_identifier
from switchboard.core.sql.guard import SqlLimits
from switchboard.core.sql.store import Statement, adopt_table, run_statement
from switchboard.core.tools.child import SandboxLimits, run_callable
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.tools.threads import run_blocking
from switchboard.core.workspaces.disk import Workspaces, make_private_dir
from switchboard.errors import ToolError

__all__ = ["TOOLS", "SqlInput", "load_table", "sql_tools"]

_LOADER = "switchboard.core.sql.load:load"


class SqlInput(BaseModel):
    """Arguments of ``sql``."""

    model_config = ConfigDict(extra="forbid")

    statement: str = Field(
        min_length=1,
        max_length=100_000,
        description="One SQLite statement. Reads (SELECT, WITH) may use every database listed in your context "
        "(shared ones as name.table); writes (CREATE TABLE, INSERT, UPDATE, DELETE, DROP, ALTER) only change main, "
        "your own database. Each statement commits on its own.",
    )
    description: str | None = Field(
        None,
        max_length=500,
        description="When the statement creates a table: what one row is and what the table holds (shown with "
        "its columns in your context from then on).",
    )
    max_rows: int = Field(50, ge=1, le=500, description="Most rows returned; the rest are counted, not shown.")


def sql_tools(limits: SqlLimits) -> list[Tool]:
    """The ``sql`` tool under ``limits``."""

    async def sql(args: SqlInput, ctx: ToolContext) -> dict[str, Any]:
        statement = Statement(
            sql=args.statement,
            max_rows=min(args.max_rows, limits.max_rows),
            description=args.description,
            key=ctx.idempotency_key,
            untrusted=ctx.untrusted_context,
        )
        workspace = make_private_dir(ctx.workspace)
        spaces = ctx.workspaces or Workspaces(None)
        return await run_blocking(ctx, run_statement, workspace, statement, ctx.databases, spaces, limits)

    return [
        Tool(
            name="sql",
            description="Run one SQLite statement on your databases (their tables and columns are listed in your "
            "context). Fetch only the rows you need: filter, aggregate and LIMIT in SQL; results are capped and say "
            "how many rows were left out.",
            input=SqlInput,
            fn=sql,
            # Reads must never be answered from a record, so the gateway keeps none; writes are recorded under the
            # call's idempotency key inside the database itself, in the same transaction (see sqlstore).
            side_effect="read",
            output_trust="data",  # rows may hold outside text (a loaded document, shared data)
            timeout_s=limits.timeout_s + 10.0,
            connector="sql",
            retry_on=frozenset(),
            max_inline_bytes=4 * limits.max_chars + 4096,
        )
    ]


async def load_table(
    request: dict[str, Any], ctx: ToolContext, sandbox: SandboxLimits, *, replace: bool
) -> dict[str, Any]:
    """Load the CSV/XLSX ``request`` names into a table of the session database; returns the table's description.

    ``request`` is the document parser's (``path`` relative to the workspace, ``suffix``, ``sheet``,
    ``max_unzipped_bytes``) plus ``table``. The document is parsed in a sandbox child under ``sandbox`` that
    writes one new SQLite file, at most the session quota in size; the table is then copied into the session
    database through the workspace quotas.

    Raises:
        ToolError: a bad table name (``validation``), a document that cannot be loaded, or a quota.
    """
    table = str(request["table"])
    if not is_identifier(table):
        raise ToolError(
            f"into_table {table!r} is not a plain table name (letters, digits and _, starting with a letter)",
            error_class="validation",
        )
    spaces = ctx.workspaces or Workspaces(None)
    workspace = make_private_dir(ctx.workspace)
    scratch = Path(tempfile.mkdtemp(prefix="switchboard-load-"))
    try:
        out = scratch / "table.sqlite"
        limits = SandboxLimits(
            memory_bytes=sandbox.memory_bytes,
            wall_s=sandbox.wall_s,
            file_bytes=spaces.quotas.session_bytes,
            output_bytes=2**20,
        )
        done = await run_callable(_LOADER, {**request, "out": str(out)}, limits, cwd=str(workspace))
        if done.status != "ok" or not isinstance(done.value, dict):
            raise ToolError(
                f"{request['path']!r} could not be loaded within the limits ({done.error or done.status}); "
                "do not retry it; ask for a smaller file",
                error_class="permanent",
            )
        if "result" not in done.value:
            message = str(done.value.get("error", "could not be loaded"))
            raise ToolError(
                f"{request['path']!r}: {message}", error_class=str(done.value.get("error_class", "permanent"))
            )
        loaded: dict[str, Any] = done.value["result"]
        outcome = {
            **loaded,
            "database": "main",
            "hint": f"query the table {table} with sql; its columns are now in your context",
        }
        source = str(request["path"]) + (f" (sheet {request['sheet']})" if request.get("sheet") else "")
        return await run_blocking(
            ctx,
            adopt_table,
            workspace,
            out,
            table,
            source=source,
            replace=replace,
            key=ctx.idempotency_key,
            outcome=outcome,
            workspaces=spaces,
            limits=SqlLimits(),
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


TOOLS: list[Tool] = sql_tools(SqlLimits())
"""``sql`` under the default limits."""
