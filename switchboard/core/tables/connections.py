"""The connected tables of each agent, bound to their databases once and shared by every turn."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from switchboard.core.agent.config import Agent
from switchboard.core.tables.access import TableAccess
from switchboard.core.tables.backends import PostgresBackend, SqliteBackend, TableBackend
from switchboard.errors import ToolError

__all__ = ["TableConnections"]


class TableConnections:
    """``agent name → {reference: TableAccess}``, built from the agents' ``tables`` on first use.

    A PostgreSQL database's connection string is read from the environment variable its config names, here, outside
    the model's context; one pool per connection string is shared by every agent that names it.
    """

    def __init__(self, agents: Mapping[str, Agent], environ: Mapping[str, str] | None = None) -> None:
        self._agents = agents
        self._environ = os.environ if environ is None else environ
        self._bound: dict[str, dict[str, TableAccess]] = {}
        self._backends: dict[str, TableBackend] = {}

    def _backend(self, agent: Agent, database: str) -> TableBackend:
        if database in agent.databases:
            path: Path = agent.databases[database].path
            key = f"sqlite:{path}"
            if key not in self._backends:
                self._backends[key] = SqliteBackend(path)
            return self._backends[key]
        config = agent.postgres[database]
        dsn = self._environ.get(config.dsn_env, "")
        if not dsn:
            raise ToolError(f"the database {database!r} is not configured on this host", error_class="permanent")
        key = f"postgres:{dsn}"
        if key not in self._backends:
            self._backends[key] = PostgresBackend(dsn, max_connections=config.max_connections)
        return self._backends[key]

    def __call__(self, agent_name: str) -> Mapping[str, TableAccess]:
        """The connected tables of ``agent_name`` (none for an unknown agent)."""
        found = self._bound.get(agent_name)
        if found is None:
            agent = self._agents.get(agent_name)
            tables = agent.tables if agent is not None else {}
            found = {}
            for ref, table in tables.items():
                assert agent is not None
                found[ref] = TableAccess(ref, table, self._backend(agent, table.database))
            self._bound[agent_name] = found
        return found

    async def close(self) -> None:
        """Close the PostgreSQL pools."""
        for backend in self._backends.values():
            if isinstance(backend, PostgresBackend):
                await backend.close()
