"""⑤ Outbound rate limits: token buckets in Redis, per bot account and per chat, shared by every worker.

Every send takes a token from its account's and its chat's bucket (:meth:`SendBuckets.pace`), so however many
workers send for one bot, the platform sees at most the declared rate; waits are bounded. Streaming edits use a
separate edit budget and are never waited for, and a platform 429 holds the chat's buckets for every worker. The
buckets are GCRA meters on the server's clock: an idle bucket is no key at all.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from switchboard.channels.base import Capabilities, Rate
from switchboard.core.messages import ConversationRef
from switchboard.errors import RateLimitedError
from switchboard.queue import scripts
from switchboard.queue.keys import GlobalKeys

__all__ = ["PACE_MAX_WAIT_S", "SendBuckets", "bucket_args"]

logger = logging.getLogger(__name__)

PACE_MAX_WAIT_S = 30.0
"""The longest one send waits for a token before it counts as rate-limited (and the outbox's retries take over)."""

_EDITS_REMEMBERED = 10_000
"""Chats whose edit refusal is remembered at once (past it, the ones whose wait is over are forgotten)."""

_GLOBAL = GlobalKeys()


def bucket_args(rate: Rate) -> tuple[int, float]:
    """A rate as a GCRA meter's ``(limit, period_ms)``: ``burst`` tokens, refilled at ``per_s`` a second.

    A rate of zero or less (or no burst) is no limit.
    """
    if rate.per_s <= 0 or rate.burst <= 0:
        return 0, 1.0
    return rate.burst, rate.burst * 1000.0 / rate.per_s


def _unlimited(args: list[float]) -> bool:
    """Whether every bucket of a ``(limit, period)`` list is no limit (then there is nothing to ask Redis)."""
    return all(limit <= 0 for limit in args[::2])


def _chat(conversation: ConversationRef) -> str:
    """The chat a conversation's sends land in (Telegram forum topics of one chat share the chat's limit)."""
    return conversation.extra.get("chat_id") or conversation.conversation


class SendBuckets:
    """The shared outbound buckets, over one Redis client."""

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        max_wait_s: float = PACE_MAX_WAIT_S,
    ) -> None:
        self.redis = redis
        self.max_wait_s = max_wait_s
        self._sleep = sleep
        self.waited_s = 0.0
        """Seconds spent waiting for tokens so far (a figure for tests and benchmarks)."""
        self._edits_after: dict[str, float] = {}
        """Edit budget key → the monotonic time before which it has no token (as its last refusal said)."""

    def _send_buckets(self, conversation: ConversationRef, caps: Capabilities) -> tuple[list[str], list[float]]:
        channel, account = conversation.channel, conversation.account
        keys = [_GLOBAL.send_rate(channel, account), _GLOBAL.chat_send_rate(channel, account, _chat(conversation))]
        args: list[float] = []
        for rate in (caps.bot_rate, caps.chat_rate):
            args += bucket_args(rate)
        return keys, args

    async def take(self, conversation: ConversationRef, caps: Capabilities) -> float:
        """Take a send token from the account's and the chat's buckets: 0, or the seconds to wait (none taken)."""
        keys, args = self._send_buckets(conversation, caps)
        if _unlimited(args):
            return 0.0
        wait_ms = await scripts.BUCKET_TAKE(self.redis, keys, args)
        return int(wait_ms) / 1000.0

    async def pace(self, conversation: ConversationRef, caps: Capabilities) -> None:
        """Wait until a send token is taken (sleeping between tries, never blocking the event loop).

        Raises:
            RateLimitedError: the buckets would make this send wait past ``max_wait_s`` in all.
        """
        waited = 0.0
        while (wait := await self.take(conversation, caps)) > 0:
            if waited + wait > self.max_wait_s:
                raise RateLimitedError(
                    f"{conversation.channel} send buckets are empty for {wait:.1f} s more",
                    channel=conversation.channel,
                    retry_after=wait,
                )
            await self._sleep(wait)
            waited += wait
            self.waited_s += wait

    async def try_edit(self, conversation: ConversationRef, caps: Capabilities) -> bool:
        """Take a token of the chat's edit budget if one is there now, never waiting.

        A streamed edit is a call into the chat too: it takes a token of the account's and the chat's send buckets
        in the same step (all three or none), so streaming never pushes the chat's sends past their rate.

        A refusal's wait is remembered here: until it has passed no bucket can have a token again (other workers only
        take more), so the deltas meanwhile are refused without asking Redis.
        """
        keys, args = self._send_buckets(conversation, caps)
        edit_key = _GLOBAL.chat_edit_rate(conversation.channel, conversation.account, _chat(conversation))
        keys.append(edit_key)
        args += bucket_args(caps.edit_rate)
        if _unlimited(args):
            return True
        now = time.monotonic()
        if self._edits_after.get(edit_key, 0.0) > now:
            return False
        wait_ms = int(await scripts.BUCKET_TAKE(self.redis, keys, args))
        if wait_ms <= 0:
            return True
        if len(self._edits_after) >= _EDITS_REMEMBERED:
            self._edits_after = {k: t for k, t in self._edits_after.items() if t > now}
        self._edits_after[edit_key] = now + wait_ms / 1000.0
        return False

    async def hold(self, conversation: ConversationRef, caps: Capabilities, seconds: float) -> None:
        """The platform asked the chat to wait ``seconds``: no send or edit into it from any worker until then."""
        channel, account = conversation.channel, conversation.account
        chat = _chat(conversation)
        keys = [_GLOBAL.chat_send_rate(channel, account, chat), _GLOBAL.chat_edit_rate(channel, account, chat)]
        args: list[float] = [max(0.0, seconds) * 1000.0]
        for rate in (caps.chat_rate, caps.edit_rate):
            args += bucket_args(rate)
        await scripts.BUCKET_HOLD(self.redis, keys, args)
        logger.info("%s chat held %.1f s at the platform's request", channel, seconds)
