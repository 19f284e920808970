"""One person across channels: a tenant's registry of which principals (``telegram:42``, ``slack:U123``) are one person.

Principals are linked only by an operator (``switchboard people link``, the console) or by the person themself with a
one-time code asked for on one account and sent from the other, so both sides are proven by the channels' own
verified webhooks; nothing is ever linked by matching names, phone numbers or anything else (``docs/identity.md``).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import redis.asyncio as aioredis

from switchboard.core.events import EventAdapter, PersonLinked, PersonUnlinked
from switchboard.errors import ConfigError
from switchboard.queue import scripts
from switchboard.queue.keys import GlobalKeys

__all__ = [
    "LINK_CODE_DIGITS",
    "TENANT_WRONG_CODES_PER_HOUR",
    "LinkRefused",
    "People",
    "check_person",
    "check_principal",
]

LINK_CODE_DIGITS: Final = 8
"""Digits of a ``/link`` code (with a few tries an hour per principal, guessing one is hopeless)."""
TENANT_WRONG_CODES_PER_HOUR: Final = 50
"""Wrong ``/link`` codes one tenant takes in an hour from all its accounts together (new accounts cost nothing on an
open bot, so a cap per account alone would not stop guessing)."""
LOG_CAP: Final = 10_000
"""Approximate length of a tenant's link/unlink log."""
_PERSON = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
_PRINCIPAL = re.compile(r"[a-z][a-z0-9_]{0,31}:[^\s]{1,200}")
_KEYS = GlobalKeys()


def check_person(person: str) -> str:
    """``person`` if it is a valid person id (lower case letters, digits, ``_.-``), else a clear error."""
    if not _PERSON.fullmatch(person):
        raise ConfigError(f"person id {person!r}: use 1-64 lower case letters, digits, '_', '.' or '-'", field="person")
    return person


def check_principal(principal: str) -> str:
    """``principal`` if it reads ``<channel>:<sender id>``, else a clear error."""
    if not _PRINCIPAL.fullmatch(principal) or principal.startswith(("console:", "person:")):
        raise ConfigError(
            f"principal {principal!r}: write it as <channel>:<sender id>, e.g. telegram:42", field="principal"
        )
    return principal


@dataclass(frozen=True, slots=True)
class LinkRefused:
    """Why a link was not made (shown to whoever asked; nothing was written)."""

    reason: str


