"""The in-process way out: tools that call out use :class:`EgressClient`, which applies the proxy's policy.

The same checks, secret injection, caps and events as a sandbox's requests through the proxy; redirects are
followed here hop by hop, each hop checked again as a new request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from yarl import URL

from switchboard.egress.forward import Forwarder
from switchboard.egress.policy import Grant

__all__ = ["EgressClient", "EgressResponse"]

_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})


@dataclass(frozen=True, slots=True)
class EgressResponse:
    """A response (or the policy's refusal, ``refused`` set) as a tool sees it."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    url: str
    refused: str | None = None

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive)."""
        return next((v for n, v in self.headers if n.lower() == name.lower()), None)


class EgressClient:
    """Sends a tool's requests through the egress policy for one grant (one agent, one session).

    ```python
    client = EgressClient(forwarder, forwarder.policy.grant(agent.name, session))
    response = await client.request("GET", "https://api.github.com/user",
                                    headers={"Authorization": "Bearer {{secret:GITHUB_TOKEN}}"})
    ```
    """

    def __init__(self, forwarder: Forwarder, grant: Grant, *, max_redirects: int = 5) -> None:
        """Bind the client to ``grant``; ``max_redirects``: hops followed (each checked like a new request)."""
        self.forwarder = forwarder
        self.grant = grant
        self.max_redirects = max_redirects

    async def request(
        self, method: str, url: str, *, headers: Mapping[str, str] | None = None, body: bytes = b""
    ) -> EgressResponse:
        """Send one request; a refusal comes back as a response with ``refused`` set, never as an exception."""
        target = URL(url)
        pairs = [(k.lower(), v) for k, v in (headers or {}).items()]
        method = method.upper()
        for _ in range(self.max_redirects + 1):
            outcome = await self.forwarder.forward(self.grant, method, target, pairs, body)
            location = next((v for n, v in outcome.headers if n.lower() == "location"), None)
            if outcome.refused is not None or outcome.status not in _REDIRECTS or location is None:
                return EgressResponse(outcome.status, outcome.headers, outcome.body, str(target), outcome.refused)
            target = target.join(URL(location))
            if outcome.status == 303 or (outcome.status in (301, 302) and method == "POST"):
                method, body = "GET", b""
            # credentials never follow a redirect to another host; placeholders would be re-checked anyway
            pairs = [(n, v) for n, v in pairs if n not in ("authorization", "cookie")]
        return EgressResponse(outcome.status, outcome.headers, outcome.body, str(target), "too_many_redirects")
