"""⑤ WhatsApp sends through the Cloud API: ``POST /{phone_number_id}/messages`` (and ``/media`` for uploads).

Each text part is recorded as sent before the next, so a retry resumes after the parts delivered; how each action is
sent is on :class:`WhatsAppSender`. Outside the 24-hour window (error 131047) the configured template is sent once
instead, or the send fails for good with a recorded ``window_closed`` and a clear reason.
"""

from __future__ import annotations

import base64
import logging
from typing import Any, Final

from switchboard.channels.base import Receipt, SendContext
from switchboard.channels.meta.graph import GraphApi, GraphError, window_closed
from switchboard.channels.meta.webhook import record_event
from switchboard.channels.parts import SentParts
from switchboard.channels.render.whatsapp import render_whatsapp, split_text
from switchboard.core.actions import OfferChoice, SendFile, SendVoice
from switchboard.core.messages import ConversationRef
from switchboard.errors import DeliveryError

__all__ = ["MAX_BUTTONS", "MAX_LIST_ROWS", "WhatsAppSender"]

_CHANNEL: Final = "whatsapp"
MAX_BUTTONS: Final = 3
MAX_LIST_ROWS: Final = 10
_BUTTON_TITLE: Final = 20
_ROW_TITLE: Final = 24
_ROW_DESCRIPTION: Final = 72
_INTERACTIVE_BODY: Final = 1024
_CAPTION: Final = 1024
_TEMPLATE_MARK: Final = "template:"


