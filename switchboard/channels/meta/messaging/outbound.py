"""⑤ for Messenger and Instagram: send actions through the Send API (``POST /me/messages``), resumable by part.

Each part is paced and recorded as sent, so a retry on any worker resumes after the parts already sent; how each
action is sent is listed on :class:`MessagingSender`. Past the 24-hour messaging window a part is sent again tagged
``HUMAN_AGENT`` when ``human_agent`` is enabled; otherwise a ``window_closed`` event is recorded and the send fails
for good, saying what to configure.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal

from switchboard.channels.base import Receipt, SendContext
from switchboard.channels.meta.graph import GraphApi, GraphError, window_closed
from switchboard.channels.meta.webhook import record_event
from switchboard.channels.parts import SentParts
from switchboard.channels.render.actions import action_markdown
from switchboard.channels.render.plain import render_parts, shorten
from switchboard.core.actions import EditText, OfferChoice, SendFile, StreamText
from switchboard.core.messages import ConversationRef
from switchboard.errors import DeliveryError

__all__ = ["MAX_QUICK_REPLIES", "QUICK_REPLY_TITLE", "MessagingSender"]

logger = logging.getLogger(__name__)

MAX_QUICK_REPLIES: Final = 13
QUICK_REPLY_TITLE: Final = 20
_ERROR_TEXT: Final = 600
_MAX_UPLOAD: Final = 25 * 2**20
"""Messenger's attachment size limit."""
_PATH: Final = "me/messages"
_KIND: Final[dict[str, Literal["image", "video", "audio"]]] = {"image": "image", "video": "video", "audio": "audio"}


def _attachment_type(mime: str | None) -> str:
    return _KIND.get((mime or "").split("/", 1)[0], "file")


