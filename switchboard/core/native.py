"""What the provider does natively for an agent: compaction (``compaction: native``) and the hosted shell.

:class:`NativeAdapter` wraps a turn's model adapter (through :class:`~switchboard.core.validtext.ValidTextAdapter`)
and keeps the :class:`~switchboard.core.model.ModelAdapter` interface, so the runtime's loop is unchanged:

- ``shell: hosted`` marks every request :attr:`~switchboard.core.model.ModelRequest.hosted_shell`: the provider
  offers its own shell in its own container (OpenAI's Responses API; the toolbox leaves the local ``shell`` out).
  After a step whose commands ran there (a :class:`~switchboard.core.model.HostedContainer` event), the files they
  wrote are fetched from the container (a :class:`HostedFileSource`) into the session workspace under
  :data:`HOSTED_DIR`, through the workspace quotas, and persisted like any write; the user and the model are told
  which (``send_file`` delivers them from there). Their output is outside text: the turn counts as untrusted from
  that step on, as after a local ``shell`` call.
- ``compaction: native``, when the provider can compact (a :class:`NativeCompactor`: OpenAI's Responses API),
  compacts once a request passes :data:`COMPACT_AT` of the agent's context budget: the conversation up to its last
  tool result goes to the provider, which answers a shorter window of opaque items (an encrypted ``compaction`` item
  and the user's messages); what follows that result stays verbatim. From then on the messages the window stands
  for are sent as those items, so a long tool-driven run goes on within the budget. The window is saved with the
  session state (the ``native_compaction`` field of the session's slots, through the
  :class:`~switchboard.core.turn.SessionStore`), so a later turn on any worker starts from it; ``/reset`` forgets
  it with the slots.

Which messages a window stands for is told by an anchor: the call id of the last tool result it covered (tool
results keep their call ids in the stored history, whatever happens to their text). A request in which the anchor
is not found (it was folded into the deterministic record, dropped, or never there) is sent whole, as before.
Everything else is the deterministic path, kept as the fallback: a provider without native compaction, a failed
compaction call (any :class:`~switchboard.errors.ModelError`: 4xx, 5xx, timeouts), a window for another model.
The compaction request holds only the turn's model input (which never holds secrets: they exist only as
placeholders until the egress proxy swaps them in), never keys or headers.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
from collections.abc import AsyncIterator, Callable, Sequence, Set
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from switchboard.core.agent import Agent
from switchboard.core.gateway import ToolGateway
from switchboard.core.model import (
    ChatMessage,
    HostedContainer,
    ModelAdapter,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolSpec,
)
from switchboard.core.prompt import request_tokens
from switchboard.core.turn import SessionStore
from switchboard.core.validtext import ValidTextAdapter
from switchboard.core.workspaces import workspace_for
from switchboard.core.workspacestore import persist_quietly
from switchboard.errors import ModelError, ToolError

__all__ = [
    "COMPACT_AT",
    "HOSTED_DIR",
    "MAX_HOSTED_FILES",
    "STATE_SLOT",
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
_CONTAINER_HOME = "/mnt/data/"


@dataclass(frozen=True)
class NativeWindow:
    """A conversation compacted by the provider: the items to send in its place, and what they cost."""

    items: list[dict[str, Any]]
    tokens: int
    """Input tokens the items are counted as."""


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
class HostedFileSource(Protocol):
    """An adapter that can fetch the files a hosted container holds."""

    async def container_files(self, container_id: str, *, skip: Set[str], limit: int) -> list[tuple[str, str, bytes]]:
        """Files the model's commands wrote there, ``(id, path, content)``, but those in ``skip``.

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

    async def save(self, path: str, data: bytes) -> str:
        """Write one container file into the workspace; returns its workspace-relative path.

        Raises:
            ToolError: a quota would be passed, or the path is unusable.
        """
        below = path[len(_CONTAINER_HOME) :] if path.startswith(_CONTAINER_HOME) else posixpath.basename(path)
        parts = [part for part in posixpath.normpath("/" + below).split("/") if part not in ("", ".", "..")]
        if not parts:
            raise ToolError(f"{path!r} names no file", error_class="validation")
        relative = "/".join([HOSTED_DIR, *parts])
        workspace = workspace_for(self.gateway.workspace_root, self.session_key)
        store = self.gateway.workspaces.store
        await asyncio.to_thread(store, workspace, workspace.joinpath(*relative.split("/")), data, shown=relative)
        return relative


