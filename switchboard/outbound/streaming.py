"""⑤ The streaming policy, in one place: how a reply being written reaches a channel, by its ``streaming`` capability.

``transport`` (the web chat's SSE), ``native`` (the platform streams into one message), ``edits`` (a preview message
edited under the chat's shared edit budget, a delta finding no token coalesced into the next) or ``none``. The
preview goes through the outbox, so a re-run on any worker edits the same one, and whatever the mode, the final
message is complete and split within the channel's limits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import assert_never

from switchboard.channels.base import Capabilities, FileData, Receipt, SendContext
from switchboard.channels.render.split import RENDER_HEADROOM, measure, split_head, split_reply
from switchboard.core.actions import Action, EditText, SendError, SendText, StreamDelta, StreamText
from switchboard.core.messages import ConversationRef
from switchboard.errors import DeliveryError, RateLimitedError
from switchboard.outbound.notices import CANCELLED_TEXT
from switchboard.outbound.outbox import Ephemeral, Outbox, idempotency_key
from switchboard.outbound.ratelimits import SendBuckets

__all__ = ["PREVIEW", "ReplyStream"]

logger = logging.getLogger(__name__)

PREVIEW = "preview"
"""The logical name of a streamed reply's preview message in the outbox."""

Perform = Callable[[Action, ConversationRef, SendContext], Awaitable[Receipt]]
Notify = Callable[[Action, str], Awaitable[None]]


class _Part:
    """The send context of one part of a reply the streaming policy sends (a channel may make it several messages).

    Its messages are recorded in the reply's outbox record as ``<part>:<platform id>``, so a retry knows both which
    parts went out and how far the last one got.
    """

    def __init__(self, reply: SendContext, index: int) -> None:
        self._reply = reply
        self._index = index
        self._key = f"{reply.idempotency_key}:{index}"
        self._sent = [i for n, _, i in (r.partition(":") for r in reply.sent) if n == str(index)]

    @property
    def idempotency_key(self) -> str:
        return self._key

    @property
    def sent(self) -> tuple[str, ...]:
        return tuple(self._sent)

    async def part_sent(self, platform_id: str) -> None:
        await self._reply.part_sent(f"{self._index}:{platform_id}")
        self._sent.append(platform_id)

    async def pace(self) -> None:
        await self._reply.pace()

    async def read_file(self, path: str) -> FileData:
        return await self._reply.read_file(path)


