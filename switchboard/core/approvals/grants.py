"""Who may do what: permissions granted to principals, the policy of a turn, and who may decide an approval.

A principal is a string: ``<channel>:<sender id>`` for channel users (``telegram:42``, ``slack:U123``),
``console:<name>`` for console operators, ``switchboard`` for the gateway itself. The YAML file grants
permissions in the ``grants`` of a ``policy:`` block (the tenant's, the agent's and the channel of the
principal's): principal glob → permission globs. A tool that declares a ``permission`` runs only for a principal
granted it (:func:`~switchboard.core.approvals.policy.granted`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from switchboard.core.agent.config import Agent
from switchboard.core.approvals.policy import Policy, PolicyConfig, TenantConfig
from switchboard.core.approvals.records import ApprovalRecord, Verdict

__all__ = [
    "GATEWAY_PRINCIPAL",
    "ChannelPolicy",
    "PolicySources",
    "agent_policy",
    "channel_of",
    "may_decide",
    "permissions_for",
    "policy_blocks",
    "policy_problems",
    "resolve_policy",
]

GATEWAY_PRINCIPAL = "switchboard"
"""The gateway's own principal: it expires approvals, and never approves or denies one."""


class ChannelPolicy(Protocol):
    """What the grants read of a channel's block in the YAML file."""

    @property
    def policy(self) -> PolicyConfig | None:
        """``channels.<name>.policy``."""

    @property
    def admins(self) -> Sequence[str]:
        """``channels.<name>.admins``: principals who decide approvals naming ``admins``."""


class PolicySources(Protocol):
    """Where ``policy:`` blocks come from: the YAML file (:class:`switchboard.settings.FileConfig`)."""

    @property
    def agents(self) -> Mapping[str, Agent]:
        """``agents.<name>``."""

    @property
    def channels(self) -> Mapping[str, ChannelPolicy]:
        """``channels.<name>``."""

    @property
    def tenants(self) -> Mapping[str, TenantConfig]:
        """``tenants.<name>``."""


def channel_of(principal: str) -> str:
    """The channel a principal speaks on (``telegram`` of ``telegram:42``; ``console``; empty for the gateway)."""
    head, sep, _ = principal.partition(":")
    return head if sep else ""


def policy_blocks(
    config: PolicySources, *, tenant: str, agent: str, channel: str
) -> list[tuple[str, PolicyConfig | None]]:
    """The ``policy:`` blocks that apply to a turn, most specific first: the agent's, the channel's, the tenant's."""
    found_agent = config.agents.get(agent)
    found_channel = config.channels.get(channel)
    found_tenant = config.tenants.get(tenant)
    return [
        (f"agent:{agent}", found_agent.policy if found_agent is not None else None),
        (f"channel:{channel}", found_channel.policy if found_channel is not None else None),
        (f"tenant:{tenant}", found_tenant.policy if found_tenant is not None else None),
    ]


def agent_policy(agent: Agent) -> Policy:
    """The policy of ``agent`` alone (a turn run without the YAML file's channel and tenant blocks)."""
    return Policy.of((f"agent:{agent.name}", agent.policy))


def resolve_policy(config: PolicySources, *, tenant: str, agent: str, channel: str) -> Policy:
    """The effective :class:`Policy` of a turn of ``agent`` for ``tenant`` on ``channel``."""
    found_channel = config.channels.get(channel)
    admins = found_channel.admins if found_channel is not None else []
    return Policy.of(*policy_blocks(config, tenant=tenant, agent=agent, channel=channel), admins=admins)


def permissions_for(config: PolicySources, tenant: str, agent: str, principal: str) -> frozenset[str]:
    """The permissions (globs) ``principal`` holds when talking to ``agent`` of ``tenant``.

    The union of the grants in the tenant's, the agent's and the principal's channel's ``policy`` blocks whose
    principal glob matches ``principal``.
    """
    blocks = policy_blocks(config, tenant=tenant, agent=agent, channel=channel_of(principal))
    return frozenset(_granted(principal, (block for _, block in blocks if block is not None)))


