"""Declared REST tools' way out: each call gets its own grant for the calling agent, revoked when it returns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from yarl import URL

from switchboard.core.tools.rest.tool import declared_tools
from switchboard.egress.client import EgressClient, EgressResponse
from switchboard.egress.forward import Forwarder
from switchboard.egress.policy import EgressPolicy, host_matches

if TYPE_CHECKING:
    from switchboard.core.tools.builtin import ToolRegistry
    from switchboard.settings import Settings

__all__ = ["EgressTransport", "register_rest_tools", "rest_problems", "search_problems"]


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
    """Declared REST tools whose host an agent that has them (``only``: that agent) may not reach."""
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
