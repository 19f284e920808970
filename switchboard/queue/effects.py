"""Idempotency records of write effects in Redis: the queue layer's effect store.

:class:`~switchboard.core.tools.effects.EffectStore` on Redis: one key per effect, kept longer than any retry of a
turn, written only by scripts fenced by the session lease. An effect in doubt is indexed for reconciliation in its
tenant's list and never performed again automatically.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis

from switchboard.core.tools.effects import EFFECT_TTL_S, EffectRecord
from switchboard.queue import scripts
from switchboard.queue.keys import SessionKeys, tenant_of
from switchboard.types import SessionKey

__all__ = ["RedisEffects", "doubt_field"]


def doubt_field(session: SessionKey, key: str) -> str:
    """The ``<session>|<effect key>`` field of an effect in its tenant's reconciliation index."""
    return f"{session}|{key}"


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
            [self._keys.lease, self._keys.fenced_rejections, self._keys.effect(key)],
            [self.token, record.to_json(), self.ttl_ms],
            session=self.session,
            epoch=self.epoch,
        )
        return EffectRecord.from_json(found) if found else None

    async def effect_finish(self, key: str, record: EffectRecord | None) -> None:
        """Store the finished ``record`` under ``key``, or release the claim (``None``) after a failure."""
        await scripts.EFFECT_FINISH(
            self.redis,
            [self._keys.lease, self._keys.fenced_rejections, self._keys.effect(key)],
            [self.token, record.to_json() if record is not None else "", self.ttl_ms],
            session=self.session,
            epoch=self.epoch,
        )

    async def effect_doubt(self, key: str, record: EffectRecord, info: Mapping[str, Any]) -> None:
        """Route the effect under ``key`` (``started``, no result) to reconciliation; the first report is kept.

        ``info`` says what is known (the tool, the run, why it is in doubt); it must hold no secrets.
        """
        entry = {
            "session": self.session,
            "key": key,
            "record": json.loads(record.to_json()),
            "info": dict(info),
            "at": time.time(),
        }
        await scripts.EFFECT_DOUBT(
            self.redis,
            [
                self._keys.lease,
                self._keys.fenced_rejections,
                self._keys.shard.effects_in_doubt(tenant_of(self.session)),
            ],
            [self.token, doubt_field(self.session, key), json.dumps(entry, separators=(",", ":"), default=str)],
            session=self.session,
            epoch=self.epoch,
        )
