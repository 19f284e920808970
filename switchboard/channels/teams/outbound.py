"""⑤ for Teams: every send action as Bot Connector activities, resumable part by part.

Replies are proactive messages: ``POST {serviceUrl}/v3/conversations/{id}/activities`` to the ``serviceUrl`` the
conversation's verified activities came from (a channel thread's id carries ``;messageid=``, so the reply lands in
the thread). Text is split in Markdown and rendered (:mod:`~switchboard.channels.render.teams`); each part is one
activity, preceded by ``await send.pace()`` and followed by ``await send.part_sent(id)``, so a retry on any worker
resumes after the parts already sent. ``EditText`` updates the activity (``PUT …/activities/{id}``): the streaming
policy streams a reply by editing a preview under the shared edit budget. ``OfferChoice`` is an Adaptive Card whose
``Action.Submit`` buttons carry the option id in ``data`` (a click comes back as a message activity with ``value``).
"""

from __future__ import annotations

import base64
from typing import Any, Final

from microsoft_agents.activity import Activity, ChannelAccount
from microsoft_agents.activity import Attachment as CardAttachment

from switchboard.channels.base import Receipt, SendContext
from switchboard.channels.parts import SentParts
from switchboard.channels.render.teams import neutral_text, render_parts
from switchboard.channels.teams.api import ConnectorApi
from switchboard.channels.teams.inbound import CHOICE_KEY
from switchboard.core.actions import EditText, OfferChoice, SendFile, StreamText
from switchboard.core.messages import ConversationRef
from switchboard.errors import DeliveryError

__all__ = ["ADAPTIVE_CARD", "MAX_BUTTONS", "MAX_LABEL", "TeamsSender", "choice_card"]

ADAPTIVE_CARD: Final = "application/vnd.microsoft.card.adaptive"
MAX_BUTTONS: Final = 6
"""Actions Teams shows on an Adaptive Card before folding them into a menu."""
MAX_LABEL: Final = 40
_INLINE_IMAGE: Final = 256 * 1024
_ERROR_TEXT: Final = 1000
_CHANNEL: Final = "teams"


def route(conversation: ConversationRef) -> tuple[str, str]:
    """``(serviceUrl, conversation id)`` of a conversation.

    Raises:
        DeliveryError: the conversation has no verified service URL (not retryable).
    """
    service_url = conversation.extra.get("service_url")
    if not service_url:
        raise DeliveryError("teams conversation without a verified serviceUrl", channel=_CHANNEL, retryable=False)
    return service_url, conversation.conversation


def choice_card(action: OfferChoice, question: str) -> dict[str, Any]:
    """The Adaptive Card of an offer: the question, then one ``Action.Submit`` per option (``data`` = its id)."""
    actions = []
    for option in action.options[:MAX_BUTTONS]:
        label = option.label if len(option.label) <= MAX_LABEL else option.label[: MAX_LABEL - 1] + "…"
        actions.append({"type": "Action.Submit", "title": label, "data": {CHOICE_KEY: option.id, "label": label}})
    body: list[dict[str, Any]] = []
    if question:
        body.append({"type": "TextBlock", "text": question, "wrap": True})
    rest = action.options[MAX_BUTTONS:]
    if rest:
        body.append({"type": "TextBlock", "text": "\n".join(f"- {o.label}" for o in rest), "wrap": True})
    return {
        "type": "AdaptiveCard",
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "version": "1.4",
        "body": body,
        "actions": actions,
    }


