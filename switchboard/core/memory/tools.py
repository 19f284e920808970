"""The memory tools over an agent's connected projects: ``remember``, ``recall``, ``read_memory`` and the rest.

``link``, ``correct`` and ``forget`` change facts by id. They go through the tool gateway like any tool. Every call sees
only the facts of the turn's tenant in the projects its agent is connected to; a fact outside them is answered as
unknown, never as forbidden, so ids reveal nothing. ``remember`` and ``correct`` refuse a source the turn has not
seen: the cited message must be in the conversation, the cited tool result (or the call that read the file or URL)
must be a result of this run, and the quoted words must be in it (:func:`check_source`). ``recall`` searches by
words, by meaning (embeddings), both fused, or both then over links (:mod:`~switchboard.core.memory.retrieval`).
Results of ``recall`` and ``read_memory`` are outside text (``output_trust="data"``), with ids, dates and sources,
snippets capped at :data:`MAX_SNIPPET_CHARS` (for a document, its passage that matched best); ``read_memory`` reads a
document by ranges of at most :data:`MAX_READ_CHARS`. Each change is stored with who and why and appended to the
session's event log as :class:`~switchboard.core.events.MemoryChanged` (ids only, never the fact's text); logs
record ids only.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, assert_never

from pydantic import BaseModel, ConfigDict, Field

from switchboard.core.events import MemoryChanged
from switchboard.core.memory.chunks import passages_for
from switchboard.core.memory.embeddings import CachedEmbedder, Embedder, EmbeddingError, LocalEmbedder
from switchboard.core.memory.evidence import TurnEvidence
from switchboard.core.memory.facts import (
    MAX_DOCUMENT_CHARS,
    MAX_FACT_CHARS,
    ChangeOp,
    Fact,
    FactChange,
    FactKind,
    Hit,
    Source,
)
from switchboard.core.memory.retrieval import SearchMode, retrieve
from switchboard.core.memory.store import MemoryStore
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.errors import ToolError

__all__ = [
    "EMBED_TIMEOUT_S",
    "MAX_LINKS_SHOWN",
    "MAX_READ_CHARS",
    "MAX_RECALLED",
    "MAX_REF_SHOWN",
    "MAX_SNIPPET_CHARS",
    "MEMORY_TOOLS",
    "READ_ONLY_PREFIX",
    "ConnectedProjects",
    "CorrectInput",
    "ForgetInput",
    "LinkInput",
    "ReadMemoryInput",
    "RecallInput",
    "RememberInput",
    "check_source",
    "memory_tools",
    "read_only",
]

logger = logging.getLogger(__name__)

MAX_SNIPPET_CHARS = 400
"""Longest text of one recalled fact shown to the model."""

MAX_RECALLED = 10
"""Most facts one ``recall`` returns."""

MAX_LINKS_SHOWN = 10
"""Most links of one recalled fact shown."""

MAX_READ_CHARS = 4000
"""Most characters of a document one ``read_memory`` returns."""

EMBED_TIMEOUT_S = 20.0
"""Longest wait for the embeddings of a ``remember`` or ``correct`` (the gateway times a tool out at 30 s)."""

MAX_REF_SHOWN = 200
"""Longest source reference of one recalled fact shown (a URL may be 2,000 characters)."""

_MAX_QUERY_CHARS = 200

_MAX_RECALL_BYTES = (
    MAX_RECALLED * (4 * MAX_SNIPPET_CHARS + 4 * MAX_REF_SHOWN + 600 + 40 * MAX_LINKS_SHOWN) + 4 * _MAX_QUERY_CHARS + 200
)
"""A bound on one ``recall`` result (capped snippets, bounded metadata), so it is always shown inline."""

READ_ONLY_PREFIX = "knowledge."
"""Projects named so hold an agent's knowledge: the memory tools read them and never write to them."""


def read_only(project: str) -> bool:
    """Whether the memory tools may only read ``project`` (an agent's knowledge)."""
    return project.startswith(READ_ONLY_PREFIX)


MEMORY_TOOLS = ("remember", "recall", "read_memory", "link", "correct", "forget")

