"""① for Teams: a verified Bot Framework activity → zero or one inbound message draft (:func:`parse_activity`).

Only the fields the gateway reads are parsed (:class:`WireActivity`): the SDK's ``Activity`` validator logs a failed
payload, body included, at ERROR. The conversation id is the session (personal chat, group chat, channel thread),
and the verified ``serviceUrl`` goes into the conversation: replies go there and nowhere else.
"""

from __future__ import annotations

import re
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from switchboard.core.groups import CONTEXT_AT_META, GroupRule
from switchboard.core.messages import (
    Attachment,
    ChoiceSelected,
    ConversationRef,
    InboundMessage,
    MessageDeleted,
    MessageEdited,
    Posted,
)
from switchboard.errors import MalformedBodyError

__all__ = [
    "CHOICE_KEY",
    "TeamsIdentity",
    "WireActivity",
    "parse_activity",
    "read_activity",
]

CHOICE_KEY: Final = "switchboard_choice"
"""The ``Action.Submit`` data field carrying the option id (what :class:`ChoiceSelected.option_id` gets)."""
_CHANNEL: Final = "teams"
_FILE_INFO: Final = "application/vnd.microsoft.teams.file.download.info"
_UNSAFE_ID: Final = re.compile(r"[/\\?#\s]")
_MAX_TEXT: Final = 100_000
_SPACES: Final = re.compile(r"[ \t\u00a0]{2,}")


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class WireAccount(_Wire):
    """``from`` / ``recipient``."""

    id: str = ""
    name: str | None = None
    aad_object_id: str | None = Field(None, alias="aadObjectId")


class WireConversation(_Wire):
    """``conversation``."""

    id: str = Field(min_length=1, max_length=512)
    conversation_type: str | None = Field(None, alias="conversationType")
    tenant_id: str | None = Field(None, alias="tenantId")
    is_group: bool | None = Field(None, alias="isGroup")


class WireAttachment(_Wire):
    """One of ``attachments``."""

    content_type: str = Field("", alias="contentType")
    content_url: str | None = Field(None, alias="contentUrl")
    name: str | None = None
    content: Any = None


class WireActivity(_Wire):
    """The fields of an activity the gateway reads."""

    type: str = Field(min_length=1, max_length=64)
    id: str | None = Field(None, max_length=256)
    timestamp: str | None = None
    service_url: str = Field(alias="serviceUrl", min_length=1, max_length=2048)
    channel_id: str = Field(alias="channelId", min_length=1, max_length=64)
    from_: WireAccount = Field(alias="from", default_factory=WireAccount)
    recipient: WireAccount = Field(default_factory=WireAccount)
    conversation: WireConversation
    text: str | None = Field(None, max_length=_MAX_TEXT)
    attachments: list[WireAttachment] = Field(default_factory=list, max_length=64)
    entities: list[dict[str, Any]] = Field(default_factory=list, max_length=256)
    channel_data: dict[str, Any] | None = Field(None, alias="channelData")
    reply_to_id: str | None = Field(None, alias="replyToId")
    value: Any = None


class TeamsIdentity:
    """Who the bot is in one account, and how it is addressed.

    Args:
        account: The account name.
        require_mention: Group chats and channels reach the agent only when the bot is mentioned (used without
            ``groups``).
        groups: The account's group behaviour (``group_replies``).
        agent: The account's agent, and
        tenant: its tenant (empty agent: the ingest router fills both in).
    """

    def __init__(
        self,
        account: str,
        *,
        require_mention: bool = True,
        groups: GroupRule | None = None,
        agent: str = "",
        tenant: str = "default",
    ) -> None:
        self.account = account
        self.groups = groups if groups is not None else GroupRule(answer="mention" if require_mention else "always")
        self.agent = agent
        self.tenant = tenant


def read_activity(body: bytes) -> WireActivity:
    """Parse the body into the fields the gateway reads.

    Raises:
        MalformedBodyError: not an activity.
    """
    try:
        return WireActivity.model_validate_json(body)
    except ValidationError as err:
        where = ".".join(str(p) for p in err.errors()[0]["loc"]) if err.errors() else "body"
        raise MalformedBodyError(f"not a Bot Framework activity ({where})", channel=_CHANNEL) from None


def _mentions_bot(activity: WireActivity) -> list[str]:
    """The texts of the ``mention`` entities naming the bot (empty: the bot is not mentioned)."""
    bot = activity.recipient.id
    found = []
    for entity in activity.entities:
        mentioned = entity.get("mentioned")
        if entity.get("type") != "mention" or not isinstance(mentioned, dict) or not bot or mentioned.get("id") != bot:
            continue
        text = entity.get("text")
        name = mentioned.get("name")
        found.append(text if isinstance(text, str) and text else f"<at>{name}</at>" if isinstance(name, str) else "")
    return found


def _without_mentions(text: str, mentions: list[str]) -> str:
    for mention in mentions:
        if mention:
            text = text.replace(mention, " ")
    return _SPACES.sub(" ", text).strip()


def _kind(activity: WireActivity) -> str:
    kind = activity.conversation.conversation_type
    if kind in ("personal", "groupChat", "channel"):
        return kind
    return "groupChat" if activity.conversation.is_group else "personal"


def _conversation(identity: TeamsIdentity, activity: WireActivity, kind: str) -> ConversationRef:
    tenant_id = activity.conversation.tenant_id or ""
    if not tenant_id and activity.channel_data is not None:
        found = activity.channel_data.get("tenant")
        tenant_id = str(found.get("id", "")) if isinstance(found, dict) else ""
    extra = {
        "service_url": activity.service_url,
        "conversation_type": kind,
        "bot_id": activity.recipient.id,
        "channel_id": activity.channel_id,
    }
    if tenant_id:
        extra["tenant_id"] = tenant_id[:64]
    return ConversationRef(
        tenant=identity.tenant,
        agent=identity.agent,
        channel=_CHANNEL,
        account=identity.account,
        conversation=activity.conversation.id,
        extra=extra,
    )


