"""Slack payloads → inbound events: Events API callbacks and interactivity, from HTTP or Socket Mode alike.

Direct messages always reach the agent; elsewhere messages as the account's ``group_replies`` say (those that mention
the bot or reply in a thread the bot started, or every one; the others kept as context or ignored, see
:mod:`switchboard.core.groups`); the bot's own and other bots' messages are dropped. A channel conversation keeps to its
thread (a top-level post opens one, and reads the channel's kept context). A new message is deduplicated on its
``ts``, which covers both Slack's retries and the second event it sends when the app subscribes to ``app_mention`` and
``message.channels``; retries are never dropped as such, the ingest's dedup record answers them.
"""

from __future__ import annotations

import functools
import re
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from switchboard.channels.render.slack import slack_text_to_plain
from switchboard.core.groups import CONTEXT_AT_META, GroupRule
from switchboard.core.messages import (
    Attachment,
    ChoiceSelected,
    CommandIssued,
    ConversationRef,
    InboundMessage,
    MessageDeleted,
    MessageEdited,
    Posted,
    Sender,
    trusted,
)
from switchboard.errors import MalformedBodyError

__all__ = ["SlackIdentity", "WireCommand", "parse_command", "parse_event_callback", "parse_interaction", "wire_error"]

_CHANNEL: Literal["slack"] = "slack"
_POSTED_SUBTYPES = frozenset({"file_share", "thread_broadcast", "me_message"})
_POSTED = Posted()


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class WireFile(_Wire):
    """One entry of a message's ``files``."""

    id: str = ""
    name: str | None = None
    mimetype: str | None = None
    size: int | None = Field(None, ge=0)
    url_private: str | None = None
    url_private_download: str | None = None
    subtype: str | None = None


class WireMessage(_Wire):
    """A message event, or the message inside ``message_changed``/``message_deleted``."""

    type: str = "message"
    subtype: str | None = None
    channel: str | None = None
    channel_type: str | None = None
    user: str | None = None
    bot_id: str | None = None
    text: str | None = None
    ts: str | None = None
    thread_ts: str | None = None
    parent_user_id: str | None = None
    """In a thread reply: who wrote the thread's first message."""
    user_team: str | None = Field(None, max_length=64)
    """The author's own workspace (another organisation's in a Slack Connect channel)."""
    deleted_ts: str | None = None
    files: list[WireFile] | None = None
    message: WireMessage | None = None
    previous_message: WireMessage | None = None


class WireAuthorization(_Wire):
    user_id: str | None = None
    is_bot: bool = False


class WireCallback(_Wire):
    """The outer Events API body (``event_callback``, ``url_verification``, ``app_rate_limited``)."""

    type: str
    team_id: str | None = None
    event_id: str | None = None
    challenge: str | None = None
    event: WireMessage | None = None
    authorizations: list[WireAuthorization] | None = None


class _WireText(_Wire):
    text: str = ""


class _WireOption(_Wire):
    text: _WireText | None = None
    value: str | None = None


class _WireAction(_Wire):
    type: str = ""
    action_id: str = ""
    block_id: str | None = None
    value: str | None = None
    text: _WireText | None = None
    selected_option: _WireOption | None = None
    """What a ``static_select``, ``radio_buttons`` or ``overflow`` element's user picked."""
    action_ts: str | None = None


_PICKERS = frozenset({"static_select", "radio_buttons", "overflow"})
"""Elements whose one ``selected_option`` answers an offer (besides buttons); checkboxes and multi-selects pick
several, user/channel/conversation pickers pick Slack ids: acknowledged, not run."""


def _picked(action: _WireAction) -> tuple[str, str] | None:
    """``(option id, label)`` of a button click or a one-option pick, else ``None``."""
    if action.type == "button":
        option = action.value or action.action_id
        return (option, action.text.text if action.text and action.text.text else option) if option else None
    chosen = action.selected_option if action.type in _PICKERS else None
    if chosen is None or not chosen.value:
        return None
    return chosen.value, chosen.text.text if chosen.text and chosen.text.text else chosen.value


class _WireId(_Wire):
    id: str
    name: str | None = None
    username: str | None = None
    team_id: str | None = Field(None, max_length=64)
    """A user's own workspace."""


class _WireContainer(_Wire):
    message_ts: str | None = None
    thread_ts: str | None = None
    channel_id: str | None = None


