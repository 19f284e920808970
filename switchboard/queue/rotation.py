"""Key rotation of what Redis holds sealed: history entries and approval records not under the current data key.

Each value is re-sealed in place only if it is still the value read (a history entry is found again by its value, an
approval record is replaced under ``WATCH``), so a concurrent writer is never overwritten; what moved is picked up by
the next run. A dry run only counts.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING

from redis.exceptions import WatchError

from switchboard.core.sealing import Keyring
from switchboard.queue.keys import GlobalKeys, SessionKeys, session_in
from switchboard.queue.sealed import APPROVAL_CONTEXT, history_context
from switchboard.types import SessionKey

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = ["rotate_redis"]

logger = logging.getLogger(__name__)

_KEYS = GlobalKeys()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def rotate_redis(redis: aioredis.Redis, keyring: Keyring, *, dry_run: bool = False) -> Counter[str]:
    """Re-seal with the current key every history entry and approval record that is plain or under an older key.

    Returns counts per store (``history``, ``approvals``).

    Raises:
        SealError: a value is sealed with a key no longer listed (nothing of it changed).
    """
    counts: Counter[str] = Counter()
    async for raw in redis.scan_iter(match=_KEYS.every_session, count=1000):
        key = _text(raw)
        session = session_in(key)
        if session is None:
            continue
        keys = SessionKeys(SessionKey(session))
        if key == keys.history:
            counts["history"] += await _rotate_list(redis, key, keyring, history_context(session), dry_run)
        elif key.startswith(keys.approval("")):
            counts["approvals"] += await _rotate_field(redis, key, "record", keyring, APPROVAL_CONTEXT, dry_run)
    if not dry_run and counts:
        logger.info("re-sealed under key %s: %s", keyring.current, dict(counts))
    return counts


async def _rotate_list(redis: aioredis.Redis, key: str, keyring: Keyring, context: str, dry_run: bool) -> int:
    async with redis.pipeline(transaction=True) as pipe:
        while True:
            try:
                await pipe.watch(key)
                values = [_text(v) for v in await pipe.lrange(key, 0, -1)]
                stale = [i for i, v in enumerate(values) if keyring.needs_rotation(v)]
                if stale and not dry_run:
                    fresh = {i: keyring.reseal(values[i], context) for i in stale}
                    pipe.multi()  # type: ignore[no-untyped-call]
                    for index, value in fresh.items():
                        pipe.lset(key, index, value)
                    await pipe.execute()
                else:
                    await pipe.reset()  # type: ignore[no-untyped-call]
                return len(stale)
            except WatchError:
                continue


async def _rotate_field(
    redis: aioredis.Redis, key: str, name: str, keyring: Keyring, context: str, dry_run: bool
) -> int:
    async with redis.pipeline(transaction=True) as pipe:
        while True:
            try:
                await pipe.watch(key)
                raw = await pipe.hget(key, name)
                if raw is None or not keyring.needs_rotation(_text(raw)):
                    await pipe.reset()  # type: ignore[no-untyped-call]
                    return 0
                if not dry_run:
                    fresh = keyring.reseal(_text(raw), context)
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.hset(key, name, fresh)
                    await pipe.execute()
                else:
                    await pipe.reset()  # type: ignore[no-untyped-call]
                return 1
            except WatchError:
                continue
