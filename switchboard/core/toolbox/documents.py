"""``read_document``: text, Markdown, PDF and DOCX as capped text; CSV and XLSX as data cards.

A data card describes a table without flooding the model's context: its columns (with a type guessed from
the first rows), its row count and a few sample rows. Text keeps its head and tail around an omission
marker. Paths are confined to the session workspace as for the file tools; parsing runs in a thread.
"""

from __future__ import annotations

import asyncio
import csv
import datetime as dt
import io
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from switchboard.core.programs import cap_output
from switchboard.core.toolbox.files import check_relative_path, resolve_in_workspace
from switchboard.core.tools import Tool, ToolContext
from switchboard.errors import ToolError

__all__ = ["MAX_DOCUMENT_BYTES", "TOOLS", "ReadDocumentInput", "read_document", "table_card"]

MAX_DOCUMENT_BYTES = 32 * 2**20
MAX_UNZIPPED_BYTES = 256 * 2**20
"""DOCX and XLSX are zip files: refuse ones that would expand past this (zip bombs)."""
MAX_PDF_PAGES = 300
MAX_ROWS_COUNTED = 2_000_000
MAX_SHEETS = 20
TYPE_SAMPLE_ROWS = 1000
CELL_CHARS = 200
TABLE_SUFFIXES = frozenset({".csv", ".tsv", ".xlsx", ".xlsm"})
TEXT_SUFFIXES = frozenset(
    {".txt", ".md", ".markdown", ".rst", ".log", ".json", ".jsonl", ".yaml", ".yml", ".xml", ".html", ".htm", ".ini"}
)