ConnectedProjects = Callable[[str, str], Sequence[str]]
"""The projects an agent (by name) is connected to within a tenant: ``connected(agent, tenant)``."""

_MEMORY_SOURCES = frozenset(MEMORY_TOOLS)
"""Results of the memory tools themselves are no source: a recalled fact re-remembered would launder it."""

_LOG_SOURCES = frozenset(("search_history",))
"""Results of the session log are no source either: it holds the model's own replies and earlier recall results next
to the user's words (a user message is cited as a message)."""

_MAX_REASON = 500
"""Longest reason kept with a change."""

_FACT_ID = Field(min_length=3, max_length=64, pattern=r"^f_[0-9a-f]+$", description="A fact id, as recall gives it.")
_REASON = Field(min_length=3, max_length=_MAX_REASON, description="Why, in a sentence (kept with the change).")
_PROJECT = Field(
    "", max_length=64, description="A connected project; empty: the agent's only one (or every one, for recall)."
)


class RememberInput(BaseModel):
    """Arguments of ``remember``."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(
        min_length=1,
        max_length=MAX_DOCUMENT_CHARS,
        description=f"The fact, in one or two sentences (at most {MAX_FACT_CHARS} characters); or, with kind "
        "document, the document's text.",
    )
    kind: FactKind = Field("fact", description="fact, or document for a longer text (searched by its passages).")
    source: Source = Field(description="Where it came from in this conversation; the quote must be in it, verbatim.")
    project: str = _PROJECT
    confidence: float = Field(1.0, ge=0.0, le=1.0, description="How sure the source makes it (0 to 1).")
    expires_at: datetime | None = Field(None, description="When it stops being true (ISO 8601 with a time zone).")


class RecallInput(BaseModel):
    """Arguments of ``recall``."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(
        min_length=1,
        max_length=_MAX_QUERY_CHARS,
        description="What to look for in remembered facts: words, or a question.",
    )
    project: str = _PROJECT
    limit: int = Field(5, ge=1, le=MAX_RECALLED, description="Most facts returned.")
    mode: SearchMode | None = Field(
        None,
        description="lexical (words), vector (meaning), hybrid (both) or graph (both, then linked facts); "
        "default: hybrid when embeddings are configured, else lexical.",
    )


class ReadMemoryInput(BaseModel):
    """Arguments of ``read_memory``."""

    model_config = ConfigDict(extra="forbid")

    id: str = _FACT_ID
    offset: int = Field(0, ge=0, le=MAX_DOCUMENT_CHARS, description="First character to read.")
    length: int = Field(MAX_READ_CHARS, ge=1, le=MAX_READ_CHARS, description="Most characters to read.")


class LinkInput(BaseModel):
    """Arguments of ``link``."""

    model_config = ConfigDict(extra="forbid")

    fact_id: str = _FACT_ID
    to: str = _FACT_ID
    reason: str = _REASON


class CorrectInput(BaseModel):
    """Arguments of ``correct``."""

    model_config = ConfigDict(extra="forbid")

    fact_id: str = _FACT_ID
    text: str = Field(min_length=1, max_length=MAX_DOCUMENT_CHARS, description="The corrected fact (or document) text.")
    source: Source = Field(description="Where the correction came from in this conversation.")
    confidence: float = Field(1.0, ge=0.0, le=1.0)
    reason: str = _REASON


class ForgetInput(BaseModel):
    """Arguments of ``forget``."""

    model_config = ConfigDict(extra="forbid")

    fact_id: str = _FACT_ID
    reason: str = _REASON


_WORD = re.compile(r"\w")


def _normal(text: str) -> str:
    return " ".join(text.split()).casefold()


def _quoted(quote: str, text: str) -> bool:
    """Whether ``quote`` is in ``text`` (both normalised) as whole words, not letters cut out of words.

    A quote of three words or more may end inside a word (a long quote cut short); a shorter one must end with one.
    """
    before = r"(?<!\w)" if _WORD.match(quote[0]) else ""
    after = r"(?!\w)" if _WORD.match(quote[-1]) and len(quote.split()) < 3 else ""
    return re.search(before + re.escape(quote) + after, text) is not None


