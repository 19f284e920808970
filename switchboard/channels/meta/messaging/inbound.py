"""Messenger Platform webhooks (Facebook Messenger and Instagram) → inbound events, receipts set apart.

Both channels speak the same format; each ``messaging[]`` item becomes a message, an edit, a deletion, a choice or a
delivery report, and anything else parses to nothing (the delivery is still acknowledged, so Meta does not retry it
for ever). Each message names the account its ``entry[].id`` maps to, and carries a dedup key unique per account:
Meta delivers at least once.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from switchboard.channels.base import DeliveryStatus
from switchboard.core.messages import (
    Attachment,
    ChoiceSelected,
    ConversationRef,
    InboundEvent,
    InboundMessage,
    Location,
    MessageDeleted,
    MessageEdited,
    Posted,
    Sender,
    trusted,
)
from switchboard.errors import MalformedBodyError

__all__ = [
    "MAX_PAYLOAD",
    "MessagingChannel",
    "MessagingReader",
    "Parsed",
    "WireDelivery",
    "wire_error",
]

MessagingChannel = Literal["messenger", "instagram"]
MAX_PAYLOAD = 1000
"""Meta's limit for a quick reply's or a postback button's ``payload`` (longer ones are cut, never trusted)."""
_OBJECT: dict[MessagingChannel, str] = {"messenger": "page", "instagram": "instagram"}
_KINDS: dict[str, Literal["image", "document", "audio", "video"]] = {
    "image": "image",
    "video": "video",
    "audio": "audio",
    "file": "document",
}
_POSTED = Posted()


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class _WireId(_Wire):
    id: str


class _WireCoordinates(_Wire):
    lat: float = Field(ge=-90, le=90)  # no NaN, infinity or place off the globe
    long: float = Field(ge=-180, le=180)


class _WirePayload(_Wire):
    url: str | None = None
    title: str | None = None
    sticker_id: int | str | None = None
    coordinates: _WireCoordinates | None = None


class _WireAttachment(_Wire):
    type: str = ""
    title: str | None = None
    payload: _WirePayload | None = None


class _WireStory(_Wire):
    id: str | None = None
    url: str | None = None


class _WireReplyTo(_Wire):
    mid: str | None = None
    story: _WireStory | None = None


class _WireQuickReply(_Wire):
    payload: str = ""


class _WireMessage(_Wire):
    mid: str = ""
    text: str | None = None
    attachments: list[_WireAttachment] = Field(default_factory=list)
    quick_reply: _WireQuickReply | None = None
    reply_to: _WireReplyTo | None = None
    is_echo: bool = False
    is_deleted: bool = False
    is_unsupported: bool = False


class _WirePostback(_Wire):
    mid: str | None = None
    title: str | None = None
    payload: str = ""


class _WireReaction(_Wire):
    mid: str = ""
    action: str = "react"
    reaction: str | None = None
    emoji: str | None = None


class _WireEdit(_Wire):
    mid: str = ""
    text: str = ""
    num_edit: int = 0


class _WireDeliveryReceipt(_Wire):
    mids: list[str] = Field(default_factory=list)
    watermark: int | None = None


class _WireReadReceipt(_Wire):
    mid: str | None = None
    watermark: int | None = None


class _WireEvent(_Wire):
    sender: _WireId | None = None
    recipient: _WireId | None = None
    timestamp: int = 0
    message: _WireMessage | None = None
    postback: _WirePostback | None = None
    reaction: _WireReaction | None = None
    message_edit: _WireEdit | None = None
    delivery: _WireDeliveryReceipt | None = None
    read: _WireReadReceipt | None = None


class _WireEntry(_Wire):
    id: str
    time: int = 0
    messaging: list[_WireEvent] = Field(default_factory=list)


class WireDelivery(_Wire):
    """One webhook POST: ``object`` and its entries (what the signature covered, parsed once verified)."""

    object: str
    entry: list[_WireEntry] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Parsed:
    """What one delivery carried: drafts for the agent, receipts to record, and what was left aside."""

    messages: tuple[InboundMessage, ...] = ()
    statuses: tuple[DeliveryStatus, ...] = ()
    """Delivery and read receipts, for the same conversations as the users' messages."""
    ignored: int = 0
    """Items that were neither (echoes, unknown kinds, another object's entries)."""


def wire_error(err: ValidationError, channel: MessagingChannel) -> MalformedBodyError:
    """A 400 naming the first field that did not fit."""
    first = err.errors()[0]
    if first["type"] == "json_invalid":
        return MalformedBodyError("body is not JSON", channel=channel)
    where = ".".join(str(p) for p in first["loc"])[:200] or "body"
    return MalformedBodyError(f"not a {channel} webhook delivery: {where}: {first['msg']}", channel=channel)


