"""Policy outside the model: whether a tool call runs, waits for a person's approval, or is refused.

The inputs are facts the gateway holds (the tool, its normalised arguments, the principal, whether untrusted content
entered the turn), never what the model says about safety. Rules come from the agent's, the channel's and the
tenant's ``policy`` blocks, first match deciding; the defaults and the modes are in ``docs/ARCHITECTURE.md`` §6. The
version is a hash of the effective configuration, recorded on every run and approval.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import operator
import re
import unicodedata
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from switchboard.core.access import AccessConfig, Role

__all__ = [
    "APPROVER_KINDS",
    "ApprovalsConfig",
    "Condition",
    "Decision",
    "Mode",
    "Policy",
    "PolicyConfig",
    "PolicyDecision",
    "Rule",
    "TenantConfig",
    "ToolFacts",
    "UntrustedEffects",
    "granted",
    "untrusted_reason",
]

Decision = Literal["allow", "approve", "refuse"]
Mode = Literal["observe", "confirm", "review"]
UntrustedEffects = Literal["approve", "allow", "refuse"]
RiskName = Literal["low", "medium", "high"]
_RISK_ORDER: dict[str, int] = {"low": 0, "medium": 1, "high": 2}

APPROVER_KINDS = ("requester", "operators", "admins")
"""Symbolic approvers: the requesting user, any console operator of the tenant, the channel's ``admins``."""

DEFAULT_EXPIRE_AFTER_S = 3600


class ToolFacts(Protocol):
    """What the policy reads of a tool (a :class:`~switchboard.core.tools.definition.Tool`): facts the gateway holds."""

    @property
    def name(self) -> str:
        """The tool's name, matched against a rule's glob."""

    @property
    def side_effect(self) -> Literal["read", "write"]:
        """Whether a call reads or writes."""

    @property
    def risk(self) -> RiskName:
        """The tool's risk class."""

    @property
    def reversible(self) -> bool:
        """Whether the effect can be undone."""


def _principal_like(value: str) -> bool:
    return value == "switchboard" or (":" in value and not value.startswith(":") and not value.endswith(":"))


class Condition(BaseModel):
    """A test on one normalised argument (``field`` is a dotted path, ``to.address``); every test set must hold.

    A missing (or null) field does not match. A value of the wrong type for a comparison does not match an ``allow``
    rule, and does match an ``approve`` or ``refuse`` rule (see :meth:`holds`).
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    arg: str = Field(alias="field", min_length=1)
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    eq: str | float | bool | None = None
    in_: list[str | float | bool] | None = Field(None, alias="in")
    matches: str | None = None
    """A regular expression the (string) value must match somewhere (``re.search``)."""

    @field_validator("matches")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as err:
                raise ValueError(f"`matches` is not a valid regular expression ({err}): {value!r}") from None
        return value

    @model_validator(mode="after")
    def _some_test(self) -> Condition:
        if all(getattr(self, name) is None for name in ("gt", "ge", "lt", "le", "eq", "in_", "matches")):
            raise ValueError(f"condition on {self.arg!r} tests nothing: add one of gt, ge, lt, le, eq, in, matches")
        return self

    def holds(self, args: Mapping[str, Any], *, strict: bool = False) -> bool:
        """Whether the call's normalised ``args`` pass every test of this condition.

        A field under a list (``to.address`` over ``to: [{address: …}, …]``) or holding one is tested element by
        element. An ambiguity never resolves towards ``allow``: for an ``approve`` or ``refuse`` rule (``strict``),
        one element passing is enough, a value the test cannot read (``"1,000"`` under ``gt``, a NaN) passes, and
        strings are compared after NFKC normalisation and case folding; for an ``allow`` rule every element must
        pass exactly.
        """
        values = _lookup(args, self.arg)
        if not values:
            return False
        results = [self._test(value, strict) for value in values]
        if strict:
            return any(result is not False for result in results)
        return all(result is True for result in results)

    def _test(self, value: Any, loose: bool) -> bool | None:
        """One value against every test: ``True``, ``False``, or ``None`` when a test cannot read it."""
        unreadable = False
        bounds = ((self.gt, operator.gt), (self.ge, operator.ge), (self.lt, operator.lt), (self.le, operator.le))
        for bound, test in bounds:
            if bound is None:
                continue
            number = _number(value)
            if number is None:
                unreadable = True
            elif not test(number, bound):
                return False
        if self.eq is not None and not _equal(value, self.eq, loose):
            return False
        if self.in_ is not None and not any(_equal(value, item, loose) for item in self.in_):
            return False
        if self.matches is not None:
            if not isinstance(value, str):
                unreadable = True
            elif not any(re.search(self.matches, text) is not None for text in _forms(value, loose)):
                return False
        return None if unreadable else True


def _lookup(args: Mapping[str, Any], path: str) -> list[Any]:
    """The values at a dotted ``path`` (several under lists; none when it is missing or null)."""
    current: list[Any] = [args]
    for part in path.split("."):
        current = [item[part] for item in _flat(current) if isinstance(item, Mapping) and part in item]
    return [value for value in _flat(current) if value is not None]


def _flat(values: list[Any]) -> list[Any]:
    flat: list[Any] = []
    for value in values:
        flat.extend(_flat(list(value)) if isinstance(value, list | tuple) else [value])
    return flat


def _number(value: Any) -> int | float | Decimal | None:
    """A number to compare (exactly: a huge int or ``"1e400"`` stays what it is), or ``None`` (not one, or NaN)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, str) and len(value) <= 100:
        try:
            number = Decimal(value.strip())
        except (InvalidOperation, ValueError):
            return None
        return None if number.is_nan() else number
    return None