def _code_hash(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


class People:
    """A tenant-scoped registry of linked principals, in Redis."""

    def __init__(self, redis: aioredis.Redis, *, clock: Callable[[], float] = time.time) -> None:
        self.redis = redis
        self.clock = clock

    async def person_of(self, tenant: str, principal: str) -> str | None:
        """The person ``principal`` is linked to, if any (one ``HGET``)."""
        found = await self.redis.hget(_KEYS.people(tenant), principal)
        return found.decode() if isinstance(found, bytes) else found

    async def everyone(self, tenant: str) -> dict[str, list[str]]:
        """Each person of ``tenant`` and their principals, sorted."""
        raw: Any = await self.redis.hgetall(_KEYS.people(tenant))
        out: dict[str, list[str]] = {}
        for principal, person in sorted((k.decode(), v.decode()) for k, v in raw.items()):
            out.setdefault(person, []).append(principal)
        return dict(sorted(out.items()))

    async def link(self, tenant: str, principals: Sequence[str], person: str, *, by: str) -> PersonLinked | LinkRefused:
        """Link ``principals`` to ``person``: all of them, or none when one already belongs to someone else."""
        check_person(person)
        principals = tuple(dict.fromkeys(check_principal(p) for p in principals))
        if not principals:
            raise ConfigError("name at least one principal to link", field="principals")
        event = PersonLinked(at=self.clock(), tenant=tenant, person=person, principals=principals, by=by)
        result = await scripts.PEOPLE_LINK(
            self.redis,
            [_KEYS.people(tenant), _KEYS.people_log(tenant)],
            [person, LOG_CAP, EventAdapter.dump_json(event).decode(), *principals],
        )
        if int(result[0]) == 1:
            principal, other = (v.decode() if isinstance(v, bytes) else str(v) for v in result[1:3])
            return LinkRefused(f"{principal} is already linked to {other}: unlink it first")
        return event

    async def unlink(self, tenant: str, principal: str, *, by: str) -> PersonUnlinked | None:
        """Unlink ``principal`` from its person (``None``: it was not linked)."""
        check_principal(principal)
        template = PersonUnlinked(at=self.clock(), tenant=tenant, person="__PERSON__", principal=principal, by=by)
        person = await scripts.PEOPLE_UNLINK(
            self.redis,
            [_KEYS.people(tenant), _KEYS.people_log(tenant)],
            [principal, LOG_CAP, EventAdapter.dump_json(template).decode()],
        )
        if person is None:
            return None
        return template.model_copy(update={"person": person.decode() if isinstance(person, bytes) else str(person)})

    async def log(self, tenant: str, count: int = 100) -> list[PersonLinked | PersonUnlinked]:
        """The latest link and unlink facts of ``tenant``, newest first."""
        entries: Any = await self.redis.xrevrange(_KEYS.people_log(tenant), count=count)
        out: list[PersonLinked | PersonUnlinked] = []
        for _id, fields in entries:
            event = EventAdapter.validate_json(fields[b"data"])
            if isinstance(event, PersonLinked | PersonUnlinked):
                out.append(event)
        return out

    async def _spend_try(self, tenant: str, principal: str, per_hour: int) -> bool:
        """Count one code asked for or one code tried by ``principal``; ``False`` past ``per_hour``."""
        key = _KEYS.link_tries(tenant, principal)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.incr(key)
            pipe.expire(key, 3600, nx=True)
            count, _ = await pipe.execute()
        return int(count) <= per_hour

    async def issue_code(self, tenant: str, principal: str, *, ttl_s: int, per_hour: int) -> str | None:
        """A one-time code for ``principal`` to send from its other account (``None``: asked too often)."""
        check_principal(principal)
        if not await self._spend_try(tenant, principal, per_hour):
            return None
        record = json.dumps({"principal": principal})
        while True:  # a code equal to a live one must not replace it: its sender would be linked instead
            code = f"{secrets.randbelow(10**LINK_CODE_DIGITS):0{LINK_CODE_DIGITS}d}"
            if await self.redis.set(_KEYS.link_code(tenant, _code_hash(code)), record, ex=ttl_s, nx=True):
                return code

    async def redeem(
        self,
        tenant: str,
        principal: str,
        code: str,
        *,
        per_hour: int,
        tenant_per_hour: int = TENANT_WRONG_CODES_PER_HOUR,
    ) -> PersonLinked | LinkRefused:
        """Link ``principal`` with the account that asked for ``code`` (used once; wrong codes count as tries).

        Wrong codes count per account and for the whole tenant: past ``tenant_per_hour`` of them, no code is taken
        from any account of the tenant for the rest of that hour (an operator can still link).
        """
        check_principal(principal)
        if not await self._spend_try(tenant, principal, per_hour):
            return LinkRefused("Too many link attempts from this account; try again in an hour.")
        wrong_key = _KEYS.link_wrong(tenant)
        if int(await self.redis.get(wrong_key) or 0) >= tenant_per_hour:
            return LinkRefused("Too many wrong link codes were sent here lately; try again in an hour.")
        digits = "".join(c for c in code if c.isdigit())
        raw = await self.redis.getdel(_KEYS.link_code(tenant, _code_hash(digits))) if digits else None
        if raw is None:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.incr(wrong_key)
                pipe.expire(wrong_key, 3600, nx=True)
                await pipe.execute()
            return LinkRefused("That code is wrong or has expired. Send /link on your other account for a new one.")
        first = str(json.loads(raw)["principal"])
        if first == principal:
            return LinkRefused("Send the code from your other account, not the one that asked for it.")
        person = await self.person_of(tenant, first) or await self.person_of(tenant, principal)
        if person is None:
            person = f"p-{secrets.token_hex(6)}"
        return await self.link(tenant, [first, principal], person, by="code")
