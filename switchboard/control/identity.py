"""Operators linking and unlinking one person's principals, checked against the tenants they may act on."""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis

from switchboard.control.scope import InvalidRequestError, NotFoundError, OperatorScope, OutOfScopeError
from switchboard.core.events import PersonLinked, PersonUnlinked
from switchboard.errors import ConfigError
from switchboard.queue.people import LinkRefused, People

__all__ = ["link_people", "unlink_person"]


def _check(scope: OperatorScope, tenant: str) -> None:
    if not tenant:
        raise InvalidRequestError("name the tenant")
    if not scope.allows(tenant):
        raise OutOfScopeError(f"tenant {tenant!r} is not one of yours")


async def link_people(
    redis: aioredis.Redis, scope: OperatorScope, tenant: str, principals: Sequence[str], person: str
) -> PersonLinked:
    """Link ``principals`` of ``tenant`` to ``person`` (all or none), as the operator of ``scope``."""
    _check(scope, tenant)
    try:
        done = await People(redis).link(tenant, principals, person, by=f"operator:{scope.operator}")
    except ConfigError as err:
        raise InvalidRequestError(str(err)) from None
    if isinstance(done, LinkRefused):
        raise InvalidRequestError(done.reason)
    return done


async def unlink_person(redis: aioredis.Redis, scope: OperatorScope, tenant: str, principal: str) -> PersonUnlinked:
    """Take ``principal`` out of its person, as the operator of ``scope``."""
    _check(scope, tenant)
    try:
        gone = await People(redis).unlink(tenant, principal, by=f"operator:{scope.operator}")
    except ConfigError as err:
        raise InvalidRequestError(str(err)) from None
    if gone is None:
        raise NotFoundError(f"{principal} is not linked")
    return gone
