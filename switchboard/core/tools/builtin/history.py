"""``search_history``: find earlier parts of the conversation in the session's full event log.

Compaction keeps only recent turns verbatim in the prompt; the full log stays outside it. This tool reads
it through :class:`HistorySearch`, a Protocol the queue layer's session store implements.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from switchboard.core.agent.programs import cap_output
from switchboard.core.protocols import conforms
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.errors import ToolError

__all__ = ["MAX_RESULT_CHARS", "TOOLS", "HistorySearch", "SearchHistoryInput", "search_history"]

MAX_RESULT_CHARS = 1000
"""Longest text of one result (head and tail kept)."""


@runtime_checkable
class HistorySearch(Protocol):
    """Search over a session's full history and event log (implemented by the queue layer's store)."""

    async def search(self, query: str, limit: int) -> list[dict[str, Any]]:
        """Entries matching ``query`` (case-insensitive words), most recent first, at most ``limit``.

        Each result is JSON-shaped: at least ``text`` and ``role`` or ``kind``, with ``seq`` (its position
        in the log) and ``at`` where known.
        """
        ...


class SearchHistoryInput(BaseModel):
    """Arguments of ``search_history``."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=200, description="Words to look for in earlier messages and events.")
    limit: int = Field(10, ge=1, le=50, description="Most results returned.")


def _trim(result: dict[str, Any]) -> dict[str, Any]:
    return {k: cap_output(v, MAX_RESULT_CHARS) if isinstance(v, str) else v for k, v in result.items()}


async def search_history(args: SearchHistoryInput, ctx: ToolContext) -> dict[str, Any]:
    """Tool body: search the session's full log."""
    store = ctx.store
    if not conforms(store, HistorySearch):
        raise ToolError("this session's history cannot be searched here (its store has no search)")
    found = await store.search(args.query.strip(), args.limit)
    results = [_trim(dict(item)) for item in found[: args.limit]]
    return {"query": args.query.strip(), "count": len(results), "results": results}


TOOLS: list[Tool] = [
    Tool(
        name="search_history",
        description="Search the full conversation history, including turns no longer shown to you, "
        "for words you name; returns matching messages and events, most recent first.",
        input=SearchHistoryInput,
        fn=search_history,
        side_effect="read",
        output_trust="data",  # outside text: a data block, and later risky writes need confirmation
        timeout_s=10.0,
    )
]
"""The history search tool."""