class ReadDocumentInput(BaseModel):
    """Arguments of ``read_document``."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="Path relative to the session workspace, e.g. inbox/report.pdf.")
    max_chars: int = Field(20_000, ge=200, le=200_000, description="Longest text returned (head and tail kept).")
    sample_rows: int = Field(5, ge=0, le=50, description="Rows shown in a table's data card.")
    sheet: str | None = Field(None, description="XLSX only: the one sheet to describe (default: every sheet).")

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        return check_relative_path(value)


def _cell(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    text = str(value)
    return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 1] + "…"


def _kind(value: Any) -> str:
    if value is None or value == "":
        return "empty"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float | Decimal):
        return "float"
    if isinstance(value, dt.datetime | dt.date):
        return "date"
    text = str(value).strip()
    for parse, kind in ((int, "int"), (float, "float")):
        try:
            parse(text)
        except ValueError:
            continue
        return kind
    if text.lower() in {"true", "false"}:
        return "bool"
    try:
        dt.date.fromisoformat(text[:10])
    except ValueError:
        return "text"
    return "date"


def _column_type(kinds: set[str]) -> str:
    kinds.discard("empty")
    if not kinds:
        return "empty"
    if kinds == {"int", "float"}:
        return "float"
    return kinds.pop() if len(kinds) == 1 else "mixed"


def table_card(rows: Iterable[Sequence[Any]], *, sample_rows: int = 5) -> dict[str, Any]:
    """A data card for a table whose first row is the header: columns with types, row count, sample rows."""
    iterator = iter(rows)
    header = next(iterator, None)
    if header is None:
        return {"columns": [], "rows": 0, "sample": []}
    names: list[str] = []
    for index, raw in enumerate(header, start=1):
        name = str(raw).strip() if raw not in (None, "") else f"column_{index}"
        names.append(name if name not in names else f"{name}_{index}")
    kinds: list[set[str]] = [set() for _ in names]
    sample: list[dict[str, Any]] = []
    count = 0
    for row in iterator:
        if not any(cell not in (None, "") for cell in row):
            continue
        count += 1
        if count <= TYPE_SAMPLE_ROWS:
            for index, cell in enumerate(row[: len(names)]):
                kinds[index].add(_kind(cell))
        if len(sample) < sample_rows:
            sample.append({names[i]: _cell(cell) for i, cell in enumerate(row[: len(names)])})
        if count >= MAX_ROWS_COUNTED:
            break
    columns = [{"name": name, "type": _column_type(kinds[i])} for i, name in enumerate(names)]
    return {"columns": columns, "rows": count, "rows_capped": count >= MAX_ROWS_COUNTED, "sample": sample}


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _csv(target: Path, args: ReadDocumentInput) -> dict[str, Any]:
    text = _decode(target.read_bytes())
    dialect: type[csv.Dialect] | csv.Dialect = csv.excel_tab if target.suffix.lower() == ".tsv" else csv.excel
    if target.suffix.lower() != ".tsv":
        try:
            dialect = csv.Sniffer().sniff(text[:65536], delimiters=",;\t|")
        except csv.Error:
            dialect = csv.excel
    card = table_card(csv.reader(io.StringIO(text, newline=""), dialect), sample_rows=args.sample_rows)
    return {"kind": "table", "format": target.suffix.lower().lstrip("."), **card}


def _check_zip(target: Path) -> None:
    try:
        with zipfile.ZipFile(target) as archive:
            expanded = sum(info.file_size for info in archive.infolist())
    except zipfile.BadZipFile:
        raise ToolError(f"{target.name} is not a valid {target.suffix} file (not a zip archive)") from None
    if expanded > MAX_UNZIPPED_BYTES:
        raise ToolError(f"{target.name} would expand to {expanded} bytes: too large to read")


def _xlsx(target: Path, args: ReadDocumentInput) -> dict[str, Any]:
    import openpyxl

    _check_zip(target)
    workbook = openpyxl.load_workbook(target, read_only=True, data_only=True)
    try:
        names = list(workbook.sheetnames)
        if args.sheet is not None and args.sheet not in names:
            raise ToolError(f"no sheet {args.sheet!r}; the sheets are {names}", error_class="validation")
        chosen = [args.sheet] if args.sheet is not None else names[:MAX_SHEETS]
        sheets = []
        for name in chosen:
            rows: Iterator[Sequence[Any]] = workbook[name].iter_rows(values_only=True)
            sheets.append({"name": name, **table_card(rows, sample_rows=args.sample_rows)})
    finally:
        workbook.close()
    return {"kind": "workbook", "format": "xlsx", "sheet_names": names, "sheets": sheets}


def _pdf(target: Path) -> tuple[str, dict[str, Any]]:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(target)
        if reader.is_encrypted and not reader.decrypt(""):
            raise ToolError(f"{target.name} is password-protected")
        pages = len(reader.pages)
        texts = [
            f"--- page {number} ---\n{(reader.pages[number - 1].extract_text() or '').strip()}"
            for number in range(1, min(pages, MAX_PDF_PAGES) + 1)
        ]
    except PdfReadError as exc:
        raise ToolError(f"{target.name} is not a readable PDF: {exc}") from None
    return "\n\n".join(texts), {"pages": pages, "pages_read": min(pages, MAX_PDF_PAGES)}


def _docx(target: Path) -> tuple[str, dict[str, Any]]:
    import docx
    from docx.table import Table

    _check_zip(target)
    document = docx.Document(str(target))
    blocks: list[str] = []
    for block in document.iter_inner_content():
        if isinstance(block, Table):
            for row in block.rows:
                blocks.append(" | ".join(cell.text.strip() for cell in row.cells))
            continue
        text = block.text.strip()
        if not text:
            continue
        style = (block.style.name if block.style is not None else "") or ""
        if style.startswith("Heading ") and style[8:].isdigit():
            text = "#" * int(style[8:]) + " " + text
        elif style == "Title":
            text = "# " + text
        blocks.append(text)
    return "\n\n".join(blocks), {"paragraphs": len(document.paragraphs), "tables": len(document.tables)}


def _read(args: ReadDocumentInput, ctx: ToolContext) -> dict[str, Any]:
    target = resolve_in_workspace(ctx.workspace, args.path)
    if not target.is_file():
        raise ToolError(f"no file {args.path!r} in the session workspace", error_class="validation")
    size = target.stat().st_size
    if size > MAX_DOCUMENT_BYTES:
        raise ToolError(f"{args.path!r} is {size} bytes, over the {MAX_DOCUMENT_BYTES}-byte document cap")
    suffix = target.suffix.lower()
    if suffix not in TEXT_SUFFIXES | TABLE_SUFFIXES | {".pdf", ".docx", ""}:
        raise ToolError(
            f"{args.path!r}: {suffix} documents are not supported (text, Markdown, PDF, DOCX, CSV and XLSX are)",
            error_class="validation",
        )
    try:
        found = _parse(target, suffix, args)
    except ToolError:
        raise
    except Exception as exc:  # parsers raise many kinds of errors on malformed files; all mean "unreadable"
        raise ToolError(f"{args.path!r} could not be read as {suffix or 'text'}: {type(exc).__name__}: {exc}") from None
    return {"path": args.path, "bytes": size, **found}


def _parse(target: Path, suffix: str, args: ReadDocumentInput) -> dict[str, Any]:
    if suffix in {".csv", ".tsv"}:
        return _csv(target, args)
    if suffix in {".xlsx", ".xlsm"}:
        return _xlsx(target, args)
    extra: dict[str, Any] = {}
    if suffix == ".pdf":
        text, extra = _pdf(target)
    elif suffix == ".docx":
        text, extra = _docx(target)
    else:
        text = _decode(target.read_bytes())
    content = cap_output(text, args.max_chars)
    fmt = {"": "text", ".markdown": "md"}.get(suffix, suffix.lstrip("."))
    return {"kind": "text", "format": fmt, **extra, "chars": len(text), "truncated": content != text, "text": content}


async def read_document(args: ReadDocumentInput, ctx: ToolContext) -> dict[str, Any]:
    """Tool body: a workspace document as capped text, or as a data card for tables."""
    return await asyncio.to_thread(_read, args, ctx)


TOOLS: list[Tool] = [
    Tool(
        name="read_document",
        description="Read a document from your workspace: text, Markdown, PDF and DOCX come back as text "
        "(long ones: head and tail); CSV and XLSX as a data card (columns, row count, sample rows).",
        input=ReadDocumentInput,
        fn=read_document,
        side_effect="read",
        timeout_s=30.0,
    )
]
"""The document reader."""
