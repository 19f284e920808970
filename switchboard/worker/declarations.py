"""Declared REST tools kept in step with the YAML file: a changed ``rest_tools`` takes effect at the next turn.

Before each turn the worker looks at the file (its size and modification time, then a hash of its bytes when those
moved). A file that changed and still loads replaces the declared REST tools (the shared ones and each agent's own)
in the tool registry; one that no longer loads keeps the last good declarations and logs why, naming the field.
Only the declarations are re-read: agents' ``tools`` lists, egress allowlists and secrets are read at start.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from switchboard.core.agent.config import Agent
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.rest.declaration import RestToolSpec
from switchboard.core.tools.rest.tool import RestTransport, declared_tools
from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.errors import ConfigError
from switchboard.settings import FileConfig, Settings, load_file

if TYPE_CHECKING:
    from switchboard.worker.drain import TurnRunner

__all__ = ["RestDeclarations"]

logger = logging.getLogger(__name__)

Stamp = tuple[int, int]
"""A file's size and modification time (ns): when neither moved, it is not read."""


@dataclass(frozen=True, slots=True)
class _Read:
    stamp: Stamp | None
    digest: str
    config: FileConfig | None
    error: str


def _stamp(path: Path) -> Stamp | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_size, found.st_mtime_ns)


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


def _dumped(specs: list[RestToolSpec]) -> list[dict[str, object]]:
    return [spec.model_dump() for spec in specs]


class RestDeclarations:
    """The declared REST tools of one worker, re-registered when the YAML file's declarations change."""

    def __init__(self, registry: ToolRegistry, settings: Settings, transport: RestTransport | None) -> None:
        """Watch ``settings.config`` for the tools ``registry`` holds (registered from ``settings.file`` already).

        ``transport``: the way out the re-declared tools send through (``None``: their calls fail).
        """
        self.registry = registry
        self.settings = settings
        self.transport = transport
        self.path = settings.config
        self._stamp = _stamp(self.path)
        self._digest = _digest(self.path)
        self._names = self._declared_names(settings.file)
        self._lock = asyncio.Lock()

    @staticmethod
    def _declared_names(config: FileConfig) -> set[str]:
        return {spec.name for spec in config.rest_tools} | {
            spec.name for agent in config.agents.values() for spec in agent.rest_tools
        }

    def _read(self) -> _Read | None:
        """The file as it is now, when it changed since last looked at (``None``: it did not)."""
        stamp = _stamp(self.path)
        if stamp == self._stamp:
            return None
        digest = _digest(self.path)
        if stamp is None or digest == self._digest:
            return _Read(stamp, self._digest, None, "")
        try:
            return _Read(stamp, digest, load_file(self.path, required=True), "")
        except ConfigError as err:
            return _Read(stamp, digest, None, str(err))

    async def check(self) -> bool:
        """Look at the file; re-register the declarations when they changed. Whether they were replaced."""
        async with self._lock:
            found = await asyncio.to_thread(self._read)
            if found is None:
                return False
            self._stamp, changed, self._digest = found.stamp, found.digest != self._digest, found.digest
            if found.error:
                logger.error(
                    "%s changed but does not load; the REST tools keep their last good declarations: %s",
                    self.path,
                    found.error,
                )
                return False
            if found.config is None or not changed:
                return False
            return self._apply(found.config)

    def _apply(self, config: FileConfig) -> bool:
        current = self.settings.file
        own = {name: config.agents[name].rest_tools for name in current.agents if name in config.agents}
        own = {name: specs for name, specs in own.items() if specs}
        before_own = {name: agent.rest_tools for name, agent in current.agents.items() if agent.rest_tools}
        if _dumped(config.rest_tools) == _dumped(current.rest_tools) and {
            name: _dumped(specs) for name, specs in own.items()
        } == {name: _dumped(specs) for name, specs in before_own.items()}:
            return False  # something else in the file changed: read at start, left as it is
        tools = declared_tools(config.rest_tools, own, self.transport)
        taken = [tool.name for tool in tools if tool.name in self.registry and tool.name not in self._names]
        if taken:
            logger.error(
                "%s: the REST tool %r has the name of a native tool: rename it (the last good declarations are kept)",
                self.path,
                taken[0],
            )
            return False
        for name in self._names:
            self.registry.remove(name)
        for tool in tools:
            self.registry.register(tool)
        before, self._names = self._names, {tool.name for tool in tools}
        current.rest_tools = config.rest_tools
        for name in own.keys() | before_own.keys():
            agent = current.agents[name]
            current.agents[name] = agent.model_copy(update={"rest_tools": own.get(name, [])})
        logger.info(
            "%s: REST tool declarations reloaded (now: %s; added: %s; removed: %s)",
            self.path,
            ", ".join(sorted(self._names)) or "none",
            ", ".join(sorted(self._names - before)) or "none",
            ", ".join(sorted(before - self._names)) or "none",
        )
        return True

    def agent(self, agent: Agent) -> Agent:
        """``agent`` with its own declarations as they now stand."""
        now = self.settings.file.agents.get(agent.name)
        if now is None or now.rest_tools == agent.rest_tools:
            return agent
        return agent.model_copy(update={"rest_tools": now.rest_tools})

    def wrap(self, runner: TurnRunner) -> TurnRunner:
        """``runner`` that first brings the declarations up to date, so the turn sees the file as saved."""

        async def run(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
            await self.check()
            agent = self.agent(request.agent)
            if agent is not request.agent:
                request = request.model_copy(update={"agent": agent})
            return await runner(request, sink, store)

        return run
