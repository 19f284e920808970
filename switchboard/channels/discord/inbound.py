"""Discord's inbound payloads, interactions and gateway dispatches, as normalised inbound messages.

Direct messages always reach the agent; guild channels and threads as the account's ``group_replies`` say (when the bot,
or its managed role, is mentioned or the bot is replied to, or always; the others kept as context or ignored, see
:mod:`switchboard.core.groups`); never the bot itself, other bots or webhooks (no bot-to-bot loops). A thread is its
own session, and the snowflakes are the dedup keys. Verifying requests and speaking the gateway protocol happen
elsewhere.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from switchboard.core.groups import GroupRule
from switchboard.core.messages import (
    Attachment,
    ChoiceSelected,
    CommandIssued,
    ConversationRef,
    InboundEvent,
    InboundMessage,
    MessageDeleted,
    MessageEdited,
    Posted,
    Sender,
)
from switchboard.errors import MalformedBodyError

__all__ = [
    "INTERACTION_TTL_S",
    "DiscordInbound",
    "Interaction",
    "load_interaction",
    "parse_interaction",
]

CHANNEL: Literal["discord"] = "discord"
INTERACTION_TTL_S = 15 * 60
"""An interaction token answers follow-ups for 15 minutes after the interaction."""
_THREAD_TYPES = {10, 11, 12}
"""Announcement, public and private threads."""
_USER_MESSAGE_TYPES = {0, 19}
"""``DEFAULT`` and ``REPLY``: everything else is a system message (joins, pins, boosts)."""
_REMEMBER = 4096
"""Messages addressed to the bot remembered per listener (to report their edits and deletions)."""


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class _User(_Wire):
    id: str
    username: str = ""
    global_name: str | None = None
    bot: bool = False


class _Member(_Wire):
    user: _User | None = None
    nick: str | None = None


class _File(_Wire):
    id: str
    url: str
    filename: str = "file"
    content_type: str | None = None
    size: int | None = Field(None, ge=0)


class _Ref(_Wire):
    author: _User | None = None


class _Message(_Wire):
    id: str
    channel_id: str
    guild_id: str | None = None
    author: _User | None = None
    member: _Member | None = None
    webhook_id: str | None = None
    type: int = 0
    content: str = ""
    mentions: list[_User] = Field(default_factory=list)
    mention_roles: list[str] = Field(default_factory=list)
    attachments: list[_File] = Field(default_factory=list)
    referenced_message: _Ref | None = None
    edited_timestamp: str | None = None


class _Channel(_Wire):
    id: str
    type: int = 0
    parent_id: str | None = None


class _Option(_Wire):
    name: str
    type: int = 3
    value: Any = None
    options: list[_Option] = Field(default_factory=list)


class _Resolved(_Wire):
    users: dict[str, _User] = Field(default_factory=dict)
    members: dict[str, _Member] = Field(default_factory=dict)
    messages: dict[str, _Message] = Field(default_factory=dict)


class _Data(_Wire):
    name: str | None = None
    custom_id: str | None = None
    component_type: int | None = None
    values: list[str] = Field(default_factory=list)
    """What a select menu's user picked (option values)."""
    options: list[_Option] = Field(default_factory=list)
    type: int = 1
    """An application command's type: 1 slash (``CHAT_INPUT``), 2 ``USER`` and 3 ``MESSAGE`` context menus."""
    target_id: str | None = None
    """The user or message a context-menu command was used on (its object is in ``resolved``)."""
    resolved: _Resolved | None = None


class _SelectOption(_Wire):
    label: str = ""
    value: str = ""


class _Component(_Wire):
    type: int = 0
    custom_id: str | None = None
    label: str | None = None
    options: list[_SelectOption] = Field(default_factory=list)
    """A string select menu's options."""
    components: list[_Component] = Field(default_factory=list)


class _OfferMessage(_Wire):
    id: str
    components: list[_Component] = Field(default_factory=list)


class Interaction(_Wire):
    """The fields of an interaction that Switchboard reads."""

    id: str
    application_id: str
    type: int
    token: str = ""
    channel_id: str | None = None
    channel: _Channel | None = None
    guild_id: str | None = None
    member: _Member | None = None
    user: _User | None = None
    data: _Data | None = None
    message: _OfferMessage | None = None


_Option.model_rebuild()
_Component.model_rebuild()


