"""read_document: text formats capped head and tail; CSV and XLSX as data cards. Fixtures are generated here."""

from __future__ import annotations

import datetime as dt
import json
import zipfile
from pathlib import Path
from typing import Any

import docx
import openpyxl
import pytest
from pydantic import ValidationError
from pypdf import PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

from switchboard.core.tools.builtin.documents import (
    DocumentLimits,
    ReadDocumentInput,
    document_tools,
    read_document,
    table_card,
)
from switchboard.core.tools.definition import ToolContext
from switchboard.errors import ToolError


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


async def read(workspace: Path, *, limits: DocumentLimits | None = None, **args: Any) -> dict[str, Any]:
    ctx = ToolContext(
        session_key="t/a/web/default/c", tenant="t", run_id="r", actor="u", workspace=workspace, idempotency_key="k"
    )
    if limits is None:
        return await read_document(ReadDocumentInput.model_validate(args), ctx)
    [tool] = document_tools(limits)
    found: dict[str, Any] = await tool.fn(ReadDocumentInput.model_validate(args), ctx)
    return found


def write_pdf(path: Path, pages: list[str]) -> None:
    writer = PdfWriter()
    for text in pages:
        page = writer.add_blank_page(612, 792)
        font = DictionaryObject(
            {
                NameObject("/Type"): NameObject("/Font"),
                NameObject("/Subtype"): NameObject("/Type1"),
                NameObject("/BaseFont"): NameObject("/Helvetica"),
            }
        )
        fonts = DictionaryObject({NameObject("/F1"): writer._add_object(font)})
        page[NameObject("/Resources")] = DictionaryObject({NameObject("/Font"): fonts})
        content = DecodedStreamObject()
        content.set_data(f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode())
        page[NameObject("/Contents")] = writer._add_object(content)
    writer.write(path)


async def test_markdown_and_text_come_back_capped_head_and_tail(workspace: Path) -> None:
    body = "# Title\n\n" + "".join(f"- item {i}\n" for i in range(5000)) + "\nThe end.\n"
    (workspace / "notes.md").write_text(body)
    doc = await read(workspace, path="notes.md", max_chars=800)
    assert doc["kind"] == "text" and doc["format"] == "md"
    assert doc["chars"] == len(body) and doc["truncated"] is True
    assert len(doc["text"]) <= 800
    assert doc["text"].startswith("# Title\n") and doc["text"].endswith("The end.\n")
    (workspace / "short.txt").write_text("just this")
    short = await read(workspace, path="short.txt")
    assert short["text"] == "just this" and short["truncated"] is False


async def test_pdf_text_is_extracted_page_by_page(workspace: Path) -> None:
    write_pdf(workspace / "report.pdf", ["Revenue grew 12 percent", "Costs fell in March"])
    doc = await read(workspace, path="report.pdf")
    assert doc["format"] == "pdf" and doc["pages"] == 2
    assert "--- page 1 ---\nRevenue grew 12 percent" in doc["text"]
    assert "--- page 2 ---\nCosts fell in March" in doc["text"]


async def test_docx_paragraphs_headings_and_tables_in_order(workspace: Path) -> None:
    document = docx.Document()
    document.add_heading("Quarterly report", level=1)
    document.add_paragraph("Sales were strong.")
    table = document.add_table(rows=2, cols=2)
    for (row, col), text in {(0, 0): "region", (0, 1): "sales", (1, 0): "north", (1, 1): "42"}.items():
        table.cell(row, col).text = text
    document.add_paragraph("Outlook: stable.")
    document.save(str(workspace / "q3.docx"))
    doc = await read(workspace, path="q3.docx")
    assert doc["format"] == "docx" and doc["tables"] == 1
    assert doc["text"] == "# Quarterly report\n\nSales were strong.\n\nregion | sales\n\nnorth | 42\n\nOutlook: stable."