class TeamsSender:
    """Performs send actions for one account.

    Args:
        api: The Connector client with the bot's token.
    """

    def __init__(self, api: ConnectorApi) -> None:
        self._api = api

    @staticmethod
    def _activity(conversation: ConversationRef, **fields: Any) -> Activity:
        bot = conversation.extra.get("bot_id")
        if bot:
            fields["from_property"] = ChannelAccount(id=bot)
        return Activity(**fields)

    async def _post(self, conversation: ConversationRef, send: SendContext, activity: Activity) -> str:
        service_url, conversation_id = route(conversation)
        await send.pace()
        return await self._api.send(service_url, conversation_id, activity)

    async def post_parts(
        self, parts: list[str], conversation: ConversationRef, send: SendContext, *, done: SentParts | None = None
    ) -> Receipt:
        """Post ``parts`` as Markdown messages in order, resuming after those already sent (``done``, extended)."""
        sent = SentParts(send) if done is None else done
        if not parts:
            return sent.receipt(skipped="empty")

        async def post(_: int, part: str) -> str:
            activity = self._activity(conversation, type="message", text=part, text_format="markdown")
            return await self._post(conversation, send, activity)

        await sent.send(parts, post)
        return sent.receipt()

    async def text(self, markdown: str, conversation: ConversationRef, send: SendContext) -> Receipt:
        """A reply: split, rendered, posted part by part."""
        return await self.post_parts(render_parts(markdown), conversation, send)

    async def error(self, message: str, conversation: ConversationRef, send: SendContext) -> Receipt:
        """A failure notice, shown literally."""
        text = neutral_text(message.strip()[:_ERROR_TEXT] or "Sorry, something went wrong.")
        return await self.post_parts([text], conversation, send)

    async def edit(self, action: EditText, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Update one activity the bot sent (the first part, if the text outgrew one message)."""
        service_url, conversation_id = route(conversation)
        parts = render_parts(action.text) or ["…"]
        activity = self._activity(
            conversation, type="message", id=action.message_id, text=parts[0], text_format="markdown"
        )
        await send.pace()
        await self._api.update(service_url, conversation_id, action.message_id, activity)
        return Receipt(platform_ids=(action.message_id,), parts=1, detail={"truncated": str(len(parts) > 1).lower()})

    async def stream(self, action: StreamText, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Not declared (Teams streams by edits): "unavailable", so the caller falls back to edits."""
        return Receipt(parts=0, detail={"streaming": "unavailable"})

    async def typing(self, conversation: ConversationRef, send: SendContext) -> Receipt:
        """A ``typing`` activity (Teams shows it for a few seconds, or until the next message)."""
        await self._post(conversation, send, self._activity(conversation, type="typing"))
        return Receipt(parts=0, detail={"typing": "activity"})

    async def choice(self, action: OfferChoice, conversation: ConversationRef, send: SendContext) -> Receipt:
        """The question's leading parts as messages, its last part on an Adaptive Card with the buttons."""
        question = render_parts(action.question) if action.question.strip() else []
        done = SentParts(send)
        if len(question) > 1:
            await self.post_parts(question[:-1], conversation, send, done=done)
        if len(done) >= max(len(question), 1):
            return done.receipt()
        card = CardAttachment(content_type=ADAPTIVE_CARD, content=choice_card(action, question[-1] if question else ""))
        activity = self._activity(conversation, type="message", attachments=[card])
        await done.record(await self._post(conversation, send, activity))
        return done.receipt()

    async def file(self, action: SendFile, conversation: ConversationRef, send: SendContext) -> Receipt:
        """A small image inline (a data URL attachment) with its caption; other files are named, not uploaded.

        Bots upload files to Teams only through a file-consent card in personal chats, which this gateway does not
        offer; the caption and the file's name still reach the user.
        """
        done = SentParts(send)
        if done.ids:
            return done.receipt()
        data = await send.read_file(action.path)
        mime = action.mime_type or data.mime_type or "application/octet-stream"
        caption = render_parts(action.caption)[0] if action.caption.strip() else ""
        if mime.startswith("image/") and len(data.data) <= _INLINE_IMAGE:
            url = f"data:{mime};base64,{base64.b64encode(data.data).decode()}"
            image = CardAttachment(content_type=mime, content_url=url, name=data.name)
            fields: dict[str, Any] = {"type": "message", "attachments": [image]}
            if caption:
                fields.update(text=caption, text_format="markdown")
            sent_id = await self._post(conversation, send, self._activity(conversation, **fields))
        else:
            note = f"{caption}\n\n" if caption else ""
            text = note + neutral_text(f"(file {data.name}: Teams bots cannot upload files here)")
            activity = self._activity(conversation, type="message", text=text, text_format="markdown")
            sent_id = await self._post(conversation, send, activity)
        await done.record(sent_id)
        return done.receipt()
