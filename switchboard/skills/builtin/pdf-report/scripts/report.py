"""A PDF report from Markdown (fpdf2's HTML renderer over markdown-it-py's HTML); prints one JSON line.

Usage: python3 report.py --markdown REPORT.md --out REPORT.pdf [--title T] [--author A] [--paper A4|Letter]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path, PurePosixPath
from typing import Any

from fpdf import FPDF
from fpdf.fonts import FontFace
from markdown_it import MarkdownIt

__all__ = ["main"]

MAX_MARKDOWN_BYTES = 2 * 2**20
FONT_DIRS = ("/usr/share/fonts/truetype/dejavu", "/usr/share/fonts/dejavu")
_IMAGE = re.compile(r"<img\b[^>]*>", re.IGNORECASE)


class ReportError(Exception):
    """A problem the caller can act on, reported as the JSON result."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Report(FPDF):
    """A4/Letter pages with the title in the header (after the first page) and page numbers in the footer."""

    def __init__(self, paper: str, title: str, family: str) -> None:
        super().__init__(format=paper)
        self.report_title = title
        self.family = family

    def header(self) -> None:
        """The report's title, small and right-aligned, from the second page on."""
        if self.page_no() > 1 and self.report_title:
            self.set_font(self.family, "I", 8)
            self.set_text_color(120, 120, 120)
            self.cell(0, 6, self.report_title, align="R", new_x="LMARGIN", new_y="NEXT")
            self.set_text_color(0, 0, 0)
            self.ln(2)

    def footer(self) -> None:
        """``page / pages``, centred."""
        self.set_y(-15)
        self.set_font(self.family, "I", 8)
        self.set_text_color(120, 120, 120)
        self.cell(0, 10, f"{self.page_no()} / {{nb}}", align="C")


def relative_out(path: str) -> Path:
    """The output path, refused unless it is relative and stays inside the working directory."""
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or not pure.name.endswith(".pdf"):
        raise ReportError("bad_output", f"--out must be a relative path ending in .pdf, inside the workspace: {path}")
    return Path(path)


FONT_FILES = {"": "DejaVuSans.ttf", "B": "DejaVuSans-Bold.ttf", "I": "DejaVuSans-Oblique.ttf"}
FONT_FILES["BI"] = "DejaVuSans-BoldOblique.ttf"


def font_dir() -> Path | None:
    """The folder holding DejaVu Sans in its four styles, when the host has it."""
    for folder in FONT_DIRS:
        if all((Path(folder) / name).is_file() for name in FONT_FILES.values()):
            return Path(folder)
    return None


def unicode_font(pdf: FPDF, folder: Path) -> str:
    """Register DejaVu Sans (and DejaVu Sans Mono when present) with ``pdf``; the monospace family to use."""
    for style, name in FONT_FILES.items():
        pdf.add_font("DejaVu", style, str(folder / name))
    if (folder / "DejaVuSansMono.ttf").is_file():
        pdf.add_font("DejaVuMono", "", str(folder / "DejaVuSansMono.ttf"))
        return "DejaVuMono"
    return "Courier"


def latin1(text: str) -> str:
    """Text the core fonts can show: characters outside Latin-1 become '?'."""
    return text.encode("latin-1", "replace").decode("latin-1")


def build(args: argparse.Namespace) -> dict[str, Any]:
    """Write the PDF; the data of the JSON result."""
    out = relative_out(args.out)
    source = Path(args.markdown)
    if not source.is_file():
        raise ReportError("not_found", f"no such Markdown file: {args.markdown}")
    if source.stat().st_size > MAX_MARKDOWN_BYTES:
        raise ReportError("too_large", f"{args.markdown} is larger than {MAX_MARKDOWN_BYTES} bytes")
    try:
        markdown = source.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise ReportError("bad_input", f"{args.markdown} is not UTF-8 text") from None
    html = MarkdownIt("commonmark", {"html": False}).enable("table").enable("strikethrough").render(markdown)
    html = _IMAGE.sub("", html)  # no fetching or embedding from a report's text
    fonts = font_dir()
    family = "DejaVu" if fonts is not None else None
    pdf = Report(args.paper, args.title, family or "Helvetica")
    if fonts is not None:
        code = FontFace(family=unicode_font(pdf, fonts))
    else:
        html, code = latin1(html), FontFace(family="Courier")
    title = args.title if family is not None else latin1(args.title)
    pdf.set_title(title or out.stem)
    if args.author:
        pdf.set_author(args.author if family is not None else latin1(args.author))
    pdf.set_creator("Switchboard pdf-report skill")
    pdf.set_auto_page_break(auto=True, margin=18)
    pdf.add_page()
    if title:
        pdf.set_font(pdf.family, "B", 20)
        pdf.multi_cell(0, 10, title, new_x="LMARGIN", new_y="NEXT")
        pdf.ln(4)
    pdf.set_font(pdf.family, "", 11)
    try:
        pdf.write_html(html, font_family=pdf.family, tag_styles={"code": code, "pre": code})
    except Exception as err:  # fpdf2 raises plain exceptions on HTML it cannot lay out
        raise ReportError("render_failed", f"the Markdown could not be laid out: {err}") from None
    if out.parent != Path():
        out.parent.mkdir(parents=True, exist_ok=True)
    pdf.output(str(out))
    return {"path": out.as_posix(), "pages": pdf.page_no(), "unicode": family is not None, "bytes": out.stat().st_size}


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, build the PDF, print one JSON line; 0 on success, 1 on a reported error."""
    parser = argparse.ArgumentParser(description="A PDF report from a Markdown file.")
    parser.add_argument("--markdown", required=True, help="Markdown file to render")
    parser.add_argument("--out", required=True, help="relative path of the .pdf to write")
    parser.add_argument("--title", default="")
    parser.add_argument("--author", default="")
    parser.add_argument("--paper", choices=["A4", "Letter"], default="A4")
    args = parser.parse_args(argv)
    try:
        data = build(args)
    except ReportError as err:
        print(json.dumps({"ok": False, "error": {"code": err.code, "message": str(err)}}))
        return 1
    except OSError as err:
        print(json.dumps({"ok": False, "error": {"code": "io", "message": f"{err.strerror or err}"}}))
        return 1
    print(json.dumps({"ok": True, "data": data, "artifacts": [data["path"]]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
