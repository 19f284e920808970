"""An agent's ``knowledge:`` block: the files and URLs indexed for it, and whether it searches them as a graph."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from yarl import URL

from switchboard.core.memory.facts import check_name

__all__ = ["KNOWLEDGE_TOOLS", "MAX_REF_CHARS", "MAX_SOURCES", "KnowledgeConfig", "KnowledgeSource", "knowledge_project"]

MAX_REF_CHARS = 1000
"""Longest path or URL of a source (it heads its document, which has a length cap)."""

KNOWLEDGE_TOOLS = ("search_knowledge", "read_source")
"""The run-time tools every agent with ``knowledge:`` gets."""

MAX_SOURCES = 100
"""Most sources one agent lists (a folder is one source, holding up to ``MAX_FOLDER_FILES`` files)."""


def knowledge_project(agent: str) -> str:
    """The read-only memory project holding ``agent``'s knowledge (``knowledge.<agent>``)."""
    return f"knowledge.{agent}"


class KnowledgeSource(BaseModel):
    """One source: ``{path: ...}`` (a file or a folder, relative to the YAML file's folder) or ``{url: ...}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str | None = None
    """A file or a folder (its supported files, recursively), relative to the configuration file's folder."""
    url: str | None = None
    """An ``http(s)`` URL, fetched through egress under the agent's allowlist."""

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str | None) -> str | None:
        if value is None:
            return None
        text = value.strip()
        if len(text) > MAX_REF_CHARS:
            raise ValueError(f"path {text[:40]!r}… is longer than {MAX_REF_CHARS} characters")
        parts = PurePosixPath(text.replace("\\", "/")).parts
        if not text or text.startswith(("/", "~")) or (len(text) > 1 and text[1] == ":"):
            raise ValueError(f"path {value!r} must be relative to the configuration file's folder (e.g. docs/faq.md)")
        if ".." in parts:
            raise ValueError(f"path {value!r} leaves the configuration file's folder: remove '..'")
        return text

    @field_validator("url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            url = URL(value.strip())
        except ValueError:
            url = URL()
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"url {value!r} is not an http(s) URL with a host (e.g. https://example.com/faq)")
        if len(str(url)) > MAX_REF_CHARS:
            raise ValueError(f"url {value[:40]!r}… is longer than {MAX_REF_CHARS} characters")
        if url.user or url.password:
            raise ValueError(f"url {value!r} carries credentials: use egress secrets instead")
        return str(url)

    @model_validator(mode="after")
    def _one_of(self) -> Self:
        if (self.path is None) == (self.url is None):
            raise ValueError("a knowledge source is either {path: ...} or {url: ...}, exactly one of them")
        return self

    @property
    def ref(self) -> str:
        """The path or the URL, as the index names the source."""
        return self.path if self.path is not None else str(self.url)


class KnowledgeConfig(BaseModel):
    """``knowledge:`` of an agent: sources indexed when the worker starts (and when they change), searched read-only.

    ```yaml
    knowledge:
      deep: true
      sources:
        - path: docs/handbook      # a folder: its text, Markdown, PDF and DOCX files
        - path: faq.md
        - url: https://example.com/pricing
    ```

    A bare list is the ``sources`` of a block with ``deep: false``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    sources: tuple[KnowledgeSource, ...] = Field(min_length=1, max_length=MAX_SOURCES)
    deep: bool = False
    """Deep knowledge: sources sharing keywords are linked, and ``search_knowledge`` expands over the links."""
    tenant: str = "default"
    """The tenant whose turns may search it; its documents live in that tenant's memory."""

    @model_validator(mode="before")
    @classmethod
    def _bare_list(cls, value: object) -> object:
        return {"sources": value} if isinstance(value, list) else value

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, value: str) -> str:
        return check_name(value, "knowledge.tenant")

    @field_validator("sources")
    @classmethod
    def _distinct(cls, value: tuple[KnowledgeSource, ...]) -> tuple[KnowledgeSource, ...]:
        seen: set[str] = set()
        for source in value:
            if source.ref in seen:
                raise ValueError(f"the source {source.ref!r} is listed twice: remove one")
            seen.add(source.ref)
        return value