def _name(user: _User, member: _Member | None = None) -> str | None:
    return (member.nick if member else None) or user.global_name or user.username or None


def _options_text(options: list[_Option]) -> str:
    """A command's arguments as the agent reads them: string values in order, nested subcommands flattened."""
    words: list[str] = []
    for option in options:
        if option.options:
            words.append(_options_text(option.options))
        elif option.value is not None:
            words.append(str(option.value))
    return " ".join(w for w in words if w)


def _files(message: _Message) -> tuple[Attachment, ...]:
    return tuple(
        Attachment(kind=_kind(f.content_type), ref=f.url, name=f.filename, mime_type=f.content_type, size=f.size)
        for f in message.attachments
    )


def _target(data: _Data) -> tuple[str, tuple[Attachment, ...]]:
    """What a context-menu command was used on, as the agent reads it, and the target message's files."""
    target, resolved = data.target_id or "", data.resolved or _Resolved()
    if data.type == 2:
        user = resolved.users.get(target)
        if user is None:
            return f"[target user: id {target}]", ()
        name = _name(user, resolved.members.get(target)) or user.id
        handle = f"@{user.username}, " if user.username else ""
        return f"[target user: {name} ({handle}id {user.id})]", ()
    message = resolved.messages.get(target)
    if message is None:
        return f"[target message {target}]", ()
    author = f" by {_name(message.author) or message.author.id} (id {message.author.id})" if message.author else ""
    content = f": {message.content}" if message.content else ""
    return f"[target message {message.id}{author}{content}]", _files(message)


_BUTTON, _STRING_SELECT = 2, 3
"""Component types that answer an offer; the other selects (users, roles, channels) pick Discord ids instead."""


def _find(components: list[_Component], custom_id: str) -> _Component | None:
    for component in components:
        if component.custom_id == custom_id:
            return component
        found = _find(component.components, custom_id)
        if found is not None:
            return found
    return None


def _picked(data: _Data, offer: _OfferMessage | None) -> tuple[str, str | None] | None:
    """``(option id, label)`` of a button click or a string select pick; ``None`` for other components.

    Raises:
        MalformedBodyError: no ``custom_id``.
    """
    if not data.custom_id:
        raise MalformedBodyError("component interaction without a custom_id", channel=CHANNEL)
    component = _find(offer.components, data.custom_id) if offer else None
    if data.component_type in (None, _BUTTON):
        return data.custom_id, component.label if component else None
    if data.component_type != _STRING_SELECT or not data.values or not data.values[0]:
        return None
    value = data.values[0]
    labels = [o.label for o in component.options if o.value == value] if component else []
    return value, labels[0] if labels and labels[0] else None


def _conversation(account: str, channel_id: str, parent: str | None, extra: dict[str, str]) -> ConversationRef:
    """The channel is the conversation; a thread is a session of its own under its parent channel."""
    extra = {"channel_id": channel_id, **extra}
    if parent:
        return ConversationRef(channel=CHANNEL, account=account, conversation=parent, thread=channel_id, extra=extra)
    return ConversationRef(channel=CHANNEL, account=account, conversation=channel_id, extra=extra)


def load_interaction(body: bytes | dict[str, Any]) -> Interaction:
    """The interaction in a request body (or a gateway ``INTERACTION_CREATE``).

    Raises:
        MalformedBodyError: not an interaction.
    """
    try:
        if isinstance(body, dict):
            return Interaction.model_validate(body)
        return Interaction.model_validate_json(body)
    except ValidationError as err:
        first = err.errors()[0]
        if first["type"] == "json_invalid":
            raise MalformedBodyError("body is not JSON", channel=CHANNEL) from None
        where = ".".join(str(p) for p in first["loc"])[:200] or "body"
        raise MalformedBodyError(f"not a Discord interaction: {where}: {first['msg']}", channel=CHANNEL) from None


