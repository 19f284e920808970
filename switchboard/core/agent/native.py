"""What the provider does natively for an agent: compaction, the hosted shell and the hosted web search.

:class:`NativeAdapter` wraps a turn's model adapter and keeps the :class:`~switchboard.core.model.ModelAdapter`
interface, so the runtime's loop is unchanged. Files the hosted shell wrote are copied into the workspace within
bounds and quotas; a compaction window is anchored on its last tool result and saved with the session state, the
deterministic path staying the fallback (``docs/ARCHITECTURE.md`` §7).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import posixpath
import unicodedata
from collections.abc import AsyncIterator, Callable, Sequence, Set
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from switchboard.core.agent.config import Agent
from switchboard.core.agent.pending import PendingAction, pending_actions, render_pending
from switchboard.core.agent.prompt import estimate_tokens, request_tokens
from switchboard.core.model import (
    ChatMessage,
    HostedContainer,
    HostedSearch,
    ModelAdapter,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolSpec,
    data_block,
)
from switchboard.core.protocols import conforms
from switchboard.core.providers.validtext import ValidTextAdapter
from switchboard.core.tools.gateway import ToolGateway
from switchboard.core.turn import SessionStore
from switchboard.core.workspaces.disk import workspace_for
from switchboard.core.workspaces.store import persist_quietly
from switchboard.errors import ModelError, ToolError

__all__ = [
    "COMPACT_AT",
    "HOSTED_DIR",
    "MAX_HOSTED_BYTES",
    "MAX_HOSTED_FILES",
    "PENDING_SOURCE",
    "STATE_SLOT",
    "ContainerFile",
    "HostedFileSource",
    "HostedFiles",
    "NativeAdapter",
    "NativeCompactor",
    "NativeWindow",
]

logger = logging.getLogger(__name__)

COMPACT_AT = 0.8
"""Share of ``limits.max_input_tokens`` past which a ``compaction: native`` agent's request is compacted."""
STATE_SLOT = "native_compaction"
"""Field of the session's slots holding the compacted window (not a slot the model sees or writes)."""
HOSTED_DIR = "hosted"
"""Workspace directory the files written in a hosted container are copied to (their path below ``/mnt/data``)."""
MAX_HOSTED_FILES = 20
"""Most files fetched from a hosted container after one step (the newest)."""
MAX_HOSTED_BYTES = 64 * 2**20
"""Most bytes fetched from a hosted container after one step (held in memory until written; the session quota
lowers it). A file past what is left is not copied."""
_CONTAINER_HOME = "/mnt/data/"
PENDING_SOURCE = "pending-actions"
"""Label of the data message that keeps a compacted window's open actions word for word."""


@dataclass(frozen=True)
class NativeWindow:
    """A conversation compacted by the provider: the items to send in its place, and what they cost."""

    items: list[dict[str, Any]]
    tokens: int
    """Input tokens the items are counted as."""


@dataclass(frozen=True)
class ContainerFile:
    """A file hosted commands wrote, as fetched from their container."""

    id: str
    path: str
    """Its path in the container."""
    data: bytes | None
    """Its content; ``None`` when it was not fetched (``refused`` says why)."""
    refused: str = ""


class _State(BaseModel):
    """A compacted window as saved in the session's slots."""

    model_config = ConfigDict(extra="ignore")

    model: str
    anchor: str = Field(min_length=1)
    check: str = ""
    """Digest of the anchor's call (name and arguments); empty in windows saved before it existed."""
    items: list[dict[str, Any]]
    tokens: int = Field(ge=0)


@runtime_checkable
class NativeCompactor(Protocol):
    """An adapter whose provider compacts a conversation itself."""

    @property
    def native_compaction(self) -> bool:
        """This adapter's provider and wire format can compact (OpenAI: the Responses API only)."""
        ...

    async def compact(self, request: ModelRequest) -> NativeWindow:
        """The request's conversation (``compacted`` items, then ``messages``) compacted by the provider.

        Raises:
            ModelError: classified like a failed step.
        """
        ...


@runtime_checkable
class HostedSearcher(Protocol):
    """An adapter whose provider can search the web within a step (``ModelRequest.hosted_search``)."""

    @property
    def hosted_search(self) -> bool:
        """This adapter's provider and wire format offer a hosted web search."""
        ...


