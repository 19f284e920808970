"""``read_document``: text, Markdown, PDF and DOCX as capped text; CSV and XLSX as data cards.

A data card describes a table (columns, row count, sample rows) without flooding the model's context. Documents are
untrusted: they are parsed in a limited child process (:mod:`switchboard.core.tools.child`), and a parse that hits a
limit is a ``permanent`` error, so the worker's own memory and threads are never at stake.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from switchboard.core.tools.builtin.files import check_relative_path, resolve_in_workspace
from switchboard.core.tools.builtin.sql import load_table
from switchboard.core.tools.child import SandboxLimits, run_callable
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.tools.parsers import MAX_UNZIPPED_BYTES, table_card
from switchboard.core.tools.threads import run_blocking
from switchboard.errors import ToolError

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "TOOLS",
    "DocumentLimits",
    "ReadDocumentInput",
    "document_tools",
    "read_document",
    "table_card",
]

MAX_DOCUMENT_BYTES = 25 * 2**20
"""Default largest document read (``SWITCHBOARD_DOCUMENTS__MAX_BYTES``)."""
TABLE_SUFFIXES = frozenset({".csv", ".tsv", ".xlsx", ".xlsm"})
TEXT_SUFFIXES = frozenset(
    {".txt", ".md", ".markdown", ".rst", ".log", ".json", ".jsonl", ".yaml", ".yml", ".xml", ".html", ".htm", ".ini"}
)
_PARSER = "switchboard.core.tools.parsers:parse"


@dataclass(frozen=True, slots=True)
class DocumentLimits:
    """Bounds of one document parse (``SWITCHBOARD_DOCUMENTS__*``)."""

    max_bytes: int = MAX_DOCUMENT_BYTES
    """Largest file read at all."""
    memory_mb: int = 512
    """Address space of the parsing child."""
    timeout_s: float = 20.0
    """Wall-clock deadline of the parse; the child is killed when it passes."""
    max_output_chars: int = 100_000
    """Longest text returned, whatever ``max_chars`` the model asks for."""
    max_unzipped_bytes: int = MAX_UNZIPPED_BYTES
    """DOCX and XLSX (zip files) whose members really expand past this are refused."""

    def sandbox(self) -> SandboxLimits:
        """The child's limits: memory and time as configured, no files written, output bounded."""
        return SandboxLimits(
            memory_bytes=self.memory_mb * 2**20,
            wall_s=self.timeout_s,
            output_bytes=4 * self.max_output_chars + 2 * 2**20,
        )


class ReadDocumentInput(BaseModel):
    """Arguments of ``read_document``."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="Path relative to the session workspace, e.g. inbox/report.pdf.")
    max_chars: int = Field(20_000, ge=200, le=200_000, description="Longest text returned (head and tail kept).")
    sample_rows: int = Field(5, ge=0, le=50, description="Rows shown in a table's data card.")
    sheet: str | None = Field(None, description="XLSX only: the one sheet to describe (default: every sheet).")
    into_table: str | None = Field(
        None,
        description="CSV/XLSX only: load the rows into this table of your database instead (the first sheet, or "
        "`sheet`); you get its columns and row count back, and query it with sql.",
    )
    replace_table: bool = Field(False, description="With into_table: replace a table of that name if there is one.")

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        return check_relative_path(value)


def _locate(args: ReadDocumentInput, ctx: ToolContext, limits: DocumentLimits) -> tuple[str, int, str]:
    """The document's path relative to the workspace, its size and its suffix; refusals before any parsing."""
    target = resolve_in_workspace(ctx.workspace, args.path)
    if not target.is_file():
        raise ToolError(f"no file {args.path!r} in the session workspace", error_class="validation")
    size = target.stat().st_size
    if size > limits.max_bytes:
        raise ToolError(f"{args.path!r} is {size} bytes, over the {limits.max_bytes}-byte document cap")
    suffix = target.suffix.lower()
    if suffix not in TEXT_SUFFIXES | TABLE_SUFFIXES | {".pdf", ".docx", ""}:
        raise ToolError(
            f"{args.path!r}: {suffix} documents are not supported (text, Markdown, PDF, DOCX, CSV and XLSX are)",
            error_class="validation",
        )
    return target.relative_to(ctx.workspace.resolve()).as_posix(), size, suffix


async def _read(args: ReadDocumentInput, ctx: ToolContext, limits: DocumentLimits) -> dict[str, Any]:
    relative, size, suffix = await run_blocking(ctx, _locate, args, ctx, limits)
    if args.into_table is not None:  # into the session database, not the context
        if suffix not in TABLE_SUFFIXES:
            raise ToolError(f"into_table loads CSV and XLSX only, not {suffix or 'text'}", error_class="validation")
        load = {"path": relative, "suffix": suffix, "sheet": args.sheet, "table": args.into_table}
        loaded = await load_table(
            {**load, "max_unzipped_bytes": limits.max_unzipped_bytes}, ctx, limits.sandbox(), replace=args.replace_table
        )
        return {"path": args.path, "bytes": size, **loaded}
    request = {
        "path": relative,
        "suffix": suffix,
        "max_chars": min(args.max_chars, limits.max_output_chars),
        "sample_rows": args.sample_rows,
        "sheet": args.sheet,
        "max_unzipped_bytes": limits.max_unzipped_bytes,
    }
    done = await run_callable(_PARSER, request, limits.sandbox(), cwd=str(ctx.workspace.resolve()))
    if done.status == "ok" and isinstance(done.value, dict):
        if "result" in done.value:
            return {"path": args.path, "bytes": size, **done.value["result"]}
        message = str(done.value.get("error", "could not be read"))
        if "error_class" in done.value:  # a refusal, worded in full by the parser
            raise ToolError(message, error_class=str(done.value["error_class"]))
        raise ToolError(f"{args.path!r} {message}")
    if done.status in {"timeout", "memory", "cpu", "output"}:
        raise ToolError(
            f"{args.path!r} is too large or too complex to read within the limits: {done.error}; "
            "do not retry it; ask for a smaller or simpler file",
            error_class="permanent",
        )
    raise ToolError(f"{args.path!r} could not be read: {done.error or done.status}", error_class="permanent")


def document_tools(limits: DocumentLimits) -> list[Tool]:
    """The document tools under ``limits`` (the worker builds them from its settings)."""

    async def read(args: ReadDocumentInput, ctx: ToolContext) -> dict[str, Any]:
        return await _read(args, ctx, limits)

    return [
        Tool(
            name="read_document",
            description="Read a document from your workspace: text, Markdown, PDF and DOCX come back as text "
            "(long ones: head and tail); CSV and XLSX as a data card (columns, row count, sample rows), or loaded "
            "into a table of your database with into_table.",
            input=ReadDocumentInput,
            fn=read,
            side_effect="read",
            output_trust="data",  # outside text: a data block, and later risky writes need confirmation
            timeout_s=limits.timeout_s + 5.0,
            connector="documents",
            retry_on=frozenset(),
        )
    ]


async def read_document(args: ReadDocumentInput, ctx: ToolContext) -> dict[str, Any]:
    """Tool body: a workspace document as capped text, or as a data card for tables."""
    return await _read(args, ctx, DocumentLimits())


TOOLS: list[Tool] = document_tools(DocumentLimits())
"""The document reader, under the default limits."""
