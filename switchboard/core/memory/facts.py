"""Facts with provenance, the projects they belong to, and the record of every change to them."""

from __future__ import annotations

import re
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "MAX_DOCUMENT_CHARS",
    "MAX_FACT_CHARS",
    "NAME_PATTERN",
    "ChangeOp",
    "Fact",
    "FactChange",
    "FactKind",
    "Hit",
    "Passage",
    "ProjectConfig",
    "Source",
    "SourceKind",
    "check_name",
]

MAX_FACT_CHARS = 2000
"""Longest fact text; a longer text is a document, not a fact."""

MAX_DOCUMENT_CHARS = 100_000
"""Longest document text; a document is split into passages, each indexed on its own."""

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""Tenant and project names: safe as one path component (no separators, no leading dot)."""

SourceKind = Literal["message", "file", "tool_result", "url"]
ChangeOp = Literal["remembered", "linked", "corrected", "forgotten"]
FactKind = Literal["fact", "document"]


def check_name(value: str, what: str) -> str:
    """``value`` when it is a valid tenant or project name, else :class:`ValueError` naming ``what``."""
    if not NAME_PATTERN.fullmatch(value) or ".." in value:
        raise ValueError(f"{what} {value!r} is not a valid name (letters, digits, '_', '.', '-'; at most 64)")
    return value


class ProjectConfig(BaseModel):
    """One entry of the file's top-level ``projects:``: a memory shared by the agents connected to it."""

    model_config = ConfigDict(extra="forbid")

    tenant: str = "default"
    """The tenant the project belongs to; only turns of this tenant see or change its facts."""
    description: str = ""

    @field_validator("tenant")
    @classmethod
    def _tenant_is_a_name(cls, value: str) -> str:
        return check_name(value, "tenant")


class Source(BaseModel):
    """Where a fact came from: a message, a file, a tool result or a URL of the turn's context."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: SourceKind
    ref: str = Field("", max_length=2000)
    """The message id, the file path, the tool call id or the URL; for ``message``, empty means a user message of
    the conversation."""
    call_id: str = Field("", max_length=200)
    """For ``file`` and ``url``: the tool call of this run that read it."""
    quote: str = Field(min_length=3, max_length=500)
    """Words of the source, verbatim, that support the fact."""


class Fact(BaseModel):
    """One remembered fact, in one project of one tenant."""

    model_config = ConfigDict(frozen=True)

    id: str
    project: str
    tenant: str
    text: str = Field(min_length=1, max_length=MAX_DOCUMENT_CHARS)
    """At most :data:`MAX_FACT_CHARS` for a fact, :data:`MAX_DOCUMENT_CHARS` for a document."""
    kind: FactKind = "fact"
    source: Source
    run_id: str
    created_at: float = Field(default_factory=time.time)
    updated_at: float | None = None
    """When it was last corrected (``None``: never)."""
    confidence: float = Field(1.0, ge=0.0, le=1.0)
    expires_at: float | None = None
    """Unix time after which it is no longer recalled (``None``: kept until forgotten)."""
    links: tuple[str, ...] = ()
    """Ids of related facts."""
    actor: str = ""
    """The principal the run that remembered it acted for (so erasing a person finds their facts)."""

    @model_validator(mode="after")
    def _fact_is_short(self) -> Fact:
        if self.kind == "fact" and len(self.text) > MAX_FACT_CHARS:
            raise ValueError(f"a fact is at most {MAX_FACT_CHARS} characters; a longer text is a document")
        return self

    def live(self, now: float) -> bool:
        """Not expired at ``now``."""
        return self.expires_at is None or self.expires_at > now


class FactChange(BaseModel):
    """Who changed a fact, how and why; never its content."""

    model_config = ConfigDict(frozen=True)

    fact_id: str
    project: str
    op: ChangeOp
    actor: str
    """Who the run acted for, or the operator."""
    agent: str = ""
    run_id: str = ""
    reason: str = Field("", max_length=500)
    at: float = Field(default_factory=time.time)


class Passage(BaseModel):
    """One indexed piece of a fact's text: the whole of a fact, a chunk of a document."""

    model_config = ConfigDict(frozen=True)

    index: int
    """Its place among the fact's passages, from 0."""
    start: int
    """Offset of its first character in the fact's text."""
    text: str


class Hit(BaseModel):
    """One fact a search found, with its score among the facts the caller may see."""

    model_config = ConfigDict(frozen=True)

    fact: Fact
    score: float
    passage: str = ""
    """For a document: its passage that matched best (empty for a fact)."""
    via: str = ""
    """For a graph search: the id of the fact it was reached from (empty for a seed)."""
