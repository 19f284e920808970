"""Document parsers for ``read_document``: they run in a sandbox child, never in the worker.

:func:`parse` is the child's entry point. Documents are untrusted, so besides the child's memory, CPU and time
limits every parser bounds its own work: zip members are decompressed as a stream against a cap (whatever their
headers declare), tables read at most :data:`MAX_COLUMNS` columns, PDF pages sharing one content stream are read
once, and only the pages whose text is shown (head and tail) are extracted.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from switchboard.core.agent.programs import cap_output
from switchboard.core.workspaces.safepaths import read_bytes
from switchboard.errors import ToolError

__all__ = ["MAX_COLUMNS", "MAX_UNZIPPED_BYTES", "csv_dialect", "parse", "table_card"]

MAX_UNZIPPED_BYTES = 128 * 2**20
"""DOCX and XLSX are zip files: refuse ones whose members really expand past this (zip bombs)."""
MAX_XML_PART_BYTES = 32 * 2**20
"""A DOCX's XML parts are parsed whole: refuse one that expands past this."""
MAX_PDF_PAGES = 2000
MAX_ROWS_COUNTED = 1_000_000
MAX_COLUMNS = 500
"""Columns of a table described; wider tables say how many there were."""
MAX_SHEETS = 20
TYPE_SAMPLE_ROWS = 1000
CELL_CHARS = 200
SNIFF_CHARS = 16384


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
    text = str(value).strip()[:64]
    for parse_as, kind in ((int, "int"), (float, "float")):
        try:
            parse_as(text)
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


def table_card(
    rows: Iterable[Sequence[Any]], *, sample_rows: int = 5, max_rows: int = MAX_ROWS_COUNTED
) -> dict[str, Any]:
    """A data card for a table whose first row is the header: columns with types, row count, sample rows.

    At most :data:`MAX_COLUMNS` columns are described (``columns_total`` says how many the header had) and at
    most ``max_rows`` rows counted (``rows_capped``).
    """
    iterator = iter(rows)
    header = next(iterator, None)
    if header is None:
        return {"columns": [], "rows": 0, "sample": []}
    total_columns = 0
    for index, raw in enumerate(header, start=1):  # a reader may pad the header with blanks: they are not columns
        if raw not in (None, ""):
            total_columns = index
    total_columns = total_columns or len(header)
    names: list[str] = []
    seen: set[str] = set()
    for index, raw in enumerate(header[:total_columns], start=1):
        if index > MAX_COLUMNS:
            break
        name = str(raw).strip()[:CELL_CHARS] if raw not in (None, "") else f"column_{index}"
        name = name if name not in seen else f"{name}_{index}"
        seen.add(name)
        names.append(name)
    width = len(names)
    kinds: list[set[str]] = [set() for _ in names]
    sample: list[dict[str, Any]] = []
    count = 0
    blank: object = None
    for row in iterator:
        if row is blank:  # a reader pads gaps with one shared empty row: skip it without scanning it again
            continue
        cells = row[:width]
        if not any(cell not in (None, "") for cell in cells):
            blank = row
            continue
        count += 1
        if count <= TYPE_SAMPLE_ROWS:
            for index, cell in enumerate(cells):
                kinds[index].add(_kind(cell))
        if len(sample) < sample_rows:
            sample.append({names[i]: _cell(cell) for i, cell in enumerate(cells)})
        if count >= max_rows:
            break
    columns = [{"name": name, "type": _column_type(kinds[i])} for i, name in enumerate(names)]
    card: dict[str, Any] = {"columns": columns, "rows": count, "rows_capped": count >= max_rows, "sample": sample}
    if total_columns > width:
        card["columns_total"] = total_columns
    return card


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def csv_dialect(text: str, suffix: str) -> type[csv.Dialect] | csv.Dialect:
    """The dialect of a delimited file's ``text``: tabs for ``.tsv``, else sniffed (``excel`` when unsure)."""
    if suffix == ".tsv":
        return csv.excel_tab
    try:
        return csv.Sniffer().sniff(text[:SNIFF_CHARS], delimiters=",;\t|")
    except csv.Error:
        return csv.excel


def _csv(target: Path, suffix: str, sample_rows: int) -> dict[str, Any]:
    text = _decode(read_bytes(Path(), target.parts))  # from the workspace (cwd), no link followed
    dialect = csv_dialect(text, suffix)
    card = table_card(csv.reader(io.StringIO(text, newline=""), dialect), sample_rows=sample_rows)
    return {"kind": "table", "format": suffix.lstrip("."), **card}


def _check_zip(target: Path, cap: int, xml_cap: int | None = None) -> None:
    """Refuse a zip whose members expand past ``cap`` bytes, or one XML part past ``xml_cap``.

    Sizes are counted as the members really inflate, whatever their headers declare.
    """
    try:
        with zipfile.ZipFile(target) as archive:
            infos = archive.infolist()
            declared = sum(info.file_size for info in infos)
            if declared > cap:
                raise ToolError(f"{target.name} would expand to {declared} bytes: too large to read")
            expanded = 0
            for info in infos:
                part = 0
                limited = xml_cap is not None and info.filename.endswith((".xml", ".rels"))
                with archive.open(info) as member:
                    while chunk := member.read(1 << 20):
                        expanded += len(chunk)
                        part += len(chunk)
                        if expanded > cap:
                            raise ToolError(f"{target.name} expands past {cap} bytes: too large to read")
                        if limited and xml_cap is not None and part > xml_cap:
                            raise ToolError(
                                f"{target.name}: its part {info.filename} expands past {xml_cap} bytes: too large"
                            )
    except zipfile.BadZipFile as exc:
        raise ToolError(f"{target.name} is not a valid {target.suffix} file: {exc}") from None