def _last_result(messages: Sequence[ChatMessage]) -> int | None:
    """The index of the last tool result among ``messages`` (the anchor a window is cut at)."""
    return next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "tool" and messages[i].tool_call_id), None
    )


class NativeAdapter:
    """A turn's model adapter with the agent's native features (see the module docstring)."""

    def __init__(
        self, inner: ModelAdapter, agent: Agent, store: SessionStore, files: HostedFiles | None = None
    ) -> None:
        """Wrap ``inner`` for one turn of ``agent``.

        ``store`` persists the compacted window; ``files`` receives what hosted commands wrote (``None``: it stays in
        the container).
        """
        self.inner = inner
        self.files = files
        self.provider = inner.provider
        self._valid = ValidTextAdapter(inner)  # no lone surrogates in what the model wrote
        self.agent = agent
        self.store = store
        responses = isinstance(inner, NativeCompactor) and bool(inner.native_compaction)
        self.native = agent.compaction == "native" and responses
        if agent.shell == "hosted" and not responses:
            logger.warning("agent %r has `shell: hosted` but its model has no hosted shell", agent.name)
        self.failed = False
        """Native compaction failed this turn: the rest of the turn is deterministic."""
        self.hosted_ran = False
        """Hosted shell commands ran in a step of this turn: their output, outside text, reached the model."""
        self._state: dict[str, Any] | None = None
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
        return int(found[0]["tokens"]) + request_tokens(system, found[1], tools)

    def _split(
        self, messages: Sequence[ChatMessage], model: str | None = None
    ) -> tuple[dict[str, Any], list[ChatMessage]] | None:
        """The saved window and the messages after its anchor, when the window applies to ``messages``."""
        state = self._state
        if not self.native or self.failed or state is None or (model is not None and state.get("model") != model):
            return None
        anchor = state.get("anchor")
        for index in range(len(messages) - 1, -1, -1):
            if messages[index].role == "tool" and messages[index].tool_call_id == anchor:
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
        if isinstance(stored, dict) and isinstance(stored.get("items"), list) and stored.get("anchor"):
            self._state = stored

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Run one step through the wrapped adapter, with the agent's native features applied."""
        if self.agent.shell == "hosted":
            request = request.model_copy(update={"hosted_shell": True})
        self._model = request.model
        await self._load()
        request = await self._compacted(request)
        async for event in self._valid.stream(request):
            yield event
            if isinstance(event, HostedContainer):
                self.hosted_ran = True
                if self.files is not None and self.files.tainted is not None:
                    self.files.tainted()
                note = await self._fetch(event.container_id) if event.container_id else ""
                if note:
                    yield TextDelta(text=note)

    async def _fetch(self, container_id: str) -> str:
        """Copy the files hosted commands wrote into the workspace; what the user and the model are told."""
        files, source = self.files, self.inner
        if files is None or not isinstance(source, HostedFileSource):
            return ""
        try:
            found = await source.container_files(container_id, skip=files.fetched, limit=MAX_HOSTED_FILES)
        except ModelError as err:
            logger.warning("could not list the hosted container's files (%s)", err.code or "error")
            return ""
        saved: list[str] = []
        refused: list[str] = []
        for file_id, path, data in found:
            files.fetched.add(file_id)
            try:
                saved.append(await files.save(path, data))
            except ToolError as err:
                refused.append(f"{posixpath.basename(path)} ({err})")
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
        if found is not None:
            state, rest = found
            sent = request.model_copy(update={"compacted": list(state["items"]), "messages": rest})
            estimate = int(state["tokens"]) + request_tokens(request.system, rest, request.tools)
        if estimate <= int(self.agent.limits.max_input_tokens * COMPACT_AT):
            return sent
        cut = _last_result(sent.messages)
        if cut is None:  # nothing a later request could be matched against
            return sent
        assert isinstance(self.inner, NativeCompactor)
        anchor, rest = sent.messages[cut].tool_call_id, sent.messages[cut + 1 :]  # what follows stays verbatim
        try:
            window = await self.inner.compact(sent.model_copy(update={"messages": sent.messages[: cut + 1]}))
        except ModelError as err:
            self.failed = True
            logger.warning("native compaction failed (%s); using deterministic compaction", err.code or "error")
            return request
        state = {"model": request.model, "anchor": anchor, "items": window.items, "tokens": window.tokens}
        self._state = state
        await self.store.save_slot(STATE_SLOT, state)  # fenced: a turn that lost its lease stops here
        logger.info("compacted the conversation natively: %d items, ~%d tokens", len(window.items), window.tokens)
        return request.model_copy(update={"compacted": list(window.items), "messages": rest})