@runtime_checkable
class HostedFileSource(Protocol):
    """An adapter that can fetch the files a hosted container holds."""

    async def container_files(
        self, container_id: str, *, skip: Set[str], limit: int, max_bytes: int
    ) -> list[ContainerFile]:
        """Files the model's commands wrote there (the newest ``limit``, together at most ``max_bytes``), but ``skip``.

        A file over the byte budget, or not fetched in time, comes back without content.

        Raises:
            ModelError: classified like a failed step.
        """
        ...


@dataclass
class HostedFiles:
    """What a turn does after hosted commands ran: it copies their files and counts their output as outside text.

    The files go to the session workspace through the gateway's quotas and workspace store.
    """

    gateway: ToolGateway
    session_key: str
    tainted: Callable[[], None] | None = None
    """Called when hosted commands ran: their output, outside text, reached the model (the turn is untrusted)."""
    fetched: set[str] = field(default_factory=set)
    """Container file ids already copied this turn."""

    @staticmethod
    def target(path: str) -> str:
        """The workspace-relative path a container file is copied to (its path below ``/mnt/data``, or its name).

        Raises:
            ToolError: the path names no file, or holds control or formatting characters.
        """
        if any(unicodedata.category(char) in ("Cc", "Cf") for char in path):
            raise ToolError("its name holds control or formatting characters", error_class="validation")
        below = path[len(_CONTAINER_HOME) :] if path.startswith(_CONTAINER_HOME) else posixpath.basename(path)
        parts = [part for part in posixpath.normpath("/" + below).split("/") if part not in ("", ".", "..")]
        if not parts:
            raise ToolError(f"{path!r} names no file", error_class="validation")
        return "/".join([HOSTED_DIR, *parts])

    async def save(self, path: str, data: bytes) -> str:
        """Write one container file into the workspace; returns its workspace-relative path.

        Raises:
            ToolError: a quota would be passed, or the path is unusable.
        """
        relative = self.target(path)
        workspace = workspace_for(self.gateway.workspace_root, self.session_key)
        store = self.gateway.workspaces.store
        await asyncio.to_thread(store, workspace, workspace.joinpath(*relative.split("/")), data, shown=relative)
        return relative


def _call_check(messages: Sequence[ChatMessage], index: int) -> str:
    """Digest of the call a tool result answers (its name and arguments, from the assistant message that made it)."""
    call_id = messages[index].tool_call_id
    for message in reversed(messages[:index]):
        for call in message.tool_calls if message.role == "assistant" else []:
            if call.id == call_id:
                text = json.dumps([call.name, call.arguments], sort_keys=True, default=str, ensure_ascii=False)
                return hashlib.sha256(text.encode()).hexdigest()[:32]
    return ""


def _shown(path: str) -> str:
    """A container file's name as told to the user, cut at a control or formatting character.

    A newline could forge a line of the note; U+202E would reverse how the name reads.
    """
    bad = next((i for i, char in enumerate(path) if unicodedata.category(char) in ("Cc", "Cf")), None)
    return posixpath.basename(path) if bad is None else posixpath.basename(path[:bad]) + "…"


def _keep_pending(window: NativeWindow, pending: Sequence[PendingAction]) -> NativeWindow:
    """``window`` with the open actions it covers kept word for word, as a ``data`` message after its items.

    The provider's summary is opaque: an approval waiting or a write in doubt it covers could come back as anything.
    """
    if not pending:
        return window
    text = data_block(render_pending(pending), source=PENDING_SOURCE)
    item = {"type": "message", "role": "user", "content": text}
    return NativeWindow([*window.items, item], window.tokens + estimate_tokens(text) + 4)


def _last_result(messages: Sequence[ChatMessage]) -> int | None:
    """The index of the last tool result among ``messages`` (the anchor a window is cut at)."""
    return next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "tool" and messages[i].tool_call_id), None
    )


