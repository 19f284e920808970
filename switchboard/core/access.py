"""Who may talk to an agent: the ``access`` blocks of the YAML file, and the decision about one inbound message.

An ``access`` block sits on a tenant (``tenants.<name>.access``), a channel (``channels.<name>.access``) and a channel
account (``channels.<name>.accounts.<account>.access``); for each field the most specific block that sets it wins
(account, then channel, then tenant). The decision is pure (config only): :func:`judge` admits or refuses a message,
or, in ``pairing`` mode, says the sender's pairing must be looked up (the queue's pairing store holds paired senders).

A sender is named by its principal ``<channel>:<sender id>`` (``telegram:42``, ``slack:U123``, ``whatsapp:4915112345``,
``teams:29:1Abc…``); an ``allow`` entry may also name a Slack workspace (``slack:team:T123``) or a Teams tenant
(``teams:tenant:<id>``), whose every member it admits. Entries are globs (``slack:team:T1*``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from switchboard.core.messages import InboundMessage

__all__ = [
    "ROLES",
    "ROLE_META",
    "RULE_META",
    "AccessConfig",
    "AccessMode",
    "AccessRules",
    "Admitted",
    "GroupAccess",
    "NeedsPairing",
    "PairingConfig",
    "RefusalReason",
    "Refused",
    "Role",
    "Verdict",
    "facets",
    "is_group",
    "judge",
    "least_role",
    "principal",
    "resolve_access",
    "role_of",
    "stamped_role",
]

AccessMode = Literal["open", "allowlist", "pairing"]
Role = Literal["admin", "user", "guest"]
RefusalReason = Literal["not_allowed", "group_not_allowed", "not_allowed_in_group", "pairing_required"]
ROLES: tuple[Role, ...] = ("guest", "user", "admin")
"""Roles from the least to the most trusted."""
_RANK: dict[str, int] = {role: index for index, role in enumerate(ROLES)}
ROLE_META = "access_role"
"""The key of ``InboundMessage.meta`` under which ingest stamps the sender's role (no adapter sets it)."""
RULE_META = "access_rule"
"""The key of ``InboundMessage.meta`` under which ingest stamps the rule that admitted the sender."""

_DIRECT_KINDS: dict[str, tuple[str, frozenset[str]]] = {
    "telegram": ("chat_type", frozenset({"private"})),
    "slack": ("channel_type", frozenset({"im"})),
    "teams": ("conversation_type", frozenset({"personal"})),
}
"""Channels with groups whose conversation's ``extra`` says the kind of chat: (field, the values of a direct chat)."""


def _principal_entry(value: str) -> str:
    """Check one ``allow``/``roles`` entry: ``<channel>:<id or glob>``; a WhatsApp number loses its ``+`` or ``00``."""
    head, sep, rest = value.partition(":")
    if not sep or not head or not rest:
        raise ValueError(
            f"{value!r} is not a principal: write <channel>:<sender id> (telegram:42, slack:U123, whatsapp:4915112345),"
            " slack:team:<workspace id>, teams:tenant:<tenant id>, or a glob such as telegram:*"
        )
    if head == "whatsapp":  # the Cloud API names senders by the number's digits alone: +49…, 0049… are 49…
        digits = rest[1:] if rest.startswith("+") else rest[2:] if rest.startswith("00") else rest
        return f"whatsapp:{digits}"
    return value


class PairingConfig(BaseModel):
    """How pairing codes behave (``access.pairing``)."""

    model_config = ConfigDict(extra="forbid")

    code_ttl_s: int = Field(3600, ge=60, le=7 * 24 * 3600)
    """How long a pairing code is valid; a sender holds at most one live code."""
    notice_every_s: int = Field(600, ge=10, le=7 * 24 * 3600)
    """The refusal answer goes to one sender at most once per this many seconds (other messages get no answer)."""
    recheck_s: float = Field(15.0, ge=0, le=3600)
    """A paired sender is looked up again after this many seconds: the longest a revocation takes to bite in a
    running web process (``0``: every message is looked up)."""
    role: Role = "user"
    """The role a paired sender gets (unless ``roles`` names it)."""


