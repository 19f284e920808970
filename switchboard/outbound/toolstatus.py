"""⑤ Tool calls' status messages on the conversation's channel (:class:`~switchboard.core.tools.status.StatusMessages`).

A status message is posted through the outbox under its own logical name, so a re-run of the call on any worker edits
the message an earlier attempt posted rather than posting a second. Updates are ephemeral edits under the chat's
shared edit budget, skipped rather than waited for; the final state is the one edit the user must see, so it waits for
a token (bounded) and never goes into a chat the platform holds. An unfinished message is ended as interrupted by a
later attempt (:func:`resume`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from switchboard.channels.base import Capabilities, Rate, Receipt, SendContext
from switchboard.core.actions import Action, EditText, SendText
from switchboard.core.messages import ConversationRef
from switchboard.errors import DeliveryError, RateLimitedError
from switchboard.outbound.outbox import Ephemeral, Outbox, idempotency_key
from switchboard.outbound.ratelimits import SendBuckets
from switchboard.outbound.streaming import ReplyStream
from switchboard.queue.keys import SessionKeys

__all__ = [
    "FINAL_HOLD_WAIT_S",
    "FINAL_TOKEN_WAIT_S",
    "INTERRUPTED_TEXT",
    "SETTLE_WAIT_S",
    "StatusBoard",
    "ToolStatus",
    "resume",
    "settle",
]

logger = logging.getLogger(__name__)

FINAL_TOKEN_WAIT_S = 2.0
"""Longest a status message's final edit waits for a token of the chat's edit budget before it is made anyway."""
FINAL_HOLD_WAIT_S = 8.0
"""Longest a final edit waits out the platform's hold on the chat (a 429's ``retry_after``); past it, it is skipped."""
SETTLE_WAIT_S = 12.0
"""Longest the end of a turn waits for its status messages' posts and edits still in flight."""
OPEN_TTL_S = 86_400
"""How long the session's list of open status messages outlives its last change."""
INTERRUPTED_TEXT = "⚠️ Interrupted: the worker running this was lost; the command may or may not have finished."
"""What a later attempt at the turn shows in a status message an earlier one left open."""

Perform = Callable[[Action, ConversationRef, SendContext], Awaitable[Receipt]]
T = TypeVar("T")