def _forms(text: str, loose: bool) -> tuple[str, ...]:
    return (text, unicodedata.normalize("NFKC", text)) if loose else (text,)


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold().strip()


def _equal(value: Any, expected: str | float | bool, loose: bool = False) -> bool:
    if isinstance(expected, bool) or isinstance(value, bool):
        return value is expected
    if isinstance(expected, str):
        return isinstance(value, str) and (value == expected or (loose and _fold(value) == _fold(expected)))
    number = _number(value) if loose or not isinstance(value, str) else None
    return number is not None and number == expected


class Rule(BaseModel):
    """One rule: what it matches (every given field must match) and what it decides."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    """Shown to reviewers and recorded (default: ``<block>#<index>``)."""
    tool: str = "*"
    """Tool name, a glob (``send_*``)."""
    side_effect: Literal["read", "write"] | None = None
    risk: list[RiskName] | None = None
    """The tool's risk is one of these."""
    reversible: bool | None = None
    untrusted: bool | None = None
    """Matches only when untrusted content has (``true``) or has not (``false``) entered the turn."""
    actor: list[str] = Field(default_factory=list)
    """Principals (globs: ``telegram:*``) the rule applies to; empty: anyone."""
    role: list[Role] | None = None
    """The rule applies only to a turn acting for one of these roles (``admin``, ``user``, ``guest``)."""
    role_not: list[Role] | None = None
    """The rule applies only to a turn acting for none of these roles (``{tool: shell, role_not: [admin],
    decide: refuse}``)."""
    when: list[Condition] = Field(default_factory=list)
    """Conditions on the arguments, all of which must hold."""
    decide: Decision
    reason: str = ""
    """Why, as the reviewer (or the model, for a refusal) reads it."""

    @field_validator("risk", "role", "role_not", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    def recorded(self) -> dict[str, Any]:
        """The rule as hashed into the policy's version (role fields only when set: other versions stay unchanged)."""
        dump = self.model_dump(mode="json", by_alias=True)
        for name in ("role", "role_not"):
            if dump[name] is None:
                del dump[name]
        return dump


class ApprovalsConfig(BaseModel):
    """How long an approval waits, and who may decide it."""

    model_config = ConfigDict(extra="forbid")

    expire_after_s: int = Field(DEFAULT_EXPIRE_AFTER_S, ge=10, le=30 * 24 * 3600)
    approvers: list[str] = Field(default_factory=lambda: ["requester", "operators"], min_length=1)
    """``requester``, ``operators``, ``admins`` (the channel's), or principals (``console:alice``, ``slack:U1``)."""

    @field_validator("approvers")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        for item in value:
            if item not in APPROVER_KINDS and not _principal_like(item):
                raise ValueError(
                    f"unknown approver {item!r}: use requester, operators, admins, or a principal such as "
                    "console:alice or telegram:42"
                )
        return value


class PolicyConfig(BaseModel):
    """A ``policy:`` block (of an agent, a channel or a tenant); unset fields fall through to the next block."""

    model_config = ConfigDict(extra="forbid")

    mode: Mode | None = None
    """``observe``, ``confirm`` (default) or ``review``."""
    version: str | None = Field(None, min_length=1, max_length=64)
    """A label for this policy, recorded with the hash of the rules (``v3:1a2b…``)."""
    untrusted_effects: UntrustedEffects | None = None
    """A write of medium or high risk after untrusted content: ``approve`` (default), ``allow`` or ``refuse``."""
    rules: list[Rule] = Field(default_factory=list)
    approvals: ApprovalsConfig | None = None
    grants: dict[str, list[str]] = Field(default_factory=dict)
    """Principal (a glob: ``slack:*``, ``*``) → permissions it gets (globs: ``payments.*``)."""

    @field_validator("grants")
    @classmethod
    def _grants(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for principal, permissions in value.items():
            if principal != "*" and not _principal_like(principal):
                raise ValueError(
                    f"grants key {principal!r} is not a principal: write <channel>:<sender id> (telegram:42), "
                    "console:<name>, or a glob such as slack:* or *"
                )
            if not all(isinstance(p, str) and p.strip() for p in permissions):
                raise ValueError(f"grants of {principal!r}: permissions are non-empty strings")
        return value


class TenantConfig(BaseModel):
    """A tenant's block in the YAML file (``tenants.<name>``)."""

    model_config = ConfigDict(extra="forbid")

    policy: PolicyConfig | None = None
    """Rules, mode, approvals and grants for every agent and channel of the tenant (the least specific block)."""
    access: AccessConfig | None = None
    """Who may talk to the tenant's agents (the least specific block; see ``switchboard.core.access``)."""


@dataclass(frozen=True, slots=True)
class PolicyDecision:
    """What the policy decided about one call."""

    decision: Decision
    rule: str
    """The matching rule's name, or ``default:<what>``."""
    reason: str
    version: str
    observed: bool = False
    """Observe mode let a would-be approval run."""

    @property
    def label(self) -> str:
        """How the decision is recorded (``ToolCalled.policy``): ``allow:<rule>``, ``observe:<rule>``, ..."""
        return f"observe:{self.rule}" if self.observed else f"{self.decision}:{self.rule}"


_DEFAULT_REASONS = {
    "default:risky_write": "this action is risky or cannot be undone",
    "default:untrusted": (
        "content from a document, file or search result entered this conversation turn and may have asked for it"
    ),
}


def untrusted_reason(sources: Sequence[str]) -> str:
    """Why a write waits after untrusted content entered the turn, naming where it came from when known."""
    if not sources:
        return _DEFAULT_REASONS["default:untrusted"]
    named = " and ".join(sources) if len(sources) <= 2 else ", ".join(sources[:-1]) + " and " + sources[-1]
    return f"{named} entered this conversation turn and may have asked for it"


@dataclass(frozen=True, slots=True)
class _Named:
    scope: str
    rule: Rule
    name: str


@dataclass(frozen=True)
class Policy:
    """The effective policy of one turn: the agent's, the channel's and the tenant's blocks, in that order.

    Build it with :meth:`of` (from the blocks) or :meth:`resolve` (from the YAML file's config).
    """

    rules: tuple[_Named, ...] = ()
    mode: Mode = "confirm"
    untrusted_effects: UntrustedEffects = "approve"
    approvals: ApprovalsConfig = field(default_factory=ApprovalsConfig)
    admins: tuple[str, ...] = ()
    """The channel's admins (principals), for the ``admins`` approver."""
    version: str = ""

    @classmethod
    def of(cls, *blocks: tuple[str, PolicyConfig | None], admins: Iterable[str] = ()) -> Policy:
        """The policy of ``blocks`` — ``(scope name, block)`` pairs, most specific first (``agent:assistant``)."""
        present = [(scope, block) for scope, block in blocks if block is not None]
        rules = tuple(
            _Named(scope, rule, rule.name or f"{scope}#{index + 1}")
            for scope, block in present
            for index, rule in enumerate(block.rules)
        )
        admitted = tuple(admins)
        mode: Mode = next((b.mode for _, b in present if b.mode is not None), "confirm")
        untrusted: UntrustedEffects = next(
            (b.untrusted_effects for _, b in present if b.untrusted_effects is not None), "approve"
        )
        approvals = next((b.approvals for _, b in present if b.approvals is not None), ApprovalsConfig())
        effective = {
            "rules": [[named.scope, named.rule.recorded()] for named in rules],
            "mode": mode,
            "untrusted_effects": untrusted,
            "approvals": approvals.model_dump(mode="json"),
            "admins": sorted(admitted),
        }
        digest = hashlib.sha256(json.dumps(effective, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        labels = "+".join(b.version for _, b in present if b.version)
        version = f"{labels}:{digest[:12]}" if labels else digest[:12]
        return cls(rules, mode, untrusted, approvals, admitted, version)

    def decide(
        self,
        tool: ToolFacts,
        args: Mapping[str, Any],
        *,
        actor: str,
        untrusted: bool = False,
        untrusted_sources: Sequence[str] = (),
        role: Role = "user",
    ) -> PolicyDecision:
        """Decide one validated call (``args``: its normalised arguments) for ``actor`` holding ``role``.

        ``untrusted_sources`` names what brought the untrusted content in (``the output of shell``): the reason of
        the ``default:untrusted`` rule says so.
        """
        decision, rule, reason, explicit_untrusted = self._match(tool, args, actor, untrusted, role)
        risky = tool.side_effect == "write" and _RISK_ORDER[tool.risk] >= 1
        if decision == "allow" and untrusted and risky and not explicit_untrusted and self.untrusted_effects != "allow":
            decision = "approve" if self.untrusted_effects == "approve" else "refuse"
            rule, reason = "default:untrusted", untrusted_reason(untrusted_sources)
        if decision == "approve" and self.mode == "observe":
            return PolicyDecision("allow", rule, reason, self.version, observed=True)
        return PolicyDecision(decision, rule, reason, self.version)

    def offers(self, tool: ToolFacts, *, actor: str, role: Role) -> bool:
        """Whether ``tool`` is offered to the model: ``False`` when a ``role`` rule refuses every call by ``actor``.

        That is when the first rule that may match the call, whatever its arguments and the turn's taint, is a
        ``refuse`` naming ``role`` or ``role_not`` (a rule with conditions or an ``untrusted`` test that would not
        refuse keeps the tool offered). A call the model makes to a tool it was not offered is refused all the same.
        """
        for named in self.rules:
            rule = named.rule
            if not _matches_tool(rule, tool, actor, role):
                continue
            if rule.when or rule.untrusted is not None:
                if rule.decide != "refuse":
                    return True
                continue
            return not (rule.decide == "refuse" and (rule.role is not None or rule.role_not is not None))
        return True

    def _match(
        self, tool: ToolFacts, args: Mapping[str, Any], actor: str, untrusted: bool, role: Role
    ) -> tuple[Decision, str, str, bool]:
        for named in self.rules:
            if _matches(named.rule, tool, args, actor, untrusted, role):
                reason = named.rule.reason or f"policy rule {named.name}"
                return named.rule.decide, named.name, reason, named.rule.untrusted is not None
        if tool.side_effect == "read":
            return "allow", "default:read", "reads are allowed", False
        if tool.risk == "high" or (not tool.reversible and tool.risk == "medium"):
            return "approve", "default:risky_write", _DEFAULT_REASONS["default:risky_write"], False
        return "allow", "default:write", "writes of low risk are allowed", False

    def approvers(self) -> tuple[str, ...]:
        """Who may decide this policy's approvals, resolved for the record: ``admins`` becomes the principals."""
        found: list[str] = []
        for item in self.approvals.approvers:
            for principal in self.admins if item == "admins" else (item,):
                if principal not in found:
                    found.append(principal)
        return tuple(found)


def _matches(rule: Rule, tool: ToolFacts, args: Mapping[str, Any], actor: str, untrusted: bool, role: Role) -> bool:
    if not _matches_tool(rule, tool, actor, role):
        return False
    if rule.untrusted is not None and rule.untrusted != untrusted:
        return False
    strict = rule.decide != "allow"
    return all(condition.holds(args, strict=strict) for condition in rule.when)


def _matches_tool(rule: Rule, tool: ToolFacts, actor: str, role: Role) -> bool:
    """Whether ``rule`` matches the tool, the actor and its role (what holds whatever a call's arguments)."""
    if not fnmatch.fnmatchcase(tool.name, rule.tool):
        return False
    if rule.side_effect is not None and rule.side_effect != tool.side_effect:
        return False
    if rule.risk is not None and tool.risk not in rule.risk:
        return False
    if rule.reversible is not None and rule.reversible != tool.reversible:
        return False
    if rule.role is not None and role not in rule.role:
        return False
    if rule.role_not is not None and role in rule.role_not:
        return False
    return not rule.actor or any(fnmatch.fnmatchcase(actor, pattern) for pattern in rule.actor)


def granted(permission: str, permissions: Collection[str]) -> bool:
    """Whether ``permission`` is among ``permissions`` (granted patterns are globs: ``payments.*``)."""
    return any(permission == p or fnmatch.fnmatchcase(permission, p) for p in permissions)
