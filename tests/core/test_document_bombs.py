"""Hostile documents: each one is built here, read for real, and must end in a clean answer within the limits.

For every bomb: the parse runs in a child process that is gone afterwards, the worker (this process) grows by
far less than the issue's 512 MiB bound, the call is tried once (a limit is never retried), and the document
breaker counts nothing. The limits used are the defaults unless a test needs a quicker deadline.
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docx
import openpyxl
import psutil
import pytest
from pypdf import PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.builtin.documents import DocumentLimits, document_tools
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.gateway import CallScope, ToolGateway
from switchboard.core.tools.parsers import MAX_COLUMNS, table_card
from switchboard.types import SessionKey

MiB = 2**20
PARA = b"<w:p><w:r><w:t>bomb bomb bomb bomb</w:t></w:r></w:p>" * 1000


def docx_bomb(path: Path, expanded: int) -> None:
    """A real DOCX whose document.xml inflates to ``expanded`` bytes of paragraphs (compresses ~300:1)."""
    buffer = io.BytesIO()
    seed = docx.Document()
    seed.add_paragraph("hello")
    seed.save(buffer)
    source = zipfile.ZipFile(buffer)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for info in source.infolist():
            data = source.read(info.filename)
            if info.filename != "word/document.xml":
                out.writestr(info, data)
                continue
            head, _, _rest = data.partition(b"<w:body>")
            with out.open("word/document.xml", "w", force_zip64=True) as member:
                member.write(head + b"<w:body>")
                written = 0
                while written < expanded:
                    member.write(PARA)
                    written += len(PARA)
                member.write(b"</w:body></w:document>")


def lie_about_sizes(path: Path, member: str, declared: int) -> None:
    """Rewrite the zip so that ``member``'s headers declare ``declared`` uncompressed bytes."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member)
        real = info.file_size
    data = bytearray(path.read_bytes())
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        start = 0
        while (found := data.find(signature, start)) >= 0:
            start = found + 4
            if int.from_bytes(data[found + offset : found + offset + 4], "little") == real:
                data[found + offset : found + offset + 4] = declared.to_bytes(4, "little")
    path.write_bytes(bytes(data))


def pdf_sharing_one_stream(path: Path, pages: int) -> None:
    """``pages`` pages whose /Contents are all one heavy content stream (small file, much text to extract)."""
    writer = PdfWriter()
    font = DictionaryObject(
        {
            NameObject("/Type"): NameObject("/Font"),
            NameObject("/Subtype"): NameObject("/Type1"),
            NameObject("/BaseFont"): NameObject("/Helvetica"),
        }
    )
    resources = DictionaryObject({NameObject("/Font"): DictionaryObject({NameObject("/F1"): writer._add_object(font)})})
    content = DecodedStreamObject()
    content.set_data(b"BT /F1 6 Tf " + b"".join(b"0 -7 Td (shared line %d) Tj " % i for i in range(3000)) + b"ET")
    shared = writer._add_object(content)
    for _ in range(pages):
        page = writer.add_blank_page(612, 792)
        page[NameObject("/Resources")] = resources
        page[NameObject("/Contents")] = shared
    writer.write(path)


@pytest.fixture(scope="module")
def bombs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bombs")
    docx_bomb(root / "expands-250mb.docx", 250 * MiB)
    docx_bomb(root / "expands-100mb.docx", 100 * MiB)
    docx_bomb(root / "expands-30mb.docx", 30 * MiB)
    docx_bomb(root / "lying.docx", 40 * MiB)
    lie_about_sizes(root / "lying.docx", "word/document.xml", 1000)
    columns = 150_000
    (root / "wide.csv").write_text(
        ",".join(f"c{i}" for i in range(columns)) + "\n" + ",".join(str(i % 10) for i in range(columns)) + "\n"
    )
    pdf_sharing_one_stream(root / "shared.pdf", 300)
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet["A1"], sheet["B1"], sheet["A2"], sheet["B2"] = "name", "value", "first", 1
    sheet.cell(row=1_048_576, column=16_384, value="far corner")  # declares A1:XFD1048576
    book.save(root / "sparse.xlsx")
    return root