class NativeAdapter:
    """A turn's model adapter with the agent's native features (see the module docstring)."""

    def __init__(
        self,
        inner: ModelAdapter,
        agent: Agent,
        store: SessionStore,
        files: HostedFiles | None = None,
        searched: Callable[[], None] | None = None,
    ) -> None:
        """Wrap ``inner`` for one turn of ``agent``.

        ``store`` persists the compacted window; ``files`` receives what hosted commands wrote (``None``: it stays in
        the container); ``searched`` is called when the provider's hosted web search ran (its results, outside text,
        reached the model).
        """
        self.inner = inner
        self.files = files
        self.provider = inner.provider
        self._valid = ValidTextAdapter(inner)  # no lone surrogates in what the model wrote
        self.agent = agent
        self.store = store
        responses = conforms(inner, NativeCompactor) and bool(inner.native_compaction)
        self.native = agent.compaction == "native" and responses
        if agent.shell == "hosted" and not responses:
            logger.warning("agent %r has `shell: hosted` but its model has no hosted shell", agent.name)
        searches = conforms(inner, HostedSearcher) and bool(inner.hosted_search)
        self.hosted_search = searches and "web_search" in agent.tools and agent.search.provider == "hosted"
        """The provider searches (``web_search`` is its hosted tool, not the gateway's)."""
        self.searched = searched
        self.failed = False
        """Native compaction failed this turn: the rest of the turn is deterministic."""
        self.hosted_ran = False
        """Hosted shell commands ran in a step of this turn: their output, outside text, reached the model."""
        self._state: _State | None = None
        self._loaded = False
        self._model: str | None = None

    async def aclose(self) -> None:
        """Close the wrapped adapter."""
        await self.inner.aclose()

    def tokens(self, system: str, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> int:
        """Estimated input tokens of a request over ``messages``, counting a compacted window as its items."""
        found = self._split(messages, self._model)
        if found is None:
            return request_tokens(system, messages, tools)
        return found[0].tokens + request_tokens(system, found[1], tools)

    def _split(
        self, messages: Sequence[ChatMessage], model: str | None = None
    ) -> tuple[_State, list[ChatMessage]] | None:
        """The saved window and the messages after its anchor, when the window applies to ``messages``.

        The anchor is the first tool result with the window's call id whose call matches the saved check: an id
        repeated later (servers may number calls ``call_0``…) never moves the cut past messages the window lacks.
        """
        state = self._state
        if not self.native or self.failed or state is None or (model is not None and state.model != model):
            return None
        for index, message in enumerate(messages):
            if message.role == "tool" and message.tool_call_id == state.anchor:
                if state.check and _call_check(messages, index) != state.check:
                    continue
                return state, list(messages[index + 1 :])
        return None

    async def _load(self) -> None:
        if self._loaded or not self.native:
            return
        self._loaded = True
        try:
            stored = (await self.store.load_slots()).get(STATE_SLOT)
        except Exception:  # a window we cannot read is a window we do not have
            logger.warning("could not read the session's compacted window; compacting anew")
            return
        if stored is None:
            return
        try:
            self._state = _State.model_validate(stored)
        except ValidationError:
            logger.warning("the session's compacted window does not read as one; compacting anew")

    async def _forget(self, reason: str) -> None:
        """Drop the saved window: the rest of the turn is deterministic, the next turn compacts anew."""
        self.failed = True
        self._state = None
        logger.warning("dropped the session's compacted window (%s); using deterministic compaction", reason)
        await self.store.save_slot(STATE_SLOT, None)  # fenced like the save

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Run one step through the wrapped adapter, with the agent's native features applied."""
        if self.agent.shell == "hosted":
            request = request.model_copy(update={"hosted_shell": True})
        if self.hosted_search:  # the provider's own tool takes the name's place
            tools = [spec for spec in request.tools if spec.name != "web_search"]
            request = request.model_copy(update={"hosted_search": True, "tools": tools})
        self._model = request.model
        await self._load()
        sent = await self._compacted(request)
        started = False
        try:
            async for event in self._steps(sent):
                started = True
                yield event
        except ModelError as err:
            if started or not sent.compacted or err.code != "bad_request":
                raise
            await self._forget(f"the provider refused it: {err.code}")  # e.g. made for another organisation
            async for event in self._steps(request):
                yield event

    async def _steps(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """One step's events, with what hosted commands wrote copied once their container is named."""
        async for event in self._valid.stream(request):
            yield event
            if isinstance(event, HostedSearch) and self.searched is not None:
                self.searched()
            if isinstance(event, HostedContainer):
                self.hosted_ran = True
                if self.files is not None and self.files.tainted is not None:
                    self.files.tainted()
                hosted = self.agent.shell == "hosted"  # a server may name a container the gateway never asked for
                note = await self._fetch(event.container_id) if event.container_id and hosted else ""
                if note:
                    yield TextDelta(text=note)

    async def _fetch(self, container_id: str) -> str:
        """Copy the files hosted commands wrote into the workspace; what the user and the model are told."""
        files, source = self.files, self.inner
        if files is None or not conforms(source, HostedFileSource):
            return ""
        budget = min(MAX_HOSTED_BYTES, files.gateway.workspaces.quotas.session_bytes)  # more could never be written
        try:
            found = await source.container_files(
                container_id, skip=files.fetched, limit=MAX_HOSTED_FILES, max_bytes=budget
            )
        except ModelError as err:
            logger.warning("could not list the hosted container's files (%s)", err.code or "error")
            return ""
        except Exception as exc:  # the answer was fine; only the copy fails
            logger.warning("could not list the hosted container's files (%s)", type(exc).__name__)
            return ""
        saved: list[str] = []
        refused: list[str] = []
        for file in found:
            files.fetched.add(file.id)
            try:
                if file.data is None:
                    raise ToolError(file.refused)
                target = files.target(file.path)
                if target in saved:
                    raise ToolError(f"another file was copied to {target}", error_class="validation")
                saved.append(await files.save(file.path, file.data))
            except ToolError as err:
                refused.append(f"{_shown(file.path)} ({' '.join(str(err).split())})")
        if saved:
            await persist_quietly(files.gateway.store, files.session_key)
        lines = [f"copied to the workspace: {', '.join(saved)}"] if saved else []
        lines += [f"not copied: {', '.join(refused)}"] if refused else []
        return "".join(f"\n[hosted shell] {line}" for line in lines) + ("\n" if lines else "")

    async def _compacted(self, request: ModelRequest) -> ModelRequest:
        """``request`` with the messages a compacted window stands for replaced by its items.

        Compacts first when the request passes :data:`COMPACT_AT` of the budget; when that fails, ``request`` as it is.
        """
        if not self.native or self.failed:
            return request
        found = self._split(request.messages, request.model)
        sent = request
        estimate = request_tokens(request.system, request.messages, request.tools)
        before = 0  # what the window already sent stands for
        if found is not None:
            state, rest = found
            sent = request.model_copy(update={"compacted": list(state.items), "messages": rest})
            before = state.tokens
            estimate = before + request_tokens(request.system, rest, request.tools)
        if estimate <= int(self.agent.limits.max_input_tokens * COMPACT_AT):
            return sent
        cut = _last_result(sent.messages)
        if cut is None or not sent.messages[cut].tool_call_id:  # nothing a later request could be matched against
            return sent
        assert isinstance(self.inner, NativeCompactor)
        anchor, rest = sent.messages[cut].tool_call_id or "", sent.messages[cut + 1 :]  # what follows stays verbatim
        covered = sent.messages[: cut + 1]
        try:
            window = await self.inner.compact(sent.model_copy(update={"messages": covered}))
        except ModelError as err:
            self.failed = True
            logger.warning("native compaction failed (%s); using deterministic compaction", err.code or "error")
            return request
        window = _keep_pending(window, pending_actions(covered))
        replaced = before + request_tokens("", covered, [])
        if window.tokens >= replaced:  # it would grow every later request instead of shrinking it
            self.failed = True
            logger.warning("native compaction answered %d tokens for %d; using deterministic", window.tokens, replaced)
            return request
        check = _call_check(sent.messages, cut)
        state = _State(model=request.model, anchor=anchor, check=check, items=window.items, tokens=window.tokens)
        self._state = state
        await self.store.save_slot(STATE_SLOT, state.model_dump())  # fenced: a turn that lost its lease stops here
        logger.info("compacted the conversation natively: %d items, ~%d tokens", len(window.items), window.tokens)
        return request.model_copy(update={"compacted": list(window.items), "messages": rest})