def _xlsx(target: Path, sample_rows: int, sheet: str | None, unzipped: int) -> dict[str, Any]:
    import openpyxl

    _check_zip(target, unzipped)
    workbook = openpyxl.load_workbook(target, read_only=True, data_only=True)
    try:
        names = list(workbook.sheetnames)
        if sheet is not None and sheet not in names:
            raise ToolError(f"no sheet {sheet!r}; the sheets are {names}", error_class="validation")
        chosen = [sheet] if sheet is not None else names[:MAX_SHEETS]
        budget = MAX_ROWS_COUNTED
        sheets = []
        for name in chosen:
            worksheet = workbook[name]
            width = min(worksheet.max_column or MAX_COLUMNS, MAX_COLUMNS)  # the declared width may lie: capped
            rows: Iterator[Sequence[Any]] = worksheet.iter_rows(max_col=width, values_only=True)
            card = table_card(rows, sample_rows=sample_rows, max_rows=max(1, budget))
            budget -= card["rows"]
            sheets.append({"name": name, **card})
    finally:
        workbook.close()
    return {"kind": "workbook", "format": "xlsx", "sheet_names": names, "sheets": sheets}


def _pdf(target: Path, max_chars: int) -> tuple[str, dict[str, Any]]:
    """Text of the first pages and the last ones, as much as ``max_chars`` shows; pages sharing content once."""
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError
    from pypdf.generic import IndirectObject

    try:
        reader = PdfReader(target)
        if reader.is_encrypted and not reader.decrypt(""):
            raise ToolError(f"{target.name} is password-protected")
        pages = len(reader.pages)
        readable = min(pages, MAX_PDF_PAGES)
        seen: dict[tuple[int, int], int] = {}
        texts: dict[int, str] = {}

        def extract(number: int) -> int:
            page = reader.pages[number - 1]
            ref = page.raw_get("/Contents") if "/Contents" in page else None
            key = (ref.idnum, ref.generation) if isinstance(ref, IndirectObject) else None
            if key is not None and key in seen:
                texts[number] = f"--- page {number} ---\n(same content as page {seen[key]})"
            else:
                if key is not None:
                    seen[key] = number
                texts[number] = f"--- page {number} ---\n{(page.extract_text() or '').strip()}"
            return len(texts[number])

        head = 0
        forward = 1
        while forward <= readable and head < max_chars:
            head += extract(forward)
            forward += 1
        tail = 0
        backward = readable
        while backward >= forward and tail < max_chars:
            tail += extract(backward)
            backward -= 1
    except PdfReadError as exc:
        raise ToolError(f"{target.name} is not a readable PDF: {exc}") from None
    parts = [texts[n] for n in range(1, forward)]
    if backward >= forward:
        parts.append(f"--- pages {forward}–{backward} not read ---")
    parts.extend(texts[n] for n in range(backward + 1, readable + 1))
    return "\n\n".join(parts), {"pages": pages, "pages_read": len(texts), "pages_extracted": len(seen) or len(texts)}


def _docx(target: Path, unzipped: int) -> tuple[str, dict[str, Any]]:
    import docx
    from docx.table import Table

    _check_zip(target, unzipped, MAX_XML_PART_BYTES)
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


def _parse(target: Path, suffix: str, request: dict[str, Any]) -> dict[str, Any]:
    max_chars, sample_rows = int(request["max_chars"]), int(request["sample_rows"])
    unzipped = int(request.get("max_unzipped_bytes") or MAX_UNZIPPED_BYTES)
    if suffix in {".csv", ".tsv"}:
        return _csv(target, suffix, sample_rows)
    if suffix in {".xlsx", ".xlsm"}:
        return _xlsx(target, sample_rows, request.get("sheet"), unzipped)
    extra: dict[str, Any] = {}
    if suffix == ".pdf":
        text, extra = _pdf(target, max_chars)
    elif suffix == ".docx":
        text, extra = _docx(target, unzipped)
    else:
        text = _decode(read_bytes(Path(), target.parts))  # from the workspace (cwd), no link followed
    content = cap_output(text, max_chars)
    fmt = {"": "text", ".markdown": "md"}.get(suffix, suffix.lstrip("."))
    return {"kind": "text", "format": fmt, **extra, "chars": len(text), "truncated": content != text, "text": content}


def parse(request: dict[str, Any]) -> dict[str, Any]:
    """The child's entry point: a ``read_document`` request in, the tool's answer out.

    The request holds ``path``, ``suffix``, ``max_chars``, ``sample_rows``, ``sheet`` and ``max_unzipped_bytes``.
    ``path`` is relative to the child's working directory (the session workspace), so no message names a host
    path. Returns ``{"result": {...}}``, ``{"error": "...", "error_class": "..."}`` for a refusal, or
    ``{"error": "could not be read as ..."}`` for a file its parser failed on.
    """
    target = Path(request["path"])
    suffix = str(request["suffix"])
    try:
        found = _parse(target, suffix, request)
    except ToolError as exc:
        return {"error": str(exc), "error_class": exc.error_class}
    except MemoryError:
        raise
    except Exception as exc:  # parsers raise many kinds of errors on malformed files; all mean "unreadable"
        if type(exc).__name__ == "XMLSyntaxError" and "unknown error" in str(exc):  # libxml2 out of memory
            return {"error": f"{target.name} is too large or too complex to parse within the memory limit"}
        return {"error": f"could not be read as {suffix or 'text'}: {type(exc).__name__}: {exc}"[:1000]}
    return {"result": found}