class WireInteraction(_Wire):
    """An interactivity payload (``block_actions`` is the one handled)."""

    type: str
    user: _WireId | None = None
    team: _WireId | None = None
    channel: _WireId | None = None
    container: _WireContainer | None = None
    message: WireMessage | None = None
    trigger_id: str | None = None
    actions: list[_WireAction] = Field(default_factory=list)


class WireCommand(_Wire):
    """A slash command's form fields (over HTTP) or a Socket Mode ``slash_commands`` payload.

    ``token`` (the legacy verification token) and ``response_url`` are not read: the signature authenticates the
    request and the answer goes through ``chat.postMessage``, so neither capability is ever stored.
    """

    command: str = Field(min_length=2, max_length=64, pattern=r"^/\S+$")
    """``/name`` as configured in the app."""
    text: str = Field("", max_length=40_000)
    user_id: str = Field(min_length=1, max_length=64)
    channel_id: str = Field(min_length=1, max_length=64)
    team_id: str | None = Field(None, max_length=64)
    trigger_id: str = Field(min_length=1, max_length=200)
    """Unique per invocation: the command's dedup key."""


WireMessage.model_rebuild()


def wire_error(err: ValidationError, what: str) -> MalformedBodyError:
    """A 400 naming the first field that did not fit."""
    first = err.errors()[0]
    if first["type"] == "json_invalid":
        return MalformedBodyError("body is not JSON", channel=_CHANNEL)
    where = ".".join(str(p) for p in first["loc"])[:200] or "body"
    return MalformedBodyError(f"not a Slack {what}: {where}: {first['msg']}", channel=_CHANNEL)


class SlackIdentity:
    """Who the bot is, for dropping its own messages and noticing mentions; filled from ``auth.test``."""

    def __init__(
        self,
        account: str,
        bot_user_id: str | None = None,
        bot_id: str | None = None,
        *,
        require_mention: bool = True,
        groups: GroupRule | None = None,
        agent: str = "",
        tenant: str = "default",
    ) -> None:
        self.account = account
        self.agent = agent
        """The agent the account routes to (``BuildContext``): drafts are built routed (empty: the router fills it)."""
        self.tenant = tenant
        self.groups = groups if groups is not None else GroupRule(answer="mention" if require_mention else "always")
        """The account's group behaviour (``group_replies``; without it, from ``require_mention``)."""
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self._mention: tuple[str, re.Pattern[str]] | None = None

    def learn(self, callback: WireCallback) -> None:
        """Take the bot user id from the payload's ``authorizations`` when ``auth.test`` has not given it."""
        if self.bot_user_id is None:
            for auth in callback.authorizations or ():
                if auth.is_bot and auth.user_id:
                    self.bot_user_id = auth.user_id
                    break

    def mention(self) -> re.Pattern[str] | None:
        """``<@BOT>`` (with an optional ``|name``) and the punctuation and space after it."""
        if self.bot_user_id is None:
            return None
        if self._mention is None or self._mention[0] != self.bot_user_id:
            pattern = re.compile(rf"<@{re.escape(self.bot_user_id)}(?:\|[^>]*)?>[,:;]?\s*")
            self._mention = (self.bot_user_id, pattern)
        return self._mention[1]

    def is_own(self, message: WireMessage) -> bool:
        """Written by this bot."""
        return (self.bot_id is not None and message.bot_id == self.bot_id) or (
            self.bot_user_id is not None and message.user == self.bot_user_id
        )


def _conversation(
    identity: SlackIdentity,
    team: str | None,
    channel: str,
    channel_type: str,
    thread: str | None,
    user: str,
    user_team: str | None = None,
) -> dict[str, Any]:
    """A :class:`ConversationRef`'s fields (validated with the message, in one pass).

    ``user_team`` is the author's own workspace when the payload names it: in a Slack Connect channel it is another
    organisation's, and access control's ``slack:team:`` entries judge the author by it, not by the host ``team``.
    """
    extra = {"channel": channel, "channel_type": channel_type, "user": user}
    if team:
        extra["team"] = team
    if user_team and user_team != team:
        extra["user_team"] = user_team
    if thread:
        extra["thread_ts"] = thread
    return {  # in declaration order (the hot path builds the model from it as it is: ``trusted``)
        "tenant": identity.tenant,
        "agent": identity.agent,
        "channel": _CHANNEL,
        "account": identity.account,
        "conversation": channel,
        "thread": thread,
        "extra": extra,
    }


