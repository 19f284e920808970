"""The projects an agent is connected to at run time: the YAML file's connections and the operators', merged.

The memory tools ask a plain function for an agent's projects (the core layer reads no Redis); the worker brings
the operators' connections of the turn's tenant up to date before each turn (:meth:`LiveConnections.wrap`), so a
connection made or removed in the console applies from the agent's next turn on. A turn's agent keeps the projects
the file gives it (other tenants' included: the tools filter by tenant) and gains the operators'.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from switchboard.queue.projects import ProjectConnections
from switchboard.settings import FileConfig

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
    from switchboard.worker.drain import TurnRunner

__all__ = ["LiveConnections"]

logger = logging.getLogger(__name__)


class LiveConnections:
    """``connected(agent, tenant)`` for the memory tools: the file's projects and the operators' (as last read)."""

    def __init__(self, file: FileConfig, redis: aioredis.Redis) -> None:
        self.file = file
        self.connections = ProjectConnections(redis)
        self._operators: dict[str, dict[str, list[str]]] = {}

    def __call__(self, agent: str, tenant: str) -> list[str]:
        """The projects of ``tenant`` that ``agent`` is connected to (only projects the file defines for it)."""
        found = self.file.connected_projects(agent, tenant)
        for project in self._operators.get(tenant, {}).get(agent, []):
            defined = self.file.projects.get(project)
            if defined is not None and defined.tenant == tenant and project not in found:
                found.append(project)
        return found

    async def refresh(self, tenant: str) -> None:
        """Read the operators' connections of ``tenant`` again (a Redis that does not answer keeps the last read)."""
        try:
            self._operators[tenant] = await self.connections.of(tenant)
        except (RedisError, OSError, TimeoutError) as err:
            logger.warning("project connections of a tenant not refreshed (%s)", type(err).__name__)

    def wrap(self, runner: TurnRunner) -> TurnRunner:
        """``runner`` that first reads the turn's tenant's connections, so the turn sees them as operators left them.

        The turn's agent carries its merged projects, so an agent connected only by an operator is offered the memory
        tools too.
        """

        async def run(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
            await self.refresh(request.tenant)
            merged = list(dict.fromkeys([*request.agent.projects, *self(request.agent.name, request.tenant)]))
            if merged != request.agent.projects:
                request = request.model_copy(update={"agent": request.agent.model_copy(update={"projects": merged})})
            return await runner(request, sink, store)

        return run
