"""② The normalised inbound message and the conversation it belongs to."""

from __future__ import annotations

import re
import time
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from switchboard.types import ChannelName, SessionKey

__all__ = [
    "Attachment",
    "ChoiceSelected",
    "CommandIssued",
    "Contact",
    "ConversationRef",
    "ExternalEvent",
    "InboundEvent",
    "InboundMessage",
    "Location",
    "MessageDeleted",
    "MessageEdited",
    "OperatorActed",
    "Posted",
    "Scheduled",
    "Sender",
    "SharedPart",
    "session_key",
    "trusted",
]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.:@+=-]")


def _component(value: str) -> str:
    """Escape one session-key component so that it can never contain ``/``, ``{`` or ``}``."""
    return _UNSAFE.sub(lambda m: "%" + "%".join(f"{b:02X}" for b in m.group().encode()), value) or "-"


def session_key(
    tenant: str, agent: str, channel: str, account: str, conversation: str, thread: str | None = None
) -> SessionKey:
    """Build the session key ``tenant/agent/channel/account/conversation[/thread]``.

    Components are percent-escaped, so a key is always safe inside a Redis hash tag and a file path.
    """
    parts = [tenant, agent, channel, account, conversation] + ([thread] if thread else [])
    return SessionKey("/".join(_component(p) for p in parts))


_M = TypeVar("_M", bound=BaseModel)
_new_object = object.__new__
_set_attribute = object.__setattr__


def trusted(cls: type[_M], /, **values: Any) -> _M:
    """``cls(**values)`` without validating ``values`` again: for a hot path whose values already have the field types.

    Channel adapters build each draft from a wire model that pydantic has just validated; validating those copies
    again costs more than the rest of the draft. Every field must be given, in declaration order (defaults are not
    filled in), values are taken as they are (not copied), and the adapter's tests must show, for every sample
    payload, that validating the result's dump gives an equal model. Only for models without private attributes or
    extra fields (every model of this module).

    Raises:
        TypeError: a field is missing or unknown.
    """
    if values.keys() != cls.__pydantic_fields__.keys():
        raise TypeError(f"{cls.__name__} needs exactly its fields: {', '.join(cls.__pydantic_fields__)}")
    model = _new_object(cls)
    _set_attribute(model, "__dict__", values)
    _set_attribute(model, "__pydantic_fields_set__", set(values))
    _set_attribute(model, "__pydantic_extra__", None)
    _set_attribute(model, "__pydantic_private__", None)
    return model


class ConversationRef(BaseModel):
    """Where a conversation lives on its platform: everything a send action needs to reach it."""

    model_config = ConfigDict(frozen=True)

    tenant: str = "default"
    agent: str = ""
    """The channel account's agent from its configuration: set by adapters given it (``BuildContext``), else by the
    ingest router."""
    channel: ChannelName
    account: str = "default"
    conversation: str
    """Platform conversation id (Telegram chat id, web chat session id, ...)."""
    thread: str | None = None
    """Platform thread id where the platform has threads (Telegram forum topic, Slack thread_ts)."""
    extra: dict[str, str] = Field(default_factory=dict)
    """Channel-specific routing data needed to reply (never secrets)."""

    @property
    def session_key(self) -> SessionKey:
        """The session this conversation maps to."""
        return session_key(self.tenant, self.agent, self.channel, self.account, self.conversation, self.thread)


class Sender(BaseModel):
    """Who wrote the message."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str | None = None
    is_bot: bool = False


class Attachment(BaseModel):
    """A file the user sent, by reference: the channel fetches it lazily (size-capped) when a turn needs it."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["image", "document", "audio", "voice", "video"]
    """``voice`` is a recorded voice note (transcribed when a transcription provider is configured)."""
    ref: str
    """What the channel needs to fetch it later (Telegram ``file_id``, Slack ``url_private``, Meta media id)."""
    name: str | None = None
    """The file name the user's app gave it, if any."""
    mime_type: str | None = None
    size: int | None = None
    """Bytes, when the platform says (checked against the cap before fetching)."""


