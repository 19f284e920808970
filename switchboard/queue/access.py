"""③ Access control at ingest: who may talk to an agent, decided before a message is queued.

:class:`AccessGate` judges each routed message by its account's :class:`~switchboard.core.access.AccessRules`. An
admitted message gets its sender's role and the admitting rule stamped into ``meta`` (the worker's policy reads the
role; ingest records the rule with ``message_received``); a refused one is dropped before ingest (no run is queued,
no model asked), recorded as ``access_refused`` in its session's event log, and its sender answered at most once per
``pairing.notice_every_s``.

Redis commands per admitted message: ``open`` and ``allowlist`` none (the configuration decides); ``pairing`` none for
a sender the configuration admits or this process found paired less than ``pairing.recheck_s`` ago (the bound on how
long a revocation takes to bite), else one script call (``access_check.lua``), which also refuses an unknown sender
and issues its code. :class:`PairingStore` is the operators' side: approve a code, list, revoke.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, assert_never

import redis.asyncio as aioredis

from switchboard.core.access import (
    ROLE_META,
    RULE_META,
    AccessRules,
    Admitted,
    NeedsPairing,
    Refused,
    Role,
    judge,
    resolve_access,
    role_of,
)
from switchboard.core.events import AccessPaired, AccessRefused, AccessRevoked, Event, PairingCodeIssued
from switchboard.core.messages import ConversationRef, InboundMessage
from switchboard.queue import scripts
from switchboard.queue.eventlog import encode_event
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.settings import FileConfig
from switchboard.types import SessionKey

__all__ = [
    "CODE_ALPHABET",
    "AccessGate",
    "Notify",
    "Paired",
    "PairingRequest",
    "PairingStore",
    "access_problems",
    "code_digest",
    "known_tenants",
    "new_code",
    "normalise_code",
    "rules_from_config",
]

logger = logging.getLogger(__name__)

Notify = Callable[[ConversationRef, str], Awaitable[None]]
"""Send one text to a conversation outside any turn (the refusal answer); wired by the web tier to the adapters."""

CODE_ALPHABET: Final = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
"""32 letters and digits without the look-alikes (0/O, 1/I): six of them are 30 random bits."""
_CODE_LENGTH: Final = 6
_CACHE_MAX: Final = 65_536
_GLOBAL = GlobalKeys()


def new_code() -> str:
    """A fresh one-time pairing code, ``ABC-234`` (from :mod:`secrets`)."""
    raw = "".join(secrets.choice(CODE_ALPHABET) for _ in range(_CODE_LENGTH))
    return f"{raw[:3]}-{raw[3:]}"


def normalise_code(text: str) -> str:
    """A code as typed (any case, spaces or dashes) in its canonical ``ABC-234`` form; ``""`` when it cannot be one."""
    raw = "".join(ch for ch in text.upper() if ch not in " -_")
    if len(raw) != _CODE_LENGTH or any(ch not in CODE_ALPHABET for ch in raw):
        return ""
    return f"{raw[:3]}-{raw[3:]}"


def code_digest(code: str) -> str:
    """What Redis keeps of a code: its SHA-256 (a leaked key name or value reveals no code)."""
    return hashlib.sha256(code.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Paired:
    """A sender an operator paired."""

    principal: str
    role: Role | None
    """The role the operator chose (``None``: the account's ``pairing.role``)."""
    at: float
    by: str
    session: str


@dataclass(frozen=True, slots=True)
class PairingRequest:
    """An open pairing request: a sender holding a live code (the code itself is known only to the sender)."""

    principal: str
    expires_at: float


def _minutes(ms: float) -> str:
    minutes = max(1, round(ms / 60_000))
    if minutes % 60 == 0:
        hours = minutes // 60
        return f"{hours} hour" + ("s" if hours > 1 else "")
    return f"{minutes} minute" + ("s" if minutes > 1 else "")


def known_tenants(config: FileConfig) -> list[str]:
    """Every tenant the YAML file names: the default, ``tenants.*``, and channels' and accounts' ``tenant``."""
    found = [config.tenant, *config.tenants]
    for options in config.channels.values():
        found += [options.tenant or "", *(extra.tenant or "" for extra in options.accounts.values())]
    return sorted({t for t in found if t})


def access_problems(config: FileConfig) -> list[str]:
    """What in the ``access`` blocks cannot work as written (``switchboard check`` reports it, start-up refuses it).

    An ``access`` block on the web chat (never checked: its visitors are anonymous), and an ``allow``, group
    ``allow`` or ``roles`` entry of a channel's (or account's) block naming another channel, which never matches.
    """
    problems: list[str] = []
    for name, options in config.channels.items():
        blocks = [(f"channels.{name}.access", options.access)]
        blocks += [(f"channels.{name}.accounts.{a}.access", extra.access) for a, extra in options.accounts.items()]
        for where, block in blocks:
            if block is None:
                continue
            if name == "web":
                problems.append(f"{where}: the web chat is never checked (its visitors are anonymous); remove it")
                continue
            entries = [*(block.allow or []), *(block.roles or {})]
            if isinstance(block.groups, dict):
                entries += [item for group in block.groups.values() for item in group.allow if item != "*"]
            problems.extend(
                f"{where}: {entry!r} names another channel and never matches here (write {name}:<id>)"
                for entry in entries
                if not fnmatch.fnmatchcase(name, entry.partition(":")[0])
            )
    return problems


def rules_from_config(config: FileConfig, tenants: Mapping[tuple[str, str], str]) -> dict[tuple[str, str], AccessRules]:
    """The rules of each ``(channel, account)`` → tenant that access control looks at.

    An account is left out (no check, no cost) when its merged blocks admit everyone as ``user``: ``open``, no group
    rules, no roles. The web chat is never checked: its visitors are anonymous, and it has its own access (tokens).
    """
    found: dict[tuple[str, str], AccessRules] = {}
    for (channel, account), tenant in tenants.items():
        if channel == "web":
            continue
        options = config.channels.get(channel)
        extra = options.accounts.get(account) if options else None
        tenant_block = config.tenants.get(tenant)
        rules = resolve_access(
            extra.access if extra else None,
            options.access if options else None,
            tenant_block.access if tenant_block else None,
            tenant=tenant,
        )
        if rules.checks or rules.roles or rules.default_role != "user":
            found[(channel, account)] = rules
    return found


class AccessGate:
    """Judges routed messages by their account's rules; see the module docstring."""

    def __init__(
        self,
        redis: aioredis.Redis,
        rules: Mapping[tuple[str, str], AccessRules],
        *,
        notify: Notify | None = None,
        events_maxlen: int = 2000,
    ) -> None:
        """Judge with ``rules`` per ``(channel, account)`` (an account missing from it is not checked)."""
        self.redis = redis
        self.rules = dict(rules)
        self.notify = notify
        self.events_maxlen = events_maxlen
        self._paired: dict[tuple[str, str], tuple[Role, float]] = {}
        """(tenant, principal) → (role, monotonic time until which it is believed without asking Redis)."""
        self._answers: set[asyncio.Task[None]] = set()

    def rules_for(self, conversation: ConversationRef) -> AccessRules | None:
        """The rules of the message's account, or ``None`` when access control does not look at it."""
        return self.rules.get((conversation.channel, conversation.account))

    async def admit(self, message: InboundMessage, rules: AccessRules) -> InboundMessage | None:
        """``message`` with its role and admitting rule stamped, or ``None`` when refused (recorded, answered)."""
        verdict = judge(rules, message)
        if isinstance(verdict, NeedsPairing):
            cached = self._believed(rules.tenant, verdict.principal)
            if cached is not None:
                verdict = Admitted("paired", role_of(rules, verdict.principal, cached))
            else:
                found = await self._pairing(rules, message, verdict.principal)
                if found is None:
                    return None
                verdict = found
        if isinstance(verdict, Admitted):
            meta = {**message.meta, ROLE_META: verdict.role, RULE_META: verdict.rule}
            return message.model_copy(update={"meta": meta})
        if isinstance(verdict, Refused):
            await self._refuse(rules, message, verdict)
            return None
        assert_never(verdict)

    def _believed(self, tenant: str, who: str) -> Role | None:
        found = self._paired.get((tenant, who))
        if found is None:
            return None
        role, until = found
        if time.monotonic() >= until:
            del self._paired[(tenant, who)]
            return None
        return role

    async def _pairing(self, rules: AccessRules, message: InboundMessage, who: str) -> Admitted | None:
        """Ask the pairing store (one script call): paired, or refused with a code issued or still live."""
        tenant, pairing = rules.tenant, rules.pairing
        code = new_code()
        digest = code_digest(code)
        now = time.time()
        session = message.session_key
        record = {"principal": who, "session": session, "expires_at": now + pairing.code_ttl_s}
        reply = await scripts.ACCESS_CHECK(
            self.redis,
            [
                _GLOBAL.access_paired(tenant),
                _GLOBAL.access_pending(tenant, who),
                _GLOBAL.access_code(tenant, digest),
                _GLOBAL.access_notice(tenant, who),
                _GLOBAL.access_requests(tenant),
            ],
            [who, digest, json.dumps(record), pairing.code_ttl_s, pairing.notice_every_s, now],
        )
        status = int(reply[0])
        if status == 1:
            paired = json.loads(reply[1])
            role = role_of(rules, who, paired.get("role") or pairing.role)
            if pairing.recheck_s > 0:
                if len(self._paired) >= _CACHE_MAX:
                    self._paired.clear()
                self._paired[(tenant, who)] = (role, time.monotonic() + pairing.recheck_s)
            return Admitted("paired", role)
        conv, sender = message.conversation, message.sender.id
        answered = bool(int(reply[2]))
        events: list[Event] = []
        if status == 2:
            events.append(PairingCodeIssued(channel=conv.channel, sender=sender, expires_at=record["expires_at"]))
            text = f"{rules.refusal} Your pairing code is {code} (valid {_minutes(int(reply[1]))})."
        else:
            left = _minutes(int(reply[1]))
            text = f"{rules.refusal} Your pairing code was sent earlier; it is valid for {left} more."
        events.append(
            AccessRefused(
                message_id=None,
                channel=conv.channel,
                sender=sender,
                reason="pairing_required",
                rule="pairing",
                answered=answered,
            )
        )
        await self._record(session, events)
        if answered:
            self._answer(conv, text)
        return None

    async def _refuse(self, rules: AccessRules, message: InboundMessage, verdict: Refused) -> None:
        """Record a refusal the configuration decided; answer it unless this sender (or group) was lately."""
        conv = message.conversation
        who = f"group:{conv.channel}:{conv.conversation}" if verdict.reason == "group_not_allowed" else None
        key = _GLOBAL.access_notice(rules.tenant, who or f"{conv.channel}:{message.sender.id}")
        answered = bool(await self.redis.set(key, "1", nx=True, ex=rules.pairing.notice_every_s))
        event = AccessRefused(
            channel=conv.channel, sender=message.sender.id, reason=verdict.reason, rule=verdict.rule, answered=answered
        )
        await self._record(message.session_key, [event])
        if answered:
            self._answer(conv, rules.refusal)

    async def _record(self, session: str, events: list[Event]) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            for event in events:
                fields: Any = {"kind": event.kind, "data": encode_event(event)}
                pipe.xadd(SessionKeys(SessionKey(session)).events, fields, maxlen=self.events_maxlen, approximate=True)
            await pipe.execute()

    def _answer(self, conversation: ConversationRef, text: str) -> None:
        """Send the refusal answer in the background: the platform's request is acknowledged without waiting."""
        if self.notify is None:
            return
        task = asyncio.create_task(self._send(conversation, text))
        self._answers.add(task)
        task.add_done_callback(self._answers.discard)

    async def _send(self, conversation: ConversationRef, text: str) -> None:
        assert self.notify is not None
        try:
            await self.notify(conversation, text)
        except Exception as err:  # an answer lost is logged, never an error the platform would see
            logger.warning("%s: the access refusal answer was not sent: %s", conversation.channel, type(err).__name__)

    async def drain(self) -> None:
        """Wait for the refusal answers still being sent (on shutdown, and in tests)."""
        while self._answers:
            await asyncio.gather(*list(self._answers), return_exceptions=True)


class PairingStore:
    """The operators' side of pairing: approve a code, list paired senders and open requests, revoke."""

    def __init__(self, redis: aioredis.Redis, *, events_maxlen: int = 2000) -> None:
        self.redis = redis
        self.events_maxlen = events_maxlen

    async def approve(self, tenant: str, code: str, operator: str, role: Role | None = None) -> Paired | None:
        """Pair the sender holding ``code`` in ``tenant`` as ``role``; ``None`` for an unknown or expired code.

        Without ``role`` the sender gets the ``pairing.role`` of the account it writes to (``user`` by default).

        The code is taken with ``GETDEL``: it pairs once, however many operators approve it at the same time.
        """
        canonical = normalise_code(code)
        if not canonical:
            return None
        digest = code_digest(canonical)
        raw = await self.redis.getdel(_GLOBAL.access_code(tenant, digest))
        if raw is None:
            return None
        record = json.loads(raw)
        who, session = str(record["principal"]), str(record["session"])
        paired = Paired(principal=who, role=role, at=time.time(), by=operator, session=session)
        value = json.dumps({"role": role, "at": paired.at, "by": operator, "session": session})
        event = AccessPaired(principal=who, role=role or "default", operator=operator)
        # Two steps, as on a cluster one transaction holds one slot: the tenant's access keys ({access:<tenant>}),
        # then the fact in the session's log. A crash between them pairs the sender without its access_paired fact:
        # the paired hash is what admits (and it records who paired it, when, as what), the fact is the session's
        # history of it, so nothing is admitted or refused wrongly; the operator's approval came back as an error,
        # and approving again finds the code taken (it was GETDEL'd): `access list` shows the sender paired.
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(_GLOBAL.access_paired(tenant), who, value)
            pipe.delete(_GLOBAL.access_pending(tenant, who), _GLOBAL.access_notice(tenant, who))
            pipe.zrem(_GLOBAL.access_requests(tenant), who)
            await pipe.execute()
        fields: Any = {"kind": event.kind, "data": encode_event(event)}
        await self.redis.xadd(
            SessionKeys(SessionKey(session)).events, fields, maxlen=self.events_maxlen, approximate=True
        )
        return paired

    async def revoke(self, tenant: str, principal: str, operator: str) -> bool:
        """Unpair ``principal`` in ``tenant``; ``False`` when it was not paired.

        A web process that found it paired believes so for up to ``pairing.recheck_s`` more.
        """
        key = _GLOBAL.access_paired(tenant)
        raw = await self.redis.hget(key, principal)
        if raw is None or not await self.redis.hdel(key, principal):
            return False
        session = str(json.loads(raw).get("session", ""))
        if session:
            event = AccessRevoked(principal=principal, operator=operator)
            fields: Any = {"kind": event.kind, "data": encode_event(event)}
            events = SessionKeys(SessionKey(session)).events
            await self.redis.xadd(events, fields, maxlen=self.events_maxlen, approximate=True)
        return True

    async def paired(self, tenant: str) -> list[Paired]:
        """Every paired sender of ``tenant``, by principal."""
        found = await self.redis.hgetall(_GLOBAL.access_paired(tenant))
        out = []
        for key, raw in sorted(found.items()):
            data = json.loads(raw)
            out.append(
                Paired(
                    principal=key.decode() if isinstance(key, bytes) else str(key),
                    role=data.get("role"),
                    at=float(data.get("at", 0)),
                    by=str(data.get("by", "")),
                    session=str(data.get("session", "")),
                )
            )
        return out

    async def requests(self, tenant: str) -> list[PairingRequest]:
        """The open pairing requests of ``tenant`` (senders holding a live code), soonest to expire first."""
        key = _GLOBAL.access_requests(tenant)
        now = time.time()
        await self.redis.zremrangebyscore(key, "-inf", now)
        out = []
        entries: list[Any] = await self.redis.zrange(key, 0, -1, withscores=True)
        for member, score in entries:
            who = member.decode() if isinstance(member, bytes) else str(member)
            out.append(PairingRequest(principal=who, expires_at=float(score)))
        return out