def _short(text: str, most: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= most else text[: most - 1] + "…"


class WhatsAppSender:
    """Sends for one business number.

    - Text: rendered to WhatsApp formatting and split within 4,096 characters; each part is recorded as sent (its
      ``wamid``) before the next, so a retry resumes after the parts already delivered.
    - Choices: up to 3 options with titles of at most 20 characters → interactive reply buttons; otherwise up to 10 →
      an interactive list (row titles ≤ 24, the full label in the row's description); more → numbered text. The
      option id comes back as ``button_reply.id`` / ``list_reply.id``.
    - Files: uploaded to ``/{phone_number_id}/media`` (multipart), then sent by media id as an image, video, audio or
      document (documents keep their file name; captions where WhatsApp takes one).
    - Typing: ``status: read`` on the last inbound ``wamid`` with ``typing_indicator`` (marks it read, shows typing for
      up to 25 s or until the reply).
    - The 24-hour customer-service window: WhatsApp refuses free-form messages outside it (error 131047). The
      sender reacts to that error (no last-inbound time is tracked): it sends the configured ``window_template``
      (``name:language``) once instead and records ``window_template_sent``, or, without one, records
      ``window_closed`` and raises a non-retryable error the outbox dead-letters with a clear reason.

    Args:
        api: The Graph API client with the account's token.
        phone_number_id: The business number's id.
        account: The account name (for events).
        window_template: ``(name, language)`` of the template sent outside the 24-hour window, or ``None``.
    """

    def __init__(
        self, api: GraphApi, phone_number_id: str, account: str, window_template: tuple[str, str] | None
    ) -> None:
        self.api = api
        self.phone_number_id = phone_number_id
        self.account = account
        self.window_template = window_template

    def _number(self, conversation: ConversationRef) -> str:
        return self.phone_number_id or conversation.extra.get("phone_number_id", "")

    async def _post(self, conversation: ConversationRef, message: dict[str, Any]) -> str:
        body = {"messaging_product": "whatsapp", "recipient_type": "individual", "to": conversation.conversation}
        answer = await self.api.post(f"{self._number(conversation)}/messages", body | message)
        sent = answer.get("messages")
        first = sent[0] if isinstance(sent, list) and sent and isinstance(sent[0], dict) else {}
        wamid = first.get("id")
        if not isinstance(wamid, str) or not wamid:
            raise DeliveryError("whatsapp answered a send without a message id", channel=_CHANNEL, retryable=False)
        return wamid

    async def send_parts(
        self, messages: list[dict[str, Any]], conversation: ConversationRef, send: SendContext
    ) -> Receipt:
        """Send ``messages`` in order, skipping the ones an earlier attempt sent; the window handled once."""
        done = SentParts(send)
        if done.ids and done.ids[-1].startswith(_TEMPLATE_MARK):
            return done.receipt(window="template")

        async def post(_: int, message: dict[str, Any]) -> str:
            await send.pace()
            return await self._post(conversation, message)

        try:
            await done.send(messages, post)
        except GraphError as err:
            if err.kind != "window":
                raise
            return await self._outside_window(err, conversation, done)
        return done.receipt()

    def _template(self, conversation: ConversationRef) -> tuple[str, str] | None:
        """The template sent outside the window: a scheduled job's own, else the account's."""
        name, _, language = conversation.extra.get("window_template", "").partition(":")
        if name and language:
            return name, language
        return self.window_template

    async def _outside_window(self, err: GraphError, conversation: ConversationRef, done: SentParts) -> Receipt:
        template_of = self._template(conversation)
        if template_of is None:
            raise window_closed(
                err,
                account=self.account,
                remedy="set window_template (SWITCHBOARD_WHATSAPP__WINDOW_TEMPLATE=name:language) to send an "
                "approved template instead",
            )
        name, language = template_of
        template = {"type": "template", "template": {"name": name, "language": {"code": language}}}
        wamid = await self._post(conversation, template)
        ids = tuple(done.ids)
        await done.record(_TEMPLATE_MARK + wamid)
        record_event(_CHANNEL, self.account, "window_template_sent", level=logging.INFO, template=name[:64])
        return Receipt(platform_ids=(*ids, wamid), parts=len(ids) + 1, detail={"window": "template"})

    async def text(self, markdown: str, conversation: ConversationRef, send: SendContext) -> Receipt:
        """A reply in WhatsApp formatting, split within 4,096 characters."""
        parts = split_text(markdown)
        if not parts:
            return Receipt(parts=0)
        messages = [{"type": "text", "text": {"preview_url": False, "body": part}} for part in parts]
        return await self.send_parts(messages, conversation, send)

    async def choice(self, action: OfferChoice, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Reply buttons (≤ 3 short titles), a list (≤ 10), or numbered text beyond that."""
        options = action.options
        if len(options) > MAX_LIST_ROWS:
            numbered = "\n".join(f"{i}. {option.label}" for i, option in enumerate(options, 1))
            return await self.text(f"{action.question}\n\n{numbered}", conversation, send)
        prefix = split_text(action.question, _INTERACTIVE_BODY) or ["Choose one:"]
        body, before = prefix[-1], prefix[:-1]
        messages: list[dict[str, Any]] = [{"type": "text", "text": {"body": part}} for part in before]
        if len(options) <= MAX_BUTTONS and all(len(option.label) <= _BUTTON_TITLE for option in options):
            buttons = [{"type": "reply", "reply": {"id": o.id, "title": o.label}} for o in options]
            interactive: dict[str, Any] = {"type": "button", "body": {"text": body}, "action": {"buttons": buttons}}
        else:
            rows = [
                {"id": o.id, "title": _short(o.label, _ROW_TITLE)}
                | ({"description": _short(o.label, _ROW_DESCRIPTION)} if len(o.label) > _ROW_TITLE else {})
                for o in options
            ]
            interactive = {
                "type": "list",
                "body": {"text": body},
                "action": {"button": "Choose", "sections": [{"title": "Options", "rows": rows}]},
            }
        messages.append({"type": "interactive", "interactive": interactive})
        return await self.send_parts(messages, conversation, send)

    async def file(self, action: SendFile, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Upload a workspace file to ``/{phone_number_id}/media`` and send it by id."""
        if send.sent:
            return Receipt(platform_ids=send.sent, parts=len(send.sent))
        data = await send.read_file(action.path)
        mime = action.mime_type or data.mime_type or "application/octet-stream"
        kind = mime.split("/", 1)[0]
        media_type = {"image": "image", "video": "video", "audio": "audio"}.get(kind, "document")
        fields = {"messaging_product": "whatsapp", "type": mime}
        uploaded = await self.api.upload(f"{self._number(conversation)}/media", fields, data.name, data.data, mime)
        media_id = uploaded.get("id")
        if not isinstance(media_id, str) or not media_id:
            raise DeliveryError("whatsapp answered an upload without a media id", channel=_CHANNEL, retryable=False)
        media: dict[str, Any] = {"id": media_id}
        caption = render_whatsapp(action.caption).strip()[:_CAPTION]
        if caption and media_type != "audio":
            media["caption"] = caption
        if media_type == "document":
            media["filename"] = data.name
        return await self.send_parts([{"type": media_type, media_type: media}], conversation, send)

    async def voice(self, action: SendVoice, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Upload the OGG/Opus audio to ``/{phone_number_id}/media`` and send it as a voice message (``voice: true``).

        WhatsApp shows a voice note (play button, profile picture, transcript) only for OGG/Opus; it shows the play
        button up to 512 KB, a download arrow above.
        """
        if send.sent:
            return Receipt(platform_ids=send.sent, parts=len(send.sent))
        data = base64.b64decode(action.audio)
        fields = {"messaging_product": "whatsapp", "type": action.mime_type}
        uploaded = await self.api.upload(
            f"{self._number(conversation)}/media", fields, "reply.ogg", data, action.mime_type
        )
        media_id = uploaded.get("id")
        if not isinstance(media_id, str) or not media_id:
            raise DeliveryError("whatsapp answered an upload without a media id", channel=_CHANNEL, retryable=False)
        return await self.send_parts([{"type": "audio", "audio": {"id": media_id, "voice": True}}], conversation, send)

    async def typing(self, conversation: ConversationRef) -> Receipt:
        """Mark the last inbound message read and show the typing indicator (nothing without an inbound id)."""
        wamid = conversation.extra.get("wamid")
        if not wamid:
            return Receipt(parts=0)
        body = {
            "messaging_product": "whatsapp",
            "status": "read",
            "message_id": wamid,
            "typing_indicator": {"type": "text"},
        }
        await self.api.post(f"{self._number(conversation)}/messages", body)
        return Receipt(parts=0, detail={"typing": "on"})
