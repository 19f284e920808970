"""The worker's egress proxy as the ``shell`` tool uses it: one proxy per worker process, one grant per call.

With no allowlist anywhere nothing starts; under bubblewrap a proxy on a unix socket records every request in the
session's event log (Landlock shares the host's network, so there it only says why there is no network). Each call
gets a confined grant usable only through its own private socket, handed to the sandbox off the command line, and
revoked when the call ends (``docs/ARCHITECTURE.md`` §7).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from switchboard.sandbox.bwrap import CA_CERT, PROXY_ADDRESS
from switchboard.sandbox.runner import EgressAccess

if TYPE_CHECKING:
    import redis.asyncio as aioredis
    from aiohttp.abc import AbstractResolver

    from switchboard.egress.policy import EgressPolicy
    from switchboard.egress.proxy import EgressProxy
    from switchboard.sandbox.runner import Sandbox
    from switchboard.settings import Settings

__all__ = [
    "MAX_SOCKET_PATH",
    "NO_HOSTS",
    "SandboxEgress",
    "allowlisted",
    "egress_status",
    "socket_path",
    "start_sandbox_egress",
]

logger = logging.getLogger(__name__)

MAX_SOCKET_PATH = 107
"""Longest unix socket path the kernel accepts (``sun_path`` is 108 bytes with its NUL)."""

NO_HOSTS = "none: this agent may reach no host (it has no egress allowlist)"
"""The result's ``network`` for an agent without an allowlist."""


def allowlisted(settings: Settings) -> list[str]:
    """Agents that may reach some host (the deployment-wide allowlist counts for every agent)."""
    return [name for name, agent in settings.file.agents.items() if settings.egress.allow or agent.egress.allow]


def socket_path(settings: Settings, pid: int | None = None) -> Path:
    """Where this worker's proxy listens: ``SWITCHBOARD_SANDBOX__PROXY_SOCKET``, else one socket per process."""
    configured = settings.sandbox.proxy_socket
    return configured or settings.data_path / "egress" / f"worker-{os.getpid() if pid is None else pid}.sock"


def _too_long(path: Path) -> str | None:
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        return None
    return (
        f"the egress proxy's socket path {path} is longer than {MAX_SOCKET_PATH} bytes: set "
        "SWITCHBOARD_SANDBOX__PROXY_SOCKET to a shorter path (one per worker process)"
    )


@dataclass(slots=True)
class SandboxEgress:
    """Grants to the worker's egress proxy for one ``shell`` call at a time (or why a call has no network)."""

    policy: EgressPolicy
    proxy: EgressProxy | None
    """``None``: the sandbox cannot reach a proxy (``unreachable`` says why)."""
    unreachable: str = ""

    def reaches(self, agent: str) -> bool:
        """Whether ``agent``'s commands get a way out: its own allowlist (or the deployment's), and a reachable proxy.

        Only that agent's configuration counts: another agent's allowlist changes nothing for it.
        """
        return self.proxy is not None and bool(self.policy.rules(agent).allow)

    @contextlib.asynccontextmanager
    async def access(self, agent: str, session: str) -> AsyncIterator[EgressAccess | str]:
        """The way out of one call for ``agent`` in ``session``, or why it has none; grant and socket end with it."""
        if self.proxy is None:
            yield self.unreachable
            return
        if not self.policy.rules(agent).allow:
            yield NO_HOSTS
            return
        grant = self.policy.grant(agent, session, confined=True)
        try:
            async with self.proxy.own_socket(grant) as path:
                yield EgressAccess(
                    socket=path,
                    ca_cert=self.proxy.ca.cert_path,
                    environment=self.proxy.environment(grant, address=PROXY_ADDRESS, ca_path=CA_CERT),
                    token=grant.token,
                )
        finally:
            self.policy.revoke(grant)

    async def close(self) -> None:
        """Stop the proxy (its socket is removed)."""
        if self.proxy is not None:
            await self.proxy.close()


async def start_sandbox_egress(
    settings: Settings,
    redis: aioredis.Redis,
    sandbox: Sandbox | None,
    *,
    resolver: AbstractResolver | None = None,
) -> SandboxEgress | None:
    """Start this worker's egress proxy when some agent may reach a host and the sandbox can reach the proxy.

    Returns ``None`` when there is no sandbox or no allowlist (commands have no network, nothing is started).

    Raises:
        ConfigError: the socket path is too long for a unix socket.
    """
    from switchboard.errors import ConfigError

    if sandbox is None or not allowlisted(settings):
        return None
    from switchboard.egress.policy import EgressPolicy

    if sandbox.kind != "bwrap":
        why = f"a {sandbox.label} sandbox shares the host's network stack and cannot reach the egress proxy"
        logger.warning("egress: %s; shell commands have no network", why)
        return SandboxEgress(EgressPolicy.from_settings(settings), None, f"none: {why}")
    path = socket_path(settings)
    problem = _too_long(path)
    if problem is not None:
        raise ConfigError(problem)
    from switchboard.egress.events import RedisEgressSink
    from switchboard.egress.proxy import build_proxy

    sink = RedisEgressSink(redis, maxlen=settings.queue.events_maxlen)
    proxy = build_proxy(settings, sink, resolver=resolver, socket_path=path)
    await proxy.start()
    logger.info("egress: proxy listening on %s (and %s:%d)", path, proxy.host, proxy.port)
    return SandboxEgress(proxy.forwarder.policy, proxy)


def egress_status(settings: Settings, sandbox: Sandbox | None) -> tuple[list[str], list[str], list[str]]:
    """What ``switchboard check`` says about egress: lines to print, warnings and problems."""
    from switchboard.egress.policy import EgressPolicy

    policy = EgressPolicy.from_settings(settings)
    agents = allowlisted(settings)
    if not agents:
        return ["none — no agent has an egress allowlist: shell commands have no network"], [], []
    if sandbox is None:
        return ["none — no sandbox (the shell tool is not offered)"], [], []
    if sandbox.kind != "bwrap":
        why = f"a {sandbox.label} sandbox cannot reach the egress proxy: shell commands have no network"
        return [f"none — {why}"], [f"egress: {why} (agents with an allowlist: {', '.join(agents)})"], []
    path = socket_path(settings, pid=4_194_304)  # the longest pid, for the length check
    problem = _too_long(path)
    where = settings.sandbox.proxy_socket or settings.data_path / "egress" / "worker-<pid>.sock"
    lines = [f"proxy per worker on {where}, CA {settings.data_path / 'egress' / 'ca'}"]
    for name in sorted(policy.agents):
        rules = policy.agents[name]
        if rules.allow:
            lines.append(f"{name}: {', '.join(rules.allow)}; secrets: {', '.join(sorted(rules.secrets)) or 'none'}")
    return lines, [], [problem] if problem else []