@functools.lru_cache(maxsize=4096)
def _sender(user: str) -> Sender:
    """A user's sender (frozen, so one is shared by their messages: the draft takes it without validating it again)."""
    return Sender(id=user)


def _kind(file: WireFile) -> Literal["image", "document", "audio", "voice", "video"]:
    mime = (file.mimetype or "").lower()
    if file.subtype == "slack_audio":
        return "voice"
    for prefix in ("image", "audio", "video"):
        if mime.startswith(prefix + "/"):
            return prefix
    return "document"


def _attachments(message: WireMessage) -> tuple[Attachment, ...]:
    found = []
    for file in message.files or ():
        ref = file.url_private_download or file.url_private
        if ref:
            found.append(Attachment(kind=_kind(file), ref=ref, name=file.name, mime_type=file.mimetype, size=file.size))
    return tuple(found)


def _thread_of(message: WireMessage, channel_type: str) -> str | None:
    return message.thread_ts or (None if channel_type == "im" else message.ts)


def _addressed(
    identity: SlackIdentity, message: WireMessage, channel_type: str, app_mention: bool, channel: str | None = None
) -> bool:
    """Whether the message is answered: a DM, a mention, a reply in a thread the bot started, or free response."""
    if channel_type == "im" or app_mention:
        return True
    pattern = identity.mention()
    mentioned = pattern is not None and bool(pattern.search(message.text or ""))
    replied = message.parent_user_id is not None and message.parent_user_id == identity.bot_user_id
    return identity.groups.answers(addressed=mentioned or replied, conversations=(channel or message.channel,))


def _group_meta(
    identity: SlackIdentity, event: WireMessage, channel: str, channel_type: str, *, keep: bool
) -> dict[str, Any]:
    """The draft's group-context marks: kept only, or answered in a session that may hold kept context."""
    if identity.groups.keep is None or channel_type == "im":
        return {}
    meta = identity.groups.marks(kept=keep)
    if event.thread_ts is None:  # a top-level post opens its own thread: the chatter before it is the channel's
        meta[CONTEXT_AT_META] = [channel, None]
    return meta


def _read(identity: SlackIdentity, text: str | None) -> str:
    pattern = identity.mention()
    raw = pattern.sub("", text or "") if pattern is not None else (text or "")
    return slack_text_to_plain(raw).strip()


def parse_event_callback(identity: SlackIdentity, callback: WireCallback) -> InboundMessage | None:
    """One ``event_callback`` → zero or one message draft."""
    event = callback.event
    if event is None or event.type not in ("message", "app_mention") or not event.channel:
        return None
    channel = event.channel
    channel_type = event.channel_type or ("im" if channel.startswith("D") else "channel")
    team = callback.team_id
    if event.subtype == "message_changed":
        return _edited(identity, callback, event, channel, channel_type)
    if event.subtype == "message_deleted":
        return _deleted(identity, callback, event, channel, channel_type)
    if event.subtype is not None and event.subtype not in _POSTED_SUBTYPES:
        return None  # bot_message, channel_join, …
    if identity.is_own(event) or event.bot_id or not event.user or not event.ts:
        return None
    keep = not _addressed(identity, event, channel_type, event.type == "app_mention", channel)
    if keep and identity.groups.keep is None:
        return None
    text, attachments = _read(identity, event.text), _attachments(event)
    if keep:
        attachments = ()  # kept context is words only
    if not text and not attachments:
        return None
    thread = _thread_of(event, channel_type)
    conversation = _conversation(identity, team, channel, channel_type, thread, event.user, event.user_team)
    # Every value below is a str/None from the validated wire model (or an event model): the draft is built without
    # validating it again (tests/channels/test_fast_drafts.py checks it against validation).
    return trusted(
        InboundMessage,
        id="",
        dedup_key=f"ts:{channel}:{event.ts}",
        conversation=trusted(ConversationRef, **conversation),
        sender=_sender(event.user),
        text=text,
        event=Posted(attachments=attachments) if attachments else _POSTED,
        platform_message_id=event.ts,
        received_at=time.time(),
        meta={
            "channel_type": channel_type,
            "event_id": callback.event_id or "",
            **_group_meta(identity, event, channel, channel_type, keep=keep),
        },
    )


