"""``switchboard access approve CODE | list | revoke PRINCIPAL``: pairing, the operators' side.

A sender refused in ``pairing`` mode was given a one-time code; the operator approves it here (or in the console),
and the sender's next message is answered. The commands search every tenant the YAML file names unless ``--tenant``
is given. What is done is signed ``console:<--operator>`` (default: the login name) in the session's event log.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from switchboard.core.access import Role
from switchboard.settings import Settings

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = ["access_command"]


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def access_command(
    settings: Settings,
    action: str,
    target: str | None,
    *,
    tenant: str | None,
    role: Role | None,
    operator: str | None,
) -> int:
    """Run ``access approve|list|revoke``; returns the exit code (1: nothing matched, 2: usage)."""
    from switchboard.cli.control import operator_principal
    from switchboard.cli.sessions import redis_url_for, with_redis
    from switchboard.queue.access import PairingStore, known_tenants

    if action in ("approve", "revoke") and not target:
        print(f"switchboard: access {action} needs a {'code' if action == 'approve' else 'principal'}", file=sys.stderr)
        return 2
    tenants = [tenant] if tenant else known_tenants(settings.file)
    signed = operator_principal(operator)

    async def go(redis: aioredis.Redis) -> int:
        store = PairingStore(redis, events_maxlen=settings.queue.events_maxlen)
        if action == "approve":
            assert target is not None
            for name in tenants:
                paired = await store.approve(name, target, signed, role)
                if paired is not None:
                    print(f"paired {paired.principal} as {paired.role or 'the default role'} (tenant {name})")
                    return 0
            print(f"switchboard: no live pairing code {target!r} (expired, used, or mistyped)", file=sys.stderr)
            return 1
        if action == "revoke":
            assert target is not None
            revoked = [name for name in tenants if await store.revoke(name, target, signed)]
            if not revoked:
                print(f"switchboard: {target} is not paired (tenants: {', '.join(tenants)})", file=sys.stderr)
                return 1
            print(f"revoked {target} (tenant {', '.join(revoked)})")
            return 0
        for name in tenants:
            for entry in await store.paired(name):
                print(f"{name}\tpaired\t{entry.principal}\t{entry.role or 'default'}\t{_when(entry.at)}\t{entry.by}")
            for request in await store.requests(name):
                print(f"{name}\twaiting\t{request.principal}\t-\tcode valid until {_when(request.expires_at)}\t-")
        return 0

    return with_redis(redis_url_for(settings), go)