def _attachment_text(item: _WireAttachment) -> str | None:
    """A line standing in for an attachment that is not a file nor a location (share, story mention, reel …)."""
    payload = item.payload
    kind = item.type or "attachment"
    if kind == "fallback" and (item.title or (payload and payload.title)):
        title = item.title or (payload.title if payload else "")
        link = payload.url if payload and payload.url else ""
        return f"[shared: {title} {link}]".replace(" ]", "]")
    url = payload.url if payload is not None else None
    return f"[{kind.replace('_', ' ')}: {url}]" if url else f"[{kind.replace('_', ' ')}]"


def _location(item: _WireAttachment) -> Location | None:
    """A shared pin with its coordinates and the title Messenger gave it."""
    if item.type != "location" or item.payload is None or item.payload.coordinates is None:
        return None
    where = item.payload.coordinates
    return Location(latitude=where.lat, longitude=where.long, name=item.title or item.payload.title or None)


@functools.lru_cache(maxsize=4096)
def _sender(user: str) -> Sender:
    """The (frozen) sender of a message; shared by every message of the same user."""
    return trusted(Sender, id=user, name=None, is_bot=False)


class MessagingReader:
    """Reads one channel's webhook deliveries for the adapter of one account.

    Args:
        channel: ``messenger`` (``object: page``) or ``instagram`` (``object: instagram``).
        account_of: ``entry[].id`` (Page / Instagram account id) → the account it belongs to.
        home: The adapter's own account: its drafts are built routed with ``agent`` and ``tenant``; others'
            are left for the ingest router to route.
        agent: The home account's agent (``BuildContext``).
        tenant: The home account's tenant.
    """

    def __init__(
        self,
        channel: MessagingChannel,
        account_of: Callable[[str], str],
        *,
        home: str = "default",
        agent: str = "",
        tenant: str = "default",
    ) -> None:
        self.channel: MessagingChannel = channel
        self._account_of = account_of
        self._home = home
        self._agent = agent
        self._tenant = tenant

    def read(self, body: bytes) -> Parsed:
        """Parse a verified delivery.

        Raises:
            MalformedBodyError: the body is not a Messenger Platform delivery.
        """
        try:
            delivery = WireDelivery.model_validate_json(body)
        except ValidationError as err:
            raise wire_error(err, self.channel) from None
        return self.read_delivery(delivery)

    def read_delivery(self, delivery: WireDelivery) -> Parsed:
        """Every message and receipt of a parsed delivery (another object's entries are ignored)."""
        if delivery.object != _OBJECT[self.channel]:
            return Parsed(ignored=sum(len(entry.messaging) for entry in delivery.entry))
        messages: list[InboundMessage] = []
        statuses: list[DeliveryStatus] = []
        ignored = 0
        for entry in delivery.entry:
            account = self._account_of(entry.id)
            for item in entry.messaging:
                if item.sender is None or item.sender.id == entry.id:
                    ignored += 1  # the Page's or account's own doing (an echo, or a receipt of its own)
                    continue
                receipts = self._receipts(entry, account, item)
                if receipts is not None:
                    statuses += receipts
                    continue
                draft = self._draft(entry, account, item)
                if draft is None:
                    ignored += 1
                else:
                    messages.append(draft)
        return Parsed(tuple(messages), tuple(statuses), ignored)

    def _receipts(self, entry: _WireEntry, account: str, item: _WireEvent) -> list[DeliveryStatus] | None:
        """A delivery or read receipt as one report per message it names (``None``: the item is not a receipt).

        A receipt naming no message (Messenger's ``read``, a ``delivery`` with only a watermark) is one report with
        an empty ``platform_id``: everything sent before its watermark.
        """
        if item.delivery is not None:
            status: Literal["delivered", "read"] = "delivered"
            mids = item.delivery.mids
        elif item.read is not None:
            status, mids = "read", [item.read.mid] if item.read.mid else []
        else:
            return None
        user = item.sender.id if item.sender else ""
        conversation = self._conversation(entry, account, user)
        return [DeliveryStatus(conversation, status, mid[:256]) for mid in mids or [""]]

    def _conversation(self, entry: _WireEntry, account: str, user: str) -> ConversationRef:
        """The conversation with ``user`` (built routed when it is the home account's)."""
        home = account == self._home
        # Every value is a str from the validated wire model (or the reader's own): built without validating it again
        # (tests/channels/test_fast_drafts.py checks every sample payload against validation).
        return trusted(
            ConversationRef,
            tenant=self._tenant if home else "default",
            agent=self._agent if home else "",
            channel=self.channel,
            account=account,
            conversation=user,
            thread=None,
            extra={"page": entry.id, "user": user},
        )

    def _draft(self, entry: _WireEntry, account: str, item: _WireEvent) -> InboundMessage | None:
        found = self._event(item)
        if found is None:
            return None
        dedup, text, event, platform_id, meta = found
        user = item.sender.id if item.sender else ""
        return trusted(
            InboundMessage,
            id="",
            dedup_key=dedup,
            conversation=self._conversation(entry, account, user),
            sender=_sender(user),
            text=text,
            event=event,
            platform_message_id=platform_id,
            received_at=time.time(),
            meta={"timestamp": item.timestamp, **meta},
        )

    def _event(self, item: _WireEvent) -> tuple[str, str, InboundEvent, str | None, dict[str, Any]] | None:
        """``(dedup key, text, event, platform id, meta)`` of one item, or ``None`` when it is nothing for the agent."""
        user = item.sender.id if item.sender else ""
        if item.message is not None:
            return self._message(item.message)
        if item.postback is not None:
            back = item.postback
            if not back.payload:
                return None
            dedup = f"pb:{back.mid}" if back.mid else f"pb:{user}:{item.timestamp}"
            label = back.title or back.payload
            choice = ChoiceSelected(option_id=back.payload[:MAX_PAYLOAD], offer_message_id=None)
            return dedup, label, choice, back.mid, {"postback": True}
        if item.message_edit is not None:
            edit = item.message_edit
            if not edit.mid:
                return None
            dedup = f"edit:{edit.mid}:{edit.num_edit}"
            return dedup, edit.text, MessageEdited(original_id=edit.mid), edit.mid, {"num_edit": edit.num_edit}
        if item.reaction is not None:
            return self._reaction(user, item.timestamp, item.reaction)
        return None

    def _message(self, message: _WireMessage) -> tuple[str, str, InboundEvent, str | None, dict[str, Any]] | None:
        if message.is_echo or not message.mid:
            return None
        if message.is_deleted:
            return f"del:{message.mid}", "", MessageDeleted(original_id=message.mid), message.mid, {}
        meta: dict[str, Any] = {}
        if message.reply_to is not None:
            if message.reply_to.mid:
                meta["reply_to"] = message.reply_to.mid
            if message.reply_to.story is not None and message.reply_to.story.id:
                meta["reply_to_story"] = message.reply_to.story.id
        text = message.text or ""
        if message.quick_reply is not None and message.quick_reply.payload:
            choice = ChoiceSelected(option_id=message.quick_reply.payload[:MAX_PAYLOAD], offer_message_id=None)
            return message.mid, text, choice, message.mid, meta | {"quick_reply": True}
        files: list[Attachment] = []
        lines: list[str] = []
        places: list[Location] = []
        for item in message.attachments:
            kind = _KINDS.get(item.type)
            url = item.payload.url if item.payload is not None else None
            if item.payload is not None and item.payload.sticker_id:
                lines.append("[sticker]")
                continue
            if kind is not None and url:
                files.append(trusted(Attachment, kind=kind, ref=url, name=item.title, mime_type=None, size=None))
                continue
            place = _location(item)
            if place is not None:
                places.append(place)
                continue
            line = _attachment_text(item)
            if line is not None:
                lines.append(line)
        if message.is_unsupported and not text:
            lines.append("[a message this app cannot show]")
        text = "\n".join(part for part in (text, *lines) if part)
        if not text and not files and not places:
            return None
        event = _POSTED
        if files or places:
            event = trusted(Posted, kind="message", attachments=tuple(files), shared=tuple(places))
        return message.mid, text, event, message.mid, meta

    def _reaction(
        self, user: str, timestamp: int, reaction: _WireReaction
    ) -> tuple[str, str, InboundEvent, str | None, dict[str, Any]] | None:
        if not reaction.mid or reaction.action == "unreact":
            return None  # a reaction taken back: nothing to answer
        emoji = reaction.emoji or reaction.reaction or "a reaction"
        text = f"[reacted {emoji} to message {reaction.mid}]"
        dedup = f"react:{reaction.mid}:{user}:{emoji}:{timestamp}"
        return dedup, text, _POSTED, None, {"reaction": emoji, "reacted_to": reaction.mid}