class StatusBoard:
    """The status messages of one turn's tool calls, in the turn's conversation.

    A message's posts and edits run in order, one at a time, as tasks of the board: a caller that stops waiting (its
    call was cancelled) never cuts a request off mid-flight, and the final state always lands after any update still in
    flight. The drain settles the board before the turn ends (:func:`settle`, bounded by :data:`SETTLE_WAIT_S`): what is
    still running then is cancelled, and nothing is sent for the turn afterwards. A message the platform says is gone
    (the user deleted it) is not edited again. Each status message not yet in its final state is listed in the session's
    ``tool_statuses`` hash, so that a later attempt at the turn, after a worker was lost mid-call, ends it as
    interrupted (:func:`resume`) rather than leave it saying it runs.
    """

    def __init__(
        self,
        capabilities: Capabilities,
        conversation: ConversationRef,
        *,
        outbox: Outbox,
        perform: Perform,
        buckets: SendBuckets | None,
        run_id: str,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.caps = capabilities
        self.conversation = conversation
        self.outbox = outbox
        self.perform = perform
        self.buckets = buckets
        self.run_id = run_id
        self.sleep = sleep
        self.key = SessionKeys(outbox.lease.session).tool_statuses
        self.closed = False
        """Set once the turn is settled: nothing more is sent for it."""
        self._tasks: set[asyncio.Task[Any]] = set()

    @classmethod
    def beside(cls, stream: ReplyStream, perform: Perform) -> StatusBoard:
        """The status messages of the turn ``stream`` streams the reply of (its conversation, outbox and run)."""
        outbox = stream.outbox
        return cls(
            stream.caps,
            stream.conversation,
            outbox=outbox,
            perform=perform,
            buckets=outbox.buckets,
            run_id=stream.run_id,
        )

    def open(self, name: str) -> ToolStatus:
        """The status message ``name`` of this turn."""
        return ToolStatus(self, name)

    async def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` as the board's task: a caller that stops waiting leaves it to finish (or to :func:`settle`)."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return await asyncio.shield(task)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:  # seen here when its caller stopped waiting
            logger.debug("status message work failed: %s", type(task.exception()).__name__)

    async def settle(self, wait_s: float = SETTLE_WAIT_S) -> None:
        """The turn ends: wait up to ``wait_s`` for the posts and edits in flight, cancel the rest, send no more."""
        self.closed = True
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=wait_s)
            for task in late:
                task.cancel()
            if late:
                logger.info("%s status message work cut off at the end of the turn", self.conversation.channel)

    async def settle_leftovers(self) -> None:
        """A later attempt at the turn: end every status message an earlier attempt left open as interrupted.

        Raises:
            FencedWriteError: the session's lease was lost.
        """
        for field, raw in (await self.outbox.redis.hgetall(self.key)).items():
            name = field.decode() if isinstance(field, bytes) else str(field)
            try:
                message_id = str(json.loads(raw)["message_id"])
            except (ValueError, KeyError, TypeError):
                await self.outbox.redis.hdel(self.key, name)
                continue
            status = ToolStatus(self, name, record=name)
            status.message_id = message_id
            await status.edit(INTERRUPTED_TEXT, final=True)


async def settle(board: StatusBoard | None, *, after: asyncio.Future[Any]) -> None:
    """Wait for the turn's runner ``after`` to end (however it ends), then settle its ``board``, if any.

    The runner's outcome is left to the caller (``after.result()``); see :meth:`StatusBoard.settle`.
    """
    with contextlib.suppress(BaseException):
        await after
    if board is not None:
        await board.settle()


async def resume(stream: ReplyStream, perform: Perform) -> None:
    """A later attempt at the turn: find the preview an earlier one streamed, and end the status messages it left.

    Raises:
        FencedWriteError: the session's lease was lost.
    """
    await stream.restore()
    if stream.caps.edits:
        await StatusBoard.beside(stream, perform).settle_leftovers()


class ToolStatus:
    """One tool call's status message (:class:`~switchboard.core.tools.status.StatusMessage`)."""

    def __init__(self, board: StatusBoard, name: str, *, record: str | None = None) -> None:
        self._board = board
        self._name = name
        self._record = record or f"{board.run_id}|{name}"
        self._posts = 0
        self._edits = 0
        self._lock = asyncio.Lock()
        self.gone = False
        """The platform said the message is gone (the user deleted it): it is not edited again."""
        self.message_id: str | None = None
        """The platform id of the first message posted (what :meth:`edit` edits)."""

    @property
    def edits(self) -> bool:
        """Whether the conversation's channel edits sent messages."""
        return self._board.caps.edits

    async def post(self, text: str) -> bool:
        """Send ``text`` as a new message through the outbox (once per re-run of the call); whether it is there.

        Raises:
            FencedWriteError: the session's lease was lost.
        """
        if self._board.closed:
            return False
        return await self._board.run(self._post(text))

    async def edit(self, text: str, *, final: bool = False) -> bool:
        """Edit the posted message to ``text``, after any post or edit still in flight; whether the edit was made.

        An update takes a token of the chat's edit budget if there is one now; a ``final`` edit waits for one a little,
        then is made without one, but never into a chat the platform holds.

        Raises:
            FencedWriteError: the session's lease was lost.
        """
        if self._board.closed:
            return False
        return await self._board.run(self._edit(text, final=final))

    async def _post(self, text: str) -> bool:
        board = self._board
        async with self._lock:
            self._posts += 1
            try:
                sent = await board.outbox.send(
                    SendText(text=text), board.conversation, run_id=board.run_id, logical=f"{self._name}:{self._posts}"
                )
            except DeliveryError as err:
                logger.info("%s status message not delivered: %s", board.conversation.channel, type(err).__name__)
                return False
            ids = sent.receipt.platform_ids if sent.receipt is not None else ()
            if self.message_id is None and ids and self.edits:
                self.message_id = ids[0]
                redis = board.outbox.redis
                await redis.hset(board.key, self._record, json.dumps({"message_id": self.message_id}))
                await redis.expire(board.key, OPEN_TTL_S)
            return bool(ids) or not self.edits

    async def _edit(self, text: str, *, final: bool) -> bool:
        board = self._board
        async with self._lock:
            for retry in range(3):  # a final edit answered 429 waits the hold out and tries again
                if self.message_id is None or not self.edits or self.gone:
                    return False
                if not await (self._final_token(poll=not retry) if final else self._token()):
                    return False
                self._edits += 1
                action = EditText(message_id=self.message_id, text=text)
                send = Ephemeral(idempotency_key(board.run_id, f"{self._name}:edit:{self._edits}"))
                try:
                    await board.perform(action, board.conversation, send)
                except RateLimitedError as err:
                    await board.outbox.hold(board.conversation, err.retry_after)
                    logger.info("%s status edit rate-limited", board.conversation.channel)
                    if final and err.retry_after <= FINAL_HOLD_WAIT_S:
                        await board.sleep(err.retry_after)
                        continue
                    return False
                except DeliveryError as err:
                    logger.info("%s status edit not delivered: %s", board.conversation.channel, type(err).__name__)
                    if not err.retryable:  # the message is gone, or can never take this edit
                        self.gone = True
                        await board.outbox.redis.hdel(board.key, self._record)
                    return False
                if final:
                    await board.outbox.redis.hdel(board.key, self._record)
                return True
            return False

    async def _token(self) -> bool:
        """Take a token of the chat's edit budget if one is there now."""
        board = self._board
        return board.buckets is None or await board.buckets.try_edit(board.conversation, board.caps)

    async def _final_token(self, *, poll: bool) -> bool:
        """Wait up to :data:`FINAL_TOKEN_WAIT_S` for an edit token (``poll``), then take a send token instead.

        Only the local budgets are skipped (the edit budget, and the chat's send pacing: a wait no longer than one
        token's interval). A longer wait is the platform's hold on the chat, and is waited out, up to
        :data:`FINAL_HOLD_WAIT_S` (``False``: still held after that).
        """
        board = self._board
        if board.buckets is None:
            return True
        step, waited = 0.25, 0.0
        while poll and not await board.buckets.try_edit(board.conversation, board.caps):
            if waited >= FINAL_TOKEN_WAIT_S:
                break
            await board.sleep(step)
            waited += step
        else:
            if poll:
                return True
        pacing = max(_interval(board.caps.chat_rate), _interval(board.caps.bot_rate))
        held = 0.0
        while (wait := await board.buckets.take(board.conversation, board.caps)) > pacing:
            if held + wait > FINAL_HOLD_WAIT_S:
                logger.info("%s chat held past the final edit's wait; not edited", board.conversation.channel)
                return False
            await board.sleep(wait)
            held += wait
        return True


def _interval(rate: Rate) -> float:
    """Seconds between two tokens of ``rate`` once its burst is spent (0: no limit)."""
    return 1.0 / rate.per_s if rate.per_s > 0 and rate.burst > 0 else 0.0
