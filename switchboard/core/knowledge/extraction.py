"""Sources to text: files under the configuration's folder and URLs fetched through egress.

Files are read without following links and must stay under the configuration's folder. PDF and DOCX go through the
bounded document parsers (:mod:`switchboard.core.tools.parsers`) in a limited child process, like ``read_document``;
text and Markdown are decoded here, HTML reduced to its text. URLs are fetched by a :data:`UrlFetcher` the worker
injects (its egress client under the agent's allowlist), so core never opens a connection itself. Every failure is a
:class:`~switchboard.errors.SourceUnreadableError` naming the source and what to do.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Literal

from yarl import URL

from switchboard.core.knowledge.config import KnowledgeConfig
from switchboard.core.tools.builtin.documents import DocumentLimits
from switchboard.core.tools.child import run_callable
from switchboard.errors import SourceUnreadableError

__all__ = [
    "MAX_FOLDER_FILES",
    "MAX_TEXT_CHARS",
    "PARSED_SUFFIXES",
    "TEXT_SUFFIXES",
    "Fetched",
    "Located",
    "Raw",
    "UrlFetcher",
    "extract",
    "load",
    "locate",
]

MAX_FOLDER_FILES = 500
"""Most files one folder source contributes (the first, in path order)."""
MAX_TEXT_CHARS = 98_000
"""Longest text kept of one source (the rest is cut, and the listing says so); leaves room for the index header."""
TEXT_SUFFIXES = frozenset({".txt", ".md", ".markdown", ".rst", ".text", ".html", ".htm"})
PARSED_SUFFIXES = frozenset({".pdf", ".docx"})
"""Formats parsed in a limited child process."""
_PARSER = "switchboard.core.tools.parsers:parse"
_TYPES = {
    "text/html": ".html",
    "application/xhtml+xml": ".html",
    "text/plain": ".txt",
    "text/markdown": ".md",
    "application/pdf": ".pdf",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": ".docx",
}


@dataclass(frozen=True, slots=True)
class Located:
    """One source to index: a file (``path``) or a URL, named by ``ref`` (its path as configured, or the URL)."""

    ref: str
    kind: Literal["file", "url"]
    path: Path | None = None


@dataclass(frozen=True, slots=True)
class Fetched:
    """A URL's response as egress gave it (``refused``: egress's reason code, nothing was fetched)."""

    status: int
    content_type: str
    body: bytes
    refused: str | None = None


UrlFetcher = Callable[[str, str, str], Awaitable[Fetched]]
"""``fetch(tenant, agent, url)``: one GET through egress under the agent's policy (the worker's egress client)."""


@dataclass(frozen=True, slots=True)
class Raw:
    """A source's bytes, their format and their content hash."""

    source: Located
    data: bytes
    suffix: str
    digest: str


def locate(config: KnowledgeConfig, root: Path) -> tuple[list[Located], list[SourceUnreadableError]]:
    """The sources of ``config`` (folders expanded, in path order) and the configured paths that cannot be indexed."""
    found: list[Located] = []
    problems: list[SourceUnreadableError] = []
    base = root.resolve()
    for source in config.sources:
        if source.url is not None:
            found.append(Located(ref=source.url, kind="url"))
            continue
        assert source.path is not None
        target = base / source.path
        if target.is_symlink() or not target.resolve().is_relative_to(base):
            problems.append(
                SourceUnreadableError(
                    f"{source.path} is a link or leaves the folder: name the file itself", ref=source.path
                )
            )
        elif target.is_dir():
            files = sorted(p for p in target.rglob("*") if _indexable(p, base))
            found.extend(
                Located(ref=p.relative_to(base).as_posix(), kind="file", path=p) for p in files[:MAX_FOLDER_FILES]
            )
            if len(files) > MAX_FOLDER_FILES:
                problems.append(
                    SourceUnreadableError(
                        f"{source.path} holds {len(files)} files: only the first {MAX_FOLDER_FILES} are indexed "
                        "(split it into smaller folders)",
                        ref=source.path,
                    )
                )
        elif target.is_file():
            suffix = target.suffix.lower()
            if suffix not in TEXT_SUFFIXES | PARSED_SUFFIXES:
                problems.append(_unsupported(source.path, suffix))
            else:
                found.append(Located(ref=source.path, kind="file", path=target))
        else:
            problems.append(
                SourceUnreadableError(
                    f"{source.path}: no such file or folder next to the configuration", ref=source.path
                )
            )
    return found, problems


def _indexable(path: Path, base: Path) -> bool:
    relative = path.relative_to(base).parts
    return (
        not any(part.startswith(".") or not part.isprintable() for part in relative)
        and not path.is_symlink()
        and path.is_file()
        and path.suffix.lower() in TEXT_SUFFIXES | PARSED_SUFFIXES
    )


