"""⑤ for Slack: every send action through the Web API, within Slack's limits, resumable part by part.

Text is rendered to mrkdwn and split after rendering; each part is paced and recorded as sent, so a retry on any
worker resumes after the parts already sent. Native streaming (``chat.startStream``…) works only in threads: elsewhere,
or on a workspace without the methods, the opening action answers "unavailable" and the caller streams by edits; an
account that was refused remembers it.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Final
from urllib.parse import urlsplit

import aiohttp

from switchboard.channels.base import FileData, Receipt, SendContext
from switchboard.channels.parts import SentParts
from switchboard.channels.render.slack import (
    MAX_MESSAGE_CHARS,
    neutralise_markdown,
    plain_mrkdwn,
    render_mrkdwn,
)
from switchboard.channels.slack.api import SlackApi, SlackRefusal
from switchboard.core.actions import EditText, OfferChoice, SendFile, StreamText
from switchboard.core.messages import Attachment, ConversationRef
from switchboard.errors import AttachmentError, DeliveryError

__all__ = ["MAX_BUTTONS", "STREAM_CAP", "NativeStreamOff", "SlackSender"]

logger = logging.getLogger(__name__)

_CHANNEL: Final = "slack"
STREAM_CAP: Final = MAX_MESSAGE_CHARS
"""Most characters of Markdown one stream message carries; the rest of a long reply follows as messages."""
MAX_BUTTONS: Final = 25
"""Slack's limit of elements in one ``actions`` block."""
_BUTTON_TEXT: Final = 75
_SECTION_TEXT: Final = 3000
_ERROR_TEXT: Final = 1000
CHOICE_BLOCK: Final = "switchboard_choice"
_NO_STREAMING: Final = frozenset(
    {
        "unknown_method",
        "not_allowed",
        "method_deprecated",
        "missing_scope",
        "not_allowed_token_type",
        "feature_not_enabled",
        "team_not_allowed",
    }
)
_FENCE: Final = re.compile(r"^ {0,3}(`{3,}|~{3,})", re.M)


class NativeStreamOff(Exception):
    """The workspace has no native streaming (raised inside; surfaced as a ``Receipt`` detail)."""


def route(conversation: ConversationRef) -> tuple[str, str | None]:
    """``(channel, thread_ts)`` of a conversation: where its replies go."""
    channel = conversation.extra.get("channel") or conversation.conversation
    return channel, conversation.extra.get("thread_ts") or conversation.thread


