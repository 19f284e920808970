"""The model-adapter Protocol: neutral requests in, a stream of neutral events out.

Adapters turn a :class:`ModelRequest` into a provider call and its stream into :data:`ModelEvent` items; the runtime
folds them into one :data:`Decision`. Every piece of context carries a :data:`TrustClass`: only ``system`` text may
instruct the model, ``data`` from elsewhere is always inside a :func:`data_block` envelope, and nothing changes class
on its way into a prompt.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ChatMessage",
    "Decision",
    "FinalAnswer",
    "Finished",
    "HostedContainer",
    "HostedSearch",
    "ImagePart",
    "ModelAdapter",
    "ModelEvent",
    "ModelRequest",
    "Program",
    "TextDelta",
    "ToolCall",
    "ToolCallEvent",
    "ToolCalls",
    "ToolSpec",
    "TrustClass",
    "Usage",
    "data_block",
]

TrustClass = Literal["system", "user", "model", "tool", "data"]
"""Who a piece of context comes from, and so whether it may instruct the model (only ``system`` may)."""

_ROLE_TRUST: dict[str, TrustClass] = {"user": "user", "assistant": "model", "tool": "tool"}
_DATA_TAG = re.compile(
    r"[<\uff1c\ufe64]"  # "<", or a full-width or small "<" a model may read as one
    r"(?=[\s/\uff0f\u200b-\u200d\u2060\ufeff]*"  # then any spaces, newlines, zero-width characters and slashes
    r"[d\uff44][a\uff41][t\uff54][a\uff41]\b)",  # then the tag name "data", any case, ASCII or full-width
    re.IGNORECASE,
)


def data_block(text: str, *, source: str) -> str:
    """``text`` wrapped in a labelled ``<data source=… trust="untrusted">`` envelope it cannot close.

    Every ``<`` that begins a ``data`` tag inside the text is escaped (``&lt;``), whatever its form: any case,
    a space or a newline after ``<`` or after ``/`` (``< /data>``, ``</ DATA>``, ``<data`` and a line break), zero-width
    characters, full-width ``＜/ｄａｔａ＞``. So data can neither end its own envelope nor open a second one
    that looks trusted, while every other ``<`` (code, markup, ``x < y``) reaches the model as it is.
    """
    label = source.replace('"', "'").replace("<", "(").replace(">", ")")
    body = _DATA_TAG.sub("&lt;", text)
    return f'<data source="{label}" trust="untrusted">\n{body}\n</data>'


class ToolCall(BaseModel):
    """One call the model asked for."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolSpec(BaseModel):
    """A tool as the model sees it."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    parameters: dict[str, Any]
    """JSON Schema of the arguments."""


class ImagePart(BaseModel):
    """An image given to a vision-capable model as input (a file the user sent)."""

    model_config = ConfigDict(frozen=True)

    mime_type: str
    """``image/jpeg``, ``image/png``, ``image/gif`` or ``image/webp``."""
    data: str
    """The image, base64-encoded."""


class ChatMessage(BaseModel):
    """One entry of the neutral conversation sent to a model."""

    model_config = ConfigDict(frozen=True)

    role: Literal["user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    """On an assistant message: the calls it made (their results follow as ``tool`` messages)."""
    tool_call_id: str | None = None
    """On a tool message: the call it answers."""
    name: str | None = None
    """On a tool message: the tool's name."""
    trust: TrustClass | None = None
    """Trust class of the content; ``None`` means the role's own (user → ``user``, assistant → ``model``,
    tool → ``tool``). A ``user``-role message holding documents, slots or records is ``data``."""
    images: list[ImagePart] = Field(default_factory=list)
    """On a user-role message: images shown with its text (only to vision-capable models)."""

    @property
    def trust_class(self) -> TrustClass:
        """The trust class of this message's content."""
        return self.trust or _ROLE_TRUST[self.role]


class ModelRequest(BaseModel):
    """Everything a provider needs for one step."""

    model_config = ConfigDict(frozen=True)

    model: str
    """The provider's model name (without the ``provider:`` prefix)."""
    system: str
    messages: list[ChatMessage]
    tools: list[ToolSpec] = Field(default_factory=list)
    max_output_tokens: int = 2048
    metadata: dict[str, str] = Field(default_factory=dict)
    compacted: list[dict[str, Any]] = Field(default_factory=list)
    """Opaque items of the provider's native compaction (:mod:`switchboard.core.agent.native`), standing for the
    conversation before ``messages``; only the adapter that made them reads them."""
    hosted_shell: bool = False
    """Offer the provider's hosted shell (OpenAI Responses: the ``shell`` tool in a hosted container)."""
    hosted_search: bool = False
    """Offer the provider's hosted web search (OpenAI Responses: the ``web_search`` tool)."""
    cache_key: str | None = None
    """Ask the provider to cache the request's stable prefix (system prompt, then tools): Anthropic gets
    ``cache_control`` breakpoints, OpenAI this value as ``prompt_cache_key`` (a digest naming the tenant, the agent
    and its prompt version; never a secret). ``None``: no caching asked (the agent's ``prompt_cache: false``)."""


class TextDelta(BaseModel):
    """A piece of answer text."""

    kind: Literal["text_delta"] = "text_delta"
    text: str


class ToolCallEvent(BaseModel):
    """A complete tool call (adapters assemble streamed argument fragments)."""

    kind: Literal["tool_call"] = "tool_call"
    call: ToolCall


class Usage(BaseModel):
    """Tokens used by the step."""

    kind: Literal["usage"] = "usage"
    input_tokens: int = 0
    """Every input token, those read from or written to the provider's prompt cache included."""
    output_tokens: int = 0
    cached_input_tokens: int = 0
    """Of ``input_tokens``, those read from the provider's prompt cache (billed at its cached-input price)."""
    cache_write_tokens: int = 0
    """Of ``input_tokens``, those written to the provider's prompt cache (Anthropic bills them at a write price)."""


class Finished(BaseModel):
    """The provider ended the step."""

    kind: Literal["finished"] = "finished"
    stop_reason: str = "stop"


class HostedContainer(BaseModel):
    """The provider ran the step's hosted shell commands in this container (files they wrote may be fetched)."""

    kind: Literal["hosted_container"] = "hosted_container"
    container_id: str = ""
    """Empty when the provider did not name the container."""


class HostedSearch(BaseModel):
    """The provider searched the web within the step: what it read is outside text, now in the model's context."""

    kind: Literal["hosted_search"] = "hosted_search"
    queries: list[str] = Field(default_factory=list)
    """What it searched for, as the provider reported it."""


ModelEvent = Annotated[
    TextDelta | ToolCallEvent | Usage | Finished | HostedContainer | HostedSearch, Field(discriminator="kind")
]


class FinalAnswer(BaseModel):
    """The model answered the user."""

    kind: Literal["answer"] = "answer"
    text: str


class ToolCalls(BaseModel):
    """The model asked for tool calls."""

    kind: Literal["tool_calls"] = "tool_calls"
    calls: list[ToolCall]
    text: str = ""


class Program(BaseModel):
    """The model answered with a short program that calls tools as functions (CodeAct)."""

    kind: Literal["program"] = "program"
    code: str
    call_id: str
    text: str = ""


Decision = Annotated[FinalAnswer | ToolCalls | Program, Field(discriminator="kind")]


class ModelAdapter(Protocol):
    """A thin adapter over one provider."""

    provider: str

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Run one step, yielding events as the provider produces them.

        Raises:
            ModelError: classified (``retryable``, ``retry_after``); auth errors are not retryable.
        """
        ...

    async def aclose(self) -> None:
        """Release the HTTP connection pool."""
