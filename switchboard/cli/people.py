"""``switchboard people list|link|unlink`` and ``switchboard budgets``: linked identities and period spend, by hand.

An operator links principals that are one person (``people link telegram:42 slack:U123 --as alice``); the person's
budgets, and the ``person`` a turn's policy sees, then follow them across channels (``docs/identity.md``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from switchboard.cli.sessions import redis_url_for, with_redis
from switchboard.errors import ConfigError
from switchboard.settings import Settings

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = ["budgets_command", "people_command"]


def people_command(
    settings: Settings, action: str, principals: Sequence[str], person: str | None, tenant: str | None
) -> int:
    """Run one ``people`` subcommand; returns the exit code."""
    from switchboard.core.events import PersonLinked
    from switchboard.queue.people import LinkRefused, People, check_person, check_principal

    tenant = tenant or settings.file.tenant
    try:
        if action == "link":
            if person is None or len(principals) < 1:
                raise ConfigError("`people link` needs principals and --as PERSON", field="person")
            check_person(person)
        for principal in principals:
            check_principal(principal)
    except ConfigError as err:
        print(f"switchboard: {err}", file=sys.stderr)
        return 2

    async def go(redis: aioredis.Redis) -> int:
        people = People(redis)
        if action == "list":
            everyone = await people.everyone(tenant)
            if not everyone:
                print(f"no linked people in tenant {tenant}")
            for name, linked in everyone.items():
                print(f"{name}\t{' '.join(linked)}")
            return 0
        if action == "link":
            assert person is not None
            done = await people.link(tenant, principals, person, by="cli")
            if isinstance(done, LinkRefused):
                print(f"switchboard: not linked: {done.reason}", file=sys.stderr)
                return 1
            assert isinstance(done, PersonLinked)
            print(f"linked {' '.join(done.principals)} as {done.person} (tenant {tenant})")
            return 0
        status = 0
        for principal in principals:
            gone = await people.unlink(tenant, principal, by="cli")
            if gone is None:
                print(f"switchboard: {principal} is not linked", file=sys.stderr)
                status = 1
            else:
                print(f"unlinked {principal} from {gone.person}")
        return status

    return with_redis(redis_url_for(settings), go)


def budgets_command(settings: Settings, tenant: str | None) -> int:
    """``budgets``: each live period counter of the tenant, its spend against its budget and the alerts reported."""
    from switchboard.queue.budgets import Budgets

    tenant = tenant or settings.file.tenant

    async def go(redis: aioredis.Redis) -> int:
        rows = await Budgets(redis, settings.file.budgets).live(tenant)
        if not settings.file.budgets:
            print("no budgets configured (budgets: in the YAML file)")
        for row in rows:
            alerts = ",".join(f"{a:g}" for a in row.alerts) or "-"
            print(f"{row.scope}\t{row.subject}\t{row.period}\t{row.spent:g}/{row.credits:g}\talerts {alerts}")
        return 0

    return with_redis(redis_url_for(settings), go)
