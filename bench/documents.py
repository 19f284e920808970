"""Hostile documents (issue #7): the worker's memory and another session's tool latency while bombs are parsed.

One session reads document bombs in six concurrent loops through the real tool gateway (each parse in its sandbox
child); meanwhile a second session calls ``list_files`` every 20 ms. Side by side in the same run, the second
session's latency with no documents being read (baseline). Reported: median and p95 latency of each phase, the
difference of the medians, the worker's peak RSS (sampled every 10 ms) and the largest parsing child's RSS.

The bombs: a 0.8 MB DOCX expanding to 250 MB, one expanding to 100 MB (parsed until a limit stops it), a CSV of
150,000 columns, a PDF of 300 pages sharing one content stream, an XLSX declaring 1,048,576 × 16,384 cells.

    python -m bench.documents
    python -m bench.documents --quick
"""

from __future__ import annotations

import asyncio
import io
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import docx
import openpyxl
import psutil
from pypdf import PdfWriter
from pypdf.generic import DecodedStreamObject, NameObject

from bench._harness import SUMMARY_HEADERS, Row, fmt, median, parser, percentile, render_table, verdicts
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.gateway import ToolGateway
from switchboard.types import SessionKey

MiB = 2**20
TARGET_RSS_MIB = 512.0
TARGET_WAIT_MS = 100.0
PARA = b"<w:p><w:r><w:t>bomb bomb bomb bomb</w:t></w:r></w:p>" * 1000


def _docx_bomb(path: Path, expanded: int) -> None:
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
            head = data.partition(b"<w:body>")[0]
            with out.open("word/document.xml", "w", force_zip64=True) as member:
                member.write(head + b"<w:body>")
                for _ in range(expanded // len(PARA)):
                    member.write(PARA)
                member.write(b"</w:body></w:document>")


def _pdf(path: Path, pages: int) -> None:
    writer = PdfWriter()
    content = DecodedStreamObject()
    content.set_data(b"BT " + b"".join(b"0 -7 Td (shared line %d) Tj " % i for i in range(3000)) + b"ET")
    shared = writer._add_object(content)
    for _ in range(pages):
        writer.add_blank_page(612, 792)[NameObject("/Contents")] = shared
    writer.write(path)


def build(workspace: Path, quick: bool) -> list[str]:
    """The bombs, written into ``workspace``; their names."""
    workspace.mkdir(parents=True, exist_ok=True)
    _docx_bomb(workspace / "expands-250mb.docx", (25 if quick else 250) * MiB)
    _docx_bomb(workspace / "expands-100mb.docx", (10 if quick else 100) * MiB)
    columns = 15_000 if quick else 150_000
    (workspace / "wide.csv").write_text(",".join(f"c{i}" for i in range(columns)) + "\n" + "1," * columns + "\n")
    _pdf(workspace / "shared.pdf", 300)
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet["A1"], sheet["A2"] = "name", "first"
    sheet.cell(row=1_048_576, column=16_384, value="far corner")
    book.save(workspace / "sparse.xlsx")
    return ["expands-250mb.docx", "expands-100mb.docx", "wide.csv", "shared.pdf", "sparse.xlsx"]


def _ctx(root: Path, name: str) -> ToolContext:
    key = SessionKey(f"t/a/web/default/{name}")
    return ToolContext(session_key=key, tenant="t", run_id=name, actor="u", workspace=root / name, idempotency_key="")


async def _probe(gateway: ToolGateway, ctx: ToolContext, calls: int) -> list[float]:
    latencies: list[float] = []
    for _ in range(calls):
        began = time.perf_counter()
        outcome = await gateway.call("list_files", {}, ctx)
        latencies.append((time.perf_counter() - began) * 1000)
        assert outcome.ok, outcome.error
        await asyncio.sleep(0.02)
    return latencies


async def _sample(peaks: dict[str, float], stop: asyncio.Event) -> None:
    me = psutil.Process()
    while not stop.is_set():
        peaks["worker"] = max(peaks["worker"], me.memory_info().rss / MiB)
        for child in me.children(recursive=True):
            try:
                peaks["child"] = max(peaks["child"], child.memory_info().rss / MiB)
            except psutil.Error:
                continue
        await asyncio.sleep(0.01)


async def measure(root: Path, calls: int, quick: bool) -> dict[str, object]:
    """Baseline, then the same probe while six loops read bombs."""
    names = build(root / "hog", quick)
    gateway = ToolGateway(default_registry(), workspace_root=root)
    hog, other = _ctx(root, "hog"), _ctx(root, "other")
    await gateway.call("list_files", {}, other)  # warm up
    baseline = await _probe(gateway, other, calls)
    peaks = {"worker": psutil.Process().memory_info().rss / MiB, "child": 0.0}
    outcomes: dict[str, list[str]] = {name: [] for name in names}
    stop = asyncio.Event()

    async def reader(offset: int) -> None:
        i = offset
        while not stop.is_set():
            name = names[i % len(names)]
            out = await gateway.call("read_document", {"path": name}, hog)
            outcomes[name].append("ok" if out.ok else (out.error or "")[:60])
            i += 1

    sampler = asyncio.create_task(_sample(peaks, stop))
    readers = [asyncio.create_task(reader(n)) for n in range(6)]
    await asyncio.sleep(0.5)
    loaded = await _probe(gateway, other, calls)
    stop.set()
    await asyncio.gather(*readers, sampler)
    left = psutil.Process().children(recursive=True)
    return {"baseline": baseline, "loaded": loaded, "peaks": peaks, "outcomes": outcomes, "left": len(left)}


async def run(argv: list[str] | None = None) -> list[Row]:
    """Run and print the figures; the summary rows."""
    ns = parser(__doc__.splitlines()[0] if __doc__ else "").parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sb-bench-docs-") as tmp:
        found = await measure(Path(tmp), 15 if ns.quick else 60, ns.quick)
    baseline, loaded = found["baseline"], found["loaded"]
    peaks, outcomes = found["peaks"], found["outcomes"]
    assert isinstance(baseline, list) and isinstance(loaded, list)
    assert isinstance(peaks, dict) and isinstance(outcomes, dict)
    wait = median(loaded) - median(baseline)
    rows = [
        ["list_files, other session, idle (ms)", fmt(median(baseline), 2), fmt(percentile(baseline, 95), 2)],
        ["list_files, other session, 6 bomb loops (ms)", fmt(median(loaded), 2), fmt(percentile(loaded, 95), 2)],
    ]
    print(render_table("Another session's tool latency", ["phase", "median", "p95"], rows))
    print(
        render_table(
            "Bombs read during the loaded phase",
            ["document", "reads", "outcome (first)"],
            [[name, len(seen), seen[0] if seen else "—"] for name, seen in outcomes.items()],
        )
    )
    print(f"worker peak RSS {peaks['worker']:.0f} MiB; largest parsing child {peaks['child']:.0f} MiB; ", end="")
    print(f"children left after the run: {found['left']}\n")
    return verdicts(
        [
            Row(
                "documents",
                "worker peak RSS (MiB)",
                fmt(peaks["worker"], 0),
                f"≤ {TARGET_RSS_MIB:.0f}",
                peaks["worker"] <= TARGET_RSS_MIB,
            ),
            Row(
                "documents",
                "other session's extra wait, median (ms)",
                fmt(wait, 2),
                f"≤ {TARGET_WAIT_MS:.0f}",
                wait <= TARGET_WAIT_MS,
            ),
        ],
        ns.quick,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.documents``."""
    rows = asyncio.run(run(argv))
    print(render_table("Targets of issue #7", SUMMARY_HEADERS, [r.cells() for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
