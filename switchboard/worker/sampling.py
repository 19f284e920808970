"""Production sampling: a configured fraction of finished runs is queued for review (``SWITCHBOARD_EVALS__*``).

The draw is made in Python; only a sampled run costs Redis anything (one round trip). A tenant that opted out is never
drawn. A failure to queue a sample is logged and forgotten: review is best effort, the run is done.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from urllib.parse import unquote

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard.core.turn import HistoryEntry
from switchboard.queue.review import ReviewQueue, ReviewSample
from switchboard.settings.evals import EvalSettings
from switchboard.types import SessionKey

__all__ = ["Sampler"]

logger = logging.getLogger(__name__)


class Sampler:
    """Draws finished runs for review at the configured rates."""

    def __init__(
        self, redis: aioredis.Redis, settings: EvalSettings, *, draw: Callable[[], float] = random.random
    ) -> None:
        self.settings = settings
        self.queue = ReviewQueue(redis, max_per_tenant=settings.max_per_tenant)
        self._draw = draw

    @classmethod
    def build(cls, redis: aioredis.Redis, settings: EvalSettings) -> Sampler | None:
        """A sampler, or ``None`` when every rate is 0 (a run then does nothing more)."""
        return cls(redis, settings) if settings.sampling else None

    def wanted(self, tenant: str, agent: str) -> bool:
        """Whether this run of ``agent`` in ``tenant`` is drawn (never for a tenant that opted out)."""
        rate = self.settings.rate(tenant, agent)
        return rate > 0 and self._draw() < rate

    async def finished(
        self, session: SessionKey, run_id: str, *, steps: int, work: Sequence[HistoryEntry], answered: bool
    ) -> bool:
        """Queue the run of ``session`` for review when drawn; whether it was."""
        tenant, agent, channel = (unquote(part) for part in session.split("/")[:3])
        if not self.wanted(tenant, agent):
            return False
        tools = [
            str(call.get("name", ""))
            for entry in work
            if entry.role == "assistant"
            for call in entry.meta.get("tool_calls", [])
        ]
        sample = ReviewSample(
            run_id=run_id,
            session=session,
            tenant=tenant,
            agent=agent,
            channel=channel,
            steps=steps,
            tools=tools,
            answered=answered,
        )
        try:
            await self.queue.add(sample)
        except (RedisError, OSError) as err:
            logger.warning("a sampled run of %s was not queued for review: %s", agent, err)
            return False
        return True
