"""Declared REST tools' way out: each call gets its own grant for the calling agent, revoked when it returns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from yarl import URL

from switchboard.core.tools.rest.tool import declared_tools
from switchboard.egress.client import EgressClient, EgressResponse
from switchboard.egress.credentials import CREDENTIAL
from switchboard.egress.forward import Forwarder
from switchboard.egress.policy import EgressPolicy, host_matches

if TYPE_CHECKING:
    from switchboard.core.tools.builtin import ToolRegistry
    from switchboard.core.tools.rest.declaration import RestToolSpec
    from switchboard.settings import Settings

__all__ = ["EgressTransport", "credentials_used", "register_rest_tools", "rest_problems", "search_problems"]


def register_rest_tools(registry: ToolRegistry, settings: Settings, transport: EgressTransport | None) -> None:
    """Add the declared REST tools of the YAML file (shared and each agent's own) to ``registry``.

    Raises:
        ValueError: a declared name is already a tool's (a native tool keeps its name).
    """
    file = settings.file
    own = {name: agent.rest_tools for name, agent in file.agents.items() if agent.rest_tools}
    for tool in declared_tools(file.rest_tools, own, transport):
        if tool.name in registry:
            raise ValueError(f"the REST tool {tool.name!r} has the name of a native tool: rename it")
        registry.register(tool)


def rest_problems(settings: Settings, only: str | None = None) -> list[str]:
    """Problems of the declared REST tools an agent has (``only``: that agent), in words an operator can act on.

    A host the agent may not reach; a ``{{credential:NAME}}`` egress would refuse (unknown, other hosts, wider scope).
    """
    policy = EgressPolicy.from_settings(settings)
    shared = {spec.name: spec for spec in settings.file.rest_tools}
    found: list[str] = []
    for name, agent in settings.file.agents.items():
        if only is not None and name != only:
            continue
        specs = [*agent.rest_tools, *(shared[tool] for tool in agent.tools if tool in shared)]
        for spec in specs:
            if not policy.rules(name).allows(spec.host):
                found.append(
                    f"agent {name!r}: REST tool {spec.name} calls {spec.host}, which is not in its egress allowlist: "
                    f"add it to agents.{name}.egress.allow"
                )
            found += _credential_problems(settings, name, spec)
    return found


def credentials_used(settings: Settings, agent: str) -> list[str]:
    """The configured credentials the agent's REST tools use, one line each (for ``agents show``)."""
    shared = {spec.name: spec for spec in settings.file.rest_tools}
    own = settings.file.agents[agent]
    specs = [*own.rest_tools, *(shared[tool] for tool in own.tools if tool in shared)]
    names = sorted(
        {m.group(1).upper() for spec in specs for v in spec.headers.values() for m in CREDENTIAL.finditer(v)}
    )
    credentials = {name.upper(): c for name, c in settings.egress.credentials.items()}
    return [
        f"credential {name} ({c.type}, tokens from {c.token_host}, scope {c.scope!r}) → {', '.join(c.hosts)}"
        for name in names
        if (c := credentials.get(name)) is not None
    ]


def _credential_problems(settings: Settings, agent: str, spec: RestToolSpec) -> list[str]:
    """What egress would refuse about the credential placeholders of one declaration's headers."""
    credentials = {name.upper(): c for name, c in settings.egress.credentials.items()}
    found: list[str] = []
    for value in spec.headers.values():
        for match in CREDENTIAL.finditer(value):
            name, scope = match.group(1).upper(), set((match.group(2) or "").split())
            where = f"agent {agent!r}: REST tool {spec.name} uses the credential {name}"
            credential = credentials.get(name)
            if credential is None:
                found.append(f"{where}, which is not configured: set SWITCHBOARD_EGRESS__CREDENTIALS__{name}__*")
            elif not host_matches(spec.host, credential.hosts):
                found.append(
                    f"{where} on {spec.host}, which is not among its hosts: add it to "
                    f"SWITCHBOARD_EGRESS__CREDENTIALS__{name}__HOSTS"
                )
            elif scope and credential.scope and not scope <= set(credential.scope.split()):
                found.append(f"{where} with scope {' '.join(sorted(scope))}, more than its {credential.scope!r}")
    return found


def search_problems(settings: Settings, only: str | None = None) -> list[str]:
    """Agents (``only``: that one) whose ``web_search`` cannot work as configured, in words an operator can act on.

    A search API whose host the agent may not reach, an API key secret not bound to that host, or a hosted search
    on a model that has none.
    """
    from switchboard.core.providers import parse_model_spec

    policy = EgressPolicy.from_settings(settings)
    found: list[str] = []
    for name, agent in settings.file.agents.items():
        if (only is not None and name != only) or "web_search" not in agent.tools:
            continue
        search = agent.search
        if search.provider == "hosted":
            provider = parse_model_spec(agent.model or settings.default_model)[0]
            if provider == "offline" or (provider == "openai" and settings.openai_wire_api != "responses"):
                found.append(
                    f"agent {name!r}: web_search has no hosted search on its model (OpenAI's Responses API and "
                    f"Anthropic have one): set agents.{name}.search.provider to brave, tavily or searxng"
                )
            continue
        host = (URL(search.endpoint).host or "").lower()
        if not policy.rules(name).allows(host):
            found.append(
                f"agent {name!r}: web_search calls {host} ({search.provider}), which is not in its egress allowlist: "
                f"add it to agents.{name}.egress.allow"
            )
        key = (search.api_key_secret or "").upper()
        secret = agent.egress.secrets.get(key)
        if secret is not None and not host_matches(host, secret.domains):
            found.append(
                f"agent {name!r}: the search key secret {key} is not bound to {host}: add it to "
                f"agents.{name}.egress.secrets.{key}.domains"
            )
    return found


class EgressTransport:
    """Sends a tool call's request through the egress policy of the agent the call serves (no redirects followed)."""

    def __init__(self, forwarder: Forwarder) -> None:
        """Send through ``forwarder`` (the worker's, shared with its sandboxes' proxy when there is one)."""
        self.forwarder = forwarder

    async def request(
        self, *, agent: str, session: str, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> EgressResponse:
        """Send one request for ``agent`` in ``session``; a refusal comes back as a response with ``refused`` set."""
        policy = self.forwarder.policy
        grant = policy.grant(agent, session)
        try:
            return await EgressClient(self.forwarder, grant, max_redirects=0).request(
                method, url, headers=headers, body=body
            )
        finally:
            policy.revoke(grant)
