"""Telegram long polling (``getUpdates``): the transport for hosts without a public HTTPS URL.

The offset moves past an update only after ``emit`` returned, i.e. after the ingest durably accepted it, since
Telegram forgets an update once a later call passes it. A malformed update is logged and passed over, errors back
off, and a 409 deletes the webhook again or waits. Exactly one poller per bot runs across all processes.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any, Final

from pydantic import ValidationError

from switchboard.channels.base import Emit, Inbound
from switchboard.channels.telegram.api import BotApi, BotApiRefusal
from switchboard.core.messages import InboundMessage
from switchboard.errors import DeliveryError, RateLimitedError

__all__ = ["ALLOWED_UPDATES", "TelegramPoller"]

logger = logging.getLogger(__name__)

ALLOWED_UPDATES: Final = ["message", "edited_message", "callback_query"]
"""The update kinds the gateway reads (Telegram filters the rest out)."""
_BATCH: Final = 100
_MOST_429_WAIT_S: Final = 60.0
"""The longest a 429 on ``getUpdates`` pauses polling, whatever ``retry_after`` it names."""


class TelegramPoller:
    """A :class:`~switchboard.channels.base.Listener` that long-polls ``getUpdates`` for one bot.

    Args:
        client: Returns the account's Bot API client.
        read: Turns one ``Update`` (decoded JSON) into drafts; raises ``ValidationError`` for a malformed one.
        account: The account name (for logs).
        poll_timeout: Seconds Telegram holds a ``getUpdates`` call open when nothing is waiting.
        backoff: ``(first, most)`` seconds to wait after consecutive failures.
    """

    def __init__(
        self,
        client: Callable[[], BotApi],
        read: Callable[[Any], list[InboundMessage]],
        *,
        account: str,
        poll_timeout: float = 25.0,
        backoff: tuple[float, float] = (1.0, 30.0),
    ) -> None:
        self._client = client
        self._read = read
        self._account = account
        self._poll_timeout = poll_timeout
        self._backoff = backoff
        self.offset: int | None = None
        """The next ``update_id`` to ask for: every update before it was durably accepted (or unreadable)."""

    async def listen(self, emit: Emit) -> None:
        """Poll until cancelled; transient failures back off and retry by themselves."""
        failures = 0
        webhook_deleted = False
        while True:
            try:
                if not webhook_deleted:
                    await self._client().call("deleteWebhook", {"drop_pending_updates": False})
                    webhook_deleted = True
                    logger.info("telegram account %s: polling for updates", self._account)
                updates = await self._poll()
                for update in updates:
                    await self._handle(update, emit)
                failures = 0
            except asyncio.CancelledError:
                raise
            except RateLimitedError as exc:
                wait = min(max(exc.retry_after, self._backoff[0]), _MOST_429_WAIT_S)  # early: one more 429 at most
                logger.warning("telegram account %s: getUpdates waits %.0f s (429)", self._account, wait)
                await asyncio.sleep(wait)
            except BotApiRefusal as exc:
                if exc.status == 409 and "webhook" in exc.description.lower():
                    webhook_deleted = False  # someone set a webhook again: polling is what is configured
                failures += 1
                logger.warning("telegram account %s: polling refused: %s", self._account, exc.description)
                await asyncio.sleep(self._delay(failures))
            except Exception as exc:  # the poller outlives any failure: it backs off and retries
                failures += 1
                logger.warning(
                    "telegram account %s: polling failed (%s: %s); retrying", self._account, type(exc).__name__, exc
                )
                await asyncio.sleep(self._delay(failures))

    def _delay(self, failures: int) -> float:
        first, most = self._backoff
        return float(min(most, first * 2 ** min(failures - 1, 16)) * random.uniform(0.5, 1.0))

    async def _poll(self) -> list[Any]:
        params: dict[str, Any] = {
            "offset": self.offset,
            "limit": _BATCH,
            "timeout": int(self._poll_timeout),
            "allowed_updates": ALLOWED_UPDATES,
        }
        result = await self._client().call("getUpdates", params, wait_s=self._poll_timeout + 15)
        if not isinstance(result, list):
            raise DeliveryError("telegram answered getUpdates without a list", channel="telegram")
        return result

    async def _handle(self, update: Any, emit: Emit) -> None:
        """Emit one update's drafts, then move the offset past it (never before the router accepted them)."""
        update_id = update.get("update_id") if isinstance(update, dict) else None
        if not isinstance(update_id, int) or isinstance(update_id, bool) or update_id < 0:
            logger.warning("telegram account %s: getUpdates returned an update without an id", self._account)
            return
        if self.offset is not None and update_id < self.offset:
            return  # already accepted (Telegram resent it before our confirmation reached it)
        try:
            drafts = self._read(update)
        except ValidationError as err:
            logger.warning(
                "telegram account %s: update %d is malformed and skipped: %s",
                self._account,
                update_id,
                err.errors()[0]["msg"],
            )
            drafts = []
        if drafts:
            await emit(Inbound(messages=tuple(drafts)))
        else:
            await self._answer_dropped_tap(update)
        self.offset = update_id + 1

    async def _answer_dropped_tap(self, update: dict[str, Any]) -> None:
        """Stop the spinner of a tap no turn will answer (a game's, an inline-mode message's); best effort."""
        query = update.get("callback_query")
        query_id = query.get("id") if isinstance(query, dict) else None
        if not isinstance(query_id, str) or not query_id:
            return
        try:
            await self._client().call("answerCallbackQuery", {"callback_query_id": query_id})
        except DeliveryError as err:
            logger.info("telegram account %s: a dropped tap was not answered: %s", self._account, type(err).__name__)