class Location(BaseModel):
    """A place the user shared: a map pin, or a venue with its name and address."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["location"] = "location"
    latitude: float = Field(ge=-90, le=90)
    """Degrees; a finite value on the globe (NaN or infinity would not survive the queue's JSON)."""
    longitude: float = Field(ge=-180, le=180)
    name: str | None = None
    """The venue's or place's name, when the user shared one (Telegram ``venue.title``, WhatsApp ``name``)."""
    address: str | None = None
    url: str | None = None
    """A link the platform gave with the place (WhatsApp ``location.url``)."""


class Contact(BaseModel):
    """A contact card the user shared (what the platform sends of it; never fetched further)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["contact"] = "contact"
    name: str
    """The card's display name (``(no name)`` when it has none)."""
    phones: tuple[str, ...] = ()
    emails: tuple[str, ...] = ()


SharedPart = Annotated[Location | Contact, Field(discriminator="kind")]
"""Something the user shared that is not text or a file; rendered into what the agent reads by
:func:`switchboard.core.inbound.shared_text` (``match`` + ``assert_never``)."""


class Posted(BaseModel):
    """A new message: ``InboundMessage.text`` plus attachments and shared locations or contacts."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["message"] = "message"
    attachments: tuple[Attachment, ...] = ()
    shared: tuple[SharedPart, ...] = ()
    """Locations and contact cards in the message (a message may hold only these, with an empty text)."""


class CommandIssued(BaseModel):
    """A command (``/stop``, ``/reset``, ``/ask …``; Telegram bot commands, Discord slash commands).

    ``InboundMessage.text`` holds the arguments (what the agent reads for ``/ask``).
    """

    model_config = ConfigDict(frozen=True)

    kind: Literal["command"] = "command"
    name: str
    """Lower case, without the slash or a ``@botname`` suffix."""
    attachments: tuple[Attachment, ...] = ()


class ChoiceSelected(BaseModel):
    """The user clicked one option of an ``OfferChoice`` (button, quick reply, card action).

    ``InboundMessage.text`` holds the option's label where the platform reports it.
    """

    model_config = ConfigDict(frozen=True)

    kind: Literal["choice"] = "choice"
    option_id: str
    """The ``Choice.id`` the option was offered with."""
    offer_message_id: str | None = None
    """The platform id of the message that carried the buttons."""
    ack_ref: str | None = None
    """What ``AckChoice`` needs to acknowledge the click (Telegram ``callback_query.id``); ``None`` when the HTTP
    answer already acknowledged it (Slack, Discord)."""
    offered: bool = False
    """Whether the gateway found ``option_id`` among the options it recently offered in this session (and then
    ``InboundMessage.text`` is the offered label). The drain sets it before every turn, whatever the click carried;
    ``False`` (a forged, stale or foreign click, or one never checked) reads as not offered."""


class MessageEdited(BaseModel):
    """The user edited an earlier message; ``InboundMessage.text`` is its new text."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["edited"] = "edited"
    original_id: str
    """The platform id of the edited message."""


class MessageDeleted(BaseModel):
    """The user deleted an earlier message (recorded; the agent does not answer it)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["deleted"] = "deleted"
    original_id: str


class OperatorActed(BaseModel):
    """What an operator did in the console, or the gateway itself did (an approval expired): never a channel's.

    It rides the session's inbox like any message, so it is ordered with the conversation and applied under the
    session lease by the worker. ``InboundMessage.text`` holds what the operator wrote (``say``), else is empty.
    The ingest router refuses it from channel adapters (:meth:`~switchboard.queue.router.IngestRouter.accept`).
    """

    model_config = ConfigDict(frozen=True)

    kind: Literal["operator"] = "operator"
    action: Literal["say", "take_over", "hand_back", "decide"]
    operator: str
    """``console:<name>`` of the operator, or ``switchboard`` for the gateway's own (an approval's expiry)."""
    approval_id: str | None = None
    """The approval a ``decide`` is about."""
    verdict: Literal["approve", "deny", "expire"] | None = None
    """What a ``decide`` asks for."""


class ExternalEvent(BaseModel):
    """Something that happened outside the chat, posted by an integration (``POST /api/v1/turns``).

    ``InboundMessage.text`` holds the event's payload: the model reads it as untrusted data, never as instructions
    (:func:`switchboard.core.inbound.event_text`). The ingest router refuses it from channel adapters.
    """

    model_config = ConfigDict(frozen=True)

    kind: Literal["external"] = "external"
    name: str
    """What happened, as the integration calls it (``order.shipped``)."""
    source: str
    """The integration's principal (``api:<token name>``)."""


class Scheduled(BaseModel):
    """An occurrence of a scheduled job (:mod:`switchboard.core.schedules`): never a channel's.

    ``InboundMessage.text`` holds the job's text: the prompt of a ``turn`` (the agent runs a turn on it), or the
    message a ``message`` job sends as it is (no model call). Like :class:`OperatorActed`, the ingest router refuses
    it from channel adapters.
    """

    model_config = ConfigDict(frozen=True)

    kind: Literal["scheduled"] = "scheduled"
    job_id: str
    action: Literal["turn", "message"]
    due_at: float
    """Unix time the occurrence was due (with the job id, what makes its dedup key)."""


InboundEvent = Annotated[
    Posted
    | CommandIssued
    | ChoiceSelected
    | MessageEdited
    | MessageDeleted
    | OperatorActed
    | ExternalEvent
    | Scheduled,
    Field(discriminator="kind"),
]
"""What an inbound message is; handled exhaustively (``match`` + ``assert_never``)."""


class InboundMessage(BaseModel):
    """One message from a user, in the shape every later stage understands."""

    model_config = ConfigDict(frozen=True)

    id: str = ""
    """Gateway message id; assigned at ingest (empty in a freshly parsed draft)."""
    dedup_key: str
    """The platform's own event id (Telegram ``update_id``, web ``client_id``, ...), unique per account."""
    conversation: ConversationRef
    sender: Sender
    text: str
    """What the agent reads: the message text, a command's arguments, a chosen option's label, an edit's new text."""
    event: InboundEvent = Field(default_factory=Posted)
    """What kind of inbound event this is, with its structured part."""
    platform_message_id: str | None = None
    """The platform's id of this message, for reply threading."""
    received_at: float = Field(default_factory=time.time)
    """Unix time the gateway accepted it."""
    meta: dict[str, Any] = Field(default_factory=dict)
    """Small channel-specific facts (chat type, mention flags); never secrets."""

    @property
    def session_key(self) -> SessionKey:
        """The session this message belongs to."""
        return self.conversation.session_key
