"""Idempotency records of write effects in Redis: the queue layer's :class:`~switchboard.core.effects.EffectStore`.

One STRING per effect (:meth:`SessionKeys.effect`), holding the arguments hash, the status and the recorded
outcome, kept for :data:`~switchboard.core.effects.EFFECT_TTL_S` (longer than any retry of a turn). Both
writes are Lua scripts fenced by the session lease: a zombie worker can neither claim nor record an effect.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from switchboard.core.effects import EFFECT_TTL_S, EffectRecord
from switchboard.queue import scripts
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.types import SessionKey

__all__ = ["RedisEffects"]

_GLOBAL = GlobalKeys()


class RedisEffects:
    """The effect records of one session, written under one lease token."""

    def __init__(
        self, redis: aioredis.Redis, session: SessionKey, token: str, epoch: int, *, ttl_s: int = EFFECT_TTL_S
    ) -> None:
        self.redis = redis
        self.session = session
        self.token = token
        self.epoch = epoch
        self.ttl_ms = ttl_s * 1000
        self._keys = SessionKeys(session)

    async def effect_begin(self, key: str, record: EffectRecord) -> EffectRecord | None:
        """Claim ``key`` with ``record``; returns the existing record instead when there is one."""
        found = await scripts.EFFECT_BEGIN(
            self.redis,
            [self._keys.lease, _GLOBAL.fenced_rejections, self._keys.effect(key)],
            [self.token, record.to_json(), self.ttl_ms],
            session=self.session,
            epoch=self.epoch,
        )
        return EffectRecord.from_json(found) if found else None

    async def effect_finish(self, key: str, record: EffectRecord | None) -> None:
        """Store the finished ``record`` under ``key``, or release the claim (``None``) after a failure."""
        await scripts.EFFECT_FINISH(
            self.redis,
            [self._keys.lease, _GLOBAL.fenced_rejections, self._keys.effect(key)],
            [self.token, record.to_json() if record is not None else "", self.ttl_ms],
            session=self.session,
            epoch=self.epoch,
        )