def parse_interaction(wire: Interaction, account: str, *, now: float | None = None) -> InboundMessage | None:
    """A slash command, a button click or a string select pick as a draft; ``None`` for what the agent does not see.

    Not seen: PING, user/role/channel pickers (no offer has them), other interaction types.

    Raises:
        MalformedBodyError: the interaction lacks the user, channel or data Discord always sends with it.
    """
    if wire.type not in (2, 3):
        return None
    user = wire.member.user if wire.member and wire.member.user else wire.user
    channel_id = wire.channel.id if wire.channel else wire.channel_id
    if user is None or channel_id is None or wire.data is None:
        raise MalformedBodyError("interaction without a user, channel or data", channel=CHANNEL)
    if user.bot:
        return None
    parent = wire.channel.parent_id if wire.channel and wire.channel.type in _THREAD_TYPES else None
    issued = time.time() if now is None else now
    extra = {
        "interaction_token": wire.token,
        "interaction_expires": str(int(issued + INTERACTION_TTL_S)),
        "application_id": wire.application_id,
    }
    event: InboundEvent
    meta = {"guild_id": wire.guild_id or "", "interaction": "command" if wire.type == 2 else "component"}
    if wire.type == 2:
        name = (wire.data.name or "").lower()
        if not name:
            raise MalformedBodyError("application command without a name", channel=CHANNEL)
        if wire.data.type in (2, 3):  # a context-menu command: its target is what it is about
            if not wire.data.target_id:
                raise MalformedBodyError("context-menu command without a target_id", channel=CHANNEL)
            text, files = _target(wire.data)
            event, meta["target_id"] = CommandIssued(name=name, attachments=files), wire.data.target_id
        else:
            event, text = CommandIssued(name=name), _options_text(wire.data.options)
    else:
        offer = wire.message
        picked = _picked(wire.data, offer)
        if picked is None:
            return None  # a user, role or channel picker: acknowledged, nothing the agent offered
        option, label = picked
        event = ChoiceSelected(option_id=option, offer_message_id=offer.id if offer else None)
        text = label or option
    return InboundMessage(
        dedup_key=f"i:{wire.id}",
        conversation=_conversation(account, channel_id, parent, extra),
        sender=Sender(id=user.id, name=_name(user, wire.member)),
        text=text,
        event=event,
        meta=meta,
    )