def _refuse(message: str) -> ToolError:
    return ToolError(f"not remembered: {message}", error_class="validation")


def _strings(value: Any) -> list[str]:
    """Every string in a call's arguments, however nested."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for item in value.values() for text in _strings(item)]
    if isinstance(value, list | tuple):
        return [text for item in value for text in _strings(item)]
    return []


def check_source(source: Source, evidence: TurnEvidence | None) -> None:
    """Refuse (:class:`ToolError`) a source this turn has not seen, or a quote that is not in it."""
    if evidence is None:
        raise _refuse("this call has no conversation to cite (memory writes need one)")
    quote = _normal(source.quote)
    if not _WORD.search(quote):
        raise _refuse("the quote has no words (quote the source's words verbatim)")
    if source.kind == "message":
        messages = [m for m in evidence.messages() if not source.ref or m.message_id == source.ref]
        if not messages:
            raise _refuse(f"message {source.ref!r} is not in this conversation")
        if not any(_quoted(quote, _normal(m.text)) for m in messages):
            raise _refuse("the quote is not in the cited message (quote its whole words verbatim)")
        return
    if source.kind == "tool_result":
        call_id = source.ref or source.call_id
    elif source.kind == "file" or source.kind == "url":
        call_id = source.call_id
        if not source.ref or not call_id:
            raise _refuse(f"a {source.kind} source needs its ref and the call_id of the tool call that read it")
    else:
        assert_never(source.kind)
    seen = list(evidence.tool_results())
    results = [r for r in seen if r.call_id == call_id]
    if not results:
        raise _refuse(f"tool call {call_id!r} has no result in this run")
    if len(results) > 1:  # which call gave which result is then unknown: one may be memory's own output
        raise _refuse(f"tool call id {call_id!r} was used more than once in this run")
    result = results[0]
    if result.tool in _MEMORY_SOURCES:
        raise _refuse(f"a result of {result.tool!r} is memory itself, not a source")
    if result.tool in _LOG_SOURCES:
        raise _refuse(f"a result of {result.tool!r} mixes your own replies and recalled memory: cite a message")
    if source.kind in ("file", "url") and source.ref.strip() not in {
        str(value).strip() for value in result.arguments.values() if isinstance(value, str)
    }:
        raise _refuse(f"tool call {call_id!r} did not read {source.ref!r}")
    if not _quoted(quote, _normal(result.text)):
        raise _refuse("the quote is not in the cited tool result (quote its whole words verbatim)")
    if any(_quoted(quote, _normal(value)) for value in _strings(result.arguments)):
        raise _refuse("the quoted words are in the call's own arguments: a result echoing them is no source")
    earlier = seen[: seen.index(result)]  # a file or a row the run wrote, then read back, holds the model's words
    if any(_quoted(quote, _normal(value)) for other in earlier for value in _strings(other.arguments)):
        raise _refuse("this run wrote the quoted words itself before it read them: they are no source")


_RECENT_QUERIES = 512
"""Query vectors kept in the worker's memory, most recently used first out last."""