@pytest.fixture
def workspace(tmp_path: Path, bombs: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    for item in bombs.iterdir():
        os.link(item, path / item.name)  # a hard link: the workspace refuses symlinks that lead out
    return path


def context(workspace: Path) -> ToolContext:
    return ToolContext(
        session_key=SessionKey("t/a/web/default/c"),
        tenant="t",
        run_id="run",
        actor="u",
        workspace=workspace,
        idempotency_key="",
    )


@pytest.fixture
def no_children_left() -> Iterator[None]:
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    left = [p for p in me.children(recursive=True) if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE]
    assert left == [], f"parser processes outlived their call: {left}"


async def read(workspace: Path, path: str, limits: DocumentLimits | None = None, **args: Any) -> tuple[Any, Any]:
    """One read_document call through the gateway: its outcome and full value, the worker's RSS watched."""
    gateway = ToolGateway(ToolRegistry(document_tools(limits or DocumentLimits())), workspace_root=workspace.parent)
    me = psutil.Process()
    rss_before = me.memory_info().rss
    scope = CallScope()
    outcome = await gateway.call("read_document", {"path": path, **args}, context(workspace), scope=scope)
    grown = me.memory_info().rss - rss_before
    assert grown < 64 * MiB, f"the worker grew by {grown // MiB} MiB reading {path}"
    assert outcome.attempts == 1, "a document that hit a limit must not be parsed again"
    assert gateway.breaker("documents").failures == 0
    return outcome, scope.variables[outcome.variable] if outcome.variable else outcome.value


@pytest.mark.usefixtures("no_children_left")
async def test_a_docx_expanding_to_250_mb_is_refused_by_its_real_size(workspace: Path) -> None:
    assert (workspace / "expands-250mb.docx").stat().st_size < 2 * MiB
    outcome, _ = await read(workspace, "expands-250mb.docx")
    assert not outcome.ok and outcome.error_class == "permanent"
    assert "expand" in (outcome.error or "") and "too large" in (outcome.error or "")


@pytest.mark.usefixtures("no_children_left")
async def test_a_docx_whose_xml_part_expands_to_100_mb_is_refused_before_parsing(workspace: Path) -> None:
    outcome, _ = await read(workspace, "expands-100mb.docx")
    assert not outcome.ok and outcome.error_class == "permanent"
    assert "word/document.xml expands past" in (outcome.error or "")


@pytest.mark.usefixtures("no_children_left")
async def test_a_docx_under_every_cap_hits_the_childs_memory_limit_not_the_workers(workspace: Path) -> None:
    outcome, _ = await read(workspace, "expands-30mb.docx", DocumentLimits(memory_mb=200, timeout_s=15.0))
    assert not outcome.ok and outcome.error_class == "permanent"
    assert "too large or too complex" in (outcome.error or "") and "memory" in (outcome.error or "")


@pytest.mark.usefixtures("no_children_left")
async def test_a_zip_whose_headers_under_declare_an_entry_is_refused(workspace: Path) -> None:
    outcome, _ = await read(workspace, "lying.docx")
    assert not outcome.ok and outcome.error_class == "permanent"
    assert "lying.docx is not a valid .docx file" in (outcome.error or "")
    assert str(workspace.parent) not in (outcome.error or "")


@pytest.mark.usefixtures("no_children_left")
async def test_a_csv_of_150_000_columns_gets_a_bounded_card(workspace: Path) -> None:
    outcome, card = await read(workspace, "wide.csv", DocumentLimits(timeout_s=10.0))
    assert outcome.ok, outcome.error
    assert card["columns_total"] == 150_000 and len(card["columns"]) == MAX_COLUMNS and card["rows"] == 1


def test_the_table_card_of_a_very_wide_table_is_capped_and_linear() -> None:
    header = [f"c{i % 1000}" for i in range(150_000)]  # duplicate names: renamed without a quadratic scan
    card = table_card([header, ["1"] * 150_000], sample_rows=1)
    assert card["columns_total"] == 150_000 and len(card["columns"]) == MAX_COLUMNS
    assert len(card["sample"][0]) == MAX_COLUMNS


@pytest.mark.usefixtures("no_children_left")
async def test_a_pdf_of_300_pages_sharing_one_stream_is_read_once(workspace: Path) -> None:
    assert (workspace / "shared.pdf").stat().st_size < 200_000
    outcome, found = await read(workspace, "shared.pdf", DocumentLimits(timeout_s=10.0), max_chars=5000)
    assert outcome.ok, outcome.error
    assert found["pages"] == 300 and found["pages_extracted"] == 1
    assert found["text"].startswith("--- page 1 ---\nshared line 0")
    assert found["text"].endswith("--- page 300 ---\n(same content as page 1)")


@pytest.mark.usefixtures("no_children_left")
async def test_an_xlsx_declaring_a_million_rows_and_16384_columns_is_described_quickly(workspace: Path) -> None:
    outcome, found = await read(workspace, "sparse.xlsx", DocumentLimits(timeout_s=10.0))
    assert outcome.ok, outcome.error
    [sheet] = found["sheets"]
    assert [c["name"] for c in sheet["columns"]] == ["name", "value"]  # not 16,384 padded columns
    assert sheet["rows"] == 1 and sheet["sample"] == [{"name": "first", "value": 1}]


@pytest.mark.usefixtures("no_children_left")
async def test_a_parse_past_its_deadline_is_killed_and_not_retried(workspace: Path) -> None:
    outcome, _ = await read(workspace, "expands-30mb.docx", DocumentLimits(timeout_s=0.3))
    assert not outcome.ok and outcome.error_class == "permanent"
    assert "within the limits" in (outcome.error or "") and "0.3s" in (outcome.error or "")


@pytest.mark.usefixtures("no_children_left")
async def test_five_parses_hitting_their_limits_pause_nothing_for_anyone(workspace: Path) -> None:
    from switchboard.core.tools.builtin.clock import TOOLS as CLOCK
    from switchboard.core.tools.builtin.files import TOOLS as FILES

    limits = DocumentLimits(timeout_s=0.3)
    gateway = ToolGateway(ToolRegistry([*CLOCK, *FILES, *document_tools(limits)]), workspace_root=workspace.parent)
    for _ in range(5):
        outcome = await gateway.call("read_document", {"path": "expands-30mb.docx"}, context(workspace))
        assert not outcome.ok and outcome.attempts == 1
    other = ToolContext(
        session_key=SessionKey("t/a/web/default/other"),
        tenant="t",
        run_id="run-2",
        actor="v",
        workspace=workspace.parent / "other",
        idempotency_key="",
    )
    assert (await gateway.call("current_time", {}, other)).ok
    assert (await gateway.call("list_files", {}, other)).ok
    assert gateway.breaker("documents").state == "closed"