def _unsupported(ref: str, suffix: str) -> SourceUnreadableError:
    return SourceUnreadableError(
        f"{ref}: {suffix or 'files without a suffix'} cannot be indexed (text, Markdown, HTML, PDF and DOCX can)",
        ref=ref,
    )


async def load(source: Located, tenant: str, agent: str, fetch: UrlFetcher | None, limits: DocumentLimits) -> Raw:
    """The source's bytes (at most ``limits.max_bytes``) and their hash; :class:`SourceUnreadableError` otherwise."""
    if source.kind == "file":
        assert source.path is not None
        data = await asyncio.to_thread(_read_file, source, limits.max_bytes)
        suffix = source.path.suffix.lower()
    else:
        if fetch is None:
            raise SourceUnreadableError(f"{source.ref}: this process has no egress to fetch URLs", ref=source.ref)
        got = await fetch(tenant, agent, source.ref)
        if got.refused is not None:
            raise SourceUnreadableError(
                f"{source.ref}: egress refused it ({got.refused}); a host must be in agents.{agent}.egress.allow",
                ref=source.ref,
            )
        if not 200 <= got.status < 300:
            raise SourceUnreadableError(f"{source.ref}: the server answered {got.status}", ref=source.ref)
        if len(got.body) > limits.max_bytes:
            raise SourceUnreadableError(
                f"{source.ref} is {len(got.body)} bytes, over the {limits.max_bytes}-byte document cap", ref=source.ref
            )
        data = got.body
        mime = got.content_type.split(";", 1)[0].strip().lower()
        suffix = _TYPES.get(mime) or Path(URL(source.ref).path).suffix.lower()
        if suffix not in TEXT_SUFFIXES | PARSED_SUFFIXES:
            raise SourceUnreadableError(
                f"{source.ref}: content type {mime or 'unknown'} cannot be indexed (text, HTML, PDF and DOCX can)",
                ref=source.ref,
            )
    return Raw(source=source, data=data, suffix=suffix, digest=hashlib.sha256(data).hexdigest())


def _read_file(source: Located, cap: int) -> bytes:
    assert source.path is not None
    try:
        fd = os.open(source.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as err:
        raise SourceUnreadableError(f"{source.ref} cannot be opened: {err.strerror}", ref=source.ref) from None
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > cap:
            raise SourceUnreadableError(
                f"{source.ref} is {size} bytes, over the {cap}-byte document cap", ref=source.ref
            )
        data = handle.read(cap + 1)
    if len(data) > cap:
        raise SourceUnreadableError(f"{source.ref} grew past the {cap}-byte document cap", ref=source.ref)
    return data


async def extract(raw: Raw, limits: DocumentLimits) -> str:
    """The text of ``raw`` (up to :data:`MAX_TEXT_CHARS`); PDF and DOCX parsed in a limited child process."""
    ref = raw.source.ref
    if raw.suffix in PARSED_SUFFIXES:
        text = await _parsed(raw, limits)
    else:
        text = _decode(raw.data)
        if raw.suffix in (".html", ".htm"):
            text = _html_text(text)
    text = text.replace("\r\n", "\n").strip()
    if len(text) < 3:
        raise SourceUnreadableError(f"{ref} holds no text to index", ref=ref)
    return text[:MAX_TEXT_CHARS]


async def _parsed(raw: Raw, limits: DocumentLimits) -> str:
    ref = raw.source.ref
    with tempfile.TemporaryDirectory(prefix="knowledge-") as folder:
        name = "source" + raw.suffix
        await asyncio.to_thread(Path(folder, name).write_bytes, raw.data)
        request = {
            "path": name,
            "suffix": raw.suffix,
            "max_chars": min(limits.max_output_chars, MAX_TEXT_CHARS),
            "sample_rows": 0,
            "sheet": None,
            "max_unzipped_bytes": limits.max_unzipped_bytes,
        }
        done = await run_callable(_PARSER, request, limits.sandbox(), cwd=folder)
    if done.status == "ok" and isinstance(done.value, dict):
        if "result" in done.value:
            return str(done.value["result"].get("text", ""))
        raise SourceUnreadableError(f"{ref}: {done.value.get('error', 'could not be read')}", ref=ref)
    raise SourceUnreadableError(
        f"{ref} could not be parsed within the document limits ({done.status}: {done.error or 'no detail'})", ref=ref
    )


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")


_BLOCKS = frozenset({"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "pre"})
_SKIPPED = frozenset({"script", "style", "noscript", "template", "svg", "head"})


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIPPED:
            self.skipping += 1
        elif tag in _BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED:
            self.skipping = max(0, self.skipping - 1)
        elif tag in _BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(data)


def _html_text(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)