class _QueryEmbedder:
    """Embeds recall queries, keeping the recent ones in this process only.

    A query is no memory: written to the tenant's cache it would stay on disk (the hash of its text and a vector) with
    no owner or date, so neither erasing a person nor a retention rule could find it.
    """

    def __init__(self, inner: Embedder, tenant: str, recent: OrderedDict[tuple[str, str, str], list[float]]) -> None:
        self.inner = inner
        self.tenant = tenant
        self.recent = recent
        self.model = inner.model
        self.dims = inner.dims

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order: from the recent ones, else from the inner embedder."""
        keys = [(self.tenant, self.model, text) for text in texts]
        found = {key: self.recent[key] for key in keys if key in self.recent}
        missing = [key for key in dict.fromkeys(keys) if key not in found]
        if missing:
            vectors = await self.inner.embed([text for _, _, text in missing])
            found.update(zip(missing, vectors, strict=True))
        for key, vector in found.items():
            self.recent[key] = vector
            self.recent.move_to_end(key)
        while len(self.recent) > _RECENT_QUERIES:
            self.recent.popitem(last=False)
        return [list(found[key]) for key in keys]


def _not_blank(text: str) -> None:
    if not text.strip():
        raise ToolError("the text is blank: nothing to remember", error_class="validation")


def _fitted(reason: str) -> str:
    """``reason`` cut to what a change keeps (it may embed a long source reference, or a fact id and the model's)."""
    return reason if len(reason) <= _MAX_REASON else reason[: _MAX_REASON - 1] + "…"


def _date(at: float | None) -> str | None:
    return None if at is None else datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


def _capped(text: str, most: int = MAX_SNIPPET_CHARS) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


def _shown(hit: Hit) -> dict[str, Any]:
    fact = hit.fact
    shown: dict[str, Any] = {"id": fact.id, "project": fact.project, "kind": fact.kind}
    if fact.kind == "document":  # its best passage, and its length for read_memory
        shown["text"] = _capped(hit.passage or fact.text)
        shown["chars"] = len(fact.text)
    else:
        shown["text"] = _capped(fact.text)
    if hit.via:
        shown["via"] = hit.via
    return shown | {
        "source": {"kind": fact.source.kind, "ref": _capped(fact.source.ref, MAX_REF_SHOWN)},
        "created_at": _date(fact.created_at),
        "corrected_at": _date(fact.updated_at),
        "confidence": fact.confidence,
        "expires_at": _date(fact.expires_at),
        "links": list(fact.links[:MAX_LINKS_SHOWN]),
    }


def memory_tools(
    store: MemoryStore,
    connected: ConnectedProjects,
    clock: Callable[[], float] = time.time,
    embedder: Embedder | None = None,
    embed_timeout_s: float = EMBED_TIMEOUT_S,
) -> list[Tool]:
    """The memory tools over ``store``, each call limited to the projects ``connected`` gives its agent.

    ``embedder``: how texts become vectors (remembered texts are embedded, recall defaults to hybrid search);
    ``None``: words only. ``embed_timeout_s``: longest wait for a write's embeddings, below the tool's own timeout.
    """
    recent: OrderedDict[tuple[str, str, str], list[float]] = OrderedDict()

    def embedder_for(ctx: ToolContext) -> Embedder | None:
        if embedder is None or isinstance(embedder, LocalEmbedder):  # local vectors cost less than a cache lookup
            return embedder
        return CachedEmbedder(embedder, store, ctx.tenant)

    def query_embedder(ctx: ToolContext) -> Embedder | None:
        if embedder is None or isinstance(embedder, LocalEmbedder):
            return embedder
        return _QueryEmbedder(embedder, ctx.tenant, recent)

    async def embedded(ctx: ToolContext, kind: FactKind, text: str) -> list[list[float]] | None:
        found = embedder_for(ctx)
        if found is None:
            return None
        try:
            async with asyncio.timeout(embed_timeout_s):  # before the gateway's, which would make the write doubtful
                return await found.embed([piece.text for piece in passages_for(kind, text)])
        except EmbeddingError as error:
            raise ToolError(f"not remembered: {error}; try again later", error_class="transient") from None
        except TimeoutError:
            message = f"not remembered: the embeddings took over {embed_timeout_s:g} s; try again later"
            raise ToolError(message, error_class="transient") from None

    def visible(ctx: ToolContext) -> list[str]:
        return list(connected(ctx.agent, ctx.tenant))

    def one_project(ctx: ToolContext, name: str, *, write: bool = False) -> str:
        projects = visible(ctx)
        if name and write and read_only(name) and name in projects:
            raise ToolError(f"project {name!r} is knowledge, which agents only read", error_class="validation")
        if write:
            projects = [project for project in projects if not read_only(project)]
        if name:
            if name not in projects:
                raise ToolError(
                    f"no connected project {name!r} (connected: {', '.join(projects) or 'none'})",
                    error_class="validation",
                )
            return name
        if len(projects) != 1:
            raise ToolError(f"name the project (connected: {', '.join(projects) or 'none'})", error_class="validation")
        return projects[0]

    async def find(ctx: ToolContext, fact_id: str, *, write: bool = False) -> Fact:
        fact = await store.get(ctx.tenant, fact_id, visible(ctx))
        if fact is None:
            raise ToolError(f"no fact {fact_id!r} in the connected projects", error_class="validation")
        if write and read_only(fact.project):
            raise ToolError(f"{fact_id!r} is knowledge, which agents only read", error_class="validation")
        return fact

    async def changed(ctx: ToolContext, op: ChangeOp, fact: Fact, reason: str) -> FactChange:
        change = FactChange(
            fact_id=fact.id,
            project=fact.project,
            op=op,
            actor=ctx.actor,
            agent=ctx.agent,
            run_id=ctx.run_id,
            reason=reason,
            at=clock(),
        )
        return change

    async def recorded(ctx: ToolContext, change: FactChange, source_kind: str = "") -> None:
        if ctx.record is not None:
            await ctx.record(
                MemoryChanged(
                    op=change.op,
                    fact_id=change.fact_id,
                    project=change.project,
                    actor=change.actor,
                    agent=change.agent,
                    run_id=change.run_id,
                    reason=change.reason,
                    source_kind=source_kind,
                )
            )

    async def remember(args: RememberInput, ctx: ToolContext) -> dict[str, Any]:
        project = one_project(ctx, args.project, write=True)
        _not_blank(args.text)
        check_source(args.source, ctx.evidence)
        now = clock()
        expires = None if args.expires_at is None else args.expires_at.timestamp()
        if args.expires_at is not None and args.expires_at.tzinfo is None:
            raise ToolError("expires_at needs a time zone (e.g. 2027-01-31T00:00:00Z)", error_class="validation")
        if expires is not None and expires <= now:
            raise ToolError("expires_at is in the past: nothing to remember", error_class="validation")
        if args.kind == "fact" and len(args.text) > MAX_FACT_CHARS:
            raise ToolError(
                f"a fact is at most {MAX_FACT_CHARS} characters: remember a longer text with kind document",
                error_class="validation",
            )
        key = ctx.idempotency_key  # a re-run of the same call names the same fact, so it is stored once
        fact_id = "f_" + (
            hashlib.sha256(f"{ctx.tenant}\n{key}".encode()).hexdigest()[:16] if key else secrets.token_hex(8)
        )
        fact = Fact(
            id=fact_id,
            project=project,
            tenant=ctx.tenant,
            text=args.text.strip() or args.text,
            kind=args.kind,
            actor=ctx.actor,
            source=args.source,
            run_id=ctx.run_id,
            created_at=now,
            confidence=args.confidence,
            expires_at=expires,
        )
        vectors = await embedded(ctx, fact.kind, fact.text)
        change = await changed(ctx, "remembered", fact, _fitted(f"from {args.source.kind} {args.source.ref}".strip()))
        await store.add(fact, change, vectors)
        await recorded(ctx, change, args.source.kind)
        return {"remembered": fact.id, "project": project, "kind": fact.kind}

    async def recall(args: RecallInput, ctx: ToolContext) -> dict[str, Any]:
        projects = [one_project(ctx, args.project)] if args.project else visible(ctx)
        mode: SearchMode = args.mode or ("lexical" if embedder is None else "hybrid")
        try:
            hits = await retrieve(
                store, query_embedder(ctx), ctx.tenant, projects, args.query, mode=mode, limit=args.limit, now=clock()
            )
        except ValueError as error:
            raise ToolError(f"{error}; use mode lexical", error_class="validation") from None
        except EmbeddingError as error:
            raise ToolError(f"{error}; use mode lexical, or try again later", error_class="transient") from None
        logger.info("recall mode=%s found=%s", mode, ",".join(hit.fact.id for hit in hits))
        return {"query": args.query, "mode": mode, "count": len(hits), "facts": [_shown(hit) for hit in hits]}

    async def read_memory(args: ReadMemoryInput, ctx: ToolContext) -> dict[str, Any]:
        fact = await find(ctx, args.id)
        if not fact.live(clock()):
            raise ToolError(f"no fact {args.id!r} in the connected projects", error_class="validation")
        total = len(fact.text)
        if args.offset > total:
            raise ToolError(f"offset {args.offset} is past the end ({total} characters)", error_class="validation")
        end = min(total, args.offset + args.length)
        return {
            "id": fact.id,
            "kind": fact.kind,
            "offset": args.offset,
            "text": fact.text[args.offset : end],
            "total_chars": total,
            "next_offset": end if end < total else None,
        }

    async def link(args: LinkInput, ctx: ToolContext) -> dict[str, Any]:
        if args.fact_id == args.to:
            raise ToolError("a fact cannot be linked to itself", error_class="validation")
        fact = await find(ctx, args.fact_id, write=True)
        await find(ctx, args.to, write=True)
        change = await changed(ctx, "linked", fact, _fitted(f"to {args.to}: {args.reason}"))
        await store.link(ctx.tenant, args.fact_id, args.to, change)
        await recorded(ctx, change)
        return {"linked": [args.fact_id, args.to]}

    async def correct(args: CorrectInput, ctx: ToolContext) -> dict[str, Any]:
        fact = await find(ctx, args.fact_id, write=True)
        _not_blank(args.text)
        check_source(args.source, ctx.evidence)
        if fact.kind == "fact" and len(args.text) > MAX_FACT_CHARS:
            raise ToolError(f"a fact is at most {MAX_FACT_CHARS} characters", error_class="validation")
        vectors = await embedded(ctx, fact.kind, args.text)
        change = await changed(ctx, "corrected", fact, args.reason)
        await store.correct(ctx.tenant, fact.id, args.text, args.source, args.confidence, change, vectors)
        await recorded(ctx, change, args.source.kind)
        return {"corrected": fact.id}

    async def forget(args: ForgetInput, ctx: ToolContext) -> dict[str, Any]:
        fact = await find(ctx, args.fact_id, write=True)
        change = await changed(ctx, "forgotten", fact, args.reason)
        await store.forget(ctx.tenant, fact.id, change)
        await recorded(ctx, change)
        return {"forgotten": fact.id}

    return [
        Tool(
            name="remember",
            description="Remember a fact (or, with kind document, a longer text) in a connected project, citing its "
            "source in this conversation: a user message, or a tool result of this run (with a verbatim quote). "
            "Never remember what you only assume.",
            input=RememberInput,
            fn=remember,
            side_effect="write",
            idempotent=True,
            connector="memory",
            cost=5,
            resources=lambda a: (f"project {a.project or '(connected)'}",),
        ),
        Tool(
            name="recall",
            description="Search remembered facts and documents of your connected projects by words or meaning; "
            "gives each one's id, date, source and confidence (for a document, its best passage: read more with "
            "read_memory).",
            input=RecallInput,
            fn=recall,
            output_trust="data",
            max_inline_bytes=_MAX_RECALL_BYTES,
            connector="memory",
        ),
        Tool(
            name="read_memory",
            description="Read a remembered document (by id) from a character offset, at most "
            f"{MAX_READ_CHARS} characters at a time.",
            input=ReadMemoryInput,
            fn=read_memory,
            output_trust="data",
            max_inline_bytes=4 * MAX_READ_CHARS + 400,
            connector="memory",
        ),
        Tool(
            name="link",
            description="Relate two remembered facts (by id), saying why.",
            input=LinkInput,
            fn=link,
            side_effect="write",
            connector="memory",
            cost=5,
            resources=lambda a: (f"fact {a.fact_id}", f"fact {a.to}"),
        ),
        Tool(
            name="correct",
            description="Correct a remembered fact (by id) from a source in this conversation, saying why.",
            input=CorrectInput,
            fn=correct,
            side_effect="write",
            connector="memory",
            cost=5,
            resources=lambda a: (f"fact {a.fact_id}",),
        ),
        Tool(
            name="forget",
            description="Delete a remembered fact (by id) for good, saying why.",
            input=ForgetInput,
            fn=forget,
            side_effect="write",
            risk="medium",  # irreversible: a person approves, so an instruction hidden in recalled text deletes nothing
            reversible=False,
            connector="memory",
            cost=5,
            resources=lambda a: (f"fact {a.fact_id}",),
        ),
    ]