async def test_csv_becomes_a_data_card_not_the_rows(workspace: Path) -> None:
    lines = ["id,price,name,day,note"]
    lines += [f"{i},{i * 1.5},item {i},2026-01-{i % 28 + 1:02d}," for i in range(1, 1001)]
    (workspace / "orders.csv").write_text("\n".join(lines) + "\n")
    card = await read(workspace, path="orders.csv", sample_rows=3)
    assert card["kind"] == "table" and card["format"] == "csv"
    assert card["rows"] == 1000
    assert card["columns"] == [
        {"name": "id", "type": "int"},
        {"name": "price", "type": "float"},
        {"name": "name", "type": "text"},
        {"name": "day", "type": "date"},
        {"name": "note", "type": "empty"},
    ]
    assert card["sample"][0] == {"id": "1", "price": "1.5", "name": "item 1", "day": "2026-01-02", "note": ""}
    assert len(card["sample"]) == 3
    assert len(json.dumps(card)) < 1500  # a card, not the table


async def test_semicolon_csv_is_sniffed(workspace: Path) -> None:
    (workspace / "eu.csv").write_text("name;amount\nA;1\nB;2\n")
    card = await read(workspace, path="eu.csv")
    assert [c["name"] for c in card["columns"]] == ["name", "amount"] and card["rows"] == 2


async def test_xlsx_becomes_one_card_per_sheet(workspace: Path) -> None:
    book = openpyxl.Workbook()
    sales = book.active
    sales.title = "Sales"
    sales.append(["region", "amount", "closed"])
    for i in range(250):
        sales.append([f"r{i % 4}", i * 10, dt.datetime(2026, 1, 1) + dt.timedelta(days=i)])
    people = book.create_sheet("People")
    people.append(["name"])
    people.append(["Ada"])
    book.save(workspace / "book.xlsx")

    card = await read(workspace, path="book.xlsx", sample_rows=2)
    assert card["kind"] == "workbook" and card["sheet_names"] == ["Sales", "People"]
    first = card["sheets"][0]
    assert first["name"] == "Sales" and first["rows"] == 250
    assert first["columns"] == [
        {"name": "region", "type": "text"},
        {"name": "amount", "type": "int"},
        {"name": "closed", "type": "date"},
    ]
    assert first["sample"] == [
        {"region": "r0", "amount": 0, "closed": "2026-01-01T00:00:00"},
        {"region": "r1", "amount": 10, "closed": "2026-01-02T00:00:00"},
    ]
    only = await read(workspace, path="book.xlsx", sheet="People")
    assert [s["name"] for s in only["sheets"]] == ["People"] and only["sheets"][0]["rows"] == 1
    with pytest.raises(ToolError, match="no sheet 'Nope'"):
        await read(workspace, path="book.xlsx", sheet="Nope")


def test_table_card_names_blank_and_duplicate_headers() -> None:
    card = table_card([["a", "", "a"], [1, 2, 3], [None, None, None], [4, "x", 6]], sample_rows=5)
    assert [c["name"] for c in card["columns"]] == ["a", "column_2", "a_3"]
    assert card["rows"] == 2  # the blank row is not counted
    assert card["columns"][1]["type"] == "mixed"


async def test_bad_inputs_get_clear_errors(workspace: Path) -> None:
    with pytest.raises(ValidationError):
        ReadDocumentInput.model_validate({"path": "../etc/passwd"})
    (workspace / "tool.exe").write_bytes(b"MZ")
    with pytest.raises(ToolError, match="not supported"):
        await read(workspace, path="tool.exe")
    with pytest.raises(ToolError, match="no file"):
        await read(workspace, path="absent.pdf")
    (workspace / "fake.docx").write_text("not a zip")
    with pytest.raises(ToolError, match=r"not a valid \.docx"):
        await read(workspace, path="fake.docx")
    (workspace / "broken.pdf").write_text("not a pdf")
    with pytest.raises(ToolError, match="not a readable PDF"):
        await read(workspace, path="broken.pdf")
    document = docx.Document()
    document.add_paragraph("x" * 5000)
    document.save(str(workspace / "bomb.docx"))
    with pytest.raises(ToolError, match="would expand"):
        await read(workspace, limits=DocumentLimits(max_unzipped_bytes=1000), path="bomb.docx")
    with pytest.raises(ToolError, match="document cap"):
        await read(workspace, limits=DocumentLimits(max_bytes=100), path="bomb.docx")


async def test_malformed_tables_are_reported_not_raised_raw(workspace: Path) -> None:
    with zipfile.ZipFile(workspace / "empty.xlsx", "w") as archive:
        archive.writestr("hello.txt", "not a workbook")
    with pytest.raises(ToolError, match=r"'empty\.xlsx' could not be read as \.xlsx"):
        await read(workspace, path="empty.xlsx")
