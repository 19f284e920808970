"""The review queue: finished runs sampled in production, per tenant, and the reviewers' verdicts on them.

A sample holds ids and counts only (session, run, agent, channel, steps, the tools called), never words: a reviewer
reads the run's transcript from the session itself, through the control service, which withholds the words from
whoever may not read them. Each tenant's list is capped (the oldest samples go first); a verdict is kept while its
sample is.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

import redis.asyncio as aioredis
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.segments import SegmentLabels, review_field
from switchboard.types import SessionKey

__all__ = ["MAX_NOTE_CHARS", "ReviewQueue", "ReviewSample", "ReviewVerdict"]

MAX_NOTE_CHARS = 2000
"""Longest note a reviewer may leave with a verdict."""
_KEYS = GlobalKeys()


class ReviewSample(BaseModel):
    """One finished run queued for review."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    session: str
    tenant: str
    agent: str
    channel: str
    at: float = Field(default_factory=time.time)
    steps: int = 0
    tools: list[str] = Field(default_factory=list)
    """The tools the run called, in order (names only)."""
    answered: bool = True
    """Whether the run ended with an answer to the user."""

    @property
    def member(self) -> str:
        """The sample's id in its tenant's verdicts (run ids are per session)."""
        return f"{self.session}|{self.run_id}"


class ReviewVerdict(BaseModel):
    """A reviewer's judgement of one sampled run."""

    model_config = ConfigDict(frozen=True)

    verdict: Literal["pass", "fail"]
    note: str = Field("", max_length=MAX_NOTE_CHARS)
    by: str
    at: float = Field(default_factory=time.time)


class ReviewQueue:
    """The sampled runs of every tenant, each tenant's list capped at ``max_per_tenant``."""

    def __init__(
        self, redis: aioredis.Redis, *, max_per_tenant: int = 500, labels: SegmentLabels | None = None
    ) -> None:
        self.redis = redis
        self.max_per_tenant = max_per_tenant
        self.labels = labels or SegmentLabels.of(None)
        """Label values of the verdict counters (``/metrics``): the configuration's names, the rest ``other``."""

    async def add(self, sample: ReviewSample) -> None:
        """Queue ``sample`` (one round trip: the push and the trim)."""
        key = _KEYS.review_runs(sample.tenant)
        pipe = self.redis.pipeline(transaction=False)
        pipe.lpush(key, sample.model_dump_json())
        pipe.ltrim(key, 0, self.max_per_tenant - 1)
        await pipe.execute()

    async def samples(self, tenant: str, *, limit: int = 100) -> list[tuple[ReviewSample, ReviewVerdict | None]]:
        """The tenant's newest ``limit`` samples with their verdicts (an unreadable entry is skipped)."""
        raw = await self.redis.lrange(_KEYS.review_runs(tenant), 0, max(1, limit) - 1)
        found = [s for s in (_sample(item) for item in raw) if s is not None]
        if not found:
            return []
        verdicts = await self.redis.hmget(_KEYS.review_verdicts(tenant), [s.member for s in found])
        return [(s, _verdict(v)) for s, v in zip(found, verdicts, strict=True)]

    async def find(self, tenant: str, session: str, run_id: str) -> ReviewSample | None:
        """The sample of ``run_id`` of ``session``, if still queued."""
        for item in await self.redis.lrange(_KEYS.review_runs(tenant), 0, -1):
            sample = _sample(item)
            if sample is not None and sample.session == session and sample.run_id == run_id:
                return sample
        return None

    async def judge(self, sample: ReviewSample, verdict: ReviewVerdict) -> None:
        """Keep ``verdict`` on ``sample``; verdicts of samples trimmed off the list are dropped with it.

        A run's first verdict is also counted by agent and tenant (a changed mind replaces the verdict kept, not the
        count: the counter only grows).
        """
        key = _KEYS.review_verdicts(sample.tenant)
        if await self.redis.hset(key, sample.member, verdict.model_dump_json()):
            counted = review_field(self.labels, sample.agent, sample.tenant, verdict.verdict)
            await self.redis.hincrby(SessionKeys(SessionKey(sample.session)).shard.stats, counted, 1)
        listed = {
            s.member
            for s in (_sample(i) for i in await self.redis.lrange(_KEYS.review_runs(sample.tenant), 0, -1))
            if s
        }
        stale = [m for m in await self.redis.hkeys(key) if _text(m) not in listed]
        if stale:
            await self.redis.hdel(key, *stale)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _sample(raw: Any) -> ReviewSample | None:
    try:
        return ReviewSample.model_validate_json(raw)
    except (ValidationError, ValueError):
        return None


def _verdict(raw: Any) -> ReviewVerdict | None:
    if raw is None:
        return None
    try:
        return ReviewVerdict.model_validate(json.loads(raw))
    except (ValidationError, ValueError):
        return None