class DiscordInbound:
    """Gateway dispatches → drafts, for one bot account; remembers threads and the messages it accepted.

    Args:
        account: The account name.
        bot_id: The bot's user id (from its token; confirmed by ``READY``).
        require_mention: Guild messages count only when they address the bot (used without ``groups``).
        groups: The account's group behaviour (``group_replies``).
    """

    def __init__(
        self, account: str, bot_id: str | None, *, require_mention: bool = True, groups: GroupRule | None = None
    ) -> None:
        self.account = account
        self.bot_id = bot_id
        self.groups = groups if groups is not None else GroupRule(answer="mention" if require_mention else "always")
        self._roles: set[str] = set()
        """The bot's managed roles (one per guild): mentioning one mentions the bot."""
        self._threads: OrderedDict[str, str] = OrderedDict()
        self._accepted: OrderedDict[str, tuple[str, str | None]] = OrderedDict()
        """Message id → (author id, author name) of messages that reached the agent."""

    def _remember(self, store: OrderedDict[str, Any], key: str, value: Any) -> None:
        store[key] = value
        store.move_to_end(key)
        while len(store) > _REMEMBER:
            store.popitem(last=False)

    def dispatch(self, event: str, data: dict[str, Any]) -> InboundMessage | None:
        """One gateway dispatch (``t``, ``d``); ``None`` when it is not for the agent.

        Raises:
            MalformedBodyError: the event lacks fields Discord always sends.
        """
        try:
            match event:
                case "READY":
                    self.bot_id = str(data["user"]["id"])
                case "GUILD_CREATE":
                    for thread in data.get("threads") or ():
                        self._thread(thread)
                    for role in data.get("roles") or ():
                        self._role(role)
                case "GUILD_ROLE_CREATE" | "GUILD_ROLE_UPDATE":
                    self._role(data.get("role") or {})
                case "THREAD_CREATE" | "THREAD_UPDATE":
                    self._thread(data)
                case "THREAD_LIST_SYNC":
                    for thread in data.get("threads") or ():
                        self._thread(thread)
                case "MESSAGE_CREATE":
                    return self._created(_Message.model_validate(data))
                case "MESSAGE_UPDATE":
                    return self._edited(_Message.model_validate(data))
                case "MESSAGE_DELETE":
                    return self._deleted(str(data["id"]), str(data["channel_id"]), data.get("guild_id"))
        except (ValidationError, KeyError, TypeError, AttributeError) as exc:  # AttributeError: ``d`` not an object
            raise MalformedBodyError(f"malformed {event} dispatch ({type(exc).__name__})", channel=CHANNEL) from None
        return None

    def _thread(self, data: dict[str, Any]) -> None:
        if data.get("type") in _THREAD_TYPES and data.get("parent_id"):
            self._remember(self._threads, str(data["id"]), str(data["parent_id"]))

    def _role(self, role: dict[str, Any]) -> None:
        tags = role.get("tags")
        if isinstance(tags, dict) and self.bot_id is not None and str(tags.get("bot_id")) == self.bot_id:
            self._roles.add(str(role.get("id")))

    def _addressed(self, message: _Message) -> tuple[bool, str]:
        """Whether the message is answered, and its text with the bot's (and its role's) mention removed."""
        text = message.content
        bot = self.bot_id
        mentioned = replied = False
        if bot is not None:
            mention = re.compile(rf"<@!?{re.escape(bot)}>[,:;]?\s*")
            mentioned = any(u.id == bot for u in message.mentions) or mention.search(text) is not None
            text = mention.sub("", text)
            roles = self._roles.intersection(message.mention_roles)
            for role in roles:
                mentioned = True
                text = re.sub(rf"<@&{re.escape(role)}>[,:;]?\s*", "", text)
            referenced = message.referenced_message.author if message.referenced_message else None
            replied = referenced is not None and referenced.id == bot
        if message.guild_id is None:
            return True, text.strip()
        where = (message.channel_id, self._threads.get(message.channel_id))
        return self.groups.answers(addressed=mentioned or replied, conversations=where), text.strip()

    def _from_user(self, message: _Message) -> _User | None:
        author = message.author
        if author is None or author.bot or message.webhook_id is not None or author.id == self.bot_id:
            return None
        return author

    def _draft(
        self, message: _Message, author: _User, text: str, key: str, event: InboundEvent, *, keep: bool = False
    ) -> InboundMessage:
        parent = self._threads.get(message.channel_id)
        meta: dict[str, Any] = {"guild_id": message.guild_id or "", "dm": message.guild_id is None}
        if self.groups.keep is not None and message.guild_id is not None:
            meta.update(self.groups.marks(kept=keep))
        return InboundMessage(
            dedup_key=key,
            conversation=_conversation(self.account, message.channel_id, parent, {"reply_to": message.id}),
            sender=Sender(id=author.id, name=_name(author, message.member)),
            text=text,
            event=event,
            platform_message_id=message.id,
            meta=meta,
        )

    def _created(self, message: _Message) -> InboundMessage | None:
        author = self._from_user(message)
        if author is None or message.type not in _USER_MESSAGE_TYPES:
            return None
        addressed, text = self._addressed(message)
        if not addressed:
            if self.groups.keep is None or not text:
                return None
            return self._draft(message, author, text, f"m:{message.id}", Posted(), keep=True)
        files = _files(message)
        if not (text or files):
            return None
        self._remember(self._accepted, message.id, (author.id, _name(author, message.member)))
        return self._draft(message, author, text, f"m:{message.id}", Posted(attachments=files))

    def _edited(self, message: _Message) -> InboundMessage | None:
        author = self._from_user(message)
        if author is None or message.edited_timestamp is None or "content" not in message.model_fields_set:
            return None  # an embed unfurling or a pin, not a change of words
        addressed, text = self._addressed(message)
        if not (addressed or message.id in self._accepted) or not text:
            return None
        key = f"e:{message.id}:{message.edited_timestamp}"
        return self._draft(message, author, text, key, MessageEdited(original_id=message.id))

    def _deleted(self, message_id: str, channel_id: str, guild_id: str | None) -> InboundMessage | None:
        known = self._accepted.pop(message_id, None)
        if known is None and guild_id is not None:
            return None  # a guild message the agent never saw
        author_id, name = known or ("unknown", None)
        stub = _Message(id=message_id, channel_id=channel_id, guild_id=guild_id)
        return self._draft(
            stub, _User(id=author_id, global_name=name), "", f"d:{message_id}", MessageDeleted(original_id=message_id)
        )


def _kind(content_type: str | None) -> Literal["image", "document", "audio", "voice", "video"]:
    major = (content_type or "").split("/", 1)[0]
    if major == "image":
        return "image"
    if major == "video":
        return "video"
    if major == "audio":
        return "voice" if (content_type or "").startswith("audio/ogg") else "audio"
    return "document"