class ReplyStream:
    """The streaming policy for one turn's reply."""

    def __init__(
        self,
        capabilities: Capabilities,
        conversation: ConversationRef,
        *,
        outbox: Outbox,
        perform: Perform,
        notify: Notify,
        buckets: SendBuckets | None,
        run_id: str,
        reply_to: str | None,
        start_after_s: float = 0.0,
        delta_every_s: float = 0.0,
    ) -> None:
        self.caps = capabilities
        self.mode = capabilities.streaming
        self.conversation = conversation
        self.outbox = outbox
        self._perform = perform
        self._notify = notify
        self._buckets = buckets
        self.run_id = run_id
        self.reply_to = reply_to
        self.text = ""
        """The reply so far."""
        self.shown = ""
        """What the platform shows of it (the preview's text, or the native stream's)."""
        self.preview_id: str | None = None
        self.handle: str | None = None
        self.deltas = 0
        self.edits = 0
        """Preview edits (or native appends) performed: what the edit budget bounds."""
        self.coalesced = 0
        """Deltas that found no edit token and were folded into a later edit."""
        self._off = False
        self.start_after_s = start_after_s
        """How long a reply is written before it starts to stream into a message (``native`` and ``edits``)."""
        self._first_at: float | None = None
        self.delta_every_s = delta_every_s
        """``transport``: the most often a delta is sent; the pieces written in between go together in the next."""
        self._unsent = ""
        self._sent_at: float | None = None

    @property
    def limit(self) -> int:
        """The length a part of the reply is cut at (:data:`RENDER_HEADROOM` of ``max_text``, for rendering)."""
        return max(1, int(self.caps.max_text * RENDER_HEADROOM))

    def parts(self, text: str) -> list[str]:
        """``text`` split into messages within the channel's limit."""
        return split_reply(text, self.limit, self.caps.text_unit)

    async def delta(self, text: str) -> None:
        """A piece of the reply was written."""
        self.deltas += 1
        self.text += text
        if self.start_after_s > 0 and self.mode in ("native", "edits") and self._early():
            return  # a reply finished sooner goes out once, whole: no preview to open and edit
        match self.mode:
            case "none":
                return
            case "transport":
                await self._transport(text)
            case "native":
                await self._native()
            case "edits":
                await self._edit()
            case _:
                assert_never(self.mode)

    async def _transport(self, text: str) -> None:
        self._unsent += text
        now = time.monotonic()
        if self._sent_at is not None and now - self._sent_at < self.delta_every_s:
            return  # goes with the next delta, or the final reply (which replaces the streamed text)
        self._sent_at = now
        text, self._unsent = self._unsent, ""
        await self._notify(StreamDelta(text=text, reply_to=self.reply_to), f"delta:{self.deltas}")

    async def flush(self) -> None:
        """Send the pieces of the reply held back by ``delta_every_s`` now (``transport``): what follows comes after."""
        if self.mode == "transport" and self._unsent:
            self._sent_at = time.monotonic()
            text, self._unsent = self._unsent, ""
            await self._notify(StreamDelta(text=text, reply_to=self.reply_to), f"delta:{self.deltas}")

    def _early(self) -> bool:
        """Whether the reply has been written for less than :attr:`start_after_s` so far."""
        now = time.monotonic()
        if self._first_at is None:
            self._first_at = now
        return now - self._first_at < self.start_after_s

    async def _edit_token(self) -> bool:
        return self._buckets is None or await self._buckets.try_edit(self.conversation, self.caps)

    async def _ephemeral(self, action: Action, logical: str) -> Receipt | None:
        """Perform a preview edit or stream append: best effort; a 429 holds the chat for every worker."""
        send = Ephemeral(idempotency_key(self.run_id, logical))
        try:
            return await self._perform(action, self.conversation, send)
        except RateLimitedError as err:
            await self.outbox.hold(self.conversation, err.retry_after)
            logger.info("%s streaming rate-limited; coalescing", self.conversation.channel)
        except DeliveryError as err:
            logger.info("%s streaming step not delivered: %s", self.conversation.channel, type(err).__name__)
        return None

    async def _native(self) -> None:
        if self._off:
            return
        if self.handle is None:
            if not await self._edit_token():
                self.coalesced += 1
                return
            receipt = await self._ephemeral(StreamText(text=self.text, reply_to=self.reply_to), "stream:open")
            if receipt is None:
                return  # not delivered: the next delta tries again
            if receipt.handle is None:  # the channel cannot stream here (Slack outside threads): edit, or wait
                self.mode = "edits" if self.caps.edits else "none"
                if self.mode == "edits":
                    await self._edit()
                return
            self.handle, self.shown = receipt.handle, self.text
            return
        if not await self._edit_token():
            self.coalesced += 1
            return
        action = StreamText(handle=self.handle, text=self.text, sent=len(self.shown), reply_to=self.reply_to)
        if await self._ephemeral(action, f"stream:{self.deltas}") is not None:
            self.shown = self.text
            self.edits += 1

    def _preview_text(self) -> str:
        parts = self.parts(self.text)
        return parts[0] + (" …" if len(parts) > 1 else "")

    async def _edit(self) -> None:
        if self._off or not self.text.strip():
            return
        preview = self._preview_text()
        if self.preview_id is None:
            try:
                sent = await self.outbox.send(
                    SendText(text=preview, reply_to=self.reply_to),
                    self.conversation,
                    run_id=self.run_id,
                    logical=PREVIEW,
                )
            except DeliveryError as err:
                logger.info("%s preview not delivered (%s): final reply only", self.conversation.channel, err)
                self._off = True
                return
            ids = sent.receipt.platform_ids if sent.receipt is not None else ()
            if not ids:
                self._off = True
                return
            self.preview_id = ids[0]
            self.shown = "" if sent.skipped else preview  # a re-run's preview shows the earlier run's text
            if not sent.skipped:
                return
        if preview == self.shown:
            return
        if not await self._edit_token():
            self.coalesced += 1
            return
        assert self.preview_id is not None
        edit = EditText(message_id=self.preview_id, text=preview)
        if await self._ephemeral(edit, f"edit:{self.deltas}") is not None:
            self.shown = preview
            self.edits += 1

    async def restore(self) -> None:
        """A later attempt at the turn: find the preview an earlier one sent, so the reply edits it."""
        if self.mode == "edits" and self.preview_id is None:
            ids = await self.outbox.recorded_ids(self.run_id, PREVIEW)
            self.preview_id = ids[0] if ids else None

    def reply(self, text: str) -> SendText | StreamText:
        """The reply to deliver durably: what closes a native stream, or the text."""
        if self.mode == "native" and self.handle is not None:
            return StreamText(handle=self.handle, text=text, sent=len(self.shown), final=True, reply_to=self.reply_to)
        return SendText(text=text, reply_to=self.reply_to)

    def takes(self, key: str) -> bool:
        """Whether this policy performs the send ``key`` itself (the reply, when it edits a preview into it)."""
        return self.mode == "edits" and self.preview_id is not None and key == idempotency_key(self.run_id, "reply")

    async def perform_reply(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Edit the preview into the reply's first part and send the rest, recording every part as it goes.

        The rest goes as one ``SendText``: the channel splits it within its own limits (exactly, after rendering),
        recording each message it sends; a retry resumes inside it.

        Raises:
            DeliveryError: a part was refused (the parts recorded so far are kept: the retry resumes after them).
            RateLimitedError: the platform asked to wait.
            FencedWriteError: the lease was lost.
        """
        if not isinstance(action, SendText) or self.preview_id is None:
            return await self._perform(action, conversation, send)
        head, rest = split_head(action.text, self.limit, self.caps.text_unit)
        parts = [head, rest] if rest else [head]
        recorded = [int(r.partition(":")[0]) for r in send.sent if r.partition(":")[0].isdigit()]
        # parts before the last one recorded are complete; that one may have stopped midway (the channel resumes it)
        for index in range(max(recorded, default=0), len(parts)):
            part = _Part(send, index)
            if index == 0:
                if not part.sent:
                    edit = EditText(message_id=self.preview_id, text=parts[0])
                    await self._perform(edit, conversation, part)
                    await part.part_sent(self.preview_id)
            else:
                receipt = await self._perform(SendText(text=parts[index]), conversation, part)
                if not part.sent:  # a channel that records no parts itself: record what it returned
                    for platform_id in receipt.platform_ids:
                        await part.part_sent(platform_id)
        platform_ids = tuple(r.partition(":")[2] for r in send.sent)
        return Receipt(platform_ids=platform_ids, parts=len(platform_ids), detail={"preview": self.preview_id})

    async def stopped(self, *, code: str = "cancelled", notice: str = CANCELLED_TEXT, restarts: bool = False) -> bool:
        """The turn was stopped on request: close what streamed so far, with the notice.

        ``restarts``: a newer message interrupted the turn, which restarts under the same run id (the ``interrupt``
        busy policy); its preview is left as it is, for the restarted turn edits that same message.

        Returns whether the notice is shown (nothing streamed into a message yet: it is not, and the ``/stop``
        that asked says so instead).
        """
        match self.mode:
            case "transport":
                await self._notify(SendError(code=code, message=notice, reply_to=self.reply_to), "stop")
                return True
            case "native" if self.handle is not None:
                text = f"{self.text}\n\n{notice}".strip()
                action = StreamText(handle=self.handle, text=text, sent=len(self.shown), final=True)
                return await self._ephemeral(action, "stream:stop") is not None
            case "edits" if self.preview_id is not None and not restarts:
                room = max(1, self.limit - measure(notice, self.caps.text_unit) - 2)  # the notice must fit too
                text = f"{split_head(self.text, room, self.caps.text_unit)[0]}\n\n{notice}".strip()
                return await self._ephemeral(EditText(message_id=self.preview_id, text=text), "edit:stop") is not None
            case _:
                return False
