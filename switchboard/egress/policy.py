"""Egress policy: per-agent host allowlists and secrets, the caps, and the grants that tie a client to an agent.

A sandbox (or tool) is handed a :class:`Grant` for one agent and one session; the proxy knows the client by the
grant's token (``Proxy-Authorization``), never by anything the request says about itself.
"""

from __future__ import annotations

import ipaddress
import secrets as token_source
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import SecretStr

from switchboard.core.tools.egress import normalize_pattern
from switchboard.egress.placeholders import Secret

if TYPE_CHECKING:
    from switchboard.settings import Settings

__all__ = ["AgentRules", "EgressPolicy", "Grant", "host_matches", "is_ip_literal"]


def host_matches(host: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``host`` (lower-case, no trailing dot) is one of the exact names or under a ``*.`` pattern."""
    for pattern in patterns:
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]) and len(host) > len(pattern) - 1:
                return True
        elif host == pattern:
            return True
    return False


@dataclass(frozen=True, slots=True)
class AgentRules:
    """What one agent's requests may do."""

    allow: tuple[str, ...]
    secrets: Mapping[str, Secret]

    def allows(self, host: str) -> bool:
        """Whether the agent may reach ``host``."""
        return host_matches(host, self.allow)


@dataclass(frozen=True, slots=True)
class Grant:
    """The right of one client (a sandboxed command, a tool call) to send requests for an agent and session."""

    token: str
    agent: str
    session: str
    confined: bool = False
    """Honoured only on its own unix socket (:meth:`~switchboard.egress.proxy.EgressProxy.own_socket`), never on the
    proxy's shared listeners: a sandbox's grant, which no other local process may use even if it learns the token."""


@dataclass(slots=True)
class EgressPolicy:
    """Every agent's rules plus the deployment-wide caps; built once from the settings."""

    agents: dict[str, AgentRules]
    methods: frozenset[str]
    ports: frozenset[int]
    max_request_bytes: int
    max_response_bytes: int
    problems: list[str] = field(default_factory=list)
    """Secrets that could not be bound (a missing environment variable), in words an operator can act on."""
    _grants: dict[str, Grant] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Settings) -> EgressPolicy:
        """Combine ``SWITCHBOARD_EGRESS__*`` with each agent's ``egress`` block of the YAML file."""
        egress = settings.egress
        shared_allow = tuple(normalize_pattern(p) for p in egress.allow)
        # a client secret or subject token is egress's own, sent only by its token requests: no request may carry it
        reserved = {name.upper() for credential in egress.credentials.values() for name in credential.secret_names()}
        shared = {
            name.upper(): Secret(name.upper(), s.value, tuple(normalize_pattern(d) for d in s.domains))
            for name, s in egress.secrets.items()
            if name.upper() not in reserved
        }
        problems: list[str] = []
        agents: dict[str, AgentRules] = {}
        for name, agent in settings.file.agents.items():
            own = dict(shared)
            for secret_name, binding in agent.egress.secrets.items():
                value = settings.environ.get(binding.env)
                if not value:
                    problems.append(
                        f"agent {name!r}: secret {secret_name} reads ${binding.env}, which is not set: set it or "
                        f"remove the binding (requests using {{{{secret:{secret_name}}}}} are refused meanwhile)"
                    )
                    continue
                own[secret_name] = Secret(secret_name, SecretStr(value), binding.domains)
            agents[name] = AgentRules(allow=(*shared_allow, *agent.egress.allow), secrets=own)
        return cls(
            agents=agents,
            methods=frozenset(m.upper() for m in egress.methods),
            ports=frozenset(egress.ports),
            max_request_bytes=egress.max_request_bytes,
            max_response_bytes=egress.max_response_bytes,
            problems=problems,
        )

    def rules(self, agent: str) -> AgentRules:
        """The agent's rules (an unknown agent may reach nothing)."""
        return self.agents.get(agent) or AgentRules(allow=(), secrets={})

    def grant(self, agent: str, session: str, *, confined: bool = False) -> Grant:
        """Issue a grant for one client; revoke it when the client is done (``confined``: :attr:`Grant.confined`)."""
        grant = Grant(token=token_source.token_urlsafe(24), agent=agent, session=session, confined=confined)
        self._grants[grant.token] = grant
        return grant

    def revoke(self, grant: Grant) -> None:
        """Withdraw a grant: requests with its token are refused from now on."""
        self._grants.pop(grant.token, None)

    def bound_to(self, host: str) -> tuple[Secret, ...]:
        """Every secret of any agent bound to ``host``: what each response from it is redacted of."""
        found: dict[tuple[str, str], Secret] = {}
        for rules in self.agents.values():
            for secret in rules.secrets.values():
                if host_matches(host, secret.domains):
                    found.setdefault((secret.name, secret.value.get_secret_value()), secret)
        return tuple(found.values())

    def lookup(self, token: str) -> Grant | None:
        """The live grant with this token."""
        return self._grants.get(token)


def is_ip_literal(host: str) -> bool:
    """Whether ``host`` is an address rather than a name."""
    try:
        ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    return True