def _attachments(activity: WireActivity) -> tuple[Attachment, ...]:
    """Files (Teams' download info) and inline images; the ``text/html`` copy of the message is not one."""
    found = []
    for item in activity.attachments:
        content = item.content if isinstance(item.content, dict) else {}
        if item.content_type == _FILE_INFO and isinstance(content.get("downloadUrl"), str):
            kind = "image" if str(content.get("fileType", "")).lower() in ("png", "jpg", "jpeg", "gif") else "document"
            found.append(Attachment(kind=kind, ref=content["downloadUrl"], name=item.name))
        elif item.content_type.startswith("image/") and item.content_url:
            found.append(Attachment(kind="image", ref=item.content_url, name=item.name, mime_type=item.content_type))
    return tuple(found[:10])


def _base(identity: TeamsIdentity, activity: WireActivity, kind: str) -> dict[str, Any]:
    sender = activity.from_
    return {
        "conversation": _conversation(identity, activity, kind),
        "sender": {"id": sender.aad_object_id or sender.id, "name": sender.name},
        "platform_message_id": activity.id,
        "meta": {"conversation_type": kind},
    }


def parse_activity(identity: TeamsIdentity, activity: WireActivity) -> InboundMessage | None:
    """One verified activity → a draft, or ``None`` when it carries nothing for the agent.

    - ``message``: a user's post (the bot's @mention removed from the text, using the ``mention`` entities that name the
      recipient), or an Adaptive Card ``Action.Submit`` click (``value`` carries the option id the card was built with)
      → :class:`ChoiceSelected`. In group chats and channels a post is answered as ``group_replies`` says (when it
      mentions the bot, or always, or in a free-response conversation); another is kept as context or dropped. Teams
      names no author of the message a reply answers, so a reply is not by itself addressed to the bot. Clicks always
      count (the card was the bot's).
    - ``messageUpdate`` (``channelData.eventType`` ``editMessage``) → :class:`MessageEdited`; ``messageDelete`` →
      :class:`MessageDeleted`.
    - Teams sends a bot no native location or contact share (a shared place or person arrives as text or a card link,
      read as such): nothing becomes a :class:`~switchboard.core.messages.Location` part.
    - Anything else (``conversationUpdate`` when the bot is added or removed, ``installationUpdate``, ``typing``,
      reactions, invokes) carries nothing for the agent: acknowledged, not run.

    Raises:
        MalformedBodyError: a message activity without an id, or with ids that cannot name a Connector path.
    """
    if activity.type not in ("message", "messageUpdate", "messageDelete"):
        return None  # conversationUpdate, installationUpdate, typing, reactions, invokes: acknowledged, not run
    if not activity.id or _UNSAFE_ID.search(activity.id) or _UNSAFE_ID.search(activity.conversation.id):
        raise MalformedBodyError("activity without a usable id or conversation id", channel=_CHANNEL)
    if not activity.from_.id or activity.from_.id == activity.recipient.id:
        return None  # the bot's own activity
    kind = _kind(activity)
    conv = activity.conversation.id
    mentions = _mentions_bot(activity)
    base_conv = conv.split(";messageid=", 1)[0]
    addressed = kind == "personal" or identity.groups.answers(addressed=bool(mentions), conversations=(conv, base_conv))
    if activity.type == "messageDelete":
        return InboundMessage.model_validate(
            {
                **_base(identity, activity, kind),
                "dedup_key": f"delete:{conv}:{activity.id}",
                "text": "",
                "event": MessageDeleted(original_id=activity.id),
            }
        )
    text = _without_mentions(activity.text or "", mentions)
    if activity.type == "messageUpdate":
        event_type = (activity.channel_data or {}).get("eventType", "editMessage")
        if event_type != "editMessage" or not addressed or not text:
            return None  # undeleteMessage; an edit nobody addressed to the bot
        return InboundMessage.model_validate(
            {
                **_base(identity, activity, kind),
                "dedup_key": f"edit:{conv}:{activity.id}:{activity.timestamp or ''}",
                "text": text,
                "event": MessageEdited(original_id=activity.id),
            }
        )
    if isinstance(activity.value, dict) and isinstance(activity.value.get(CHOICE_KEY), str):
        option = activity.value[CHOICE_KEY][:64]
        if not option:
            return None
        label = activity.value.get("label")
        return InboundMessage.model_validate(
            {
                **_base(identity, activity, kind),
                "dedup_key": f"{conv}:{activity.id}",
                "text": label if isinstance(label, str) else option,
                "event": ChoiceSelected(option_id=option, offer_message_id=activity.reply_to_id),
            }
        )
    keep = not addressed
    if keep and identity.groups.keep is None:
        return None
    attachments = () if keep else _attachments(activity)  # kept context is words only
    if not text and not attachments:
        return None
    meta: dict[str, Any] = {"conversation_type": kind, "mentioned": bool(mentions)}
    if identity.groups.keep is not None and kind != "personal":
        meta.update(identity.groups.marks(kept=keep))
        if conv.endswith(f";messageid={activity.id}"):  # a channel post opening its thread: the channel's chatter
            meta[CONTEXT_AT_META] = [base_conv, None]
    return InboundMessage.model_validate(
        {
            **_base(identity, activity, kind),
            "dedup_key": f"{conv}:{activity.id}",
            "text": text,
            "event": Posted(attachments=attachments),
            "meta": meta,
        }
    )
