"""① WhatsApp Cloud API webhook deliveries → drafts of inbound messages, and delivery reports.

Every message of every change becomes one draft (a delivery is accepted whole or not at all), deduplicated on its
``wamid``; statuses of our own sends become :class:`~switchboard.channels.base.DeliveryStatus` reports, never
messages. The normalisation table by message ``type`` is explicit: a type it does not name becomes a notice the agent
can pass on, so the user hears something rather than nothing (table: ``docs/channels/whatsapp.md``).
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Any, Final, Literal

from switchboard.channels.base import OK_JSON, DeliveryStatus, Inbound
from switchboard.channels.meta.webhook import AccountMap, record_event
from switchboard.core.messages import (
    Attachment,
    ChoiceSelected,
    Contact,
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

__all__ = ["WhatsAppIdentity", "parse_delivery"]

logger = logging.getLogger(__name__)

_CHANNEL: Final = "whatsapp"
_Kind = Literal["image", "document", "audio", "voice", "video"]
_MEDIA: Final[dict[str, _Kind]] = {
    "image": "image",
    "document": "document",
    "audio": "audio",
    "video": "video",
    "sticker": "image",
}
_SILENT: Final = frozenset({"system", "request_welcome", "ephemeral"})
"""System events: never answered (see the module's table)."""
_POSTED: Final = Posted()
"""The event of a message without attachments (frozen: shared by every draft)."""
_STATUSES: Final[dict[str, Literal["sent", "delivered", "read", "failed"]]] = {
    "sent": "sent",
    "delivered": "delivered",
    "read": "read",
    "failed": "failed",
}


@dataclass(frozen=True, slots=True)
class WhatsAppIdentity:
    """Who receives: the adapter's own account (built routed) and the map of every account of the same app."""

    account: str
    accounts: AccountMap
    agent: str = ""
    tenant: str = "default"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def parse_delivery(identity: WhatsAppIdentity, payload: dict[str, Any]) -> Inbound:
    """Every message of a verified delivery as a draft, and every status of our sends as a delivery report.

    Raises:
        MalformedBodyError: an entry or change is not an object.
    """
    drafts: list[InboundMessage] = []
    reports: list[DeliveryStatus] = []
    for entry in payload.get("entry") or []:
        if not isinstance(entry, dict):
            raise MalformedBodyError("whatsapp: an entry is not an object", channel=_CHANNEL)
        for change in _list(entry.get("changes")):
            if not isinstance(change, dict):
                raise MalformedBodyError("whatsapp: a change is not an object", channel=_CHANNEL)
            if change.get("field") != "messages":
                continue
            value = _dict(change.get("value"))
            number = _str(_dict(value.get("metadata")).get("phone_number_id"))
            account = identity.accounts.account_for(number)
            names = {
                _str(c.get("wa_id")): _str(_dict(c.get("profile")).get("name"))
                for c in _list(value.get("contacts"))
                if isinstance(c, dict)
            }
            for message in _list(value.get("messages")):
                draft = _message(identity, account, number, names, message) if isinstance(message, dict) else None
                if draft is not None:
                    drafts.append(draft)
            for status in _list(value.get("statuses")):
                report = _status(identity, account, number, status) if isinstance(status, dict) else None
                if report is not None:
                    reports.append(report)
            for error in _list(value.get("errors")):
                code = _dict(error).get("code")
                record_event(_CHANNEL, account, "webhook_error", level=logging.WARNING, code=_code(code))
    return Inbound(tuple(drafts), OK_JSON, tuple(reports))


def _code(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _conversation(identity: WhatsAppIdentity, account: str, number: str, user: str, **extra: str) -> ConversationRef:
    """The conversation with ``user`` on the number ``number`` (built routed when it is the adapter's own account)."""
    routed = account == identity.account
    # Every value is a str taken from the payload through ``_str`` (or the identity's): built without validating it
    # again (tests/channels/test_fast_drafts.py checks every sample payload against validation).
    return trusted(
        ConversationRef,
        tenant=identity.tenant if routed else "default",
        agent=identity.agent if routed else "",
        channel=_CHANNEL,
        account=account,
        conversation=user,
        thread=None,
        extra={"phone_number_id": number, "wa_id": user, **extra},
    )


@functools.lru_cache(maxsize=4096)
def _sender(user: str, name: str | None) -> Sender:
    """The (frozen) sender of a message; shared by every message of the same user and profile name."""
    return trusted(Sender, id=user, name=name, is_bot=False)


def _status(identity: WhatsAppIdentity, account: str, number: str, status: dict[str, Any]) -> DeliveryStatus | None:
    """A status of one of our sends as a report for that user's conversation (``None``: not one we record)."""
    wamid, user = _str(status.get("id"))[:256], _str(status.get("recipient_id"))
    state = _STATUSES.get(_str(status.get("status")))
    if state is None or not user:
        logger.debug("whatsapp/%s: skipped a status without a known state or recipient", account)
        return None
    error = ""
    if state == "failed":
        first = _dict(next(iter(_list(status.get("errors"))), None))
        code = _code(first.get("code"))
        error = " ".join(part for part in (str(code) if code else "", _str(first.get("title"))) if part)[:200]
        error = error or "no error given"
        logger.warning("whatsapp/%s: message %s failed: error %s", account, wamid[:128], code)
    return DeliveryStatus(_conversation(identity, account, number, user), state, wamid, error)


def _message(
    identity: WhatsAppIdentity, account: str, number: str, names: dict[str, str], message: dict[str, Any]
) -> InboundMessage | None:
    wamid, user, kind = _str(message.get("id")), _str(message.get("from")), _str(message.get("type"))
    if not wamid or not user:
        logger.warning("whatsapp/%s: skipped a message without id or sender", account)
        return None
    if kind in _SILENT:
        return None
    context = _dict(message.get("context"))
    reply_to = _str(context.get("id"))
    body = _body(kind, message, reply_to)
    if body is None:
        return None
    text, event = body
    conversation = _conversation(identity, account, number, user, wamid=wamid)
    meta: dict[str, Any] = {"type": kind}
    if reply_to:
        meta["reply_to"] = reply_to
    return trusted(
        InboundMessage,
        id="",
        dedup_key=wamid,
        conversation=conversation,
        sender=_sender(user, names.get(user) or None),
        text=text,
        event=event,
        platform_message_id=wamid,
        received_at=time.time(),
        meta=meta,
    )


def _body(kind: str, message: dict[str, Any], reply_to: str) -> tuple[str, InboundEvent] | None:
    part = _dict(message.get(kind))
    if kind == "text":
        return _str(part.get("body")), _POSTED
    if kind in _MEDIA:
        media_kind: _Kind = "voice" if kind == "audio" and part.get("voice") is True else _MEDIA[kind]
        attachment = trusted(
            Attachment,
            kind=media_kind,
            ref=_str(part.get("id")),
            name=_str(part.get("filename")) or None,
            mime_type=_str(part.get("mime_type")) or None,
            size=None,
        )
        if not attachment.ref:
            return None
        caption = _str(part.get("caption"))
        posted = trusted(Posted, kind="message", attachments=(attachment,), shared=())
        return (caption or ("[sticker]" if kind == "sticker" else "")), posted
    if kind == "location":
        location = _location(part)
        return ("", Posted(shared=(location,))) if location is not None else _cannot_show(kind)
    if kind == "contacts":
        contacts = tuple(_contact(_dict(c)) for c in _list(message.get("contacts")))
        return ("", Posted(shared=contacts)) if contacts else _cannot_show(kind)
    if kind == "reaction":
        emoji = _str(part.get("emoji"))
        if not emoji:
            return None  # a reaction removed: nothing to answer
        return f"[reacted {emoji} to message {_str(part.get('message_id'))}]", _POSTED
    if kind == "interactive":
        reply = _dict(part.get("button_reply")) or _dict(part.get("list_reply"))
        option = _str(reply.get("id"))
        if not option:
            return f"[an interactive {_str(part.get('type')) or 'message'} this gateway cannot show]", _POSTED
        return _str(reply.get("title")), ChoiceSelected(option_id=option, offer_message_id=reply_to or None)
    if kind == "button":
        option = _str(part.get("payload")) or _str(part.get("text"))
        if not option:
            return None
        return _str(part.get("text")), ChoiceSelected(option_id=option, offer_message_id=reply_to or None)
    if kind == "edit":
        original, edited = _str(part.get("original_message_id")), _dict(part.get("message"))
        edited_kind = _str(edited.get("type"))
        content = _dict(edited.get(edited_kind))
        text = _str(content.get("body")) if edited_kind == "text" else _str(content.get("caption"))
        if not original or not text:
            return None  # nothing the user can read changed
        return text, MessageEdited(original_id=original)
    if kind == "revoke":
        original = _str(part.get("original_message_id"))
        return ("", MessageDeleted(original_id=original)) if original else None
    return _cannot_show(kind)


def _cannot_show(kind: str) -> tuple[str, InboundEvent]:
    """The notice for content the user sent that this gateway cannot read (the agent can say so)."""
    return f"[a message this gateway cannot show ({kind or 'no type'})]", _POSTED


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _location(part: dict[str, Any]) -> Location | None:
    latitude, longitude = _number(part.get("latitude")), _number(part.get("longitude"))
    if latitude is None or longitude is None or not (-90 <= latitude <= 90 and -180 <= longitude <= 180):
        return None  # missing, NaN, infinite or off the globe: no place
    return Location(
        latitude=latitude,
        longitude=longitude,
        name=_str(part.get("name")) or None,
        address=_str(part.get("address")) or None,
        url=_str(part.get("url")) or None,
    )


def _contact(card: dict[str, Any]) -> Contact:
    phones = (_str(_dict(p).get("phone")) for p in _list(card.get("phones")))
    emails = (_str(_dict(e).get("email")) for e in _list(card.get("emails")))
    return Contact(
        name=_str(_dict(card.get("name")).get("formatted_name")) or "(no name)",
        phones=tuple(p for p in phones if p),
        emails=tuple(e for e in emails if e),
    )