def _edited(
    identity: SlackIdentity, callback: WireCallback, event: WireMessage, channel: str, channel_type: str
) -> InboundMessage | None:
    new = event.message
    if new is None or not new.user or not new.ts or identity.is_own(new) or new.bot_id:
        return None
    if not (_addressed(identity, new, channel_type, False, channel)):
        return None
    text = _read(identity, new.text)
    if not text or (event.previous_message is not None and _read(identity, event.previous_message.text) == text):
        return None  # an unfurl or a reaction changed the message, not its words
    thread = _thread_of(new, channel_type)
    return InboundMessage.model_validate(
        {
            "dedup_key": f"edit:{callback.event_id or event.ts}",
            "conversation": _conversation(
                identity, callback.team_id, channel, channel_type, thread, new.user, new.user_team
            ),
            "sender": {"id": new.user},
            "text": text,
            "event": MessageEdited(original_id=new.ts),
            "platform_message_id": new.ts,
            "meta": {"channel_type": channel_type},
        }
    )


def _deleted(
    identity: SlackIdentity, callback: WireCallback, event: WireMessage, channel: str, channel_type: str
) -> InboundMessage | None:
    old = event.previous_message
    deleted = event.deleted_ts or (old.ts if old else None)
    if old is None or not old.user or not deleted or identity.is_own(old) or old.bot_id:
        return None
    if not _addressed(identity, old, channel_type, False, channel):
        return None
    thread = old.thread_ts or (None if channel_type == "im" else deleted)
    return InboundMessage.model_validate(
        {
            "dedup_key": f"del:{callback.event_id or deleted}",
            "conversation": _conversation(
                identity, callback.team_id, channel, channel_type, thread, old.user, old.user_team
            ),
            "sender": {"id": old.user},
            "text": "",
            "event": MessageDeleted(original_id=deleted),
            "platform_message_id": deleted,
            "meta": {"channel_type": channel_type},
        }
    )


def parse_interaction(identity: SlackIdentity, payload: WireInteraction) -> InboundMessage | None:
    """A ``block_actions`` button click or one-option pick → a :class:`ChoiceSelected` draft.

    Picks come from ``static_select``, ``radio_buttons`` and ``overflow`` elements (``selected_option.value``).
    Every interaction is acknowledged by the HTTP 200, also those that carry nothing for the agent.
    """
    if payload.type != "block_actions" or payload.user is None or not payload.actions:
        return None
    action = payload.actions[0]
    picked = _picked(action)
    channel = (payload.channel.id if payload.channel else None) or (
        payload.container.channel_id if payload.container else None
    )
    if picked is None or not channel:
        return None
    option, label = picked
    message = payload.message
    offer_ts = (payload.container.message_ts if payload.container else None) or (message.ts if message else None)
    channel_type = "im" if channel.startswith("D") else "channel"
    thread = (message.thread_ts if message else None) or (payload.container.thread_ts if payload.container else None)
    if thread is None and channel_type != "im":
        thread = offer_ts
    team = payload.team.id if payload.team else None
    return InboundMessage.model_validate(
        {
            "dedup_key": f"act:{action.action_ts or payload.trigger_id or offer_ts}:{payload.user.id}",
            "conversation": _conversation(
                identity, team, channel, channel_type, thread, payload.user.id, payload.user.team_id
            ),
            "sender": Sender(id=payload.user.id, name=payload.user.username or payload.user.name),
            "text": label,
            "event": ChoiceSelected(option_id=option, offer_message_id=offer_ts, ack_ref=None),
            "platform_message_id": offer_ts,
            "meta": {"channel_type": channel_type},
        }
    )


def parse_command(identity: SlackIdentity, command: WireCommand) -> InboundMessage:
    """A slash command → a :class:`CommandIssued` draft in the channel it was typed in (no thread: Slack sends none).

    The arguments are what the agent reads; a command is addressed to the bot by itself, so no mention is needed.
    """
    channel = command.channel_id
    channel_type = "im" if channel.startswith("D") else "channel"
    return InboundMessage.model_validate(
        {
            "dedup_key": f"cmd:{command.trigger_id}",
            "conversation": _conversation(identity, command.team_id, channel, channel_type, None, command.user_id),
            "sender": _sender(command.user_id),
            "text": slack_text_to_plain(command.text).strip(),
            "event": CommandIssued(name=command.command[1:].lower()),
            "meta": {"channel_type": channel_type, "interaction": "command"},
        }
    )


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else a 400."""
    if not isinstance(value, dict):
        raise MalformedBodyError("payload must be a JSON object", channel=_CHANNEL)
    return value