class GroupAccess(BaseModel):
    """One allowed group (``access.groups.<chat or channel id>``)."""

    model_config = ConfigDict(extra="forbid")

    allow: list[str] = Field(default_factory=list)
    """Who may talk in this group (principal globs; ``"*"``: every member); empty: whoever ``mode`` admits."""

    @field_validator("allow")
    @classmethod
    def _entries(cls, value: list[str]) -> list[str]:
        return [item if item == "*" else _principal_entry(item) for item in value]


class AccessConfig(BaseModel):
    """An ``access:`` block (of a tenant, a channel or an account); unset fields fall through to the next block."""

    model_config = ConfigDict(extra="forbid")

    mode: AccessMode | None = None
    """``open`` (default: anyone), ``allowlist`` (only ``allow``), ``pairing`` (``allow``, plus senders an operator
    paired with the code they were given)."""
    allow: list[str] | None = None
    """Principals (``telegram:42``), Slack workspaces (``slack:team:T123``), Teams tenants (``teams:tenant:<id>``),
    WhatsApp numbers (``whatsapp:4915112345``); globs allowed."""
    groups: Literal["open", "none"] | dict[str, GroupAccess] | None = None
    """``open`` (default): group messages are judged like direct ones; ``none``: no group; a mapping: only the
    listed groups (chat, channel or conversation ids), each with who may talk in it."""
    roles: dict[str, Role] | None = None
    """Principal glob → ``admin``, ``user`` or ``guest`` (the first matching entry wins)."""
    default_role: Role | None = None
    """The role of an admitted sender ``roles`` does not name (default ``user``; a paired one: ``pairing.role``)."""
    pairing: PairingConfig | None = None
    refusal: str | None = Field(None, min_length=1, max_length=500)
    """The answer to a refused sender (default: "This bot is private. Ask its operator for access.")."""

    @field_validator("allow")
    @classmethod
    def _allow(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else [_principal_entry(item) for item in value]

    @field_validator("roles")
    @classmethod
    def _roles(cls, value: dict[str, Role] | None) -> dict[str, Role] | None:
        return None if value is None else {_principal_entry(key): role for key, role in value.items()}


DEFAULT_REFUSAL = "This bot is private. Ask its operator for access."


@dataclass(frozen=True, slots=True)
class AccessRules:
    """The effective access rules of one channel account (the blocks merged), resolved once at start-up."""

    tenant: str
    mode: AccessMode = "open"
    allow: tuple[str, ...] = ()
    groups: Literal["open", "none"] | Mapping[str, tuple[str, ...]] = "open"
    roles: tuple[tuple[str, Role], ...] = ()
    default_role: Role = "user"
    pairing: PairingConfig = field(default_factory=PairingConfig)
    refusal: str = DEFAULT_REFUSAL

    @property
    def checks(self) -> bool:
        """Whether a message needs judging at all (``open`` with no group rules admits everyone unlooked-at)."""
        return self.mode != "open" or self.groups != "open"

    def matches(self, patterns: Iterable[str], keys: Iterable[str]) -> str | None:
        """The first pattern matching one of ``keys``, or ``None``."""
        keys = tuple(keys)
        for pattern in patterns:
            if any(pattern == key or fnmatch.fnmatchcase(key, pattern) for key in keys):
                return pattern
        return None


def resolve_access(*blocks: AccessConfig | None, tenant: str) -> AccessRules:
    """The effective rules of ``blocks``, most specific first (account, channel, tenant): per field, the first set."""
    present = [block for block in blocks if block is not None]
    mode: AccessMode = next((b.mode for b in present if b.mode is not None), "open")
    allow = next((b.allow for b in present if b.allow is not None), [])
    groups_field: Literal["open", "none"] | dict[str, GroupAccess] = next(
        (b.groups for b in present if b.groups is not None), "open"
    )
    groups: Literal["open", "none"] | dict[str, tuple[str, ...]] = (
        {key: tuple(value.allow) for key, value in groups_field.items()}
        if isinstance(groups_field, dict)
        else groups_field
    )
    roles: list[tuple[str, Role]] = []
    for block in present:  # the account's entries first: the most specific wins
        roles.extend((block.roles or {}).items())
    return AccessRules(
        tenant=tenant,
        mode=mode,
        allow=tuple(allow),
        groups=groups,
        roles=tuple(roles),
        default_role=next((b.default_role for b in present if b.default_role is not None), "user"),
        pairing=next((b.pairing for b in present if b.pairing is not None), PairingConfig()),
        refusal=next((b.refusal for b in present if b.refusal is not None), DEFAULT_REFUSAL),
    )


def principal(message: InboundMessage) -> str:
    """The sender's principal, ``<channel>:<sender id>``."""
    return f"{message.conversation.channel}:{message.sender.id}"


def facets(message: InboundMessage) -> tuple[str, ...]:
    """What an ``allow`` entry may name of the sender: its principal, its Slack workspace, its Teams tenant."""
    conv = message.conversation
    found = [principal(message)]
    if conv.channel == "slack" and (conv.extra.get("user_team") or conv.extra.get("team")):
        found.append(f"slack:team:{conv.extra.get('user_team') or conv.extra['team']}")  # the author's own workspace
    elif conv.channel == "teams" and conv.extra.get("tenant_id"):
        found.append(f"teams:tenant:{conv.extra['tenant_id']}")
    return tuple(found)


def is_group(message: InboundMessage) -> bool:
    """Whether the message was written in a group (a group chat, a channel, a guild) rather than to the bot alone."""
    conv = message.conversation
    if conv.channel == "discord":
        return bool(message.meta.get("guild_id"))
    kind = _DIRECT_KINDS.get(conv.channel)
    if kind is None:
        return False  # WhatsApp, Messenger, Instagram and the web chat reach the bot one to one
    name, direct = kind
    value = conv.extra.get(name) or message.meta.get(name)
    return value is not None and value not in direct


@dataclass(frozen=True, slots=True)
class Admitted:
    """The message may reach the agent."""

    rule: str
    """Which rule admitted it (``open``, ``allowlist:telegram:42``, ``group:-100123``, ``paired``)."""
    role: Role


@dataclass(frozen=True, slots=True)
class Refused:
    """The message goes no further."""

    reason: RefusalReason
    rule: str


@dataclass(frozen=True, slots=True)
class NeedsPairing:
    """``pairing`` mode, and nothing in the configuration admits the sender: the pairing store decides."""

    principal: str


Verdict = Admitted | Refused | NeedsPairing


def role_of(rules: AccessRules, who: str, fallback: Role | None = None) -> Role:
    """The role of principal ``who``: the first ``roles`` entry matching it, else ``fallback`` or the default."""
    for pattern, role in rules.roles:
        if pattern == who or fnmatch.fnmatchcase(who, pattern):
            return role
    return fallback or rules.default_role


def stamped_role(meta: Mapping[str, object]) -> Role:
    """The role ingest stamped on a message; ``user`` when none was (access control admits everyone as ``user``)."""
    value = meta.get(ROLE_META, "user")
    for role in ROLES:
        if value == role:
            return role
    return "guest"  # never stamped so: the least trust


def least_role(roles: Iterable[Role]) -> Role:
    """The least trusted of ``roles`` (``user`` when there are none)."""
    found = list(roles)
    return min(found, key=_RANK.__getitem__) if found else "user"


def judge(rules: AccessRules, message: InboundMessage) -> Verdict:
    """Whether ``message`` may reach the agent by the configuration alone (see the module docstring)."""
    who = principal(message)
    if is_group(message) and rules.groups != "open":
        group = message.conversation.conversation
        if rules.groups == "none":
            return Refused("group_not_allowed", "groups:none")
        allowed = rules.groups.get(group)
        if allowed is None:
            return Refused("group_not_allowed", "groups")
        if allowed:
            if "*" in allowed or rules.matches(allowed, (who,)) is not None:
                return Admitted(f"group:{group}", role_of(rules, who))
            return Refused("not_allowed_in_group", f"group:{group}")
    if rules.mode == "open":
        return Admitted("open", role_of(rules, who))
    found = rules.matches(rules.allow, facets(message))
    if found is not None:
        return Admitted(f"allowlist:{found}", role_of(rules, who))
    if rules.mode == "pairing":
        return NeedsPairing(who)
    return Refused("not_allowed", "allowlist")