def _granted(principal: str, blocks: Iterable[PolicyConfig]) -> Iterable[str]:
    for block in blocks:
        for pattern, permissions in block.grants.items():
            if fnmatch.fnmatchcase(principal, pattern):
                yield from permissions


def may_decide(record: ApprovalRecord, actor: str, verdict: Verdict = "approve") -> bool:
    """Whether ``actor`` may apply ``verdict`` to ``record`` (pure: the record holds its resolved approvers).

    ``expire`` is the gateway's own (``switchboard``), and only it may expire. Otherwise the record's approvers
    count: ``requester`` (the principal the run acts for), ``operators`` (any console operator; the console and the
    CLI have already checked the operator's tenant), and principals or principal globs (a channel's admins were
    resolved into principals when the approval was asked). The gateway itself never approves or denies.
    """
    if verdict == "expire":
        return actor == GATEWAY_PRINCIPAL
    if not actor or actor == GATEWAY_PRINCIPAL:
        return False
    for approver in record.approvers:
        if approver == "requester":
            if actor == record.requested_by:
                return True
        elif approver == "operators":
            if channel_of(actor) == "console":
                return True
        elif fnmatch.fnmatchcase(actor, approver):
            return True
    return False


def policy_problems(config: PolicySources, tool_names: Iterable[str]) -> list[str]:
    """What in the ``policy`` blocks cannot work as written (``switchboard check`` reports it).

    A rule naming a tool that none of the agent's tools (for an agent's block) or none of ``tool_names`` (the known
    tools, for a channel's or a tenant's block) matches; ``admins`` among a channel's approvers while the channel
    names no admins; a channel admin that is not a principal.
    """
    known = sorted(tool_names)
    problems: list[str] = []
    for name, agent in config.agents.items():
        # an MCP server's tools are known only once it is connected: any rule within a server the agent uses counts
        mcp = [f"{m.server}__{tool}" for m in agent.mcp for tool in (m.tools if m.tools is not None else ["*"])]
        problems.extend(
            _unmatched(f"agents.{name}.policy", agent.policy, [*agent.tools, *(s.name for s in agent.rest_tools), *mcp])
        )
    for name, channel in config.channels.items():
        where = f"channels.{name}"
        problems.extend(_unmatched(f"{where}.policy", channel.policy, known))
        approvers = channel.policy.approvals.approvers if channel.policy and channel.policy.approvals else []
        if "admins" in approvers and not channel.admins:
            problems.append(f"{where}.policy.approvals.approvers names admins, but {where}.admins lists nobody")
        problems.extend(
            f"{where}.admins: {admin!r} is not a principal (write <channel>:<sender id>, e.g. {name}:42)"
            for admin in channel.admins
            if channel_of(admin) in ("", "console") or admin.endswith(":")
        )
    for name, tenant in config.tenants.items():
        problems.extend(_unmatched(f"tenants.{name}.policy", tenant.policy, known))
    return problems


def _unmatched(where: str, block: PolicyConfig | None, tools: Iterable[str]) -> list[str]:
    if block is None:
        return []
    names = list(tools)
    return [
        f"{where}.rules[{index}] ({rule.name or 'unnamed'}): tool {rule.tool!r} matches none of "
        f"{', '.join(names) or 'no tools'}; fix the name or remove the rule"
        for index, rule in enumerate(block.rules)
        if not any(fnmatch.fnmatchcase(tool, rule.tool) or _within(rule.tool, tool) for tool in names)
    ]


def _within(pattern: str, tools: str) -> bool:
    """Whether a rule's tool pattern names tools of an MCP server whose tools are all offered (``server__*``)."""
    return tools.endswith("__*") and pattern.startswith(tools[:-1])