def _stream_cut(text: str, held: int) -> int:
    """Where the stream message ends for a reply longer than :data:`STREAM_CAP`.

    The last line end in ``text[held:STREAM_CAP]`` that keeps it at least half full, else the cap itself.
    """
    newline = text.rfind("\n", held, STREAM_CAP)
    return newline + 1 if newline + 1 >= max(held, STREAM_CAP // 2) else max(held, STREAM_CAP)


def _rest_markdown(text: str, cut: int) -> str:
    """The Markdown after the stream message, reopening a code fence left open at the cut."""
    fences = _FENCE.findall(text[:cut])
    rest = text[cut:]
    if len(fences) % 2 == 1:
        rest = f"{fences[-1]}\n{rest}"
    return rest


class SlackSender:
    """Performs send actions for one account.

    Args:
        api: The bot token's Web API client.
        account: The account name (for log lines).
    """

    def __init__(self, api: SlackApi, account: str) -> None:
        self._api = api
        self._account = account
        self.native_streaming = True

    async def _post(self, send: SendContext, params: dict[str, Any]) -> str:
        await send.pace()
        answer = await self._api.call("chat.postMessage", {"unfurl_links": False, "unfurl_media": False, **params})
        ts = answer.get("ts")
        if not isinstance(ts, str):
            raise DeliveryError("slack answered chat.postMessage without a ts", channel=_CHANNEL)
        return ts

    async def post_parts(
        self,
        parts: list[str],
        conversation: ConversationRef,
        send: SendContext,
        *,
        done: SentParts | None = None,
        skip: int = 0,
    ) -> Receipt:
        """Post ``parts`` in order in the conversation's thread, resuming after those already sent.

        ``done`` is this logical send's platform ids so far (``send.sent`` plus what this attempt recorded; it is
        extended in place), the first ``skip`` of them not among ``parts`` (a stream message, an uploaded file).
        """
        sent = SentParts(send) if done is None else done
        if not parts:
            return sent.receipt(skipped="empty")
        channel, thread = route(conversation)

        async def post(_: int, part: str) -> str:
            return await self._post(send, {"channel": channel, "thread_ts": thread, "text": part})

        await sent.send(parts, post, offset=skip)
        return sent.receipt()

    async def text(self, markdown: str, conversation: ConversationRef, send: SendContext) -> Receipt:
        """A reply: rendered, split, posted part by part."""
        return await self.post_parts(render_mrkdwn(markdown), conversation, send)

    async def error(self, message: str, conversation: ConversationRef, send: SendContext) -> Receipt:
        """A failure notice, shown literally."""
        text = plain_mrkdwn(message.strip()[:_ERROR_TEXT] or "Sorry, something went wrong.")
        return await self.post_parts([text], conversation, send)

    async def edit(self, action: EditText, conversation: ConversationRef, send: SendContext) -> Receipt:
        """``chat.update`` of one message the gateway sent (the first part if the text outgrew one message)."""
        parts = render_mrkdwn(action.text) or ["…"]
        channel, _ = route(conversation)
        await send.pace()
        await self._api.call("chat.update", {"channel": channel, "ts": action.message_id, "text": parts[0]})
        return Receipt(platform_ids=(action.message_id,), parts=1, detail={"truncated": str(len(parts) > 1).lower()})

    async def typing(self, conversation: ConversationRef, send: SendContext) -> Receipt:
        """The assistant thread's status line (Slack has no typing indicator for bots elsewhere)."""
        channel, thread = route(conversation)
        if thread is None or conversation.extra.get("channel_type", "im") != "im":
            return Receipt(parts=0, detail={"typing": "unsupported"})
        params = {"channel_id": channel, "thread_ts": thread, "status": "is thinking…"}
        await send.pace()
        try:
            await self._api.call("assistant.threads.setStatus", params)
        except SlackRefusal as exc:  # not an assistant thread, or the app is not an assistant app
            return Receipt(parts=0, detail={"typing": "unsupported", "error": exc.error})
        return Receipt(parts=0, detail={"typing": "status"})

    async def stream(self, action: StreamText, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Open, append to or close a native stream (see the module's docstring)."""
        if action.handle is None:
            try:
                return await self._open(action, conversation, send)
            except NativeStreamOff as off:
                return Receipt(parts=0, detail={"streaming": "unavailable", "reason": str(off)})
        channel, _, ts = action.handle.partition(":")
        if not channel or not ts:
            raise DeliveryError(f"not a Slack stream handle: {action.handle!r}", channel=_CHANNEL, retryable=False)
        if not action.final:
            await self._append(channel, ts, action.text, min(action.sent, STREAM_CAP), STREAM_CAP, send)
            return Receipt(platform_ids=(ts,), parts=1, handle=action.handle)
        return await self._close(action, channel, ts, conversation, send)

    async def _open(self, action: StreamText, conversation: ConversationRef, send: SendContext) -> Receipt:
        channel, thread = route(conversation)
        if not self.native_streaming:
            raise NativeStreamOff("the workspace has no native streaming")
        if thread is None:
            raise NativeStreamOff("Slack streams only into threads")
        first = action.text[:STREAM_CAP]
        params: dict[str, Any] = {
            "channel": channel,
            "thread_ts": thread,
            "markdown_text": neutralise_markdown(first) if first else None,
        }
        if conversation.extra.get("channel_type", "im") != "im":
            params["recipient_user_id"] = conversation.extra.get("user")
            params["recipient_team_id"] = conversation.extra.get("team")
        await send.pace()
        try:
            answer = await self._api.call("chat.startStream", params)
        except SlackRefusal as exc:
            if exc.error in _NO_STREAMING:
                self.native_streaming = False
                logger.info("slack account %s: no native streaming (%s); streaming by edits", self._account, exc.error)
            raise NativeStreamOff(exc.error) from None
        ts = answer.get("ts")
        if not isinstance(ts, str):
            raise DeliveryError("slack answered chat.startStream without a ts", channel=_CHANNEL)
        if action.final:
            return await self._close(action.model_copy(update={"sent": len(first)}), channel, ts, conversation, send)
        return Receipt(platform_ids=(ts,), parts=1, handle=f"{channel}:{ts}")

    async def _append(
        self, channel: str, ts: str, text: str, start: int, end: int, send: SendContext, *, stop: bool = False
    ) -> None:
        """``chat.appendStream`` of ``text[start:end]`` (``chat.stopStream`` with it when ``stop``: one call)."""
        end = min(end, len(text))
        chunk = neutralise_markdown(text[start:end], before=text[start - 1] if start else "") if end > start else None
        if chunk is None and not stop:
            return
        await send.pace()
        method = "chat.stopStream" if stop else "chat.appendStream"
        await self._api.call(method, {"channel": channel, "ts": ts, "markdown_text": chunk})

    async def _close(
        self, action: StreamText, channel: str, ts: str, conversation: ConversationRef, send: SendContext
    ) -> Receipt:
        text, held = action.text, min(action.sent, STREAM_CAP)
        cut = len(text) if len(text) <= STREAM_CAP else _stream_cut(text, held)
        done = SentParts(send)
        if not done.ids:  # the stream is still open: finish it, then record it as the first part
            try:
                await self._append(channel, ts, text, held, cut, send, stop=True)
            except SlackRefusal as exc:  # the stream ended on its own (idle): what it lacks follows as messages
                logger.info("slack account %s: stream %s could not be closed (%s)", self._account, ts, exc.error)
                cut = held
            await done.record(ts)
        rest = render_mrkdwn(_rest_markdown(text, cut)) if cut < len(text) else []
        if not rest:
            return Receipt(platform_ids=(ts,), parts=1, handle=f"{channel}:{ts}")
        receipt = await self.post_parts(rest, conversation, send, done=done, skip=1)
        return Receipt(platform_ids=receipt.platform_ids, parts=receipt.parts, handle=f"{channel}:{ts}")

    async def choice(self, action: OfferChoice, conversation: ConversationRef, send: SendContext) -> Receipt:
        """The question in a section block with one button per option (``action_id``/``value`` = the option id)."""
        channel, thread = route(conversation)
        question = render_mrkdwn(action.question, _SECTION_TEXT) if action.question.strip() else []
        shown, rest = action.options[:MAX_BUTTONS], action.options[MAX_BUTTONS:]
        if rest:
            question += render_mrkdwn("\n".join(f"- {option.label}" for option in rest), _SECTION_TEXT)
        done = SentParts(send)
        if len(question) > 1:
            await self.post_parts(question[:-1], conversation, send, done=done)
        if len(done) >= max(len(question), 1):
            return done.receipt()
        used: set[str] = set()
        buttons = []
        for index, option in enumerate(shown):
            action_id = option.id if option.id not in used else f"{option.id}#{index}"
            used.add(action_id)
            label = option.label if len(option.label) <= _BUTTON_TEXT else option.label[: _BUTTON_TEXT - 1] + "…"
            buttons.append(
                {
                    "type": "button",
                    "text": {"type": "plain_text", "text": label, "emoji": True},
                    "action_id": action_id,
                    "value": option.id,
                }
            )
        blocks: list[dict[str, Any]] = []
        last = question[-1] if question else ""
        if last:
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": last}})
        blocks.append({"type": "actions", "block_id": CHOICE_BLOCK, "elements": buttons})
        fallback = last or plain_mrkdwn(", ".join(option.label for option in shown))[:_SECTION_TEXT]
        await done.record(
            await self._post(send, {"channel": channel, "thread_ts": thread, "text": fallback, "blocks": blocks})
        )
        return done.receipt()

    async def file(self, action: SendFile, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Upload a workspace file: ``files.getUploadURLExternal`` → upload → ``files.completeUploadExternal``."""
        channel, thread = route(conversation)
        captions = render_mrkdwn(action.caption) if action.caption.strip() else []
        done = SentParts(send)
        if not done.ids:
            data = await send.read_file(action.path)
            await send.pace()
            ticket = await self._api.call(
                "files.getUploadURLExternal", {"filename": data.name, "length": len(data.data)}, form=True
            )
            url, file_id = ticket.get("upload_url"), ticket.get("file_id")
            if not isinstance(url, str) or not isinstance(file_id, str):
                raise DeliveryError("slack answered files.getUploadURLExternal without a URL", channel=_CHANNEL)
            await self._api.upload(
                url, data.data, data.name, action.mime_type or data.mime_type or "application/octet-stream"
            )
            params = {
                "files": json.dumps([{"id": file_id, "title": data.name}]),
                "channel_id": channel,
                "thread_ts": thread,
                "initial_comment": captions[0] if captions else None,
            }
            await send.pace()
            await self._api.call("files.completeUploadExternal", params, form=True)
            await done.record(file_id)
        if len(captions) <= 1:
            return done.receipt(1, method="files.completeUploadExternal")
        return await self.post_parts(captions[1:], conversation, send, done=done, skip=1)

    async def fetch(self, attachment: Attachment, limit: int) -> FileData:
        """Download ``url_private`` with the bot token (only from Slack's hosts or the configured API's)."""
        if attachment.size is not None and attachment.size > limit:
            raise AttachmentError(
                f"the file is {attachment.size} bytes, over the {limit}-byte limit", channel=_CHANNEL, too_large=True
            )
        url = urlsplit(attachment.ref)
        api = urlsplit(self._api.base_url)
        slack_host = url.scheme == "https" and (url.hostname or "").endswith(".slack.com")
        if not (slack_host or (url.scheme, url.netloc) == (api.scheme, api.netloc)):
            raise AttachmentError("the file is not on a Slack host; the bot token is not sent there", channel=_CHANNEL)
        try:
            async with self._api.http().get(attachment.ref, headers=self._api.auth_header) as resp:
                if resp.status in (403, 404, 410):
                    raise AttachmentError(f"Slack answered HTTP {resp.status} for the file", channel=_CHANNEL)
                if resp.status >= 300:
                    raise AttachmentError(f"Slack answered HTTP {resp.status} for the file", channel=_CHANNEL)
                if resp.content_type == "text/html" and attachment.mime_type != "text/html":
                    raise AttachmentError(
                        "Slack answered with a sign-in page: the app lacks the files:read scope", channel=_CHANNEL
                    )
                data = bytearray()
                async for chunk in resp.content.iter_chunked(65536):
                    data += chunk
                    if len(data) > limit:
                        break
                mime = attachment.mime_type or resp.content_type
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise AttachmentError(f"could not download the file: {type(exc).__name__}", channel=_CHANNEL) from None
        if len(data) > limit:
            raise AttachmentError(f"the file is over the {limit}-byte limit", channel=_CHANNEL, too_large=True)
        name = attachment.name or url.path.rsplit("/", 1)[-1] or "file"
        return FileData(name=name, data=bytes(data), mime_type=mime)