class MessagingSender:
    """Performs send actions for one Messenger or Instagram account.

    - ``OfferChoice`` → the question with up to 13 quick replies (title ≤ 20 characters, ``payload`` = the option id:
      a tap comes back as ``message.quick_reply.payload``); further options are listed in the text.
    - ``SendTyping`` → ``sender_action: mark_seen`` then ``typing_on`` (each its own request, as the API wants).
    - ``SendFile`` → Messenger: the file uploaded with the message (multipart ``filedata``; nothing public needed),
      the caption as text after it. Instagram's Send API takes attachments by public URL only, which a workspace file
      does not have: the caption and the file's name are sent as text instead (``Capabilities.files`` is false).
    - Edits and streams: neither platform edits a sent message; ``EditText`` is refused and ``StreamText`` answers
      "unavailable", so the gateway sends the final reply only.

    Args:
        api: The account's Graph API client.
        channel: ``messenger`` or ``instagram``.
        account: The account name (events and log lines).
        limit: Longest text of one message, in ``unit``s.
        unit: ``chars`` (Messenger) or ``bytes`` (Instagram).
        human_agent: Retry replies refused outside the window tagged ``HUMAN_AGENT``.
        uploads: Workspace files are uploaded with the message (Messenger), else named in text (Instagram).
    """

    def __init__(
        self,
        api: GraphApi,
        *,
        channel: Literal["messenger", "instagram"],
        account: str,
        limit: int,
        unit: Literal["chars", "bytes"],
        human_agent: bool,
        uploads: bool,
    ) -> None:
        self._api = api
        self._channel = channel
        self._account = account
        self._limit = limit
        self._unit: Literal["chars", "bytes"] = unit
        self._human_agent = human_agent
        self._uploads = uploads

    # ---------------------------------------------------------------- the one send call

    async def _send(self, conversation: ConversationRef, message: dict[str, Any], send: SendContext) -> str:
        """Send one message (see :meth:`_within_window`); its ``message_id``."""
        recipient = {"id": conversation.conversation}

        async def call(kind: dict[str, str]) -> dict[str, Any]:
            return await self._api.post(_PATH, {"recipient": recipient, **kind, "message": message})

        return self._message_id(await self._within_window(call, send))

    def _message_id(self, answer: dict[str, Any]) -> str:
        mid = answer.get("message_id")
        if not isinstance(mid, str) or not mid:
            raise DeliveryError(f"{self._channel} answered the Send API without a message_id", channel=self._channel)
        return mid

    async def _within_window(
        self, call: Callable[[dict[str, str]], Awaitable[dict[str, Any]]], send: SendContext
    ) -> dict[str, Any]:
        """``call`` as a ``RESPONSE``; refused outside the window, again tagged ``HUMAN_AGENT`` where enabled.

        Raises:
            DeliveryError: not retryable, after a ``window_closed`` event, when the window is closed for good.
        """
        await send.pace()
        try:
            return await call({"messaging_type": "RESPONSE"})
        except GraphError as err:
            if err.kind != "window":
                raise
            if not self._human_agent:
                remedy = (
                    f"the user must write first (or set human_agent for this {self._channel} account: a 7-day "
                    "window, for replies a person writes or approves)"
                )
                raise window_closed(err, account=self._account, remedy=remedy) from None
        await send.pace()
        try:
            answer = await call({"messaging_type": "MESSAGE_TAG", "tag": "HUMAN_AGENT"})
        except GraphError as again:
            if again.kind != "window":
                raise
            remedy = "the HUMAN_AGENT tag was refused too (over 7 days, or the app lacks the Human Agent permission)"
            raise window_closed(again, account=self._account, remedy=remedy) from None
        record_event(self._channel, self._account, "window_human_agent_sent")
        return answer

    async def _action(self, conversation: ConversationRef, action: str, send: SendContext) -> None:
        await send.pace()
        await self._api.post(_PATH, {"recipient": {"id": conversation.conversation}, "sender_action": action})

    # ---------------------------------------------------------------- actions

    async def post_parts(
        self, parts: list[str], conversation: ConversationRef, send: SendContext, *, done: SentParts | None = None
    ) -> Receipt:
        """Send ``parts`` in order, resuming after those already sent (``done``, extended in place)."""
        sent = SentParts(send) if done is None else done
        if not parts and not sent.ids:
            return Receipt(parts=0, detail={"skipped": "empty"})

        async def post(_: int, part: str) -> str:
            return await self._send(conversation, {"text": part}, send)

        await sent.send(parts, post)
        return sent.receipt()

    def parts(self, markdown: str) -> list[str]:
        """The agent's Markdown as the plain-text messages it becomes."""
        return render_parts(markdown, self._limit, self._unit)

    async def text(self, markdown: str, conversation: ConversationRef, send: SendContext) -> Receipt:
        """A reply: rendered to plain text, split, sent part by part."""
        return await self.post_parts(self.parts(markdown), conversation, send)

    async def error(self, message: str, conversation: ConversationRef, send: SendContext) -> Receipt:
        """A failure notice, shown as written."""
        text = " ".join(message.split())[:_ERROR_TEXT] or "Sorry, something went wrong."
        return await self.post_parts([text], conversation, send)

    async def edit(self, action: EditText, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Refused for good: neither platform edits a sent message.

        Raises:
            DeliveryError: always, not retryable.
        """
        raise DeliveryError(f"{self._channel} cannot edit a sent message", channel=self._channel, retryable=False)

    async def stream(self, action: StreamText, conversation: ConversationRef, send: SendContext) -> Receipt:
        """No streams on either platform: "unavailable", so the gateway sends the final reply only."""
        return Receipt(parts=0, detail={"streaming": "unavailable", "reason": f"{self._channel} has no streams"})

    async def typing(self, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Mark the user's messages seen and show the typing indicator (it clears itself after 20 s)."""
        await self._action(conversation, "mark_seen", send)
        await self._action(conversation, "typing_on", send)
        return Receipt(parts=0, detail={"typing": "typing_on"})

    async def choice(self, action: OfferChoice, conversation: ConversationRef, send: SendContext) -> Receipt:
        """The question with one quick reply per option (the option id as its payload)."""
        shown, rest = action.options[:MAX_QUICK_REPLIES], action.options[MAX_QUICK_REPLIES:]
        markdown = action.question if action.question.strip() else ""
        if rest:
            listed = "\n".join(f"- {option.label}" for option in rest)
            markdown = f"{markdown}\n\n{listed}" if markdown else listed
        parts = self.parts(markdown) or ["Choose one:"]
        done = SentParts(send)
        if len(parts) > 1:
            await self.post_parts(parts[:-1], conversation, send, done=done)
        if len(done) >= len(parts):
            return done.receipt()
        replies = [
            {"content_type": "text", "title": shorten(option.label, QUICK_REPLY_TITLE), "payload": option.id}
            for option in shown
        ]
        await done.record(await self._send(conversation, {"text": parts[-1], "quick_replies": replies}, send))
        return done.receipt(quick_replies=str(len(replies)))

    async def file(self, action: SendFile, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Messenger: upload the file with the message, then the caption; Instagram: caption and name as text."""
        if not self._uploads:
            return await self.post_parts(self.parts(action_markdown(action)), conversation, send)
        captions = self.parts(action.caption) if action.caption.strip() else []
        done = SentParts(send)
        if not done.ids:
            data = await send.read_file(action.path)
            if len(data.data) > _MAX_UPLOAD:
                raise DeliveryError(
                    f"{data.name} is over Messenger's 25 MB attachment limit", channel=self._channel, retryable=False
                )
            mime = action.mime_type or data.mime_type or "application/octet-stream"
            message = {"attachment": {"type": _attachment_type(mime), "payload": {"is_reusable": False}}}

            async def call(kind: dict[str, str]) -> dict[str, Any]:
                fields = {"recipient": json.dumps({"id": conversation.conversation}), **kind}
                fields["message"] = json.dumps(message)
                return await self._api.upload(_PATH, fields, data.name, data.data, mime, field="filedata")

            await done.record(self._message_id(await self._within_window(call, send)))
        if captions:  # the upload is part 0: the captions are parts 1…
            await self.post_parts(["", *captions], conversation, send, done=done)
        return done.receipt(method="upload")
